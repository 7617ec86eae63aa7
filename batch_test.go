package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// batchRecorder is a ClearBatch that records its calls and fails as a
// whole when a batch holds a poison id.
type batchRecorder struct {
	mu      sync.Mutex
	calls   [][]string
	cleared map[string]int
	poison  map[string]bool
	down    bool // every call fails
}

func newBatchRecorder(poison ...string) *batchRecorder {
	r := &batchRecorder{cleared: map[string]int{}, poison: map[string]bool{}}
	for _, id := range poison {
		r.poison[id] = true
	}
	return r
}

func (r *batchRecorder) clear(_ context.Context, ids []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, slices.Clone(ids))
	if r.down {
		return errors.New("downstream down")
	}
	for _, id := range ids {
		if r.poison[id] {
			return fmt.Errorf("foreign key violation on %s", id)
		}
	}
	for _, id := range ids {
		r.cleared[id]++
	}
	return nil
}

func markN(t testing.TB, kv *MemKV, n int, at time.Time) []string {
	var ids []string
	for i := range n {
		id := fmt.Sprintf("b%04d", i)
		mark(t, kv, "runs/", id, at.Add(time.Duration(i)*time.Millisecond))
		ids = append(ids, id)
	}
	return ids
}

// TestBatchSizeAbovePageSizeReadsPagesOfIt: a BatchSize above the default
// page, with PageSize left 0, gets calls of BatchSize ids, not of a page.
func TestBatchSizeAbovePageSizeReadsPagesOfIt(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	r := newBatchRecorder()
	s, clock := newSweep(t, kv, Config{ClearBatch: r.clear, BatchSize: 500})
	markN(t, kv, 1000, t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1000, st.Cleared)
	assert.Equal(t, 500, st.BatchSize)
	var sizes []int
	for _, c := range r.calls {
		sizes = append(sizes, len(c))
	}
	assert.Equal(t, []int{500, 500}, sizes, "ClearBatch calls")
}

// TestBatchPoisonIsolated: one id whose batch always fails as a whole costs
// about 2·log2(BatchSize) extra calls, and every other id is cleared once.
func TestBatchPoisonIsolated(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		batch, conc int
	}{{100, 1}, {64, 4}, {7, 2}, {1, 1}} {
		t.Run(fmt.Sprintf("batch%d/conc%d", tt.batch, tt.conc), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			r := newBatchRecorder("b0137")
			s, clock := newSweep(t, kv, Config{ClearBatch: r.clear, BatchSize: tt.batch, Concurrency: tt.conc, PageSize: 256})
			ids := markN(t, kv, 1000, t0)
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 999, st.Cleared)
			assert.Equal(t, 1, st.Failed)
			assert.Equal(t, 1, st.Retried)
			assert.Equal(t, map[string]int{"b0137": 1}, markerIDs(t, kv, "runs/"))
			for _, id := range ids {
				if id != "b0137" {
					require.Equal(t, 1, r.cleared[id], "id %s cleared once", id)
				}
			}
			batches := (1000 + tt.batch - 1) / tt.batch // pages of 256 cut the last batch of each page short
			if tt.batch < 256 {
				batches = 0
				for page := 1000; page > 0; page -= 256 {
					batches += (min(page, 256) + tt.batch - 1) / tt.batch
				}
			}
			extra := 2*bits.Len(uint(tt.batch)) + probes // and a few ids tried alone, should the failures look like an outage
			assert.LessOrEqual(t, len(r.calls), batches+extra, "calls")
			assert.Equal(t, len(r.calls), st.ClearCalls)
			for _, c := range r.calls {
				assert.LessOrEqual(t, len(c), tt.batch)
				assert.True(t, slices.IsSorted(c), "a batch goes oldest first")
			}
		})
	}
}

