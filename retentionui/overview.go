package retentionui

import (
	"fmt"
	"net/http"
	"time"

	"github.com/marksweep/retention"
)

func (h *Handler) serveOverview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.storeCtx(r)
	defer cancel()
	now := h.opts.Clock.Now()
	o := Overview{Now: now.UTC(), ReadOnly: h.opts.ReadOnly, Limit: h.opts.Limit}
	// One sweep after another: the page costs the store one reader at a
	// time, however many sweeps there are.
	for _, s := range h.opts.Sweeps {
		b, err := s.Backlog(ctx, h.opts.Limit)
		o.Sweeps = append(o.Sweeps, h.status(s.Prefix(), b, err, h.fleet(ctx, s, now)))
	}
	h.answer(w, r, "overview", o, o)
}

// status builds a sweep's line of the overview from its backlog (or the
// error reading it), and what the fleet shares in its store (fl), or else
// what the Recorder saw.
func (h *Handler) status(prefix string, b retention.Backlog, err error, fl *FleetStatus) SweepStatus {
	st := SweepStatus{Prefix: prefix, Lease: "unknown"}
	if d, ok := h.opts.Details[prefix]; ok && d.Retention > 0 {
		ms := msOf(d.Retention)
		st.RetentionMs = &ms
	}
	rec, seen := h.opts.Recorder.get(prefix)
	if seen && rec.hasPass {
		st.LastPass = &PassStatus{
			At: rec.passAt.UTC(), Passes: rec.passes, Error: rec.passErr,
			Cleared: rec.pass.Cleared, Failed: rec.pass.Failed, Retried: rec.pass.Retried,
			Parked: rec.pass.Parked, Held: rec.pass.Held, Malformed: rec.pass.Malformed,
			Scanned: rec.pass.Scanned, DurationMs: msOf(rec.pass.Duration), MaxLagMs: msOf(rec.pass.MaxLag),
		}
	}
	if seen && rec.hasLease {
		st.Lease = rec.lease.String()
	}
	if seen && rec.hasLag {
		ms := msOf(rec.lag)
		st.LagMs = &ms
	}
	if fl != nil {
		applyFleet(&st, fl)
	}
	if err != nil {
		st.State, st.Error = StateError, err.Error()
		st.Summary = "The backlog could not be read: " + err.Error()
		return st
	}
	st.Backlog = &BacklogStatus{
		Due: b.Due, OldestID: b.OldestID, OldestDue: timePtr(b.OldestDue), AgeMs: msOf(b.Age),
		Retrying: b.Retrying, RetryingAgeMs: msOf(b.RetryingAge), Held: b.Held, Parked: b.Parked, More: b.More,
	}
	st.State, st.Summary = h.judge(b, st.LastPass)
	return st
}

// judge says in a word and a sentence whether anything is wrong: the worst
// of a failed last pass, parked markers, retries and a backlog older than
// Options.Behind.
func (h *Handler) judge(b retention.Backlog, last *PassStatus) (state, summary string) {
	atLeast := ""
	if b.More {
		atLeast = "at least "
	}
	switch {
	case last != nil && last.Error != "":
		return StateError, "The last pass failed: " + last.Error
	case b.Parked > 0:
		return StateParked, fmt.Sprintf("%s%d parked after failing every attempt: they wait for a Requeue once the cause is fixed.", atLeast, b.Parked)
	case b.Retrying > 0:
		return StateRetrying, fmt.Sprintf("%s%d failed to clear and will be tried again; the oldest fell due %s ago.", atLeast, b.Retrying, roundAge(b.RetryingAge))
	case b.Due > 0 && b.Age > h.opts.Behind:
		return StateBehind, fmt.Sprintf("Behind: %s%d due, the oldest %s past due (more than %s).", atLeast, b.Due, roundAge(b.Age), h.opts.Behind)
	case b.Due > 0:
		return StateOK, fmt.Sprintf("Keeping up: %s%d due, the oldest %s past due.", atLeast, b.Due, roundAge(b.Age))
	}
	return StateOK, "Keeping up: nothing is due."
}

// roundAge rounds d for a person: to the second from a second up, to the
// millisecond below.
func roundAge(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}
