package retention

import (
	"errors"
	"fmt"
	"time"
)

// Hold returns the error that keeps an entity past its retention until
// until: a Config.Clear (or an entry of a BatchError, or a whole ClearBatch
// or ClearDeleter call) returns it for an entity on legal hold, say. The
// entity is not cleared and its marker falls due again at until (a zero or
// past until: after Config.RetryDelay); a hold is no failure (Stats.Held).
// It is asked for again at until, so keep returning Hold for as long as
// the entity is held. See docs/policies.md.
func Hold(until time.Time) error { return &holdError{until: until} }

type holdError struct{ until time.Time }

func (e *holdError) Error() string {
	if e.until.IsZero() {
		return "retention: entity is held"
	}
	return fmt.Sprintf("retention: entity is held until %s", e.until.UTC().Format(time.RFC3339Nano))
}

func (e *holdError) Is(target error) bool { return target == ErrHeld }

// outcomeOf classifies what a clear (or the entry of a BatchError for one
// id) returned: cleared on nil, live again, held, or else failed.
func outcomeOf(err error) outcome {
	if err == nil {
		return cleared // most calls: small enough to be inlined
	}
	return errOutcome(err)
}

func errOutcome(err error) outcome {
	switch {
	case errors.Is(err, ErrLiveAgain):
		return liveAgain
	case errors.Is(err, ErrHeld):
		return held
	}
	return failed
}

// holdKey returns the end of the hold of it and the held key of the retry
// range to move its marker to, or nil when the hold is kept in memory.
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

// remember records in memory the hold the clear of it returned, and returns
// its end in whole ms: RetryDelay from now when it is zero or past.
func (s *Sweep) remember(it *item) time.Time {
	var until time.Time
	if h := (*holdError)(nil); errors.As(it.err, &h) { // else ErrHeld itself
		until = h.until
	}
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

// rememberHolds records the holds of a page the pass leaves unsettled, for
// the next pass to skip their ids and move their markers.
func (s *Sweep) rememberHolds(items []item) {
	for i := range items {
		if items[i].out == held {
			s.remember(&items[i])
		}
	}
}

// DeadlineKey returns the key of a marker for id that falls due at deleteAt
// whatever the sweep's Retention, for an entity kept longer or shorter than
// the others of its prefix. Write it instead of the key of MarkerKey, in
// the same transaction. It lies in the sweep's retry range. See
// docs/policies.md, "A deadline of its own".
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
