package retentionui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/marksweep/retention"
)

// Handler is the console: an http.Handler serving the overview, a page per
// sweep, the look-up by id and the Requeue and Release actions, each page
// as HTML or, asked for with "Accept: application/json", as JSON. Create
// one with New and mount it under any path with http.StripPrefix, behind
// your authentication: it has none of its own. Its routes, relative to
// where it is mounted:
//
//	GET  /                         the overview (Overview)
//	GET  /sweep?prefix=P           one sweep's due and parked markers (SweepPage)
//	GET  /why?prefix=P&id=X        when X will be cleared, and why not yet (Why)
//	POST /requeue  prefix=P&id=X   put X's parked marker back (Requeued)
//	POST /requeue  prefix=P&all=1  put every parked marker back
//	POST /release  prefix=P&id=X   lift X's hold: its marker is due at once (Released)
//	GET  /style.css                the page's style sheet
//
// A Handler is safe for concurrent use. It logs nothing: errors go to the
// response.
type Handler struct {
	opts   Options
	sweeps map[string]*retention.Sweep
	mux    *http.ServeMux
	origin *http.CrossOriginProtection
	pages  *template.Template
}

// New returns a Handler over opts.Sweeps, or an error matching
// ErrInvalidOptions that names the field at fault.
func New(opts Options) (*Handler, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	h := &Handler{
		opts:   opts,
		sweeps: make(map[string]*retention.Sweep, len(opts.Sweeps)),
		mux:    http.NewServeMux(),
		origin: http.NewCrossOriginProtection(),
		pages:  pages,
	}
	// Copies: a caller changing its slice or map later changes nothing.
	h.opts.Sweeps = append([]*retention.Sweep(nil), opts.Sweeps...)
	h.opts.Details = maps.Clone(opts.Details)
	for _, s := range opts.Sweeps {
		h.sweeps[s.Prefix()] = s
	}
	h.mux.HandleFunc("GET /{$}", h.serveOverview)
	h.mux.HandleFunc("GET /sweep", h.serveSweep)
	h.mux.HandleFunc("GET /why", h.serveWhy)
	h.mux.HandleFunc("POST /requeue", h.serveRequeue)
	h.mux.HandleFunc("POST /release", h.serveRelease)
	h.mux.HandleFunc("GET /style.css", serveStyle)
	h.mux.HandleFunc("/", h.serveOther)
	return h, nil
}

// ServeHTTP serves the console's pages and actions.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	// The page loads nothing from elsewhere and may not be framed.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	// A GET must not change anything: a POST to a GET route gets 405
	// from the mux, and a cross-origin POST is refused before routing.
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := h.origin.Check(r); err != nil {
			h.fail(w, r, errCrossOrigin, http.StatusForbidden)
			return
		}
	}
	h.mux.ServeHTTP(w, r)
}

// serveOther answers what no route serves: a known path with the wrong
// method (405, with Allow), anything else 404, in the format asked for.
func (h *Handler) serveOther(w http.ResponseWriter, r *http.Request) {
	allow := map[string]string{"/": "GET, HEAD", "/sweep": "GET, HEAD", "/why": "GET, HEAD", "/style.css": "GET, HEAD", "/requeue": "POST", "/release": "POST"}[r.URL.Path]
	if allow == "" {
		h.fail(w, r, errNotFound, http.StatusNotFound)
		return
	}
	w.Header().Set("Allow", allow)
	h.fail(w, r, errMethod, http.StatusMethodNotAllowed)
}

// storeCtx bounds a request's store calls by Options.Timeout.
func (h *Handler) storeCtx(r *http.Request) (context.Context, context.CancelFunc) {
	if h.opts.Timeout < 0 {
		return context.WithCancel(r.Context())
	}
	return context.WithTimeout(r.Context(), h.opts.Timeout)
}

// wantsJSON reports whether the request's Accept header asks for JSON.
func wantsJSON(r *http.Request) bool {
	for part := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(part); err == nil && mt == "application/json" {
			return true
		}
	}
	return false
}

// sweepOf returns the sweep of the request's prefix parameter.
func (h *Handler) sweepOf(values url.Values) (*retention.Sweep, error) {
	prefix, err := oneValue(values, "prefix")
	if err != nil {
		return nil, err
	}
	s, ok := h.sweeps[prefix]
	if !ok {
		return nil, errUnknownSweep
	}
	return s, nil
}

// idOf returns the request's id parameter, checked by s's id rule.
func idOf(s *retention.Sweep, values url.Values) (string, error) {
	id, err := oneValue(values, "id")
	if err != nil {
		return "", err
	}
	if err := checkID(s, id); err != nil {
		return "", err
	}
	return id, nil
}

// checkID checks id by s's rule (Config.ValidateID), as a marker key of s
// would be.
func checkID(s *retention.Sweep, id string) error {
	if len(id) > retention.MaxIDLen {
		return errInvalidID
	}
	if _, err := s.MarkerKey(epoch, id); err != nil {
		return errInvalidID
	}
	return nil
}

// oneValue returns the one value of name in values: a missing or repeated
// parameter is a bad request.
func oneValue(values url.Values, name string) (string, error) {
	v := values[name]
	if len(v) != 1 {
		return "", fmt.Errorf("%w: want one %s parameter, got %d", errBadRequest, name, len(v))
	}
	return v[0], nil
}

// statusOf maps a request's error to its HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errUnknownSweep), errors.Is(err, errNotFound):
		return http.StatusNotFound
	case errors.Is(err, errInvalidID), errors.Is(err, errBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, errNotParked), errors.Is(err, errNotHeld):
		return http.StatusConflict
	case errors.Is(err, errReadOnly), errors.Is(err, errCrossOrigin):
		return http.StatusForbidden
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed
	}
	return http.StatusInternalServerError
}

// fail answers with err and status, as JSON or as a page. The message
// holds no request input but through html/template or JSON escaping.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error, status int) {
	if wantsJSON(r) {
		writeJSON(w, status, ErrorBody{Status: status, Error: err.Error()})
		return
	}
	h.render(w, status, "error", struct {
		Status int
		Text   string
		Error  string
	}{status, http.StatusText(status), err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nothing to do
}

// answer writes doc, the page's documented JSON type, as JSON, or renders
// page with view, which may hold more: what only the HTML shows must not
// reach the JSON.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, page string, doc, view any) {
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, doc)
		return
	}
	h.render(w, http.StatusOK, page, view)
}

func (h *Handler) render(w http.ResponseWriter, status int, page string, v any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = h.pages.ExecuteTemplate(w, page, v) // the client went away: nothing to do
}

// countOf reads the count a requeue's or a release's redirect carries to
// the page, in the parameter name.
func countOf(values url.Values, name string) (int, bool) {
	n, err := strconv.Atoi(values.Get(name))
	return n, err == nil && n >= 0
}
