package retention

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parkedFleet is two replicas of one sweep over one store under one
// lease, "a" holding it, with one marker parked: the stage of a Requeue
// made through the replica that does not sweep. Made by newHeldFleet, the
// marker is held instead, until a day later, in the store and in a's
// memory, until lifted.
type parkedFleet struct {
	kv      *wakeCountKV
	a, b    *Sweep
	cleared atomic.Int64
	lifted  atomic.Bool // the held id's Clear answers Hold until set
	stop    func()
}

func newParkedFleet(t *testing.T, cfg Config) *parkedFleet { return newFleetStage(t, cfg, false) }

func newHeldFleet(t *testing.T, cfg Config) *parkedFleet { return newFleetStage(t, cfg, true) }

func newFleetStage(t *testing.T, cfg Config, held bool) *parkedFleet {
	t.Helper()
	f := &parkedFleet{kv: &wakeCountKV{fakeKV: newFakeKV(nil)}}
	locker := &fakeLocker{}
	cfg.Prefix, cfg.Retention, cfg.Interval, cfg.Lease = "runs/", time.Hour, time.Minute, locker
	cfg.Clear = func(context.Context, string) error {
		if held && !f.lifted.Load() {
			return Hold(time.Now().Add(24 * time.Hour))
		}
		f.cleared.Add(1)
		return nil
	}
	key := appendParkedKey(nil, "runs/", 0, time.Now().Add(-2*time.Hour).UnixMilli(), 3, "job-1")
	if held {
		key = mark(t, f.kv.MemKV, "runs/", "job-1", time.Now().Add(-2*time.Hour))
	}
	require.NoError(t, f.kv.Put(context.Background(), key, nil))
	var err error
	ca, cb := cfg, cfg
	ca.Replica, cb.Replica = "web-a", "web-b"
	f.a, err = New(f.kv, ca)
	require.NoError(t, err)
	f.b, err = New(f.kv, cb)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { _ = f.a.Run(ctx) })
	synctest.Wait() // a holds the lease, and sleeps
	require.True(t, locker.held())
	if held {
		p, err := f.a.Pending(t.Context(), 10)
		require.NoError(t, err)
		require.Len(t, p, 1)
		require.Equal(t, StateHeld, p[0].State, "a held job-1")
	}
	wg.Go(func() { _ = f.b.Run(ctx) })
	synctest.Wait() // b tried it, and sleeps
	f.stop = func() { cancel(); wg.Wait() }
	return f
}

// requeueToCleared requeues the parked marker through b and returns how
// long it took, in the bubble's time, until a cleared it.
func (f *parkedFleet) requeueToCleared(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	n, err := f.b.Requeue(t.Context(), "job-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	for f.cleared.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	synctest.Wait() // the marker's delete, after the clear
	return took
}

// releaseToCleared lifts the hold of the held marker and releases it
// through b, and returns how long it took, in the bubble's time, until a,
// whose memory holds it for a day, cleared it.
func (f *parkedFleet) releaseToCleared(t *testing.T) time.Duration {
	t.Helper()
	f.lifted.Store(true)
	start := time.Now()
	n, err := f.b.ReleaseHolds(t.Context(), "job-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	for f.cleared.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	synctest.Wait() // the marker's delete, after the clear
	return took
}

// TestReleaseHoldsOnAnotherReplicaWakesTheLeaseHolder: a hold released
// through the replica that does not hold the lease is cleared by the
// holder, whose memory holds it for a day, within its WakePoll; through
// the holder's own Sweep, at once.
func TestReleaseHoldsOnAnotherReplicaWakesTheLeaseHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newHeldFleet(t, Config{})
		defer f.stop()
		took := f.releaseToCleared(t)
		t.Logf("release to cleared under a 1m Interval: %v", took)
		assert.LessOrEqual(t, took, DefaultWakePoll+20*time.Millisecond)
		assert.Zero(t, markerCount(t, f.kv, "runs/"), "the marker is deleted")
	})
	synctest.Test(t, func(t *testing.T) {
		f := newHeldFleet(t, Config{})
		defer f.stop()
		f.lifted.Store(true)
		start := time.Now()
		n, err := f.a.ReleaseHolds(t.Context(), "job-1")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		synctest.Wait()
		assert.EqualValues(t, 1, f.cleared.Load())
		assert.Zero(t, time.Since(start), "released through the holder: cleared without waiting")
		assert.Zero(t, markerCount(t, f.kv, "runs/"), "the marker is deleted")
	})
}

// TestRequeueOnAnotherReplicaWakesTheLeaseHolder: a Requeue made through
// the replica that does not hold the lease is cleared by the holder within
// its WakePoll, not at its next pass a minute later.
func TestRequeueOnAnotherReplicaWakesTheLeaseHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newParkedFleet(t, Config{})
		defer f.stop()
		took := f.requeueToCleared(t)
		t.Logf("requeue to cleared under a 1m Interval: %v", took)
		assert.LessOrEqual(t, took, DefaultWakePoll+20*time.Millisecond)
		assert.Zero(t, markerCount(t, f.kv, "runs/"), "the marker is deleted")
	})
}

