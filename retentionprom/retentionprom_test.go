package retentionprom_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	t0    = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	quiet = slog.New(slog.DiscardHandler)
)

func mark(t testing.TB, kv *retention.MemKV, prefix, id string, at time.Time) {
	t.Helper()
	require.NoError(t, retention.Mark(context.Background(), kv, prefix, id, at))
}

// scrape fetches /metrics from a promhttp handler of reg over HTTP and
// parses the text format.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain") // the text format, not protobuf
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err, "parse:\n%s", body)
	return families
}

// find returns the metric of family name whose labels include want.
func find(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	f := families[name]
	require.NotNil(t, f, "no family %s", name)
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s%v", name, want)
	return nil
}

func TestScrapeOverHTTP(t *testing.T) {
	t.Parallel()
	mem := retention.NewMemKV()
	clock := retention.NewManualClock(t0)
	// 300 markers, one every 10s, over the 50 minutes before t0; retention 1h.
	const n = 300
	for i := range n {
		mark(t, mem, "runs/", fmt.Sprintf("r%03d", i), t0.Add(-time.Duration(n-i)*10*time.Second))
	}
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	var failing atomic.Bool
	s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, PageSize: 16, Logger: quiet,
		Observer: c,
		Clear: func(_ context.Context, id string) error {
			if failing.Load() && id == "r299" {
				return fmt.Errorf("boom")
			}
			return nil
		}})
	require.NoError(t, err)
	c.Watch(s)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))

	// 40 minutes on, the markers of the first 30 minutes (180) are due.
	clock.Set(t0.Add(40 * time.Minute))
	f := scrape(t, reg)
	assert.Equal(t, 1800.0, find(t, f, "retention_backlog_age_seconds", map[string]string{"prefix": "runs/"}).GetGauge().GetValue(),
		"the oldest marker fell due 30 minutes ago")
	assert.Equal(t, 180.0, find(t, f, "retention_backlog_markers", nil).GetGauge().GetValue(),
		"markers written more than 20 minutes before t0 (the one of exactly 20 is not due)")

	st, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 180, st.Cleared)
	// Then the rest, the last one failing once, at t0+70m.
	clock.Set(t0.Add(70 * time.Minute))
	failing.Store(true)
	st2, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, n-180-1, st2.Cleared)
	require.Equal(t, 1, st2.Failed)

	// The lags, computed here from the markers' times: the first pass
	// deleted at t0+40m, the second at t0+70m; each marker fell due an hour
	// after it was written.
	var wantSum float64
	for i := range n - 1 {
		written := t0.Add(-time.Duration(n-i) * 10 * time.Second)
		deleted := t0.Add(70 * time.Minute)
		if i < 180 {
			deleted = t0.Add(40 * time.Minute)
		}
		wantSum += deleted.Sub(written.Add(time.Hour)).Seconds()
	}

	f = scrape(t, reg)
	lag := find(t, f, "retention_clear_lag_seconds", map[string]string{"prefix": "runs/"}).GetHistogram()
	assert.Equal(t, uint64(st.Cleared+st2.Cleared), lag.GetSampleCount(), "one lag per entity cleared")
	assert.InDelta(t, wantSum, lag.GetSampleSum(), 1e-6, "sum of lags")
	// Cumulative buckets: the lags run from 0s to 30 minutes.
	for _, b := range lag.GetBucket() {
		want := 0
		for i := range n - 1 {
			written := t0.Add(-time.Duration(n-i) * 10 * time.Second)
			deleted := t0.Add(70 * time.Minute)
			if i < 180 {
				deleted = t0.Add(40 * time.Minute)
			}
			if deleted.Sub(written.Add(time.Hour)).Seconds() <= b.GetUpperBound() {
				want++
			}
		}
		assert.Equal(t, uint64(want), b.GetCumulativeCount(), "bucket le=%v", b.GetUpperBound())
	}
	for outcome, want := range map[string]int{"cleared": n - 1, "failed": 1, "retried": 1, "malformed": 0, "foreign": 0, "live_again": 0} {
		got := find(t, f, "retention_markers_total", map[string]string{"prefix": "runs/", "outcome": outcome}).GetCounter().GetValue()
		assert.Equal(t, float64(want), got, "retention_markers_total{outcome=%q}", outcome)
	}
	assert.Equal(t, 2.0, find(t, f, "retention_passes_total", map[string]string{"result": "ok"}).GetCounter().GetValue())
	assert.Equal(t, uint64(2), find(t, f, "retention_pass_duration_seconds", nil).GetHistogram().GetSampleCount())
	// The failed marker was rescheduled, but its entity fell due 610s ago
	// (written at t0-10s, due an hour later, now t0+70m): it is retrying,
	// and the backlog age counts it from its real due time.
	assert.Equal(t, 610.0, find(t, f, "retention_backlog_age_seconds", nil).GetGauge().GetValue())
	assert.Equal(t, 0.0, find(t, f, "retention_backlog_markers", nil).GetGauge().GetValue(), "none due and not tried")
	assert.Equal(t, 1.0, find(t, f, "retention_retrying_markers", nil).GetGauge().GetValue())
	assert.Equal(t, 610.0, find(t, f, "retention_retrying_age_seconds", nil).GetGauge().GetValue())
	assert.Equal(t, 0.0, find(t, f, "retention_parked_markers", nil).GetGauge().GetValue())
	assert.Equal(t, float64(st.ClearCalls+st2.ClearCalls), find(t, f, "retention_clear_calls_total", nil).GetCounter().GetValue())
	assert.Equal(t, 1.0, find(t, f, "retention_clear_calls_failed_total", map[string]string{"cause": "error"}).GetCounter().GetValue())
	assert.Nil(t, f["retention_lease_held"], "no lease, no lease gauge")

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "Prometheus naming conventions")
}

