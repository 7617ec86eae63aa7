package retentionui

import (
	"net/http"
	"net/url"
	"strconv"
)

// serveRelease lifts the hold of one held marker (retention.Sweep.ReleaseHolds):
// the sweep's next pass asks its Clear again, at once.
func (h *Handler) serveRelease(w http.ResponseWriter, r *http.Request) {
	if h.opts.ReadOnly {
		h.fail(w, r, errReadOnly, http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, errBadRequest, http.StatusBadRequest)
		return
	}
	// The form only: parameters in the URL of a POST are not read.
	form := r.PostForm
	s, err := h.sweepOf(form)
	if err != nil {
		h.fail(w, r, err, statusOf(err))
		return
	}
	res := Released{Prefix: s.Prefix()}
	if res.ID, err = idOf(s, form); err != nil {
		h.fail(w, r, err, statusOf(err))
		return
	}
	ctx, cancel := h.storeCtx(r)
	defer cancel()
	res.Released, err = s.ReleaseHolds(ctx, res.ID)
	if err == nil && res.Released == 0 {
		err = errNotHeld
	}
	if err != nil {
		h.fail(w, r, err, statusOf(err))
		return
	}
	if wantsJSON(r) {
		now := h.opts.Clock.Now()
		if fl := h.fleet(ctx, s, now); fl != nil {
			res.Sweeper = fl.Holder
			res.PassBy, res.Pass = wakeNote(fl, now)
		}
		writeJSON(w, http.StatusOK, res)
		return
	}
	// Post/redirect/get, with a relative Location, as a requeue's.
	w.Header().Set("Location", sweepURL(s.Prefix(), url.Values{"released": {strconv.Itoa(res.Released)}}))
	w.WriteHeader(http.StatusSeeOther)
}
