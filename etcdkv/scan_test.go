package etcdkv_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
)

func stampKey(prefix string, ms uint64, rest string) []byte {
	return fmt.Appendf(nil, "%s%020d%s", prefix, ms, rest)
}

// windowedKeys is a key set that stresses Scan's windows: a dense run,
// keys ages apart, keys on 20-digit boundaries with and without an id,
// and keys under the prefix that are not markers.
func windowedKeys() [][]byte {
	var keys [][]byte
	for i := range 300 {
		keys = append(keys, stampKey("m/", 1_000_000+uint64(i), fmt.Sprintf("/id-%d", i)))
	}
	for _, ms := range []uint64{0, 1, 44, 999_999, 1_000_300, 1_000_344, 5_000_000_000, 9_000_000_000_000, 18_000_000_000_000_000_000} {
		keys = append(keys, stampKey("m/", ms, ""), stampKey("m/", ms, "/a"), stampKey("m/", ms, "\x00"))
	}
	for _, k := range []string{
		"m/", "m/0", "m/0abc", "m/0000000000000100002", "m/00000000000001000010x", "m/0000000000000100001000000",
		"m/99999999999999999999", "m/99999999999999999999999/x", "m/:", "m/~", "m0", "l/00000000000001000000/a",
	} {
		keys = append(keys, []byte(k))
	}
	slices.SortFunc(keys, bytes.Compare)
	return slices.CompactFunc(keys, bytes.Equal)
}

func inRange(keys [][]byte, start, end []byte, limit int) [][]byte {
	var out [][]byte
	for _, k := range keys {
		if bytes.Compare(k, start) >= 0 && bytes.Compare(k, end) < 0 && len(out) < limit {
			out = append(out, k)
		}
	}
	return out
}

// TestScanMatchesOneRange compares windowed Scans with the answer of one
// range over the same keys, for ranges between many bounds and several
// limits, on one KV whose learned densities and landmarks keep changing
// from scan to scan, and on fresh ones.
func TestScanMatchesOneRange(t *testing.T) {
	kv, _, put, fresh := benchKVs(t)
	keys := windowedKeys()
	put(keys)
	ctx := context.Background()

	bounds := [][]byte{
		[]byte("m/"), []byte("m/0"), stampKey("m/", 0, ""), stampKey("m/", 1, "/a\x00"), stampKey("m/", 44, ""),
		stampKey("m/", 999_999, ""), stampKey("m/", 1_000_000, ""), stampKey("m/", 1_000_150, "/id-150\x00"),
		stampKey("m/", 1_000_344, ""), stampKey("m/", 4_999_999_999, ""), stampKey("m/", 9_000_000_000_000, "/a"),
		[]byte("m/0000000000000100002"), []byte("m/99999999999999999999"), []byte("m/:"), []byte("m0"), []byte("n"),
	}
	slices.SortFunc(bounds, bytes.Compare)
	limits := []int{1, 2, 7, 50, 1000}
	for i, start := range bounds {
		for _, end := range bounds[i+1:] {
			for _, limit := range limits {
				got, err := kv.Scan(ctx, start, end, limit)
				require.NoError(t, err)
				require.Equal(t, inRange(keys, start, end, limit), got, "Scan(%q, %q, %d)", start, end, limit)
			}
		}
	}

	// Paging through with fresh KVs and one that has learned.
	for _, page := range []int{1, 3, 64, 256} {
		for _, isFresh := range []bool{true, false} {
			k := kv
			if isFresh {
				k = fresh()
			}
			var got [][]byte
			from := []byte("m/")
			for {
				p, err := k.Scan(ctx, from, []byte("m/:"), page)
				require.NoError(t, err)
				got = append(got, p...)
				if len(p) < page {
					break
				}
				from = append(bytes.Clone(p[len(p)-1]), 0)
			}
			require.Equal(t, inRange(keys, []byte("m/"), []byte("m/:"), len(keys)), got, "pages of %d (fresh KV: %v)", page, isFresh)
		}
	}
}

