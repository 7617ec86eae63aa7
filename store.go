package retention

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// KV is the ordered key store a Sweep reads markers from and deletes them
// in. The sweep never reads values. Any store with ordered keys can
// implement it; the kvtest package checks an implementation against this
// contract.
//
// Scan returns up to limit keys k with start <= k < end, in ascending
// bytewise order (bytes.Compare), with limit >= 1. A page shorter than limit
// means there are no more keys in the range; a page of exactly limit keys
// says nothing about what follows. When end <= start the page is empty. The
// caller owns the returned slices: the store must not keep or modify them
// after Scan returns, and the caller may modify them.
//
// Delete removes the given keys. Deleting a key that does not exist is not
// an error. A store that can batch does so in one round trip; a Delete that
// fails may have removed some of the keys.
//
// Scans are paged by the caller: a later Scan starts after the last key of
// the previous page, and keys deleted or added between pages must neither
// make it skip a key that was present throughout nor return one twice.
// There is no snapshot across pages.
//
// Both methods must be safe for concurrent use, honour ctx, and return an
// error (ctx.Err() or one wrapping it) when ctx is done before they finish.
type KV interface {
	Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error)
	Delete(ctx context.Context, keys ...[]byte) error
}

// ClearDeleter is a KV that clears entities itself, in the transaction that
// deletes their markers, so that each entity is cleared exactly once:
// pgkv.KV.WithClear makes one. A Sweep over one, with neither Config.Clear
// nor Config.ClearBatch set, calls ClearAndDelete for each batch of a page.
//
// A call that returns an error must have changed nothing. A BatchError
// names the ids at fault, as from ClearBatch; the sweep sends the others
// again. Any other error may hide a commit the caller did not hear of: the
// sweep then reads which of the batch's markers are left, and takes one
// that is gone for an entity cleared with it. See docs/clearing.md.
type ClearDeleter interface {
	KV
	// ClearAndDelete clears the entities of ids and deletes keys, their
	// markers (ascending, every marker of each id), in one transaction. It
	// commits only if every key still exists: else it changes nothing and
	// returns an error matching ErrMarkerGone, so that a call sent twice
	// clears nothing twice.
	ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error
}

// Mover is a store that can move a marker to a new key in one atomic step:
// a Sweep over one reschedules, holds and parks markers in the store, and
// no crash can leave two markers of one id. Without it, retry delays and
// holds are kept in memory. MemKV and every adapter are Movers.
type Mover interface {
	// Move replaces each key from[i] by the key to[i], with an empty value,
	// only if from[i] exists: each pair moves whole or not at all, and a
	// failed call may have moved some pairs. from and to have the same
	// length. Move must write where the KV's Scan reads.
	Move(ctx context.Context, from, to [][]byte) error
}

// Putter is a store that can write a key: Mark and Sweep.Mark use it. A
// Sweep writes to its KV only through Mover. Put must write where the KV's
// Scan reads.
type Putter interface {
	Put(ctx context.Context, key, value []byte) error
}

// Mark writes the marker for id, finished at t, under prefix, with an empty
// value. It refuses what MarkerKey refuses; for a sweep with its own
// Config.ValidateID use Sweep.Mark. Where the store has transactions,
// prefer writing MarkerKey's key in the transaction that records the
// entity's terminal state: a crash between two writes loses the marker.
func Mark(ctx context.Context, p Putter, prefix, id string, t time.Time) error {
	key, err := MarkerKey(prefix, t, id)
	if err != nil {
		return err
	}
	return p.Put(ctx, key, nil)
}

// MemKV is an in-memory ordered KV, a Mover and a Putter, safe for
// concurrent use, for tests, demos and services whose state lives in
// memory. Create one with NewMemKV; the zero value is an empty MemKV ready
// to use too. It is a skip list: Put, Get and the deletion of one key cost
// O(log n), Scan O(log n + page).
type MemKV struct {
	mu    sync.RWMutex
	head  [maxLevel]*memNode
	tail  *memNode // the last node, or nil
	level int
	n     int
	rng   *rand.Rand
}

// maxLevel bounds the tower height; with a branching factor of 4 it covers
// 4^16 keys before towers stop growing.
const maxLevel = 16

type memNode struct {
	key, value []byte
	next       []*memNode
}

// NewMemKV returns an empty MemKV.
func NewMemKV() *MemKV {
	return &MemKV{level: 1, rng: newMemRand()}
}

