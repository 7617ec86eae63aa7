package retentionui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// do sends a request to h and returns the status and body.
func do(t testing.TB, h http.Handler, method, target string, form url.Values, header http.Header) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequest(method, target, body)
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

var asJSON = http.Header{"Accept": {"application/json"}}

func getJSON[T any](t testing.TB, h http.Handler, target string) T {
	t.Helper()
	code, body := do(t, h, "GET", target, nil, asJSON)
	require.Equal(t, http.StatusOK, code, body)
	var v T
	require.NoError(t, json.Unmarshal([]byte(body), &v), body)
	return v
}

func newHandler(t testing.TB, opts retentionui.Options) *retentionui.Handler {
	t.Helper()
	h, err := retentionui.New(opts)
	require.NoError(t, err)
	return h
}

func TestNewRefusesUnusableOptions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := []struct {
		name  string
		opts  retentionui.Options
		field string
	}{
		{"no sweep", retentionui.Options{}, "Options.Sweeps is empty"},
		{"nil sweep", retentionui.Options{Sweeps: []*retention.Sweep{nil}}, "Options.Sweeps[0] is nil"},
		{"zero sweep", retentionui.Options{Sweeps: []*retention.Sweep{{}}}, "Options.Sweeps[0] was not made"},
		{"same prefix twice", retentionui.Options{Sweeps: []*retention.Sweep{f.jobs, f.jobs}}, "two sweeps of prefix"},
		{"detail of no sweep", retentionui.Options{Sweeps: []*retention.Sweep{f.jobs}, Details: map[string]retentionui.Detail{"other/": {}}}, "Options.Details names"},
		{"negative retention", retentionui.Options{Sweeps: []*retention.Sweep{f.jobs}, Details: map[string]retentionui.Detail{jobs: {Retention: -1}}}, "Retention is negative"},
		{"limit too big", retentionui.Options{Sweeps: []*retention.Sweep{f.jobs}, Limit: retention.MaxPageSize}, "Options.Limit"},
		{"negative limit", retentionui.Options{Sweeps: []*retention.Sweep{f.jobs}, Limit: -1}, "Options.Limit"},
		{"negative behind", retentionui.Options{Sweeps: []*retention.Sweep{f.jobs}, Behind: -time.Second}, "Options.Behind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := retentionui.New(tt.opts)
			require.ErrorIs(t, err, retentionui.ErrInvalidOptions, "New() = %v, %v", h, err)
			assert.Contains(t, err.Error(), tt.field)
		})
	}
}

func TestOverviewJSONShowsBacklogAndLastPass(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := newHandler(t, f.options())
	o := getJSON[retentionui.Overview](t, h, "/")
	require.Len(t, o.Sweeps, 2)
	assert.Equal(t, retentionui.DefaultLimit, o.Limit)
	for i, s := range []*retention.Sweep{f.jobs, f.uploads} {
		want, err := s.Backlog(context.Background(), retentionui.DefaultLimit)
		require.NoError(t, err)
		got := o.Sweeps[i]
		require.Equal(t, s.Prefix(), got.Prefix)
		require.NotNil(t, got.Backlog, got.Error)
		var oldest *time.Time
		if !want.OldestDue.IsZero() {
			oldest = ptr(want.OldestDue.UTC())
		}
		assert.Equal(t, retentionui.BacklogStatus{
			Due: want.Due, OldestID: want.OldestID, OldestDue: oldest, AgeMs: want.Age.Milliseconds(),
			Retrying: want.Retrying, RetryingAgeMs: want.RetryingAge.Milliseconds(), Held: want.Held, Parked: want.Parked, More: want.More,
		}, *got.Backlog)
		require.NotNil(t, got.LastPass)
		assert.Equal(t, t0, got.LastPass.At)
		assert.Equal(t, "unknown", got.Lease, "no Lease configured")
	}
	jobsStatus := o.Sweeps[0]
	assert.Equal(t, backlogSize, jobsStatus.Backlog.Due)
	assert.Equal(t, 1, jobsStatus.Backlog.Held)
	assert.Equal(t, 1, jobsStatus.Backlog.Parked)
	assert.Equal(t, retentionui.StateParked, jobsStatus.State)
	assert.Contains(t, jobsStatus.Summary, "1 parked")
	assert.Equal(t, 1, jobsStatus.LastPass.Cleared, "job-ok")
	assert.Equal(t, 1, jobsStatus.LastPass.Parked, poison)
	assert.Equal(t, 1, jobsStatus.LastPass.Held, held)
	assert.Equal(t, int64(time.Hour/time.Millisecond), *jobsStatus.RetentionMs)
	require.NotNil(t, jobsStatus.LagMs)
	assert.Equal(t, (2 * time.Hour).Milliseconds(), *jobsStatus.LagMs, "job-ok was cleared two hours past due")
	assert.Equal(t, retentionui.StateOK, o.Sweeps[1].State, o.Sweeps[1].Summary)
}

