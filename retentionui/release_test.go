package retentionui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// TestReleaseMakesTheHeldMarkerDue: POST /release lifts the hold of the
// held id in the store (the sweep page and a look-up list it as due), says
// how many it released, and a second release of it is 409: not held.
func TestReleaseMakesTheHeldMarkerDue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := newHandler(t, f.options())
	code, body := do(t, h, "POST", "/release", url.Values{"prefix": {jobs}, "id": {held}}, asJSON)
	require.Equal(t, http.StatusOK, code, body)
	var res retentionui.Released
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	assert.Equal(t, retentionui.Released{Prefix: jobs, ID: held, Released: 1}, res)
	assert.Empty(t, heldIDs(t, f.jobs))

	p := getJSON[retentionui.SweepPage](t, h, "/sweep?prefix="+url.QueryEscape(jobs))
	assert.Empty(t, p.Held)
	require.NotEmpty(t, p.Due)
	assert.Equal(t, held, p.Due[0].ID, "due, the longest overdue first: %v", p.Due)
	w := getJSON[retentionui.Why](t, h, "/why?"+url.Values{"prefix": {jobs}, "id": {held}}.Encode())
	assert.Equal(t, "due", w.State)
	assert.Contains(t, w.Answer, "the next pass clears it")

	code, body = do(t, h, "POST", "/release", url.Values{"prefix": {jobs}, "id": {held}}, asJSON)
	assert.Equal(t, http.StatusConflict, code, "released twice: %s", body)
	assert.Contains(t, body, "not held")
}

// TestReleaseFromAFormRedirectsToTheSweepPage: the page's Release button
// posts a form; the answer sends the browser back to the sweep's page,
// which says what was released and when it takes effect.
func TestReleaseFromAFormRedirectsToTheSweepPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := newHandler(t, f.options())
	r := httptest.NewRequest("POST", "/release", strings.NewReader(url.Values{"prefix": {jobs}, "id": {held}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", "http://example.com")
	r.Host = "example.com"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	assert.Equal(t, "sweep?prefix=jobs%2Fdone%2F&released=1", w.Header().Get("Location"), "relative, so it works under any mount")
	code, body := do(t, h, "GET", "/"+w.Header().Get("Location"), nil, nil)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "Released 1: due at once")
	assert.NotContains(t, body, `data-held-id="`+held+`"`)
}

// TestConcurrentReleasesOfOneIDAnswerOneReleased: of 12 releases of one
// held id racing over a slow Move, one answers "released 1" and the others
// that it is not held (any more).
func TestConcurrentReleasesOfOneIDAnswerOneReleased(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		kv := slowMoveKV{retention.NewMemKV()}
		s, err := retention.New(kv, retention.Config{
			Prefix: jobs, Retention: time.Hour, Logger: discard,
			Clear: func(context.Context, string) error { return retention.Hold(time.Now().Add(time.Hour)) },
		})
		require.NoError(t, err)
		require.NoError(t, s.Mark(ctx, kv, held, time.Now().Add(-2*time.Hour)))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, st.Held)
		h := newHandler(t, retentionui.Options{Sweeps: []*retention.Sweep{s}})

		codes := make([]int, 12)
		released := 0
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range codes {
			wg.Go(func() {
				code, body := do(t, h, "POST", "/release", url.Values{"prefix": {jobs}, "id": {held}}, asJSON)
				codes[i] = code
				if code == http.StatusOK {
					var res retentionui.Released
					assert.NoError(t, json.Unmarshal([]byte(body), &res), body)
					mu.Lock()
					released += res.Released
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		count := map[int]int{}
		for _, c := range codes {
			count[c]++
		}
		assert.Equal(t, map[int]int{http.StatusOK: 1, http.StatusConflict: 11}, count, "statuses of 12 racing releases")
		assert.Equal(t, 1, released, "markers released, summed over the answers")
		assert.Empty(t, heldIDs(t, s))
	})
}
