package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMalformedRetryKeys: a retry-range key whose finish time is past
// 9999 is deleted as malformed, without Clear; one whose retry time is
// past 9999 sorts after every due key and is never read by a pass (it
// stays; Backlog skips it). A foreign key in the retry range stays.
func TestMalformedRetryKeys(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, mem, Config{Clear: c.clear})
	clock.Set(t0.Add(2 * time.Hour))
	badFinished := fmt.Sprintf("runs/r%020d/99999999999999999999/1/x", t0.UnixMilli())
	badAt := fmt.Sprintf("runs/r99999999999999999999/%020d/1/y", t0.UnixMilli())
	foreign := "runs/r0-not-a-marker"
	for _, k := range []string{badFinished, badAt, foreign} {
		require.NoError(t, mem.Put(context.Background(), []byte(k), nil))
	}
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Malformed)
	assert.Equal(t, 1, st.Foreign)
	assert.Zero(t, c.total())
	assert.ElementsMatch(t, []string{badAt, foreign}, keysUnder(t, mem, "runs/"))
}

// TestDuplicatesOfRandomIDs: ids of 1 to 40 bytes, some one byte apart,
// each written 1 to 3 times on one page: every id cleared exactly once,
// every marker gone, Duplicates = markers - ids.
func TestDuplicatesOfRandomIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for seed := range uint64(6) {
		r := rand.New(rand.NewPCG(seed, 11))
		mem := NewMemKV()
		c := newClears()
		s, clock := newSweep(t, mem, Config{Clear: c.clear, PageSize: 5000})
		ids := map[string]int{}
		for len(ids) < 300 {
			n := 1 + r.IntN(40)
			id := make([]byte, n)
			for i := range id {
				id[i] = "abAB01_-"[r.IntN(8)]
			}
			for _, v := range [][]byte{id, bytes.Clone(id)} {
				if len(ids) > 0 && r.IntN(2) == 0 {
					v[r.IntN(n)] ^= 1 // a neighbour one bit off, when still an id byte
					if ValidateID(string(v)) != nil {
						continue
					}
				}
				for range 1 + r.IntN(3) {
					mark(t, mem, "runs/", string(v), t0.Add(time.Duration(r.IntN(1000))*time.Millisecond))
				}
				ids[string(v)]++
			}
		}
		// Two marks may have hit one key: count what is there.
		left := markerIDs(t, mem, "runs/")
		markers := 0
		for _, n := range left {
			markers += n
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Empty(t, markerIDs(t, mem, "runs/"), "seed %d", seed)
		assert.Equal(t, len(left), st.Cleared, "seed %d", seed)
		assert.Equal(t, markers-len(left), st.Duplicates, "seed %d", seed)
		for id := range left {
			assert.Equal(t, 1, c.count(id), "seed %d id %q", seed, id)
		}
	}
}

// TestDuplicatesMergeInEveryClearMode: the page's duplicate check merges
// the markers of one id for ClearBatch and a ClearDeleter, also when the
// id waits in memory (a failed first clear).
func TestDuplicatesMergeInEveryClearMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("ClearBatch", func(t *testing.T) {
		t.Parallel()
		kv := NewMemKV()
		seen := map[string]int{}
		s, clock := newSweep(t, kv, Config{ClearBatch: func(_ context.Context, ids []string) error {
			for _, id := range ids {
				seen[id]++
			}
			return nil
		}, BatchSize: 3})
		for i, id := range []string{"a", "b", "a", "c", "b", "a", "d"} {
			mark(t, kv, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}, seen)
		assert.Equal(t, 4, st.Cleared)
		assert.Equal(t, 3, st.Duplicates)
		assert.Empty(t, markerIDs(t, kv, "runs/"))
	})
	t.Run("ClearDeleter", func(t *testing.T) {
		t.Parallel()
		kv := atomicOver(nil)
		s, clock := newSweep(t, kv, Config{})
		for i, id := range []string{"a", "b", "a", "c", "b", "a", "d"} {
			mark(t, kv.MemKV, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}, kv.cleared)
		assert.Equal(t, 4, st.Cleared)
		assert.Equal(t, 3, st.Duplicates)
		assert.Empty(t, markerIDs(t, kv.MemKV, "runs/"))
	})
	t.Run("waiting in memory", func(t *testing.T) {
		t.Parallel()
		mem := NewMemKV()
		kv := readOnlyKV{mem}
		c := newClears()
		c.set("a", errBoom)
		s, clock := newSweep(t, kv, Config{Clear: c.clear})
		mark(t, mem, "runs/", "a", t0)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed)
		// Two more markers of a while it waits: the first stays for all,
		// the others go as its duplicates; none is cleared.
		mark(t, mem, "runs/", "a", t0.Add(time.Millisecond))
		mark(t, mem, "runs/", "a", t0.Add(2*time.Millisecond))
		st, err = s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, c.count("a"))
		assert.Equal(t, 1, st.Deferred)
		assert.Equal(t, 2, st.Duplicates)
		assert.Equal(t, 1, markerIDs(t, mem, "runs/")["a"])
		c.set("a", nil)
		clock.Advance(time.Hour)
		st, err = s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, c.count("a"))
		assert.Equal(t, 1, st.Cleared)
		assert.Empty(t, markerIDs(t, mem, "runs/"))
	})
}

