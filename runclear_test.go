package retention

import (
	"context"
	"errors"
	"fmt"
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

// newRunKV returns a runKV holding n markers finished at t0 (markN) and
// their entities, and the markers' ids.
func newRunKV(t testing.TB, n int) (*runKV, []string) {
	mem := NewMemKV()
	kv := runOver(mem)
	ids := markN(t, mem, n, t0)
	for _, id := range ids {
		kv.entities[id] = true
	}
	return kv, ids
}

// TestRunClearerClearsTheExpiredRangeInRuns: the store picks each batch,
// so the expired range is never scanned, and a run short of its limit
// ends it; the markers not expired stay.
func TestRunClearerClearsTheExpiredRangeInRuns(t *testing.T) {
	t.Parallel()
	kv, ids := newRunKV(t, 25)
	late := mark(t, kv.MemKV, "runs/", "late", t0.Add(2*time.Hour))
	s, clock := newSweep(t, kv, Config{BatchSize: 10})
	clock.Advance(time.Hour + time.Second)
	kv.reset()

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 25, st.Cleared)
	assert.Equal(t, 3, st.ClearCalls, "runs of 10, 10 and 5")
	assert.Equal(t, int64(3), kv.runs.Load())
	assert.Equal(t, int64(2), kv.scans.Load(), "Scans: the key past the expired range and the retry range, none of the expired range")
	assert.Equal(t, int64(0), kv.deletes.Load())
	assert.Equal(t, time.Second, st.MaxLag)
	assert.Equal(t, t0.Add(3*time.Hour), st.NextDue)
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
	assert.Equal(t, []string{string(late)}, keysUnder(t, kv, "runs/"))
}

// TestRunClearerDuplicatesGoWithTheirFirst: a run that holds two markers
// of an id clears the entity once and counts the second a duplicate.
func TestRunClearerDuplicatesGoWithTheirFirst(t *testing.T) {
	t.Parallel()
	kv, ids := newRunKV(t, 4)
	mark(t, kv.MemKV, "runs/", ids[1], t0.Add(time.Minute))
	s, clock := newSweep(t, kv, Config{})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 4, st.Cleared)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, 1, kv.cleared[ids[1]])
	assert.Empty(t, keysUnder(t, kv, "runs/"))
}

// TestRunRefusedForAKeyNotAMarker: a key of the range that is no marker
// makes the store refuse the run; the sweep reads that page itself,
// leaves the key alone, and goes on in runs after it.
func TestRunRefusedForAKeyNotAMarker(t *testing.T) {
	t.Parallel()
	kv, ids := newRunKV(t, 30)
	foreignKey := []byte("runs/0000000/not-a-marker") // sorts before the markers
	require.NoError(t, kv.Put(context.Background(), foreignKey, nil))
	s, clock := newSweep(t, kv, Config{BatchSize: 10, PageSize: 10})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 30, st.Cleared)
	assert.Equal(t, 1, st.Foreign)
	assert.Zero(t, st.FailedCalls, "a refused run is no failed call")
	assert.Equal(t, int64(4), kv.runs.Load(), "refused, then after the page of 10 keys: 10, 10 and 1")
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
	assert.Equal(t, []string{string(foreignKey)}, keysUnder(t, kv, "runs/"))
}

// TestRunClearerThatCannotRunIsAskedOnce: a store that says it cannot
// clear runs is cleared page by page, and not asked again.
func TestRunClearerThatCannotRunIsAskedOnce(t *testing.T) {
	t.Parallel()
	kv, _ := newRunKV(t, 5)
	kv.unsupported = true
	s, clock := newSweep(t, kv, Config{})
	clock.Advance(2 * time.Hour)
	for range 2 {
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Zero(t, st.FailedCalls)
	}
	assert.Equal(t, int64(1), kv.runs.Load())
	assert.Empty(t, keysUnder(t, kv, "runs/"))
}

// TestFailedRunFallsBackToPages: a run that fails changes nothing; the
// sweep reads the page and clears it by ClearAndDelete, bisecting around
// the id at fault, whose marker then waits in the retry range: the next
// pass clears in runs again.
func TestFailedRunFallsBackToPages(t *testing.T) {
	t.Parallel()
	kv, ids := newRunKV(t, 8)
	kv.poison[ids[3]] = true
	s, clock := newSweep(t, kv, Config{RetryDelay: time.Minute})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 7, st.Cleared)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, int64(1), kv.runs.Load())
	assert.GreaterOrEqual(t, st.FailedCalls, 2, "the run, then the page's batch")

	more := mark(t, kv.MemKV, "runs/", "more", t0.Add(time.Minute))
	kv.entities["more"] = true
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, int64(2), kv.runs.Load(), "a run while %s waits in the retry range", ids[3])
	assert.False(t, has(t, kv.MemKV, more))
}

// TestLostRunReplyClearsNothingTwice: a run that committed but whose reply
// was lost is counted gone when its keys came back with the error, and
// not at all when they did not; the page read after it finds its markers
// gone, and every entity is cleared once.
func TestLostRunReplyClearsNothingTwice(t *testing.T) {
	t.Parallel()
	for _, keysLost := range []bool{false, true} {
		t.Run(fmt.Sprintf("keys lost %v", keysLost), func(t *testing.T) {
			t.Parallel()
			kv, ids := newRunKV(t, 12)
			kv.keysLost = keysLost
			kv.after = func(call int, err error) error {
				if call == 1 && err == nil {
					return errLostReply
				}
				return err
			}
			s, clock := newSweep(t, kv, Config{BatchSize: 5, PageSize: 5})
			clock.Advance(2 * time.Hour)

			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 7, st.Cleared)
			if keysLost {
				assert.Zero(t, st.Gone, "nothing tells which markers the run took")
				assert.Equal(t, 1, st.FailedCalls)
			} else {
				assert.Equal(t, 5, st.Gone, "read back: gone, cleared by this call or another's")
				assert.Zero(t, st.FailedCalls)
			}
			for _, id := range ids {
				assert.Equal(t, 1, kv.cleared[id], "id %s", id)
			}
			assert.Empty(t, keysUnder(t, kv, "runs/"))
		})
	}
}

