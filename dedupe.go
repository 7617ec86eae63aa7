package retention

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"strings"
)

// idStore holds the ids of pages as strings, which Clear gets substrings
// of and may keep. Pages share a block of idBlock bytes until it is full:
// a block is written once and never changed, as a strings.Builder is, so
// each page's string stays as it was. An allocation per page cost more
// than the rest of the page's bookkeeping (fresh memory to fault in,
// mostly); a kept id now holds its block alive rather than its page's
// ids alone.
type idStore struct {
	b strings.Builder
}

// idBlock is the size of a block of idStore.
const idBlock = 64 << 10

// hold returns ids as a string.
func (s *idStore) hold(ids []byte) string {
	if s.b.Cap()-s.b.Len() < len(ids) {
		s.b = strings.Builder{} // the old block stays with its strings
		s.b.Grow(max(idBlock, len(ids)))
	}
	start := s.b.Len()
	s.b.Write(ids)
	return s.b.String()[start:]
}

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
	mix   [2]uint64 // hash's keys, from seed
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

// hash returns the hash of an id. Ids of up to 16 bytes, most of them,
// take two loads and a multiplication (the mixing of wyhash) instead of a
// call of maphash, which cost a quarter of the sweep's own work per marker;
// a collision costs a probe, never a wrong answer.
//
// With check, valid reports whether ValidateID accepts id, tested on the
// words the hash loaded (see idWord) where a look-up per byte cost as much
// as the hash; without it, valid is true.
func (s *seenIDs) hash(id []byte, check bool) (h uint32, valid bool) {
	var x, y uint64
	valid = true
	switch n := len(id); {
	case n > 16:
		return uint32(maphash.Bytes(s.seed, id)), !check || validID(id)
	case n >= 8:
		x, y = binary.LittleEndian.Uint64(id), binary.LittleEndian.Uint64(id[n-8:])
		valid = !check || idWord(x)&idWord(y) == idTops
	case n >= 4:
		x, y = uint64(binary.LittleEndian.Uint32(id)), uint64(binary.LittleEndian.Uint32(id[n-4:]))
		valid = !check || idWord(x|y<<32) == idTops
	case n > 0:
		x = uint64(id[0]) | uint64(id[n/2])<<8 | uint64(id[n-1])<<16
		valid = !check || validID(id)
	default:
		valid = !check
	}
	return s.mixHash(x, y, len(id)), valid
}

// mixHash is the hash of an id of n bytes, 16 at most, from its words x
// and y (see hash).
func (s *seenIDs) mixHash(x, y uint64, n int) uint32 {
	hi, lo := bits.Mul64(x^s.mix[0], y^s.mix[1]^uint64(n))
	return uint32(hi ^ lo)
}

// idTops is idWord of a word whose eight bytes ValidateID accepts.
const idTops = 0x8080808080808080

// idWord returns, in the top bit of each of the eight bytes of w, whether
// ValidateID accepts that byte. For a byte below 0x80, adding 0x80-lo sets
// its top bit when it is lo or more, and adding 0x7f-hi when it is above
// hi; neither carries into the next byte. A byte of 0x80 or more is no id
// byte, and may carry into the next: the word is refused all the same.
func idWord(w uint64) uint64 {
	const ones = 0x0101010101010101
	in := func(lo, hi uint64) uint64 {
		return (w + (0x80-lo)*ones) &^ (w + (0x7f-hi)*ones)
	}
	ok := in('0', '9') | in('_', '_') | in('-', '-')
	w |= 0x20 * ones // the letters, either case
	return (ok | in('a', 'z')) &^ w & idTops
}

// reset starts a pass, over its whole length when wide. A table grown by
// one large pass is dropped once a later pass needs far less.
func (s *seenIDs) reset(wide bool) {
	s.wide = wide
	if !s.ready {
		s.seed, s.ready = maphash.MakeSeed(), true
		// Odd constants, so that the product keeps every bit of both.
		s.mix = [2]uint64{maphash.Comparable(s.seed, 1) | 1, maphash.Comparable(s.seed, 2) | 1}
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
