package retentionotel_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
)

// markDeadline writes the marker of id with a deadline of its own.
func markDeadline(t testing.TB, kv *retention.MemKV, prefix, id string, at time.Time) {
	t.Helper()
	key, err := retention.DeadlineKey(prefix, at, id)
	require.NoError(t, err)
	require.NoError(t, kv.Put(context.Background(), key, nil))
}

// A hold is counted as held and nowhere as a failure, whichever way the
// clear returned it; retention.held.markers counts the held marker, and one
// with a deadline of its own, until their times come.
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
			o, reader := newObserver(t)
			mem := retention.NewMemKV()
			clock := retention.NewManualClock(t0)
			for _, id := range []string{"legal", "ok1", "ok2"} {
				require.NoError(t, retention.Mark(t.Context(), mem, "runs/", id, t0.Add(-2*time.Hour)))
			}
			markDeadline(t, mem, "runs/", "kept", t0.Add(48*time.Hour))
			cfg := tt.config(func() bool { return clock.Now().Before(until) })
			cfg.Prefix, cfg.Retention, cfg.Clock, cfg.Logger, cfg.Observer = "runs/", time.Hour, clock, quiet, o
			s, err := retention.New(mem, cfg)
			require.NoError(t, err)
			o.Watch(s)

			st, err := s.Pass(t.Context())
			require.NoError(t, err)
			require.Equal(t, 1, st.Held)
			require.Equal(t, 2, st.Cleared)
			m := collect(t, reader)
			assert.Equal(t, int64(1), sum(t, m["retention.markers"], prefix, outcome("held")))
			assert.Equal(t, int64(2), sum(t, m["retention.markers"], prefix, outcome("cleared")))
			for _, v := range []string{"failed", "retried", "parked", "would_clear"} {
				assert.Zero(t, sum(t, m["retention.markers"], prefix, outcome(v)), "a hold is no %s marker", v)
			}
			assert.NotContains(t, m, "retention.clear.calls.failed", "a hold is no failed call")
			assert.Equal(t, int64(1), gauge[int64](t, m["retention.held.markers"], prefix), "legal, held; kept, with a deadline ahead, is not due yet and not held")
			assert.Equal(t, "{marker}", m["retention.held.markers"].Unit)
			assert.Zero(t, gauge[int64](t, m["retention.retrying.markers"], prefix))
			assert.Zero(t, gauge[int64](t, m["retention.backlog.markers"], prefix))
			assert.Zero(t, gauge[float64](t, m["retention.backlog.age"], prefix), "held markers are not late")

			// A day on, the hold is over and legal is cleared; kept waits
			// for its deadline.
			clock.Set(until.Add(time.Hour))
			st, err = s.Pass(t.Context())
			require.NoError(t, err)
			require.Equal(t, 1, st.Cleared)
			m = collect(t, reader)
			assert.Equal(t, int64(1), sum(t, m["retention.markers"], prefix, outcome("held")), "counted once")
			assert.Equal(t, int64(3), sum(t, m["retention.markers"], prefix, outcome("cleared")))
			assert.Zero(t, gauge[int64](t, m["retention.held.markers"], prefix), "kept waits for its deadline: not due yet, not held")
		})
	}
}

// A dry run counts the markers it would have cleared as would_clear, at
// every pass, and nothing as cleared; the backlog stays as it was.
func TestWouldClearOutcome(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	mem := retention.NewMemKV()
	for _, id := range []string{"a", "b", "c"} {
		require.NoError(t, retention.Mark(t.Context(), mem, "runs/", id, t0.Add(-2*time.Hour)))
	}
	require.NoError(t, retention.Mark(t.Context(), mem, "runs/", "fresh", t0.Add(-time.Minute)))
	markDeadline(t, mem, "runs/", "deadline", t0.Add(-time.Minute))
	cfg := retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: retention.NewManualClock(t0), Logger: quiet, Observer: o,
		DryRun: true,
		Clear: func(_ context.Context, id string) error {
			t.Errorf("Clear(%q) in a dry run", id)
			return nil
		}}
	dry, err := retention.New(mem, cfg)
	require.NoError(t, err)
	o.Watch(dry)

	for range 2 {
		st, err := dry.Pass(t.Context())
		require.NoError(t, err)
		require.Equal(t, 4, st.WouldClear, "a, b, c and deadline")
	}
	m := collect(t, reader)
	assert.Equal(t, int64(8), sum(t, m["retention.markers"], prefix, outcome("would_clear")), "counted at every dry pass")
	for _, v := range []string{"cleared", "failed", "held"} {
		assert.Zero(t, sum(t, m["retention.markers"], prefix, outcome(v)), v)
	}
	assert.NotContains(t, m, "retention.clear.calls", "no clear was called")
	assert.NotContains(t, m, "retention.clear.lag", "no lag: nothing was cleared")
	assert.Equal(t, int64(2), sum(t, m["retention.passes"], prefix, attribute.String("retention.pass.result", "ok")))
	assert.Equal(t, int64(4), gauge[int64](t, m["retention.backlog.markers"], prefix), "a dry run leaves the backlog: a, b, c and deadline")

	// The same sweep for real clears what a dry pass counted.
	cfg.DryRun, cfg.Clear = false, func(context.Context, string) error { return nil }
	real, err := retention.New(mem, cfg)
	require.NoError(t, err)
	st, err := real.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 4, st.Cleared)
	m = collect(t, reader)
	assert.Equal(t, int64(4), sum(t, m["retention.markers"], prefix, outcome("cleared")))
	assert.Equal(t, int64(8), sum(t, m["retention.markers"], prefix, outcome("would_clear")))
}

// Held and WouldClear are counted from ObservePass's Stats once, whether
// or not ObservePage's Stats carry them too.
func TestHeldCountedOncePerPass(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	o.ObservePage("runs/", retention.Stats{Held: 2, WouldClear: 3, Cleared: 1})
	o.ObservePass("runs/", retention.Stats{Held: 2, WouldClear: 3, Cleared: 1}, nil)
	m := collect(t, reader)
	for v, want := range map[string]int64{"held": 2, "would_clear": 3, "cleared": 1} {
		assert.Equal(t, want, sum(t, m["retention.markers"], prefix, outcome(v)), v)
	}
}
