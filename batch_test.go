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
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// atomicKV is a ClearDeleter over a MemKV: entities live in a map, and a
// ClearAndDelete removes entities and markers under one lock, or neither.
type atomicKV struct {
	*MemKV
	mu       sync.Mutex
	entities map[string]bool
	cleared  map[string]int
	poison   map[string]bool
	calls    int
}

func (a *atomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	want := map[string]bool{}
	for _, id := range ids {
		if a.poison[id] {
			return fmt.Errorf("constraint violated by %s", id)
		}
		want[id] = true
	}
	for _, key := range keys {
		_, gotID, err := ParseMarkerKey("runs/", key)
		if err != nil || !want[string(gotID)] {
			return fmt.Errorf("key %q is not the marker of an id of the batch", key)
		}
		if _, ok, _ := a.MemKV.Get(ctx, key); !ok {
			return fmt.Errorf("%w: %q", ErrMarkerGone, key)
		}
	}
	for _, id := range ids {
		delete(a.entities, id)
		a.cleared[id]++
	}
	return a.MemKV.Delete(ctx, keys...)
}

// TestClearDeleter: a KV that clears and deletes in one transaction is
// called once per batch, the sweep deletes nothing itself, and a poison id
// is isolated by bisection with nothing half done.
func TestClearDeleter(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := &atomicKV{MemKV: mem, entities: map[string]bool{}, cleared: map[string]int{}, poison: map[string]bool{"b0077": true}}
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
		kv := &atomicKV{MemKV: mem, entities: map[string]bool{}, cleared: map[string]int{}, poison: map[string]bool{}}
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
