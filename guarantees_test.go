package retention

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Guarantees that cut across the clear modes: atomic refusals, ambiguous
// failures, atomic reschedules, duplicates and fences through wrappers.

func newAtomicKV(t *testing.T, n int) (*atomicKV, []string) {
	mem := NewMemKV()
	kv := atomicOver(mem)
	ids := markN(t, mem, n, t0)
	for _, id := range ids {
		kv.entities[id] = true
	}
	return kv, ids
}

// TestAtomicBatchErrorRefusesTheCall: a ClearDeleter that refuses [a b c]
// because b is held clears none of them; a and c were not cleared, so their
// markers must not go (deleted with a plain Delete, their entities would
// be left for ever). They are sent again without b.
func TestAtomicBatchErrorRefusesTheCall(t *testing.T) {
	t.Parallel()
	base, ids := newAtomicKV(t, 3)
	kv := base
	kv.before = refuse(map[string]error{ids[1]: errors.New("on hold")})
	s, clock := newSweep(t, kv, Config{})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, st.Cleared)
	assert.Equal(t, 1, st.Failed)
	assert.Zero(t, st.DeleteCalls, "no marker goes but with its entity")
	assert.Equal(t, map[string]bool{ids[1]: true}, kv.entities)
	assert.Equal(t, map[string]int{ids[1]: 1}, markerIDs(t, kv.MemKV, "runs/"))
	assert.Equal(t, 2, st.ClearCalls, "the refused call, then one for the ids it did not name")

	// The hold is lifted: b is cleared after its delay, once.
	kv.before = nil // the hold is lifted
	clock.Advance(2 * time.Second)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Empty(t, kv.entities)
	assert.Zero(t, kv.MemKV.Len())
	for id, n := range kv.cleared {
		assert.Equal(t, 1, n, "%s cleared once", id)
	}
}

// TestAtomicAmbiguousFailure: after a ClearAndDelete that failed in a way
// that may have committed, the sweep reads which markers are left before
// it retries, splits or reschedules: committed batches count as cleared and
// are neither sent again nor rescheduled (which would write markers back
// for entities already gone).
func TestAtomicAmbiguousFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                   string
		commit                 bool
		scanErr                error
		cleared, failed, calls int
		gone, markers          int
	}{
		// Found gone: committed, by this call or another replica's.
		{name: "committed", commit: true, gone: 8, calls: 1},
		{name: "not committed", failed: 8, calls: 1 + bits.Len(8), markers: 8}, // an outage: the batch, then one path down
		{name: "unknown", commit: true, scanErr: errBoom, failed: 8, calls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base, _ := newAtomicKV(t, 8)
			kv := loseReplies(base, tc.commit, tc.scanErr)
			s, clock := newSweep(t, kv, Config{})
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			if tc.scanErr != nil {
				// The peek after the page fails too: the pass reports it.
				require.ErrorIs(t, err, errBoom)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.cleared, st.Cleared)
			assert.Equal(t, tc.gone, st.Gone)
			assert.Equal(t, tc.failed, st.Failed)
			assert.Equal(t, tc.calls, st.ClearCalls, "no batch sent again once it was found committed")
			for id, n := range kv.cleared {
				assert.Equal(t, 1, n, "%s cleared once", id)
			}
			assert.Len(t, kv.entities, tc.markers, "an entity is left iff its marker is")
			assert.Equal(t, tc.markers, kv.MemKV.Len(), "no marker written back for a gone entity")
		})
	}
}

// TestRescheduleMovesOnce: on a Mover a failed marker is moved in one
// atomic step, so there is never a moment with two markers of the id.
func TestRescheduleMovesOnce(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := newFakeKV(mem)
	c := newClears()
	c.set("a", errBoom)
	c.set("b", errBoom)
	s, clock := newSweep(t, kv.store(), Config{Clear: c.clear})
	mark(t, mem, "runs/", "a", t0)
	mark(t, mem, "runs/", "b", t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, st.Retried)
	assert.Equal(t, 1, st.PutCalls, "both markers moved in one call")
	assert.Zero(t, st.DeleteCalls)
	assert.Equal(t, map[string]int{"a": 1, "b": 1}, markerIDs(t, mem, "runs/"))
	assert.Equal(t, int64(1), kv.moves.Load())
}

