package retention

// seenIDs is the set of the ids of a page, so that a second marker of one
// id in the page (a marker written twice) is deleted with the first rather
// than cleared again; on a later page or pass it is cleared again: Clear is
// idempotent. It maps an id to its first item, and is kept from page to
// page.
type seenIDs map[string]int32

// see marks items[i] a duplicate of the page's first item with its id,
// linking it into that item's chain, or records it as that first item.
func (s seenIDs) see(items []item, i int) {
	it := &items[i]
	j, ok := s[it.id]
	if !ok {
		s[it.id] = int32(i)
		return
	}
	// Deleted with the first, once it is settled.
	it.out, it.primary = duplicate, j
	for items[j].next != 0 {
		j = items[j].next - 1
	}
	items[j].next = int32(i) + 1
}
