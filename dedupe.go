package retention

import "hash/maphash"

// seenIDs is the set of ids a pass has met, so that a second marker of one
// id (a crash between the write of a rescheduled marker and the delete of
// the old one, on a store that is no Mover, or a marker written twice) is
// deleted with the first rather than cleared again. It costs a hash and a
// probe per marker and no allocation once grown: entries of earlier passes
// are told apart by a generation number instead of being cleared.
type seenIDs struct {
	seed  maphash.Seed
	gen   uint32
	n     int         // entries of this generation
	slots []seenEntry // open addressing; len is a power of two or zero
	pages []string    // the id buffer of each page of the pass
}

// seenEntry is one id met in the pass: pages[page][lo:hi], items[idx] of
// that page.
type seenEntry struct {
	hash        uint64
	gen         uint32
	page        uint32
	lo, hi, idx uint32
}

// reset starts a pass. A table grown by one large pass is dropped once a
// later pass needs far less.
func (s *seenIDs) reset() {
	if s.gen == 0 {
		s.seed = maphash.MakeSeed()
	}
	if len(s.slots) > 1<<16 && s.n < len(s.slots)/16 {
		s.slots = nil
	}
	s.gen++
	if s.gen == 0 { // wrapped: old entries would look current
		clear(s.slots)
		s.gen = 1
	}
	s.n = 0
	clear(s.pages)
	s.pages = s.pages[:0]
}

// end drops the pass's references to its pages' ids.
func (s *seenIDs) end() {
	clear(s.pages)
	s.pages = s.pages[:0]
}

// page starts a page whose ids are substrings of all.
func (s *seenIDs) page(all string) {
	s.pages = append(s.pages, all)
}

// add records the id all[lo:hi] of items[idx] of the current page. When
// the pass met the id before, it returns where: first is true when that
// was an earlier page, else idx is its item in this page.
func (s *seenIDs) add(lo, hi, idx int) (dup, first bool, at int) {
	if 2*(s.n+1) > len(s.slots) {
		s.grow()
	}
	page := uint32(len(s.pages) - 1)
	id := s.pages[page][lo:hi]
	h := maphash.String(s.seed, id)
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := &s.slots[i]
		if e.gen != s.gen {
			*e = seenEntry{hash: h, gen: s.gen, page: page, lo: uint32(lo), hi: uint32(hi), idx: uint32(idx)}
			s.n++
			return false, false, 0
		}
		if e.hash == h && s.pages[e.page][e.lo:e.hi] == id {
			return true, e.page != page, int(e.idx)
		}
	}
}

// grow doubles the table, keeping this pass's entries.
func (s *seenIDs) grow() {
	old := s.slots
	s.slots = make([]seenEntry, max(2*len(old), 512))
	mask := uint64(len(s.slots) - 1)
	for _, e := range old {
		if e.gen != s.gen {
			continue
		}
		i := e.hash & mask
		for s.slots[i].gen == s.gen {
			i = (i + 1) & mask
		}
		s.slots[i] = e
	}
}
