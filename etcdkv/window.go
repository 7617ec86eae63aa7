package etcdkv

import (
	"bytes"
	"math"
	"math/bits"
	"sync"
)

// A Scan is cut into windows because an etcd range request costs O(keys in
// its range) on every server release to date, whatever its limit: the server
// walks its in-memory index over the whole range to fill in the response's
// Count (etcd-io/etcd#11057, #16510). In 3.4 the MVCC layer collects the
// revision of every live key of the range (treeIndex.Revisions, no limit)
// and only then reads limit+1 values; 3.5 and 3.6 pass the limit down but
// keep walking the index to count the rest; the unary Range RPC of 3.7
// still asks for that total, and only the streaming RangeStream skips it.
// Nothing a client sets avoids the walk: WithCountOnly is the same walk,
// WithKeysOnly only skips values, WithSerializable only the read-index
// round, a revision filter (WithMinModRev, ...) makes the server drop the
// limit and read every value, and no server flag turns the count off; a
// sort by key, ascending, would drop the limit on a 3.4 server (clientv3
// sends the default order, which keeps it). Deleted keys cost too until a
// compaction. So the only way to bound a request is to narrow it. Reading [start, end) as consecutive windows
// [start, w1), [w1, w2), ..., [wk, end), each with the limit still missing,
// returns exactly what one request over [start, end) would (the windows
// partition the range and are read in order), while each request counts only
// the keys of its window. Where the windows fall is a guess that only costs
// time when it is wrong, never keys.
//
// Windows are measured in the timestamp of marker keys, <prefix><20-digit
// ms>/<id>: where a Scan's start has digits right after the bytes it shares
// with its end (the prefix), a window is [cursor, prefix + cursor's time +
// width). Widths come from a density of keys per millisecond that the KV
// learns, per prefix, from the Count of every response, aiming at
// windowKeys(limit) keys a window; after maxEmptyWindows empty ones, the
// rest of the range is one request, so that a scan past the last key does
// not step to the end of the key space. The KV also remembers the last key each
// prefix returned (the landmark): the next pass's scans start below it
// and have seen nothing live there since, so one request up to it and a
// sized window after it usually answer them.

const (
	// stampDigits is how many digits a marker's timestamp has.
	stampDigits = 20
	// growth is how much wider a window gets after an empty one.
	growth = 16
	// exploreDensity is the density, in keys per millisecond, assumed for
	// a prefix nothing is known about yet.
	exploreDensity = 1.0 / 1024
	// maxEmptyWindows is how many empty sized windows a Scan reads before
	// it reads the rest of its range in one request.
	maxEmptyWindows = 2
	// maxFamilies bounds how many prefixes a KV remembers.
	maxFamilies = 1024
)

// windowKeys is how many keys a window aims at for a Scan of limit keys:
// enough that density noise seldom leaves a page short of one more
// request, few enough that the walk stays small beside a round trip.
func windowKeys(limit int) float64 { return float64(limit)*1.5 + 8 }

// family is what a KV has learned about the keys under one prefix.
type family struct {
	density  float64 // keys per millisecond; 0 means unknown
	landmark []byte  // the last key a Scan returned, or nil
}

// families holds what a KV has learned, per prefix. It is only ever a hint.
type families struct {
	mu sync.Mutex
	m  map[string]family
}

func (f *families) get(prefix []byte) family {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[string(prefix)]
}

func (f *families) set(prefix []byte, fam family) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil || len(f.m) >= maxFamilies {
		// Forgetting costs one exploration per prefix; growing without
		// bound would cost memory for callers that scan arbitrary ranges.
		f.m = make(map[string]family)
	}
	f.m[string(prefix)] = fam
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// stampStart returns where the timestamp of the keys in [start, end) begins:
// the start of the digit run in start that reaches the end of the bytes
// start and end share, or the first byte after them. ok is false when start
// has no digit there, and the range is then read in one request.
func stampStart(start, end []byte) (int, bool) {
	q := 0
	for q < len(start) && q < len(end) && start[q] == end[q] {
		q++
	}
	t0 := q
	for t0 > 0 && isDigit(start[t0-1]) {
		t0--
	}
	return t0, t0 < len(start) && isDigit(start[t0])
}

