package retentionprom_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gather returns the value of the counter or gauge name{labels}, and the
// sample count of the histogram name{labels}, read from reg's Gather.
func gather(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

// An Observer's calls for one page, ObserveLags then ObservePage, move the
// outcome counters and the lag histogram together: a scrape between two
// pages (before any ObservePass) sees as many cleared markers as lags.
func TestCountersAdvanceWithLags(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	cleared := map[string]string{"prefix": "runs/", "outcome": "cleared"}

	c.ObserveLags("runs/", []time.Duration{3 * time.Second, 2 * time.Second, time.Second})
	c.ObservePage("runs/", retention.Stats{Cleared: 3, Failed: 1, Retried: 1, Scanned: 5, ScanCalls: 1, ClearCalls: 4, FailedCalls: 1})
	assert.Equal(t, 3.0, gather(t, reg, "retention_clear_lag_seconds", nil))
	assert.Equal(t, 3.0, gather(t, reg, "retention_markers_total", cleared), "cleared == lag count mid-pass")
	assert.Equal(t, 1.0, gather(t, reg, "retention_markers_total", map[string]string{"outcome": "retried"}))
	assert.Equal(t, 4.0, gather(t, reg, "retention_clear_calls_total", nil))
	assert.Equal(t, 0.0, gather(t, reg, "retention_passes_total", map[string]string{"result": "ok"}), "no pass ended yet")

	c.ObserveLags("runs/", []time.Duration{time.Second, time.Second})
	c.ObservePage("runs/", retention.Stats{Cleared: 2, ClearCalls: 2})
	// ObservePass carries the pass's totals; they were counted already.
	c.ObservePass("runs/", retention.Stats{Cleared: 5, Failed: 1, Retried: 1, Scanned: 5, ScanCalls: 1, ClearCalls: 6, FailedCalls: 1,
		Duration: time.Second}, nil)
	assert.Equal(t, 5.0, gather(t, reg, "retention_clear_lag_seconds", nil))
	assert.Equal(t, 5.0, gather(t, reg, "retention_markers_total", cleared), "a pass's outcomes are not counted twice")
	assert.Equal(t, 6.0, gather(t, reg, "retention_clear_calls_total", nil))
	assert.Equal(t, 1.0, gather(t, reg, "retention_passes_total", map[string]string{"result": "ok"}))
}

// The same, mid-pass in a real sweep: while the Clear of the second page
// waits, a scrape sees the first page's cleared markers and their lags, and
// no pass.
func TestCountersAdvancePerPageOfAPass(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	for i := range 10 {
		mark(t, mem, "runs/", fmt.Sprintf("r%02d", i), t0.Add(-2*time.Hour+time.Duration(i)*time.Second))
	}
	entered, release := make(chan struct{}), make(chan struct{})
	s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: retention.NewManualClock(t0),
		PageSize: 4, Logger: quiet, Observer: c,
		Clear: func(_ context.Context, id string) error {
			if id == "r05" { // on the second page
				close(entered)
				<-release
			}
			return nil
		}})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))

	var wg sync.WaitGroup
	var st retention.Stats
	wg.Go(func() { st, _ = s.Pass(t.Context()) })
	<-entered
	assert.Equal(t, 4.0, gather(t, reg, "retention_clear_lag_seconds", nil), "the first page's lags")
	assert.Equal(t, 4.0, gather(t, reg, "retention_markers_total", map[string]string{"outcome": "cleared"}), "as many cleared as lags")
	assert.Equal(t, 4.0, gather(t, reg, "retention_clear_calls_total", nil))
	assert.Equal(t, 0.0, gather(t, reg, "retention_passes_total", map[string]string{"result": "ok"}))
	close(release)
	wg.Wait()

	require.Equal(t, 10, st.Cleared)
	assert.Equal(t, 10.0, gather(t, reg, "retention_clear_lag_seconds", nil))
	assert.Equal(t, 10.0, gather(t, reg, "retention_markers_total", map[string]string{"outcome": "cleared"}))
	assert.Equal(t, 1.0, gather(t, reg, "retention_passes_total", map[string]string{"result": "ok"}))
}

