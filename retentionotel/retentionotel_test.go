package retentionotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	t0    = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	quiet = slog.New(slog.DiscardHandler)
)

func newObserver(t *testing.T) (*retentionotel.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	o, err := retentionotel.New(retentionotel.Options{MeterProvider: mp})
	require.NoError(t, err)
	return o, reader
}

// collect returns the metrics of the Observer's scope by name.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != retentionotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func has(set attribute.Set, kv ...attribute.KeyValue) bool {
	for _, want := range kv {
		if v, ok := set.Value(want.Key); !ok || v != want.Value {
			return false
		}
	}
	return true
}

func sum(t *testing.T, m metricdata.Metrics, kv ...attribute.KeyValue) int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	for _, dp := range s.DataPoints {
		if has(dp.Attributes, kv...) {
			return dp.Value
		}
	}
	return 0
}

func gauge[N int64 | float64](t *testing.T, m metricdata.Metrics, kv ...attribute.KeyValue) N {
	t.Helper()
	g, ok := m.Data.(metricdata.Gauge[N])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	for _, dp := range g.DataPoints {
		if has(dp.Attributes, kv...) {
			return dp.Value
		}
	}
	t.Fatalf("no point of %s with %v", m.Name, kv)
	return 0
}

func histogram(t *testing.T, m metricdata.Metrics) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	require.Len(t, h.DataPoints, 1)
	return h.DataPoints[0]
}

var prefix = attribute.String("retention.prefix", "runs/")

func TestInstruments(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	mem := retention.NewMemKV()
	clock := retention.NewManualClock(t0)
	const n = 120
	for i := range n { // one every 30s over the hour before t0
		require.NoError(t, retention.Mark(t.Context(), mem, "runs/", fmt.Sprintf("r%03d", i), t0.Add(-time.Duration(n-i)*30*time.Second)))
	}
	require.NoError(t, mem.Put(t.Context(), []byte("runs/0-foreign"), nil))
	s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, PageSize: 10, Logger: quiet, Observer: o,
		Clear: func(_ context.Context, id string) error {
			if id == "r007" {
				return fmt.Errorf("resumed: %w", retention.ErrLiveAgain)
			}
			return nil
		}})
	require.NoError(t, err)
	o.Watch(s)

	clock.Set(t0.Add(30 * time.Minute)) // the first 60 markers are due
	m := collect(t, reader)
	assert.Equal(t, 1800.0, gauge[float64](t, m["retention.backlog.age"], prefix))
	assert.Equal(t, int64(60), gauge[int64](t, m["retention.backlog.markers"], prefix), "written more than 30 minutes before t0")
	assert.Equal(t, "s", m["retention.backlog.age"].Unit)

	st, err := s.Pass(t.Context())
	require.NoError(t, err)
	clock.Set(t0.Add(2 * time.Hour))
	st2, err := s.Pass(t.Context())
	require.NoError(t, err)

	var wantSum float64
	for i := range n {
		if i == 7 {
			continue
		}
		written := t0.Add(-time.Duration(n-i) * 30 * time.Second)
		deleted := t0.Add(2 * time.Hour)
		if i < 60 {
			deleted = t0.Add(30 * time.Minute)
		}
		wantSum += deleted.Sub(written.Add(time.Hour)).Seconds()
	}
	m = collect(t, reader)
	lag := histogram(t, m["retention.clear.lag"])
	assert.Equal(t, uint64(st.Cleared+st2.Cleared), lag.Count, "one lag per entity cleared")
	assert.Equal(t, uint64(n-1), lag.Count)
	assert.InDelta(t, wantSum, lag.Sum, 1e-6, "sum of lags")
	assert.Equal(t, "s", m["retention.clear.lag"].Unit)
	assert.Equal(t, uint64(2), histogram(t, m["retention.pass.duration"]).Count)
	assert.Equal(t, "{marker}", m["retention.markers"].Unit)
	for outcome, want := range map[string]int64{"cleared": n - 1, "live_again": 1, "foreign": 2} {
		assert.Equal(t, want, sum(t, m["retention.markers"], prefix, attribute.String("retention.outcome", outcome)), outcome)
	}
	assert.Equal(t, int64(2), sum(t, m["retention.passes"], prefix, attribute.String("retention.pass.result", "ok")))
	assert.Equal(t, 0.0, gauge[float64](t, m["retention.backlog.age"], prefix), "caught up")
	_, hasLease := m["retention.lease.held"]
	assert.False(t, hasLease, "no lease, no lease gauge")
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

func (l *locker) TryAcquire(context.Context) (retention.Lease, error) {
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

func TestLease(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	lk := &locker{}
	var heldDuringPass atomic.Int64
	s, err := retention.New(retention.NewMemKV(), retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: o, Lease: lk,
		OnPass: func(retention.Stats, error) {
			heldDuringPass.Store(gauge[int64](t, collect(t, reader)["retention.lease.held"], prefix))
		},
		Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	_, err = s.LeasedPass(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(1), heldDuringPass.Load())
	lk.holder = "other"
	_, err = s.LeasedPass(t.Context())
	require.ErrorIs(t, err, retention.ErrLeaseHeld)

	m := collect(t, reader)
	assert.Equal(t, int64(0), gauge[int64](t, m["retention.lease.held"], prefix))
	for event, want := range map[string]int64{"acquired": 1, "released": 1, "held": 1, "lost": 0} {
		assert.Equal(t, want, sum(t, m["retention.lease.events"], prefix, attribute.String("retention.lease.event", event)), event)
	}
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts retentionotel.Options
		ok   bool
	}{
		{"zero", retentionotel.Options{}, true},
		{"buckets", retentionotel.Options{LagBuckets: []float64{1, 2}}, true},
		{"empty buckets", retentionotel.Options{LagBuckets: []float64{}}, false},
		{"unsorted buckets", retentionotel.Options{DurationBuckets: []float64{2, 1}}, false},
		{"limit", retentionotel.Options{BacklogLimit: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := retentionotel.New(tt.opts)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, retentionotel.ErrInvalidOptions)
			}
		})
	}
}

// TestBacklogGaugeFallsBehindAndCatchesUp: a Clear of 100ms, markers every
// 50ms for 20s; the backlog age grows, then drops to zero. Fake time.
func TestBacklogGaugeFallsBehindAndCatchesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o, reader := newObserver(t)
		mem := retention.NewMemKV()
		s, err := retention.New(mem, retention.Config{Prefix: "runs/", Retention: time.Second, Logger: quiet, Observer: o, PageSize: 8,
			Clear: func(context.Context, string) error {
				time.Sleep(100 * time.Millisecond)
				return nil
			}})
		require.NoError(t, err)
		o.Watch(s)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { _ = s.Run(ctx) })
		wg.Go(func() {
			for i := range 400 {
				_ = retention.Mark(ctx, mem, "runs/", fmt.Sprintf("m%04d", i), time.Now())
				time.Sleep(50 * time.Millisecond)
			}
		})
		var ages []float64
		for range 4 {
			time.Sleep(5 * time.Second)
			ages = append(ages, gauge[float64](t, collect(t, reader)["retention.backlog.age"], prefix))
		}
		for i := 1; i < len(ages); i++ {
			assert.Greater(t, ages[i], ages[i-1], "the backlog age grows: %v", ages)
		}
		time.Sleep(30 * time.Second)
		m := collect(t, reader)
		assert.Equal(t, 0.0, gauge[float64](t, m["retention.backlog.age"], prefix), "caught up")
		assert.Equal(t, uint64(400), histogram(t, m["retention.clear.lag"]).Count)
		cancel()
		wg.Wait()
	})
}
