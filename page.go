package retention

import (
	"context"
	"errors"
	"time"
)

// outcome is what became of one key of a page. Every clear mode ends in
// one of these, and settle alone acts on them: docs/architecture.md ("The
// outcomes") says what each does to the marker and where it is counted.
type outcome uint8

const (
	pending     outcome = iota // Clear has not returned (yet): the marker stays
	cleared                    // Clear returned nil
	clearedGone                // cleared with its marker deleted, by a ClearDeleter
	foundGone                  // its marker found gone after a call whose outcome is unknown
	liveAgain                  // Clear returned ErrLiveAgain
	failed                     // Clear failed; the marker stays, put off for a retry
	held                       // Clear returned Hold: the marker waits for the hold's end
	unknown                    // a ClearDeleter failed and its commit could not be checked
	duplicate                  // another marker of an id met before in the pass
	bad                        // malformed: deleted without Clear
	foreign                    // not marker-shaped: left alone
	deferred                   // in its retry delay: left for later
	unexpired                  // in the retry range, not expired under today's Retention: left
	wouldClear                 // a dry run would have cleared it
)

// preparePage sorts a page's keys into items and marks the waiting ones.
func (s *Sweep) preparePage(p *passState, keys [][]byte) []item {
	items := s.parsePage(p, keys)
	if len(s.retries.byID) > 0 { // else no id waits: most pages
		s.markWaiting(p, items)
	}
	return items
}

// markWaiting defers the pending items whose id waits in memory.
func (s *Sweep) markWaiting(p *passState, items []item) {
	now := s.clock.Now()
	for i := range items {
		if items[i].out == pending {
			s.waiting(p, &items[i], now)
		}
	}
}

// waiting defers it, and reports so, when its id waits in memory at now.
func (s *Sweep) waiting(p *passState, it *item, now time.Time) bool {
	r, ok := s.retries.byID[it.id]
	if !ok || !now.Before(r.notBefore) {
		return false
	}
	if r.stored && p.inRetry && it.kind&keyHeld != 0 {
		// The store has the hold, whose key a pass reads only once it is
		// due: a held key of the id due before then was moved since, by a
		// Sweep.ReleaseHolds here or on another replica. The store wins;
		// deferred, the marker would go back to the hold's end. A key of
		// another kind is a further marker's (a retry of its failed
		// clear), which waits for the hold as the first did.
		s.retries.released(it.id)
		return false
	}
	it.out = deferred
	if r.held && p.writes() {
		// Moved to the hold's end too (see decide), so that a restart
		// keeps it.
		it.err = Hold(r.notBefore)
	}
	return true
}

// finishPage clears a prepared page and settles it.
func (s *Sweep) finishPage(ctx context.Context, p *passState, keys [][]byte, items []item) error {
	if s.dryRun {
		for i := range items {
			if items[i].out == pending {
				items[i].out = wouldClear
			}
		}
		return s.afterClears(ctx, p, keys, items, 0, nil)
	}
	calls, err := s.clearAll(ctx, p, keys, items)
	return s.afterClears(ctx, p, keys, items, calls, err)
}

// afterClears settles a page whose clears are over: calls of them, and
// err, the error of a pass cut short during them.
func (s *Sweep) afterClears(ctx context.Context, p *passState, keys [][]byte, items []item, calls int, err error) error {
	p.st.ClearCalls += calls
	p.foldCalls()
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		// Not settled: the page's clears that were cut short would lose
		// their markers. Holds are kept in memory, so that the next pass
		// does not ask for them again before their ends.
		s.countGone(p, keys, items)
		s.rememberWaits(p, items)
		s.observePage(p)
		return err
	}
	err = s.settle(ctx, p, keys, items)
	s.observePage(p)
	return err
}

// parsePage sorts the keys of a page into items, each with its first
// outcome (see classify). It stops at a marker that is not expired (or a
// retry not due), which only a KV that breaks Scan's end bound returns.
func (s *Sweep) parsePage(p *passState, keys [][]byte) []item {
	if cap(s.items) < len(keys) {
		// Grown once to the page, not by appends, which copy.
		s.items = make([]item, 0, len(keys))
	}
	items, ids := s.items[:0], s.ids[:0]
	for _, key := range keys {
		// Classified in place: an item returned by value would be copied.
		items = append(items, item{})
		it := &items[len(items)-1]
		id, ok := s.classify(p, key, it)
		if !ok {
			items = items[:len(items)-1]
			break
		}
		it.lo = int32(len(ids))
		if it.out == pending {
			ids = append(ids, id...)
		}
		it.hi = int32(len(ids))
	}
	s.items, s.ids = items, ids
	// One string holds the page's ids, which Clear gets substrings of.
	s.nameIDs(keys, items, string(ids))
	return items
}

