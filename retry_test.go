package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPoisonMarkerBacksOff runs a sweep whose Clear always fails for one id
// while other markers keep falling due every 2ms, so Run passes hundreds of
// times a second: the poison id is still tried only as its backoff allows.
func TestPoisonMarkerBacksOff(t *testing.T) {
	for _, tt := range []struct {
		name string
		kv   func(*MemKV) KV
	}{
		{"rescheduled on a Putter", func(m *MemKV) KV { return m }},
		{"in memory without Put", func(m *MemKV) KV { return readOnlyKV{m} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const retention = time.Second
				mem := NewMemKV()
				var mu sync.Mutex
				var poisonCalls []time.Duration
				start := time.Now()
				mark(t, mem, "runs/", "poison", start.Add(-2*retention))
				s, err := New(tt.kv(mem), Config{Prefix: "runs/", Retention: retention,
					Clear: func(_ context.Context, id string) error {
						if id != "poison" {
							return nil
						}
						mu.Lock()
						defer mu.Unlock()
						poisonCalls = append(poisonCalls, time.Since(start))
						return errors.New("downstream down")
					}})
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(t.Context())
				var wg sync.WaitGroup
				wg.Go(func() { // a marker falls due every 2ms
					for i := 0; ctx.Err() == nil; i++ {
						mark(t, mem, "runs/", fmt.Sprintf("e%06d", i), time.Now().Add(-retention))
						time.Sleep(2 * time.Millisecond)
					}
				})
				done := make(chan error, 1)
				go func() { done <- s.Run(ctx) }()
				time.Sleep(40 * time.Second)
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
				wg.Wait()
				// Markers written already due wait at most Interval (1s
				// here) for Run to wake, as documented; one more pass then
				// clears everything but the poison, whose retry is not due.
				assert.LessOrEqual(t, mem.Len(), 1+int(time.Second/(2*time.Millisecond))+1, "backlog when Run stopped")
				_, err = s.Pass(t.Context())
				require.NoError(t, err)

				// Tries at 0, then after 1s, 2s, 4s, 8s, 16s (each up to a
				// fifth longer): 6 in 40s, where a pass per marker would
				// have made 20,000.
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, poisonCalls, 6, "poison tried at %v", poisonCalls)
				wantGap := time.Second
				for i := 1; i < len(poisonCalls); i++ {
					gap := poisonCalls[i] - poisonCalls[i-1]
					assert.GreaterOrEqual(t, gap, wantGap, "gap %d", i)
					assert.LessOrEqual(t, gap, wantGap*6/5+5*time.Millisecond, "gap %d", i)
					wantGap *= 2
				}
				assert.Equal(t, map[string]int{"poison": 1}, markerIDs(t, mem, "runs/"), "the poison marker stays; the rest was cleared")
			})
		})
	}
}

// TestRetryDelayCapped checks that the delay doubles up to MaxRetryDelay and
// stays there, and that success forgets the failures.
func TestRetryDelayCapped(t *testing.T) {
	t.Parallel()
	r := newRetries(time.Second, 10*time.Second)
	now := t0
	for i, base := range []time.Duration{1, 2, 4, 8, 10, 10, 10, 10} {
		base *= time.Second
		d := failedAt(&r, "x", now).Sub(now)
		if base < 10*time.Second {
			assert.GreaterOrEqual(t, d, base, "failure %d", i+1)
			assert.LessOrEqual(t, d, min(base*6/5, 10*time.Second), "failure %d", i+1)
		} else { // at the cap the jitter goes below it
			assert.GreaterOrEqual(t, d, 8*time.Second, "failure %d", i+1)
			assert.LessOrEqual(t, d, 10*time.Second, "failure %d", i+1)
		}
	}
	r.forget("x")
	assert.Equal(t, time.Second, failedAt(&r, "x", now).Sub(now).Truncate(time.Second))

	// Huge delays saturate instead of wrapping negative.
	big := newRetries(maxDuration/3, maxDuration)
	for n := 1; n < 70; n++ {
		d := big.delay(n)
		require.Positive(t, d, "delay(%d)", n)
	}
	assert.GreaterOrEqual(t, big.delay(69), maxDuration/5*4)
}