// TestRunsOnlyWhereNothingNeedsThePage: a sweep whose settings need each
// id in memory before its clear (its own id rule, a budget, a dry run,
// concurrent batches) reads pages, and clears the same.
func TestRunsOnlyWhereNothingNeedsThePage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		runs bool
	}{
		{"defaults", Config{}, true},
		{"Concurrency 1", Config{Concurrency: 1}, true},
		{"Concurrency 2", Config{Concurrency: 2}, false},
		{"ValidateID", Config{ValidateID: ValidateID}, false},
		{"Limiter", Config{Limiter: rate.NewLimiter(rate.Inf, 1)}, true},
		{"Limiter and Concurrency 2", Config{Limiter: rate.NewLimiter(100, 10), Concurrency: 2}, false},
		{"DryRun", Config{DryRun: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kv, _ := newRunKV(t, 6)
			s, clock := newSweep(t, kv, tc.cfg)
			clock.Advance(2 * time.Hour)
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.runs, kv.runs.Load() > 0, "runs")
			if tc.cfg.DryRun {
				assert.Equal(t, 6, st.WouldClear)
				return
			}
			assert.Equal(t, 6, st.Cleared)
			assert.Empty(t, keysUnder(t, kv, "runs/"))
		})
	}
}

// TestRunCutShortReturnsTheContextsError: a pass cancelled during a run
// returns ctx.Err() and counts nothing of the run.
func TestRunCutShortReturnsTheContextsError(t *testing.T) {
	t.Parallel()
	kv, _ := newRunKV(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	kv.before = func(ctx context.Context, _ int, _ []string, _ [][]byte) error {
		calls.Add(1)
		cancel()
		<-ctx.Done()
		return fmt.Errorf("cut: %w", ctx.Err())
	}
	s, clock := newSweep(t, kv, Config{})
	clock.Advance(2 * time.Hour)
	st, err := s.Pass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, st.Cleared)
	assert.Equal(t, int32(1), calls.Load())
	assert.Len(t, keysUnder(t, kv, "runs/"), 3)
	assert.False(t, errors.Is(err, ErrLeaseLost))
}

// TestRunAnswersAreActedOn: a run the clear refused with a BatchError
// comes back with its keys; the held id is held, not asked again, and the
// others go in a call of their own.
func TestRunAnswersAreActedOn(t *testing.T) {
	t.Parallel()
	kv, ids := newRunKV(t, 6)
	until := t0.Add(3 * time.Hour)
	var asked atomic.Int32
	refuseHeld := refuse(map[string]error{ids[2]: Hold(until)})
	kv.before = func(ctx context.Context, call int, batch []string, keys [][]byte) error {
		for _, id := range batch {
			if id == ids[2] {
				asked.Add(1)
			}
		}
		return refuseHeld(ctx, call, batch, keys)
	}
	s, clock := newSweep(t, kv, Config{})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 5, st.Cleared)
	assert.Equal(t, 1, st.Held)
	assert.Equal(t, 2, st.ClearCalls, "the run, then the five not held")
	assert.Equal(t, int32(1), asked.Load(), "%s asked once", ids[2])
	assert.Equal(t, int64(1), kv.runs.Load())
	assert.Zero(t, kv.cleared[ids[2]])
	bl, err := s.Backlog(context.Background(), 100)
	require.NoError(t, err)
	assert.Equal(t, 1, bl.Held)
}

// pageObserver is a recorder that calls onPage after each ObservePage,
// with the page's number from 1.
type pageObserver struct {
	recorder
	onPage func(n int32)
	n      atomic.Int32
}

func (o *pageObserver) ObservePage(prefix string, page Stats) {
	o.recorder.ObservePage(prefix, page)
	o.onPage(o.n.Add(1))
}

// runsInFlight returns a runKV of n markers whose run number call (from
// 1) closes started as it begins to commit and done once it has.
func runsInFlight(t *testing.T, n, call int) (kv *runKV, started, done chan struct{}) {
	kv, _ = newRunKV(t, n)
	started, done = make(chan struct{}), make(chan struct{})
	kv.before = func(_ context.Context, c int, _ []string, _ [][]byte) error {
		if c == call {
			close(started)
		}
		return nil
	}
	kv.after = func(c int, err error) error {
		if c == call {
			close(done)
		}
		return err
	}
	return kv, started, done
}

// TestNextRunGoesWhileARunIsSettled: a run that took all it was asked for
// is followed at once by the next, which the store clears while the sweep
// settles and observes the first.
func TestNextRunGoesWhileARunIsSettled(t *testing.T) {
	t.Parallel()
	kv, started, _ := runsInFlight(t, 25, 2)
	obs := &pageObserver{onPage: func(n int32) {
		if n == 1 {
			waitFor(t, started, "the second run, while the first is settled")
		}
	}}
	s, clock := newSweep(t, kv, Config{BatchSize: 10, Observer: obs})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 25, st.Cleared)
	assert.Equal(t, int64(3), kv.runs.Load(), "runs of 10, 10 and 5")
	assert.Equal(t, []int{10, 10, 5}, clearedPerPage(obs.pages))
	for id, n := range kv.cleared {
		assert.Equal(t, 1, n, "id %s", id)
	}
}

