package retentionui

import (
	"net/http"
	"net/url"

	"github.com/marksweep/retention"
)

// sweepPage is a SweepPage with what only the HTML shows.
type sweepPage struct {
	SweepPage
	Requeued    int
	WasRequeued bool
	Released    int
	WasReleased bool
	Wake        string // when the sweep tries what was requeued or released (see wakeNote)
	Retention   bool
}

func (h *Handler) serveSweep(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s, err := h.sweepOf(q)
	if err != nil {
		h.fail(w, r, err, statusOf(err))
		return
	}
	ctx, cancel := h.storeCtx(r)
	defer cancel()
	now := h.opts.Clock.Now()
	p := sweepPage{SweepPage: SweepPage{
		Now: now.UTC(), ReadOnly: h.opts.ReadOnly, Limit: h.opts.Limit, Prefix: s.Prefix(),
		Due: []Marker{}, Retrying: []Marker{}, Held: []Marker{}, Parked: []Marker{},
	}}
	pending, err := s.Pending(ctx, h.opts.Limit)
	if err != nil {
		h.fail(w, r, err, http.StatusInternalServerError)
		return
	}
	for _, m := range pending {
		pm := Marker{ID: m.ID, State: m.State.String(), Due: timePtr(m.Due), Attempts: m.Attempts, Next: timePtr(m.Next)}
		switch m.State {
		case retention.StateDue:
			overdue := msOf(max(now.Sub(m.Due), 0))
			pm.OverdueMs = &overdue
			p.Due = append(p.Due, pm)
		case retention.StateRetrying:
			p.Retrying = append(p.Retrying, pm)
		case retention.StateHeld:
			p.Held = append(p.Held, pm)
		}
		// Parked markers are listed by Sweep.Parked below, with their
		// finish time.
	}
	p.PendingCut = len(pending) == h.opts.Limit
	parked, err := s.Parked(ctx, h.opts.Limit)
	if err != nil {
		h.fail(w, r, err, http.StatusInternalServerError)
		return
	}
	ret := h.opts.Details[s.Prefix()].Retention
	p.Retention = ret > 0
	for _, m := range parked {
		pm := Marker{ID: m.ID, State: retention.StateParked.String(), Finished: timePtr(m.Finished), Attempts: m.Attempts}
		if ret > 0 {
			pm.Due = timePtr(m.Finished.Add(ret))
		}
		p.Parked = append(p.Parked, pm)
	}
	p.ParkedCut = len(parked) == h.opts.Limit
	p.Requeued, p.WasRequeued = countOf(q, "requeued")
	p.Released, p.WasReleased = countOf(q, "released")
	if p.WasRequeued || p.WasReleased {
		_, p.Wake = wakeNote(h.fleet(ctx, s, now), now)
	}
	h.answer(w, r, "sweep", p.SweepPage, p)
}

// sweepURL is the relative URL of prefix's page, with extra parameters.
func sweepURL(prefix string, extra url.Values) string {
	v := url.Values{"prefix": {prefix}}
	for k, vs := range extra {
		v[k] = vs
	}
	return "sweep?" + v.Encode()
}