// TestPageOfNoItems: a page whose first key is a marker not expired (only
// a KV that breaks Scan's end bound returns one) has no items; it is no
// page whose items were all cleared, and the marker stays.
func TestPageOfNoItems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		expired int // markers before the unexpired one: a full page of 2 and then the page of none
		cfg     Config
	}{
		{name: "Clear, the first page", expired: 0},
		{name: "Clear, after a full page", expired: 2},
		{name: "ClearBatch with workers", expired: 2, cfg: Config{ClearBatch: func(context.Context, []string) error { return nil }, Concurrency: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			cfg := tt.cfg
			cfg.PageSize = 2
			if cfg.ClearBatch == nil {
				cfg.Clear = newClears().clear
			}
			s, clock := newSweep(t, endIgnoringKV{mem}, cfg)
			for i := range tt.expired {
				mark(t, mem, "runs/", fmt.Sprintf("m%d", i), clock.Now().Add(-2*time.Hour))
			}
			young := mark(t, mem, "runs/", "young", clock.Now())
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.expired, st.Cleared)
			assert.True(t, has(t, mem, young), "the marker not expired stays")
			assert.Equal(t, 1, mem.Len())
		})
	}
}

// TestDuplicateMarkersMerge: several markers of one id on one page clear
// the id once and all go (on the atomic path in the same transaction); a
// marker on a later page clears the id again (Clear is idempotent), and
// goes too.
func TestDuplicateMarkersMerge(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"Clear", "ClearBatch", "ClearDeleter"} {
		for _, pageSize := range []int{16, 2} {
			t.Run(fmt.Sprintf("%s/page%d", mode, pageSize), func(t *testing.T) {
				t.Parallel()
				mem := NewMemKV()
				calls := map[string]int{}
				cfg := Config{PageSize: pageSize}
				var kv KV = mem
				var atomicStore *atomicKV
				switch mode {
				case "Clear":
					cfg.Clear = func(_ context.Context, id string) error { calls[id]++; return nil }
				case "ClearBatch":
					cfg.ClearBatch = func(_ context.Context, ids []string) error {
						for _, id := range ids {
							calls[id]++
						}
						return nil
					}
				default:
					atomicStore = atomicOver(mem)
					atomicStore.entities["x"], atomicStore.entities["y"] = true, true
					atomicStore.cleared = calls
					kv = atomicStore
				}
				mark(t, mem, "runs/", "x", t0)
				mark(t, mem, "runs/", "y", t0.Add(time.Millisecond))
				mark(t, mem, "runs/", "x", t0.Add(2*time.Millisecond)) // a second marker of x
				mark(t, mem, "runs/", "x", t0.Add(3*time.Millisecond)) // and a third
				s, clock := newSweep(t, kv, cfg)
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				if pageSize == 2 {
					// Pages [x y] and [x x]: the id is deduped page by
					// page, and cleared again on the later page.
					assert.Equal(t, map[string]int{"x": 2, "y": 1}, calls, "x cleared once a page")
					assert.Equal(t, 3, st.Cleared)
					assert.Equal(t, 1, st.Duplicates)
				} else {
					assert.Equal(t, map[string]int{"x": 1, "y": 1}, calls, "each id cleared once")
					assert.Equal(t, 2, st.Cleared)
					assert.Equal(t, 2, st.Duplicates)
				}
				assert.Zero(t, mem.Len(), "every marker went")
				if atomicStore != nil && pageSize > 2 {
					assert.Zero(t, st.DeleteCalls, "the duplicates went in the clear's transaction")
				}
			})
		}
	}
}