// waitFor waits for ch to close, or fails the test after a minute.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Errorf("waited a minute for %s", what)
	}
}

func clearedPerPage(pages []Stats) []int {
	var n []int
	for _, p := range pages {
		if p.Cleared > 0 {
			n = append(n, p.Cleared)
		}
	}
	return n
}

// TestPassCutShortCountsTheRunInFlight: a pass cancelled while its next
// run is in flight counts what that run cleared, and starts none after it.
func TestPassCutShortCountsTheRunInFlight(t *testing.T) {
	t.Parallel()
	kv, _, done := runsInFlight(t, 30, 2)
	ctx, cancel := context.WithCancel(context.Background())
	obs := &pageObserver{onPage: func(n int32) {
		if n == 1 {
			waitFor(t, done, "the second run, while the first is settled")
			cancel()
		}
	}}
	s, clock := newSweep(t, kv, Config{BatchSize: 10, Observer: obs})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 20, st.Cleared)
	assert.Equal(t, int64(2), kv.runs.Load())
	assert.Len(t, keysUnder(t, kv, "runs/"), 10)
	assert.Len(t, kv.cleared, 20)
}

// TestPanicWithARunInFlightReachesTheCallerOnceTheRunIsDone: a panic or
// runtime.Goexit under the pass while the next run is in flight (here an
// Observer's, on the first page or a later one) reaches the caller once
// that run is done, so that nothing of the pass writes after Pass ended.
func TestPanicWithARunInFlightReachesTheCallerOnceTheRunIsDone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		page int32
		how  string
	}{{1, "panic"}, {1, "Goexit"}, {2, "panic"}, {2, "Goexit"}} {
		t.Run(fmt.Sprintf("page %d %s", tc.page, tc.how), func(t *testing.T) {
			t.Parallel()
			// The run in flight while page tc.page is observed waits a
			// little for Pass to end before it commits.
			kv, started, done := runsInFlight(t, 35, int(tc.page)+1)
			passOver := make(chan struct{})
			var committedAfter atomic.Bool
			before := kv.before
			kv.before = func(ctx context.Context, call int, ids []string, keys [][]byte) error {
				err := before(ctx, call, ids, keys)
				if call == int(tc.page)+1 {
					select {
					case <-passOver:
						committedAfter.Store(true)
					case <-time.After(200 * time.Millisecond):
					}
				}
				return err
			}
			obs := &pageObserver{onPage: func(n int32) {
				if n == tc.page {
					waitFor(t, started, "the run in flight")
					if tc.how == "panic" {
						panic("observer")
					}
					runtime.Goexit()
				}
			}}
			s, clock := newSweep(t, kv, Config{BatchSize: 10, Observer: obs})
			clock.Advance(2 * time.Hour)

			hung, returned, panicked, _ := passWithin(s, 10*time.Second)
			close(passOver)
			require.False(t, hung, "Pass hung")
			assert.False(t, returned)
			if tc.how == "panic" {
				assert.Equal(t, "observer", panicked)
			}
			waitFor(t, done, "the run in flight to end")
			assert.False(t, committedAfter.Load(), "the run in flight committed after Pass ended")
		})
	}
}

// passWithin runs Pass on a goroutine of its own and reports how it ended,
// or hung = true when it did not end within d (its goroutine then stays).
func passWithin(s *Sweep, d time.Duration) (hung, returned bool, panicked any, err error) {
	done := make(chan struct{})
	var (
		mu   sync.Mutex
		ret  bool
		pval any
		perr error
	)
	go func() {
		defer close(done)
		defer func() {
			r := recover()
			mu.Lock()
			pval = r
			mu.Unlock()
		}()
		_, e := s.Pass(context.Background())
		mu.Lock()
		ret, perr = true, e
		mu.Unlock()
	}()
	select {
	case <-done:
	case <-time.After(d):
		return true, false, nil, nil
	}
	mu.Lock()
	defer mu.Unlock()
	return false, ret, pval, perr
}

// armedPanicClock is a ManualClock that panics on its first Now once armed.
type armedPanicClock struct {
	*ManualClock
	armed atomic.Bool
}

func (c *armedPanicClock) Now() time.Time {
	if c.armed.CompareAndSwap(true, false) {
		panic("clock")
	}
	return c.ManualClock.Now()
}

// TestClockPanicAfterARunReachesTheCaller: a Clock that panics when read
// just after a run committed must reach the caller of Pass (as a Clock's
// panic anywhere else under the pass does). startRun reads the clock for
// r.took on the run's guarded goroutine, which turns the Clock's panic
// into a "ClearRun panicked" error: the pass returns nil, the run it
// committed is counted Gone, not Cleared.
func TestClockPanicAfterARunReachesTheCaller(t *testing.T) {
	kv, _ := newRunKV(t, 5)
	clock := &armedPanicClock{ManualClock: NewManualClock(t0)}
	kv.after = func(call int, err error) error {
		if call == 1 {
			clock.armed.Store(true) // the next Now is r.took's, on the run's goroutine
		}
		return err
	}
	s, _ := newSweep(t, kv, Config{Clock: clock})
	clock.Advance(2 * time.Hour)

	var st Stats
	var err error
	panicked := func() (p any) {
		defer func() { p = recover() }()
		st, err = s.Pass(context.Background())
		return nil
	}()
	assert.Equal(t, "clock", panicked, "the Clock's panic reaches the caller; got Stats %+v, err %v", st, err)
	if panicked == nil {
		assert.Equal(t, 5, st.Cleared, "the run this replica committed counts as cleared")
		assert.Zero(t, st.PanickedCalls, "no ClearRun panicked")
	}
}

