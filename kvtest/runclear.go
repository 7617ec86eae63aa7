package kvtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// runClearer returns the store's KV as a retention.RunClearer, or skips
// the test when it is not one: the ClearRun behaviours check an optional
// ability. Counting, it returns the store's CountRun as a ClearRun (see
// counter), or skips the test when the KV is no retention.RunCounter.
func runClearer(t *testing.T, s Store) retention.RunClearer {
	t.Helper()
	rc, ok := s.KV.(retention.RunClearer)
	if !ok {
		t.Skipf("the KV (%T) is not a retention.RunClearer", s.KV)
	}
	if s.counting {
		c, ok := s.KV.(retention.RunCounter)
		if !ok {
			t.Skipf("the KV (%T) is not a retention.RunCounter", s.KV)
		}
		return counter{c, t, s, new(int)}
	}
	return rc
}

// counting returns behaviour run with the store's runs taken by CountRun.
func counting(behaviour func(*testing.T, Store)) func(*testing.T, Store) {
	return func(t *testing.T, s Store) {
		s.counting = true
		behaviour(t, s)
	}
}

// counter is a RunCounter seen as a RunClearer by the ClearRun behaviours:
// its ClearRun calls CountRun, asking for the times at every other call
// (the first included), checks that the answer tells what the run deleted
// (how many, the first key's time, the last key gone, and when asked one
// time per key gone, in order), and returns the keys gone; with an error,
// the answer's Keys.
type counter struct {
	retention.RunCounter
	t     *testing.T
	s     Store
	calls *int
}

func (c counter) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	c.t.Helper()
	before := allKeys(c.t, c.s)
	times := *c.calls%2 == 0
	*c.calls++
	rc, err := c.CountRun(ctx, prefix, from, end, limit, times)
	if err != nil {
		return rc.Keys, err
	}
	gone := missing(before, allKeys(c.t, c.s))
	call := fmt.Sprintf("CountRun(%q, %q, %q, %d, %t)", prefix, from, end, limit, times)
	var want []int64
	for _, k := range gone {
		at, _, perr := retention.ParseMarkerKey(prefix, []byte(k))
		if perr != nil {
			c.t.Errorf("%s deleted %q, no marker of %q: %v", call, k, prefix, perr)
			continue
		}
		want = append(want, at.UnixMilli())
	}
	if rc.N != len(gone) {
		c.t.Errorf("%s answered a count of %d, having deleted %q", call, rc.N, gone)
	}
	if len(want) > 0 && rc.First != want[0] {
		c.t.Errorf("%s answered the first time %d, having deleted %q: want %d", call, rc.First, gone, want[0])
	}
	if (times || rc.Times != nil) && !slices.Equal(rc.Times, want) {
		c.t.Errorf("%s answered the times %v for the keys it deleted, %q: want %v, one per key, ascending", call, rc.Times, gone, want)
	}
	var last []byte
	if len(gone) > 0 {
		last = []byte(gone[len(gone)-1])
	}
	if !bytes.Equal(rc.Last, last) {
		c.t.Errorf("%s answered the last key %q, having deleted %q: want %q", call, rc.Last, gone, last)
	}
	keys := make([][]byte, len(gone))
	for i, k := range gone {
		keys[i] = []byte(k)
	}
	return keys, nil
}

// runCall is the arguments of one ClearRun.
type runCall struct {
	prefix, from, end string
	limit             int
}

func (c runCall) String() string {
	return fmt.Sprintf("ClearRun(%q, %q, %q, %d)", c.prefix, c.from, c.end, c.limit)
}

// allKeys returns every key of the store, which holds only those the
// behaviour wrote.
func allKeys(t *testing.T, s Store) []string {
	t.Helper()
	return scanAll(t, s, "", "\xff", 1000)
}

// clearRun calls ClearRun with ctx and checks what any call must have
// done to the store: one that returned no error deleted exactly the keys
// it returned, and one that failed changed nothing. When the store says
// errors.ErrUnsupported, having changed nothing, the behaviour is skipped:
// a sweep then reads pages, and calls ClearRun no more.
func clearRun(ctx context.Context, t *testing.T, s Store, rc retention.RunClearer, c runCall) ([]string, error) {
	t.Helper()
	before := allKeys(t, s)
	got, err := rc.ClearRun(ctx, c.prefix, []byte(c.from), []byte(c.end), c.limit)
	keys := make([]string, len(got))
	for i, k := range got {
		keys[i] = string(k)
	}
	after := allKeys(t, s)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		if !slices.Equal(after, before) {
			t.Fatalf("%s = %v, having deleted %q: a store that cannot clear runs must say so before it changes anything",
				c, err, missing(before, after))
		}
		t.Skipf("%s = %v: the store cannot clear runs", c, err)
	case err != nil:
		if !slices.Equal(after, before) {
			t.Errorf("%s = %v, having deleted %q: a call that fails must change nothing", c, err, missing(before, after))
		}
	default:
		if left := missing(before, keys); !slices.Equal(after, left) {
			t.Errorf("keys after %s returned %q = %q, want %q: a run deletes the keys it returns, and no other",
				c, keys, after, left)
		}
	}
	return keys, err
}