// TestDuplicatesOfEveryIDLength: the page's table finds the second marker
// of an id of any length, and tells apart ids that differ in one byte
// anywhere (the hash reads ids of up to 16 bytes in two loads).
func TestDuplicatesOfEveryIDLength(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	var ids []string
	for n := 1; n <= 40; n++ {
		base := []byte(strings.Repeat("a", n))
		ids = append(ids, string(base))
		for _, at := range []int{0, n / 2, n - 1} {
			other := slices.Clone(base)
			other[at] = 'b'
			if !slices.Contains(ids, string(other)) {
				ids = append(ids, string(other))
			}
		}
	}
	for i, id := range ids {
		mark(t, mem, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
		mark(t, mem, "runs/", id, t0.Add(time.Duration(len(ids)+i)*time.Millisecond))
	}
	calls := map[string]int{}
	s, clock := newSweep(t, mem, Config{PageSize: 1000, Clear: func(_ context.Context, id string) error { calls[id]++; return nil }})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	for _, id := range ids {
		assert.Equal(t, 1, calls[id], "calls of Clear(%q)", id)
	}
	assert.Equal(t, len(ids), st.Cleared)
	assert.Equal(t, len(ids), st.Duplicates)
	assert.Zero(t, mem.Len(), "every marker went")
}

// TestDuplicateOfFailedIDKeepsOne: the second marker of an id whose clear
// failed goes, and the first, moved to its retry time, stands for both.
func TestDuplicateOfFailedIDKeepsOne(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	s, clock := newSweep(t, mem, Config{Clear: c.clear})
	mark(t, mem, "runs/", "x", t0)
	mark(t, mem, "runs/", "x", t0.Add(time.Millisecond))
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, c.calls["x"])
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, map[string]int{"x": 1}, markerIDs(t, mem, "runs/"))
	c.set("x", nil)
	clock.Advance(2 * time.Second)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Zero(t, mem.Len())
}

// checkDedupe checks items against a plain model of a page's duplicates:
// the first pending marker of an id is its primary, each later pending
// marker of it a duplicate whose primary is that first, chained through
// next in page order; no other item is linked.
func checkDedupe(t *testing.T, keys [][]byte, items []item, pendingBefore []bool, ids []string) {
	t.Helper()
	first := map[string]int{}
	last := map[string]int{}
	for i := range items {
		it := &items[i]
		if !pendingBefore[i] {
			assert.NotEqual(t, duplicate, it.out, "item %d (%q): not pending, made a duplicate", i, keys[i])
			assert.Zero(t, it.next, "item %d (%q): not pending, chained", i, keys[i])
			continue
		}
		id := ids[i]
		require.Equal(t, id, it.id, "item %d id", i)
		j, seen := first[id]
		if !seen {
			first[id], last[id] = i, i
			assert.NotEqual(t, duplicate, it.out, "item %d (%q): the first of id %q made a duplicate", i, keys[i], id)
			continue
		}
		assert.Equal(t, duplicate, it.out, "item %d (%q): a second marker of id %q not a duplicate", i, keys[i], id)
		assert.Equal(t, int32(j), it.primary, "item %d: primary", i)
		assert.Equal(t, int32(i)+1, items[last[id]].next, "item %d: chained after item %d", i, last[id])
		last[id] = i
	}
	for id, l := range last {
		assert.Zero(t, items[l].next, "the chain of %q ends at its last marker", id)
	}
}