// TestRunFailingFastIsNotCountedTimedOut: the run started ahead fails at
// once while the sweep settles the last (a slow Observer, a slow Scan);
// the run's ClearTimeout is only cancelled when the run is awaited, so by
// then its deadline has passed and await calls the failure a timeout:
// Stats.TimedOutCalls counts it, the error says "after ClearTimeout", and
// adapt halves the batch.
func TestRunFailingFastIsNotCountedTimedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv, ids := newRunKV(t, 25)
		kv.poison[ids[13]] = true // in the second run, which fails at once
		obs := &pageObserver{onPage: func(n int32) {
			if n == 1 {
				time.Sleep(2 * time.Second) // the sweep is slow to settle the first
			}
		}}
		s, clock := newSweep(t, kv, Config{BatchSize: 10, ClearTimeout: time.Second, Observer: obs})
		clock.Advance(2 * time.Hour)

		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 24, st.Cleared)
		assert.Equal(t, 1, st.Failed)
		assert.Zero(t, st.TimedOutCalls, "no call ran past ClearTimeout")
		assert.Equal(t, 10, st.BatchSize, "no call was slow: the batch keeps its size")
	})
}

// TestFailedIDWaitsForItsDelayWhenARunMeetsItsOtherMarker: an id whose
// clear failed (its marker moved to the retry range) and that has another
// marker further in the expired range is not sent again before its
// RetryDelay when a run holds that marker and fails, as a whole or with a
// BatchError for another id: the run's other ids go again without it, its
// marker stays deferred, counted neither failed nor parked, and the next
// passes read pages until its delay is over.
func TestFailedIDWaitsForItsDelayWhenARunMeetsItsOtherMarker(t *testing.T) {
	t.Parallel()
	for _, refused := range []bool{false, true} {
		t.Run(fmt.Sprintf("BatchError %v", refused), func(t *testing.T) {
			t.Parallel()
			kv, ids := newRunKV(t, 20)
			poison, heldID := ids[3], ids[17]
			kv.poison[poison] = true
			// Its other marker, in the second run of 10.
			mark(t, kv.MemKV, "runs/", poison, t0.Add(15*time.Millisecond+500*time.Microsecond))
			refuseHeld := refuse(map[string]error{heldID: Hold(t0.Add(3 * time.Hour))})
			var asked atomic.Int32
			kv.before = func(ctx context.Context, call int, batch []string, keys [][]byte) error {
				if slices.Contains(batch, poison) {
					asked.Add(1)
				}
				if refused {
					return refuseHeld(ctx, call, batch, keys)
				}
				return nil
			}
			s, clock := newSweep(t, kv, Config{BatchSize: 10, PageSize: 10, RetryDelay: time.Minute, MaxAttempts: 2})
			clock.Advance(2 * time.Hour)

			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Failed, "%s failed once, then waits for its delay", poison)
			assert.Equal(t, 1, st.Deferred, "its other marker")
			assert.Zero(t, st.Parked)

			clock.Advance(30 * time.Second)
			before, runs := asked.Load(), kv.runs.Load()
			st, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Zero(t, st.Failed)
			assert.Equal(t, before, asked.Load(), "%s asked again within its RetryDelay", poison)
			assert.Equal(t, runs, kv.runs.Load(), "no run while its other marker waits in the range")
		})
	}
}

// TestAtMostOneRunInFlight: the run ahead is one call at a time.
func TestAtMostOneRunInFlight(t *testing.T) {
	kv, _ := newRunKV(t, 30)
	var inFlight atomic.Int32
	var most atomic.Int32
	kv.before = func(_ context.Context, call int, _ []string, _ [][]byte) error {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
		inFlight.Add(-1)
		return nil
	}
	s, clock := newSweep(t, kv, Config{BatchSize: 10})
	clock.Advance(2 * time.Hour)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 30, st.Cleared)
	assert.LessOrEqual(t, most.Load(), int32(1), "at most one ClearRun at a time")
}

// fencedRunningView is a lease's view that fences its runs too, declaring
// ClearRun and RunStore: the sweep takes runs through it.
type fencedRunningView struct{ fencedRunView }

func (f fencedRunningView) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	if err := f.guard(); err != nil {
		return nil, err
	}
	return f.runKV.ClearRun(ctx, prefix, from, end, limit)
}

func (f fencedRunningView) RunStore() RunClearer { return f }

// TestRunAheadIsFencedWhenTheLeaseIsLostDuringTheSettle: the lease
// passes to another replica while the sweep settles a run and the next is
// already under way: that run's commit is refused by the fence, the pass
// returns ErrLeaseLost, and Stats count only the first run.
func TestRunAheadIsFencedWhenTheLeaseIsLostDuringTheSettle(t *testing.T) {
	kv, _ := newRunKV(t, 30)
	locker := &runFencingLocker{runs: true}
	obs := &pageObserver{onPage: func(n int32) {
		if n == 1 {
			locker.stealSilently() // the second run commits before or is refused
		}
	}}
	s, clock := newSweep(t, kv, Config{BatchSize: 10, Lease: locker, Observer: obs})
	clock.Advance(2 * time.Hour)
	st, err := s.LeasedPass(context.Background())
	t.Logf("Stats %+v, err %v, runs %d", st, err, kv.runs.Load())
	assert.ErrorIs(t, err, ErrLeaseLost)
	left := len(keysUnder(t, kv, "runs/"))
	assert.Equal(t, 30-st.Cleared, left, "Stats.Cleared is what this replica deleted")
	assert.GreaterOrEqual(t, left, 10, "no run after the one in flight at the loss")
}