// TestBatchOutage: with the dependency down, the first batch of the pass
// costs at most log2(BatchSize)+2 calls (the batch and one path of its
// bisection towards single ids), every later batch one call, not one per
// id, and every id backs off.
func TestBatchOutage(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	r := newBatchRecorder()
	r.down = true
	s, clock := newSweep(t, kv, Config{ClearBatch: r.clear, BatchSize: 100})
	markN(t, kv, 1000, t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1000, st.Failed)
	assert.Equal(t, 1000, st.Retried)
	assert.Equal(t, 1+bits.Len(100)+(4*3-1), st.ClearCalls, "4 pages of 3 batches (100, 100, the rest): the first bisected down one path, the others one call each")
	assert.Equal(t, st.ClearCalls, st.FailedCalls)
	assert.LessOrEqual(t, 1+bits.Len(100), int(math.Log2(100))+2)
	assert.Len(t, markerIDs(t, kv, "runs/"), 1000)

	// Within the retry delay: nothing is called.
	clock.Advance(500 * time.Millisecond)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.ClearCalls)

	// The dependency is back: after the delay everything is cleared.
	r.mu.Lock()
	r.down = false
	r.mu.Unlock()
	clock.Advance(time.Second)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1000, st.Cleared)
	assert.Zero(t, kv.Len())
}

// TestBatchErrorPerID: ids reported one by one in a BatchError keep their
// markers (or drop them, for ErrLiveAgain); the rest are cleared, with no
// bisection.
func TestBatchErrorPerID(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	var calls int
	s, clock := newSweep(t, kv, Config{BatchSize: 50, ClearBatch: func(_ context.Context, ids []string) error {
		calls++
		return fmt.Errorf("partly: %w", BatchError{
			"b0003": errors.New("locked"),
			"b0004": fmt.Errorf("resumed: %w", ErrLiveAgain),
		})
	}})
	markN(t, kv, 10, t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, calls)
	assert.Equal(t, 8, st.Cleared)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.LiveAgain)
	assert.Equal(t, map[string]int{"b0003": 1}, markerIDs(t, kv, "runs/"))
	assert.Contains(t, BatchError{"a": errBoom, "b": errBoom}.Error(), `2 ids of the batch not cleared; "a": boom; "b": boom`)
}

// TestBatchErrorNamingAnotherID: a BatchError that names an id not in the
// batch (ids formatted differently, say) says nothing trustworthy of the
// others: the call fails as a whole and no marker goes.
func TestBatchErrorNamingAnotherID(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	var logs syncBuffer
	s, clock := newSweep(t, kv, Config{BatchSize: 50, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		ClearBatch: func(_ context.Context, ids []string) error {
			return BatchError{"job-" + ids[0]: errBoom}
		}})
	markN(t, kv, 4, t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.Cleared)
	assert.Equal(t, 4, st.Failed)
	assert.Len(t, markerIDs(t, kv, "runs/"), 4)
	assert.Contains(t, logs.String(), `names \"job-b0000\", which is not in the batch`)
}

// TestBatchNeverReturnsNormally: a ClearBatch that panics or calls
// runtime.Goexit for a batch holding a poison id fails that call only.
func TestBatchNeverReturnsNormally(t *testing.T) {
	t.Parallel()
	for name, die := range map[string]func(){
		"panic":  func() { panic("kaboom") },
		"goexit": runtime.Goexit,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			s, clock := newSweep(t, kv, Config{BatchSize: 16, Concurrency: 3, ClearBatch: func(_ context.Context, ids []string) error {
				if slices.Contains(ids, "b0042") {
					die()
				}
				return nil
			}})
			markN(t, kv, 100, t0)
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 99, st.Cleared)
			assert.Equal(t, 1, st.Failed)
			assert.Equal(t, map[string]int{"b0042": 1}, markerIDs(t, kv, "runs/"))
		})
	}
}

// TestBatchTimeoutAndLiveAgain: a batch call that hangs is cut off by
// ClearTimeout; a whole-call ErrLiveAgain drops every marker of the batch.
func TestBatchTimeoutAndLiveAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, BatchSize: 5, ClearTimeout: time.Second, BatchTarget: -1, // batches of 5 throughout
			ClearBatch: func(ctx context.Context, ids []string) error {
				switch {
				case slices.Contains(ids, "b0002"):
					<-ctx.Done()
					return ctx.Err()
				case slices.Contains(ids, "b0007"):
					return fmt.Errorf("resumed: %w", ErrLiveAgain)
				}
				return nil
			}})
		require.NoError(t, err)
		markN(t, kv, 15, time.Now().Add(-2*time.Hour))
		st, err := s.Pass(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, st.Failed, "the hanging id, isolated")
		assert.Equal(t, 5, st.LiveAgain)
		assert.Equal(t, 9, st.Cleared)
		assert.Equal(t, map[string]int{"b0002": 1}, markerIDs(t, kv, "runs/"))
	})
}

