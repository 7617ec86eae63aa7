package retention

import (
	"bytes"
	"context"
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
