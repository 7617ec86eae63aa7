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
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const retention = time.Second
				mem := NewMemKV()
				var mu sync.Mutex
				var poisonCalls []time.Duration
				start := time.Now()
				mark(t, mem, "runs/", "poison", start.Add(-2*retention))
				s, err := New(kind.wrap(mem), Config{Prefix: "runs/", Retention: retention,
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
					// Under steady traffic Run passes once per MinInterval: a due
					// retry is seen up to one MinInterval late.
					assert.LessOrEqual(t, gap, wantGap*6/5+DefaultMinInterval, "gap %d", i)
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
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			counting := kind.fake(mem)
			kv := counting.store()
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
			assert.Zero(t, counting.deletes.Load()+counting.puts.Load()+counting.moves.Load(), "an idle pass writes nothing")
			if kind.writes {
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

// misplacedWritesKV puts a namespace in front of the keys it scans and
// deletes but inherits Put and Move from the MemKV it wraps: they write
// where Scan does not read.
type misplacedWritesKV struct {
	*MemKV
	ns string
}

func (n misplacedWritesKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	keys, err := n.MemKV.Scan(ctx, append([]byte(n.ns), start...), append([]byte(n.ns), end...), limit)
	for i := range keys {
		keys[i] = keys[i][len(n.ns):]
	}
	return keys, err
}

func (n misplacedWritesKV) Delete(ctx context.Context, keys ...[]byte) error {
	full := make([][]byte, len(keys))
	for i, k := range keys {
		full[i] = append([]byte(n.ns), k...)
	}
	return n.MemKV.Delete(ctx, full...)
}

// TestRescheduleReadBack: a Put that writes where Scan does not read is
// caught by reading the first rewrite back; the marker stays.
// misplacedWritesKV inherits MemKV's Move, so the Move is what is read
// back.
func TestRescheduleReadBack(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := misplacedWritesKV{MemKV: mem, ns: "tenant1/"}
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

// TestClockSteppedBackMidPassKeepsFailedMarker: a marker goes only once its
// Clear succeeded, even when the clock steps back (more than RetryDelay)
// during a pass, so that a rescheduled key could land further on in the
// expired range and be met again by a later page of the same pass, on
// every kind of store.
func TestClockSteppedBackMidPassKeepsFailedMarker(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			const prefix = "runs/"
			var clock *ManualClock
			var mu sync.Mutex
			stepped := false
			s, c := newSweep(t, kind.wrap(mem), Config{
				Prefix:   prefix,
				PageSize: 1,
				Clear: func(_ context.Context, id string) error {
					mu.Lock()
					defer mu.Unlock()
					if id == "a" {
						if !stepped {
							stepped = true
							clock.Advance(-150 * time.Minute) // NTP steps the clock back
						}
						return errBoom
					}
					return nil
				},
			})
			clock = c
			mark(t, mem, prefix, "a", t0.Add(-5*time.Hour))
			mark(t, mem, prefix, "b", t0.Add(-4*time.Hour))
			mark(t, mem, prefix, "c", t0.Add(-3*time.Hour+30*time.Minute))
			mark(t, mem, prefix, "d", t0.Add(-2*time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			ids := markerIDs(t, mem, prefix)
			assert.Equal(t, 1, ids["a"], "a's Clear never succeeded: one marker of it must stay (markers: %v, stats %+v)", ids, st)
		})
	}
}

// TestRaisedRetentionKeepsRetriedMarker: a Retention raised between the
// failure and the retry keeps the rescheduled marker until it expires
// under the new Retention (never early). Each entity is cleared once and
// no marker is lost.
func TestRaisedRetentionKeepsRetriedMarker(t *testing.T) {
	t.Parallel()
	for _, kind := range writingKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			kv := kind.wrap(mem)
			c := newClears()
			c.set("x", errBoom)
			clock := NewManualClock(t0.Add(time.Hour + time.Second))
			cfg := Config{Clear: c.clear, Clock: clock, RetryDelay: time.Second, MaxRetryDelay: time.Minute}
			s, _ := newSweep(t, kv, cfg)
			mark(t, mem, "runs/", "x", t0)
			mark(t, mem, "runs/", "y", t0)
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, st.Retried)
			c.set("x", nil)

			// Raised to 2h: x is not expired again until t0+2h.
			cfg.Retention = 2 * time.Hour
			s2, _ := newSweep(t, kv, cfg)
			clock.Set(st.NextDue.Add(time.Second))
			st, err = s2.Pass(context.Background())
			require.NoError(t, err)
			assert.Zero(t, st.Cleared)
			assert.Zero(t, c.count("x")-1, "x not cleared early")
			assert.Equal(t, t0.Add(2*time.Hour), st.NextDue, "NextDue when x expires under the new Retention")
			clock.Set(t0.Add(2*time.Hour + time.Millisecond))
			st, err = s2.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Cleared)
			assert.Equal(t, 2, c.count("x"))
			assert.Zero(t, mem.Len())
		})
	}
}

