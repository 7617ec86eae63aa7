package retentionui_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// countingObserver counts the calls it receives.
type countingObserver struct {
	mu    sync.Mutex
	calls map[string]int
}

func (o *countingObserver) count(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.calls == nil {
		o.calls = map[string]int{}
	}
	o.calls[name]++
}
func (o *countingObserver) ObservePass(string, retention.Stats, error) { o.count("pass") }
func (o *countingObserver) ObserveLags(string, []time.Duration)        { o.count("lags") }
func (o *countingObserver) ObservePage(string, retention.Stats)        { o.count("page") }
func (o *countingObserver) ObserveLease(string, retention.LeaseEvent)  { o.count("lease") }

func TestRecorderPassesEveryCallToNext(t *testing.T) {
	t.Parallel()
	next := &countingObserver{}
	f := newFixture(t)
	rec := &retentionui.Recorder{Next: next, Clock: f.clock}
	s, err := retention.New(f.kv, retention.Config{
		Prefix: jobs, Retention: time.Hour, Observer: rec, Clock: f.clock, Logger: discard,
		Clear: func(context.Context, string) error { return nil },
	})
	require.NoError(t, err)
	_, err = s.Pass(context.Background())
	require.NoError(t, err)
	rec.ObserveLease(jobs, retention.LeaseAcquired)
	assert.Equal(t, 1, next.calls["pass"])
	assert.Equal(t, 1, next.calls["lags"])
	assert.Positive(t, next.calls["page"])
	assert.Equal(t, 1, next.calls["lease"])
}

func TestOverviewShowsTheLastLeaseEventAndPassError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		event retention.LeaseEvent
		want  string
	}{
		{retention.LeaseAcquired, "acquired"},
		{retention.LeaseHeld, "held"},
		{retention.LeaseLost, "lost"},
		{retention.LeaseReleased, "released"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.recorder.ObserveLease(jobs, retention.LeaseAcquired)
			f.recorder.ObserveLease(jobs, tt.event)
			o := getJSON[retentionui.Overview](t, newHandler(t, f.options()), "/")
			assert.Equal(t, tt.want, o.Sweeps[0].Lease)
			assert.Equal(t, "unknown", o.Sweeps[1].Lease, "another sweep's events")
		})
	}
	f := newFixture(t)
	f.recorder.ObservePass(uploads, retention.Stats{}, errors.New("the store is down"))
	o := getJSON[retentionui.Overview](t, newHandler(t, f.options()), "/")
	assert.Equal(t, retentionui.StateError, o.Sweeps[1].State)
	assert.Contains(t, o.Sweeps[1].Summary, "the store is down")
	assert.Equal(t, 2, o.Sweeps[1].LastPass.Passes)
}

func TestZeroRecorderIsUsable(t *testing.T) {
	t.Parallel()
	var rec retentionui.Recorder
	rec.ObservePass("p/", retention.Stats{Cleared: 2}, nil)
	rec.ObserveLags("p/", []time.Duration{3 * time.Second, time.Second})
	rec.ObservePage("p/", retention.Stats{})
	rec.ObserveLease("p/", retention.LeaseHeld)
	kv := retention.NewMemKV()
	s, err := retention.New(kv, retention.Config{Prefix: "p/", Retention: time.Hour, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	o := getJSON[retentionui.Overview](t, newHandler(t, retentionui.Options{Sweeps: []*retention.Sweep{s}, Recorder: &rec}), "/")
	assert.Equal(t, 2, o.Sweeps[0].LastPass.Cleared)
	assert.Equal(t, int64(1000), *o.Sweeps[0].LagMs, "the newest entity's lag, the last of the slice")
	assert.Equal(t, "held", o.Sweeps[0].Lease)
}