// TestDuplicatesOnRandomPagesMatchAPlainModel: random pages, parsed one after another
// by one Sweep (so the map of ids is reused page to page), with many
// duplicates of a few ids, ids that differ by a byte or by length, keys
// that are no markers, and a Config.ValidateID that refuses some ids and
// panics on others: the page's items are chained as the model says.
func TestDuplicatesOnRandomPagesMatchAPlainModel(t *testing.T) {
	t.Parallel()
	alphabet := []string{"a", "A", "aa", "a\x00", "ab", "ba", "x", "x1", "1x", "\xff", "\xfe", "é", "e\u0301", "refuse-me", "panic-me", strings.Repeat("z", 200), strings.Repeat("z", 201)}
	for _, validate := range []bool{false, true} {
		cfg := Config{Clear: func(context.Context, string) error { return nil }}
		if validate {
			cfg.ValidateID = func(id string) error {
				switch id {
				case "refuse-me":
					return errors.New("refused")
				case "panic-me":
					panic("validate")
				}
				return nil
			}
		}
		s, _ := newSweep(t, NewMemKV(), cfg)
		rng := rand.New(rand.NewPCG(1, uint64(len(alphabet))))
		var dups, others [2]int // by range: duplicates, items not pending
		for page := range 400 {
			inRetry := page%2 == 1
			p := &passState{cutoffMs: t0.UnixMilli() + 1, inRetry: inRetry, retryDueMs: t0.UnixMilli() + 1}
			if inRetry {
				p.cutoffMs = t0.UnixMilli() - 500 // retry keys finished since are not expired
			}
			n := 1 + rng.IntN(300)
			if page%50 == 0 {
				n = 2000
			}
			var keys [][]byte
			for i := range n {
				if rng.IntN(20) == 0 {
					keys = append(keys, []byte(fmt.Sprintf("runs/x%d", i))) // foreign (not marker-shaped)
					continue
				}
				id := alphabet[rng.IntN(len(alphabet))]
				if rng.IntN(3) == 0 {
					id = fmt.Sprintf("u%d", rng.IntN(n+1)) // mostly distinct
				}
				at := t0.UnixMilli() - int64(n-i)
				if inRetry {
					kind := byte(rng.IntN(4)) // keyDeadline and keyHeld
					keys = append(keys, appendRetryKey(nil, "runs/", kind, at, at-int64(rng.IntN(1000)), 1+rng.IntN(3), id))
					continue
				}
				k, err := MarkerKey("runs/", time.UnixMilli(at), "placeholder")
				require.NoError(t, err)
				keys = append(keys, append(k[:len(k)-len("placeholder")], id...))
			}
			slices.SortStableFunc(keys, func(a, b []byte) int { return strings.Compare(string(a), string(b)) })
			items := s.parsePage(p, keys)
			require.Len(t, items, len(keys))
			pending := make([]bool, len(items))
			ids := make([]string, len(items))
			for i, k := range keys {
				var id []byte
				var foreign, notExpired bool
				var err error
				if inRetry {
					var rk retryKey
					rk, foreign, err = parseRetryKey("runs/", retryInfix, k)
					id, notExpired = rk.id, rk.kind&keyDeadline == 0 && rk.finished >= p.cutoffMs
				} else {
					_, id, foreign, err = parseKey("runs/", k)
				}
				sid := string(id)
				ids[i] = sid
				switch {
				case foreign || err != nil || notExpired:
				case !validate && !validID(id):
				case validate && (sid == "refuse-me" || sid == "panic-me"):
				default:
					pending[i] = true
				}
				if !pending[i] {
					assert.NotEqual(t, pending, items[i].out, "page %d item %d (%q): pending", page, i, k)
				}
			}
			checkDedupe(t, keys, items, pending, ids)
			for i := range items {
				switch {
				case items[i].out == duplicate:
					dups[page%2]++
				case !pending[i]:
					others[page%2]++
				}
			}
			if t.Failed() {
				t.Fatalf("page %d (validate %v, retry range %v)", page, validate, inRetry)
			}
		}
		t.Logf("validate %v: duplicates %v, not pending %v (expired range, retry range)", validate, dups, others)
		require.Positive(t, min(dups[0], dups[1], others[0], others[1]))
	}
}