// TestDuplicateMarkersMerge: several markers of one id on one page clear
// the id once and all go (on the atomic path in the same transaction); a
// marker on a later page clears the id again (Clear is idempotent), and
// goes too.
func TestDuplicateMarkersMerge(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"Clear", "ClearBatch", "ClearDeleter"} {
		for _, pageSize := range []int{16, 2} {
			t.Run(fmt.Sprintf("%s/page%d", mode, pageSize), func(t *testing.T) {
				t.Parallel()
				mem := NewMemKV()
				calls := map[string]int{}
				cfg := Config{PageSize: pageSize}
				var kv KV = mem
				var atomicStore *atomicKV
				switch mode {
				case "Clear":
					cfg.Clear = func(_ context.Context, id string) error { calls[id]++; return nil }
				case "ClearBatch":
					cfg.ClearBatch = func(_ context.Context, ids []string) error {
						for _, id := range ids {
							calls[id]++
						}
						return nil
					}
				default:
					atomicStore = atomicOver(mem)
					atomicStore.entities["x"], atomicStore.entities["y"] = true, true
					atomicStore.cleared = calls
					kv = atomicStore
				}
				mark(t, mem, "runs/", "x", t0)
				mark(t, mem, "runs/", "y", t0.Add(time.Millisecond))
				mark(t, mem, "runs/", "x", t0.Add(2*time.Millisecond)) // a second marker of x
				mark(t, mem, "runs/", "x", t0.Add(3*time.Millisecond)) // and a third
				s, clock := newSweep(t, kv, cfg)
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				if pageSize == 2 {
					// Pages [x y] and [x x]: the id is deduped page by
					// page, and cleared again on the later page.
					assert.Equal(t, map[string]int{"x": 2, "y": 1}, calls, "x cleared once a page")
					assert.Equal(t, 3, st.Cleared)
					assert.Equal(t, 1, st.Duplicates)
				} else {
					assert.Equal(t, map[string]int{"x": 1, "y": 1}, calls, "each id cleared once")
					assert.Equal(t, 2, st.Cleared)
					assert.Equal(t, 2, st.Duplicates)
				}
				assert.Zero(t, mem.Len(), "every marker went")
				if atomicStore != nil && pageSize > 2 {
					assert.Zero(t, st.DeleteCalls, "the duplicates went in the clear's transaction")
				}
			})
		}
	}
}

// TestDuplicatesOfEveryIDLength: the page's table finds the second marker
// of an id of any length, and tells apart ids that differ in one byte
// anywhere (the hash reads ids of up to 16 bytes in two loads).
func TestDuplicatesOfEveryIDLength(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	var ids []string
	for n := 1; n <= 40; n++ {
		base := []byte(strings.Repeat("a", n))
		ids = append(ids, string(base))
		for _, at := range []int{0, n / 2, n - 1} {
			other := slices.Clone(base)
			other[at] = 'b'
			if !slices.Contains(ids, string(other)) {
				ids = append(ids, string(other))
			}
		}
	}
	for i, id := range ids {
		mark(t, mem, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
		mark(t, mem, "runs/", id, t0.Add(time.Duration(len(ids)+i)*time.Millisecond))
	}
	calls := map[string]int{}
	s, clock := newSweep(t, mem, Config{PageSize: 1000, Clear: func(_ context.Context, id string) error { calls[id]++; return nil }})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	for _, id := range ids {
		assert.Equal(t, 1, calls[id], "calls of Clear(%q)", id)
	}
	assert.Equal(t, len(ids), st.Cleared)
	assert.Equal(t, len(ids), st.Duplicates)
	assert.Zero(t, mem.Len(), "every marker went")
}

// TestDuplicateOfFailedIDKeepsOne: the second marker of an id whose clear
// failed goes, and the first, moved to its retry time, stands for both.
func TestDuplicateOfFailedIDKeepsOne(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	s, clock := newSweep(t, mem, Config{Clear: c.clear})
	mark(t, mem, "runs/", "x", t0)
	mark(t, mem, "runs/", "x", t0.Add(time.Millisecond))
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, c.calls["x"])
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, map[string]int{"x": 1}, markerIDs(t, mem, "runs/"))
	c.set("x", nil)
	clock.Advance(2 * time.Second)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Zero(t, mem.Len())
}

// typedFenceKV is a store that only its own kind of lease can fence: it
// applies a fence carried on a write's context, as the adapters do.
type typedFenceKV struct {
	*MemKV
}

func (k *typedFenceKV) Delete(ctx context.Context, keys ...[]byte) error {
	if f, err := Fenced(ctx, k); f != nil || err != nil {
		if err != nil {
			return err
		}
		return f.Delete(ctx, keys...)
	}
	return k.MemKV.Delete(ctx, keys...)
}

// typedFencer fences *typedFenceKV only.
type typedFencer struct{ fencingLease }

func (l typedFencer) Fence(kv KV) (KV, bool) {
	k, ok := kv.(*typedFenceKV)
	if !ok {
		return nil, false
	}
	return fencedKV{KV: k.MemKV, lease: l.fakeLease}, true
}

type typedFencingLocker struct{ fencingLocker }

func (f *typedFencingLocker) TryAcquire(ctx context.Context) (Lease, error) {
	l, err := f.fencingLocker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return typedFencer{l.(fencingLease)}, nil
}

