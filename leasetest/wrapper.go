package leasetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// forwardingKV is a KV a user wraps around the replica's KV, as one that
// logs or counts its calls would: it forwards every call with its context
// and has Unwrap, so the lease's fence reaches the KV inside through the
// context. It counts the Deletes that succeeded, and those that began
// after another replica took the lease over.
type forwardingKV struct {
	inner retention.KV
	taken *atomic.Bool // another replica holds the lease

	deletes, late, tried atomic.Int64
}

func (w *forwardingKV) Unwrap() retention.KV { return w.inner }

func (w *forwardingKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return w.inner.Scan(ctx, start, end, limit)
}

func (w *forwardingKV) Delete(ctx context.Context, keys ...[]byte) error {
	after := w.taken.Load()
	if after {
		w.tried.Add(1)
	}
	err := w.inner.Delete(ctx, keys...)
	if err == nil {
		w.deletes.Add(1)
		if after {
			w.late.Add(1)
		}
	}
	return err
}

func (w *forwardingKV) Put(ctx context.Context, key, value []byte) error {
	p, ok := w.inner.(retention.Putter)
	if !ok {
		return fmt.Errorf("leasetest: the wrapped %T has no Put", w.inner)
	}
	return p.Put(ctx, key, value)
}

func (w *forwardingKV) Move(ctx context.Context, from, to [][]byte) error {
	m, ok := w.inner.(retention.Mover)
	if !ok {
		return fmt.Errorf("leasetest: the wrapped %T has no Move", w.inner)
	}
	return m.Move(ctx, from, to)
}

// testWrapper sweeps through a forwardingKV under the lease. Mid-pass,
// inside a Clear, the lease is taken away from outside and another replica
// acquires it; the pass goes on with the page's other Clears and then
// deletes. No Delete through the wrapper that begins after the takeover
// may succeed: the fence travels on the context of each write to the KV
// inside, which applies it (retention.Fenced).
func testWrapper(t *testing.T, h Harness) {
	ctx := context.Background()
	a, b := h.NewReplica(t), h.NewReplica(t)
	if la, err := a.Locker.TryAcquire(ctx); err != nil {
		t.Fatalf("TryAcquire on a free lease = %v", err)
	} else {
		_, fences := la.(retention.Fencer)
		if err := la.Release(ctx); err != nil {
			t.Fatalf("Release = %v", err)
		}
		if !fences {
			if h.Unfenced {
				t.Skip("the harness says its leases cannot fence")
			}
			t.Fatalf("the lease (%T) is not a retention.Fencer; set Harness.Unfenced if that is intended", la)
		}
	}

	const n, takeAt = 400, 150
	all := ids(0, n)
	clock := retention.NewManualClock(start)
	if err := h.Finish(ctx, Prefix, all, start.Add(-2*retentionWindow)); err != nil {
		t.Fatalf("Finish = %v", err)
	}
	var taken atomic.Bool
	var newHolder atomic.Pointer[retention.Lease]
	takeOver := func() {
		h.Expire(t)
		deadline := time.Now().Add(h.TTL + 10*time.Second)
		for {
			lb, err := b.Locker.TryAcquire(ctx)
			if err == nil {
				newHolder.Store(&lb)
				taken.Store(true)
				return
			}
			if !errors.Is(err, retention.ErrLeaseHeld) || time.Now().After(deadline) {
				t.Errorf("TryAcquire by another replica after Expire = %v", err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	defer func() {
		if lb := newHolder.Load(); lb != nil {
			_ = (*lb).Release(ctx)
		}
	}()

	kv := &forwardingKV{inner: a.KV, taken: &taken}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    Prefix,
		Retention: retentionWindow,
		Clock:     clock,
		Interval:  fleetInterval,
		PageSize:  16,
		Lease:     a.Locker,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clear: func(ctx context.Context, id string) error {
			if id == all[takeAt] && !taken.Load() {
				takeOver()
			}
			time.Sleep(time.Millisecond)
			return a.Clear(ctx, id)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sweep.Run(runCtx) }()

	// Run long enough after the takeover for the old holder to try its
	// deletes and give up the lease.
	deadline := time.Now().Add(waitLimit)
	for !taken.Load() && time.Now().Before(deadline) {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("Run over a wrapper with Unwrap returned %v before the takeover", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !taken.Load() {
		cancel()
		<-done
		t.Fatalf("the sweep never reached %s in %v (%d Deletes through the wrapper)", all[takeAt], waitLimit, kv.deletes.Load())
	}
	time.Sleep(h.TTL/2 + 20*fleetInterval)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v, want context.Canceled", err)
	}

	before := kv.deletes.Load() - kv.late.Load()
	t.Logf("through the wrapper: %d Deletes succeeded before the takeover; after it %d were tried and %d succeeded",
		before, kv.tried.Load(), kv.late.Load())
	if before == 0 {
		t.Error("no Delete through the wrapper succeeded before the takeover: the check proves nothing")
	}
	if late := kv.late.Load(); late != 0 {
		t.Errorf("%d Deletes through the wrapper succeeded after another replica took the lease over: "+
			"the KV inside did not apply the fence its context carried (retention.Fenced)", late)
	}
	if kv.tried.Load() == 0 {
		t.Log("note: the old holder tried no Delete after the takeover; the store-side check was not reached")
	}
}
