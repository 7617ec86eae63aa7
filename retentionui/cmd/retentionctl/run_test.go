package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
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
// id (and the ids of parked, parked too), a held id and three due markers,
// mounted under /admin/.
func console(t *testing.T, readOnly bool, parked ...string) (*retention.Sweep, string) {
	t.Helper()
	return consoleHolding(t, readOnly, []string{held}, parked...)
}

// consoleHolding is console with the held ids of holding.
func consoleHolding(t *testing.T, readOnly bool, holding []string, parked ...string) (*retention.Sweep, string) {
	t.Helper()
	ctx := context.Background()
	clock := retention.NewManualClock(t0)
	kv := retention.NewMemKV()
	parked = append(parked, poison)
	s, err := retention.New(kv, retention.Config{
		Prefix: prefix, Retention: time.Hour, MaxAttempts: 1, Clock: clock, Logger: slog.New(slog.DiscardHandler),
		Clear: func(_ context.Context, id string) error {
			switch {
			case slices.Contains(parked, id):
				return errors.New("refused")
			case slices.Contains(holding, id):
				return retention.Hold(clock.Now().Add(time.Hour))
			}
			return nil
		},
	})
	require.NoError(t, err)
	for _, id := range append(parked, holding...) {
		require.NoError(t, s.Mark(ctx, kv, id, t0.Add(-3*time.Hour)))
	}
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
	return ctlEnv(nil, args...)
}

