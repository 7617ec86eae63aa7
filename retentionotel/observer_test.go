package retentionotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// hungKV is a KV whose Scan waits for its context to end.
type hungKV struct{ *retention.MemKV }

func (hungKV) Scan(ctx context.Context, _, _ []byte, _ int) ([][]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A pass that fails because the store did not answer within StoreTimeout is
// an error, not a cancellation.
func TestStoreTimeoutIsAnError(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	s, err := retention.New(hungKV{retention.NewMemKV()}, retention.Config{Prefix: "x/", Retention: time.Hour, Logger: quiet,
		StoreTimeout: time.Millisecond, Observer: o, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	_, err = s.Pass(t.Context())
	require.ErrorIs(t, err, context.DeadlineExceeded)
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	s2, err := retention.New(hungKV{retention.NewMemKV()}, retention.Config{Prefix: "y/", Retention: time.Hour, Logger: quiet,
		StoreTimeout: -1, Observer: o, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	_, err = s2.Pass(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	m := collect(t, reader)
	for _, tt := range []struct{ prefix, result string }{{"x/", "error"}, {"y/", "canceled"}} {
		for _, r := range []string{"ok", "error", "canceled", "lease_lost"} {
			want := int64(0)
			if r == tt.result {
				want = 1
			}
			got := sum(t, m["retention.passes"], attribute.String("retention.prefix", tt.prefix), attribute.String("retention.pass.result", r))
			assert.Equal(t, want, got, "retention.passes{prefix=%q,result=%q}", tt.prefix, r)
		}
	}
}

// A marker waiting out its retry delay in memory is counted as deferred.
func TestDeferredOutcome(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	mem := retention.NewMemKV()
	require.NoError(t, retention.Mark(t.Context(), mem, "runs/", "a", t0.Add(-2*time.Hour)))
	s, err := retention.New(noPut{mem}, retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: o,
		Clock: retention.NewManualClock(t0), RetryDelay: time.Hour, MaxRetryDelay: time.Hour,
		Clear: func(context.Context, string) error { return fmt.Errorf("down") }})
	require.NoError(t, err)
	_, err = s.Pass(t.Context())
	require.NoError(t, err)
	st, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, st.Deferred)
	assert.Equal(t, int64(1), sum(t, collect(t, reader)["retention.markers"], prefix, attribute.String("retention.outcome", "deferred")))
}

// noPut hides MemKV's Put, so retry delays are kept in memory.
type noPut struct{ kv *retention.MemKV }

func (k noPut) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return k.kv.Scan(ctx, start, end, limit)
}

func (k noPut) Delete(ctx context.Context, keys ...[]byte) error { return k.kv.Delete(ctx, keys...) }

// Watching a sweep twice must not report its backlog twice: the SDK would
// keep one of two points of the same attributes.
func TestWatchTwice(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	mem := retention.NewMemKV()
	require.NoError(t, retention.Mark(t.Context(), mem, "runs/", "a", t0.Add(-2*time.Hour)))
	newSweep := func(m *retention.MemKV) *retention.Sweep {
		s, err := retention.New(m, retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: o,
			Clock: retention.NewManualClock(t0), Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		return s
	}
	s := newSweep(mem)
	o.Watch(s)
	o.Watch(s)
	// Another store under the same prefix, further behind.
	other := retention.NewMemKV()
	require.NoError(t, retention.Mark(t.Context(), other, "runs/", "b", t0.Add(-3*time.Hour)))
	o.Watch(newSweep(other))
	m := collect(t, reader)
	assert.Equal(t, 7200.0, gauge[float64](t, m["retention.backlog.age"], prefix), "the oldest of the prefix's backlogs")
	assert.Equal(t, int64(2), gauge[int64](t, m["retention.backlog.markers"], prefix), "the sum of the prefix's counts")
}

// A LeasedPass tried while this replica holds the lease finds it held: the
// gauge must still say this replica holds it.
func TestLeaseHeldGaugeSurvivesOwnRetry(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	mem := retention.NewMemKV()
	require.NoError(t, retention.Mark(t.Context(), mem, "jobs/", "a", t0.Add(-2*time.Hour)))
	var s *retention.Sweep
	var inner error
	var heldDuring int64
	s, err := retention.New(mem, retention.Config{Prefix: "jobs/", Retention: time.Hour, Logger: quiet, Lease: &locker{}, Observer: o,
		Clock: retention.NewManualClock(t0),
		Clear: func(ctx context.Context, id string) error {
			_, inner = s.LeasedPass(ctx)
			heldDuring = gauge[int64](t, collect(t, reader)["retention.lease.held"])
			return nil
		}})
	require.NoError(t, err)
	_, err = s.LeasedPass(t.Context())
	require.NoError(t, err)
	require.ErrorIs(t, inner, retention.ErrLeaseHeld)
	assert.Equal(t, int64(1), heldDuring, "retention.lease.held while this replica holds the lease")
}

// One store that does not answer must not take the backlog gauge of the
// other watched sweeps with it, up to the collection's deadline.
func TestHungStoreLeavesOtherBacklogs(t *testing.T) {
	t.Parallel()
	o, reader := newObserver(t)
	hung, err := retention.New(hungKV{retention.NewMemKV()}, retention.Config{Prefix: "hung/", Retention: time.Hour, Logger: quiet,
		StoreTimeout: -1, Observer: o, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	mem := retention.NewMemKV()
	require.NoError(t, retention.Mark(t.Context(), mem, "ok/", "a", t0.Add(-2*time.Hour)))
	ok, err := retention.New(mem, retention.Config{Prefix: "ok/", Retention: time.Hour, Logger: quiet, Observer: o,
		Clock: retention.NewManualClock(t0), Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	o.Watch(hung, ok)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "retention.backlog.age" {
				assert.Equal(t, 3600.0, gauge[float64](t, m, attribute.String("retention.prefix", "ok/")))
				return
			}
		}
	}
	t.Fatal("no retention.backlog.age")
}