// TestBatchCancelled: cancelling the pass mid-batch deletes nothing of the
// page in flight.
func TestBatchCancelled(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	ctx, cancel := context.WithCancel(context.Background())
	s, clock := newSweep(t, kv, Config{BatchSize: 4, PageSize: 16, ClearBatch: func(_ context.Context, ids []string) error {
		if slices.Contains(ids, "b0021") {
			cancel()
			return context.Canceled
		}
		return nil
	}})
	markN(t, kv, 40, t0)
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 40-16, kv.Len(), "the first page was deleted, the page in flight was not")
}

// TestClearDeleter: a KV that clears and deletes in one transaction is
// called once per batch, the sweep deletes nothing itself, and a poison id
// is isolated by bisection with nothing half done.
func TestClearDeleter(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := atomicOver(mem)
	kv.poison["b0077"] = true
	s, clock := newSweep(t, kv, Config{BatchSize: 50, PageSize: 200})
	for _, id := range markN(t, mem, 500, t0) {
		kv.entities[id] = true
	}
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 499, st.Cleared)
	assert.Equal(t, 1, st.Failed)
	assert.Zero(t, st.DeleteCalls, "the store deleted the markers with the entities")
	assert.Equal(t, 1, st.PutCalls, "the sweep moved the failed one")
	assert.Equal(t, map[string]bool{"b0077": true}, kv.entities)
	assert.Equal(t, map[string]int{"b0077": 1}, markerIDs(t, mem, "runs/"))
	for id, n := range kv.cleared {
		require.Equal(t, 1, n, "%s cleared once", id)
	}
	assert.Equal(t, st.ClearCalls, kv.calls)
	assert.LessOrEqual(t, kv.calls, 10+2*6+probes, "10 batches and the bisection of one (and a few probes)")
}

// TestClearDeleterNeedsFencedView: under a lease whose fence cannot give a
// ClearDeleter view, the pass fails instead of clearing in one transaction
// and deleting in another.
func TestClearDeleterNeedsFencedView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		kv := atomicOver(mem)
		markN(t, mem, 10, time.Now().Add(-2*time.Hour))
		var log passLog
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Lease: &fencingLocker{}, OnPass: log.onPass})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		synctest.Wait()
		require.GreaterOrEqual(t, log.len(), 1)
		require.Error(t, log.err(0))
		assert.Contains(t, log.err(0).Error(), "no ClearDeleter")
		assert.Equal(t, 10, mem.Len())
		assert.Empty(t, kv.cleared)
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

