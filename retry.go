package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// retries remembers, per id, how often its Clear failed in a row and when
// it may be tried again, in memory; on a Mover the marker keeps the count
// of failures too. Passes are serialised, so it needs no lock. Its readers
// skip an empty map: a lookup costs a call even then, per marker.
type retries struct {
	first, most time.Duration
	byID        map[string]retry
	passes      int
	// inRange holds the ids that wait while a marker of theirs that the
	// sweep read may still be in the markers' range (held or failed and not
	// moved, the Move failed, or the outcome unknown), and until when: a
	// run would take that marker (see runsWait). An id whose marker moved
	// to the retry range leaves it.
	inRange map[string]time.Time
	// latest is the latest time of inRange, or later when stale: an id
	// that held it left, and the next runsWait before it reads inRange.
	latest time.Time
	stale  bool
}

type retry struct {
	failures  int // failed clears of the id itself, in a row
	putOffs   int // times it was put off untried, the dependency down
	notBefore time.Time
	held      bool // notBefore is a hold's end, not a retry delay
	// stored says the held marker was moved to its held key, due at
	// notBefore: the store has the hold, and what the store says wins
	// (see waiting).
	stored bool
}

func newRetries(first, most time.Duration) retries {
	return retries{first: first, most: most}
}

// delay is the wait after the n-th failure in a row: the first delay
// doubled n-1 times, plus up to a fifth of that at random; at the largest
// delay, up to a fifth below it, so that markers that failed together do
// not keep coming back together. It saturates rather than overflows.
func (r *retries) delay(n int) time.Duration {
	d := r.first
	for i := 1; i < n && d < r.most; i++ {
		d *= 2 // r.most < maxDuration/2 is not guaranteed, but d < r.most is
		if d <= 0 {
			d = r.most
		}
	}
	d = min(d, r.most)
	if j := rand.N(d/5 + 1); d <= r.most-j {
		return d + j
	} else {
		return r.most - j
	}
}

// failed records one more failure of id at now, after at least before (as
// its marker records): its own, or else a put-off in an outage, which
// neither sends the id alone nor parks it. It returns the own failures in
// a row and when the id may be tried again.
func (r *retries) failed(id string, now time.Time, before int, own bool) (int, time.Time) {
	if r.byID == nil {
		r.byID = map[string]retry{}
	}
	e := r.byID[id]
	e.failures = max(e.failures, before)
	if own {
		e.failures++
	} else {
		e.putOffs++
	}
	e.notBefore, e.held, e.stored = now.Add(r.delay(e.failures+e.putOffs)), false, false
	r.byID[id] = e
	return e.failures, e.notBefore
}

// hold records that id is held until until; its count of failures stays.
func (r *retries) hold(id string, until time.Time) {
	if r.byID == nil {
		r.byID = map[string]retry{}
	}
	e := r.byID[id]
	e.notBefore, e.held, e.stored = until, true, false
	r.byID[id] = e
}

// holdStored records that the hold of id is in the store: its marker was
// moved to the held key of the hold's end.
func (r *retries) holdStored(id string) {
	if e, ok := r.byID[id]; ok && e.held {
		e.stored = true
		r.byID[id] = e
	}
}

// released forgets id, whose hold the store no longer has (another Sweep
// released it, see Sweep.ReleaseHolds).
func (r *retries) released(id string) {
	r.forget(id)
}

// stays notes that a marker of id, which waits until t, stays in the
// markers' range: runs wait for it.
func (r *retries) stays(id string, t time.Time) {
	if r.inRange == nil {
		r.inRange = map[string]time.Time{}
	}
	if old, ok := r.inRange[id]; ok && t.Before(old) && !old.Before(r.latest) {
		r.stale = true
	}
	r.inRange[id] = t
	if t.After(r.latest) {
		r.latest, r.stale = t, false // later than every other
	}
}

// left notes that no marker of id the sweep read is in the markers' range
// any more: it moved to the retry range, or it is gone.
func (r *retries) left(id string) {
	if len(r.inRange) == 0 {
		return
	}
	t, ok := r.inRange[id]
	if !ok {
		return
	}
	delete(r.inRange, id)
	switch {
	case len(r.inRange) == 0:
		r.latest, r.stale = time.Time{}, false
	case !t.Before(r.latest):
		r.stale = true
	}
}