// ctlEnv runs retentionctl with env as its environment.
func ctlEnv(env map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

// heldIDs lists the ids s's store has held.
func heldIDs(t *testing.T, s *retention.Sweep) []string {
	t.Helper()
	pending, err := s.Pending(context.Background(), 100)
	require.NoError(t, err)
	ids := []string{}
	for _, m := range pending {
		if m.State == retention.StateHeld {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// parkedIDs lists the ids s has parked.
func parkedIDs(t *testing.T, s *retention.Sweep) []string {
	t.Helper()
	parked, err := s.Parked(context.Background(), 100)
	require.NoError(t, err)
	ids := []string{}
	for _, m := range parked {
		ids = append(ids, m.ID)
	}
	return ids
}

func TestCommandsPrintTables(t *testing.T) {
	t.Parallel()
	_, addr := console(t, false)
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"status"}, []string{"PREFIX", prefix, "parked", "1 parked"}},
		{[]string{"due", prefix}, []string{"job-0", "job-2", "3 due: the next pass clears them", "0 retrying, 1 held, 1 parked"}},
		{[]string{"pending", prefix}, []string{"job-0", held, "held until 2026-03-14T10:26:53Z", poison, "waits for a requeue", "3 due, 0 retrying, 1 held, 1 parked",
			"once a hold is lifted: retentionctl release jobs/done/ ID"}},
		{[]string{"parked", prefix}, []string{poison, "waits for a requeue", "1 parked"}},
		{[]string{"why", prefix, held}, []string{held + ": held", "Held", "held until 2026-03-14T10:26:53Z"}},
		{[]string{"why", prefix, poison}, []string{poison + ": parked", "waits for a requeue"}},
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

// TestDueListsOnlyWhatStatusCountsAsDue: retentionctl due lists the
// markers status counts as due, and no held or parked one; pending lists
// those in their own states, never as overdue.
func TestDueListsOnlyWhatStatusCountsAsDue(t *testing.T) {
	t.Parallel()
	_, addr := console(t, false)
	code, out, errOut := ctl("-addr", addr, "-json", "status")
	require.Equal(t, exitOK, code, errOut)
	o, err := decode[retentionui.Overview]([]byte(out))
	require.NoError(t, err)
	due := o.Sweeps[0].Backlog.Due

	code, out, errOut = ctl("-addr", addr, "due", prefix)
	require.Equal(t, exitOK, code, errOut)
	rows := strings.Split(strings.TrimSpace(out), "\n")
	require.Greater(t, len(rows), due, out)
	assert.Len(t, slices.DeleteFunc(rows[1:1+due], func(r string) bool { return !strings.HasPrefix(r, "job-") }), due, "due rows: %s", out)
	assert.Equal(t, fmt.Sprintf("%d due: the next pass clears them", due), rows[1+due], "the count under the rows, want status's")
	for _, id := range []string{held, poison} {
		assert.NotContains(t, out, id, "due lists no held or parked marker")
	}

	code, out, errOut = ctl("-addr", addr, "pending", prefix)
	require.Equal(t, exitOK, code, errOut)
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 3 && (fields[0] == held || fields[0] == poison) {
			assert.Equal(t, "-", fields[3], "OVERDUE of %s: %s", fields[0], line)
		}
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

// TestReleaseMakesTheHeldMarkerDue: release lifts the hold of a held id
// (exit 0, "released 1"); an id that is not held, or no longer, is refused
// with 409 and exit 1; with -json the answer is the console's Released.
func TestReleaseMakesTheHeldMarkerDue(t *testing.T) {
	t.Parallel()
	s, addr := consoleHolding(t, false, []string{held, "job-held-2"})
	code, out, errOut := ctl("-addr", addr, "release", prefix, held)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "released 1 (job-held of jobs/done/): due at once")
	assert.Equal(t, []string{"job-held-2"}, heldIDs(t, s))

	for _, id := range []string{held, poison, "job-nope"} {
		code, out, errOut = ctl("-addr", addr, "release", prefix, id)
		assert.Equal(t, exitRefused, code, "release %s: stdout %q", id, out)
		assert.Contains(t, errOut, "409 Conflict")
		assert.Contains(t, errOut, "not held")
	}

	code, out, errOut = ctl("-addr", addr, "-json", "release", prefix, "job-held-2")
	require.Equal(t, exitOK, code, errOut)
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	var r retentionui.Released
	require.NoError(t, dec.Decode(&r), out)
	assert.Equal(t, retentionui.Released{Prefix: prefix, ID: "job-held-2", Released: 1}, r)
	assert.Empty(t, heldIDs(t, s))
	assert.Equal(t, []string{poison}, parkedIDs(t, s), "nothing requeued")
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
		{"read-only release", []string{"-addr", readOnly, "release", prefix, held}, exitRefused, "403 Forbidden"},
		{"release without an id", []string{"-addr", addr, "release", prefix}, exitUsage, "takes 2"},
		{"release of two ids", []string{"-addr", addr, "release", prefix, held, poison}, exitUsage, "takes 2"},
		{"release of a malformed id", []string{"-addr", addr, "release", prefix, "a b"}, exitRefused, "400 Bad Request"},
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

// TestDoubleDashEndsFlags: after --, an argument that starts with '-' is
// an id (or a prefix), and --all is an id too; before --, requeue's --all
// is every parked marker.
func TestDoubleDashEndsFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		code       int
		out        string
		leftParked []string
	}{
		{"id after --", []string{"requeue", prefix, "--", "-all"}, exitOK, "requeued 1 (-all of", []string{"--all", poison}},
		{"-- before the command", []string{"--", "requeue", prefix, "-all"}, exitOK, "requeued 1 (-all of", []string{"--all", poison}},
		{"--all after --", []string{"requeue", prefix, "--", "--all"}, exitOK, "requeued 1 (--all of", []string{"-all", poison}},
		{"--all before --", []string{"requeue", prefix, "--all"}, exitOK, "requeued 3 (every parked marker", []string{}},
		{"why after --", []string{"why", prefix, "--", "-all"}, exitOK, "-all: parked", []string{"--all", "-all", poison}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, addr := console(t, false, "-all", "--all")
			code, out, errOut := ctl(append([]string{"-addr", addr}, tt.args...)...)
			require.Equal(t, tt.code, code, "exit status; stderr: %s", errOut)
			assert.Contains(t, out, tt.out)
			assert.ElementsMatch(t, tt.leftParked, parkedIDs(t, s), "parked after %q", tt.args)
		})
	}
	releases := []struct {
		name     string
		args     []string
		out      string
		leftHeld []string
	}{
		{"release id after --", []string{"release", prefix, "--", "-h"}, "released 1 (-h of", []string{"--all", held}},
		{"release --all after --: an id", []string{"release", prefix, "--", "--all"}, "released 1 (--all of", []string{"-h", held}},
	}
	for _, tt := range releases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, addr := consoleHolding(t, false, []string{"-h", "--all", held})
			code, out, errOut := ctl(append([]string{"-addr", addr}, tt.args...)...)
			require.Equal(t, exitOK, code, "exit status; stderr: %s", errOut)
			assert.Contains(t, out, tt.out)
			assert.ElementsMatch(t, tt.leftHeld, heldIDs(t, s), "held after %q", tt.args)
		})
	}
}