// loggingKV wraps a KV as users do to log or trace its calls; with unwrap
// set it has an Unwrap method.
type loggingKV struct {
	inner   KV
	deletes atomic.Int64
}

func (w *loggingKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return w.inner.Scan(ctx, start, end, limit)
}

func (w *loggingKV) Delete(ctx context.Context, keys ...[]byte) error {
	err := w.inner.Delete(ctx, keys...)
	if err == nil {
		w.deletes.Add(1)
	}
	return err
}

type unwrappingKV struct{ *loggingKV }

func (w unwrappingKV) Unwrap() KV { return w.inner }

// TestFenceThroughWrapper: a wrapper with Unwrap keeps the lease's fence
// (dropping it would let the old holder delete after losing the lease);
// one without is refused unless
// Config.AllowUnfenced says otherwise.
func TestFenceThroughWrapper(t *testing.T) {
	t.Run("Unwrap", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := NewMemKV()
			store := &typedFenceKV{MemKV: mem}
			wrapper := unwrappingKV{&loggingKV{inner: store}}
			locker := &typedFencingLocker{}
			for i := range 20 {
				mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), time.Now().Add(-2*time.Hour))
			}
			var log passLog
			var stolen atomic.Bool
			s, err := New(wrapper, Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Minute, PageSize: 4, Lease: locker,
				Clear: func(ctx context.Context, id string) error {
					if id == "m09" {
						locker.stealSilently()
						stolen.Store(true)
					}
					return nil
				},
				OnPass: log.onPass,
			})
			require.NoError(t, err)
			stop := runInBackground(t.Context(), s)
			synctest.Wait()
			assert.Equal(t, 12, mem.Len(), "the fence refused the page in flight")
			assert.Equal(t, int64(3), wrapper.deletes.Load(), "the probe of the fence (a write of nothing) and the two pages before the loss; none after")
			require.GreaterOrEqual(t, log.len(), 1)
			assert.ErrorIs(t, log.err(0), ErrLeaseLost)
			require.ErrorIs(t, stop(), context.Canceled)
		})
	})
	t.Run("no Unwrap", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := NewMemKV()
			wrapper := &loggingKV{inner: &typedFenceKV{MemKV: mem}}
			mark(t, mem, "runs/", "a", time.Now().Add(-2*time.Hour))
			locker := &typedFencingLocker{}
			s, err := New(wrapper, Config{Prefix: "runs/", Retention: time.Hour, Lease: locker,
				Clear: func(context.Context, string) error { return nil }})
			require.NoError(t, err)
			err = s.Run(t.Context())
			require.ErrorIs(t, err, ErrUnfenced)
			assert.Contains(t, err.Error(), "AllowUnfenced")
			assert.Equal(t, 1, mem.Len(), "nothing deleted unfenced")
			assert.Nil(t, locker.holder, "the lease was released")

			_, err = s.LeasedPass(t.Context())
			require.ErrorIs(t, err, ErrUnfenced)
			assert.Equal(t, 1, mem.Len())
		})
	})
	t.Run("AllowUnfenced", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := NewMemKV()
			wrapper := &loggingKV{inner: &typedFenceKV{MemKV: mem}}
			mark(t, mem, "runs/", "a", time.Now().Add(-2*time.Hour))
			s, err := New(wrapper, Config{Prefix: "runs/", Retention: time.Hour, Lease: &typedFencingLocker{}, AllowUnfenced: true,
				Clear: func(context.Context, string) error { return nil }})
			require.NoError(t, err)
			st, err := s.LeasedPass(t.Context())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Cleared)
			assert.Zero(t, mem.Len())
		})
	})
}

// TestFencedRefusesAForeignFence: a store write under a fence that cannot
// fence the store fails rather than goes out unfenced.
func TestFencedRefusesAForeignFence(t *testing.T) {
	t.Parallel()
	ctx, _ := withFence(context.Background(), typedFencer{fencingLease{&fakeLease{}}})
	view, err := Fenced(ctx, NewMemKV())
	require.ErrorIs(t, err, ErrUnfenced)
	assert.Nil(t, view)
	view, err = Fenced(context.Background(), NewMemKV())
	require.NoError(t, err)
	assert.Nil(t, view, "no fence on the context: write as usual")
}

// probeAtomic is an atomicKV that records whether its ClearAndDelete ran
// under a fence carried on its context.
type probeAtomic struct {
	*atomicKV
	fenced, unfenced atomic.Int64
}

func (p *probeAtomic) Delete(ctx context.Context, keys ...[]byte) error {
	if f, err := Fenced(ctx, p); f != nil || err != nil {
		if err != nil {
			return err
		}
		return p.MemKV.Delete(ctx, keys...) // the fake fence lets every write through
	}
	return p.MemKV.Delete(ctx, keys...)
}