// runsWait reports whether an id whose marker may be in the markers' range
// still waits at now, so that a run could take that marker early.
func (r *retries) runsWait(now time.Time) bool {
	if !now.Before(r.latest) {
		return false
	}
	if r.stale {
		// Once per departure of the latest: inRange holds the ids whose
		// markers did not move, few on a Mover.
		r.latest, r.stale = time.Time{}, false
		for _, t := range r.inRange {
			if t.After(r.latest) {
				r.latest = t
			}
		}
	}
	return now.Before(r.latest)
}

// failures returns how often in a row id failed, as far as memory knows.
func (r *retries) failures(id string) int {
	if len(r.byID) == 0 {
		return 0
	}
	return r.byID[id].failures
}

func (r *retries) due(id string) time.Time {
	return r.byID[id].notBefore
}

func (r *retries) forget(id string) {
	if len(r.byID) != 0 {
		delete(r.byID, id)
	}
	r.left(id)
}

// prune drops, every few passes, ids whose retry has been due for longer
// than the largest delay: forgetting them costs at most a shorter delay.
func (r *retries) prune(clock Clock) {
	r.passes++
	if len(r.byID) == 0 || r.passes%64 != 0 {
		return
	}
	now := clock.Now()
	for id, e := range r.byID {
		if e.notBefore.Add(r.most).Before(now) {
			delete(r.byID, id)
			r.left(id)
		}
	}
}

// retry puts off the marker old of it, whose clear just failed, in memory
// and, when the pass writes, by returning the retry-range key to move it
// to (nil: it stays); after Config.MaxAttempts failures, the parked-range
// key (park), counted once the Move succeeded (parked).
func (s *Sweep) retry(p *passState, it *item, old []byte) (key []byte, park bool) {
	id := it.id
	own := !errors.As(it.err, new(*outageError)) // not put off in an outage
	attempts, due := s.retries.failed(id, s.clock.Now(), int(it.attempts), own)
	if own && p.writes() && s.maxAttempts > 0 && attempts >= s.maxAttempts {
		return appendParkedKey(nil, s.prefix, it.kind&keyDeadline, it.ms, attempts, id), true
	}
	p.st.Retried++
	dueMs, err := markerMillis(due)
	if !p.writes() || err != nil {
		s.noteRetry(p, due) // its marker stays (see decide)
		return nil, false
	}
	// The key keeps whole milliseconds, rounded up: a pass at due itself
	// would not find it due yet.
	s.noteRetry(p, time.UnixMilli(dueMs))
	return moved(appendRetryKey(nil, s.prefix, it.kind&keyDeadline, dueMs, it.ms, attempts, id), old), false
}

// moved returns key, or nil when it is old itself (the clock stepped back).
func moved(key, old []byte) []byte {
	if bytes.Equal(key, old) {
		return nil
	}
	return key
}

// parked counts the marker of it, now parked, and forgets its id's
// failures: a requeue starts them anew.
func (s *Sweep) parked(p *passState, it *item) {
	p.st.Parked++
	p.notes.noteParked(it.id, it.err)
	s.retries.forget(it.id)
}

// hold puts off the marker old of a held id as retry does a failed one's.
func (s *Sweep) hold(p *passState, it *item, old []byte) []byte {
	until, key := s.holdKey(p, it)
	s.noteRetry(p, until)
	return moved(key, old)
}

// checkMove reads the first move of a pass back, so that a Move that
// writes where Scan does not read (a wrapper that inherited Move from the
// store it wraps) is found out before it moves a marker out of sight.
func (s *Sweep) checkMove(ctx context.Context, p *passState, from, to []byte) error {
	found := func(key []byte) (bool, error) {
		got, err := s.scan(ctx, p, key, append(key[:len(key):len(key)], 0), 1)
		return len(got) == 1, err
	}
	if ok, err := found(to); ok || err != nil {
		return err
	}
	// Neither key: the marker went meanwhile (another replica cleared it).
	if ok, err := found(from); !ok || err != nil {
		return err
	}
	return fmt.Errorf("retention: the KV's Move of %q to %q left it where Scan reads it: "+
		"its Move must act where Scan reads (does a wrapper inherit Move from the store it wraps?)", from, to)
}

// noteRetry makes the pass's NextDue no later than due.
func (s *Sweep) noteRetry(p *passState, due time.Time) {
	p.st.NextDue = earliest(p.st.NextDue, due)
}
