package retentionotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/marksweep/retention"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
)

func outcome(v string) attribute.KeyValue { return attribute.String("retention.outcome", v) }
func cause(v string) attribute.KeyValue   { return attribute.String("retention.cause", v) }

// An Observer's calls for one page, ObserveLags then ObservePage, move the
// outcome counters and the lag histogram together: a collection between
// two pages (before any ObservePass) sees as many cleared markers as lags.
func TestCountersAdvanceWithLags(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	o.ObserveLags("runs/", []time.Duration{3 * time.Second, 2 * time.Second, time.Second})
	o.ObservePage("runs/", retention.Stats{Cleared: 3, Failed: 1, Retried: 1, Scanned: 5, ScanCalls: 1, ClearCalls: 4, FailedCalls: 1})
	m := collect(t, reader)
	assert.Equal(t, uint64(3), histogram(t, m["retention.clear.lag"]).Count)
	assert.Equal(t, int64(3), sum(t, m["retention.markers"], prefix, outcome("cleared")), "cleared == lag count mid-pass")
	assert.Equal(t, int64(1), sum(t, m["retention.markers"], prefix, outcome("retried")))
	assert.Equal(t, int64(4), sum(t, m["retention.clear.calls"], prefix))
	assert.Equal(t, "{call}", m["retention.clear.calls"].Unit)
	assert.NotContains(t, m, "retention.passes", "no pass ended yet")

	o.ObserveLags("runs/", []time.Duration{time.Second, time.Second})
	o.ObservePage("runs/", retention.Stats{Cleared: 2, ClearCalls: 2})
	// ObservePass carries the pass's totals; they were counted already.
	o.ObservePass("runs/", retention.Stats{Cleared: 5, Failed: 1, Retried: 1, Scanned: 5, ScanCalls: 1, ClearCalls: 6, FailedCalls: 1,
		Duration: time.Second}, nil)
	m = collect(t, reader)
	assert.Equal(t, uint64(5), histogram(t, m["retention.clear.lag"]).Count)
	assert.Equal(t, int64(5), sum(t, m["retention.markers"], prefix, outcome("cleared")), "a pass's outcomes are not counted twice")
	assert.Equal(t, int64(6), sum(t, m["retention.clear.calls"], prefix))
	assert.Equal(t, int64(1), sum(t, m["retention.passes"], prefix, attribute.String("retention.pass.result", "ok")))
}

// The same, mid-pass in a real sweep: while the Clear of the second page
// waits, a collection sees the first page's cleared markers and their
// lags, and no pass.
func TestCountersAdvancePerPageOfAPass(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	mem := retention.NewMemKV()
	for i := range 10 {
		require.NoError(t, retention.Mark(t.Context(), mem, "runs/", fmt.Sprintf("r%02d", i), t0.Add(-2*time.Hour+time.Duration(i)*time.Second)))
	}
	entered, release := make(chan struct{}), make(chan struct{})
	s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: retention.NewManualClock(t0),
		PageSize: 4, Logger: quiet, Observer: o,
		Clear: func(_ context.Context, id string) error {
			if id == "r05" { // on the second page
				close(entered)
				<-release
			}
			return nil
		}})
	require.NoError(t, err)

	var wg sync.WaitGroup
	var st retention.Stats
	wg.Go(func() { st, _ = s.Pass(t.Context()) })
	<-entered
	m := collect(t, reader)
	assert.Equal(t, uint64(4), histogram(t, m["retention.clear.lag"]).Count, "the first page's lags")
	assert.Equal(t, int64(4), sum(t, m["retention.markers"], prefix, outcome("cleared")), "as many cleared as lags")
	assert.Equal(t, int64(4), sum(t, m["retention.clear.calls"], prefix))
	assert.NotContains(t, m, "retention.passes")
	close(release)
	wg.Wait()

	require.Equal(t, 10, st.Cleared)
	m = collect(t, reader)
	assert.Equal(t, uint64(10), histogram(t, m["retention.clear.lag"]).Count)
	assert.Equal(t, int64(10), sum(t, m["retention.markers"], prefix, outcome("cleared")))
	assert.Equal(t, int64(1), sum(t, m["retention.passes"], prefix, attribute.String("retention.pass.result", "ok")))
}

