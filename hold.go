package retention

import (
	"context"
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

// rememberWaits records the holds of a page the pass leaves unsettled, for
// the next pass to skip their ids and move their markers, and notes that
// these markers and the deferred ones stay where they are.
func (s *Sweep) rememberWaits(p *passState, items []item) {
	for i := range items {
		switch it := &items[i]; it.out {
		case held:
			s.stays(p, it.id, s.remember(it))
		case deferred:
			s.stays(p, it.id, s.retries.due(it.id))
		}
	}
}

// ReleaseHolds lifts the holds of ids before their ends (see Hold): it
// moves each held marker of those ids (StateHeld, as Pending lists them) to
// a key due at once, in one Move, keeping its finish time (or its deadline,
// see DeadlineKey) and its failed attempts, and wakes the sweep's Run (see
// Wake) to clear them. The pass that finds such a marker due asks Clear
// again, on whichever replica holds the lease, whatever its memory says of
// the hold: a Clear that still answers Hold holds it again, until the end
// it returns now.
//
// It returns how many markers it moved: of concurrent calls through this
// Sweep (and its Requeue calls), only the one that moved a marker counts it.
// An id with no held marker is not an error, but no ids at all, an id the
// sweep's rule refuses (an error matching ErrInvalidID), or a KV that is no
// Mover (its holds are kept in memory), is. It reads the retry range from
// now on: the held markers, and the retrying ones and the deadlines of
// their own not reached yet.
//
// Two Sweeps over one store (replicas) that release one id at the same
// moment may both count it, as for Requeue; the marker is moved once.
func (s *Sweep) ReleaseHolds(ctx context.Context, ids ...string) (int, error) {
	if err := s.configured("ReleaseHolds"); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, errors.New("retention: ReleaseHolds needs the ids of the held markers to release")
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		if err := s.checkID(id); err != nil {
			return 0, fmt.Errorf("retention: ReleaseHolds: id %q: %w", id, err)
		}
		want[id] = true
	}
	mover, ok := s.kv.(Mover)
	if !ok { // only a Mover keeps holds in the store
		return 0, fmt.Errorf("retention: ReleaseHolds: the KV (%T) is no Mover: its holds are kept in the memory of the process that met them", s.kv)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// As Requeue: each call reads the held keys after the previous one's
	// Move, else every racing call counts the marker it read.
	select {
	case s.requeuing <- struct{}{}:
		defer func() { <-s.requeuing }()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	now := s.clock.Now()
	// A held key falls due at its time: those not after now are due
	// already, and the next pass takes them.
	from := appendTimestamp(append([]byte(s.prefix), retryInfix), uint64(max(now.UnixMilli()+1, 0)))
	nowMs := max(now.UnixMilli()-1, 0) // due for the next pass: strictly before now
	var moveFrom, moveTo [][]byte
	for keys, err := range s.pages(ctx, s.kv, from, s.retryUpper, s.pageSize, nil) {
		if err != nil {
			return 0, err
		}
		for _, key := range keys {
			k, _, err := parseRetryKey(s.prefix, retryInfix, key)
			if err != nil || k.kind&keyHeld == 0 || !want[string(k.id)] || s.checkIDBytes(key, k.id) != nil {
				continue
			}
			// Still a held key, due at once: its lag counts from now, as
			// of a hold that ended (see retryLag), not from its finish.
			moveFrom = append(moveFrom, key)
			moveTo = append(moveTo, appendRetryKey(nil, s.prefix, k.kind, nowMs, k.finished, k.attempts, string(k.id)))
		}
	}
	if len(moveFrom) == 0 {
		return 0, nil
	}
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	if err := mover.Move(cctx, moveFrom, moveTo); err != nil {
		return 0, s.storeErr(ctx, cctx, "release held markers", err)
	}
	if err := s.Wake(ctx); err != nil {
		s.log.Warn("retention: released markers wait for the next pass: waking the sweep failed", "error", err)
	}
	return len(moveFrom), nil
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