// replyKV answers ClearRun with the keys reshape makes of the run it
// read, having committed nothing, and the error lost.
type replyKV struct {
	*runKV
	reshape func(keys [][]byte) [][]byte
}

func (z replyKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	z.runs.Add(1)
	keys, _ := z.MemKV.Scan(ctx, from, end, limit)
	if len(keys) == 0 {
		return nil, nil
	}
	return z.reshape(keys), errLostReply
}

// RunStore implements RunClearer.
func (z replyKV) RunStore() RunClearer { return z }

// TestRunReplyBreakingTheContractFailsThePass: keys returned out of
// order, outside the range or beyond the limit are not acted on: the pass
// fails naming the store's fault, nothing is deleted, and the sweep reads
// pages from then on.
func TestRunReplyBreakingTheContractFailsThePass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		reshape func(keys [][]byte) [][]byte
		want    string
	}{
		{"descending", func(keys [][]byte) [][]byte {
			out := slices.Clone(keys)
			slices.Reverse(out)
			return out
		}, "out of order"},
		{"past the range", func([][]byte) [][]byte { return [][]byte{[]byte("runs/99999999999999999999/late")} }, "outside"},
		{"twice the same", func(keys [][]byte) [][]byte { return [][]byte{keys[0], keys[0]} }, "out of order"},
		{"beyond the limit", func(keys [][]byte) [][]byte { return append(keys, keys...) }, "for a limit of 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kv, ids := newRunKV(t, 4)
			s, clock := newSweep(t, replyKV{kv, tc.reshape}, Config{BatchSize: 4})
			clock.Advance(2 * time.Hour)
			_, err := s.Pass(context.Background())
			require.ErrorContains(t, err, "broke its contract")
			assert.ErrorContains(t, err, tc.want)
			assert.Len(t, keysUnder(t, kv, "runs/"), 4, "nothing deleted on the word of a broken store")

			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, int64(1), kv.runs.Load())
			assert.Equal(t, 4, st.Cleared)
			for _, id := range ids {
				assert.Equal(t, 1, kv.cleared[id], "id %s", id)
			}
		})
	}
}

// aheadKV is a runKV whose run number broken (from 1) returns the keys
// reshape makes of those it committed, and whose every run first calls
// onRun.
type aheadKV struct {
	*runKV
	n       *atomic.Int64
	broken  int64
	reshape func(keys [][]byte) [][]byte
	onRun   func(ctx context.Context, n int64)
}

func (z aheadKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	n := z.n.Add(1)
	if z.onRun != nil {
		z.onRun(ctx, n)
	}
	keys, err := z.runKV.ClearRun(ctx, prefix, from, end, limit)
	if n == z.broken && len(keys) > 0 {
		keys = z.reshape(slices.Clone(keys))
	}
	return keys, err
}

func (z aheadKV) RunStore() RunClearer { return z }

// TestRunBreakingTheContractWithTheNextInFlight: a run that took all it asked for
// but whose keys break the contract between the first and the last (two
// swapped, one twice, one before from, one at or past end) fails the pass
// naming the fault; the run started ahead of the check, however it ends
// (returns, panics, calls runtime.Goexit, hangs until ClearTimeout, or
// until the pass's context is cancelled), is over before Pass returns,
// and no run is asked for after it, in this pass or the next.
func TestRunBreakingTheContractWithTheNextInFlight(t *testing.T) {
	t.Parallel()
	late := []byte("runs/99999999999999999999/late")
	early := []byte("runs/00000000000000000000/early")
	shapes := map[string]func(keys [][]byte) [][]byte{
		"swapped":      func(k [][]byte) [][]byte { k[1], k[2] = k[2], k[1]; return k },
		"twice":        func(k [][]byte) [][]byte { k[2] = k[1]; return k },
		"inner late":   func(k [][]byte) [][]byte { k[1] = late; return k },
		"inner early":  func(k [][]byte) [][]byte { k[2] = early; return k },
		"last largest": func(k [][]byte) [][]byte { k[3], k[0] = k[0], k[3]; return k[:4] }, // first is past last
	}
	ends := []string{"returns", "panics", "Goexit", "ClearTimeout", "cancel"}
	for name, reshape := range shapes {
		for _, how := range ends {
			for _, broken := range []int64{1, 2} {
				t.Run(fmt.Sprintf("%s/%s/run%d", name, how, broken), func(t *testing.T) {
					t.Parallel()
					kv, _ := newRunKV(t, 20)
					var passOver, afterPass atomic.Bool
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					z := aheadKV{runKV: kv, n: new(atomic.Int64), broken: broken, reshape: reshape}
					z.onRun = func(rctx context.Context, n int64) {
						if n != broken+1 {
							return
						}
						time.Sleep(20 * time.Millisecond) // let the sweep find the broken run first
						switch how {
						case "panics":
							panic("store")
						case "Goexit":
							runtime.Goexit()
						case "ClearTimeout", "cancel":
							if how == "cancel" {
								cancel()
							}
							<-rctx.Done()
						}
						time.Sleep(50 * time.Millisecond)
						if passOver.Load() {
							afterPass.Store(true)
						}
					}
					cfg := Config{BatchSize: 4}
					if how == "ClearTimeout" {
						cfg.ClearTimeout = 100 * time.Millisecond
					}
					s, clock := newSweep(t, z, cfg)
					clock.Advance(2 * time.Hour)
					done := make(chan struct{})
					var st Stats
					var err error
					go func() {
						defer close(done)
						st, err = s.Pass(ctx)
						passOver.Store(true)
					}()
					select {
					case <-done:
					case <-time.After(20 * time.Second):
						t.Fatal("Pass hung")
					}
					t.Logf("%+v %v", st, err)
					require.ErrorContains(t, err, "broke its contract")
					assert.Equal(t, broken+1, z.n.Load(), "runs: up to the broken one and the one in flight")
					time.Sleep(100 * time.Millisecond)
					assert.False(t, afterPass.Load(), "the run in flight went on after Pass returned")
					// Nothing lost: the broken run's markers are gone (the
					// store took them); the others are all there or counted.
					left := len(keysUnder(t, kv, "runs/"))
					assert.Equal(t, 20-4, left+st.Cleared, "markers left + counted cleared (the good runs and the one in flight)")

					cancel()
					st2, err := s.Pass(context.Background())
					require.NoError(t, err)
					assert.Equal(t, broken+1, z.n.Load(), "no run after the broken one")
					assert.Empty(t, keysUnder(t, kv, "runs/"))
					assert.Equal(t, left, st2.Cleared)
				})
			}
		}
	}
}