// missing returns the keys of before that are not in after.
func missing(before, after []string) []string {
	return slices.DeleteFunc(slices.Clone(before), func(k string) bool { return slices.Contains(after, k) })
}

// runMarkers returns n marker keys of prefix, ascending: ids "m0", "m1",
// ..., a second apart.
func runMarkers(t *testing.T, prefix string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = markerKey(t, prefix, time.UnixMilli(1_700_000_000_000+int64(i)*1000), fmt.Sprintf("m%d", i))
	}
	return keys
}

// stampOf returns the timestamp of a marker of at, as MarkerKey writes it.
func stampOf(at time.Time) string {
	return fmt.Sprintf("%0*d", retention.TimestampWidth, at.UnixMilli())
}

// testClearRunStore requires RunStore to return a value of the store's
// own type: a sweep takes runs from no other, and reads its pages instead.
func testClearRunStore(t *testing.T, s Store) {
	rc := runClearer(t, s)
	if got, want := reflect.TypeOf(rc.RunStore()), reflect.TypeOf(s.KV); got != want {
		t.Errorf("RunStore() returned a %v, want the store's own %v: a sweep takes runs only from a KV whose RunStore "+
			"is of its own type (one that embeds a RunClearer and does not declare RunStore is read page by page)", got, want)
	}
}

// testClearRunLimit takes a range's markers in runs of several sizes, the
// last just as many as are left: each run is the first limit keys of the
// range, ascending, and returned exactly. The markers were written out of
// order, and share timestamps and their ids' first bytes; the keys that
// follow them in the range, and those of neighbouring prefixes, are no
// markers of the prefix, and a run that stops before them is not refused.
func testClearRunLimit(t *testing.T, s Store) {
	rc := runClearer(t, s)
	const prefix = "cr/"
	same := time.UnixMilli(1_700_000_000_000)
	var markers []string
	for _, m := range []struct {
		at time.Time
		id string
	}{
		{time.UnixMilli(0), "epoch"},
		{time.UnixMilli(1), strings.Repeat("x", retention.MaxIDLen)},
		{same, "-"}, {same, "0"}, {same, "A"}, {same, "_"}, {same, "a"}, {same, "a-"},
		{same.Add(time.Millisecond), "a"},
		{retention.MaxMarkerTime, "last"},
	} {
		markers = append(markers, markerKey(t, prefix, m.at, m.id))
	}
	if !slices.IsSorted(markers) {
		t.Fatalf("kvtest: the markers of %s are not in byte order: %q", t.Name(), markers)
	}
	others := []string{
		markerKey(t, "cr.", same, "before"), markerKey(t, "cr0/", same, "after"),
		prefix + "r" + stampOf(same) + "/" + stampOf(same) + "/1/retried", prefix + "x",
	}
	shuffled := append(slices.Clone(markers), others...)
	for i := range shuffled { // a fixed permutation
		j := (i*7 + 3) % len(shuffled)
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	}
	put(t, s, shuffled...)

	all := prefix + "\xff"
	for _, tt := range []struct {
		call runCall
		want []string
	}{
		{runCall{prefix, prefix, all, 1}, markers[:1]},
		{runCall{prefix, prefix, all, 3}, markers[1:4]},
		{runCall{prefix, prefix, all, len(markers) - 4}, markers[4:]}, // the non-markers after them are no part of it
		{runCall{prefix, prefix, prefix + ":", 100}, nil},
	} {
		got, err := clearRun(ctxFor(t), t, s, rc, tt.call)
		if err != nil {
			t.Fatalf("%s error = %v, want %q", tt.call, err, tt.want)
		}
		want(t, tt.call.String(), got, tt.want)
	}
	want(t, "keys left", allKeys(t, s), sortedCopy(others))
}

// testClearRunBounds takes runs of ranges whose ends are keys, or fall
// between keys, or hold none: a run holds the key at from and not the
// key at end, and touches no key outside the range. Each case has a
// prefix of its own, so the others' keys lie around its range.
func testClearRunBounds(t *testing.T, s Store) {
	rc := runClearer(t, s)
	tests := []struct {
		name     string
		from     func(p string, m []string) string
		end      func(p string, m []string) string
		limit    int
		first, n int // the run: n markers from the first-th on
	}{
		{"from and end are keys", markerAt(1), markerAt(4), 100, 1, 3},
		{"from and end between keys", justAfter(1), justAfter(4), 100, 2, 3},
		{"the prefix's markers", prefixAnd(""), prefixAnd(":"), 100, 0, 6},
		{"limit before end", markerAt(1), markerAt(5), 2, 1, 2},
		{"from equals end", markerAt(2), markerAt(2), 100, 0, 0},
		{"no key in the range", justAfter(2), markerAt(3), 100, 0, 0},
		{"past the markers", prefixAnd(":"), prefixAnd("\xff"), 100, 0, 0},
	}
	markers := make([][]string, len(tests))
	for i := range tests {
		markers[i] = runMarkers(t, fmt.Sprintf("cb%02d/", i), 6)
		put(t, s, markers[i]...)
	}
	for i, tt := range tests {
		p, m := fmt.Sprintf("cb%02d/", i), markers[i]
		call := runCall{p, tt.from(p, m), tt.end(p, m), tt.limit}
		got, err := clearRun(ctxFor(t), t, s, rc, call)
		if err != nil {
			t.Errorf("%s: %s error = %v", tt.name, call, err)
			continue
		}
		var wantKeys []string
		if tt.n > 0 {
			wantKeys = m[tt.first : tt.first+tt.n]
		}
		want(t, tt.name+": "+call.String(), got, wantKeys)
	}
}