// classify parses key into it (a zero item) with its first outcome:
// pending, foreign, bad (its time or id refused) or unexpired; the only
// place a marker gets one. ok is false for a key past the range's end.
func (s *Sweep) classify(p *passState, key []byte, it *item) (id []byte, ok bool) {
	var isForeign, notExpired bool
	var err error
	if p.inRetry {
		var k retryKey
		k, isForeign, err = parseRetryKey(s.prefix, retryInfix, key)
		if err == nil && k.at >= p.retryDueMs {
			return nil, false
		}
		it.ms, it.lagMs, it.kind, it.attempts = k.finished, s.retryLag(k), k.kind, int32(k.attempts)
		// A Retention raised since the marker failed (or was held): it is
		// not expired any more, and stays until it is. A deadline key is
		// due at its deadline whatever the Retention.
		notExpired = err == nil && k.kind&keyDeadline == 0 && k.finished >= p.cutoffMs
		id = k.id
	} else {
		var ms int64
		ms, id, isForeign, err = parseKey(s.prefix, key)
		if err == nil && ms >= p.cutoffMs {
			// Clearing this marker would delete state before its
			// retention ran out.
			return nil, false
		}
		it.ms, it.lagMs = ms, ms
	}
	if err == nil && s.validate == nil && !validID(id) {
		// The default rule runs on the bytes, before any string exists.
		err = malformed(key, "id", validateIDBytes(id))
	}
	switch {
	case isForeign:
		it.out = foreign
	case err != nil:
		it.out = bad
	case notExpired:
		it.out = unexpired
	}
	it.err = err
	return id, true
}

// retryLag returns the Unix ms the lag of k's marker counts from: its
// finish time (a deadline key's: the deadline less Retention), or a hold's
// end less Retention when later.
func (s *Sweep) retryLag(k retryKey) int64 {
	lag := k.finished
	if k.kind&keyDeadline != 0 {
		lag = max(k.finished-s.retention.Milliseconds(), 0)
	}
	if k.kind&keyHeld != 0 {
		lag = max(k.at-s.retention.Milliseconds(), lag)
	}
	return lag
}

// nameIDs gives each pending item of the page its id, a substring of all,
// checks it by Config.ValidateID, and marks each further marker of an id a
// duplicate of the page's first.
func (s *Sweep) nameIDs(keys [][]byte, items []item, all string) {
	if s.seen == nil {
		s.seen = seenIDs{}
	}
	clear(s.seen)
	for i := range items {
		it := &items[i]
		if it.out != pending {
			continue
		}
		it.id = all[it.lo:it.hi]
		if s.validate != nil {
			switch err := s.checkID(it.id); {
			case errors.Is(err, errValidatePanicked):
				it.err, it.out = err, failed // kept, and tried again after its delay
				continue
			case err != nil:
				it.err, it.out = malformed(keys[i], "id", err), bad
				continue
			}
		}
		s.seen.see(items, i)
	}
}

// item is one key of a page on its way through a pass; items[i] stands for
// the page's keys[i].
type item struct {
	id     string
	ms     int64 // the finish time its key records (a deadline key's: the deadline)
	lagMs  int64 // the finish time its lag counts from: ms, or later for a hold's end or a deadline
	err    error // why the key is malformed, or how Clear failed
	lo, hi int32 // the id's bounds in the page's id buffer
	// For a duplicate, primary is the item of the id's first marker in the
	// page; for the others, next is one more than the item of the id's next
	// marker in the page, or 0.
	primary, next int32
	attempts      int32 // failed attempts the key records (retry range)
	out           outcome
	withDups      bool  // cleared by a ClearDeleter's call that deleted its duplicates too
	kind          byte  // a retry-range key's kind: keyDeadline and keyHeld flags
	doneAt        int64 // when a ClearDeleter's call cleared it, Unix ns by the sweep's Clock, or 0
}
