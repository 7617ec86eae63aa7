package retentionui

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/marksweep/retention"
)

// requeueAllRounds bounds the rounds of a requeue of every parked marker:
// each round lists up to a page of them and puts them back.
const requeueAllRounds = 1000

func (h *Handler) serveRequeue(w http.ResponseWriter, r *http.Request) {
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
	res := Requeued{Prefix: s.Prefix()}
	if all := form.Get("all"); all != "" {
		if res.All, err = strconv.ParseBool(all); err != nil || !res.All || form.Has("id") {
			h.fail(w, r, errBadRequest, http.StatusBadRequest)
			return
		}
	} else if res.ID, err = idOf(s, form); err != nil {
		h.fail(w, r, err, statusOf(err))
		return
	}
	ctx, cancel := h.storeCtx(r)
	defer cancel()
	if res.All {
		res.Requeued, err = requeueAll(ctx, s)
	} else {
		res.Requeued, err = s.Requeue(ctx, res.ID)
		if err == nil && res.Requeued == 0 {
			err = errNotParked
		}
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
	// Post/redirect/get: a reload does not requeue again. The Location
	// is relative (http.Redirect would make it absolute from the path it
	// sees, which http.StripPrefix shortened), so it works under any mount.
	w.Header().Set("Location", sweepURL(s.Prefix(), url.Values{"requeued": {strconv.Itoa(res.Requeued)}}))
	w.WriteHeader(http.StatusSeeOther)
}

// requeueAll puts back every parked marker of s, a page at a time. Each
// Requeue reads the whole parked range, so the pages are as large as a
// Scan may be: 1,000 parked markers take one round.
func requeueAll(ctx context.Context, s *retention.Sweep) (int, error) {
	total := 0
	for range requeueAllRounds {
		parked, err := s.Parked(ctx, retention.MaxPageSize)
		if err != nil || len(parked) == 0 {
			return total, err
		}
		ids := make([]string, len(parked))
		for i, m := range parked {
			ids[i] = m.ID
		}
		n, err := s.Requeue(ctx, ids...)
		total += n
		if err != nil || len(parked) < retention.MaxPageSize {
			return total, err
		}
	}
	return total, nil
}