// TestLoweredRetentionStillWaitsForRetry: under a lowered Retention the
// retry is still honoured (not tried before its retry time), then
// cleared.
func TestLoweredRetentionStillWaitsForRetry(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	clock := NewManualClock(t0.Add(time.Hour + time.Second))
	cfg := Config{Clear: c.clear, Clock: clock, RetryDelay: time.Minute, MaxRetryDelay: time.Hour}
	s, _ := newSweep(t, mem, cfg)
	mark(t, mem, "runs/", "x", t0)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	due := st.NextDue
	c.set("x", nil)
	cfg.Retention = time.Minute
	s2, _ := newSweep(t, mem, cfg)
	st, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.ClearCalls, "within the retry delay")
	clock.Set(due.Add(time.Millisecond))
	st, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Zero(t, mem.Len())
}

// TestSlashIDsSurviveParkAndRequeue: under a custom ValidateID that
// accepts '/', ids with slashes (even digits and slashes that look like
// the retry key's own fields) survive a reschedule and a park/requeue.
func TestSlashIDsSurviveParkAndRequeue(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	ids := []string{"a/b", "00000000000000000001/3/x", "/", "1/"}
	for _, id := range ids {
		c.set(id, errBoom)
	}
	s, clock := newSweep(t, mem, Config{Clear: c.clear, MaxAttempts: 2, RetryDelay: time.Second, MaxRetryDelay: time.Minute,
		ValidateID: func(string) error { return nil }})
	for _, id := range ids {
		key, err := s.MarkerKey(t0, id)
		require.NoError(t, err)
		require.NoError(t, mem.Put(context.Background(), key, nil))
	}
	clock.Set(t0.Add(2 * time.Hour))
	for range 2 {
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, len(ids), st.Failed)
		clock.Advance(2 * time.Second)
	}
	parked, err := s.Parked(context.Background(), 10)
	require.NoError(t, err)
	var got []string
	for _, p := range parked {
		got = append(got, p.ID)
		assert.True(t, p.Finished.Equal(t0))
	}
	assert.ElementsMatch(t, ids, got)
	for _, id := range ids {
		c.set(id, nil)
	}
	n, err := s.Requeue(context.Background(), ids...)
	require.NoError(t, err)
	assert.Equal(t, len(ids), n)
	clock.Advance(time.Millisecond)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, len(ids), st.Cleared)
	for _, id := range ids {
		assert.Equal(t, 3, c.count(id), id)
	}
	assert.Zero(t, mem.Len())
}

// TestAttemptsAtTheCap: a key recording 999999999 attempts (the cap)
// parks at MaxAttempts 999999999 and, without MaxAttempts, backs off at
// MaxRetryDelay and keeps the cap.
func TestAttemptsAtTheCap(t *testing.T) {
	t.Parallel()
	for _, maxA := range []int{0, maxAttempts} {
		t.Run(fmt.Sprint(maxA), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			c.set("x", errBoom)
			s, clock := newSweep(t, mem, Config{Clear: c.clear, MaxAttempts: maxA, RetryDelay: time.Second, MaxRetryDelay: time.Minute})
			now := t0.Add(2 * time.Hour)
			clock.Set(now)
			key := appendRetryKey(nil, "runs/", 0, now.UnixMilli()-1, t0.UnixMilli(), maxAttempts, "x")
			require.NoError(t, mem.Put(context.Background(), key, nil))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			keys := keysUnder(t, mem, "runs/")
			require.Len(t, keys, 1)
			if maxA > 0 {
				assert.Equal(t, 1, st.Parked)
				assert.True(t, strings.HasPrefix(keys[0], "runs/p"))
			} else {
				assert.Equal(t, 1, st.Retried)
				assert.Contains(t, keys[0], "/999999999/x")
				assert.LessOrEqual(t, st.NextDue.Sub(now), time.Minute)
				assert.GreaterOrEqual(t, st.NextDue.Sub(now), 48*time.Second)
			}
		})
	}
}