func ptr[T any](v T) *T { return &v }

func TestOverviewSaysBehindPastOptionsBehind(t *testing.T) {
	t.Parallel()
	kv := retention.NewMemKV()
	clock := retention.NewManualClock(t0)
	s, err := retention.New(kv, retention.Config{Prefix: "p/", Retention: time.Hour, Clock: clock, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	require.NoError(t, s.Mark(context.Background(), kv, "a", t0.Add(-time.Hour-10*time.Minute)))
	tests := []struct {
		behind time.Duration
		want   string
	}{
		{time.Minute, retentionui.StateBehind},
		{time.Hour, retentionui.StateOK},
	}
	for _, tt := range tests {
		o := getJSON[retentionui.Overview](t, newHandler(t, retentionui.Options{Sweeps: []*retention.Sweep{s}, Clock: clock, Behind: tt.behind}), "/")
		assert.Equal(t, tt.want, o.Sweeps[0].State, "Behind %v: %s", tt.behind, o.Sweeps[0].Summary)
	}
}

func TestOverviewCountsStopAtLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := f.options()
	opts.Limit = 10
	o := getJSON[retentionui.Overview](t, newHandler(t, opts), "/")
	assert.Equal(t, 10, o.Sweeps[0].Backlog.Due)
	assert.True(t, o.Sweeps[0].Backlog.More)
	assert.Contains(t, o.Sweeps[0].Summary, "at least")
	code, body := do(t, newHandler(t, opts), "GET", "/", nil, nil)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "or more")
}

// TestSweepPageListsEachMarkerUnderItsOneState: the sweep page lists as
// due only the markers the next pass clears, longest overdue first; the
// held marker is under Held with its hold's end and no overdue time, the
// parked one under Parked with no overdue time and no next try.
func TestSweepPageListsEachMarkerUnderItsOneState(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := getJSON[retentionui.SweepPage](t, newHandler(t, f.options()), "/sweep?prefix="+url.QueryEscape(jobs))
	pending, err := f.jobs.Pending(context.Background(), retentionui.DefaultLimit)
	require.NoError(t, err)
	var due []string
	for _, m := range pending {
		if m.State == retention.StateDue {
			due = append(due, m.ID)
		}
	}
	require.Len(t, due, backlogSize)
	assert.Equal(t, due, markerIDs(p.Due), "SweepPage.Due")
	for i, m := range p.Due {
		assert.Equal(t, "due", m.State, m.ID)
		require.NotNil(t, m.OverdueMs, "OverdueMs of due %s", m.ID)
		if i > 0 {
			assert.GreaterOrEqual(t, *p.Due[i-1].OverdueMs, *m.OverdueMs, "Due[%d] before Due[%d]", i-1, i)
		}
	}
	assert.Empty(t, p.Retrying)
	require.Equal(t, []string{held}, markerIDs(p.Held), "SweepPage.Held")
	assert.Equal(t, "held", p.Held[0].State)
	assert.Nil(t, p.Held[0].OverdueMs, "a held marker is not overdue")
	assert.Equal(t, ptr(t0.Add(2*time.Hour)), p.Held[0].Next, "the hold's end")
	require.Equal(t, []string{poison}, markerIDs(p.Parked), "SweepPage.Parked")
	assert.Equal(t, 1, p.Parked[0].Attempts)
	assert.Equal(t, t0.Add(-2*time.Hour), *p.Parked[0].Due)
	assert.Nil(t, p.Parked[0].OverdueMs, "a parked marker is not overdue")
	assert.Nil(t, p.Parked[0].Next, "a parked marker has no next try: it waits for a requeue")
	assert.False(t, p.PendingCut)
	assert.False(t, p.ParkedCut)
}