// stamp reads the up to 20 digits of key from t0 as a 20-digit number of
// milliseconds, missing digits counting as zeros. full says all 20 were
// there; ok is false when there are none or the number overflows.
func stamp(key []byte, t0 int) (ms uint64, full, ok bool) {
	n := 0
	for ; n < stampDigits && t0+n < len(key) && isDigit(key[t0+n]); n++ {
		hi, lo := bits.Mul64(ms, 10)
		lo, carry := bits.Add64(lo, uint64(key[t0+n]-'0'), 0)
		if hi != 0 || carry != 0 {
			return 0, false, false
		}
		ms = lo
	}
	if n == 0 {
		return 0, false, false
	}
	for range stampDigits - n {
		hi, lo := bits.Mul64(ms, 10)
		if hi != 0 {
			return 0, false, false
		}
		ms = lo
	}
	return ms, n == stampDigits, true
}

// appendStamp appends ms as 20 digits.
func appendStamp(dst []byte, ms uint64) []byte {
	var buf [stampDigits]byte
	for i := stampDigits - 1; i >= 0; i-- {
		buf[i] = '0' + byte(ms%10)
		ms /= 10
	}
	return append(dst, buf[:]...)
}

// window is one request of a Scan: [cursor, end), and its width in
// milliseconds when it was sized from a density (0 otherwise).
type window struct {
	end   []byte
	width uint64
}

// nextWindow picks the window that starts at cursor, within [cursor, end):
// up to the landmark when there is one ahead, else a width of want keys at
// density, else (no density, or a cursor without a whole timestamp) the
// rest of the range. It always ends after cursor and never after end.
func nextWindow(cursor, end []byte, t0 int, fam family, want float64) window {
	if lm := fam.landmark; lm != nil && bytes.Compare(lm, cursor) >= 0 && bytes.Compare(lm, end) < 0 {
		return window{end: append(bytes.Clone(lm), 0)}
	}
	ms, full, ok := stamp(cursor, t0)
	if !ok || !full {
		return window{end: end}
	}
	density := fam.density
	if density <= 0 {
		density = exploreDensity
	}
	w := math.Ceil(want / density)
	if !(w < float64(math.MaxUint64-ms)) { // also NaN
		return window{end: end}
	}
	width := uint64(max(w, 1))
	if width > math.MaxUint64-ms { // float64 rounded up
		return window{end: end}
	}
	we := appendStamp(append(make([]byte, 0, t0+stampDigits), cursor[:t0]...), ms+width)
	if bytes.Compare(we, end) >= 0 || bytes.Compare(we, cursor) <= 0 {
		return window{end: end}
	}
	return window{end: we, width: width}
}

// learn updates fam's density from a response that returned keys (got of
// the need asked for) and counted count keys in a window of w.
func learn(fam *family, w window, t0 int, keys [][]byte, need int, count int64) {
	switch {
	case w.width > 0 && count == 0:
		d := fam.density
		if d <= 0 {
			d = exploreDensity
		}
		fam.density = d / growth
	case w.width > 0:
		fam.density = float64(count) / float64(w.width)
	case len(keys) >= 2 && len(keys) == need:
		// The window was not sized (the rest of the range, or up to the
		// landmark): the returned keys' own spread is the density where
		// the next page starts.
		first, _, ok1 := stamp(keys[0], t0)
		last, _, ok2 := stamp(keys[len(keys)-1], t0)
		if ok1 && ok2 && last >= first {
			fam.density = float64(len(keys)) / float64(last-first+1)
		}
	}
}