// TestClockSteppingBackAroundRescheduleLosesNothing: a clock stepping
// back by an hour between the failure and the retry: no marker lost, none
// doubled, the id cleared once it succeeds.
func TestClockSteppingBackAroundRescheduleLosesNothing(t *testing.T) {
	t.Parallel()
	for _, kind := range writingKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			kv := kind.wrap(mem)
			c := newClears()
			c.set("x", errBoom)
			s, clock := newSweep(t, kv, Config{Clear: c.clear, Retention: time.Minute, RetryDelay: time.Second, MaxRetryDelay: time.Minute})
			mark(t, mem, "runs/", "x", t0)
			clock.Set(t0.Add(2 * time.Hour))
			for _, step := range []time.Duration{-time.Hour, 3 * time.Second, -30 * time.Minute, 2 * time.Hour} {
				_, err := s.Pass(context.Background())
				require.NoError(t, err)
				require.Equal(t, map[string]int{"x": 1}, markerIDs(t, mem, "runs/"))
				clock.Advance(step)
			}
			c.set("x", nil)
			clock.Advance(time.Hour)
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Cleared)
			assert.Zero(t, mem.Len())
		})
	}
}

// TestRescheduledKeepsDueTime: an id rescheduled three times shows its
// real lag past due in the Backlog (which grows while it keeps failing)
// and, once cleared, in ObserveLags and Stats.MaxLag; on v0.1.0 each
// reschedule reset both to the retry time.
func TestRescheduledKeepsDueTime(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	rec := &recorder{}
	s, clock := newSweep(t, mem, Config{Clear: c.clear, Observer: rec, RetryDelay: time.Second, MaxRetryDelay: time.Minute})
	mark(t, mem, "runs/", "x", t0)
	due := t0.Add(time.Hour)
	clock.Set(due.Add(time.Second))
	var ages []time.Duration
	for range 3 {
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed)
		b, err := s.Backlog(context.Background(), 10)
		require.NoError(t, err)
		assert.Equal(t, Backlog{OldestID: "x", OldestDue: b.OldestDue, Age: clock.Now().Sub(due), Retrying: 1, RetryingAge: clock.Now().Sub(due)}, b)
		assert.True(t, b.OldestDue.Equal(due), "OldestDue = %v, want the entity's due time %v", b.OldestDue, due)
		ages = append(ages, b.Age)
		clock.Set(st.NextDue.Add(time.Millisecond)) // the first pass after the retry falls due, as Run makes it
	}
	assert.Less(t, ages[0], ages[1])
	assert.Less(t, ages[1], ages[2], "a stuck id makes the backlog older")
	keys := keysUnder(t, mem, "runs/")
	require.Len(t, keys, 1)
	assert.True(t, strings.HasPrefix(keys[0], "runs/r"), "in the retry range: %q", keys[0])
	assert.Contains(t, keys[0], fmt.Sprintf("/%020d/3/x", t0.UnixMilli()), "finish time and three attempts kept")

	c.set("x", nil)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Cleared)
	lag := clock.Now().Sub(due)
	assert.Equal(t, lag, st.MaxLag, "MaxLag from the real due time")
	require.NotEmpty(t, rec.lags)
	assert.Equal(t, lag, rec.lags[len(rec.lags)-1], "ObserveLags from the real due time")
	assert.Greater(t, lag, 7*time.Second, "1s + 2s + 4s of retry delays, at least")
	assert.Zero(t, mem.Len())
}

// TestAttemptsSurviveRestart: the count of failed attempts lives in the
// marker, so a new Sweep over the same store (a restart, a lease
// hand-over) backs off from it and parks at MaxAttempts.
func TestAttemptsSurviveRestart(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	mark(t, mem, "runs/", "x", t0)
	clock := NewManualClock(t0.Add(2 * time.Hour))
	cfg := Config{Clear: c.clear, Clock: clock, RetryDelay: time.Second, MaxRetryDelay: time.Hour, MaxAttempts: 4}
	for attempt := 1; attempt <= 3; attempt++ {
		s, _ := newSweep(t, mem, cfg) // a new process every time
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed, "attempt %d", attempt)
		// The n-th failure waits 2^(n-1) seconds, up to a fifth more.
		wait := st.NextDue.Sub(clock.Now())
		base := time.Second << (attempt - 1)
		assert.GreaterOrEqual(t, wait, base, "attempt %d", attempt)
		assert.LessOrEqual(t, wait, base*6/5+time.Millisecond, "attempt %d", attempt)
		clock.Set(st.NextDue.Add(time.Millisecond))
	}
	s, _ := newSweep(t, mem, cfg)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.Parked, "the fourth failure parks it, though this Sweep saw only one")
	assert.Zero(t, st.Retried)
	assert.Equal(t, 4, c.count("x"))
}