// newMemRand returns the source of tower heights, with a fixed seed for
// repeatable benchmarks.
func newMemRand() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// Len returns the number of keys stored.
func (m *MemKV) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.n
}

// Put stores a copy of key and value, replacing the value of an existing key.
func (m *MemKV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.putLocked(key, value)
	return nil
}

func (m *MemKV) putLocked(key, value []byte) {
	var prev [maxLevel]*memNode
	if x := m.seek(key, &prev); x != nil && bytes.Equal(x.key, key) {
		x.value = bytes.Clone(value)
		return
	}
	if m.rng == nil { // a zero MemKV
		m.rng = newMemRand()
	}
	lvl := 1
	for lvl < maxLevel && m.rng.Uint32()&3 == 0 {
		lvl++
	}
	// prev above the old level is nil already: those levels start at the head.
	m.level = max(m.level, lvl)
	x := &memNode{key: bytes.Clone(key), value: bytes.Clone(value), next: make([]*memNode, lvl)}
	for i := 0; i < lvl; i++ {
		links := m.linksOf(prev[i])
		x.next[i], links[i] = links[i], x
	}
	if x.next[0] == nil {
		m.tail = x
	}
	m.n++
}

// Get returns a copy of the value stored under key, and whether it exists.
func (m *MemKV) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	x := m.seek(key, nil)
	if x == nil || !bytes.Equal(x.key, key) {
		return nil, false, nil
	}
	return bytes.Clone(x.value), true, nil
}

// Scan implements KV. The keys of one page share one allocation, each
// capped so that appending to one never overwrites another.
func (m *MemKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("retention: MemKV.Scan limit must be at least 1, got %d", limit)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	first := m.seek(start, nil)
	n, size := 0, 0
	for x := first; x != nil && n < limit && bytes.Compare(x.key, end) < 0; x = x.next[0] {
		n++
		size += len(x.key)
	}
	if n == 0 {
		return nil, nil
	}
	buf := make([]byte, 0, size)
	keys := make([][]byte, 0, n)
	for x := first; len(keys) < n; x = x.next[0] {
		off := len(buf)
		buf = append(buf, x.key...)
		keys = append(keys, buf[off:len(buf):len(buf)])
	}
	return keys, nil
}

// Delete implements KV.
func (m *MemKV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, key := range keys {
		m.deleteLocked(key)
	}
	return nil
}

// deleteLocked deletes key and reports whether it was there.
func (m *MemKV) deleteLocked(key []byte) bool {
	var prev [maxLevel]*memNode
	x := m.seek(key, &prev)
	if x == nil || !bytes.Equal(x.key, key) {
		return false
	}
	for i := range x.next {
		m.linksOf(prev[i])[i] = x.next[i]
	}
	if m.tail == x {
		m.tail = prev[0] // nil when x was the only node
	}
	m.n--
	for m.level > 1 && m.head[m.level-1] == nil {
		m.level--
	}
	return true
}

// Move implements Mover, under one lock.
func (m *MemKV) Move(ctx context.Context, from, to [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(from) != len(to) {
		return fmt.Errorf("retention: MemKV.Move of %d keys to %d keys", len(from), len(to))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, key := range from {
		if m.deleteLocked(key) {
			m.putLocked(to[i], nil)
		}
	}
	return nil
}

// seek returns the first node whose key is >= key, or nil. When prev is not
// nil it records, per level, the last node before that point (nil meaning
// the head).
func (m *MemKV) seek(key []byte, prev *[maxLevel]*memNode) *memNode {
	if prev == nil {
		// A sweep's reads mostly start at the first key or past the last
		// (an empty retry range): those need no walk down the towers.
		if first := m.head[0]; first == nil || bytes.Compare(first.key, key) >= 0 {
			return first
		}
		if bytes.Compare(m.tail.key, key) < 0 {
			return nil
		}
	}
	var x *memNode // nil stands for the head
	for i := m.level - 1; i >= 0; i-- {
		for {
			next := m.linksOf(x)[i]
			if next == nil || bytes.Compare(next.key, key) >= 0 {
				break
			}
			x = next
		}
		if prev != nil {
			prev[i] = x
		}
	}
	return m.linksOf(x)[0]
}

// linksOf returns the forward links of x, or of the head when x is nil.
func (m *MemKV) linksOf(x *memNode) []*memNode {
	if x == nil {
		return m.head[:]
	}
	return x.next
}
