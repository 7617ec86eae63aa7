package retention

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClearGoexit: a Clear that calls runtime.Goexit, as t.FailNow or a
// failing require does inside it, counts as failed at every Concurrency;
// its marker stays, the other markers are cleared, and the pass returns.
func TestClearGoexit(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 2, 16} {
		t.Run(fmt.Sprint("concurrency", conc), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			var calls atomic.Int32
			s, clock := newSweep(t, kv, Config{Concurrency: conc, PageSize: 10, Clear: func(_ context.Context, id string) error {
				calls.Add(1)
				if id[0] == 'x' {
					runtime.Goexit()
				}
				return nil
			}})
			for i := range 100 {
				prefix := "a"
				if i%7 == 3 {
					prefix = "x"
				}
				mark(t, kv, "runs/", fmt.Sprintf("%s%03d", prefix, i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, int32(100), calls.Load(), "every Clear called once")
			assert.Equal(t, 14, st.Failed)
			assert.Equal(t, 86, st.Cleared)
			left := markerIDs(t, kv, "runs/")
			assert.Len(t, left, 14)
			for id := range left {
				assert.Equal(t, byte('x'), id[0], "only the markers whose Clear exited stay")
			}
		})
	}
}

// TestRunSurvivesGoexit: Run goes on after a Clear called runtime.Goexit.
func TestRunSurvivesGoexit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		mark(t, kv, "runs/", "exits", time.Now().Add(-2*time.Hour))
		var log passLog
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, OnPass: log.onPass,
			Clear: func(context.Context, string) error { runtime.Goexit(); return nil }})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.GreaterOrEqual(t, log.len(), 3, "Run keeps passing")
		assert.Equal(t, 1, log.stat(0).Failed)
		assert.Equal(t, 1, kv.Len())
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

// TestClearNeverEarly: an entity finished at any sub-millisecond time is
// cleared only once strictly more than Retention has passed since then.
func TestClearNeverEarly(t *testing.T) {
	t.Parallel()
	for _, frac := range []time.Duration{0, 1, 100 * time.Microsecond, 500 * time.Microsecond, 900 * time.Microsecond, 999_999} {
		t.Run(frac.String(), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, kv, Config{Clear: c.clear})
			finished := t0.Add(frac)
			mark(t, kv, "runs/", "a", finished)
			for step := -3 * time.Millisecond; step <= 3*time.Millisecond; step += 100 * time.Microsecond {
				now := finished.Add(time.Hour + step)
				clock.Set(now)
				_, err := s.Pass(context.Background())
				require.NoError(t, err)
				if c.count("a") > 0 {
					assert.Greater(t, now.Sub(finished), time.Hour, "cleared %v after it finished", now.Sub(finished))
					assert.LessOrEqual(t, now.Sub(finished), time.Hour+time.Millisecond+100*time.Microsecond, "and not much later")
					return
				}
			}
			t.Fatal("never cleared")
		})
	}
}

// errFirstCtx reports an error from Err once lost is set, before its Done
// channel closes: as a pass's context under a lease does between the
// lease's loss and the goroutine that cancels it (see leaseContext).
type errFirstCtx struct {
	context.Context
	done chan struct{}
	lost atomic.Bool
}

func (c *errFirstCtx) Done() <-chan struct{} { return c.done }

func (c *errFirstCtx) Err() error {
	if c.lost.Load() {
		return context.Canceled
	}
	return nil
}

// TestClearsAskErrBeforeEach: a context's Err is read before every Clear,
// not only its Done channel, so that no Clear starts once Err reports the
// pass over.
func TestClearsAskErrBeforeEach(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			ctx := &errFirstCtx{Context: context.Background(), done: make(chan struct{})}
			var calls atomic.Int32
			s, clock := newSweep(t, mem, Config{Concurrency: concurrency, Clear: func(context.Context, string) error {
				calls.Add(1)
				ctx.lost.Store(true)
				return nil
			}})
			for i := range 20 {
				mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			_, err := s.Pass(ctx)
			require.ErrorIs(t, err, context.Canceled)
			assert.LessOrEqual(t, int(calls.Load()), concurrency, "Clears after Err reported the pass over")
			assert.Equal(t, 20, mem.Len(), "nothing deleted once Err reported the pass over")
		})
	}
}