// Failed clear calls are counted by cause, also those a bisection got
// past, which end no marker failed.
func TestFailedCallsByCause(t *testing.T) {
	t.Parallel()
	t.Run("Clear", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o, reader := newObserver(t)
			mem := retention.NewMemKV()
			for _, id := range []string{"err", "ok", "panic", "slow"} {
				require.NoError(t, retention.Mark(t.Context(), mem, "runs/", id, time.Now().Add(-2*time.Hour)))
			}
			s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: o,
				ClearTimeout: time.Second,
				Clear: func(ctx context.Context, id string) error {
					switch id {
					case "err":
						return errors.New("poisoned")
					case "panic":
						panic("bug")
					case "slow": // a row lock
						<-ctx.Done()
						return ctx.Err()
					}
					return nil
				}})
			require.NoError(t, err)
			st, err := s.Pass(t.Context())
			require.NoError(t, err)
			require.Equal(t, []int{3, 1, 1}, []int{st.FailedCalls, st.TimedOutCalls, st.PanickedCalls})
			m := collect(t, reader)
			assert.Equal(t, "{call}", m["retention.clear.calls.failed"].Unit)
			for c, want := range map[string]int64{"error": 1, "timeout": 1, "panic": 1} {
				assert.Equal(t, want, sum(t, m["retention.clear.calls.failed"], prefix, cause(c)), c)
			}
			assert.Equal(t, int64(4), sum(t, m["retention.clear.calls"], prefix))
			assert.Equal(t, int64(3), sum(t, m["retention.markers"], prefix, outcome("failed")))
		})
	})
	t.Run("bisection", func(t *testing.T) {
		t.Parallel()
		o, reader := newObserver(t)
		mem := retention.NewMemKV()
		for i := range 16 {
			require.NoError(t, retention.Mark(t.Context(), mem, "runs/", fmt.Sprintf("r%02d", i), t0.Add(-2*time.Hour)))
		}
		// r03 fails once: the batch fails as a whole, and a bisection
		// clears every id, r03 alone at last.
		failures := map[string]int{"r03": 1}
		var mu sync.Mutex
		s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: retention.NewManualClock(t0),
			Logger: quiet, Observer: o, BatchSize: 16,
			ClearBatch: func(_ context.Context, ids []string) error {
				mu.Lock()
				defer mu.Unlock()
				for _, id := range ids {
					if failures[id] > 0 {
						failures[id]--
						return fmt.Errorf("row of %s locked", id)
					}
				}
				return nil
			}})
		require.NoError(t, err)
		st, err := s.Pass(t.Context())
		require.NoError(t, err)
		require.Equal(t, 16, st.Cleared)
		require.Zero(t, st.Failed, "the bisection got past the failure")
		require.Equal(t, 1, st.FailedCalls)
		m := collect(t, reader)
		assert.Equal(t, int64(1), sum(t, m["retention.clear.calls.failed"], prefix, cause("error")),
			"a failure that ended no marker failed is counted")
		assert.Equal(t, int64(0), sum(t, m["retention.markers"], prefix, outcome("failed")))
		assert.Equal(t, int64(st.ClearCalls), sum(t, m["retention.clear.calls"], prefix))
	})
}

// The Backlog gauges: a marker whose clear keeps failing is retrying, then
// parked after Config.MaxAttempts failed clears.
func TestRetryingAndParkedGauges(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	mem := retention.NewMemKV()
	clock := retention.NewManualClock(t0)
	for id, at := range map[string]time.Time{
		"poison":  t0.Add(-2 * time.Hour),              // due an hour before t0
		"stuck":   t0.Add(-time.Hour + 30*time.Second), // due 30s after t0
		"healthy": t0.Add(-time.Hour + 40*time.Second), // due 40s after t0
		"later":   t0.Add(-time.Hour + 10*time.Minute), // due 10m after t0
	} {
		require.NoError(t, retention.Mark(t.Context(), mem, "runs/", id, at))
	}
	s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, Logger: quiet, Observer: o,
		MaxAttempts: 2,
		Clear: func(_ context.Context, id string) error {
			if id == "poison" || id == "stuck" {
				return fmt.Errorf("%s: trigger raised", id)
			}
			return nil
		}})
	require.NoError(t, err)
	o.Watch(s)

	// t0: poison fails once and is retrying.
	st1, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, st1.Failed)
	m := collect(t, reader)
	assert.Equal(t, int64(1), gauge[int64](t, m["retention.retrying.markers"], prefix))
	assert.Equal(t, 3600.0, gauge[float64](t, m["retention.retrying.age"], prefix))
	assert.Equal(t, "s", m["retention.retrying.age"].Unit)
	assert.Equal(t, 3600.0, gauge[float64](t, m["retention.backlog.age"], prefix), "from poison's real due time")
	assert.Equal(t, int64(0), gauge[int64](t, m["retention.parked.markers"], prefix))

	// A minute on: poison fails a second time and is parked; stuck fails
	// for the first time; healthy is cleared.
	clock.Advance(time.Minute)
	st2, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, st2.Parked)
	require.Equal(t, 1, st2.Cleared)
	m = collect(t, reader)
	assert.Equal(t, int64(1), gauge[int64](t, m["retention.retrying.markers"], prefix), "stuck")
	assert.Equal(t, 30.0, gauge[float64](t, m["retention.retrying.age"], prefix), "stuck fell due 30s ago")
	assert.Equal(t, 30.0, gauge[float64](t, m["retention.backlog.age"], prefix), "parked markers leave the backlog age")
	assert.Equal(t, int64(0), gauge[int64](t, m["retention.backlog.markers"], prefix), "later is not due, stuck waits its retry delay")
	assert.Equal(t, int64(1), gauge[int64](t, m["retention.parked.markers"], prefix), "poison")
	assert.Equal(t, "{marker}", m["retention.parked.markers"].Unit)
	for v, want := range map[string]int{
		"cleared": st1.Cleared + st2.Cleared, "failed": st1.Failed + st2.Failed,
		"retried": st1.Retried + st2.Retried, "parked": 1,
	} {
		assert.Equal(t, int64(want), sum(t, m["retention.markers"], prefix, outcome(v)), v)
	}
	assert.Equal(t, int64(3), sum(t, m["retention.clear.calls.failed"], prefix, cause("error")))

	// Requeued, poison leaves the parked gauge.
	n, err := s.Requeue(t.Context(), "poison")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	m = collect(t, reader)
	assert.Equal(t, int64(0), gauge[int64](t, m["retention.parked.markers"], prefix))
	assert.Equal(t, int64(2), gauge[int64](t, m["retention.retrying.markers"], prefix))
}