// TestParkAndRequeue: a marker that failed MaxAttempts times is parked:
// counted, logged, never cleared again, listed by Parked and in Backlog,
// until Requeue puts it back and a pass clears it.
func TestParkAndRequeue(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	var logs syncBuffer
	s, clock := newSweep(t, mem, Config{Clear: c.clear, MaxAttempts: 2, RetryDelay: time.Second, MaxRetryDelay: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	mark(t, mem, "runs/", "x", t0)
	mark(t, mem, "runs/", "y", t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Retried)
	clock.Set(st.NextDue.Add(time.Millisecond))
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Parked)
	assert.Zero(t, st.Retried)
	assert.True(t, st.NextDue.IsZero(), "nothing left to wait for: %v", st.NextDue)
	assert.Contains(t, logs.String(), "markers parked after Config.MaxAttempts")
	assert.Contains(t, logs.String(), `\"x\": boom`)

	// Never cleared again.
	clock.Advance(24 * time.Hour)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.ClearCalls)
	assert.Equal(t, 2, c.count("x"))

	parked, err := s.Parked(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, "x", parked[0].ID)
	assert.True(t, parked[0].Finished.Equal(t0), "Finished = %v", parked[0].Finished)
	assert.Equal(t, 2, parked[0].Attempts)
	b, err := s.Backlog(context.Background(), 10)
	require.NoError(t, err)
	assert.Equal(t, Backlog{Parked: 1}, b, "parked markers count apart, not in Age")

	n, err := s.Requeue(context.Background(), "x", "nobody")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	_, err = s.Requeue(context.Background())
	require.Error(t, err, "Requeue with no id")
	c.set("x", nil)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Zero(t, mem.Len())
	parked, err = s.Parked(context.Background(), 10)
	require.NoError(t, err)
	assert.Empty(t, parked)
}

// TestMaxAttemptsValidation: MaxAttempts needs a store that can write.
func TestMaxAttemptsValidation(t *testing.T) {
	t.Parallel()
	clear := func(context.Context, string) error { return nil }
	for _, tt := range []struct {
		kv   KV
		n    int
		want string
	}{
		{NewMemKV(), -1, "Config.MaxAttempts must be 0"},
		{NewMemKV(), maxAttempts + 1, "Config.MaxAttempts must be 0"},
	} {
		_, err := New(tt.kv, Config{Prefix: "runs/", Retention: time.Hour, Clear: clear, MaxAttempts: tt.n})
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tt.want)
	}
	for _, kind := range storeKinds {
		_, err := New(kind.wrap(NewMemKV()), Config{Prefix: "runs/", Retention: time.Hour, Clear: clear, MaxAttempts: 3})
		if kind.writes {
			assert.NoError(t, err, "New(%s, MaxAttempts 3)", kind.name)
			continue
		}
		require.ErrorIs(t, err, ErrInvalidConfig, "New(%s, MaxAttempts 3)", kind.name)
		assert.Contains(t, err.Error(), "is no Mover")
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

// TestRunsWaitUntilTheLatestIDLeftInTheRange: runs wait for the latest
// time among the ids whose markers stay in the markers' range, and no
// longer once that id is moved out, forgotten or pruned, or its time
// lowered: then until the next latest, and not at all once none is left.
func TestRunsWaitUntilTheLatestIDLeftInTheRange(t *testing.T) {
	t.Parallel()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	r := newRetries(time.Minute, time.Hour)
	assert.False(t, r.runsWait(t0), "nothing in memory")

	r.stays("a", at(time.Hour))
	r.stays("b", at(365*24*time.Hour))
	r.stays("c", at(2*time.Hour))
	assert.True(t, r.runsWait(at(3*time.Hour)), "b waits a year")

	r.left("b") // moved to its held key
	assert.True(t, r.runsWait(at(90*time.Minute)), "c waits 2h")
	assert.False(t, r.runsWait(at(2*time.Hour)), "waits at most until c's time")

	r.stays("c", at(30*time.Minute)) // a later decision, earlier
	assert.True(t, r.runsWait(at(50*time.Minute)), "a waits 1h")
	assert.False(t, r.runsWait(at(time.Hour)))

	r.forget("a")
	assert.True(t, r.runsWait(at(29*time.Minute)), "c waits 30 minutes")
	assert.False(t, r.runsWait(at(30*time.Minute)))
	r.byID = map[string]retry{"c": {notBefore: at(30 * time.Minute)}}
	for range 64 {
		r.prune(NewManualClock(at(2 * time.Hour)))
	}
	assert.Empty(t, r.inRange, "pruned with its memory")
	assert.False(t, r.runsWait(t0))
}
