package retention

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// MarkerState is where a marker Sweep.Due lists stands.
type MarkerState uint8

const (
	// StateDue is a marker past its due time that a pass clears next.
	StateDue MarkerState = iota + 1
	// StateRetrying is a marker whose clear failed, waiting for its retry.
	StateRetrying
	// StateHeld is a marker whose clear returned Hold, waiting for the
	// hold's end.
	StateHeld
	// StateParked is a marker parked after Config.MaxAttempts failed
	// clears, waiting for Sweep.Requeue.
	StateParked

	// stateWaiting is a marker with a deadline of its own not reached
	// yet: not due, so Due lists none; Backlog counts it as held.
	stateWaiting
)

// String returns "due", "retrying", "held" or "parked".
func (m MarkerState) String() string {
	switch m {
	case StateDue:
		return "due"
	case StateRetrying:
		return "retrying"
	case StateHeld:
		return "held"
	case StateParked:
		return "parked"
	}
	return fmt.Sprintf("MarkerState(%d)", uint8(m))
}

// DueMarker is a marker Sweep.Due found due and not cleared yet.
type DueMarker struct {
	ID string
	// Due is when the entity fell due: its finish time plus Retention, or
	// the deadline of its own (DeadlineKey).
	Due   time.Time
	State MarkerState
	// Attempts is how many clears of it failed in a row, as its marker
	// records (retrying and parked markers); 0 otherwise.
	Attempts int
	// Next is when a pass tries it again: a retrying marker's retry time
	// or a held marker's hold's end. Zero for due and parked markers.
	Next time.Time
}

// Due lists up to limit (1 to MaxPageSize) markers that are due and not
// cleared yet, the longest overdue first, with their state: due (a pass
// clears it next), retrying, held or parked. It is for an admin page or a
// CLI: what the sweep will delete, what is stuck and why. It reads the
// expired range and the retry and parked ranges, each through at most four
// Scan calls of at most limit+1 keys, so with more than limit markers in
// a range the list holds the first of each range by key order: the oldest
// due ones, the earliest retries, the oldest parked. A marker with a
// deadline of its own not reached yet is not due and is not listed. It
// reads the store only: a retry delay kept in memory (on a KV that cannot
// write) shows as due. It may run while a pass does.
func (s *Sweep) Due(ctx context.Context, limit int) ([]DueMarker, error) {
	if err := s.configured("Due"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 || limit > MaxPageSize {
		return nil, fmt.Errorf("retention: Due's limit must be 1 to %d, got %d", MaxPageSize, limit)
	}
	now := s.clock.Now()
	var out []DueMarker
	cutoffKey := s.dueEnd(cutoffMillis(now.Add(-s.retention)))
	if _, err := s.backlogRange(ctx, s.lower, cutoffKey, limit, func(key []byte) bool {
		ms, id, isForeign, err := parseKey(s.prefix, key)
		if isForeign || err != nil || s.checkIDBytes(key, id) != nil {
			return false
		}
		out = append(out, DueMarker{ID: string(id), Due: time.UnixMilli(ms).Add(s.retention), State: StateDue})
		return true
	}); err != nil {
		return nil, err
	}
	for _, infix := range []byte{retryInfix, parkedInfix} {
		lower, upper := infixRange(s.prefix, infix)
		if _, err := s.backlogRange(ctx, lower, upper, limit, func(key []byte) bool {
			k, isForeign, err := parseRetryKey(s.prefix, infix, key)
			if isForeign || err != nil || s.checkIDBytes(key, k.id) != nil {
				return false
			}
			m := DueMarker{ID: string(k.id), Attempts: k.attempts}
			if infix == parkedInfix {
				m.Due, m.State = s.keyDue(k), StateParked
			} else {
				m.Due, m.State, m.Next = s.retryState(k, now)
			}
			if m.Due.After(now) {
				return false // not due: a deadline ahead, or a Retention raised since
			}
			out = append(out, m)
			return true
		}); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(out, func(a, b DueMarker) int { return a.Due.Compare(b.Due) })
	return out[:min(len(out), limit)], nil
}

// retryState tells what a key k of the retry range stands for at now: when
// its entity fell (or falls) due, its state (see retryKey.state), and when
// a pass tries it next (zero when that is the next pass). Retries and holds
// fall due at their finish time plus Retention (a hold's end does not make
// its entity due any later: it only puts the clear off); a deadline key at
// its deadline, whatever the Retention.
func (s *Sweep) retryState(k retryKey, now time.Time) (due time.Time, state MarkerState, next time.Time) {
	due, state = s.keyDue(k), k.state(now)
	if next = time.UnixMilli(k.at); !next.After(now) {
		next = time.Time{}
	}
	return due, state, next
}

// keyDue returns when the entity of a retry- or parked-range key fell (or
// falls) due: its finish time plus Retention, or a deadline key's own
// deadline, whatever the Retention.
func (s *Sweep) keyDue(k retryKey) time.Time {
	if k.kind&keyDeadline != 0 {
		return time.UnixMilli(k.finished)
	}
	return time.UnixMilli(k.finished).Add(s.retention)
}
