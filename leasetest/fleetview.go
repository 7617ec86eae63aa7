package leasetest

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// testFleetView checks the fleet's record and wake-up on the engine: two
// replicas with Config.Replica under the lease; the one without it reads
// the holder's record from the store, and a Wake through it makes the
// holder pass at once, not at its next pass an Interval away.
func testFleetView(t *testing.T, h Harness) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	sweeps := map[string]*retention.Sweep{}
	for _, name := range []string{"replica-a", "replica-b"} {
		r := h.NewReplica(t)
		s, err := retention.New(r.KV, retention.Config{
			Prefix: Prefix, Retention: retentionWindow, Interval: time.Minute, WakePoll: 20 * time.Millisecond,
			Lease: r.Locker, Clear: r.Clear, Replica: name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		sweeps[name] = s
	}
	a, b := sweeps["replica-a"], sweeps["replica-b"]
	wg.Go(func() { _ = a.Run(ctx) })
	var fb retention.Fleet
	waitUntil(t, "replica-a's record of its first pass", func() bool {
		var err error
		fb, err = b.Fleet(ctx)
		return err == nil && fb.Holder == "replica-a"
	})
	wg.Go(func() { _ = b.Run(ctx) })

	ids := ids(0, 10)
	if err := h.Finish(ctx, Prefix, ids, time.Now().Add(-time.Hour).Truncate(time.Millisecond)); err != nil {
		t.Fatalf("Finish = %v", err)
	}
	woke := time.Now()
	if err := b.Wake(ctx); err != nil {
		t.Fatalf("Wake through the replica without the lease = %v", err)
	}
	waitUntil(t, "the holder to clear what the wake-up was for", func() bool { return countPresent(ctx, t, h, ids) == 0 })
	took := time.Since(woke)
	t.Logf("wake-up through the replica without the lease to cleared, Interval 1m: %v", took)
	if took > 30*time.Second {
		t.Errorf("cleared %v after the wake-up, want well within the Interval (1m)", took)
	}
	fa, err := a.Fleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fb, err = b.Fleet(ctx); err != nil {
		t.Fatal(err)
	}
	if fa.Holder != "replica-a" || fb.Holder != fa.Holder || !fb.Since.Equal(fa.Since) || len(fb.Minutes) != len(fa.Minutes) {
		t.Errorf("Fleet on replica-a = %+v, on replica-b = %+v: want the same holder and passes", fa, fb)
	}
}

// waitUntil polls ok until it holds, for at most waitLimit.
func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", waitLimit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