// TestRunsWaitOnlyForIDsLeftInTheRange: after a failed clear whose marker
// was moved to the retry range, runs go on; when the Move failed, the
// marker stays in the range and runs stop until its delay is over (its
// failures still remembered), so that each run does not meet it again.
func TestRunsWaitOnlyForIDsLeftInTheRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		moveFails  bool
		runsDuring bool
	}{
		{"marker moved", false, true},
		{"move failed", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kv, ids := newRunKV(t, 3)
			kv.poison[ids[1]] = true
			if tc.moveFails {
				kv.onMove = func(context.Context, int64) error { return errBoom }
			}
			s, clock := newSweep(t, kv, Config{RetryDelay: time.Minute, MaxRetryDelay: time.Minute})
			clock.Advance(2 * time.Hour)
			_, err := s.Pass(context.Background())
			require.NoError(t, err)
			require.Equal(t, int64(1), kv.runs.Load())

			more := mark(t, kv.MemKV, "runs/", "more", t0)
			kv.entities["more"] = true
			_, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.runsDuring, kv.runs.Load() > 1, "runs while %s waits", ids[1])
			assert.False(t, has(t, kv.MemKV, more))

			clock.Advance(2 * time.Minute)
			before := kv.runs.Load()
			late := mark(t, kv.MemKV, "runs/", "late", t0)
			kv.entities["late"] = true
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Greater(t, kv.runs.Load(), before, "a run once no delay is left")
			assert.False(t, has(t, kv.MemKV, late))
			assert.Equal(t, 1, st.Failed, "%s tried again", ids[1])
		})
	}
}

// TestRunsWaitForIDsWhoseOutcomeIsUnknown: a run that failed without
// saying whether it committed, and whose markers the sweep could not read
// back, leaves its ids unknown with their markers in the range: the sweep
// reads pages until their delay is over, so that no run sends them again
// before it, and then clears in runs, each entity once.
func TestRunsWaitForIDsWhoseOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	kv, ids := newRunKV(t, 10)
	var readBack atomic.Bool
	kv.before = func(_ context.Context, call int, _ []string, _ [][]byte) error {
		if call == 1 {
			readBack.Store(true)
			return errLostReply // not committed
		}
		return nil
	}
	kv.onScan = func(context.Context, int64) error {
		if readBack.CompareAndSwap(true, false) {
			return errBoom // the read of which markers are left
		}
		return nil
	}
	s, clock := newSweep(t, kv, Config{BatchSize: 5, PageSize: 5, RetryDelay: time.Minute, MaxRetryDelay: time.Minute})
	clock.Advance(2 * time.Hour)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 5, st.Failed, "the run's ids, unknown")
	assert.Equal(t, 5, st.Cleared, "the next page's, read, not run")
	assert.Equal(t, int64(1), kv.runs.Load())

	for i := range 5 {
		id := fmt.Sprintf("n%d", i)
		mark(t, kv.MemKV, "runs/", id, t0.Add(time.Minute))
		kv.entities[id] = true
	}
	clock.Advance(30 * time.Second)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 5, st.Deferred)
	assert.Equal(t, 5, st.Cleared)
	assert.Equal(t, int64(1), kv.runs.Load(), "no run while the unknown ids wait in the range")

	clock.Advance(time.Minute)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 5, st.Cleared)
	assert.Greater(t, kv.runs.Load(), int64(1), "runs once their delay is over")
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
	assert.Empty(t, keysUnder(t, kv, "runs/"))
}

// TestRunClearsAnotherMarkerOfAWaitingID: a run the store took while a
// failed id waits in the retry range clears that id's other marker in the
// expired range, and counts it cleared, not deferred.
func TestRunClearsAnotherMarkerOfAWaitingID(t *testing.T) {
	t.Parallel()
	kv, ids := newRunKV(t, 3)
	kv.poison[ids[1]] = true
	s, clock := newSweep(t, kv, Config{RetryDelay: time.Minute})
	clock.Advance(2 * time.Hour)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Failed)

	kv.mu.Lock()
	delete(kv.poison, ids[1])
	kv.mu.Unlock()
	again := mark(t, kv.MemKV, "runs/", ids[1], t0.Add(time.Second))
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Zero(t, st.Deferred)
	assert.Equal(t, int64(2), kv.runs.Load())
	assert.False(t, has(t, kv.MemKV, again))
	assert.Equal(t, 1, kv.cleared[ids[1]])
}

// holdingKV checks holds in its ClearAndDelete, and embeds a RunClearer
// whose ClearRun knows nothing of them.
type holdingKV struct {
	*runKV
	held map[string]time.Time
}