// TestFailingBacklogIdlePass: 10,000 markers whose Clear always fails. After
// one pass puts them off, a pass before their retry is as cheap as any idle
// pass on a Mover, and calls no Clear on any KV.
func TestFailingBacklogIdlePass(t *testing.T) {
	t.Parallel()
	const n = 10_000
	for _, mover := range []bool{true, false} {
		t.Run(fmt.Sprint("mover=", mover), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			counting := &countingKV{KV: mem}
			var kv KV = countingMover{counting}
			if !mover {
				kv = readOnlyKV{counting}
			}
			c := newClears()
			s, clock := newSweep(t, kv, Config{Clear: func(ctx context.Context, id string) error {
				_ = c.clear(ctx, id)
				return errBoom
			}})
			for i := range n {
				mark(t, mem, "runs/", fmt.Sprintf("f%05d", i), t0.Add(-2*time.Hour))
			}
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, n, st.Failed)
			assert.Equal(t, n, st.Retried)
			assert.Equal(t, n, c.total())
			assert.Equal(t, n, mem.Len(), "every failed marker stays")

			clock.Advance(500 * time.Millisecond) // within every retry delay
			counting.reset()
			st, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, n, c.total(), "no Clear before the retry delay is over")
			assert.Zero(t, counting.deletes.Load()+counting.puts.Load(), "an idle pass writes nothing")
			if mover {
				assert.LessOrEqual(t, counting.scans.Load(), int64(3), "Scan calls: the expired range, the next marker, the retry range's first")
				assert.LessOrEqual(t, counting.keys.Load(), int64(1), "keys read")
				assert.Zero(t, st.Deferred)
			} else {
				// Without Move the markers stay where they are: they are read
				// again, a page at a time, but not cleared.
				assert.Equal(t, n, st.Deferred)
				assert.Equal(t, int64(n/DefaultPageSize+2+1), counting.scans.Load(), "and the empty retry range")
			}
			assert.False(t, st.NextDue.Before(t0.Add(time.Second)), "next due %v", st.NextDue)
			assert.False(t, st.NextDue.After(t0.Add(1200*time.Millisecond)), "next due %v", st.NextDue)

			// Once the delays are over, all are tried again, once.
			clock.Set(t0.Add(1300 * time.Millisecond))
			st, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, n, st.Failed)
			assert.Equal(t, 2*n, c.total())
		})
	}
}

// TestRescheduleWriteFails: when the Move of a failed marker fails, the
// marker stays as it was, the retry delay holds in memory, the failure is
// logged, and the pass goes on with the rest of the backlog.
func TestRescheduleWriteFails(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := newFaultKV(mem, newFaultRand(t, 3), 0)
	kv.enabled.Store(true)
	c := newClears()
	c.set("bad", errBoom)
	c.set("worse", errBoom)
	var logs syncBuffer
	s, clock := newSweep(t, kv, Config{Clear: c.clear, PageSize: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	badKey := mark(t, mem, "runs/", "bad", t0)
	worseKey := mark(t, mem, "runs/", "worse", t0.Add(time.Millisecond))
	for i := range 5 {
		mark(t, mem, "runs/", fmt.Sprintf("good%d", i), t0.Add(time.Duration(2+i)*time.Millisecond))
	}
	clock.Set(t0.Add(2 * time.Hour))

	kv.set(opMove, storeErr, 1)
	st, err := s.Pass(context.Background())
	require.NoError(t, err, "a failed rewrite fails no pass")
	assert.Equal(t, 5, st.Cleared, "the rest of the backlog is cleared")
	assert.Equal(t, 2, st.Retried)
	assert.Equal(t, 1, st.PutCalls, "after one failed rewrite the pass keeps the delays in memory")
	assert.True(t, has(t, mem, badKey), "the failed marker stays as it was")
	assert.True(t, has(t, mem, worseKey))
	assert.Equal(t, 2, mem.Len())
	assert.Contains(t, logs.String(), "could not reschedule failed markers")

	kv.set(opMove, storeErr, 0)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, st.Deferred, "the retry delays hold in memory")
	assert.Equal(t, 1, c.count("bad"))
}

// TestRescheduleOntoItself: a clock that steps back while a Clear fails
// can make the rewrite land on the old key; it must not then be deleted.
func TestRescheduleOntoItself(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	clock := NewManualClock(t0.Add(15 * time.Millisecond))
	s, err := New(kv, Config{Prefix: "runs/", Retention: 10 * time.Millisecond, Clock: clock,
		RetryDelay: time.Millisecond, MaxRetryDelay: time.Millisecond,
		Clear: func(context.Context, string) error {
			clock.Set(t0.Add(8500 * time.Microsecond)) // the wall clock steps back
			return errBoom
		}})
	require.NoError(t, err)
	key := mark(t, kv, "runs/", "a", t0)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, map[string]int{"a": 1}, markerIDs(t, kv, "runs/"), "the only marker of a failed id survives (moved)")
	assert.Equal(t, 1, st.Deferred, "met again in the retry range, it waits out its delay in memory")
	_ = key
}

// nsKV puts a namespace in front of its keys but inherits Put from the
// MemKV it wraps: that Put writes where Scan does not read.
type nsKV struct {
	*MemKV
	ns string
}

func (n nsKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	keys, err := n.MemKV.Scan(ctx, append([]byte(n.ns), start...), append([]byte(n.ns), end...), limit)
	for i := range keys {
		keys[i] = keys[i][len(n.ns):]
	}
	return keys, err
}

func (n nsKV) Delete(ctx context.Context, keys ...[]byte) error {
	full := make([][]byte, len(keys))
	for i, k := range keys {
		full[i] = append([]byte(n.ns), k...)
	}
	return n.MemKV.Delete(ctx, full...)
}