// TestRequeueWithoutWakePollWaitsForThePass: with WakePoll negative the
// holder reads no wake key, and the requeue waits for its next pass.
func TestRequeueWithoutWakePollWaitsForThePass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newParkedFleet(t, Config{WakePoll: -1})
		defer f.stop()
		took := f.requeueToCleared(t)
		assert.Greater(t, took, 50*time.Second)
	})
}

// TestRequeueInTheProcessThatSweepsPassesAtOnce: a Requeue through the
// Sweep whose Run holds the lease wakes that Run directly, and writes no
// wake key.
func TestRequeueInTheProcessThatSweepsPassesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newParkedFleet(t, Config{})
		defer f.stop()
		puts := f.kv.puts.Load()
		start := time.Now()
		n, err := f.a.Requeue(t.Context(), "job-1")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		synctest.Wait()
		assert.EqualValues(t, 1, f.cleared.Load())
		assert.Zero(t, time.Since(start), "cleared without waiting")
		assert.Equal(t, puts, f.kv.puts.Load(), "no wake key written")
	})
}

// TestWakeWithoutReplicaWakesOnlyThisProcess: without Config.Replica, Wake
// writes nothing and wakes the Run of its own process.
func TestWakeWithoutReplicaWakesOnlyThisProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := newFakeKV(nil)
		var cleared atomic.Int64
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Minute,
			Clear: func(context.Context, string) error { cleared.Add(1); return nil }})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		mark(t, kv.MemKV, "runs/", "job-1", time.Now().Add(-2*time.Hour))
		puts := kv.puts.Load()
		require.NoError(t, s.Wake(ctx))
		synctest.Wait()
		assert.EqualValues(t, 1, cleared.Load(), "woken, the Run passed at once")
		assert.Equal(t, puts, kv.puts.Load(), "no wake key written")
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

// TestWakePollCost: the holder of the lease reads the wake key once per
// WakePoll between passes, a Scan of one key, and nothing more: an idle
// pass still makes its two Scans. The replica that does not hold the lease
// reads no wake key, and the free key once per WakePoll between its tries
// of the lease.
func TestWakePollCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newParkedFleet(t, Config{})
		defer f.stop()
		wakeBefore, freeBefore, otherBefore := f.kv.wakeScans.Load(), f.kv.freeScans.Load(), f.kv.otherScans.Load()
		time.Sleep(10*time.Minute + time.Millisecond) // ten idle passes, one a minute
		synctest.Wait()
		wakeScans, freeScans, passScans := f.kv.wakeScans.Load()-wakeBefore, f.kv.freeScans.Load()-freeBefore, f.kv.otherScans.Load()-otherBefore
		t.Logf("10 idle minutes: %d Scans of the wake key, %d of the free key, %d of the passes", wakeScans, freeScans, passScans)
		assert.EqualValues(t, 10*59, wakeScans, "one wake-key Scan a second between passes, none by the replica without the lease")
		assert.EqualValues(t, 10*59, freeScans, "one free-key Scan a second between tries of the lease, by the replica without it")
		assert.EqualValues(t, 10*2, passScans, "two Scans per idle pass")
	})
}

