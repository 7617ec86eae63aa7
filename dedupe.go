package retention

import (
	"hash/maphash"
)

// seenIDs is the set of ids a pass has met, so that a second marker of one
// id (a crash between the write of a rescheduled marker and the delete of
// the old one, on a store that is no Mover, or a marker written twice) is
// deleted with the first rather than cleared again. It costs a hash and a
// probe of a compact table per marker, and no allocation once grown.
//
// Over a whole pass the table is as large as the pass, and a probe of it
// misses the CPU's caches once a pass holds more than some ten thousand
// markers: that costs more than the rest of the sweep's own work per
// marker. So the pass keeps the ids of the whole pass only on a store
// that leaves duplicates when it crashes (a Putter that is no Mover), and
// otherwise those of one page at a time, in a table that stays in cache.
type seenIDs struct {
	seed  maphash.Seed
	ready bool
	wide  bool // the whole pass's ids, not only the page's
	// slots is an open-addressing table: a slot holds the upper 32 bits of
	// an id's hash and one more than the index of its record, or 0. Its
	// length is a power of two, or zero.
	slots []uint64
	recs  []seenRec // the ids met, in order
	dirty bool      // startPage's table left items in slots
	pages []string  // the id buffer of each page of the pass
}

// seenRec is one id met in the pass: pages[page][lo:hi], items[idx] of
// that page.
type seenRec struct {
	page, lo, hi, idx uint32
	hash              uint32
	done              bool // its marker was cleared (or live again): the id is done with
}

// hash returns the hash of an id, for the table's probes: a collision
// costs a probe, never a wrong answer.
func (s *seenIDs) hash(id []byte) uint32 {
	return uint32(maphash.Bytes(s.seed, id))
}

// reset starts a pass, over its whole length when wide. A table grown by
// one large pass is dropped once a later pass needs far less.
func (s *seenIDs) reset(wide bool) {
	s.wide = wide
	if !s.ready {
		s.seed, s.ready = maphash.MakeSeed(), true
	}
	switch {
	case len(s.slots) > 1<<14 && len(s.recs) < len(s.slots)/16:
		s.slots = nil
	case len(s.recs) > 0 || s.dirty:
		clear(s.slots)
	}
	s.dirty = false
	s.recs = s.recs[:0]
	s.end()
}

// end drops the pass's references to its pages' ids.
func (s *seenIDs) end() {
	clear(s.pages)
	s.pages = s.pages[:0]
}

// page starts a page whose ids are substrings of all.
func (s *seenIDs) page(all string) {
	if !s.wide && len(s.pages) > 0 {
		if len(s.recs) > 0 {
			clear(s.slots)
			s.recs = s.recs[:0]
		}
		s.pages[0], s.pages = "", s.pages[:0]
	}
	s.pages = append(s.pages, all)
}

// add records the id all[lo:hi] of items[idx] of the current page, whose
// hash is h, and returns its record. When the pass met the id before, dup
// is true and it says where: earlier is true when that was on an earlier
// page, else at is its item on this page.
func (s *seenIDs) add(h uint32, lo, hi, idx int) (rec int, dup, earlier bool, at int) {
	if 2*(len(s.recs)+1) > len(s.slots) {
		s.grow()
	}
	page := uint32(len(s.pages) - 1)
	id := s.pages[page][lo:hi]
	tag := uint64(h) << 32
	mask := uint64(len(s.slots) - 1)
	for i := tag >> 32 & mask; ; i = (i + 1) & mask {
		slot := s.slots[i]
		if slot == 0 {
			s.recs = append(s.recs, seenRec{page: page, lo: uint32(lo), hi: uint32(hi), idx: uint32(idx), hash: h})
			s.slots[i] = tag | uint64(len(s.recs))
			return len(s.recs) - 1, false, false, 0
		}
		if slot>>32<<32 != tag {
			continue
		}
		if r := s.recs[uint32(slot)-1]; s.pages[r.page][r.lo:r.hi] == id {
			return int(uint32(slot) - 1), true, r.page != page, int(r.idx)
		}
	}
}

// grow doubles the table.
func (s *seenIDs) grow() {
	s.slots = make([]uint64, max(2*len(s.slots), 256))
	mask := uint64(len(s.slots) - 1)
	for j, r := range s.recs {
		tag := uint64(r.hash) << 32
		i := tag >> 32 & mask
		for s.slots[i] != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = tag | uint64(j+1)
	}
}

// done reports whether the marker of record rec was cleared.
func (s *seenIDs) done(rec int) bool { return s.recs[rec].done }

// markDone records that the marker of record rec was cleared.
func (s *seenIDs) markDone(rec int) { s.recs[rec].done = true }

// repoint makes record rec stand for the id all[lo:hi] of items[idx] of
// the current page.
func (s *seenIDs) repoint(rec, lo, hi, idx int) {
	s.recs[rec] = seenRec{page: uint32(len(s.pages) - 1), lo: uint32(lo), hi: uint32(hi), idx: uint32(idx), hash: s.recs[rec].hash}
}

// startPage readies the table of one page's ids for probe, where the pass
// keeps one page's ids only: the table then holds items of the page, not
// records, so that a marker costs a hash and a probe and nothing more. At
// most a quarter full, a probe mostly finds its slot empty at once.
func (s *seenIDs) startPage(items int) {
	n := 256
	for n < 4*items {
		n *= 2
	}
	if len(s.slots) < n {
		s.slots = make([]uint64, n)
	} else {
		s.slots = s.slots[:n]
		clear(s.slots)
	}
	s.dirty = true
}

// claim records items[i], whose hash is h, in the slot its hash points
// to when that slot is free, as it is for most items: small enough to be
// inlined, where probe is not. It reports whether it did; when not, probe
// does the rest.
func (s *seenIDs) claim(h uint32, i int) bool {
	k := uint64(h) & uint64(len(s.slots)-1)
	if s.slots[k] != 0 {
		return false
	}
	s.slots[k] = uint64(h)<<32 | uint64(i+1)
	return true
}

// probe marks items[i] a duplicate of the page's first item with its id,
// linking it into that item's chain, or records it as that first item.
func (s *seenIDs) probe(items []item, i int) {
	it := &items[i]
	tag := uint64(it.hash) << 32
	mask := uint64(len(s.slots) - 1)
	for k := tag >> 32 & mask; ; k = (k + 1) & mask {
		slot := s.slots[k]
		if slot == 0 {
			s.slots[k] = tag | uint64(i+1)
			return
		}
		if j := int(uint32(slot)) - 1; slot>>32<<32 == tag && items[j].id == it.id {
			// Deleted with the first, once it is settled.
			it.out, it.primary = duplicate, int32(j)
			for items[j].next != 0 {
				j = int(items[j].next) - 1
			}
			items[j].next = int32(i) + 1
			return
		}
	}
}
