package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Backlog tells how far behind a sweep is: how many markers Sweep.Backlog
// found in each state, and how late the oldest it should have cleared is.
// Each marker counts in one state (see MarkerState), as Sweep.Pending lists
// it; markers not due yet count in none. The zero value means nothing is
// due, retrying, held or parked.
type Backlog struct {
	// OldestID is the id of the oldest entity past its due time that the
	// sweep has not cleared though it may: a due marker or a retrying one
	// (held and parked markers wait on purpose and are left out), and
	// OldestDue when it fell due (its marker time plus Retention). Empty
	// and zero when there is none.
	OldestID  string
	OldestDue time.Time

	// Age is how long past due that entity was when Backlog read the
	// clock: how far behind the sweep is, the figure to alert on. Zero when
	// there is none.
	Age time.Duration

	// Due is how many markers are due (StateDue): clearable now, so that
	// the next pass clears them. At most the limit it was given. Retrying,
	// held and parked markers count apart, never as due.
	Due int

	// Retrying is how many markers wait in the retry range after a failed
	// clear (StateRetrying, see Config.RetryDelay), at most the limit.
	Retrying int

	// RetryingAge is how long past due the oldest retrying marker's entity
	// was: the figure to alert on for stuck ids. Zero when none is
	// retrying. When More is set, the oldest may be among those not read.
	RetryingAge time.Duration

	// Held is how many markers wait for a hold's end (StateHeld, see Hold),
	// at most the limit. A held marker is not late: it does not count in
	// Age, and counts as due once its hold ends. A deadline of its own not
	// reached yet (see DeadlineKey) is not due yet, and counts in none.
	Held int

	// Parked is how many markers are parked after Config.MaxAttempts failed
	// clears (StateParked): they wait for a Sweep.Requeue and are tried by
	// no pass until then. At most the limit; they do not count in Age.
	Parked int

	// More reports that there may be more markers than Due, Retrying,
	// Held or Parked: a limit was reached, or foreign keys filled the reads
	// Backlog allows itself.
	More bool
}

// backlogScans bounds the Scan calls of one Backlog: foreign keys in front
// of the markers cost reads, and a health check must stay cheap.
const backlogScans = 4

// Prefix returns the sweep's Config.Prefix.
func (s *Sweep) Prefix() string { return s.prefix }

// Backlog tells how far behind the sweep is, for a readiness probe or an
// alert, counting markers up to limit (1 to MaxPageSize). It reads each of
// the three ranges through at most four Scan calls of at most limit+1 keys,
// and may run while a pass does. A retry delay kept in memory (on a KV
// that is no Mover) counts as due. Malformed markers and foreign keys are
// skipped. See docs/operating.md.
func (s *Sweep) Backlog(ctx context.Context, limit int) (Backlog, error) {
	var b Backlog
	if err := s.inspectable(ctx, "Backlog", limit); err != nil {
		return b, err
	}
	now := s.clock.Now()
	more, err := s.readRanges(ctx, now, limit, func(m PendingMarker) bool {
		late := m.Due.Before(now) // not when a Retention raised since says not yet
		switch m.State {
		case StateParked:
			b.Parked++
			return true
		case StateHeld:
			b.Held++
			return true
		case StateRetrying:
			b.Retrying++
			if late {
				b.RetryingAge = max(b.RetryingAge, now.Sub(m.Due))
			}
		case StateDue:
			b.Due++
		default:
			return false // not due yet: a deadline ahead, or a Retention raised since
		}
		if late && (b.OldestID == "" || m.Due.Before(b.OldestDue)) {
			b.OldestID, b.OldestDue, b.Age = m.ID, m.Due, now.Sub(m.Due)
		}
		return true
	})
	if err != nil {
		return Backlog{}, err
	}
	b.More = more
	return b, nil
}

// inspectable checks a call of Backlog, Pending or Parked (named what) before it reads.
func (s *Sweep) inspectable(ctx context.Context, what string, limit int) error {
	if err := s.configured(what); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if limit < 1 || limit > MaxPageSize {
		return fmt.Errorf("retention: %s's limit must be 1 to %d, got %d", what, MaxPageSize, limit)
	}
	return nil
}

