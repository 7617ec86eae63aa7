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

	// Due is how many due markers Backlog counted, at most the limit it
	// was given.
	Due int

	// More reports that there may be more due markers than Due: the limit
	// was reached, or foreign keys filled the reads Backlog allows itself.
	More bool
}

// backlogScans bounds the Scan calls of one Backlog: foreign keys in front
// of the markers cost reads, and a health check must stay cheap.
const backlogScans = 4

// Prefix returns the sweep's Config.Prefix.
func (s *Sweep) Prefix() string { return s.prefix }

// Backlog tells how far behind the sweep is, for a readiness probe or an
// alert: the oldest marker that is due and not yet cleared, how long past
// due it is, and how many markers are due, counting up to limit (1 to
// MaxPageSize; a limit out of that range is an error, so that 0 is not
// taken for "no limit"). It reads the KV through at most four Scan calls of
// at most limit+1 keys each, never the whole range, whatever the number of
// markers, and may run while a pass does.
//
// A marker waiting out a retry delay in memory (on a KV that is not a
// Putter) counts as due; one rescheduled on a Putter falls due again at its
// new time. Malformed markers and foreign keys are skipped.
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
	cutoffKey := s.dueEnd(cutoffMillis(now.Add(-s.retention)))
	from := s.lower
	for range backlogScans {
		keys, err := s.scanKV(ctx, s.kv, from, cutoffKey, limit+1)
		if err != nil {
			return Backlog{}, err
		}
		for _, key := range keys {
			ms, id, isForeign, err := parseKey(s.prefix, key)
			if isForeign || err != nil || s.checkIDBytes(key, id) != nil {
				continue
			}
			if b.Due == limit {
				b.More = true
				return b, nil
			}
			if b.Due == 0 {
				b.OldestID = string(id)
				b.OldestDue = time.UnixMilli(ms).Add(s.retention)
				b.Age = max(now.Sub(b.OldestDue), 0)
			}
			b.Due++
		}
		if len(keys) <= limit {
			return b, nil // a short page: the due range is read to its end
		}
		from = keyAfter(keys[len(keys)-1])
	}
	b.More = true
	return b, nil
}