// TestBatchPoisonDensity: with poison ids at 0.5%, 1% and 5% of a backlog
// and BatchSize 100 to 1,000, every healthy id is cleared in the first pass,
// Failed is the number of poison ids, and the calls stay within about
// batches + poison·2·log2(BatchSize). The poison ids then go alone.
func TestBatchPoisonDensity(t *testing.T) {
	t.Parallel()
	const n = 20_000
	for _, density := range []float64{0.005, 0.01, 0.05} {
		for _, batch := range []int{100, 500, 1000} {
			t.Run(fmt.Sprintf("poison%.1f%%/batch%d", 100*density, batch), func(t *testing.T) {
				t.Parallel()
				kv := NewMemKV()
				ids := markN(t, kv, n, t0)
				rnd := rand.New(rand.NewPCG(uint64(batch), uint64(density*1000)))
				var poison []string
				for _, i := range rnd.Perm(n)[:int(density*n)] {
					poison = append(poison, ids[i])
				}
				r := newBatchRecorder(poison...)
				s, clock := newSweep(t, kv, Config{ClearBatch: r.clear, BatchSize: batch, PageSize: 1000})
				clock.Set(t0.Add(24 * time.Hour))
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, n-len(poison), st.Cleared, "every healthy id cleared in the first pass")
				assert.Equal(t, len(poison), st.Failed, "Failed is the poison count")
				batches := (n + batch - 1) / batch
				bound := batches + len(poison)*2*bits.Len(uint(batch))
				assert.LessOrEqual(t, st.ClearCalls, bound, "calls within batches + poison·2·log2(BatchSize)")
				assert.GreaterOrEqual(t, st.FailedCalls, len(poison), "each poison id failed alone at least once, and those calls count")
				t.Logf("%d ids, %d poison, BatchSize %d: %d calls (%d failed), bound %d", n, len(poison), batch, st.ClearCalls, st.FailedCalls, bound)

				// Next time, the poison ids go alone: one call each.
				clock.Advance(2 * time.Second)
				st, err = s.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, len(poison), st.ClearCalls, "poison ids are tried alone")
				for _, c := range r.calls[len(r.calls)-st.ClearCalls:] {
					assert.Len(t, c, 1)
				}
			})
		}
	}
}

// TestBatchOutageCallsPerBatch: with every call failing, a batch costs at
// most log2(BatchSize)+2 calls, whatever its size.
func TestBatchOutageCallsPerBatch(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{2, 3, 7, 64, 100, 500, 1000, 4096} {
		t.Run(fmt.Sprint(batch), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			markN(t, kv, batch, t0)
			r := newBatchRecorder()
			r.down = true
			s, clock := newSweep(t, kv, Config{ClearBatch: r.clear, BatchSize: batch, PageSize: batch})
			clock.Set(t0.Add(24 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, batch, st.Failed)
			assert.LessOrEqual(t, float64(st.ClearCalls), math.Log2(float64(batch))+2)
		})
	}
}

// TestAtomicDuplicateGoesWhenAnotherReplicaClearedTheID: several replicas
// without a lease clear an id once, and every marker of it goes. Replica
// B's page holds both markers k1, k2 of id x; replica A (whose page held
// only k1) commits x with k1 first. B's call fails with ErrMarkerGone; B
// reads which markers are left and must not keep k2 as if it had gone in
// the same transaction, or the next pass clears x a second time with k2.
func TestAtomicDuplicateGoesWhenAnotherReplicaClearedTheID(t *testing.T) {
	t.Parallel()
	kv := atomicOver(nil)
	const prefix = "runs/"
	k1 := mark(t, kv.MemKV, prefix, "x", t0.Add(-3*time.Hour))
	k2 := mark(t, kv.MemKV, prefix, "x", t0.Add(-2*time.Hour))
	first := true
	kv.before = func(_ context.Context, _ int, ids []string, keys [][]byte) error {
		if first {
			first = false
			// Replica A's commit of x with its one marker k1.
			require.NoError(t, kv.commit(context.Background(), []string{"x"}, [][]byte{k1}))
		}
		return nil
	}
	s, _ := newSweep(t, kv, Config{Prefix: prefix})
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	t.Logf("pass 1: %+v, k2 left: %v", st, has(t, kv.MemKV, k2))
	_, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, kv.cleared["x"], "x must be cleared exactly once across the replicas")
	assert.False(t, has(t, kv.MemKV, k2), "every marker of x goes once x is cleared")
}