// readRanges passes each well-formed marker of the three ranges to visit,
// with its state at now (stateWaiting for one not due yet), and reports
// whether any may hold more than read; visit reports whether it counted the
// marker. Backlog and Pending go by these states alone, so that a count and
// a list never disagree on what a marker is.
func (s *Sweep) readRanges(ctx context.Context, now time.Time, limit int, visit func(PendingMarker) bool) (more bool, err error) {
	cutoffKey := s.dueEnd(cutoffMillis(now.Add(-s.retention)))
	more, err = s.backlogRange(ctx, s.lower, cutoffKey, limit, func(key []byte) bool {
		ms, id, _, err := parseKey(s.prefix, key)
		if err != nil || s.checkIDBytes(key, id) != nil {
			return false
		}
		return visit(PendingMarker{ID: string(id), Due: time.UnixMilli(ms).Add(s.retention), State: StateDue})
	})
	for _, infix := range []byte{retryInfix, parkedInfix} {
		if err != nil {
			return false, err
		}
		lower, upper := infixRange(s.prefix, infix)
		var m bool
		m, err = s.backlogRange(ctx, lower, upper, limit, func(key []byte) bool {
			k, _, err := parseRetryKey(s.prefix, infix, key)
			if err != nil || s.checkIDBytes(key, k.id) != nil {
				return false
			}
			d := PendingMarker{ID: string(k.id), Attempts: k.attempts, Due: time.UnixMilli(k.finished), State: StateParked}
			if k.kind&keyDeadline == 0 {
				d.Due = d.Due.Add(s.retention) // a hold's end puts off only the clear
			}
			if infix == retryInfix {
				d.State = k.state(now)
				if d.State == StateDue && !d.Due.Before(now) {
					d.State = stateWaiting // its hold ended, but a Retention raised since says not yet
				}
				if next := time.UnixMilli(k.at); next.After(now) {
					d.Next = next
				}
			}
			return visit(d)
		})
		more = more || m
	}
	return more, err
}

// backlogRange reads [from, end) for Backlog, passing each key to count
// until limit keys counted. It reports whether there may be more.
func (s *Sweep) backlogRange(ctx context.Context, from, end []byte, limit int, count func([]byte) bool) (more bool, err error) {
	n := 0
	for range backlogScans {
		keys, err := s.scanKV(ctx, s.kv, from, end, limit+1)
		if err != nil {
			return false, err
		}
		for _, key := range keys {
			if n == limit {
				return true, nil
			}
			if count(key) {
				n++
			}
		}
		if len(keys) <= limit {
			return false, nil // a short page: the range is read to its end
		}
		from = keyAfter(keys[len(keys)-1])
	}
	return true, nil
}

// MarkerState is where a marker the sweep has not cleared stands: each
// marker Sweep.Pending lists, and Backlog counts, is in exactly one.
type MarkerState uint8

const (
	// StateDue is a marker that is due: clearable now, so that the next
	// pass clears it. Its entity is past its due time, and no failure,
	// hold or parking keeps it (a hold that ended, or a deadline of its own
	// that came, makes a marker due).
	StateDue MarkerState = iota + 1
	// StateRetrying is a marker whose clear failed, tried again at its
	// retry time (PendingMarker.Next; the next pass once that came).
	StateRetrying
	// StateHeld is a marker whose clear returned Hold, waiting for the
	// hold's end (PendingMarker.Next). It is not late: it is due when the
	// hold ends.
	StateHeld
	// StateParked is a marker parked after Config.MaxAttempts failed
	// clears. No pass tries it: it waits for a Sweep.Requeue.
	StateParked

	// stateWaiting is a marker not due yet: a deadline of its own ahead,
	// or a hold over under a Retention raised since. Pending lists none
	// and Backlog counts none, as of any marker not due yet.
	stateWaiting
)

var markerStateNames = [...]string{StateDue: "due", StateRetrying: "retrying", StateHeld: "held", StateParked: "parked"}

// String returns "due", "retrying", "held" or "parked".
func (m MarkerState) String() string {
	if int(m) < len(markerStateNames) && markerStateNames[m] != "" {
		return markerStateNames[m]
	}
	return fmt.Sprintf("MarkerState(%d)", uint8(m))
}

// PendingMarker is a marker Sweep.Pending found not cleared: due,
// retrying, held or parked.
type PendingMarker struct {
	ID string
	// Due is when the entity fell due: its finish time plus Retention, or
	// the deadline of its own (DeadlineKey). Only for StateDue does it say
	// the marker is late; a held or parked marker waits on purpose.
	Due   time.Time
	State MarkerState
	// Attempts is how many clears of it failed in a row, as its marker
	// records (retrying and parked markers); 0 otherwise.
	Attempts int
	// Next is when a pass tries it again: a retrying marker's retry time
	// or a held marker's hold's end, while ahead. Zero for due markers, a
	// retrying marker whose retry time came (the next pass tries it) and
	// parked markers (no pass tries them until a Requeue).
	Next time.Time
}