// markerAt, justAfter and prefixAnd give an end of a range: the i-th
// marker, the key just after it, and the prefix followed by s.
func markerAt(i int) func(string, []string) string {
	return func(_ string, m []string) string { return m[i] }
}

func justAfter(i int) func(string, []string) string {
	return func(_ string, m []string) string { return m[i] + "\x00" }
}

func prefixAnd(s string) func(string, []string) string {
	return func(p string, _ []string) string { return p + s }
}

// testClearRunRefused puts, among three markers of a prefix, a key that is
// no marker of it whose id retention.ValidateID accepts, and requires a
// run over them to be refused with an error matching
// retention.ErrMalformedMarker, changing nothing: a foreign key, a key of
// the sweep's retry or parked range (which retention.ParseMarkerKey reads
// too), a marker whose id or time the rules refuse, and markers of other
// prefixes, within the prefix's keys or before them.
func testClearRunRefused(t *testing.T, s Store) {
	rc := runClearer(t, s)
	stamp := stampOf(time.UnixMilli(1_700_000_000_500)) // between the first two markers
	tests := []struct {
		name  string
		bad   func(p string) string
		from  func(p string) string // nil: p
		limit int                   // 0: 100
	}{
		{"a foreign key", func(p string) string { return p + "0000000000/foreign" }, nil, 0},
		{"the prefix alone", func(p string) string { return p }, nil, 0},
		{"an empty id", func(p string) string { return p + stamp + "/" }, nil, 0},
		{"an id with a dot", func(p string) string { return p + stamp + "/a.b" }, nil, 0},
		{"an id with a byte outside ASCII", func(p string) string { return p + stamp + "/\xe9" }, nil, 0},
		{"an id too long", func(p string) string { return p + stamp + "/" + strings.Repeat("x", retention.MaxIDLen+1) }, nil, 0},
		{"a time after MaxMarkerTime", func(p string) string { return p + strings.Repeat("9", retention.TimestampWidth) + "/late" }, nil, 0},
		{"a key of the retry range", func(p string) string { return p + "r" + stamp + "/" + stamp + "/1/m9" }, nil, 0},
		{"a key of the retry range, last of the run", func(p string) string { return p + "r" + stamp + "/" + stamp + "/1/m9" }, nil, 4},
		{"a key of the parked range", func(p string) string { return p + "p" + stamp + "/1/m9" }, nil, 0},
		{"a marker of a longer prefix", func(p string) string { return p + "x/" + stamp + "/m9" }, nil, 0},
		{"a marker of a prefix before the range's", func(p string) string { return strings.TrimSuffix(p, "/") + "." + stamp + "/m9" },
			func(p string) string { return strings.TrimSuffix(p, "/") + "." }, 0},
	}
	for i, tt := range tests {
		p := fmt.Sprintf("cm%02d/", i)
		put(t, s, runMarkers(t, p, 3)...)
		put(t, s, tt.bad(p))
	}
	for i, tt := range tests {
		p := fmt.Sprintf("cm%02d/", i)
		call := runCall{p, p, p + "\xff", 100}
		if tt.from != nil {
			call.from = tt.from(p)
		}
		if tt.limit != 0 {
			call.limit = tt.limit
		}
		got, err := clearRun(ctxFor(t), t, s, rc, call)
		if !errors.Is(err, retention.ErrMalformedMarker) {
			t.Errorf("%s: %s = %q, %v, want an error matching retention.ErrMalformedMarker for %q",
				tt.name, call, got, err, tt.bad(p))
		}
	}
}

// testClearRunCancelled requires ClearRun with a cancelled context to
// return an error, and to change nothing.
func testClearRunCancelled(t *testing.T, s Store) {
	rc := runClearer(t, s)
	const prefix = "cc/"
	put(t, s, runMarkers(t, prefix, 3)...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	call := runCall{prefix, prefix, prefix + ":", 100}
	if got, err := clearRun(ctx, t, s, rc, call); err == nil {
		t.Errorf("%s with a cancelled context = %q, nil error, want an error", call, got)
	}
}