func (p *probeAtomic) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if f, err := Fenced(ctx, p); f != nil && err == nil {
		p.fenced.Add(1)
	} else {
		p.unfenced.Add(1)
	}
	return p.atomicKV.ClearAndDelete(ctx, ids, keys)
}

// probeFencer fences *probeAtomic only.
type probeFencer struct{ fencingLease }

func (l probeFencer) Fence(kv KV) (KV, bool) {
	if _, ok := kv.(*probeAtomic); !ok {
		return nil, false
	}
	return kv, true
}

type probeLocker struct{ fencingLocker }

func (f *probeLocker) TryAcquire(ctx context.Context) (Lease, error) {
	l, err := f.fencingLocker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return probeFencer{l.(fencingLease)}, nil
}

// atomicWrapper wraps a ClearDeleter, with Unwrap.
type atomicWrapper struct{ inner ClearDeleter }

func (w atomicWrapper) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return w.inner.Scan(ctx, start, end, limit)
}
func (w atomicWrapper) Delete(ctx context.Context, keys ...[]byte) error {
	return w.inner.Delete(ctx, keys...)
}
func (w atomicWrapper) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return w.inner.ClearAndDelete(ctx, ids, keys)
}
func (w atomicWrapper) Unwrap() KV { return w.inner }

// TestFenceThroughAtomicWrapper: the atomic clear through a wrapper carries
// the fence on its context too.
func TestFenceThroughAtomicWrapper(t *testing.T) {
	t.Parallel()
	base, _ := newAtomicKV(t, 10)
	probe := &probeAtomic{atomicKV: base}
	s, err := New(atomicWrapper{probe}, Config{Prefix: "runs/", Retention: time.Hour, Lease: &probeLocker{},
		Clock: NewManualClock(t0.Add(2 * time.Hour)), BatchSize: 4})
	require.NoError(t, err)
	st, err := s.LeasedPass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 10, st.Cleared)
	assert.Equal(t, int64(3), probe.fenced.Load())
	assert.Zero(t, probe.unfenced.Load())
}

// TestKeptIDsStay: ids that Clear keeps are plain strings: they stay as
// they were through later pages and passes.
func TestKeptIDsStay(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	var kept []string
	s, clock := newSweep(t, mem, Config{PageSize: 100, Clear: func(_ context.Context, id string) error {
		kept = append(kept, id)
		return nil
	}})
	want := func(pass, i int) string { return fmt.Sprintf("p%d-%s-%d", pass, strings.Repeat("x", i%40), i) }
	const n = 2000 // some 80 KB of ids a pass: more than a block
	for pass := range 3 {
		for i := range n {
			mark(t, mem, "runs/", want(pass, i), t0.Add(time.Duration(pass*n+i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, n, st.Cleared)
	}
	require.Len(t, kept, 3*n)
	for pass := range 3 {
		for i := range n {
			require.Equal(t, want(pass, i), kept[pass*n+i], "id %d of pass %d", i, pass)
		}
	}
}

// TestReplicaCountsOnlyItsOwnClears: a replica whose call hung while
// another replica cleared the same markers finds them gone and counts
// them as Gone, not Cleared: the replicas' Cleared add up to the entities
// cleared.
func TestReplicaCountsOnlyItsOwnClears(t *testing.T) {
	t.Parallel()
	base, _ := newAtomicKV(t, 8)
	// Replica A's call, the store's first, waits uncommitted until
	// released, then fails as a call whose reply was lost; replica B's
	// calls come after it and commit.
	started, release := make(chan struct{}), make(chan struct{})
	base.before = func(_ context.Context, call int, _ []string, _ [][]byte) error {
		if call > 1 {
			return nil
		}
		close(started)
		<-release
		return errLostReply
	}
	a, clockA := newSweep(t, base, Config{})
	b, clockB := newSweep(t, base, Config{})
	clockA.Set(t0.Add(2 * time.Hour))
	clockB.Set(t0.Add(2 * time.Hour))
	done := make(chan Stats)
	go func() {
		st, err := a.Pass(context.Background())
		assert.NoError(t, err)
		done <- st
	}()
	<-started
	stB, err := b.Pass(context.Background())
	require.NoError(t, err)
	close(release)
	stA := <-done
	assert.Equal(t, 8, stB.Cleared, "the replica that cleared them")
	assert.Zero(t, stA.Cleared, "Pass() Cleared = %d for markers another replica cleared, want 0", stA.Cleared)
	assert.Equal(t, 8, stA.Gone)
	assert.Equal(t, 8, stA.Cleared+stB.Cleared, "the fleet's Cleared add up to the entities cleared")
	assert.Empty(t, base.entities)
}
