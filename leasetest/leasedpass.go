package leasetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// leaseEvents is an Observer that keeps the lease events and the passes
// it is told of.
type leaseEvents struct {
	mu     sync.Mutex
	events []string
	passes int
}

func (l *leaseEvents) ObservePass(string, retention.Stats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.passes++
}

func (l *leaseEvents) ObserveLags(string, []time.Duration) {}

func (l *leaseEvents) ObservePage(string, retention.Stats) {}

func (l *leaseEvents) ObserveLease(_ string, e retention.LeaseEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e.String())
}

func (l *leaseEvents) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.events)
}

// testLeasedPass checks Sweep.LeasedPass on the engine: refused with
// ErrLeaseHeld while another replica holds the lease, clearing every due
// entity once it is free, and releasing the lease after the pass.
func testLeasedPass(t *testing.T, h Harness) {
	ctx := context.Background()
	a, b := h.NewReplica(t), h.NewReplica(t)
	ids := ids(0, 50)
	if err := h.Finish(ctx, Prefix, ids, start.Add(-time.Hour)); err != nil {
		t.Fatalf("Finish = %v", err)
	}
	obs := &leaseEvents{}
	sweep, err := retention.New(a.KV, retention.Config{
		Prefix:    Prefix,
		Retention: retentionWindow,
		Clock:     retention.NewManualClock(start),
		PageSize:  8,
		Lease:     a.Locker,
		Clear:     a.Clear,
		Observer:  obs,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}

	lb, err := b.Locker.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire by replica b = %v", err)
	}
	if _, err := sweep.LeasedPass(ctx); !errors.Is(err, retention.ErrLeaseHeld) {
		t.Errorf("LeasedPass while b holds the lease = %v, want ErrLeaseHeld", err)
	}
	if n := countPresent(ctx, t, h, ids); n != len(ids) {
		t.Errorf("after a refused LeasedPass %d of %d entities are present, want all", n, len(ids))
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}

	st, err := sweep.LeasedPass(ctx)
	if err != nil {
		t.Fatalf("LeasedPass on a free lease = %v", err)
	}
	if st.Cleared != len(ids) {
		t.Errorf("LeasedPass().Cleared = %d, want %d", st.Cleared, len(ids))
	}
	if n := countPresent(ctx, t, h, ids); n != 0 {
		t.Errorf("%d entities left after LeasedPass", n)
	}
	if got, want := obs.String(), "[held acquired released]"; got != want {
		t.Errorf("lease events = %s, want %s", got, want)
	}
	if obs.passes != 1 {
		t.Errorf("observed passes = %d, want 1", obs.passes)
	}
	// Released: the other replica takes it at once.
	lb, err = b.Locker.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire after LeasedPass = %v, want the lease free", err)
	}
	_ = lb.Release(ctx)
}