// TestScanRandomized checks Scan against one range over random marker
// sets with bursts and long gaps, while keys come and go between scans.
func TestScanRandomized(t *testing.T) {
	kv, _, put := benchKV(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	var keys [][]byte
	ms := uint64(1_700_000_000_000)
	for i := range 2000 {
		switch rng.IntN(10) {
		case 0:
			ms += uint64(rng.Int64N(10_000_000_000)) // a long gap
		case 1, 2, 3:
			// the same millisecond
		default:
			ms += uint64(rng.IntN(50))
		}
		keys = append(keys, stampKey("r/", ms, fmt.Sprintf("/%d", i)))
	}
	put(keys)
	slices.SortFunc(keys, bytes.Compare)
	for round := range 300 {
		a, b := keys[rng.IntN(len(keys))], keys[rng.IntN(len(keys))]
		if rng.IntN(4) == 0 {
			a = []byte("r/0")
		}
		if rng.IntN(4) == 0 {
			b = []byte("r/:")
		}
		if bytes.Compare(a, b) > 0 {
			a, b = b, a
		}
		limit := []int{1, 5, 100, 256}[rng.IntN(4)]
		got, err := kv.Scan(ctx, a, b, limit)
		require.NoError(t, err)
		require.Equal(t, inRange(keys, a, b, limit), got, "round %d: Scan(%q, %q, %d)", round, a, b, limit)
		if len(got) > 0 && len(keys) > 100 && rng.IntN(3) == 0 {
			// Delete some of what was read, as a sweep does.
			gone := got[:min(len(got), 8)]
			require.NoError(t, kv.Delete(ctx, gone...))
			keys = slices.DeleteFunc(keys, func(k []byte) bool {
				_, found := slices.BinarySearchFunc(gone, k, bytes.Compare)
				return found
			})
		}
	}
}

// TestIdlePassCountsFewKeys counts, with the server's own Count, the keys
// each range request of an idle pass made etcd walk: once the KV has seen
// the markers, a pass makes three requests (the expired range, the next
// marker, the retry range's first key) that count a key or two, however
// many markers wait; after an idle pass two (the range's first key, the
// retry range's first key).
func TestIdlePassCountsFewKeys(t *testing.T) {
	for _, n := range []int{100, 5000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			kv, ckv, put := benchKV(t)
			put(markers(t, "bench/", n, benchNow))
			sw, err := retention.New(kv, retention.Config{
				Prefix: "bench/", Retention: time.Hour, Clock: retention.NewManualClock(benchNow),
				Clear: func(context.Context, string) error { return nil },
			})
			require.NoError(t, err)
			ctx := context.Background()
			_, err = sw.Pass(ctx)
			require.NoError(t, err)
			ckv.take()
			for range 3 {
				st, err := sw.Pass(ctx)
				require.NoError(t, err)
				assert.Zero(t, st.Cleared)
				assert.True(t, st.NextDue.Equal(benchNow.Add(time.Hour)), "Pass().NextDue = %v, want %v", st.NextDue, benchNow.Add(time.Hour))
				counts := ckv.take()
				assert.Len(t, counts, 2, "requests per idle pass after an idle pass")
				assert.LessOrEqual(t, sum(counts), int64(2), "keys counted per idle pass: %v", counts)
			}
		})
	}
}

// TestIdlePassOnNothing: with no marker at all, an idle pass does not step
// through empty windows to the end of the key space.
func TestIdlePassOnNothing(t *testing.T) {
	kv, ckv, _ := benchKV(t)
	sw, err := retention.New(kv, retention.Config{
		Prefix: "bench/", Retention: time.Hour, Clock: retention.NewManualClock(benchNow),
		Clear: func(context.Context, string) error { return nil },
	})
	require.NoError(t, err)
	for i := range 4 {
		st, err := sw.Pass(context.Background())
		require.NoError(t, err)
		assert.True(t, st.NextDue.IsZero(), "Pass().NextDue = %v, want zero", st.NextDue)
		// The expired range, two empty windows of the peek, then the rest,
		// and the empty retry range.
		assert.LessOrEqual(t, len(ckv.take()), 5, "requests in pass %d", i)
	}
}

// TestDrainCountsAboutAPage counts the keys each range request made etcd
// walk while one pass drains a backlog: after the first request, which
// finds the markers, none counts more than a few pages, where one request
// per page would count the whole remaining backlog.
func TestDrainCountsAboutAPage(t *testing.T) {
	const n, page = 5000, 100
	kv, ckv, put := benchKV(t)
	put(markers(t, "bench/", n, benchNow.Add(-2*time.Hour)))
	sw, err := retention.New(kv, retention.Config{
		Prefix: "bench/", Retention: time.Hour, PageSize: page, Clock: retention.NewManualClock(benchNow),
		Clear: func(context.Context, string) error { return nil },
	})
	require.NoError(t, err)
	st, err := sw.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, n, st.Cleared)
	counts := ckv.take()
	assert.Equal(t, int64(n), counts[0], "the first request finds the backlog")
	for i, c := range counts[1:] {
		assert.LessOrEqual(t, c, int64(3*page), "request %d counted %d keys", i+1, c)
	}
	assert.LessOrEqual(t, len(counts), 2*(n/page+1), "requests")
}

// TestDrainIrregularBacklog drains markers with bursts and gaps of days:
// every one is cleared, and the keys etcd counts stay a small multiple of
// the backlog, where one request per page counts it about n/page/2 times.
func TestDrainIrregularBacklog(t *testing.T) {
	const n, page = 3000, 100
	kv, ckv, put := benchKV(t)
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([][]byte, n)
	at := benchNow.Add(-100_000 * time.Hour) // far enough back that all expire
	for i := range keys {
		switch rng.IntN(20) {
		case 0:
			at = at.Add(time.Duration(rng.Int64N(int64(48 * time.Hour))))
		case 1, 2, 3, 4, 5:
		default:
			at = at.Add(time.Duration(rng.IntN(100)) * time.Millisecond)
		}
		k, err := retention.MarkerKey("bench/", at, fmt.Sprint(i))
		require.NoError(t, err)
		keys[i] = k
	}
	put(keys)
	var cleared atomic.Int64
	sw, err := retention.New(kv, retention.Config{
		Prefix: "bench/", Retention: time.Hour, PageSize: page, Clock: retention.NewManualClock(benchNow),
		Clear: func(context.Context, string) error { cleared.Add(1); return nil },
	})
	require.NoError(t, err)
	st, err := sw.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, n, st.Cleared)
	require.Equal(t, int64(n), cleared.Load())
	counts := ckv.take()
	t.Logf("%d requests counted %d keys in all", len(counts), sum(counts))
	assert.LessOrEqual(t, sum(counts), int64(4*n), "keys counted over %d requests", len(counts))
}