// TestAtomicDuplicateMovesWithFailedMarker: x has two markers on one page
// and its atomic clear fails. The duplicate moves onto the first marker's
// retry key in the same Move, so no separate Delete is left to fail (or to
// be lost to a crash) leaving a second marker of x in the expired range:
// after a restart, x is cleared exactly once.
func TestAtomicDuplicateMovesWithFailedMarker(t *testing.T) {
	t.Parallel()
	kv := atomicOver(nil)
	const prefix = "runs/"
	mark(t, kv.MemKV, prefix, "x", t0.Add(-3*time.Hour))
	mark(t, kv.MemKV, prefix, "x", t0.Add(-2*time.Hour))
	kv.before = func(context.Context, int, []string, [][]byte) error {
		return BatchError{"x": errBoom}
	}
	kv.onDelete = failWith(errors.New("store down (or SIGKILL)"))
	s, clock := newSweep(t, kv, Config{Prefix: prefix})
	_, err := s.Pass(context.Background())
	// The duplicate moves onto the first's new key in the same Move, so the
	// pass makes no Delete for the failing Delete to hit.
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"x": 1}, markerIDs(t, kv, prefix), "one marker of x after the reschedule")
	t.Logf("after pass 1: %v", markerIDs(t, kv, prefix))

	// Restart: a new Sweep, the faults gone.
	kv.mu.Lock()
	kv.before = nil
	kv.mu.Unlock()
	kv.setHooks(nil, nil, nil)
	s2, err := New(kv, Config{Prefix: prefix, Retention: time.Hour, Clock: clock})
	require.NoError(t, err)
	_, err = s2.Pass(context.Background())
	require.NoError(t, err)
	clock.Advance(time.Hour)
	_, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, kv.cleared["x"], "x cleared exactly once on the atomic path (markers now: %v)", markerIDs(t, kv, prefix))
}

// outagePasses runs passes over 256 markers in batches of 64 with the
// dependency down, each pass once the retries fall due, and returns the
// ClearCalls of each pass.
func outagePasses(t testing.TB, passes int, cfg Config) ([]Stats, *batchRecorder, *MemKV) {
	t.Helper()
	kv := NewMemKV()
	r := newBatchRecorder()
	r.down = true
	cfg.ClearBatch, cfg.BatchSize, cfg.PageSize = r.clear, 64, 256
	s, clock := newSweep(t, kv, cfg)
	markN(t, kv, 256, t0)
	clock.Set(t0.Add(2 * time.Hour))
	var out []Stats
	for range passes {
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		out = append(out, st)
		if st.NextDue.IsZero() {
			break // all parked
		}
		clock.Set(st.NextDue.Add(time.Second)) // past every jittered retry of the pass
	}
	return out, r, kv
}

// TestOutageLaterPassesStillBatch: ids an outage put off carry an attempt
// in their retry keys, yet the next pass of the same outage does not send
// each alone: it stays within log2(BatchSize)+2 calls per batch.
func TestOutageLaterPassesStillBatch(t *testing.T) {
	t.Parallel()
	sts, _, _ := outagePasses(t, 2, Config{})
	perBatch := bits.Len(64) + 2
	assert.LessOrEqual(t, sts[0].ClearCalls, 4*perBatch, "first pass of the outage")
	assert.LessOrEqual(t, sts[1].ClearCalls, 4*perBatch,
		"second pass of the same outage: 4 batches of 64, want at most %d calls, not one per id", 4*perBatch)
}

// TestRecoveryAfterOutageClearsInBatches: once the dependency is back,
// the ids an outage put off (never found at fault) are cleared in batches,
// not one call each.
func TestRecoveryAfterOutageClearsInBatches(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	r := newBatchRecorder()
	r.down = true
	s, clock := newSweep(t, kv, Config{ClearBatch: r.clear, BatchSize: 64, PageSize: 256})
	markN(t, kv, 256, t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 256, st.Failed)
	r.mu.Lock()
	r.down = false
	r.mu.Unlock()
	clock.Set(st.NextDue.Add(time.Second))
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 256, st.Cleared)
	assert.LessOrEqual(t, st.ClearCalls, 4+4, "256 healthy ids in batches of 64 after an outage: want about 4 calls, got one per id")
}

// TestOutageParksNothing: with MaxAttempts, an outage lasting MaxAttempts
// passes parks none of the ids it put off: not their fault.
func TestOutageParksNothing(t *testing.T) {
	t.Parallel()
	sts, _, kv := outagePasses(t, 3, Config{MaxAttempts: 3})
	parked := 0
	for _, st := range sts {
		parked += st.Parked
	}
	assert.Zero(t, parked, "an outage of three passes parked %d of 256 healthy markers", parked)
	assert.Less(t, len(keysUnder(t, kv, "runs/p")), 256, "the whole backlog sits in the parked range")
}

