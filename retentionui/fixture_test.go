package retentionui_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// The fixture's ids: poison's clear always fails and it is parked; held's
// clear holds it for two hours; backlogSize more markers are due and no
// pass has run since they were written.
const (
	poison      = "job-poison"
	held        = "job-held"
	backlogSize = 25
	jobs        = "jobs/done/"
	uploads     = "uploads/done/"
)

var t0 = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

// fixture is a console over two sweeps of one MemKV: jobs (a parked
// poison id, a held id and a due backlog) and uploads (keeping up).
type fixture struct {
	clock    *retention.ManualClock
	kv       *retention.MemKV
	jobs     *retention.Sweep
	uploads  *retention.Sweep
	recorder *retentionui.Recorder
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{clock: retention.NewManualClock(t0), kv: retention.NewMemKV()}
	f.recorder = &retentionui.Recorder{Clock: f.clock}
	clear := func(_ context.Context, id string) error {
		switch id {
		case poison:
			return errors.New("the archive refuses it")
		case held:
			return retention.Hold(f.clock.Now().Add(2 * time.Hour))
		}
		return nil
	}
	newSweep := func(prefix string, ret time.Duration) *retention.Sweep {
		s, err := retention.New(f.kv, retention.Config{
			Prefix: prefix, Retention: ret, Clear: clear, MaxAttempts: 1,
			Clock: f.clock, Observer: f.recorder, Logger: discard,
		})
		require.NoError(t, err)
		return s
	}
	f.jobs = newSweep(jobs, time.Hour)
	f.uploads = newSweep(uploads, 24*time.Hour)
	for _, id := range []string{poison, held, "job-ok"} {
		require.NoError(t, f.jobs.Mark(ctx, f.kv, id, t0.Add(-3*time.Hour)))
	}
	for i := range 3 {
		require.NoError(t, f.uploads.Mark(ctx, f.kv, fmt.Sprintf("upload-%d", i), t0.Add(-25*time.Hour)))
	}
	require.NoError(t, f.uploads.Mark(ctx, f.kv, "upload-new", t0.Add(-time.Hour)))
	for _, s := range []*retention.Sweep{f.jobs, f.uploads} {
		_, err := s.Pass(ctx)
		require.NoError(t, err)
	}
	f.clock.Advance(time.Second)
	for i := range backlogSize {
		require.NoError(t, f.jobs.Mark(ctx, f.kv, fmt.Sprintf("job-%03d", i), t0.Add(-2*time.Hour+time.Duration(i)*time.Minute)))
	}
	return f
}

// options returns Options over the fixture's sweeps.
func (f *fixture) options() retentionui.Options {
	return retentionui.Options{
		Sweeps: []*retention.Sweep{f.jobs, f.uploads},
		Details: map[string]retentionui.Detail{
			jobs:    {Retention: time.Hour, KV: f.kv},
			uploads: {Retention: 24 * time.Hour, KV: f.kv},
		},
		Recorder: f.recorder,
		Clock:    f.clock,
	}
}

// serve mounts a console of opts under /console/ on a test server.
func serve(t testing.TB, opts retentionui.Options) *httptest.Server {
	t.Helper()
	h, err := retentionui.New(opts)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// parkedIDs lists the ids parked in the store.
func parkedIDs(t testing.TB, s *retention.Sweep) []string {
	t.Helper()
	parked, err := s.Parked(context.Background(), 1000)
	require.NoError(t, err)
	ids := []string{}
	for _, m := range parked {
		ids = append(ids, m.ID)
	}
	return ids
}

// heldIDs lists the ids s's store has held (retention.StateHeld).
func heldIDs(t testing.TB, s *retention.Sweep) []string {
	t.Helper()
	pending, err := s.Pending(context.Background(), 1000)
	require.NoError(t, err)
	ids := []string{}
	for _, m := range pending {
		if m.State == retention.StateHeld {
			ids = append(ids, m.ID)
		}
	}
	return ids
}