// TestArgumentThatLooksLikeAFlagIsRefused: before --, an argument that
// starts with '-' is refused with a hint, and nothing is requeued: "-all"
// once requeued every parked marker when it was a parked id.
func TestArgumentThatLooksLikeAFlagIsRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		hint string
	}{
		{"id", []string{"requeue", prefix, "-all"}, "retentionctl requeue jobs/done/ -- -all"},
		{"id of why", []string{"why", prefix, "-x"}, "retentionctl why jobs/done/ -- -x"},
		{"prefix", []string{"requeue", "--all", prefix}, "retentionctl requeue -- --all jobs/done/"},
		{"quoted in the hint", []string{"requeue", prefix, "-a b"}, "retentionctl requeue jobs/done/ -- '-a b'"},
		{"id of release", []string{"release", prefix, "-all"}, "retentionctl release jobs/done/ -- -all"},
		{"--all is no release flag", []string{"release", prefix, "--all"}, "retentionctl release jobs/done/ -- --all"},
		{"flag after the command", []string{"status", "-json"}, "flags go before the command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, addr := console(t, false, "-all")
			code, out, errOut := ctl(append([]string{"-addr", addr}, tt.args...)...)
			assert.Equal(t, exitUsage, code, "exit status; stdout %q stderr %q", out, errOut)
			assert.Contains(t, errOut, "looks like a flag")
			assert.Contains(t, errOut, tt.hint)
			assert.Empty(t, out)
			assert.ElementsMatch(t, []string{"-all", poison}, parkedIDs(t, s), "nothing requeued")
		})
	}
}

// basicAuth stands for the authentication a console is mounted behind:
// 401 without credentials or with wrong ones.
func basicAuth(user, password string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="console"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// TestCredentialsRefusedOrMissingNameTheFlags: a 401 or 403 from what the
// console is mounted behind says whether credentials were missing or
// refused and names the flags that give them; -user with -password or
// $RETENTIONCTL_PASSWORD, or -H, gives them.
func TestCredentialsRefusedOrMissingNameTheFlags(t *testing.T) {
	t.Parallel()
	_, addr := console(t, false)
	target, err := url.Parse(addr)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	authed := httptest.NewServer(basicAuth("admin", "s3cret", proxy))
	t.Cleanup(authed.Close)
	forbidding := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "forbidden", http.StatusForbidden)
	}))
	t.Cleanup(forbidding.Close)
	basic := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("admin:s3cret"))
	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
		msgs []string
	}{
		{"none sent", nil, []string{"-addr", authed.URL + "/admin", "status"}, exitRefused,
			[]string{"401 Unauthorized", "credentials are missing", "-user", "-password", "-H"}},
		{"wrong password", nil, []string{"-addr", authed.URL + "/admin", "-user", "admin", "-password", "nope", "status"}, exitRefused,
			[]string{"401 Unauthorized", "not accepted", "-user", "-H"}},
		{"refused", nil, []string{"-addr", forbidding.URL, "-H", "Authorization: Bearer x", "status"}, exitRefused,
			[]string{"403 Forbidden", "were refused", "-user", "-H"}},
		{"refused, none sent", nil, []string{"-addr", forbidding.URL, "status"}, exitRefused,
			[]string{"403 Forbidden", "no credentials were sent", "-user", "-H"}},
		{"-user and -password", nil, []string{"-addr", authed.URL + "/admin", "-user", "admin", "-password", "s3cret", "status"}, exitOK, nil},
		{"password from the environment", map[string]string{"RETENTIONCTL_PASSWORD": "s3cret"},
			[]string{"-addr", authed.URL + "/admin", "-user", "admin", "status"}, exitOK, nil},
		{"user from the environment", map[string]string{"RETENTIONCTL_USER": "admin", "RETENTIONCTL_PASSWORD": "s3cret"},
			[]string{"-addr", authed.URL + "/admin", "status"}, exitOK, nil},
		{"-H", nil, []string{"-addr", authed.URL + "/admin", "-H", basic, "status"}, exitOK, nil},
		{"password without user", nil, []string{"-addr", authed.URL + "/admin", "-password", "s3cret", "status"}, exitUsage,
			[]string{"without -user"}},
		{"-user and an Authorization header", nil, []string{"-addr", authed.URL + "/admin", "-user", "admin", "-H", basic, "status"}, exitUsage,
			[]string{"give one"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := ctlEnv(tt.env, tt.args...)
			require.Equal(t, tt.code, code, "exit status; stdout %q stderr %q", out, errOut)
			for _, m := range tt.msgs {
				assert.Contains(t, errOut, m)
			}
			if tt.code == exitOK {
				assert.Contains(t, out, prefix)
			}
		})
	}
}