// TestReleasedLeaseIsTakenWithinWakePoll: a replica restarted with a
// lowered Retention waits for the lease while the replica it replaces
// holds it; when that one returns and releases the lease, the new one takes
// it within its WakePoll and clears at once what the lowered Retention
// made due, where it waited for its next try of the lease, up to an
// Interval (WakePoll off). Restarted in place, the first pass is at once.
func TestReleasedLeaseIsTakenWithinWakePoll(t *testing.T) {
	tests := []struct {
		name     string
		wakePoll time.Duration
		within   time.Duration // release to cleared, at most
		least    time.Duration // and at least
	}{
		{"free key read every WakePoll", 0, DefaultWakePoll, 0},
		{"WakePoll off: the next try of the lease", -1, time.Minute, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				kv := &wakeCountKV{fakeKV: newFakeKV(nil)}
				locker := &fakeLocker{}
				var cleared atomic.Int64
				cfg := Config{Prefix: "runs/", Interval: time.Minute, Lease: locker, WakePoll: tt.wakePoll,
					Clear: func(context.Context, string) error { cleared.Add(1); return nil }}
				mark(t, kv.MemKV, "runs/", "job-1", time.Now().Add(-2*time.Hour))
				old, lowered := cfg, cfg
				old.Replica, old.Retention = "web-a", 3*time.Hour
				lowered.Replica, lowered.Retention = "web-b", time.Hour
				a, err := New(kv, old)
				require.NoError(t, err)
				b, err := New(kv, lowered)
				require.NoError(t, err)
				stopA := runInBackground(t.Context(), a)
				synctest.Wait()
				require.True(t, locker.held())
				stopB := runInBackground(t.Context(), b)
				defer func() { require.ErrorIs(t, stopB(), context.Canceled) }()
				time.Sleep(30 * time.Second) // b tried the lease, and waits
				synctest.Wait()
				require.Zero(t, cleared.Load(), "not due under a's Retention of 3h")

				start := time.Now()
				require.ErrorIs(t, stopA(), context.Canceled) // a returns: it releases the lease
				for cleared.Load() == 0 {
					time.Sleep(10 * time.Millisecond)
				}
				took := time.Since(start)
				t.Logf("lease released to cleared under the lowered Retention: %v", took)
				assert.LessOrEqual(t, took, tt.within+10*time.Millisecond)
				assert.GreaterOrEqual(t, took, tt.least)
				synctest.Wait()
				assert.Empty(t, keysUnder(t, kv, "runs/#l"), "the free key deleted by the replica that took the lease")
			})
		})
	}
	t.Run("restarted in place", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			kv := newFakeKV(nil)
			locker := &fakeLocker{}
			var cleared atomic.Int64
			cfg := Config{Prefix: "runs/", Interval: time.Minute, Lease: locker, Replica: "web-a", Retention: 3 * time.Hour,
				Clear: func(context.Context, string) error { cleared.Add(1); return nil }}
			mark(t, kv.MemKV, "runs/", "job-1", time.Now().Add(-2*time.Hour))
			a, err := New(kv, cfg)
			require.NoError(t, err)
			stop := runInBackground(t.Context(), a)
			time.Sleep(30 * time.Second)
			require.ErrorIs(t, stop(), context.Canceled)
			require.Zero(t, cleared.Load())
			cfg.Retention = time.Hour
			restarted, err := New(kv, cfg)
			require.NoError(t, err)
			start := time.Now()
			stop = runInBackground(t.Context(), restarted)
			defer func() { require.ErrorIs(t, stop(), context.Canceled) }()
			synctest.Wait()
			assert.EqualValues(t, 1, cleared.Load(), "the first pass under the lowered Retention")
			assert.Zero(t, time.Since(start), "at once")
			assert.Empty(t, keysUnder(t, kv, "runs/#l"), "the free key deleted as the lease was taken")
		})
	})
}

// TestStaleFreeKeyCostsOneTryOfTheLease: a free key left while another
// replica holds the lease (written as that one took it) makes a waiting
// replica try the lease once sooner, and is then deleted: it tries once a
// minute again.
func TestStaleFreeKeyCostsOneTryOfTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newParkedFleet(t, Config{})
		defer f.stop()
		locker := f.a.lease.(*fakeLocker)
		tries := func() int {
			locker.mu.Lock()
			defer locker.mu.Unlock()
			return locker.acquires
		}
		// web-b is half way to its next try, and half way between two
		// reads of the free key: none races the Put and the count.
		time.Sleep(30*time.Second + DefaultWakePoll/2)
		key, _ := f.a.freeRange()
		require.NoError(t, f.kv.Put(t.Context(), key, nil))
		before := tries()
		time.Sleep(DefaultWakePoll)
		synctest.Wait()
		assert.Equal(t, 1, tries()-before, "web-b tried the lease on reading the free key")
		assert.Empty(t, keysUnder(t, f.kv, "runs/#l"), "the stale free key deleted")
		before = tries()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		assert.Equal(t, 10, tries()-before, "then one try a minute")
	})
}

// wakeCountKV counts the Scans of the wake key and of the free key apart
// from the others.
type wakeCountKV struct {
	*fakeKV
	wakeScans, freeScans, otherScans atomic.Int64
}

func (w *wakeCountKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	switch {
	case bytes.HasSuffix(start, []byte{fleetInfix, wakeKind}):
		w.wakeScans.Add(1)
	case bytes.HasSuffix(start, []byte{fleetInfix, freeKind}):
		w.freeScans.Add(1)
	default:
		w.otherScans.Add(1)
	}
	return w.fakeKV.Scan(ctx, start, end, limit)
}

// markerCount returns how many keys of prefix's marker, retry and parked
// ranges kv holds.
func markerCount(t testing.TB, kv KV, prefix string) int {
	t.Helper()
	n := 0
	for _, r := range [][2]string{{prefix + "0", prefix + ":"}, {prefix + "r0", prefix + "r:"}, {prefix + "p0", prefix + "p:"}} {
		keys, err := kv.Scan(context.Background(), []byte(r[0]), []byte(r[1]), 1<<20)
		require.NoError(t, err)
		n += len(keys)
	}
	return n
}
