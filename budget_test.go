package retention

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// The delete budget (Config.Limiter), batches that adapt to BatchTarget,
// and passes that coalesce under MinInterval. They run in fake time
// (testing/synctest).

// TestBudgetPacesTheSweep: a budget of N entities a second clears a
// backlog of M in about M/N seconds, never faster, in every clear mode.
func TestBudgetPacesTheSweep(t *testing.T) {
	for _, mode := range []string{"Clear", "ClearBatch", "Runs"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n, m = 100, 1000
				mem := NewMemKV()
				for i := range m {
					mark(t, mem, "runs/", fmt.Sprintf("j%04d", i), time.Now().Add(-2*time.Hour))
				}
				lim := rate.NewLimiter(n, 10)
				cfg := Config{Prefix: "runs/", Retention: time.Hour, Limiter: lim, Concurrency: 4}
				var kv KV = mem
				var rkv *runKV
				switch mode {
				case "Clear":
					cfg.Clear = func(context.Context, string) error { return nil }
				case "ClearBatch":
					cfg.ClearBatch = func(context.Context, []string) error { return nil }
					cfg.BatchSize = 50
				case "Runs": // a RunClearer's runs, each of BatchSize, charged before it goes
					rkv = runOver(mem)
					kv, cfg.Concurrency, cfg.BatchSize = rkv, 1, 10
				}
				s, err := New(kv, cfg)
				require.NoError(t, err)
				start := time.Now()
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				took := time.Since(start)
				assert.Equal(t, m, st.Cleared)
				// The burst goes at once; the rest at n a second.
				assert.GreaterOrEqual(t, took, time.Duration(m-10)*time.Second/n, "never faster than the budget")
				assert.LessOrEqual(t, took, time.Duration(m)*time.Second/n+time.Second, "and not much slower")
				assert.Greater(t, st.BudgetWait, 9*time.Second, "the wait is counted: %v", st.BudgetWait)
				if rkv != nil {
					// Every run but the last (empty) one took all it asked for.
					assert.Equal(t, int64(m/10+1), rkv.runs.Load(), "runs")
				}
			})
		})
	}
}

// TestBudgetShared: two sweeps sharing one limiter never exceed it
// together.
func TestBudgetShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 200
		lim := rate.NewLimiter(n, 20)
		var cleared atomic.Int64
		var sweeps []*Sweep
		for _, prefix := range []string{"a/", "b/"} {
			mem := NewMemKV()
			for i := range 1000 {
				mark(t, mem, prefix, fmt.Sprintf("j%04d", i), time.Now().Add(-2*time.Hour))
			}
			s, err := New(mem, Config{Prefix: prefix, Retention: time.Hour, Limiter: lim, BatchSize: 25, Concurrency: 2,
				ClearBatch: func(_ context.Context, ids []string) error {
					cleared.Add(int64(len(ids)))
					return nil
				}})
			require.NoError(t, err)
			sweeps = append(sweeps, s)
		}
		start := time.Now()
		var wg sync.WaitGroup
		for _, s := range sweeps {
			wg.Go(func() {
				_, err := s.Pass(context.Background())
				assert.NoError(t, err)
			})
		}
		// Check the pace while they run, every second.
		for elapsed := time.Second; elapsed <= 9*time.Second; elapsed += time.Second {
			time.Sleep(time.Second)
			assert.LessOrEqual(t, cleared.Load(), int64(20+n*elapsed/time.Second), "cleared after %v", elapsed)
		}
		wg.Wait()
		assert.Equal(t, int64(2000), cleared.Load())
		assert.GreaterOrEqual(t, time.Since(start), (2000-20)*time.Second/n, "2,000 entities at 200 a second")
	})
}

// TestBatchesAdapt: calls that run past BatchTarget halve the batch size
// for the calls that follow, down to 1; fast calls double it back, up to
// BatchSize. Unlike a cleaner that only shrinks, it recovers without a
// restart.
func TestBatchesAdapt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		var slow atomic.Bool
		slow.Store(true)
		var sizes []int
		var mu sync.Mutex
		s, err := New(mem, Config{Prefix: "runs/", Retention: time.Hour, BatchSize: 64, BatchTarget: 100 * time.Millisecond,
			ClearBatch: func(ctx context.Context, ids []string) error {
				mu.Lock()
				sizes = append(sizes, len(ids))
				mu.Unlock()
				if slow.Load() {
					time.Sleep(150 * time.Millisecond) // past the target
				}
				return nil
			}})
		require.NoError(t, err)
		for i := range 200 {
			mark(t, mem, "runs/", fmt.Sprintf("j%04d", i), time.Now().Add(-2*time.Hour))
		}
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 200, st.Cleared)
		assert.Equal(t, []int{64, 32, 16, 8, 4, 2, 1, 1}, sizes[:8], "halved after every slow call")
		assert.Equal(t, 1, st.BatchSize)

		slow.Store(false)
		mu.Lock()
		sizes = nil
		mu.Unlock()
		for i := range 200 {
			mark(t, mem, "runs/", fmt.Sprintf("k%04d", i), time.Now().Add(-2*time.Hour))
		}
		st, err = s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 200, st.Cleared)
		assert.Equal(t, []int{1, 2, 4, 8, 16, 32, 64}, sizes[:7], "doubled back after every fast full batch")
		assert.Equal(t, 64, st.BatchSize)
	})
}

