package retentionprom_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hungKV is a KV whose Scan waits for its context to end.
type hungKV struct{ *retention.MemKV }

func (hungKV) Scan(ctx context.Context, _, _ []byte, _ int) ([][]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A pass that fails because the store did not answer within StoreTimeout is
// an error, not a cancellation: its error wraps context.DeadlineExceeded of
// the store call's own deadline.
func TestStoreTimeoutIsAnError(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	s, err := retention.New(hungKV{retention.NewMemKV()}, retention.Config{Prefix: "x/", Retention: time.Hour, Logger: quiet,
		StoreTimeout: time.Millisecond, Observer: c, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	_, err = s.Pass(t.Context())
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// A caller's deadline is a cancellation.
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	s2, err := retention.New(hungKV{retention.NewMemKV()}, retention.Config{Prefix: "y/", Retention: time.Hour, Logger: quiet,
		StoreTimeout: -1, Observer: c, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	_, err = s2.Pass(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	f := scrape(t, reg)
	for _, tt := range []struct{ prefix, result string }{{"x/", "error"}, {"y/", "canceled"}} {
		for _, r := range []string{"ok", "error", "canceled", "lease_lost"} {
			want := 0.0
			if r == tt.result {
				want = 1
			}
			got := find(t, f, "retention_passes_total", map[string]string{"prefix": tt.prefix, "result": r}).GetCounter().GetValue()
			assert.Equal(t, want, got, "retention_passes_total{prefix=%q,result=%q}", tt.prefix, r)
		}
	}
}

// Markers years past due, a page at a time: the sum of a page's lags must
// not overflow a time.Duration (292 years).
func TestLagSumOfOldMarkers(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	const n = 256
	written := t0.AddDate(-3, 0, 0)
	for i := range n {
		mark(t, mem, "old/", fmt.Sprintf("e%03d", i), written)
	}
	s, err := retention.New(mem, retention.Config{Prefix: "old/", Retention: time.Hour, Logger: quiet, Observer: c,
		Clock: retention.NewManualClock(t0), Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	st, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, n, st.Cleared)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	h := find(t, scrape(t, reg), "retention_clear_lag_seconds", nil).GetHistogram()
	assert.Equal(t, uint64(n), h.GetSampleCount())
	want := n * t0.Sub(written.Add(time.Hour)).Seconds()
	assert.InEpsilon(t, want, h.GetSampleSum(), 1e-9, "sum of lags")
}

// Watching a sweep twice, or two sweeps of one prefix, must not make every
// scrape fail on a duplicate series.
func TestWatchTwice(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	mark(t, mem, "runs/", "a", t0.Add(-2*time.Hour))
	newSweep := func(kv *retention.MemKV) *retention.Sweep {
		s, err := retention.New(kv, retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: c,
			Clock: retention.NewManualClock(t0), Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		return s
	}
	s := newSweep(mem)
	c.Watch(s)
	c.Watch(s)
	// Another store under the same prefix, further behind.
	other := retention.NewMemKV()
	mark(t, other, "runs/", "b", t0.Add(-3*time.Hour))
	c.Watch(newSweep(other))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	_, err = reg.Gather()
	require.NoError(t, err)
	f := scrape(t, reg)
	assert.Len(t, f["retention_backlog_age_seconds"].GetMetric(), 1)
	assert.Equal(t, 7200.0, find(t, f, "retention_backlog_age_seconds", nil).GetGauge().GetValue(), "the oldest of the prefix's backlogs")
	assert.Equal(t, 2.0, find(t, f, "retention_backlog_markers", nil).GetGauge().GetValue(), "the sum of the prefix's counts")
}

// A marker waiting out its retry delay in memory (a KV without Put) is
// skipped by every pass: the Stats count it as Deferred, and so must the
// metrics.
func TestDeferredOutcome(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	mark(t, mem, "runs/", "a", t0.Add(-2*time.Hour))
	s, err := retention.New(noPut{mem}, retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: c,
		Clock: retention.NewManualClock(t0), RetryDelay: time.Hour, MaxRetryDelay: time.Hour,
		Clear: func(context.Context, string) error { return fmt.Errorf("down") }})
	require.NoError(t, err)
	_, err = s.Pass(t.Context())
	require.NoError(t, err)
	st, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, st.Deferred)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	f := scrape(t, reg)
	assert.Equal(t, 1.0, find(t, f, "retention_markers_total", map[string]string{"outcome": "deferred"}).GetCounter().GetValue())
}

// noPut hides MemKV's Put, so retry delays are kept in memory.
type noPut struct{ kv *retention.MemKV }

func (k noPut) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return k.kv.Scan(ctx, start, end, limit)
}

func (k noPut) Delete(ctx context.Context, keys ...[]byte) error { return k.kv.Delete(ctx, keys...) }

// A LeasedPass tried while this replica holds the lease (under Run, or
// another LeasedPass) finds it held: the gauge must still say this replica
// holds it.
func TestLeaseHeldGaugeSurvivesOwnRetry(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mem := retention.NewMemKV()
	mark(t, mem, "jobs/", "a", t0.Add(-2*time.Hour))
	var s *retention.Sweep
	var inner error
	var heldDuring float64
	s, err = retention.New(mem, retention.Config{Prefix: "jobs/", Retention: time.Hour, Logger: quiet, Lease: &locker{}, Observer: c,
		Clock: retention.NewManualClock(t0),
		Clear: func(ctx context.Context, id string) error {
			_, inner = s.LeasedPass(ctx)
			families, err := reg.Gather()
			assert.NoError(t, err)
			for _, f := range families {
				if f.GetName() == "retention_lease_held" {
					heldDuring = f.GetMetric()[0].GetGauge().GetValue()
				}
			}
			return nil
		}})
	require.NoError(t, err)
	_, err = s.LeasedPass(t.Context())
	require.NoError(t, err)
	require.ErrorIs(t, inner, retention.ErrLeaseHeld)
	assert.Equal(t, 1.0, heldDuring, "retention_lease_held while this replica holds the lease")
}

// One store that does not answer must not take the backlog gauges of the
// other watched sweeps with it: each read gets the whole BacklogTimeout.
func TestHungStoreLeavesOtherBacklogs(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{BacklogTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	hung, err := retention.New(hungKV{retention.NewMemKV()}, retention.Config{Prefix: "hung/", Retention: time.Hour, Logger: quiet,
		StoreTimeout: -1, Observer: c, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	mark(t, mem, "ok/", "a", t0.Add(-2*time.Hour))
	ok, err := retention.New(mem, retention.Config{Prefix: "ok/", Retention: time.Hour, Logger: quiet, Observer: c,
		Clock: retention.NewManualClock(t0), Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	c.Watch(hung, ok)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	start := time.Now()
	f := scrape(t, reg)
	assert.Less(t, time.Since(start), time.Second, "the scrape waits for BacklogTimeout, not longer")
	assert.Equal(t, 3600.0, find(t, f, "retention_backlog_age_seconds", map[string]string{"prefix": "ok/"}).GetGauge().GetValue())
	assert.Equal(t, 1.0, find(t, f, "retention_backlog_errors_total", map[string]string{"prefix": "hung/"}).GetCounter().GetValue())
	assert.Equal(t, 0.0, find(t, f, "retention_backlog_errors_total", map[string]string{"prefix": "ok/"}).GetCounter().GetValue())
}
