package retentionprom_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// markDeadline writes the marker of id with a deadline of its own.
func markDeadline(t testing.TB, kv *retention.MemKV, prefix, id string, at time.Time) {
	t.Helper()
	key, err := retention.DeadlineKey(prefix, at, id)
	require.NoError(t, err)
	require.NoError(t, kv.Put(context.Background(), key, nil))
}

// A hold is counted as held and nowhere as a failure, whichever way the
// clear returned it; retention_held_markers counts the held marker, and
// one with a deadline of its own, until their times come.
func TestHeldOutcomeAndGauge(t *testing.T) {
	t.Parallel()
	until := t0.Add(24 * time.Hour)
	for _, tt := range []struct {
		name string
		// config returns the clear of a sweep that holds "legal" while
		// held() is true.
		config func(held func() bool) retention.Config
	}{
		{"Clear", func(held func() bool) retention.Config {
			return retention.Config{Clear: func(_ context.Context, id string) error {
				if id == "legal" && held() {
					return retention.Hold(until)
				}
				return nil
			}}
		}},
		{"BatchError entry", func(held func() bool) retention.Config {
			return retention.Config{ClearBatch: func(_ context.Context, ids []string) error {
				if slices.Contains(ids, "legal") && held() {
					return retention.BatchError{"legal": retention.Hold(until)}
				}
				return nil
			}}
		}},
		{"whole ClearBatch call", func(held func() bool) retention.Config {
			return retention.Config{BatchSize: 1, ClearBatch: func(_ context.Context, ids []string) error {
				if ids[0] == "legal" && held() {
					return retention.Hold(until)
				}
				return nil
			}}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := retentionprom.New(retentionprom.Options{})
			require.NoError(t, err)
			mem := retention.NewMemKV()
			clock := retention.NewManualClock(t0)
			for _, id := range []string{"legal", "ok1", "ok2"} {
				mark(t, mem, "runs/", id, t0.Add(-2*time.Hour))
			}
			markDeadline(t, mem, "runs/", "kept", t0.Add(48*time.Hour))
			cfg := tt.config(func() bool { return clock.Now().Before(until) })
			cfg.Prefix, cfg.Retention, cfg.Clock, cfg.Logger, cfg.Observer = "runs/", time.Hour, clock, quiet, c
			s, err := retention.New(mem, cfg)
			require.NoError(t, err)
			c.Watch(s)
			reg := prometheus.NewPedanticRegistry()
			require.NoError(t, reg.Register(c))
			labels := map[string]string{"prefix": "runs/"}
			outcome := func(o string) float64 {
				return gather(t, reg, "retention_markers_total", map[string]string{"prefix": "runs/", "outcome": o})
			}

			st, err := s.Pass(t.Context())
			require.NoError(t, err)
			require.Equal(t, 1, st.Held)
			require.Equal(t, 2, st.Cleared)
			assert.Equal(t, 1.0, outcome("held"))
			assert.Equal(t, 2.0, outcome("cleared"))
			for _, o := range []string{"failed", "retried", "parked", "would_clear"} {
				assert.Zero(t, outcome(o), "a hold is no %s marker", o)
			}
			for _, cause := range []string{"error", "timeout", "panic"} {
				assert.Zero(t, gather(t, reg, "retention_clear_calls_failed_total", map[string]string{"cause": cause}),
					"a hold is no failed call (%s)", cause)
			}
			assert.Equal(t, 1.0, gather(t, reg, "retention_held_markers", labels), "legal, held; kept, with a deadline ahead, is not due yet and not held")
			assert.Zero(t, gather(t, reg, "retention_retrying_markers", labels))
			assert.Zero(t, gather(t, reg, "retention_backlog_markers", labels))
			assert.Zero(t, gather(t, reg, "retention_backlog_age_seconds", labels), "held markers are not late")

			// A day on, the hold is over and legal is cleared; kept waits
			// for its deadline.
			clock.Set(until.Add(time.Hour))
			st, err = s.Pass(t.Context())
			require.NoError(t, err)
			require.Equal(t, 1, st.Cleared)
			assert.Equal(t, 1.0, outcome("held"), "counted once")
			assert.Equal(t, 3.0, outcome("cleared"))
			assert.Zero(t, gather(t, reg, "retention_held_markers", labels), "kept waits for its deadline: not due yet, not held")

			problems, err := testutil.GatherAndLint(reg)
			require.NoError(t, err)
			assert.Empty(t, problems, "Prometheus naming conventions")
		})
	}
}

// A dry run counts the markers it would have cleared as would_clear, at
// every pass, and nothing as cleared; the backlog stays as it was.
func TestWouldClearOutcome(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	for _, id := range []string{"a", "b", "c"} {
		mark(t, mem, "runs/", id, t0.Add(-2*time.Hour))
	}
	mark(t, mem, "runs/", "fresh", t0.Add(-time.Minute))
	markDeadline(t, mem, "runs/", "deadline", t0.Add(-time.Minute))
	cfg := retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: retention.NewManualClock(t0), Logger: quiet, Observer: c,
		DryRun: true,
		Clear: func(_ context.Context, id string) error {
			t.Errorf("Clear(%q) in a dry run", id)
			return nil
		}}
	dry, err := retention.New(mem, cfg)
	require.NoError(t, err)
	c.Watch(dry)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	labels := map[string]string{"prefix": "runs/"}
	outcome := func(o string) float64 {
		return gather(t, reg, "retention_markers_total", map[string]string{"prefix": "runs/", "outcome": o})
	}

	for range 2 {
		st, err := dry.Pass(t.Context())
		require.NoError(t, err)
		require.Equal(t, 4, st.WouldClear, "a, b, c and deadline")
	}
	assert.Equal(t, 8.0, outcome("would_clear"), "counted at every dry pass")
	for _, o := range []string{"cleared", "failed", "held"} {
		assert.Zero(t, outcome(o), o)
	}
	assert.Zero(t, gather(t, reg, "retention_clear_calls_total", labels))
	assert.Zero(t, gather(t, reg, "retention_clear_lag_seconds", labels), "no lag: nothing was cleared")
	assert.Equal(t, 2.0, gather(t, reg, "retention_passes_total", map[string]string{"prefix": "runs/", "result": "ok"}))
	assert.Equal(t, 4.0, gather(t, reg, "retention_backlog_markers", labels), "a dry run leaves the backlog: a, b, c and deadline")

	// The same sweep for real clears what a dry pass counted.
	cfg.DryRun, cfg.Clear = false, func(context.Context, string) error { return nil }
	real, err := retention.New(mem, cfg)
	require.NoError(t, err)
	st, err := real.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 4, st.Cleared)
	assert.Equal(t, 4.0, outcome("cleared"))
	assert.Equal(t, 8.0, outcome("would_clear"))
}

// Held and WouldClear are counted from ObservePass's Stats once, whether
// or not ObservePage's Stats carry them too.
func TestHeldCountedOncePerPass(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	c.ObservePage("runs/", retention.Stats{Held: 2, WouldClear: 3, Cleared: 1})
	c.ObservePass("runs/", retention.Stats{Held: 2, WouldClear: 3, Cleared: 1}, nil)
	for o, want := range map[string]float64{"held": 2, "would_clear": 3, "cleared": 1} {
		assert.Equal(t, want, gather(t, reg, "retention_markers_total", map[string]string{"outcome": o}), o)
	}
}