func (h holdingKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	be := BatchError{}
	for _, id := range ids {
		if until, ok := h.held[id]; ok {
			be[id] = Hold(until)
		}
	}
	if len(be) > 0 {
		return be
	}
	return h.runKV.ClearAndDelete(ctx, ids, keys)
}

// fencedRunView is a lease's view that fences Delete and ClearAndDelete
// and embeds the store, so inherits its ClearRun.
type fencedRunView struct {
	*runKV
	lease *fakeLease
}

func (f fencedRunView) guard() error {
	f.lease.l.mu.Lock()
	defer f.lease.l.mu.Unlock()
	if f.lease.l.holder != f.lease {
		f.lease.once.Do(func() { close(f.lease.lost) })
		return fmt.Errorf("fake fence: %w", ErrLeaseLost)
	}
	return nil
}

func (f fencedRunView) Delete(ctx context.Context, keys ...[]byte) error {
	if err := f.guard(); err != nil {
		return err
	}
	return f.runKV.Delete(ctx, keys...)
}

func (f fencedRunView) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if err := f.guard(); err != nil {
		return err
	}
	return f.runKV.ClearAndDelete(ctx, ids, keys)
}

// runFencingLocker's leases fence a runKV: their view embeds it, and
// declares ClearRun when runs is set.
type runFencingLocker struct {
	fencingLocker
	runs bool
}

type runFencingLease struct {
	*fakeLease
	runs bool
}

func (f *runFencingLocker) TryAcquire(ctx context.Context) (Lease, error) {
	l, err := f.fakeLocker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return runFencingLease{l.(*fakeLease), f.runs}, nil
}

func (l runFencingLease) Fence(kv KV) (KV, bool) {
	r, ok := kv.(*runKV)
	view := fencedRunView{runKV: r, lease: l.fakeLease}
	if l.runs {
		return fencedRunningView{view}, ok
	}
	return view, ok
}

// TestWrapperEmbeddingARunClearerTakesNoRuns: a wrapper or a fenced view
// that embeds a RunClearer inherits its ClearRun, which would go past
// what the wrapper checks; the sweep reads its pages instead, so a held
// entity stays held and nothing is deleted once the lease is gone.
func TestWrapperEmbeddingARunClearerTakesNoRuns(t *testing.T) {
	t.Parallel()
	t.Run("holds", func(t *testing.T) {
		t.Parallel()
		kv, ids := newRunKV(t, 4)
		s, clock := newSweep(t, holdingKV{kv, map[string]time.Time{ids[2]: t0.Add(90 * 24 * time.Hour)}}, Config{})
		clock.Advance(2 * time.Hour)
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Zero(t, kv.cleared[ids[2]], "a held entity cleared")
		assert.Equal(t, 1, st.Held)
		assert.Equal(t, 3, st.Cleared)
		assert.Zero(t, kv.runs.Load())
	})
	t.Run("fence", func(t *testing.T) {
		t.Parallel()
		kv, _ := newRunKV(t, 6)
		locker := &runFencingLocker{}
		kv.after = func(call int, err error) error {
			if call == 1 {
				locker.stealSilently()
			}
			return err
		}
		s, clock := newSweep(t, kv, Config{BatchSize: 2, Lease: locker})
		clock.Advance(2 * time.Hour)
		_, err := s.LeasedPass(context.Background())
		assert.ErrorIs(t, err, ErrLeaseLost)
		assert.Len(t, keysUnder(t, kv, "runs/"), 4, "only the batch before the loss committed")
		assert.Zero(t, kv.runs.Load())
	})
}

// newCountKV returns a countKV holding n markers finished at t0 (markN)
// and their entities, and the markers' ids.
func newCountKV(t testing.TB, n int) (*countKV, []string) {
	mem := NewMemKV()
	kv := countOver(mem)
	ids := markN(t, mem, n, t0)
	for _, id := range ids {
		kv.entities[id] = true
	}
	return kv, ids
}

// TestCountedRunsClearWithoutTheirKeys: a RunCounter's runs answer with
// their count, and the pass counts and observes them as it would their
// keys: every entity cleared once, each marker's lag, the oldest's as
// MaxLag, no Scan of the expired range.
func TestCountedRunsClearWithoutTheirKeys(t *testing.T) {
	t.Parallel()
	kv, ids := newCountKV(t, 25)
	late := mark(t, kv.MemKV, "runs/", "late", t0.Add(2*time.Hour))
	rec := &recorder{}
	s, clock := newSweep(t, kv, Config{BatchSize: 10, Observer: rec})
	clock.Advance(time.Hour + time.Second)
	kv.reset()

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 25, st.Cleared)
	assert.Equal(t, 3, st.ClearCalls, "runs of 10, 10 and 5")
	assert.Equal(t, int64(3), kv.counts.Load())
	assert.Equal(t, int64(2), kv.scans.Load(), "Scans: the key past the expired range and the retry range, none of the expired range")
	assert.Equal(t, time.Second, st.MaxLag)
	assert.Equal(t, t0.Add(3*time.Hour), st.NextDue)
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
	assert.Equal(t, []string{string(late)}, keysUnder(t, kv, "runs/"))
	require.Len(t, rec.lags, 25)
	for i, lag := range rec.lags {
		assert.Equal(t, time.Second-time.Duration(i)*time.Millisecond, lag, "marker %d finished %dms after the first", i, i)
	}
	assert.Equal(t, []int{10, 10, 5}, clearedPerPage(rec.pages))
	assert.Equal(t, int64(3), kv.timesAsked.Load(), "an Observer takes each lag: every run is asked for its times")
}

