package retentionui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/retentionui"
)

// exactly returns a check that a body is exactly a T: no key T lacks
// (DisallowUnknownFields), and the same keys and values as T's own
// encoding of what was decoded, so none is missing or spelled otherwise.
func exactly[T any]() func(t *testing.T, body string) {
	return func(t *testing.T, body string) {
		t.Helper()
		dec := json.NewDecoder(strings.NewReader(body))
		dec.DisallowUnknownFields()
		var v T
		require.NoError(t, dec.Decode(&v), "decoding into %T: %s", v, body)
		again, err := json.Marshal(v)
		require.NoError(t, err)
		assert.JSONEq(t, string(again), body, "the JSON is not exactly a %T", v)
	}
}

// TestEveryPagesJSONIsExactlyItsDocumentedType: each page's JSON, and each
// error's, carries the keys of its documented type and no other (GET
// /sweep once carried Requeued, WasRequeued and Retention of the HTML
// view).
func TestEveryPagesJSONIsExactlyItsDocumentedType(t *testing.T) {
	t.Parallel()
	why := func(id string) string { return "/why?" + url.Values{"prefix": {jobs}, "id": {id}}.Encode() }
	readOnly := func(o *retentionui.Options) { o.ReadOnly = true }
	noDetails := func(o *retentionui.Options) { o.Details = nil }
	// requeued makes the parked marker retrying: every list of the sweep
	// page then holds one.
	requeued := func(t *testing.T, f *fixture) {
		_, err := f.jobs.Requeue(context.Background(), poison)
		require.NoError(t, err)
	}
	tests := []struct {
		name, method, target string
		form                 url.Values
		options              func(*retentionui.Options) // nil: the fixture's
		setup                func(*testing.T, *fixture) // nil: none
		status               int
		check                func(*testing.T, string)
	}{
		{"overview", "GET", "/", nil, nil, nil, http.StatusOK, exactly[retentionui.Overview]()},
		{"read-only overview", "GET", "/", nil, readOnly, nil, http.StatusOK, exactly[retentionui.Overview]()},
		{"sweep", "GET", "/sweep?prefix=" + url.QueryEscape(jobs), nil, nil, nil, http.StatusOK, exactly[retentionui.SweepPage]()},
		{"sweep after a requeue", "GET", "/sweep?prefix=" + url.QueryEscape(jobs) + "&requeued=3", nil, nil, nil, http.StatusOK, exactly[retentionui.SweepPage]()},
		{"sweep with every state", "GET", "/sweep?prefix=" + url.QueryEscape(jobs), nil, nil, requeued, http.StatusOK, exactly[retentionui.SweepPage]()},
		{"why retrying", "GET", why(poison), nil, nil, requeued, http.StatusOK, exactly[retentionui.Why]()},
		{"sweep without details", "GET", "/sweep?prefix=" + url.QueryEscape(uploads), nil, noDetails, nil, http.StatusOK, exactly[retentionui.SweepPage]()},
		{"why due", "GET", why("job-000"), nil, nil, nil, http.StatusOK, exactly[retentionui.Why]()},
		{"why held", "GET", why(held), nil, nil, nil, http.StatusOK, exactly[retentionui.Why]()},
		{"why parked", "GET", why(poison), nil, nil, nil, http.StatusOK, exactly[retentionui.Why]()},
		{"why not found", "GET", why("job-nope"), nil, nil, nil, http.StatusOK, exactly[retentionui.Why]()},
		{"requeue one", "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}}, nil, nil, http.StatusOK, exactly[retentionui.Requeued]()},
		{"requeue all", "POST", "/requeue", url.Values{"prefix": {jobs}, "all": {"true"}}, nil, nil, http.StatusOK, exactly[retentionui.Requeued]()},
		{"release", "POST", "/release", url.Values{"prefix": {jobs}, "id": {held}}, nil, nil, http.StatusOK, exactly[retentionui.Released]()},
		{"sweep after a release", "GET", "/sweep?prefix=" + url.QueryEscape(jobs) + "&released=1", nil, nil, nil, http.StatusOK, exactly[retentionui.SweepPage]()},
		{"bad request", "GET", why("a b"), nil, nil, nil, http.StatusBadRequest, exactly[retentionui.ErrorBody]()},
		{"read-only requeue", "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}}, readOnly, nil, http.StatusForbidden, exactly[retentionui.ErrorBody]()},
		{"unknown prefix", "GET", "/sweep?prefix=nope/", nil, nil, nil, http.StatusNotFound, exactly[retentionui.ErrorBody]()},
		{"wrong method", "GET", "/requeue", nil, nil, nil, http.StatusMethodNotAllowed, exactly[retentionui.ErrorBody]()},
		{"not parked", "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {held}}, nil, nil, http.StatusConflict, exactly[retentionui.ErrorBody]()},
		{"read-only release", "POST", "/release", url.Values{"prefix": {jobs}, "id": {held}}, readOnly, nil, http.StatusForbidden, exactly[retentionui.ErrorBody]()},
		{"not held", "POST", "/release", url.Values{"prefix": {jobs}, "id": {poison}}, nil, nil, http.StatusConflict, exactly[retentionui.ErrorBody]()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if tt.setup != nil {
				tt.setup(t, f)
			}
			opts := f.options()
			if tt.options != nil {
				tt.options(&opts)
			}
			code, body := do(t, newHandler(t, opts), tt.method, tt.target, tt.form, asJSON)
			require.Equal(t, tt.status, code, "%s %s = %d, want %d: %s", tt.method, tt.target, code, tt.status, body)
			tt.check(t, body)
		})
	}
}