// Pending lists up to limit (1 to MaxPageSize) markers the sweep has not
// cleared though their entity fell due, for an admin page or a CLI: the
// due ones (clearable now), and those retrying, held and parked, each with
// its state, the longest past due first. It lists what Backlog counts:
// markers not due yet are left out. It reads as Backlog does, so with more
// than limit markers in a range it lists the first of each range by key
// order. A retry delay kept in memory shows as due. It may run while a
// pass does.
func (s *Sweep) Pending(ctx context.Context, limit int) ([]PendingMarker, error) {
	if err := s.inspectable(ctx, "Pending", limit); err != nil {
		return nil, err
	}
	now := s.clock.Now()
	var out []PendingMarker
	if _, err := s.readRanges(ctx, now, limit, func(m PendingMarker) bool {
		if m.State == stateWaiting {
			return false
		}
		out = append(out, m)
		return true
	}); err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b PendingMarker) int { return a.Due.Compare(b.Due) })
	return out[:min(len(out), limit)], nil
}

// ParkedMarker is a marker parked after Config.MaxAttempts failed clears:
// see Sweep.Parked.
type ParkedMarker struct {
	ID       string
	Finished time.Time // when the entity finished; it fell due Retention later
	Attempts int       // failed clears in a row before it was parked
}

// Parked lists up to limit (1 to MaxPageSize) markers the sweep parked
// after Config.MaxAttempts failed clears, oldest first, for an admin page
// or a CLI. Fix what makes their clears fail, then put them back with
// Requeue.
func (s *Sweep) Parked(ctx context.Context, limit int) ([]ParkedMarker, error) {
	if err := s.inspectable(ctx, "Parked", limit); err != nil {
		return nil, err
	}
	var out []ParkedMarker
	err := s.eachParked(ctx, func(key []byte, k retryKey) bool {
		out = append(out, ParkedMarker{ID: string(k.id), Finished: time.UnixMilli(k.finished), Attempts: k.attempts})
		return len(out) < limit
	})
	return out, err
}

// Requeue puts the parked markers of ids back (see Parked), in one Move to
// the retry range, due at once with no failed attempt counted, and wakes
// the sweep's Run (see Wake) to try them. It returns
// how many markers it moved: of concurrent calls through this Sweep, only
// the one that moved a marker counts it. An id with no parked marker is not
// an error, but no ids at all, or a KV that is no Mover, is. It reads the
// whole parked range.
//
// Two Sweeps over one store (replicas) that requeue one id at the same
// moment may both count it: a Move does not say which of its pairs it
// moved. The store is right either way: the marker is moved once.
func (s *Sweep) Requeue(ctx context.Context, ids ...string) (int, error) {
	if err := s.configured("Requeue"); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, errors.New("retention: Requeue needs the ids of the parked markers to put back")
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	mover, ok := s.kv.(Mover)
	if !ok { // only a Mover parks markers
		return 0, fmt.Errorf("retention: Requeue: the KV (%T) is no Mover", s.kv)
	}
	// A Move of a key already moved is a no-op that looks like success, so
	// each call reads the parked range after the previous one's Move: else
	// every racing call counts the marker it read.
	select {
	case s.requeuing <- struct{}{}:
		defer func() { <-s.requeuing }()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	var from, to [][]byte
	// Due for the next pass: strictly before now.
	nowMs := max(s.clock.Now().UnixMilli()-1, 0)
	err := s.eachParked(ctx, func(key []byte, k retryKey) bool {
		if want[string(k.id)] {
			from = append(from, key)
			to = append(to, appendRetryKey(nil, s.prefix, k.kind, nowMs, k.finished, 0, string(k.id)))
		}
		return true
	})
	if err != nil || len(from) == 0 {
		return 0, err
	}
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	if err := mover.Move(cctx, from, to); err != nil {
		return 0, s.storeErr(ctx, cctx, "requeue parked markers", err)
	}
	if err := s.Wake(ctx); err != nil {
		s.log.Warn("retention: requeued markers wait for the next pass: waking the sweep failed", "error", err)
	}
	return len(from), nil
}

// eachParked calls f for each well-formed parked key until f returns false.
func (s *Sweep) eachParked(ctx context.Context, f func(key []byte, k retryKey) bool) error {
	from, end := infixRange(s.prefix, parkedInfix)
	for keys, err := range s.pages(ctx, s.kv, from, end, s.pageSize, nil) {
		if err != nil {
			return err
		}
		for _, key := range keys {
			k, _, err := parseRetryKey(s.prefix, parkedInfix, key)
			if err != nil || s.checkIDBytes(key, k.id) != nil {
				continue
			}
			if !f(key, k) {
				return nil
			}
		}
	}
	return nil
}