// TestSweepPageCountsWhatTheOverviewCounts: for each state, the sweep page
// lists as many markers as the overview counts, before and after a requeue
// (which makes the parked marker retrying, its next try the next pass).
func TestSweepPageCountsWhatTheOverviewCounts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := newHandler(t, f.options())
	for _, step := range []string{"before a requeue", "after a requeue"} {
		if step == "after a requeue" {
			n, err := f.jobs.Requeue(context.Background(), poison)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}
		o := getJSON[retentionui.Overview](t, h, "/")
		p := getJSON[retentionui.SweepPage](t, h, "/sweep?prefix="+url.QueryEscape(jobs))
		b := o.Sweeps[0].Backlog
		require.NotNil(t, b)
		tests := []struct {
			state    string
			overview int
			page     []retentionui.Marker
		}{
			{"due", b.Due, p.Due},
			{"retrying", b.Retrying, p.Retrying},
			{"held", b.Held, p.Held},
			{"parked", b.Parked, p.Parked},
		}
		for _, tt := range tests {
			assert.Len(t, tt.page, tt.overview, "%s: the sweep page's %s markers, want the overview's count", step, tt.state)
			for _, m := range tt.page {
				assert.Equal(t, tt.state, m.State, "%s: %s", step, m.ID)
			}
		}
	}
}

// TestSweepPageWordsHeldAndParkedAsSuch: the HTML shows a held marker as
// held until its hold's end and a parked one as waiting for a requeue,
// neither as overdue nor as tried by the next pass.
func TestSweepPageWordsHeldAndParkedAsSuch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	code, body := do(t, newHandler(t, f.options()), "GET", "/sweep?prefix="+url.QueryEscape(jobs), nil, nil)
	require.Equal(t, http.StatusOK, code)
	row := func(attr, id string) string {
		t.Helper()
		start := strings.Index(body, `<tr `+attr+`="`+id+`"`)
		require.GreaterOrEqual(t, start, 0, "no row %s=%s", attr, id)
		end := strings.Index(body[start:], "</tr>")
		return body[start : start+end]
	}
	assert.NotContains(t, body, `data-due-id="`+held+`"`, "held is not due")
	assert.NotContains(t, body, `data-due-id="`+poison+`"`, "parked is not due")
	heldRow := row("data-held-id", held)
	assert.Contains(t, heldRow, t0.Add(2*time.Hour).Format("15:04:05"), "held until its hold's end")
	assert.NotContains(t, strings.ToLower(heldRow), "next pass")
	parkedRow := row("data-parked-id", poison)
	assert.Contains(t, parkedRow, "waits for a requeue")
	assert.NotContains(t, strings.ToLower(parkedRow), "next pass")
	assert.Contains(t, body, `Due: <span data-field="due-count">25</span>`)
}

// markerIDs lists the ids of ms.
func markerIDs(ms []retentionui.Marker) []string {
	ids := []string{}
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	return ids
}

func TestWhyTellsWhenAnIDIsCleared(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	require.NoError(t, f.jobs.Mark(context.Background(), f.kv, "job-later", t0.Add(-30*time.Minute)))
	opts := f.options()
	tests := []struct {
		id, state string
		due, next *time.Time
		answer    string
	}{
		{"job-000", "due", ptr(t0.Add(-time.Hour)), nil, "the next pass clears it"},
		{held, "held", ptr(t0.Add(-2 * time.Hour)), ptr(t0.Add(2 * time.Hour)), "Held"},
		{poison, "parked", ptr(t0.Add(-2 * time.Hour)), nil, "waits for a requeue"},
		{"job-later", retentionui.WhyWaiting, ptr(t0.Add(30 * time.Minute)), nil, "Not due yet"},
		{"job-ok", retentionui.WhyNotFound, nil, nil, "cleared already"},
	}
	h := newHandler(t, opts)
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			w := getJSON[retentionui.Why](t, h, "/why?"+url.Values{"prefix": {jobs}, "id": {tt.id}}.Encode())
			assert.Equal(t, tt.state, w.State, w.Answer)
			assert.Equal(t, tt.due, w.Due)
			assert.Equal(t, tt.next, w.Next)
			assert.Contains(t, w.Answer, tt.answer)
			assert.NotEmpty(t, w.Searched)
		})
	}
}

