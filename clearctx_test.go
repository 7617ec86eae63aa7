package retention

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStuckClearTimesOut: a Clear that waits on a dead dependency, which
// nothing else would ever cancel, is cut off by ClearTimeout; the rest of
// the backlog is cleared and Run keeps passing.
func TestStuckClearTimesOut(t *testing.T) {
	for _, conc := range []int{1, 16} {
		t.Run(fmt.Sprint("concurrency", conc), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				kv := NewMemKV()
				for i := range 1000 {
					mark(t, kv, "runs/", fmt.Sprintf("m%04d", i), time.Now().Add(-2*time.Hour))
				}
				var stuckCalls atomic.Int32
				var log passLog
				s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Concurrency: conc, PageSize: 100,
					ClearTimeout: 5 * time.Second, OnPass: log.onPass,
					Clear: func(ctx context.Context, id string) error {
						if id == "m0150" || id == "m0777" {
							stuckCalls.Add(1)
							<-ctx.Done() // the dependency never answers
							return ctx.Err()
						}
						return nil
					}})
				require.NoError(t, err)
				stop := runInBackground(t.Context(), s)
				time.Sleep(30 * time.Second)
				synctest.Wait()

				require.GreaterOrEqual(t, log.len(), 1, "passes complete")
				st := log.stat(0)
				require.NoError(t, log.err(0))
				assert.Equal(t, 998, st.Cleared)
				assert.Equal(t, 2, st.Failed)
				assert.Equal(t, map[string]int{"m0150": 1, "m0777": 1}, markerIDs(t, kv, "runs/"))
				// Every try ends after 5s; retries come after 1s, 2s, 4s... so
				// 30s hold 3 to 5 tries of each.
				assert.GreaterOrEqual(t, stuckCalls.Load(), int32(6))
				assert.LessOrEqual(t, stuckCalls.Load(), int32(10))
				assert.GreaterOrEqual(t, log.len(), 3, "OnPass keeps being called")
				require.ErrorIs(t, stop(), context.Canceled)
			})
		})
	}
}

// TestHungStoreTimesOut: a store that stops answering fails each pass after
// StoreTimeout instead of wedging Run; once it answers again, Run clears
// the backlog.
func TestHungStoreTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hang atomic.Bool
		kv := newFakeKV(nil)
		kv.onScan, kv.onDelete = hangWhile(&hang), hangWhile(&hang)
		for i := range 50 {
			mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), time.Now().Add(-2*time.Hour))
		}
		var log passLog
		s, err := New(kv.store(), Config{Prefix: "runs/", Retention: time.Hour, Interval: 10 * time.Second,
			StoreTimeout: 2 * time.Second, OnPass: log.onPass, Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		hang.Store(true)
		stop := runInBackground(t.Context(), s)
		time.Sleep(time.Minute)
		synctest.Wait()
		n := log.len()
		require.GreaterOrEqual(t, n, 4, "each hung pass ends after StoreTimeout and is retried")
		for i := range n {
			require.ErrorIs(t, log.err(i), context.DeadlineExceeded)
			assert.Contains(t, log.err(i).Error(), "no answer within StoreTimeout (2s)")
		}
		assert.Equal(t, 50, kv.Len())

		hang.Store(false) // the store recovers
		time.Sleep(15 * time.Second)
		synctest.Wait()
		assert.Zero(t, kv.Len())
		require.Greater(t, log.len(), n)
		assert.NoError(t, log.err(log.len()-1))
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

// TestTimeoutsCanBeOff: negative timeouts mean none, and a parent deadline
// still reaches the store and Clear.
func TestTimeoutsCanBeOff(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	var hadDeadline atomic.Bool
	s, clock := newSweep(t, kv, Config{ClearTimeout: -1, StoreTimeout: -1, Clear: func(ctx context.Context, _ string) error {
		_, ok := ctx.Deadline()
		hadDeadline.Store(ok)
		return nil
	}})
	mark(t, kv, "runs/", "a", t0)
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.False(t, hadDeadline.Load(), "no ClearTimeout: no deadline")

	s2, clock2 := newSweep(t, kv, Config{Clear: func(ctx context.Context, _ string) error {
		d, ok := ctx.Deadline()
		hadDeadline.Store(ok && time.Until(d) <= DefaultClearTimeout)
		return nil
	}})
	mark(t, kv, "runs/", "b", t0)
	clock2.Set(t0.Add(2 * time.Hour))
	_, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.True(t, hadDeadline.Load(), "the default ClearTimeout applies")
}

type ctxKey struct{}

// TestClearCtx checks the per-Clear context against what
// context.WithTimeout promises.
func TestClearCtx(t *testing.T) {
	newCtx := func(parent context.Context, timeout time.Duration) *clearCtx {
		return &clearCtx{pg: &ctxPage{c: &clearing{s: &Sweep{settings: settings{clearTimeout: timeout}}, ctx: parent}}}
	}
	t.Run("times out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCtx(context.WithValue(t.Context(), ctxKey{}, "v"), time.Second)
			start := time.Now()
			d, ok := c.Deadline()
			require.True(t, ok)
			assert.Equal(t, start.Add(time.Second), d)
			assert.NoError(t, c.Err())
			assert.Equal(t, "v", c.Value(ctxKey{}))
			<-c.Done()
			assert.Equal(t, time.Second, time.Since(start))
			require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
			assert.True(t, c.timedOut())
			c.end()
			require.ErrorIs(t, c.Err(), context.DeadlineExceeded, "the first cause stays")
		})
	})
	t.Run("parent cancelled while waiting", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			parent, cancel := context.WithCancel(t.Context())
			c := newCtx(parent, time.Hour)
			done := c.Done()
			time.AfterFunc(time.Minute, cancel)
			<-done
			require.ErrorIs(t, c.Err(), context.Canceled)
			assert.False(t, c.timedOut())
			c.end()
		})
	})
	t.Run("parent already done", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		cancel()
		c := newCtx(parent, time.Hour)
		select {
		case <-c.Done():
		default:
			t.Fatal("Done not closed")
		}
		require.ErrorIs(t, c.Err(), context.Canceled)
		c.end()
	})
	t.Run("parent deadline earlier", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			parent, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			c := newCtx(parent, time.Hour)
			d, _ := c.Deadline()
			assert.Equal(t, time.Now().Add(time.Second), d)
			<-c.Done()
			require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
			assert.False(t, c.timedOut(), "the parent's deadline, not ClearTimeout")
			c.end()
		})
	})
	t.Run("ended before consulted", func(t *testing.T) {
		c := newCtx(context.Background(), time.Hour)
		c.end()
		require.ErrorIs(t, c.Err(), context.Canceled, "a context kept past its Clear reads as cancelled")
		<-c.Done()
		c.end()
	})
	t.Run("ended while waited on", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCtx(t.Context(), time.Hour)
			done := c.Done()
			go c.end()
			<-done
			require.ErrorIs(t, c.Err(), context.Canceled)
		})
	})
	t.Run("children follow it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCtx(t.Context(), time.Second)
			child, cancel := context.WithCancel(c)
			defer cancel()
			<-child.Done()
			require.ErrorIs(t, child.Err(), context.DeadlineExceeded)
			c.end()
		})
	})
}

