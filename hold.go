package retention

import (
	"errors"
	"fmt"
	"time"
)

// Hold returns the error that keeps an entity past its retention until
// until: a Config.Clear (or an entry of a BatchError, or a whole ClearBatch
// or ClearDeleter call) returns it for an entity on legal hold, under
// investigation, or kept because a customer asked. The entity is not
// cleared and its marker falls due again at until, moved in the store to
// the sweep's retry range on a KV that can write (so the hold outlives a
// restart), kept in memory on one that cannot. A hold is no failure: it
// counts in Stats.Held, not Failed; it adds no failed attempt, no backoff,
// and no Error log line. A zero until, or one already past, means "try
// again after Config.RetryDelay".
//
// The hold is asked for again at until, so keep returning Hold for as long
// as the entity is held: a hold lifted early takes effect then. A restart
// before the marker was moved (docs/policies.md says when) may ask early.
//
// Where an entity's retention differs from the others from the start, write
// its marker with a deadline of its own instead (see DeadlineKey).
func Hold(until time.Time) error { return &holdError{until: until} }

// holdError is the error of Hold.
type holdError struct{ until time.Time }

func (e *holdError) Error() string {
	if e.until.IsZero() {
		return "retention: entity is held"
	}
	return fmt.Sprintf("retention: entity is held until %s", e.until.UTC().Format(time.RFC3339Nano))
}

func (e *holdError) Is(target error) bool { return target == ErrHeld }

// heldUntil returns the time err holds an entity until (zero for "after
// RetryDelay") and whether err is a hold at all.
func heldUntil(err error) (time.Time, bool) {
	var h *holdError
	if !errors.As(err, &h) {
		return time.Time{}, false
	}
	return h.until, true
}

// outcomeOf classifies what a clear (or the entry of a BatchError for one
// id) returned: cleared on nil, live again, held, or else failed.
func outcomeOf(err error) outcome {
	if err == nil {
		return cleared // most calls: small enough to be inlined
	}
	return errOutcome(err)
}

// errOutcome is outcomeOf of an error.
func errOutcome(err error) outcome {
	switch {
	case errors.Is(err, ErrLiveAgain):
		return liveAgain
	case errors.Is(err, ErrHeld):
		return held
	}
	return failed
}

// holdKey puts off the marker old of a held id until the hold's end, as
// retry does a failed one's: it returns the held key of the retry range to
// move old to, or nil when the marker stays and the hold is kept in memory.
func (s *Sweep) holdKey(p *passState, it *item) (until time.Time, key []byte) {
	until = s.remember(it)
	untilMs := until.UnixMilli()
	if !p.writes() {
		return until, nil
	}
	// The failures before the hold go with it, so that MaxAttempts counts
	// the same whether or not the process restarts while it is held. A
	// deadline key stays one: due at its own time, until past it.
	attempts := max(int(it.attempts), s.retries.failures(it.id))
	return until, appendRetryKey(nil, s.prefix, it.kind&keyDeadline|keyHeld, untilMs, it.ms, attempts, it.id)
}

// remember records in memory the hold that the clear of it returned, and
// returns its end, in whole milliseconds: the hold's end, or RetryDelay
// from now when that is zero or past. Until the marker is moved to the
// hold's end (or on a store that cannot move it), the pass skips the id.
func (s *Sweep) remember(it *item) time.Time {
	until, _ := heldUntil(it.err)
	if now := s.clock.Now(); !until.After(now) {
		until = now.Add(s.retries.first)
	}
	untilMs, err := markerMillis(until)
	if err != nil {
		untilMs = maxMarkerMs
	}
	until = time.UnixMilli(untilMs)
	s.retries.hold(it.id, until)
	return until
}

// rememberHolds records the holds of a page the pass leaves unsettled (it
// was cancelled or failed): the next pass skips those ids until the
// holds' ends, and moves their markers there.
func (s *Sweep) rememberHolds(items []item) {
	for i := range items {
		if items[i].out == held {
			s.remember(&items[i])
		}
	}
}

// DeadlineKey returns the key of a marker for id that falls due at deleteAt
// whatever the sweep's Retention: for an entity kept longer or shorter
// than the others of its prefix (a failed run kept for a month where
// successful ones go after a day). Write it instead of the marker of
// MarkerKey, in the same transaction, with the adapters' MarkKeyTx; the
// sweep clears it at deleteAt (and deletes it, as any marker), and a later
// change of Config.Retention leaves it alone. Where whole classes of
// entities differ, a prefix per class, each with its own Sweep in one
// Group, reads better (docs/policies.md). The key lies in the sweep's retry
// range, where held markers wait (see Hold); Sweep.Due lists it once due.
func DeadlineKey(prefix string, deleteAt time.Time, id string) ([]byte, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	return deadlineKey(prefix, deleteAt, id)
}

// deadlineKey is DeadlineKey for an id checked by the caller's rule.
func deadlineKey(prefix string, deleteAt time.Time, id string) ([]byte, error) {
	if prefix == "" || idByte(prefix[len(prefix)-1]) {
		return nil, fmt.Errorf("%w: prefix %q must be non-empty and end in a separator such as '/'", ErrMalformedMarker, prefix)
	}
	ms, err := markerMillis(deleteAt)
	if err != nil {
		return nil, err
	}
	return appendRetryKey(nil, prefix, keyDeadline, ms, ms, 0, id), nil
}

// DeadlineKey is the package's DeadlineKey for the sweep's prefix, with ids
// checked by the sweep's rule (Config.ValidateID).
func (s *Sweep) DeadlineKey(deleteAt time.Time, id string) ([]byte, error) {
	if err := s.configured("DeadlineKey"); err != nil {
		return nil, err
	}
	if err := s.checkID(id); err != nil {
		return nil, err
	}
	return deadlineKey(s.prefix, deleteAt, id)
}
