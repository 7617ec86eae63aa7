package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	prefix = "jobs/done/"
	poison = "job-poison"
	held   = "job-held"
)

var t0 = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

// console serves a retentionui console over a sweep with a parked poison
// id, a held id and three due markers, mounted under /admin/.
func console(t *testing.T, readOnly bool) (*retention.Sweep, string) {
	t.Helper()
	ctx := context.Background()
	clock := retention.NewManualClock(t0)
	kv := retention.NewMemKV()
	s, err := retention.New(kv, retention.Config{
		Prefix: prefix, Retention: time.Hour, MaxAttempts: 1, Clock: clock, Logger: slog.New(slog.DiscardHandler),
		Clear: func(_ context.Context, id string) error {
			switch id {
			case poison:
				return errors.New("refused")
			case held:
				return retention.Hold(clock.Now().Add(time.Hour))
			}
			return nil
		},
	})
	require.NoError(t, err)
	require.NoError(t, s.Mark(ctx, kv, poison, t0.Add(-3*time.Hour)))
	require.NoError(t, s.Mark(ctx, kv, held, t0.Add(-3*time.Hour)))
	_, err = s.Pass(ctx)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, s.Mark(ctx, kv, fmt.Sprintf("job-%d", i), t0.Add(-2*time.Hour)))
	}
	h, err := retentionui.New(retentionui.Options{
		Sweeps: []*retention.Sweep{s}, Clock: clock, ReadOnly: readOnly,
		Details: map[string]retentionui.Detail{prefix: {Retention: time.Hour, KV: kv}},
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return s, srv.URL + "/admin"
}

func ctl(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut, func(string) string { return "" })
	return code, out.String(), errOut.String()
}

func TestCommandsPrintTables(t *testing.T) {
	t.Parallel()
	_, addr := console(t, false)
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"status"}, []string{"PREFIX", prefix, "parked", "1 parked"}},
		{[]string{"due", prefix}, []string{"job-0", "job-2", held, "held", poison, "parked", "5 due"}},
		{[]string{"parked", prefix}, []string{poison, "1 parked"}},
		{[]string{"why", prefix, held}, []string{held + ": held", "Held"}},
		{[]string{"why", prefix, "job-nope"}, []string{"not found"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, out, errOut := ctl(append([]string{"-addr", addr}, tt.args...)...)
			require.Equal(t, exitOK, code, "exit status; stderr: %s", errOut)
			for _, w := range tt.want {
				assert.Contains(t, out, w)
			}
		})
	}
}

func TestJSONFlagPrintsTheConsolesJSON(t *testing.T) {
	t.Parallel()
	_, addr := console(t, false)
	code, out, errOut := ctl("-addr", addr+"/", "-json", "status")
	require.Equal(t, exitOK, code, errOut)
	var o retentionui.Overview
	require.NoError(t, json.Unmarshal([]byte(out), &o))
	require.Len(t, o.Sweeps, 1)
	assert.Equal(t, 3, o.Sweeps[0].Backlog.Due)
	assert.Equal(t, 1, o.Sweeps[0].Backlog.Parked)
}

func TestRequeueExitsOneWhenRefused(t *testing.T) {
	t.Parallel()
	s, addr := console(t, false)
	code, out, errOut := ctl("-addr", addr, "requeue", prefix, poison)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "requeued 1")
	parked, err := s.Parked(context.Background(), 10)
	require.NoError(t, err)
	assert.Empty(t, parked)

	code, _, errOut = ctl("-addr", addr, "requeue", prefix, poison)
	assert.Equal(t, exitRefused, code)
	assert.Contains(t, errOut, "409 Conflict")
	assert.Contains(t, errOut, "not parked")

	code, out, errOut = ctl("-addr", addr, "requeue", prefix, "--all")
	assert.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "requeued 0 (every parked marker")
}

func TestRefusalsAndUsageErrors(t *testing.T) {
	t.Parallel()
	_, addr := console(t, false)
	_, readOnly := console(t, true)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no command", []string{"-addr", addr}, exitUsage, "no command"},
		{"no addr", []string{"status"}, exitUsage, "no -addr"},
		{"bad addr", []string{"-addr", "ftp://x", "status"}, exitUsage, "not an http"},
		{"unknown command", []string{"-addr", addr, "purge"}, exitUsage, "unknown command"},
		{"missing argument", []string{"-addr", addr, "why", prefix}, exitUsage, "takes 2"},
		{"unknown flag", []string{"-nope", "status"}, exitUsage, "flag provided but not defined"},
		{"bad header", []string{"-H", "nocolon", "status"}, exitUsage, "Name: value"},
		{"unreachable", []string{"-addr", closed.URL, "status"}, exitRefused, "cannot reach the service"},
		{"unknown prefix", []string{"-addr", addr, "due", "nope/"}, exitRefused, "404 Not Found"},
		{"malformed id", []string{"-addr", addr, "why", prefix, "a b"}, exitRefused, "400 Bad Request"},
		{"read-only", []string{"-addr", readOnly, "requeue", prefix, poison}, exitRefused, "403 Forbidden"},
		{"not a console", []string{"-addr", addr + "/nowhere/x/", "status"}, exitRefused, "404"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := ctl(tt.args...)
			assert.Equal(t, tt.code, code, "exit status; stdout %q stderr %q", out, errOut)
			assert.Contains(t, errOut, tt.msg)
			assert.Empty(t, out)
		})
	}
}

func TestHeaderFlagIsSent(t *testing.T) {
	t.Parallel()
	var got string
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"sweeps":[]}`)
	}))
	defer front.Close()
	code, _, errOut := ctl("-addr", front.URL, "-H", "Authorization: Bearer s3cret", "status")
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, "Bearer s3cret", got)
}
