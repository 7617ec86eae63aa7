package retentionui

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/marksweep/retention"
)

// epoch is the marker time checkID builds keys with: any valid time would
// do, as only the id is checked.
var epoch = time.UnixMilli(0)

// lookupPages is how many pages of Options.Limit keys a look-up reads of
// the markers not yet due (with Detail.KV).
const lookupPages = 10

func (h *Handler) serveWhy(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s, err := h.sweepOf(q)
	if err != nil {
		h.fail(w, r, err, statusOf(err))
		return
	}
	id, err := idOf(s, q)
	if err != nil {
		h.fail(w, r, err, statusOf(err))
		return
	}
	ctx, cancel := h.storeCtx(r)
	defer cancel()
	why, err := h.lookup(ctx, s, id)
	if err != nil {
		h.fail(w, r, err, http.StatusInternalServerError)
		return
	}
	h.answer(w, r, "why", why, why)
}

// lookup finds id's marker in what a bounded read can see: the markers not
// cleared (Sweep.Pending: due, retrying, held and parked), the parked list
// and, with Detail.KV, the first markers not due yet.
func (h *Handler) lookup(ctx context.Context, s *retention.Sweep, id string) (Why, error) {
	now := h.opts.Clock.Now()
	limit := h.opts.Limit
	w := Why{Now: now.UTC(), Prefix: s.Prefix(), ID: id, State: WhyNotFound}
	pending, err := s.Pending(ctx, limit)
	if err != nil {
		return w, err
	}
	due := 0
	for _, m := range pending {
		if m.State == retention.StateDue {
			due++
		}
	}
	for _, m := range pending {
		if m.ID == id {
			w.State, w.Due, w.Attempts, w.Next = m.State.String(), timePtr(m.Due), m.Attempts, timePtr(m.Next)
			w.Answer = answerPending(m, now)
			w.Searched = fmt.Sprintf("found among the %d markers not cleared (due, retrying, held or parked)", len(pending))
			return w, nil
		}
	}
	parked, err := s.Parked(ctx, limit)
	if err != nil {
		return w, err
	}
	ret := h.opts.Details[s.Prefix()]
	for _, m := range parked {
		if m.ID == id {
			w.State, w.Finished, w.Attempts = retention.StateParked.String(), timePtr(m.Finished), m.Attempts
			if ret.Retention > 0 {
				w.Due = timePtr(m.Finished.Add(ret.Retention))
			}
			w.Answer = parkedAnswer(m.Attempts)
			w.Searched = fmt.Sprintf("found among the %d parked markers", len(parked))
			return w, nil
		}
	}
	searched := fmt.Sprintf("%s not cleared and %s parked", counted(len(pending), limit), counted(len(parked), limit))
	w.Searched = searched + "; the markers not due yet were not searched (no Detail.KV given)"
	w.Answer = "No marker of this id was found among those searched: it was cleared already, was never marked, or is not due yet."
	if ret.KV == nil {
		return w, nil
	}
	finished, read, all, err := findWaiting(ctx, ret.KV, s.Prefix(), id, limit)
	if err != nil {
		return w, err
	}
	if all {
		w.Searched = fmt.Sprintf("%s; all %d markers not cleared yet", searched, read)
	} else {
		w.Searched = fmt.Sprintf("%s; the oldest %d markers not cleared yet (an id beyond them is not found)", searched, read)
	}
	if finished.IsZero() {
		return w, nil
	}
	w.Finished = timePtr(finished)
	if ret.Retention <= 0 {
		w.State = WhyWaiting
		w.Answer = fmt.Sprintf("Marked as finished at %s; it falls due one retention later (the retention was not given to the console).", finished.UTC().Format(time.RFC3339))
		return w, nil
	}
	dueAt := finished.Add(ret.Retention)
	w.Due = timePtr(dueAt)
	if dueAt.After(now) {
		w.State = WhyWaiting
		w.Answer = fmt.Sprintf("Not due yet: it falls due at %s, in %s, when its retention ends; a pass clears it then.", dueAt.UTC().Format(time.RFC3339), roundAge(dueAt.Sub(now)))
		return w, nil
	}
	w.State = retention.StateDue.String()
	w.Answer = fmt.Sprintf("Due since %s (%s ago), behind the %d markers listed as due: a pass clears it after them.", dueAt.UTC().Format(time.RFC3339), roundAge(now.Sub(dueAt)), due)
	return w, nil
}

// parkedAnswer says why a parked marker is not cleared.
func parkedAnswer(attempts int) string {
	return fmt.Sprintf("Parked after %d failed clears: it waits for a requeue, and no pass tries it until then. Fix what makes its clear fail, then requeue it.", attempts)
}

// counted says "the N markers" or, at the limit, "the first N markers".
func counted(n, limit int) string {
	if n == limit {
		return fmt.Sprintf("the first %d markers", n)
	}
	return fmt.Sprintf("the %d markers", n)
}

// answerPending says why a marker Sweep.Pending lists is not cleared yet.
func answerPending(m retention.PendingMarker, now time.Time) string {
	switch m.State {
	case retention.StateRetrying:
		if m.Next.IsZero() {
			return fmt.Sprintf("Put back for a retry (its clear failed %d times before): the next pass tries it.", m.Attempts)
		}
		return fmt.Sprintf("Its clear failed %d times; it is tried again at %s, in %s.", m.Attempts, m.Next.UTC().Format(time.RFC3339), roundAge(max(m.Next.Sub(now), 0)))
	case retention.StateHeld:
		return fmt.Sprintf("Held, not late: its clear asked to wait until %s (in %s); it is due then, and cleared after that.", m.Next.UTC().Format(time.RFC3339), roundAge(max(m.Next.Sub(now), 0)))
	case retention.StateParked:
		return parkedAnswer(m.Attempts)
	}
	return fmt.Sprintf("Due since %s (%s ago): the next pass clears it.", m.Due.UTC().Format(time.RFC3339), roundAge(max(now.Sub(m.Due), 0)))
}

// findWaiting reads prefix's markers oldest first, up to lookupPages pages
// of limit keys, for one of id. It returns the time of the first found
// (zero when none), how many keys it read, and whether that was all.
func findWaiting(ctx context.Context, kv retention.KV, prefix, id string, limit int) (finished time.Time, read int, all bool, err error) {
	// Marker keys are the prefix and 20 digits: the retry and parked
	// ranges (a letter after the prefix) and foreign keys lie outside.
	from, end := []byte(prefix+"0"), []byte(prefix+":")
	for range lookupPages {
		keys, err := kv.Scan(ctx, from, end, limit)
		if err != nil {
			return time.Time{}, read, false, fmt.Errorf("retentionui: look-up: %w", err)
		}
		read += len(keys)
		for _, key := range keys {
			if t, got, err := retention.ParseMarkerKey(prefix, key); err == nil && string(got) == id {
				return t, read, false, nil
			}
		}
		if len(keys) < limit {
			return time.Time{}, read, true, nil
		}
		from = append(keys[len(keys)-1], 0)
	}
	return time.Time{}, read, false, nil
}