func TestWhyWithoutKVSaysWhatItSearched(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := f.options()
	opts.Details = nil
	require.NoError(t, f.jobs.Mark(context.Background(), f.kv, "job-later", t0.Add(-30*time.Minute)))
	w := getJSON[retentionui.Why](t, newHandler(t, opts), "/why?"+url.Values{"prefix": {jobs}, "id": {"job-later"}}.Encode())
	assert.Equal(t, retentionui.WhyNotFound, w.State)
	assert.Contains(t, w.Searched, "not searched")
}

func TestRequestsAreValidated(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := newHandler(t, f.options())
	long := strings.Repeat("a", retention.MaxIDLen+1)
	tests := []struct {
		name, method, target string
		form                 url.Values
		want                 int
	}{
		{"overview", "GET", "/", nil, http.StatusOK},
		{"style", "GET", "/style.css", nil, http.StatusOK},
		{"unknown page", "GET", "/nope", nil, http.StatusNotFound},
		{"unknown prefix", "GET", "/sweep?prefix=nope/", nil, http.StatusNotFound},
		{"no prefix", "GET", "/sweep", nil, http.StatusBadRequest},
		{"two prefixes", "GET", "/sweep?prefix=jobs/done/&prefix=jobs/done/", nil, http.StatusBadRequest},
		{"why malformed id", "GET", "/why?prefix=jobs/done/&id=a%20b", nil, http.StatusBadRequest},
		{"why too long an id", "GET", "/why?prefix=jobs/done/&id=" + long, nil, http.StatusBadRequest},
		{"why empty id", "GET", "/why?prefix=jobs/done/&id=", nil, http.StatusBadRequest},
		{"why unknown prefix", "GET", "/why?prefix=x/&id=a", nil, http.StatusNotFound},
		{"requeue by GET", "GET", "/requeue?prefix=jobs/done/&id=" + poison, nil, http.StatusMethodNotAllowed},
		{"requeue unknown prefix", "POST", "/requeue", url.Values{"prefix": {"x/"}, "id": {poison}}, http.StatusNotFound},
		{"requeue malformed id", "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {"<b>"}}, http.StatusBadRequest},
		{"requeue id and all", "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}, "all": {"true"}}, http.StatusBadRequest},
		{"requeue all=false", "POST", "/requeue", url.Values{"prefix": {jobs}, "all": {"false"}}, http.StatusBadRequest},
		{"requeue not parked", "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {held}}, http.StatusConflict},
		{"requeue prefix in URL only", "POST", "/requeue?prefix=jobs/done/&id=" + poison, url.Values{}, http.StatusBadRequest},
		{"release by GET", "GET", "/release?prefix=jobs/done/&id=" + held, nil, http.StatusMethodNotAllowed},
		{"release unknown prefix", "POST", "/release", url.Values{"prefix": {"x/"}, "id": {held}}, http.StatusNotFound},
		{"release malformed id", "POST", "/release", url.Values{"prefix": {jobs}, "id": {"<b>"}}, http.StatusBadRequest},
		{"release too long an id", "POST", "/release", url.Values{"prefix": {jobs}, "id": {long}}, http.StatusBadRequest},
		{"release no id", "POST", "/release", url.Values{"prefix": {jobs}}, http.StatusBadRequest},
		{"release two ids", "POST", "/release", url.Values{"prefix": {jobs}, "id": {held, held}}, http.StatusBadRequest},
		{"release all", "POST", "/release", url.Values{"prefix": {jobs}, "all": {"true"}}, http.StatusBadRequest},
		{"release not held", "POST", "/release", url.Values{"prefix": {jobs}, "id": {poison}}, http.StatusConflict},
		{"release prefix in URL only", "POST", "/release?prefix=jobs/done/&id=" + held, url.Values{}, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, header := range []http.Header{nil, asJSON} {
				code, body := do(t, h, tt.method, tt.target, tt.form, header)
				assert.Equal(t, tt.want, code, "%s %s = %d, want %d: %s", tt.method, tt.target, code, tt.want, body)
				if header != nil && code != http.StatusOK {
					var e retentionui.ErrorBody
					require.NoError(t, json.Unmarshal([]byte(body), &e), body)
					assert.Equal(t, tt.want, e.Status)
					assert.NotEmpty(t, e.Error)
				}
			}
		})
	}
	assert.Equal(t, []string{poison}, parkedIDs(t, f.jobs), "no request above requeued")
	assert.Equal(t, []string{held}, heldIDs(t, f.jobs), "no request above released")
}

func TestRequeuePutsTheParkedMarkerBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := newHandler(t, f.options())
	code, body := do(t, h, "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}}, asJSON)
	require.Equal(t, http.StatusOK, code, body)
	var res retentionui.Requeued
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	assert.Equal(t, retentionui.Requeued{Prefix: jobs, ID: poison, Requeued: 1}, res)
	assert.Empty(t, parkedIDs(t, f.jobs))
	assertDueAgain(t, f.jobs, poison)

	w := getJSON[retentionui.Why](t, h, "/why?"+url.Values{"prefix": {jobs}, "id": {poison}}.Encode())
	assert.Contains(t, w.Answer, "the next pass", "why of a requeued id")
	assert.Nil(t, w.Next)

	code, _ = do(t, h, "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}}, asJSON)
	assert.Equal(t, http.StatusConflict, code, "requeued twice")
}

func TestRequeueFromAFormRedirectsToTheSweepPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := newHandler(t, f.options())
	r := httptest.NewRequest("POST", "/requeue", strings.NewReader(url.Values{"prefix": {jobs}, "all": {"true"}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", "http://example.com")
	r.Host = "example.com"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	assert.Equal(t, "sweep?prefix=jobs%2Fdone%2F&requeued=1", w.Header().Get("Location"), "relative, so it works under any mount")
	assert.Empty(t, parkedIDs(t, f.jobs))
	code, body := do(t, h, "GET", "/"+w.Header().Get("Location"), nil, nil)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "Requeued 1")
}

func TestRequeueAllPutsBackMoreThanAPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	parkMany(t, f, 300)
	opts := f.options()
	opts.Limit = 10
	h := newHandler(t, opts)
	code, body := do(t, h, "POST", "/requeue", url.Values{"prefix": {jobs}, "all": {"1"}}, asJSON)
	require.Equal(t, http.StatusOK, code, body)
	var res retentionui.Requeued
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	assert.Equal(t, 301, res.Requeued)
	parked, err := f.jobs.Parked(ctx, 1)
	require.NoError(t, err)
	assert.Empty(t, parked)
}

// parkMany parks n more ids of the fixture's jobs sweep: marked long ago,
// failing their one attempt.
func parkMany(t testing.TB, f *fixture, n int) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("stuck-%05d", i)
		require.NoError(t, f.jobs.Mark(ctx, f.kv, ids[i], t0.Add(-10*time.Hour)))
	}
	s, err := retention.New(f.kv, retention.Config{
		Prefix: jobs, Retention: time.Hour, MaxAttempts: 1, Clock: f.clock, Logger: discard,
		Clear: func(_ context.Context, id string) error {
			if strings.HasPrefix(id, "stuck-") {
				return io.ErrUnexpectedEOF
			}
			return retention.Hold(f.clock.Now().Add(time.Hour))
		},
	})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, n, st.Parked)
	return ids
}

func TestCrossOriginPostIsRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header http.Header
		want   int
	}{
		{"cross-site fetch", http.Header{"Sec-Fetch-Site": {"cross-site"}}, http.StatusForbidden},
		{"same-site fetch", http.Header{"Sec-Fetch-Site": {"same-site"}}, http.StatusForbidden},
		{"other origin", http.Header{"Origin": {"https://evil.example"}}, http.StatusForbidden},
		{"same origin", http.Header{"Sec-Fetch-Site": {"same-origin"}}, http.StatusOK},
		{"no browser headers (a CLI)", http.Header{}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			h := newHandler(t, f.options())
			header := http.Header{"Accept": {"application/json"}}
			for k, v := range tt.header {
				header[k] = v
			}
			code, body := do(t, h, "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}}, header)
			assert.Equal(t, tt.want, code, body)
			code, body = do(t, h, "POST", "/release", url.Values{"prefix": {jobs}, "id": {held}}, header)
			assert.Equal(t, tt.want, code, "release: %s", body)
			if tt.want == http.StatusForbidden {
				assert.Equal(t, []string{poison}, parkedIDs(t, f.jobs))
				assert.Equal(t, []string{held}, heldIDs(t, f.jobs))
			}
		})
	}
}

func TestReadOnlyHidesAndRefusesActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := f.options()
	opts.ReadOnly = true
	h := newHandler(t, opts)
	code, body := do(t, h, "GET", "/sweep?prefix="+url.QueryEscape(jobs), nil, nil)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `data-parked-id="`+poison+`"`)
	assert.NotContains(t, body, "data-action")
	assert.NotContains(t, body, `method="post"`)
	code, _ = do(t, h, "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}}, asJSON)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, []string{poison}, parkedIDs(t, f.jobs))
	code, _ = do(t, h, "POST", "/release", url.Values{"prefix": {jobs}, "id": {held}}, asJSON)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, []string{held}, heldIDs(t, f.jobs))

	opts.ReadOnly = false
	_, body = do(t, newHandler(t, opts), "GET", "/sweep?prefix="+url.QueryEscape(jobs), nil, nil)
	assert.Contains(t, body, `data-action="requeue"`, "the control the read-only page hides")
	assert.Contains(t, body, `data-action="release"`, "the control the read-only page hides")
}