func TestLeaseMetrics(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mem := retention.NewMemKV()
	locker := &locker{}
	var held atomic.Int64
	s, err := retention.New(mem, retention.Config{Prefix: "jobs/", Retention: time.Hour, Logger: quiet, Lease: locker, Observer: c,
		Clear: func(ctx context.Context, id string) error {
			// Under the lease, the gauge says so.
			families, err := reg.Gather()
			assert.NoError(t, err)
			for _, f := range families {
				if f.GetName() == "retention_lease_held" {
					held.Store(int64(f.GetMetric()[0].GetGauge().GetValue()))
				}
			}
			return nil
		}})
	require.NoError(t, err)
	mark(t, mem, "jobs/", "a", time.Now().Add(-2*time.Hour))
	_, err = s.LeasedPass(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(1), held.Load(), "retention_lease_held during the pass")
	locker.holder = "other"
	_, err = s.LeasedPass(t.Context())
	require.ErrorIs(t, err, retention.ErrLeaseHeld)

	want := `
# HELP retention_lease_held 1 while this replica holds the sweep's lease, else 0; absent for a sweep without a lease.
# TYPE retention_lease_held gauge
retention_lease_held{prefix="jobs/"} 0
# HELP retention_lease_events_total Lease events: acquired, held (found held by another replica), lost, released.
# TYPE retention_lease_events_total counter
retention_lease_events_total{event="acquired",prefix="jobs/"} 1
retention_lease_events_total{event="held",prefix="jobs/"} 1
retention_lease_events_total{event="lost",prefix="jobs/"} 0
retention_lease_events_total{event="released",prefix="jobs/"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "retention_lease_held", "retention_lease_events_total"))

	// The gauge follows the events.
	c.ObserveLease("jobs/", retention.LeaseAcquired)
	got, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range got {
		if f.GetName() == "retention_lease_held" {
			assert.Equal(t, 1.0, f.GetMetric()[0].GetGauge().GetValue())
		}
	}
}

// locker is a Locker of one process: the lease is free when holder is "".
type locker struct {
	mu     sync.Mutex
	holder string
}

type lease struct {
	l    *locker
	lost chan struct{}
	once sync.Once
}

func (l *locker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holder != "" {
		return nil, retention.ErrLeaseHeld
	}
	l.holder = "me"
	return &lease{l: l, lost: make(chan struct{})}, nil
}

func (l *lease) Lost() <-chan struct{} { return l.lost }

func (l *lease) Release(context.Context) error {
	l.l.mu.Lock()
	if l.l.holder == "me" {
		l.l.holder = ""
	}
	l.l.mu.Unlock()
	l.once.Do(func() { close(l.lost) })
	return nil
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts retentionprom.Options
		want string // "" means valid
	}{
		{"zero", retentionprom.Options{}, ""},
		{"custom", retentionprom.Options{Namespace: "app", LagBuckets: []float64{1, 2}, BacklogLimit: 10, BacklogTimeout: time.Second}, ""},
		{"empty buckets", retentionprom.Options{LagBuckets: []float64{}}, "Options.LagBuckets must not be empty"},
		{"unsorted buckets", retentionprom.Options{DurationBuckets: []float64{1, 1}}, "Options.DurationBuckets must increase"},
		{"NaN bucket", retentionprom.Options{DurationBuckets: []float64{1, math.NaN()}}, "Options.DurationBuckets must increase"},
		{"limit", retentionprom.Options{BacklogLimit: -1}, "Options.BacklogLimit"},
		{"limit too big", retentionprom.Options{BacklogLimit: retention.MaxPageSize + 1}, "Options.BacklogLimit"},
		{"timeout", retentionprom.Options{BacklogTimeout: -time.Second}, "Options.BacklogTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := retentionprom.New(tt.opts)
			if tt.want == "" {
				require.NoError(t, err)
				require.NotNil(t, c)
				return
			}
			require.ErrorIs(t, err, retentionprom.ErrInvalidOptions)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// failingKV is a KV whose Scan fails.
type failingKV struct{ *retention.MemKV }

func (failingKV) Scan(context.Context, []byte, []byte, int) ([][]byte, error) {
	return nil, fmt.Errorf("store down")
}

func TestBacklogErrorIsCounted(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	s, err := retention.New(failingKV{retention.NewMemKV()}, retention.Config{Prefix: "x/", Retention: time.Hour,
		Clear: func(context.Context, string) error { return nil }, Logger: quiet})
	require.NoError(t, err)
	c.Watch(s)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	f := scrape(t, reg)
	assert.Nil(t, f["retention_backlog_age_seconds"], "no gauge when the read failed")
	assert.Equal(t, 1.0, find(t, f, "retention_backlog_errors_total", nil).GetCounter().GetValue())
}

// TestBacklogGaugeFallsBehindAndCatchesUp runs a sweep whose Clear takes
// 100ms while markers arrive every 50ms: the backlog age grows, and the
// gauge shows it; once the writer stops, the sweep catches up and the
// gauge drops to zero. Fake time (synctest): it takes no real time.
func TestBacklogGaugeFallsBehindAndCatchesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := retention.NewMemKV()
		c, err := retentionprom.New(retentionprom.Options{})
		require.NoError(t, err)
		var cleared atomic.Int64
		s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Second, Logger: quiet, Observer: c,
			PageSize: 8,
			Clear: func(ctx context.Context, id string) error {
				time.Sleep(100 * time.Millisecond)
				cleared.Add(1)
				return nil
			}})
		require.NoError(t, err)
		c.Watch(s)
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		gauge := func(name string) float64 {
			families, err := reg.Gather()
			require.NoError(t, err)
			for _, f := range families {
				if f.GetName() == name {
					return f.GetMetric()[0].GetGauge().GetValue()
				}
			}
			t.Fatalf("no %s", name)
			return 0
		}

		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { _ = s.Run(ctx) })
		written := 0
		writerDone := make(chan struct{})
		wg.Go(func() {
			defer close(writerDone)
			for range 400 { // 20 seconds of markers, 20 a second
				mark(t, mem, "runs/", fmt.Sprintf("m%04d", written), time.Now())
				written++
				time.Sleep(50 * time.Millisecond)
			}
		})

		var ages []float64
		for range 4 {
			time.Sleep(5 * time.Second)
			ages = append(ages, gauge("retention_backlog_age_seconds"))
		}
		<-writerDone
		t.Logf("backlog age every 5s while falling behind: %v", ages)
		for i := 1; i < len(ages); i++ {
			assert.Greater(t, ages[i], ages[i-1], "the backlog age grows: %v", ages)
		}
		// Half the markers were cleared by the end: 10 a second of 20.
		assert.Greater(t, ages[len(ages)-1], 5.0, "ten seconds of markers wait")
		assert.Greater(t, gauge("retention_backlog_markers"), 150.0, "about 200 of the 400 markers wait")

		// Caught up: 400 markers at 10 a second take at most 40s in all.
		time.Sleep(30 * time.Second)
		assert.Equal(t, 0.0, gauge("retention_backlog_age_seconds"), "caught up")
		assert.Equal(t, 0.0, gauge("retention_backlog_markers"))
		assert.Equal(t, int64(400), cleared.Load())
		cancel()
		wg.Wait()

		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "retention_clear_lag_seconds" {
				h := f.GetMetric()[0].GetHistogram()
				assert.Equal(t, uint64(400), h.GetSampleCount())
				// The last markers waited longest: well over 5s past due.
				assert.Greater(t, h.GetSampleSum()/400, 5.0, "mean lag")
			}
		}
	})
}

func TestGroupCollector(t *testing.T) {
	t.Parallel()
	c, err := retentionprom.New(retentionprom.Options{})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	clock := retention.NewManualClock(t0)
	var sweeps []*retention.Sweep
	for i, prefix := range []string{"runs/", "jobs/"} {
		for j := range 3 * (i + 1) {
			mark(t, mem, prefix, fmt.Sprintf("e%d", j), t0.Add(-2*time.Hour))
		}
		s, err := retention.New(mem, retention.Config{Prefix: prefix, Retention: time.Hour, Clock: clock, Logger: quiet, Observer: c,
			Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		sweeps = append(sweeps, s)
	}
	c.Watch(sweeps...)
	g, err := retention.NewGroup(retention.GroupConfig{Lease: &locker{}, Logger: quiet}, sweeps...)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))

	f := scrape(t, reg)
	assert.Equal(t, 3.0, find(t, f, "retention_backlog_markers", map[string]string{"prefix": "runs/"}).GetGauge().GetValue())
	assert.Equal(t, 6.0, find(t, f, "retention_backlog_markers", map[string]string{"prefix": "jobs/"}).GetGauge().GetValue())
	assert.Equal(t, 3600.0, find(t, f, "retention_backlog_age_seconds", map[string]string{"prefix": "jobs/"}).GetGauge().GetValue())

	_, err = g.LeasedPass(t.Context())
	require.NoError(t, err)
	f = scrape(t, reg)
	for prefix, want := range map[string]uint64{"runs/": 3, "jobs/": 6} {
		labels := map[string]string{"prefix": prefix}
		assert.Equal(t, want, find(t, f, "retention_clear_lag_seconds", labels).GetHistogram().GetSampleCount(), prefix)
		assert.InDelta(t, float64(want)*3600, find(t, f, "retention_clear_lag_seconds", labels).GetHistogram().GetSampleSum(), 1e-9, prefix)
		assert.Equal(t, 0.0, find(t, f, "retention_backlog_markers", labels).GetGauge().GetValue(), prefix)
		assert.Equal(t, 0.0, find(t, f, "retention_lease_held", labels).GetGauge().GetValue(), prefix)
		assert.Equal(t, 1.0, find(t, f, "retention_lease_events_total", map[string]string{"prefix": prefix, "event": "acquired"}).GetCounter().GetValue(), prefix)
	}
}