// TestMidPassOutageIsNotBisectedToSingleIDs: a dependency that goes down
// after a call of the pass succeeded is still detected as an outage: each
// later batch of 64 costs at most log2(64)+2 calls, not 2·64-1.
func TestMidPassOutageIsNotBisectedToSingleIDs(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	var calls atomic.Int64
	clear := func(_ context.Context, ids []string) error {
		if calls.Add(1) == 1 {
			return nil // the first batch goes through, then the dependency dies
		}
		return errors.New("connection refused")
	}
	s, clock := newSweep(t, kv, Config{ClearBatch: clear, BatchSize: 64, PageSize: 256})
	markN(t, kv, 256, t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 64, st.Cleared)
	perBatch := bits.Len(64) + 2
	assert.LessOrEqual(t, st.ClearCalls, 1+3*perBatch,
		"3 batches after the dependency went down: want at most %d calls each, got %d calls in all", perBatch, st.ClearCalls)
}

// TestAtomicUnknownOutcomeIsAFailedCall: a ClearDeleter call that failed
// and whose outcome could not be read back ends its ids unknown (Failed),
// and the call is counted in FailedCalls.
func TestAtomicUnknownOutcomeIsAFailedCall(t *testing.T) {
	t.Parallel()
	base, _ := newAtomicKV(t, 8)
	kv := loseReplies(base, false, errBoom)
	s, clock := newSweep(t, kv, Config{})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, 8, st.Failed)
	require.Equal(t, 1, st.ClearCalls)
	assert.Equal(t, 1, st.FailedCalls, "the one call failed")
}

// TestAtomicLostReplyOverRetryRange: on the atomic path, a call over
// retry-range keys that committed but reported an error is found committed
// by the read of which markers are left (the read covers the retry range),
// counted once as found gone and not sent again.
func TestAtomicLostReplyOverRetryRange(t *testing.T) {
	t.Parallel()
	base := atomicOver(NewMemKV())
	kv := loseReplies(base, true, nil)
	s, clock := newSweep(t, kv, Config{})
	now := t0.Add(3 * time.Hour)
	clock.Set(now)
	for i := range 5 {
		id := fmt.Sprintf("r%d", i)
		key := appendRetryKey(nil, "runs/", 0, now.UnixMilli()-10, t0.UnixMilli()+int64(i), 0, id)
		require.NoError(t, base.MemKV.Put(context.Background(), key, nil))
		base.entities[id] = true
	}
	mark(t, base.MemKV, "runs/", "fresh", t0) // not in the retry range: a Scan of the wrong range would see it
	base.entities["fresh"] = true
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 6, st.Gone, "committed, found gone: who cleared them, the store cannot tell")
	for id, n := range base.cleared {
		assert.Equal(t, 1, n, id)
	}
	assert.Zero(t, base.MemKV.Len())
}

// TestAtomicMarkerMovedByAnotherReplicaIsGoneNotCleared: after an
// ambiguous failure, a marker another replica moved to its retry range
// (its clear failed) is gone from this replica's view: it is counted as
// found gone, not as this replica's clear, and nothing is lost (the moved
// marker waits in the retry range).
func TestAtomicMarkerMovedByAnotherReplicaIsGoneNotCleared(t *testing.T) {
	t.Parallel()
	base := atomicOver(NewMemKV())
	// The first call finds another replica's reschedule under way: the
	// marker is moved to the retry range (that replica's clear failed),
	// and the call times out without committing.
	base.before = func(ctx context.Context, call int, ids []string, keys [][]byte) error {
		if call > 1 {
			return nil
		}
		to := appendRetryKey(nil, "runs/", 0, t0.Add(5*time.Hour).UnixMilli(), t0.UnixMilli(), 1, ids[0])
		_ = base.MemKV.Move(ctx, keys[:1], [][]byte{to})
		return errLostReply
	}
	kv := base
	s, clock := newSweep(t, kv, Config{BatchSize: 1})
	mark(t, base.MemKV, "runs/", "x", t0)
	base.entities["x"] = true
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.True(t, base.entities["x"], "x was not cleared by anyone")
	require.Len(t, keysUnder(t, base.MemKV, "runs/r"), 1, "its marker waits in the retry range")
	// This replica cannot tell a marker another replica moved from one it
	// cleared without a read of the retry range per id, so it counts the
	// marker found gone, not cleared.
	assert.Zero(t, st.Cleared, "not counted as this replica's clear")
	assert.Equal(t, 1, st.Gone, "counted as found gone")
}