func TestPagesEscapePrefixesAndIDs(t *testing.T) {
	t.Parallel()
	kv := retention.NewMemKV()
	clock := retention.NewManualClock(t0)
	prefix := `<script>alert(1)</script>"/`
	s, err := retention.New(kv, retention.Config{Prefix: prefix, Retention: time.Hour, Clock: clock, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	require.NoError(t, s.Mark(context.Background(), kv, "a", t0.Add(-2*time.Hour)))
	h := newHandler(t, retentionui.Options{Sweeps: []*retention.Sweep{s}, Clock: clock})
	for _, target := range []string{"/", "/sweep?prefix=" + url.QueryEscape(prefix), "/why?prefix=" + url.QueryEscape(prefix) + "&id=a"} {
		code, body := do(t, h, "GET", target, nil, nil)
		require.Equal(t, http.StatusOK, code, target)
		assert.NotContains(t, body, "<script>", target)
		assert.Contains(t, body, "&lt;script&gt;", target)
	}
}

// assertDueAgain checks in the store that id is back for the next pass:
// listed by Pending, not parked, no failed attempt counted, no later try
// set. (A requeued marker lies in the retry range, so the core lists it as
// retrying with no next try: the next pass takes it.)
func assertDueAgain(t testing.TB, s *retention.Sweep, id string) {
	t.Helper()
	pending, err := s.Pending(context.Background(), 1000)
	require.NoError(t, err)
	for _, m := range pending {
		if m.ID == id {
			assert.Contains(t, []retention.MarkerState{retention.StateDue, retention.StateRetrying}, m.State, "Pending() state of %s", id)
			assert.Zero(t, m.Attempts, "Pending() attempts of %s", id)
			assert.True(t, m.Next.IsZero(), "Pending() next try of %s = %v, want none: the next pass", id, m.Next)
			return
		}
	}
	t.Errorf("Pending() = %v, want %s listed", pending, id)
}
