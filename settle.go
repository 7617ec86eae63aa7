package retention

import (
	"context"
	"time"
)

// settle acts on a page's outcomes, the one place that decides what becomes
// of a marker (see decide): one Move reschedules, holds and parks, then one
// Delete removes the rest.
func (s *Sweep) settle(ctx context.Context, p *passState, keys [][]byte, items []item) error {
	pl := &s.plan
	pl.reset()
	for i := range items {
		s.decide(p, pl, keys, items, i)
	}
	if len(pl.from) > 0 {
		s.reschedule(ctx, p, pl, items)
	}
	if p.writes() {
		// Moved (or there already): the store has these holds.
		for _, i := range pl.holding {
			s.retries.holdStored(items[i].id)
		}
	}
	var err error
	if len(pl.del) > 0 {
		err = s.delete(ctx, p, pl.del)
	}
	// After a failed Delete, a ClearDeleter's are gone all the same.
	s.noteLags(p, items, pl.oldest, err != nil)
	return err
}

// noteLags raises MaxLag to the lag of oldest (-1: none) and shows the
// Observer the page's lags (goneOnly: those a ClearDeleter deleted).
func (s *Sweep) noteLags(p *passState, items []item, oldest int64, goneOnly bool) {
	if oldest < 0 {
		return
	}
	p.st.MaxLag = max(p.st.MaxLag, p.cutoff.Sub(time.UnixMilli(oldest)))
	if s.obs != nil {
		s.observeLags(items, goneOnly)
	}
}

// pagePlan is what settle writes for a page, reused from page to page.
type pagePlan struct {
	del      [][]byte       // markers to delete
	from, to [][]byte       // markers to move, and where
	targets  map[int][]byte // where a failed or held marker with duplicates moves, by item
	moving   []int          // items whose marker moves (not their duplicates)
	parking  []int          // items whose move parks them
	holding  []int          // items whose move puts them at their hold's end
	oldest   int64          // lagMs of the oldest cleared marker, or -1: it has the largest lag
}

func (pl *pagePlan) reset() {
	pl.del, pl.from, pl.to = pl.del[:0], pl.from[:0], pl.to[:0]
	pl.moving, pl.parking, pl.holding = pl.moving[:0], pl.parking[:0], pl.holding[:0]
	clear(pl.targets)
	pl.oldest = -1
}

// move plans the move of keys[i] to key; a nil key moves nothing: the
// marker stays where it is (see Sweep.stays).
func (pl *pagePlan) move(keys [][]byte, items []item, i int, key []byte) {
	if key == nil {
		return
	}
	pl.moving = append(pl.moving, i)
	pl.from, pl.to = append(pl.from, keys[i]), append(pl.to, key)
	if items[i].next != 0 {
		if pl.targets == nil {
			pl.targets = map[int][]byte{}
		}
		pl.targets[i] = key
	}
}

// decide counts the outcome of items[i] and plans what becomes of its
// marker keys[i].
func (s *Sweep) decide(p *passState, pl *pagePlan, keys [][]byte, items []item, i int) {
	st, it := p.st, &items[i]
	switch it.out {
	case pending: // only a cancelled pass leaves one, and it returned before
	case foreign:
		st.Foreign++
		p.notes.noteForeign(keys[i])
	case unexpired:
		s.noteRetry(p, time.UnixMilli(it.ms).Add(s.retention))
	case bad:
		st.Malformed++
		p.notes.noteMalformed(it.err)
		pl.del = append(pl.del, keys[i])
	case duplicate:
		s.decideDuplicate(p, pl, keys, items, i)
	case cleared, clearedGone:
		s.countCleared(p, it, &pl.oldest)
		if it.out == cleared {
			pl.del = append(pl.del, keys[i])
		}
	case foundGone:
		// Its marker, or one of its duplicates', is gone; deleting what
		// is left of them is free.
		st.Gone++
		s.retries.forget(it.id)
		pl.del = append(pl.del, keys[i])
	case liveAgain:
		st.LiveAgain++
		s.retries.forget(it.id)
		pl.del = append(pl.del, keys[i])
	case unknown:
		// A failed call may have committed, and the store could not
		// tell: the marker stays where it is, its delay in memory.
		st.Failed++
		st.Retried++
		p.notes.noteFailed(it.id, it.err)
		_, due := s.retries.failed(it.id, s.clock.Now(), int(it.attempts), true)
		s.stays(p, it.id, due)
		s.noteRetry(p, due)
	case wouldClear:
		st.WouldClear++
		p.notes.wouldClear.add(func() string { return it.id })
	case deferred:
		st.Deferred++
		s.noteRetry(p, s.retries.due(it.id))
		if it.err == nil {
			s.stays(p, it.id, s.retries.due(it.id))
			break
		}
		// A further marker of an id held in memory goes where the hold put
		// the first (see markWaiting).
		s.planMove(p, pl, keys, items, i, s.hold(p, it, keys[i]))
		pl.holding = append(pl.holding, i)
	case held:
		st.Held++
		s.planMove(p, pl, keys, items, i, s.hold(p, it, keys[i]))
		pl.holding = append(pl.holding, i)
	case failed:
		st.Failed++
		p.notes.noteFailed(it.id, it.err)
		key, park := s.retry(p, it, keys[i])
		s.planMove(p, pl, keys, items, i, key)
		if park {
			pl.parking = append(pl.parking, i)
		}
	}
}