// TestHeldBatchesAreNoOutage: batches that fail as a whole (poison ids,
// bisected) followed by batches whose ids are all held: the holds answer
// for the dependency, so the held ids are held, not put off as in an
// outage, and nothing held is counted as failed.
func TestHeldBatchesAreNoOutage(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	all := markN(t, mem, 40, t0)
	poison := map[string]bool{}
	for _, id := range all[:16] {
		poison[id] = true
	}
	until := t0.Add(9 * time.Hour)
	s, clock := newSweep(t, mem, Config{BatchSize: 4, ClearBatch: func(_ context.Context, ids []string) error {
		perID := BatchError{}
		for _, id := range ids {
			if poison[id] {
				return errBoom
			}
			perID[id] = Hold(until)
		}
		return perID
	}})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 24, st.Held, "every healthy id held, none put off")
	assert.Equal(t, 16, st.Failed)
	assert.Equal(t, 16, st.Retried)
	b, err := s.Backlog(context.Background(), 100)
	require.NoError(t, err)
	assert.Equal(t, 24, b.Held)
	assert.Equal(t, 16, b.Retrying)
}

// TestClearDeleterMixedBatchError: a ClearDeleter's BatchError with a
// hold, a failure and a live-again entry: the held id is held (its marker
// and a duplicate moved to one held key), the failed one retried, the
// live-again one's marker dropped with its entity kept, and the others
// sent again and cleared once.
func TestClearDeleterMixedBatchError(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := atomicOver(mem)
	kv.before = refuse(map[string]error{
		"b0001": Hold(t0.Add(9 * time.Hour)),
		"b0002": errBoom,
		"b0003": fmt.Errorf("resumed: %w", ErrLiveAgain),
	})
	for _, id := range markN(t, mem, 10, t0) {
		kv.entities[id] = true
	}
	mark(t, mem, "runs/", "b0001", t0.Add(20*time.Millisecond)) // a duplicate of the held id
	s, clock := newSweep(t, kv, Config{BatchSize: 20})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Held)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.LiveAgain)
	assert.Equal(t, 7, st.Cleared)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, map[string]bool{"b0001": true, "b0002": true, "b0003": true}, kv.entities)
	assert.Equal(t, map[string]int{"b0001": 1, "b0002": 1}, markerIDs(t, mem, "runs/"))
	for id, n := range kv.cleared {
		assert.Equal(t, 1, n, id)
	}
}

// TestClearDeleterWholeCallHold: a ClearDeleter that refuses a whole call
// with Hold commits nothing: no id cleared, no failure, no failed call,
// every marker (and a duplicate) on a held key.
func TestClearDeleterWholeCallHold(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	until := t0.Add(9 * time.Hour)
	kv := atomicOver(mem)
	kv.before = func(context.Context, int, []string, [][]byte) error { return fmt.Errorf("legal: %w", Hold(until)) }
	s, clock := newSweep(t, kv, Config{BatchSize: 5})
	markN(t, mem, 10, t0)
	mark(t, mem, "runs/", "b0004", t0.Add(30*time.Millisecond))
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 10, st.Held)
	assert.Equal(t, 1, st.Duplicates)
	assert.Zero(t, st.Cleared+st.Failed+st.FailedCalls+st.Retried)
	assert.Len(t, keysUnder(t, mem, "runs/r"), 10)
	assert.Empty(t, kv.cleared)
}