// TestClearContextReadsPassErrAtOnce: under ClearTimeout, a Clear's
// context reports the end of the pass's context as soon as that context's
// Err does, before its Done channel closes, as the pass's context under a
// lease does between the lease's loss and the goroutine that cancels it
// (see leaseContext): a Clear that checks ctx.Err() before an
// irreversible step sees the loss.
func TestClearContextReadsPassErrAtOnce(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			ctx := &errFirstCtx{Context: context.Background(), done: make(chan struct{})}
			var sawErr, sawDone atomic.Int32
			var calls atomic.Int32
			s, clock := newSweep(t, mem, Config{Concurrency: concurrency, ClearTimeout: time.Minute, Clear: func(cctx context.Context, _ string) error {
				calls.Add(1)
				ctx.lost.Store(true)
				if cctx.Err() != nil {
					sawErr.Add(1)
				}
				select {
				case <-cctx.Done():
					sawDone.Add(1)
				default:
				}
				return nil
			}})
			mark(t, mem, "runs/", "a", t0)
			clock.Set(t0.Add(2 * time.Hour))
			_, err := s.Pass(ctx)
			require.ErrorIs(t, err, context.Canceled)
			require.Equal(t, int32(1), calls.Load())
			assert.Equal(t, int32(1), sawErr.Load(), "the Clear's ctx.Err() once the pass's Err reports it over")
			assert.Equal(t, int32(1), sawDone.Load(), "the Clear's ctx.Done() once the pass's Err reports it over")
		})
	}
}

// TestClearContextSeesLeaseLossAtOnce: under Run's lease (LeasedPass), a
// Clear that finds the lease lost reads it on its own context at once.
func TestClearContextSeesLeaseLossAtOnce(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	mark(t, mem, "runs/", "a", t0)
	locker := &fakeLocker{}
	var errSeen error
	s, clock := newSweep(t, mem, Config{AllowUnfenced: true, Lease: locker, ClearTimeout: time.Minute, Clear: func(ctx context.Context, _ string) error {
		locker.expire() // the lease's TTL runs out while the Clear runs
		errSeen = ctx.Err()
		return nil
	}})
	clock.Advance(2 * time.Hour)
	_, err := s.LeasedPass(t.Context())
	require.ErrorIs(t, err, ErrLeaseLost)
	assert.ErrorIs(t, errSeen, context.Canceled, "ctx.Err() in the Clear once the lease is lost")
	assert.Equal(t, 1, mem.Len(), "the marker stays")
}
