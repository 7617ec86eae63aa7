package retention

import (
	"hash/maphash"
)

// seenIDs is the set of the ids of a page, so that a second marker of one
// id in the page (a marker written twice) is deleted with the first rather
// than cleared again; on a later page or pass it is cleared again: Clear is
// idempotent.
type seenIDs struct {
	seed  maphash.Seed
	ready bool
	// slots is an open-addressing table: a slot holds the upper 32 bits of
	// an id's hash and one more than the index of its item, or 0. Its
	// length is a power of two, or zero.
	slots []uint64
}

// hash returns the hash of an id, for the table's probes: a collision
// costs a probe, never a wrong answer.
func (s *seenIDs) hash(id []byte) uint32 {
	return uint32(maphash.Bytes(s.seed, id))
}

func (s *seenIDs) reset() {
	if !s.ready {
		s.seed, s.ready = maphash.MakeSeed(), true
	}
}

// startPage readies the table for a page of items: at most a quarter full,
// a probe mostly finds its slot empty at once.
func (s *seenIDs) startPage(items int) {
	n := 256
	for n < 4*items {
		n *= 2
	}
	if cap(s.slots) < n {
		s.slots = make([]uint64, n)
	} else {
		s.slots = s.slots[:n]
		clear(s.slots)
	}
}

// claim records items[i] in the slot of its hash h when free, as most are,
// and reports whether it did: small enough to be inlined, where probe is not.
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