// TestFastHeldCallsGrowBatchesBack: after one slow call halves the
// batches, fast calls grow them back, whether they answer nil or hold
// every id: a hold is an answer, as a nil is.
func TestFastHeldCallsGrowBatchesBack(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("held=%v", held), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			markN(t, mem, 64, t0)
			var clock *ManualClock
			first := true
			s, clock := newSweep(t, mem, Config{BatchSize: 8, BatchTarget: 100 * time.Millisecond, ClearBatch: func(context.Context, []string) error {
				if first {
					first = false
					clock.Advance(time.Second) // one slow call: the batches halve
				}
				if held {
					return Hold(t0.Add(9 * time.Hour))
				}
				return nil
			}})
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 8, st.BatchSize, "fast calls after the slow one grow the batches back")
		})
	}
}

// TestTypedNilWrapperErrorFailsItsBatch: a ClearBatch whose error is a
// typed nil with an Unwrap method fails its call, on workers too; it
// neither panics out of Pass nor kills the process.
func TestTypedNilWrapperErrorFailsItsBatch(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 3} {
		kv := NewMemKV()
		s, clock := newSweep(t, kv, Config{Concurrency: concurrency, BatchSize: 2, ClearBatch: func(context.Context, []string) error {
			var e *nilSafeWrapErr
			return e
		}})
		for i := range 6 {
			mark(t, kv, "runs/", "typednil"+itoa(i), t0.Add(time.Duration(i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err, "Concurrency %d", concurrency)
		assert.Zero(t, st.Cleared, "Concurrency %d", concurrency)
		assert.Equal(t, 6, st.Failed, "Concurrency %d", concurrency)
		assert.Len(t, markerIDs(t, kv, "runs/"), 6, "Concurrency %d: every marker stays", concurrency)
	}
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

// TestStorePanicReadingAfterAmbiguousAtomicCallReachesCaller: a store
// whose Scan panics while the sweep reads which markers a ClearDeleter's
// failed call left (on a batch's goroutine) makes Pass panic on its
// caller's goroutine with the store's value, as any other store panic
// under a pass does, and does not crash the process. It runs in a child
// process so that a crash is seen.
func TestStorePanicReadingAfterAmbiguousAtomicCallReachesCaller(t *testing.T) {
	inChildProcess(t, func() {
		mem := NewMemKV()
		a := atomicOver(mem)
		for i := range 4 {
			mark(t, mem, "runs/", fmt.Sprintf("a%d", i), t0.Add(time.Duration(i)*time.Millisecond))
		}
		a.after = func(_ int, err error) error {
			a.setHooks(func(context.Context, int64) error { panic("store bug") }, nil, nil)
			return errors.Join(err, errBoom) // committed or not: the store cannot say
		}
		s, clock := newSweep(t, a, Config{PageSize: 4, BatchSize: 4})
		clock.Set(t0.Add(2 * time.Hour))
		assert.PanicsWithValue(t, "store bug", func() { _, _ = s.Pass(context.Background()) })
	})
}

// TestClockPanicOnClearWorkerReachesCaller: a Config.Clock that panics
// when a clear worker reads it (for the Limiter's wait) makes Pass panic
// on its caller's goroutine, and does not crash the process. It runs in a
// child process so that a crash is seen.
func TestClockPanicOnClearWorkerReachesCaller(t *testing.T) {
	inChildProcess(t, func() {
		kv := NewMemKV()
		for i := range 8 {
			mark(t, kv, "runs/", fmt.Sprintf("a%d", i), t0.Add(time.Duration(i)*time.Millisecond))
		}
		clock := &panicAfterClock{ManualClock: NewManualClock(t0.Add(2 * time.Hour))}
		s, _ := newSweep(t, kv, Config{Clock: clock, Concurrency: 4, PageSize: 8, Limiter: rate.NewLimiter(rate.Limit(1e6), 1),
			Clear: func(context.Context, string) error {
				clock.panicking.Store(true)
				return nil
			}})
		assert.PanicsWithValue(t, "clock bug", func() { _, _ = s.Pass(context.Background()) })
	})
}

// panicAfterClock is a ManualClock whose Now panics once panicking is set.
type panicAfterClock struct {
	*ManualClock
	panicking atomic.Bool
}

func (c *panicAfterClock) Now() time.Time {
	if c.panicking.Load() {
		panic("clock bug")
	}
	return c.ManualClock.Now()
}