// planMove plans the move of the marker keys[i] of an id that waits to
// key, or, with no key, notes that it stays where it is.
func (s *Sweep) planMove(p *passState, pl *pagePlan, keys [][]byte, items []item, i int, key []byte) {
	if key == nil {
		s.stays(p, items[i].id, s.retries.due(items[i].id))
		return
	}
	pl.move(keys, items, i, key)
}

// stays notes that the marker of id, which waits until t, stays where the
// pass read it: in the markers' range, runs wait for it (see startRun).
func (s *Sweep) stays(p *passState, id string, t time.Time) {
	if !p.inRetry {
		s.retries.stays(id, t)
	}
}

// decideDuplicate settles items[i], a further marker of the id of an
// earlier item of the page: it goes with that one.
func (s *Sweep) decideDuplicate(p *passState, pl *pagePlan, keys [][]byte, items []item, i int) {
	first := &items[items[i].primary]
	switch first.out {
	case pending:
		return // kept with the first, which stays
	case clearedGone:
		if first.withDups {
			p.st.Duplicates++
			return // deleted in the clear's transaction
		}
	case failed, held:
		if target, ok := pl.targets[int(items[i].primary)]; ok {
			// Moved onto the first's new key in the same call: no crash
			// leaves one of them behind, due before it.
			p.st.Duplicates++
			pl.from, pl.to = append(pl.from, keys[i]), append(pl.to, target)
			return
		}
	}
	// The id is cleared or live again (deleting a marker already gone is
	// free), or its first marker stays for it.
	p.st.Duplicates++
	pl.del = append(pl.del, keys[i])
}

// reschedule makes the page's planned moves in one call, reading the
// pass's first move back (see checkMove). After a failure the markers not
// moved stay, their delays kept in memory, and the pass moves no more.
func (s *Sweep) reschedule(ctx context.Context, p *passState, pl *pagePlan, items []item) {
	err := s.move(ctx, p, pl.from, pl.to)
	if err == nil && !p.moveChecked {
		p.moveChecked = true
		err = s.checkMove(ctx, p, pl.from[0], pl.to[0])
	}
	if err != nil {
		p.noMove = true
		p.notes.rescheduleErr = err
	}
	if !p.inRetry {
		// Out of the markers' range, or maybe not (a Move may write some
		// of its keys and fail): runs wait for those that may be there.
		for _, i := range pl.moving {
			if id := items[i].id; err == nil {
				s.retries.left(id)
			} else {
				s.retries.stays(id, s.retries.due(id))
			}
		}
	}
	for _, i := range pl.parking {
		if err == nil {
			s.parked(p, &items[i])
		} else { // put off, its failures kept in memory
			p.st.Retried++
			s.noteRetry(p, s.retries.due(items[i].id))
		}
	}
}

// countCleared counts a cleared marker and lowers *oldest (-1: none yet)
// to its lag's start: retries are not in the order of finish times.
func (s *Sweep) countCleared(p *passState, it *item, oldest *int64) {
	p.st.Cleared++
	s.retries.forget(it.id)
	if *oldest < 0 || it.lagMs < *oldest {
		*oldest = it.lagMs
	}
}

// countGone counts, in a page the pass leaves unsettled, the markers a
// ClearDeleter deleted (duplicates too) and those found gone; it writes
// nothing.
func (s *Sweep) countGone(p *passState, keys [][]byte, items []item) {
	pl := &s.plan
	pl.reset()
	for i := range items {
		switch it := &items[i]; it.out {
		case clearedGone, foundGone:
			s.decide(p, pl, keys, items, i)
		case duplicate:
			if first := &items[it.primary]; first.out == clearedGone && first.withDups {
				s.decide(p, pl, keys, items, i)
			}
		}
	}
	s.noteLags(p, items, pl.oldest, true)
}
