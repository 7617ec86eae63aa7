package retention

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemKVBasics(t *testing.T) {
	t.Parallel()
	for name, kv := range map[string]*MemKV{"NewMemKV": NewMemKV(), "zero value": {}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testMemKVBasics(t, kv)
		})
	}
}

func testMemKVBasics(t testing.TB, kv *MemKV) {
	ctx := context.Background()
	for _, k := range []string{"b", "a", "c", "\x00", "\xff", "ab", "b"} {
		require.NoError(t, kv.Put(ctx, []byte(k), []byte("v"+k)))
	}
	assert.Equal(t, 6, kv.Len(), "a repeated Put replaces")

	tests := []struct {
		start, end string
		limit      int
		want       []string
	}{
		{"", "\xff\xff", 100, []string{"\x00", "a", "ab", "b", "c", "\xff"}},
		{"a", "c", 100, []string{"a", "ab", "b"}},
		{"a", "c", 2, []string{"a", "ab"}},
		{"aa", "b", 100, []string{"ab"}},
		{"c", "c", 100, nil},
		{"d", "a", 100, nil},
		{"\xff", "\xff\x00", 1, []string{"\xff"}},
	}
	for _, tt := range tests {
		got, err := kv.Scan(ctx, []byte(tt.start), []byte(tt.end), tt.limit)
		require.NoError(t, err)
		var gotS []string
		for _, k := range got {
			gotS = append(gotS, string(k))
		}
		assert.Equal(t, tt.want, gotS, "Scan(%q, %q, %d)", tt.start, tt.end, tt.limit)
	}

	v, ok, err := kv.Get(ctx, []byte("ab"))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "vab", string(v))
	_, ok, err = kv.Get(ctx, []byte("zz"))
	require.NoError(t, err)
	assert.False(t, ok)

	require.NoError(t, kv.Delete(ctx, []byte("ab"), []byte("missing"), []byte("\x00")))
	assert.Equal(t, 4, kv.Len())
	_, err = kv.Scan(ctx, nil, []byte("z"), 0)
	require.Error(t, err, "limit 0 is refused")
}

func TestMemKVScanSlicesAreOwned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := NewMemKV()
	require.NoError(t, kv.Put(ctx, []byte("k1"), nil))
	require.NoError(t, kv.Put(ctx, []byte("k2"), nil))
	got, err := kv.Scan(ctx, []byte("k"), []byte("l"), 10)
	require.NoError(t, err)
	got[0][0] = 'X'
	_ = append(got[0], "overflow"...)
	again, err := kv.Scan(ctx, []byte("k"), []byte("l"), 10)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{[]byte("k1"), []byte("k2")}, again)
	assert.Equal(t, "k2", string(got[1]), "appending to one key must not overwrite the next")
}

func TestMemKVCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	kv := NewMemKV()
	_, err := kv.Scan(ctx, nil, []byte("z"), 1)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, kv.Delete(ctx, []byte("a")), context.Canceled)
	require.ErrorIs(t, kv.Put(ctx, []byte("a"), nil), context.Canceled)
	_, _, err = kv.Get(ctx, []byte("a"))
	require.ErrorIs(t, err, context.Canceled)
}

// TestMemKVMatchesModel drives MemKV and a sorted slice with the same random
// operations and requires the same answers.
func TestMemKVMatchesModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 7))
	kv := NewMemKV()
	var model []string
	randKey := func() []byte {
		k := make([]byte, 1+rng.IntN(3))
		for i := range k {
			k[i] = "\x00ab\xff"[rng.IntN(4)]
		}
		return k
	}
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 4:
			k := randKey()
			require.NoError(t, kv.Put(ctx, k, nil))
			if i, found := slices.BinarySearch(model, string(k)); !found {
				model = slices.Insert(model, i, string(k))
			}
		case op < 7:
			ks := [][]byte{randKey(), randKey()}
			require.NoError(t, kv.Delete(ctx, ks...))
			for _, k := range ks {
				if i, found := slices.BinarySearch(model, string(k)); found {
					model = slices.Delete(model, i, i+1)
				}
			}
		default:
			start, end, limit := randKey(), randKey(), 1+rng.IntN(5)
			got, err := kv.Scan(ctx, start, end, limit)
			require.NoError(t, err)
			var want [][]byte
			for _, k := range model {
				if len(want) < limit && k >= string(start) && k < string(end) {
					want = append(want, []byte(k))
				}
			}
			require.Equal(t, want, got, "step %d: Scan(%q, %q, %d)", step, start, end, limit)
		}
		require.Equal(t, len(model), kv.Len(), "step %d", step)
	}
}

func TestMemKVConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := NewMemKV()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				k := fmt.Appendf(nil, "w%d/%04d", w, i)
				assert.NoError(t, kv.Put(ctx, k, nil))
				if i%2 == 0 {
					assert.NoError(t, kv.Delete(ctx, k))
				}
				_, err := kv.Scan(ctx, []byte("w"), []byte("x"), 8)
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 4*250, kv.Len())
}

func TestMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := NewMemKV()
	at := time.UnixMilli(1764000000123)
	require.NoError(t, Mark(ctx, kv, "jobs/", "j1", at))
	keys, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("jobs/00000001764000000123/j1")}, keys)
	require.ErrorIs(t, Mark(ctx, kv, "jobs/", "", at), ErrInvalidID)
	require.ErrorIs(t, Mark(ctx, kv, "jobs/", "j2", time.UnixMilli(-5)), ErrInvalidTime)
	assert.Equal(t, 1, kv.Len(), "refused markers are not written")
}

func TestManualClock(t *testing.T) {
	t.Parallel()
	c := NewManualClock(t0)
	assert.Equal(t, t0, c.Now())
	assert.Equal(t, t0.Add(time.Minute), c.Advance(time.Minute))
	assert.Equal(t, t0.Add(time.Minute), c.Now())
	c.Set(t0.Add(-time.Hour))
	assert.Equal(t, t0.Add(-time.Hour), c.Now())
	var zero ManualClock
	assert.True(t, zero.Now().IsZero())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { c.Advance(time.Second); _ = c.Now() })
	}
	wg.Wait()
	assert.Equal(t, t0.Add(-time.Hour+8*time.Second), c.Now())
}

func TestSystemClock(t *testing.T) {
	t.Parallel()
	before := time.Now()
	got := SystemClock.Now()
	assert.False(t, got.Before(before))
}

// TestMemKVTailAndSeeksMatchModel: Put, Delete and Move of the first,
// last and only keys keep the tail right; every Scan and Get (the seek
// fast paths: before the first key, past the last, on either) agrees with
// a sorted model. Zero MemKV included.
func TestMemKVTailAndSeeksMatchModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// 12 seeds of 400 steps over 18 keys reach every shape of the skip
	// list (empty, one key, the tail moved, deleted, passed) many times.
	for seed := range uint64(12) {
		r := rand.New(rand.NewPCG(seed, 7))
		var m *MemKV
		if seed%2 == 0 {
			m = &MemKV{}
		} else {
			m = NewMemKV()
		}
		model := map[string]bool{}
		key := func() []byte { return []byte{byte('a' + r.IntN(6)), byte('a' + r.IntN(3))} }
		sorted := func() []string {
			var ks []string
			for k := range model {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			return ks
		}
		for step := range 400 {
			switch r.IntN(5) {
			case 0, 1:
				k := key()
				require.NoError(t, m.Put(ctx, k, nil))
				model[string(k)] = true
			case 2:
				ks := sorted()
				var k []byte
				switch {
				case len(ks) > 0 && r.IntN(2) == 0:
					k = []byte(ks[0])
				case len(ks) > 0 && r.IntN(2) == 0:
					k = []byte(ks[len(ks)-1])
				default:
					k = key()
				}
				require.NoError(t, m.Delete(ctx, k))
				delete(model, string(k))
			case 3:
				ks := sorted()
				if len(ks) == 0 {
					continue
				}
				from := []byte(ks[len(ks)-1])
				if r.IntN(2) == 0 {
					from = []byte(ks[0])
				}
				to := key()
				if r.IntN(3) == 0 {
					to = append([]byte("z"), to...) // past every key
				} else if r.IntN(2) == 0 {
					to = append([]byte("0"), to...) // before every key
				}
				require.NoError(t, m.Move(ctx, [][]byte{from}, [][]byte{to}))
				delete(model, string(from))
				model[string(to)] = true
			case 4:
			}
			ks := sorted()
			require.Equal(t, len(ks), m.Len(), "seed %d step %d", seed, step)
			for _, start := range [][]byte{nil, []byte("0"), []byte("a"), key(), []byte("zz"), []byte("zzz"), []byte("{")} {
				for _, limit := range []int{1, 3, 100} {
					got, err := m.Scan(ctx, start, []byte("~"), limit)
					require.NoError(t, err)
					var want []string
					for _, k := range ks {
						if k >= string(start) && len(want) < limit {
							want = append(want, k)
						}
					}
					var gs []string
					for _, g := range got {
						gs = append(gs, string(g))
					}
					require.Equal(t, want, gs, "seed %d step %d start %q limit %d", seed, step, start, limit)
				}
				_, ok, err := m.Get(ctx, start)
				require.NoError(t, err)
				require.Equal(t, model[string(start)], ok)
			}
			if len(ks) > 0 {
				require.Equal(t, ks[len(ks)-1], string(m.tail.key), "tail, seed %d step %d", seed, step)
			} else {
				require.Nil(t, m.tail)
			}
		}
	}
}
