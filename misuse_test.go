package retention

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNotConfigured calls every method of a Sweep and a Group not made by
// their constructors: each must return ErrNotConfigured, not block.
func TestNotConfigured(t *testing.T) {
	t.Parallel()
	var nilSweep *Sweep
	var nilGroup *Group
	tests := []struct {
		name string
		call func(ctx context.Context) error
		want string // the constructor the message must name
	}{
		{"zero Sweep.Pass", func(ctx context.Context) error { _, err := (&Sweep{}).Pass(ctx); return err }, "retention.New"},
		{"zero Sweep.Run", func(ctx context.Context) error { return (&Sweep{}).Run(ctx) }, "retention.New"},
		{"zero Sweep.MarkerKey", func(context.Context) error { _, err := (&Sweep{}).MarkerKey(t0, "a"); return err }, "retention.New"},
		{"zero Sweep.Mark", func(ctx context.Context) error { return (&Sweep{}).Mark(ctx, NewMemKV(), "a", t0) }, "retention.New"},
		{"zero Sweep.LeasedPass", func(ctx context.Context) error { _, err := (&Sweep{}).LeasedPass(ctx); return err }, "retention.New"},
		{"zero Sweep.Backlog", func(ctx context.Context) error { _, err := (&Sweep{}).Backlog(ctx, 10); return err }, "retention.New"},
		{"zero Group.LeasedPass", func(ctx context.Context) error { _, err := (&Group{}).LeasedPass(ctx); return err }, "retention.NewGroup"},
		{"nil Sweep.Pass", func(ctx context.Context) error { _, err := nilSweep.Pass(ctx); return err }, "retention.New"},
		{"nil Sweep.Run", func(ctx context.Context) error { return nilSweep.Run(ctx) }, "retention.New"},
		{"zero Group.Pass", func(ctx context.Context) error { _, err := (&Group{}).Pass(ctx); return err }, "retention.NewGroup"},
		{"zero Group.Run", func(ctx context.Context) error { return (&Group{}).Run(ctx) }, "retention.NewGroup"},
		{"nil Group.Run", func(ctx context.Context) error { return nilGroup.Run(ctx) }, "retention.NewGroup"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := tt.call(ctx)
			require.ErrorIs(t, err, ErrNotConfigured, "%s = %v, want ErrNotConfigured", tt.name, err)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "%s waited for its context", tt.name)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestRunTwice starts a second Run of a sweep, alone or in a Group, while a
// first one runs: the second returns ErrRunning at once and passes nothing,
// the first goes on, and once it stops the sweep can be run again.
func TestRunTwice(t *testing.T) {
	t.Parallel()
	type setup struct {
		a, b   *Sweep
		passes *passLog
	}
	run := func(s *Sweep) func(context.Context) error { return s.Run }
	group := func(t *testing.T, sweeps ...*Sweep) func(context.Context) error {
		g, err := NewGroup(GroupConfig{}, sweeps...)
		require.NoError(t, err)
		return g.Run
	}
	tests := []struct {
		name          string
		first, second func(t *testing.T, s setup) func(context.Context) error
	}{
		{"Sweep.Run twice",
			func(_ *testing.T, s setup) func(context.Context) error { return run(s.a) },
			func(_ *testing.T, s setup) func(context.Context) error { return run(s.a) }},
		{"Group.Run twice",
			func(t *testing.T, s setup) func(context.Context) error { return group(t, s.a, s.b) },
			nil}, // the same group again; filled in below
		{"Group.Run of a running sweep",
			func(_ *testing.T, s setup) func(context.Context) error { return run(s.b) },
			func(t *testing.T, s setup) func(context.Context) error { return group(t, s.a, s.b) }},
		{"Sweep.Run of a sweep run by a Group",
			func(t *testing.T, s setup) func(context.Context) error { return group(t, s.a, s.b) },
			func(_ *testing.T, s setup) func(context.Context) error { return run(s.b) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var passes passLog
				kv := NewMemKV()
				newS := func(prefix string) *Sweep {
					s, err := New(kv, Config{Prefix: prefix, Retention: time.Hour, Interval: time.Minute,
						Clear: func(context.Context, string) error { return nil }, OnPass: passes.onPass})
					require.NoError(t, err)
					return s
				}
				s := setup{a: newS("a/"), b: newS("b/"), passes: &passes}
				first := tt.first(t, s)
				second := first
				if tt.second != nil {
					second = tt.second(t, s)
				}

				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- first(ctx) }()
				synctest.Wait()
				before := passes.len()
				require.Positive(t, before, "the first Run made no pass")

				// A second loop would run until its context ends: give it a
				// deadline so that one fails the test instead of hanging it.
				sctx, scancel := context.WithTimeout(t.Context(), time.Hour)
				err := second(sctx)
				scancel()
				require.ErrorIs(t, err, ErrRunning, "second Run = %v, want ErrRunning", err)
				synctest.Wait()
				assert.Equal(t, before, passes.len(), "the refused Run passed")

				time.Sleep(time.Minute)
				synctest.Wait()
				assert.Greater(t, passes.len(), before, "the first Run stopped passing")

				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
				// Every claim is released: both sweeps, alone, run again.
				for _, sw := range []*Sweep{s.a, s.b} {
					ctx, cancel := context.WithCancel(t.Context())
					go func() { time.Sleep(time.Second); cancel() }()
					require.ErrorIs(t, sw.Run(ctx), context.Canceled, "Run after the first stopped")
				}
			})
		})
	}
}

// TestRefusedGroupReleasesItsClaims checks that a Group whose second sweep
// is running leaves its first sweep free to run.
func TestRefusedGroupReleasesItsClaims(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		a, _ := newSweep(t, kv, Config{Prefix: "a/", Clear: func(context.Context, string) error { return nil }})
		b, _ := newSweep(t, kv, Config{Prefix: "b/", Clear: func(context.Context, string) error { return nil }})
		g, err := NewGroup(GroupConfig{}, a, b)
		require.NoError(t, err)
		stop := runInBackground(t.Context(), b)
		synctest.Wait()
		gctx, gcancel := context.WithTimeout(t.Context(), time.Hour)
		defer gcancel()
		require.ErrorIs(t, g.Run(gctx), ErrRunning)
		stopA := runInBackground(t.Context(), a)
		synctest.Wait()
		require.ErrorIs(t, stopA(), context.Canceled, "the sweep the refused Group claimed first cannot run")
		require.ErrorIs(t, stop(), context.Canceled)
	})
}