// TestRescheduleReadBack: a Put that writes where Scan does not read is
// caught by reading the first rewrite back; the marker stays. nsKV inherits
// MemKV's Move, so the Move is what is read back.
func TestRescheduleReadBack(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := nsKV{MemKV: mem, ns: "tenant1/"}
	c := newClears()
	c.set("a", errBoom)
	var logs syncBuffer
	s, clock := newSweep(t, kv, Config{Clear: c.clear, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	key, err := MarkerKey("runs/", t0, "a")
	require.NoError(t, err)
	require.NoError(t, mem.Put(context.Background(), append([]byte("tenant1/"), key...), nil))
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, map[string]int{"a": 1}, markerIDs(t, kv, "runs/"), "the marker stays where Scan reads")
	assert.Contains(t, logs.String(), "must act where Scan reads")

	c.set("a", nil)
	clock.Advance(2 * time.Second)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
}

// badErr is an error type whose nil pointer panics in Error.
type badErr struct{ msg string }

func (e *badErr) Error() string { return e.msg }

// TestPanickingErrorsAndValidators: a Clear returning a typed nil error and
// a ValidateID that panics neither crash the pass nor delete a marker.
func TestPanickingErrorsAndValidators(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	s, clock := newSweep(t, kv, Config{
		Clear: func(_ context.Context, id string) error {
			if id == "typednil" {
				var e *badErr
				return e
			}
			return nil
		},
		ValidateID: func(id string) error {
			if id == "crashes" {
				panic("validator bug")
			}
			return nil
		}})
	mark(t, kv, "runs/", "typednil", t0)
	mark(t, kv, "runs/", "crashes", t0)
	mark(t, kv, "runs/", "fine", t0)
	mark(t, kv, "runs/", "crashes", t0.Add(3*time.Hour)) // unexpired, met by the peek
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 2, st.Failed)
	assert.Zero(t, st.Malformed)
	assert.Equal(t, map[string]int{"typednil": 1, "crashes": 2}, markerIDs(t, kv, "runs/"))

	bs, clock2 := newSweep(t, kv, Config{ClearBatch: func(context.Context, []string) error {
		var e *badErr
		return e
	}})
	clock2.Set(t0.Add(10 * time.Hour))
	st, err = bs.Pass(context.Background())
	require.NoError(t, err)
	// On a Mover the pass looks for duplicates page by page: crashes' two
	// markers, one rescheduled and one not, are on two pages. The first
	// fails; the second then waits out that failure's delay. Both stay.
	assert.Equal(t, 2, st.Failed, "every id's markers left")
	assert.Equal(t, 1, st.Deferred)
	assert.Zero(t, st.Duplicates)
	assert.Equal(t, map[string]int{"typednil": 1, "crashes": 2}, markerIDs(t, kv, "runs/"))
}

// failedAt records one failure of id after none before and returns when it
// may be tried again.
func failedAt(r *retries, id string, now time.Time) time.Time {
	_, at := r.failed(id, now, 0, true)
	return at
}

// TestParkCountsOnlyOnceMoved: a marker that reaches MaxAttempts while the
// store refuses its Move to the parked range is not counted or logged as
// parked, stays due, and keeps its id's backoff; once the Move goes
// through, it is parked and counted.
func TestParkCountsOnlyOnceMoved(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := newFaultKV(mem, newFaultRand(t, 1), 0)
	kv.enabled.Store(true)
	c := newClears()
	c.set("x", errBoom)
	var logs strings.Builder
	s, clock := newSweep(t, kv, Config{Clear: c.clear, MaxAttempts: 2, RetryDelay: time.Minute, MaxRetryDelay: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	mark(t, mem, "runs/", "x", t0)
	clock.Set(t0.Add(time.Hour + time.Second))
	ctx := context.Background()

	st, err := s.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Retried, "first failure: rescheduled")

	kv.set(opMove, storeErr, 1)
	clock.Set(st.NextDue.Add(time.Millisecond))
	st, err = s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, c.count("x"))
	assert.Equal(t, 0, st.Parked, "Pass() Parked = %d with the Move refused, want 0", st.Parked)
	assert.Equal(t, 1, st.Retried)
	assert.NotContains(t, logs.String(), "parked")
	b, err := s.Backlog(ctx, 10)
	require.NoError(t, err)
	assert.Zero(t, b.Parked, "Backlog().Parked")
	assert.GreaterOrEqual(t, st.NextDue.Sub(clock.Now()), time.Minute, "the backoff is kept: next try at %v", st.NextDue)

	clock.Advance(time.Second)
	st, err = s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, c.count("x"), "not tried again within its delay")
	assert.Equal(t, 1, st.Deferred)

	kv.set(opMove, storeErr, 0)
	clock.Set(st.NextDue.Add(time.Millisecond))
	st, err = s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, c.count("x"))
	assert.Equal(t, 1, st.Parked, "parked once the Move goes through")
	assert.Contains(t, logs.String(), "parked")
	b, err = s.Backlog(ctx, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, b.Parked)
	assert.Zero(t, b.Retrying+b.Due)
}
