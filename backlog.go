package retention

import (
	"context"
	"fmt"
	"time"
)

// Backlog tells how far behind a sweep is: what Sweep.Backlog found due and
// not yet cleared. The zero value means nothing is due.
type Backlog struct {
	// OldestID is the id of the oldest marker that is due and not cleared
	// yet, and OldestDue when it fell due (its marker time plus Retention).
	// Empty and zero when none is due.
	OldestID  string
	OldestDue time.Time

	// Age is how long past due that marker was when Backlog read the
	// clock: the figure to alert on. Zero when none is due.
	Age time.Duration

	// Due is how many due markers Backlog counted that were not tried yet,
	// at most the limit it was given.
	Due int

	// Retrying is how many markers wait in the retry range: their clear
	// failed and they are tried again later (see Config.RetryDelay). Their
	// entities are due already, so the oldest of them counts for OldestID,
	// OldestDue and Age like the others: an id that keeps failing makes
	// the backlog grow older. At most the limit.
	Retrying int

	// RetryingAge is how long past due the oldest of the retrying markers'
	// entities was when Backlog read the clock: the figure to alert on for
	// stuck ids. Zero when none is retrying. The retry range is in the
	// order of the next retry, and an id that keeps failing waits longest:
	// when More is set, the oldest may be among the markers not read.
	RetryingAge time.Duration

	// Held is how many markers wait for a hold's end (see Hold) or for a
	// deadline of their own (see DeadlineKey), at most the limit: they are
	// not late, and do not count in Age. One whose time came counts as
	// due, from that time.
	Held int

	// Parked is how many markers are parked after Config.MaxAttempts failed
	// clears, at most the limit: they are never cleared until requeued
	// (Sweep.Requeue), and do not count in Age.
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
// alert: the oldest marker that is due and not yet cleared, how long past
// due it is, and how many markers are due, retrying and parked, counting
// each up to limit (1 to MaxPageSize; a limit out of that range is an
// error, so that 0 is not taken for "no limit"). It reads each of the
// three ranges through at most four Scan calls of at most limit+1 keys
// each, never a whole range, whatever the number of markers, and may run
// while a pass does.
//
// A marker waiting out a retry delay in memory (on a KV that cannot write)
// counts as due; one rescheduled by the sweep counts as retrying, from
// its entity's due time. Malformed markers and foreign keys are skipped.
func (s *Sweep) Backlog(ctx context.Context, limit int) (Backlog, error) {
	var b Backlog
	if err := s.configured("Backlog"); err != nil {
		return b, err
	}
	if err := ctx.Err(); err != nil {
		return b, err
	}
	if limit < 1 || limit > MaxPageSize {
		return b, fmt.Errorf("retention: Backlog's limit must be 1 to %d, got %d", MaxPageSize, limit)
	}
	now := s.clock.Now()
	oldest := func(due time.Time, id []byte) {
		if b.OldestID == "" || due.Before(b.OldestDue) {
			b.OldestID, b.OldestDue, b.Age = string(id), due, max(now.Sub(due), 0)
		}
	}
	cutoffKey := s.dueEnd(cutoffMillis(now.Add(-s.retention)))
	more, err := s.backlogRange(ctx, s.lower, cutoffKey, limit, func(key []byte) bool {
		ms, id, isForeign, err := parseKey(s.prefix, key)
		if isForeign || err != nil || s.checkIDBytes(key, id) != nil {
			return false
		}
		if b.Due == 0 {
			oldest(time.UnixMilli(ms).Add(s.retention), id)
		}
		b.Due++
		return true
	})
	if err != nil {
		return Backlog{}, err
	}
	b.More = b.More || more
	for _, r := range []struct{ infix byte }{{retryInfix}, {parkedInfix}} {
		lower, upper := infixRange(s.prefix, r.infix)
		more, err := s.backlogRange(ctx, lower, upper, limit, func(key []byte) bool {
			k, isForeign, err := parseRetryKey(s.prefix, r.infix, key)
			if isForeign || err != nil || s.checkIDBytes(key, k.id) != nil {
				return false
			}
			if r.infix == parkedInfix {
				b.Parked++
				return true
			}
			due, state, _ := s.retryState(k, now)
			switch {
			case state == StateRetrying:
				if due.Before(now) {
					// Due, unless a Retention raised since it failed says not yet.
					oldest(due, k.id)
					b.RetryingAge = max(b.RetryingAge, now.Sub(due))
				}
				b.Retrying++
			case state == StateDue && due.Before(now):
				oldest(due, k.id)
				b.Due++
			default:
				b.Held++ // a hold not over, or a deadline not reached
			}
			return true
		})
		if err != nil {
			return Backlog{}, err
		}
		b.More = b.More || more
	}
	return b, nil
}

// backlogRange reads [from, end) for Backlog, passing each key to count,
// which reports whether it counted it, until limit keys counted. It
// reports whether there may be more.
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
