package retentionui_test

import (
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/marksweep/retention"
)

// FuzzRequestParams sends any prefix and id to every route that reads
// them: the answer is a status the routes document, never a panic or a 500,
// an id the sweep's rule refuses is never served, and what the request
// carried never reaches the page unescaped.
func FuzzRequestParams(f *testing.F) {
	src, err := os.ReadFile("assets/pages.html")
	if err != nil {
		f.Fatal(err)
	}
	pagesHTML := string(src)
	fx := newFixture(f)
	h := newHandler(f, fx.options())
	for _, seed := range [][2]string{
		{jobs, poison}, {jobs, held}, {jobs, "job-000"}, {"nope/", "a"}, {jobs, ""}, {jobs, "<script>"},
		{jobs, strings.Repeat("x", retention.MaxIDLen+1)}, {"", ""}, {jobs + "\x00", "a\xff"},
		{jobs, "0<"}, {jobs, "0</td"}, {jobs, "x<img src=x>"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, prefix, id string) {
		q := url.Values{"prefix": {prefix}, "id": {id}}
		for _, req := range []struct {
			method, target string
			form           url.Values
		}{
			{"GET", "/sweep?" + q.Encode(), nil},
			{"GET", "/why?" + q.Encode(), nil},
			{"POST", "/requeue", q},
			{"POST", "/release", q},
		} {
			code, body := do(t, h, req.method, req.target, req.form, nil)
			switch code {
			case http.StatusOK, http.StatusSeeOther, http.StatusBadRequest, http.StatusNotFound, http.StatusConflict:
			default:
				t.Fatalf("%s %s = %d, want 200, 303, 400, 404 or 409: %s", req.method, req.target, code, body)
			}
			if code == http.StatusOK || code == http.StatusSeeOther {
				if prefix != jobs && prefix != uploads {
					t.Fatalf("%s %s = %d for an unknown prefix", req.method, req.target, code)
				}
				if req.target != "/sweep?"+q.Encode() && retention.ValidateID(id) != nil {
					t.Fatalf("%s %s = %d for an id the rule refuses", req.method, req.target, code)
				}
			}
			for _, in := range []string{prefix, id} {
				if strings.Contains(body, in) && !pageMarkup(pagesHTML, in) {
					t.Fatalf("%s %s: the page holds %q unescaped", req.method, req.target, in)
				}
			}
		}
	})
}

// pageMarkup reports whether every tag that in opens is one the page's
// template writes itself: each run of in from a '<' to the next '>' (or
// to in's end) appears in pagesHTML. A value the page shows as text can
// then meet its markup in the body ("0" of a count, then "</td>") without
// having been written unescaped; a tag the template never writes cannot.
func pageMarkup(pagesHTML, in string) bool {
	for rest := in; ; {
		i := strings.IndexByte(rest, '<')
		if i < 0 {
			return true
		}
		rest = rest[i:]
		tag := rest
		if j := strings.IndexByte(rest, '>'); j >= 0 {
			tag = rest[:j+1]
		}
		if !strings.Contains(pagesHTML, tag) {
			return false
		}
		rest = rest[1:]
	}
}