// TestCountedRunsWithoutObserverAskNoTimes: with no Observer, the sweep
// asks a run for no times, and counts and takes its lag from the count,
// the first time and the last key.
func TestCountedRunsWithoutObserverAskNoTimes(t *testing.T) {
	t.Parallel()
	kv, ids := newCountKV(t, 25)
	s, clock := newSweep(t, kv, Config{BatchSize: 10})
	clock.Advance(time.Hour + time.Second)
	kv.reset()

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 25, st.Cleared)
	assert.Equal(t, int64(3), kv.counts.Load())
	assert.Zero(t, kv.timesAsked.Load())
	assert.Equal(t, time.Second, st.MaxLag, "the first marker's")
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
	assert.Empty(t, keysUnder(t, kv, "runs/"))
}

// TestUncountableRunsGoByTheirKeys: a RunCounter that says it cannot
// count its runs is asked once; the sweep calls ClearRun from then on.
func TestUncountableRunsGoByTheirKeys(t *testing.T) {
	t.Parallel()
	kv, ids := newCountKV(t, 12)
	kv.uncountable = true
	s, clock := newSweep(t, kv, Config{BatchSize: 5})
	clock.Advance(2 * time.Hour)
	for range 2 {
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Zero(t, st.FailedCalls)
	}
	assert.Equal(t, int64(1), kv.counts.Load())
	assert.Equal(t, int64(4), kv.runs.Load(), "runs of 5, 5 and 2 by their keys, the first right after the count was refused; the next pass's, empty")
	assert.Equal(t, int64(4), kv.scans.Load(), "two a pass, the key past the expired range and the retry range: no page of the expired range")
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
}

// TestCountedRunRefusedGoesByPage: a run the store refuses (two markers
// of one id) is read as a page, whose duplicate is counted as such, and
// the sweep counts its runs again after it.
func TestCountedRunRefusedGoesByPage(t *testing.T) {
	t.Parallel()
	kv, ids := newCountKV(t, 12)
	mark(t, kv.MemKV, "runs/", ids[0], t0.Add(time.Millisecond)) // sorts right before ids[1]'s
	s, clock := newSweep(t, kv, Config{BatchSize: 4, PageSize: 4})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 12, st.Cleared)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, int64(4), kv.counts.Load(), "refused, then after the page: 4, 4 and 1")
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
	assert.Empty(t, keysUnder(t, kv, "runs/"))
}

// TestLostCountReplyClearsNothingTwice: a counted run that committed but
// whose answer was lost is not counted; the sweep reads that part of the
// range itself and finds those markers gone.
func TestLostCountReplyClearsNothingTwice(t *testing.T) {
	t.Parallel()
	kv, ids := newCountKV(t, 9)
	kv.loseCount = true
	s, clock := newSweep(t, kv, Config{BatchSize: 4, PageSize: 4})
	clock.Advance(2 * time.Hour)

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, st.FailedCalls, "the lost runs")
	assert.Equal(t, 4, st.Cleared, "a page of 4 between two lost runs, whose 5 markers are not counted")
	for _, id := range ids {
		assert.Equal(t, 1, kv.cleared[id], "id %s", id)
	}
	assert.Empty(t, keysUnder(t, kv, "runs/"))
}

// TestCountBreakingTheContractFailsThePass: a count that is too long,
// out of order, or whose last key is outside the range or not of the
// last time fails the pass naming the store's fault, and the sweep reads
// pages from then on.
func TestCountBreakingTheContractFailsThePass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		observe bool // an Observer: the run is asked for its times
		reshape func(RunCount) RunCount
		want    string
	}{
		{"beyond the limit", false, func(c RunCount) RunCount { c.N += 4; return c }, "for a limit of 4"},
		{"below zero", false, func(c RunCount) RunCount { c.N = -1; return c }, "-1 markers counted"},
		{"first after the last", false, func(c RunCount) RunCount { c.First += time.Hour.Milliseconds(); return c }, "first time"},
		{"past the range", false, func(c RunCount) RunCount { c.Last = []byte("runs/99999999999999999999/late"); return c }, "outside"},
		{"no last key", false, func(c RunCount) RunCount { c.Last = nil; return c }, "outside"},
		{"a last key for none", false, func(c RunCount) RunCount { c.N = 0; return c }, "for no marker"},
		{"times for none", true, func(c RunCount) RunCount { c.N, c.Last = 0, nil; return c }, "for no marker"},
		{"no times asked for", true, func(c RunCount) RunCount { c.Times = nil; return c }, "0 times for 4 markers"},
		{"a time too many", true, func(c RunCount) RunCount { c.Times = append(c.Times, c.Times[3]); return c }, "5 times for 4 markers"},
		{"descending", true, func(c RunCount) RunCount { slices.Reverse(c.Times); return c }, "times from"},
		{"out of order", true, func(c RunCount) RunCount { c.Times[1], c.Times[2] = c.Times[2], c.Times[1]; return c }, "out of order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kv, ids := newCountKV(t, 6)
			kv.reshape = tc.reshape
			cfg := Config{BatchSize: 4}
			if tc.observe {
				cfg.Observer = &recorder{}
			}
			s, clock := newSweep(t, kv, cfg)
			clock.Advance(2 * time.Hour)
			_, err := s.Pass(context.Background())
			require.ErrorContains(t, err, "broke its contract")
			assert.ErrorContains(t, err, tc.want)

			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, int64(1), kv.counts.Load())
			assert.Zero(t, st.FailedCalls)
			for _, id := range ids {
				assert.Equal(t, 1, kv.cleared[id], "id %s", id)
			}
			assert.Empty(t, keysUnder(t, kv, "runs/"))
		})
	}
}