// TestBatchesShrinkOnTimeout: a call that runs out of ClearTimeout halves
// the batches too.
func TestBatchesShrinkOnTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		for i := range 8 {
			mark(t, mem, "runs/", fmt.Sprintf("j%d", i), time.Now().Add(-2*time.Hour))
		}
		s, err := New(mem, Config{Prefix: "runs/", Retention: time.Hour, BatchSize: 8, ClearTimeout: time.Second, BatchTarget: -1,
			ClearBatch: func(ctx context.Context, ids []string) error {
				if len(ids) == 8 {
					<-ctx.Done() // the first, whole batch hangs
					return ctx.Err()
				}
				return nil
			}})
		require.NoError(t, err)
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 8, st.BatchSize, "BatchTarget -1: no adapting")

		s, err = New(mem, Config{Prefix: "runs/", Retention: time.Hour, BatchSize: 8, ClearTimeout: time.Second,
			BatchTarget: time.Minute, // long: only the timeout shrinks it
			ClearBatch: func(ctx context.Context, ids []string) error {
				if len(ids) == 8 {
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}})
		require.NoError(t, err)
		for i := range 8 {
			mark(t, mem, "runs/", fmt.Sprintf("k%d", i), time.Now().Add(-2*time.Hour))
		}
		st, err = s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 8, st.BatchSize, "fast full batches grew it back after the halving")
		assert.Equal(t, 1, st.TimedOutCalls)
	})
}

// TestMinIntervalCoalescesPasses: under steady traffic, Run makes at most
// one pass per MinInterval, and an entity waits at most MinInterval plus
// one pass past due.
func TestMinIntervalCoalescesPasses(t *testing.T) {
	for _, minInterval := range []time.Duration{-1, 50 * time.Millisecond, 200 * time.Millisecond} {
		t.Run(fmt.Sprint(minInterval), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemKV()
				rec := &recorder{}
				var passes atomic.Int64
				const retention = time.Second
				s, err := New(mem, Config{Prefix: "runs/", Retention: retention, MinInterval: minInterval, Observer: rec,
					Clear:  func(context.Context, string) error { return nil },
					OnPass: func(Stats, error) { passes.Add(1) }})
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- s.Run(ctx) }()
				// 1,000 entities a second for 3 seconds, each due a
				// second after it finished.
				for i := range 3000 {
					mark(t, mem, "runs/", fmt.Sprintf("j%05d", i), time.Now())
					time.Sleep(time.Millisecond)
				}
				time.Sleep(2 * retention)
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
				assert.Zero(t, mem.Len(), "all cleared")
				// Markers fall due over 3 s: passes in that time.
				n := passes.Load()
				if minInterval > 0 {
					assert.LessOrEqual(t, n, int64(5*time.Second/minInterval)+5, "passes")
				}
				var most time.Duration
				for _, l := range rec.lags {
					most = max(most, l)
				}
				bound := max(minInterval, 0) + 2*time.Millisecond // a pass takes no fake time
				assert.LessOrEqual(t, most, bound, "lag past due, MinInterval %v, %d passes", minInterval, n)
				t.Logf("MinInterval %v: %d passes, most lag %v", minInterval, n, most)
			})
		})
	}
}

// TestPausedBudgetResumes: a limiter paused with SetLimit(0) (or
// SetBurst(0)) holds the clears back, and raising it again resumes them
// within a poll and a token's time, whether or not the pass's context has
// a deadline; the time paused counts as BudgetWait.
func TestPausedBudgetResumes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pause    func(*rate.Limiter)
		resume   func(*rate.Limiter)
		deadline bool
	}{
		{"SetLimit/deadline", func(l *rate.Limiter) { l.SetLimit(0) }, func(l *rate.Limiter) { l.SetLimit(1000) }, true},
		{"SetLimit/no deadline", func(l *rate.Limiter) { l.SetLimit(0) }, func(l *rate.Limiter) { l.SetLimit(1000) }, false},
		{"SetBurst/no deadline", func(l *rate.Limiter) { l.SetBurst(0) }, func(l *rate.Limiter) { l.SetBurst(1) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 10
				mem := NewMemKV()
				for i := range n {
					mark(t, mem, "runs/", fmt.Sprintf("j%04d", i), time.Now().Add(-2*time.Hour))
				}
				lim := rate.NewLimiter(1000, 1)
				require.True(t, lim.Allow(), "the bucket starts drained")
				var cleared atomic.Int64
				s, err := New(mem, Config{Prefix: "runs/", Retention: time.Hour, Limiter: lim,
					Clear: func(context.Context, string) error { cleared.Add(1); return nil }})
				require.NoError(t, err)
				tc.pause(lim)
				ctx := context.Background()
				if tc.deadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
				}
				const pause = 300 * time.Millisecond
				go func() {
					time.Sleep(pause)
					tc.resume(lim)
				}()
				start := time.Now()
				st, err := s.Pass(ctx)
				require.NoError(t, err)
				took := time.Since(start)
				assert.Equal(t, n, st.Cleared, "Pass() cleared %d, want %d", st.Cleared, n)
				assert.Equal(t, int64(n), cleared.Load())
				assert.LessOrEqual(t, took, pause+budgetPoll+n*time.Millisecond, "Pass() took %v: resumed late", took)
				assert.GreaterOrEqual(t, st.BudgetWait, pause, "BudgetWait = %v, want the pause", st.BudgetWait)
			})
		})
	}
}