// TestJSONErrorsAreErrorBodiesOnStdout: with -json every error is the
// console's ErrorBody on stdout (status 0 when no answer came), with the
// exit status of the error.
func TestJSONErrorsAreErrorBodiesOnStdout(t *testing.T) {
	t.Parallel()
	_, addr := console(t, false)
	_, readOnly := console(t, true)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	unauthorized := httptest.NewServer(basicAuth("admin", "s3cret", http.NotFoundHandler()))
	t.Cleanup(unauthorized.Close)
	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	tests := []struct {
		name   string
		args   []string
		code   int
		status int
		msg    string
	}{
		{"not parked", []string{"-addr", addr, "requeue", prefix, held}, exitRefused, http.StatusConflict, "retentionui: the id is not parked"},
		{"not held", []string{"-addr", addr, "release", prefix, poison}, exitRefused, http.StatusConflict, "retentionui: the id is not held"},
		{"read-only release", []string{"-addr", readOnly, "release", prefix, held}, exitRefused, http.StatusForbidden, "read-only"},
		{"release usage", []string{"-addr", addr, "release", prefix, "-x"}, exitUsage, 0, "looks like a flag"},
		{"unknown prefix", []string{"-addr", addr, "due", "nope/"}, exitRefused, http.StatusNotFound, "retentionui: no sweep has this prefix"},
		{"read-only", []string{"-addr", readOnly, "requeue", prefix, poison}, exitRefused, http.StatusForbidden, "read-only"},
		{"credentials missing", []string{"-addr", unauthorized.URL, "status"}, exitRefused, http.StatusUnauthorized, "credentials are missing"},
		{"not a console", []string{"-addr", notFound.URL, "status"}, exitRefused, http.StatusNotFound, "not an answer of a retentionui console"},
		{"unreachable", []string{"-addr", closed.URL, "status"}, exitRefused, 0, "cannot reach the service"},
		{"usage", []string{"-addr", addr, "requeue", prefix, "-all"}, exitUsage, 0, "looks like a flag"},
		{"no command", []string{"-addr", addr}, exitUsage, 0, "no command"},
		{"unknown flag", []string{"-nope", "status"}, exitUsage, 0, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := ctl(append([]string{"-json"}, tt.args...)...)
			assert.Equal(t, tt.code, code, "exit status; stdout %q stderr %q", out, errOut)
			dec := json.NewDecoder(strings.NewReader(out))
			dec.DisallowUnknownFields()
			var e retentionui.ErrorBody
			require.NoError(t, dec.Decode(&e), "stdout %q", out)
			assert.False(t, dec.More(), "one ErrorBody on stdout: %q", out)
			assert.Equal(t, tt.status, e.Status)
			assert.Contains(t, e.Error, tt.msg)
			assert.Contains(t, errOut, tt.msg, "the message on stderr too")
		})
	}
}