// Failed clear calls are counted by cause, also those a bisection got
// past, which end no marker failed.
func TestFailedCallsByCause(t *testing.T) {
	t.Parallel()
	t.Run("Clear", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, err := retentionprom.New(retentionprom.Options{})
			require.NoError(t, err)
			mem := retention.NewMemKV()
			for _, id := range []string{"err", "ok", "panic", "slow"} {
				mark(t, mem, "runs/", id, time.Now().Add(-2*time.Hour))
			}
			s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: c,
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
			reg := prometheus.NewPedanticRegistry()
			require.NoError(t, reg.Register(c))
			st, err := s.Pass(t.Context())
			require.NoError(t, err)
			require.Equal(t, retention.Stats{Cleared: 1, Failed: 3, Retried: 3, ClearCalls: 4, FailedCalls: 3, TimedOutCalls: 1, PanickedCalls: 1},
				retention.Stats{Cleared: st.Cleared, Failed: st.Failed, Retried: st.Retried, ClearCalls: st.ClearCalls,
					FailedCalls: st.FailedCalls, TimedOutCalls: st.TimedOutCalls, PanickedCalls: st.PanickedCalls})
			for cause, want := range map[string]float64{"error": 1, "timeout": 1, "panic": 1} {
				assert.Equal(t, want, gather(t, reg, "retention_clear_calls_failed_total", map[string]string{"cause": cause}), cause)
			}
			assert.Equal(t, 4.0, gather(t, reg, "retention_clear_calls_total", nil))
			assert.Equal(t, 3.0, gather(t, reg, "retention_markers_total", map[string]string{"outcome": "failed"}))
		})
	})
	t.Run("bisection", func(t *testing.T) {
		t.Parallel()
		c, err := retentionprom.New(retentionprom.Options{})
		require.NoError(t, err)
		mem := retention.NewMemKV()
		for i := range 16 {
			mark(t, mem, "runs/", fmt.Sprintf("r%02d", i), t0.Add(-2*time.Hour))
		}
		// r03 fails once: the batch fails as a whole, and a bisection
		// clears every id, r03 alone at last.
		failures := map[string]int{"r03": 1}
		var mu sync.Mutex
		s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: retention.NewManualClock(t0),
			Logger: quiet, Observer: c, BatchSize: 16,
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
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		st, err := s.Pass(t.Context())
		require.NoError(t, err)
		require.Equal(t, 16, st.Cleared)
		require.Zero(t, st.Failed, "the bisection got past the failure")
		require.Equal(t, 1, st.FailedCalls)
		assert.Equal(t, 1.0, gather(t, reg, "retention_clear_calls_failed_total", map[string]string{"cause": "error"}),
			"a failure that ended no marker failed is counted")
		assert.Equal(t, 0.0, gather(t, reg, "retention_markers_total", map[string]string{"outcome": "failed"}))
		assert.Equal(t, float64(st.ClearCalls), gather(t, reg, "retention_clear_calls_total", nil))
		assert.Greater(t, st.ClearCalls, 1)
	})
}

// The Backlog gauges: a marker whose clear keeps failing is retrying, then
// parked after Config.MaxAttempts failed clears.
func TestRetryingAndParkedGauges(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	clock := retention.NewManualClock(t0)
	mark(t, mem, "runs/", "poison", t0.Add(-2*time.Hour))               // due an hour before t0
	mark(t, mem, "runs/", "stuck", t0.Add(-time.Hour+30*time.Second))   // due 30s after t0
	mark(t, mem, "runs/", "healthy", t0.Add(-time.Hour+40*time.Second)) // due 40s after t0
	mark(t, mem, "runs/", "later", t0.Add(-time.Hour+10*time.Minute))   // due 10m after t0
	s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, Logger: quiet, Observer: c,
		MaxAttempts: 2,
		Clear: func(_ context.Context, id string) error {
			if id == "poison" || id == "stuck" {
				return fmt.Errorf("%s: trigger raised", id)
			}
			return nil
		}})
	require.NoError(t, err)
	c.Watch(s)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	labels := map[string]string{"prefix": "runs/"}

	// t0: poison fails once and is retrying.
	st1, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, st1.Failed)
	assert.Equal(t, 1.0, gather(t, reg, "retention_retrying_markers", labels))
	assert.Equal(t, 3600.0, gather(t, reg, "retention_retrying_age_seconds", labels))
	assert.Equal(t, 3600.0, gather(t, reg, "retention_backlog_age_seconds", labels), "from poison's real due time")
	assert.Equal(t, 0.0, gather(t, reg, "retention_parked_markers", labels))

	// A minute on: poison fails a second time and is parked; stuck fails
	// for the first time; healthy is cleared.
	clock.Advance(time.Minute)
	st2, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, st2.Parked)
	require.Equal(t, 1, st2.Cleared)
	assert.Equal(t, 1.0, gather(t, reg, "retention_retrying_markers", labels), "stuck")
	assert.Equal(t, 30.0, gather(t, reg, "retention_retrying_age_seconds", labels), "stuck fell due 30s ago")
	assert.Equal(t, 30.0, gather(t, reg, "retention_backlog_age_seconds", labels), "parked markers leave the backlog age")
	assert.Equal(t, 0.0, gather(t, reg, "retention_backlog_markers", labels), "later is not due, stuck waits its retry delay")
	assert.Equal(t, 1.0, gather(t, reg, "retention_parked_markers", labels), "poison")
	for outcome, want := range map[string]int{
		"cleared": st1.Cleared + st2.Cleared, "failed": st1.Failed + st2.Failed,
		"retried": st1.Retried + st2.Retried, "parked": 1,
	} {
		assert.Equal(t, float64(want), gather(t, reg, "retention_markers_total", map[string]string{"outcome": outcome}), outcome)
	}
	assert.Equal(t, 3.0, gather(t, reg, "retention_clear_calls_failed_total", map[string]string{"cause": "error"}))

	// Requeued, poison leaves the parked gauge.
	n, err := s.Requeue(t.Context(), "poison")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, 0.0, gather(t, reg, "retention_parked_markers", labels))
	assert.Equal(t, 2.0, gather(t, reg, "retention_retrying_markers", labels))

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "Prometheus naming conventions")
}
