// Package kvtest checks that a retention.KV implementation keeps the
// contract a Sweep relies on. Adapter authors write a Factory that returns
// a fresh, empty Store (the KV and a way to write a key), and call Run with
// it from a test, as the example does; Benchmark measures a Sweep over the
// same stores. CustomIDRule checks, end to end, that an adapter's
// transactional writes (MarkTx, MarkKeyTx, or MarkOp and MarkKeyOp) work
// with a sweep that has its own id rule; its adapter supplies an
// IDRuleHarness, as ExampleCustomIDRule shows.
//
// Optional abilities are checked when the KV has them: a retention.Mover's
// Move, and a retention.RunClearer's ClearRun (see Run). An adapter with
// several kinds of store (a plain KV, and a RunClearer that clears
// entities) runs the suite with a factory for each.
//
// Each behaviour runs as its own subtest on a fresh store from the factory,
// so a failure names the part of the contract that is broken. Run the suite
// with -race: one behaviour drives the store from several goroutines.
package kvtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// Store is a fresh, empty store under test.
type Store struct {
	// KV is the implementation under test.
	KV retention.KV
	// Put writes key (with an empty value) so the suite can set up data.
	Put func(ctx context.Context, key []byte) error
	// PutMany, when not nil, writes many keys at once; Benchmark uses it to
	// fill a store quickly. Nil means Put is called for each key.
	PutMany func(ctx context.Context, keys [][]byte) error

	counting bool // the ClearRun behaviours call CountRun (see runClearer)
}

// Factory returns a fresh, empty Store. It is called once per behaviour (or
// benchmark) and may register cleanups with t.
type Factory func(t testing.TB) Store

// Run runs every behaviour of the KV contract against stores made by
// newStore, each as a subtest of t. Some behaviours run a retention.Sweep
// over the store: one of them a dry run (retention.Config.DryRun), which
// must leave every key as it was and count the very markers, those of
// retention.DeadlineKey among them, that a real pass then clears. A KV that is a retention.Mover has its
// Move checked too (the Move behaviours skip a KV that is not one): moved
// keys are where Scan reads, a missing from key writes nothing, racing
// Moves of one key move it once, and from and to of different lengths are
// refused.
//
// A KV that is a retention.RunClearer has its ClearRun checked too (the
// ClearRun behaviours skip a KV that is not one, and one that says
// errors.ErrUnsupported, which must then have changed nothing): a run is
// the first limit keys of [from, end), ascending, returned exactly, and
// deletes them and no other key; an empty range returns no key and no
// error; a run holding a key that is no marker of the prefix whose id
// retention.ValidateID accepts (a foreign key, a key of the retry or
// parked range, a marker of another prefix, or with a bad id or time) is
// refused with an error matching retention.ErrMalformedMarker and changes
// nothing, while a run that ends before such a key is not refused; a
// cancelled context changes nothing; and RunStore returns a value of the
// store's own type, as a sweep requires before it takes runs. What a run
// clears besides its markers the suite cannot see, any more than a
// retention.ClearDeleter's ClearAndDelete: the adapter's own tests check
// its entities. The Sweep behaviours clear through Config.Clear, so they
// give the sweep a ClearDeleter's Scan, Delete and Move without its clear.
func Run(t *testing.T, newStore Factory) {
	t.Helper()
	for _, b := range behaviours {
		t.Run(b.name, func(t *testing.T) {
			s := newStore(t)
			if s.KV == nil || s.Put == nil {
				t.Fatalf("kvtest: the factory returned a Store without KV or Put")
			}
			b.run(t, s)
		})
	}
}

var behaviours = []struct {
	name string
	run  func(*testing.T, Store)
}{
	{"AscendingByteOrder", testOrder},
	{"StartInclusiveEndExclusive", testBounds},
	{"LimitAndShortPage", testLimit},
	{"PageSizesAgree", testPageSizes},
	{"DeleteBetweenPages", testDeleteBetweenPages},
	{"DeleteMissingKey", testDeleteMissing},
	{"BatchDelete", testBatchDelete},
	{"PrefixIsolation", testPrefixIsolation},
	{"CallerOwnsSlices", testOwnership},
	{"ConcurrentScanAndDelete", testConcurrent},
	{"CancelledContext", testCancelled},
	{"SweepClearsExactlyExpired", testSweep},
	{"SweepRetriesFailedClears", testSweepRetries},
	{"SweepBacklog", testSweepBacklog},
	{"SweepDryRun", testSweepDryRun},
	// A KV that is a retention.Mover; skipped for one that is not.
	{"MovePresentKeys", testMovePresent},
	{"MoveSkipsMissingFrom", testMoveMissing},
	{"MovePairsWhole", testMoveWhole},
	{"MoveLengthsAndContext", testMoveLengths},
	// A KV that is a retention.RunClearer; skipped for one that is not,
	// or that says errors.ErrUnsupported.
	{"ClearRunStore", testClearRunStore},
	{"ClearRunLimitAndOrder", testClearRunLimit},
	{"ClearRunStartInclusiveEndExclusive", testClearRunBounds},
	{"ClearRunRefusesNonMarkers", testClearRunRefused},
	{"ClearRunCancelledContext", testClearRunCancelled},
	// A KV that is a retention.RunCounter: the ClearRun behaviours again,
	// each run by CountRun, whose answer must tell what the run deleted.
	{"CountRunLimitAndOrder", counting(testClearRunLimit)},
	{"CountRunStartInclusiveEndExclusive", counting(testClearRunBounds)},
	{"CountRunRefusesNonMarkers", counting(testClearRunRefused)},
	{"CountRunCancelledContext", counting(testClearRunCancelled)},
}

// opTimeout bounds each store call so a hung store fails instead of stalling.
const opTimeout = 30 * time.Second

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// markerKey returns the marker key of id at at under prefix.
func markerKey(t *testing.T, prefix string, at time.Time, id string) string {
	t.Helper()
	key, err := retention.MarkerKey(prefix, at, id)
	if err != nil {
		t.Fatal(err)
	}
	return string(key)
}

func put(t *testing.T, s Store, keys ...string) {
	t.Helper()
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := s.Put(ctx, []byte(k))
		cancel()
		if err != nil {
			t.Fatalf("Put(%q) = %v", k, err)
		}
	}
}

func scan(t *testing.T, s Store, start, end string, limit int) []string {
	t.Helper()
	keys, err := s.KV.Scan(ctxFor(t), []byte(start), []byte(end), limit)
	if err != nil {
		t.Fatalf("Scan(%q, %q, %d) error = %v", start, end, limit, err)
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = string(k)
	}
	return out
}

func del(t *testing.T, s Store, keys ...string) {
	t.Helper()
	bs := make([][]byte, len(keys))
	for i, k := range keys {
		bs[i] = []byte(k)
	}
	if err := s.KV.Delete(ctxFor(t), bs...); err != nil {
		t.Fatalf("Delete(%d keys) error = %v", len(keys), err)
	}
}

// scanAll pages through [start, end) with the given page size, resuming
// after the last key of each page as the sweep does.
func scanAll(t *testing.T, s Store, start, end string, page int) []string {
	t.Helper()
	var all []string
	from := start
	for i := 0; ; i++ {
		if i > 100_000 {
			t.Fatalf("Scan(%q, %q, %d) never returned a short page", start, end, page)
		}
		keys := scan(t, s, from, end, page)
		if len(keys) > page {
			t.Fatalf("Scan(%q, %q, %d) returned %d keys", from, end, page, len(keys))
		}
		all = append(all, keys...)
		if len(keys) < page {
			return all
		}
		from = keys[len(keys)-1] + "\x00"
	}
}

func want(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

// awkward holds keys whose order trips up stores that compare text, sort
// signed bytes or stop at NUL.
var awkward = []string{
	"k", "k\x00", "k\x00\x00", "k\x01", "k/", "k0", "k9", "kA", "ka",
	"k\x7f", "k\x80", "k\xfe", "k\xff", "k\xff\x00", "k\xff\xff",
}

func testOrder(t *testing.T, s Store) {
	shuffled := slices.Clone(awkward)
	for i := range shuffled { // a fixed permutation: reversed, then interleaved
		j := (i*7 + 3) % len(shuffled)
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	}
	put(t, s, shuffled...)
	sorted := slices.Clone(awkward)
	sort.Strings(sorted) // Go compares strings bytewise, as bytes.Compare does
	want(t, `Scan("k", "l", 100)`, scan(t, s, "k", "l", 100), sorted)
}

func testBounds(t *testing.T, s Store) {
	put(t, s, "b", "c", "d", "e")
	want(t, `Scan("c", "e", 10)`, scan(t, s, "c", "e", 10), []string{"c", "d"})
	want(t, `Scan("bb", "dd", 10)`, scan(t, s, "bb", "dd", 10), []string{"c", "d"})
	want(t, `Scan("c", "c", 10) (empty range)`, scan(t, s, "c", "c", 10), nil)
	want(t, `Scan("e", "c", 10) (end before start)`, scan(t, s, "e", "c", 10), nil)
	want(t, `Scan("e", "e\x00", 10)`, scan(t, s, "e", "e\x00", 10), []string{"e"})
	want(t, `Scan("a", "b", 10)`, scan(t, s, "a", "b", 10), nil)
	// A nil start is the empty key, before every other (a store whose
	// driver sends nil as NULL finds nothing).
	keys, err := s.KV.Scan(ctxFor(t), nil, []byte("c"), 10)
	if err != nil {
		t.Fatalf("Scan(nil, %q, 10) error = %v", "c", err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, string(k))
	}
	want(t, `Scan(nil, "c", 10)`, got, []string{"b"})
}

func testLimit(t *testing.T, s Store) {
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("l%02d", i)
	}
	put(t, s, keys...)
	for _, limit := range []int{1, 3, 9, 10} {
		want(t, fmt.Sprintf("Scan(l, m, %d)", limit), scan(t, s, "l", "m", limit), keys[:limit])
	}
	want(t, "Scan(l, m, 11) (short page: all there is)", scan(t, s, "l", "m", 11), keys)
	want(t, "Scan(l05, m, 1000)", scan(t, s, "l05", "m", 1000), keys[5:])
}

func testPageSizes(t *testing.T, s Store) {
	var keys []string
	for i := range 50 {
		keys = append(keys, fmt.Sprintf("p%03d", i*7%50))
	}
	put(t, s, keys...)
	sort.Strings(keys)
	for _, page := range []int{1, 2, 7, 50, 1000} {
		want(t, fmt.Sprintf("paging with size %d", page), scanAll(t, s, "p", "q", page), keys)
	}
}

func testDeleteBetweenPages(t *testing.T, s Store) {
	var keys []string
	for i := range 30 {
		keys = append(keys, fmt.Sprintf("d%02d", i))
	}
	put(t, s, keys...)
	// Page through with size 4. After each page delete what it returned
	// (as a sweep does) and the key two ahead; the ahead key must never
	// appear, and every other key must appear exactly once.
	gone := map[string]bool{}
	var seen []string
	from := "d"
	for {
		page := scan(t, s, from, "e", 4)
		for _, k := range page {
			if gone[k] {
				t.Errorf("Scan returned %q after it was deleted", k)
			}
		}
		seen = append(seen, page...)
		if len(page) < 4 {
			break
		}
		last := page[len(page)-1]
		var n int
		fmt.Sscanf(last, "d%02d", &n)
		ahead := fmt.Sprintf("d%02d", n+2)
		gone[ahead] = true
		del(t, s, append(slices.Clone(page), ahead)...)
		from = last + "\x00"
	}
	var wantSeen []string
	for _, k := range keys {
		if !gone[k] {
			wantSeen = append(wantSeen, k)
		}
	}
	want(t, "keys seen while deleting between pages", seen, wantSeen)
}

func testDeleteMissing(t *testing.T, s Store) {
	put(t, s, "m1")
	if err := s.KV.Delete(ctxFor(t), []byte("missing")); err != nil {
		t.Errorf("Delete(missing) = %v, want nil", err)
	}
	if err := s.KV.Delete(ctxFor(t), []byte("m1"), []byte("also-missing")); err != nil {
		t.Errorf("Delete(m1, also-missing) = %v, want nil", err)
	}
	if err := s.KV.Delete(ctxFor(t), []byte("m1")); err != nil {
		t.Errorf("Delete(m1) a second time = %v, want nil", err)
	}
	want(t, "keys left", scan(t, s, "m", "n", 10), nil)
}

func testBatchDelete(t *testing.T, s Store) {
	const n = 2000
	var doomed, kept []string
	for i := range n {
		doomed = append(doomed, fmt.Sprintf("b%05d/x", i))
		if i%100 == 0 {
			kept = append(kept, fmt.Sprintf("b%05d/y", i))
		}
	}
	put(t, s, doomed...)
	put(t, s, kept...)
	batch := append(slices.Clone(doomed), "b-missing", "b99999/x")
	del(t, s, batch...)
	want(t, "keys left after deleting a batch", scanAll(t, s, "b", "c", 500), kept)
}

func testPrefixIsolation(t *testing.T, s Store) {
	put(t, s, "run", "run/00000000000000000001/a", "runs", "runs/00000000000000000001/a",
		"runs/00000000000000000002/b", "runs2/00000000000000000001/a", "runs0", "runs:")
	want(t, `Scan("runs/", "runs0", 100)`, scan(t, s, "runs/", "runs0", 100),
		[]string{"runs/00000000000000000001/a", "runs/00000000000000000002/b"})
	want(t, `Scan("runs/0", "runs/:", 100)`, scan(t, s, "runs/0", "runs/:", 100),
		[]string{"runs/00000000000000000001/a", "runs/00000000000000000002/b"})
}

func testOwnership(t *testing.T, s Store) {
	put(t, s, "o1", "o2", "o3")
	got, err := s.KV.Scan(ctxFor(t), []byte("o"), []byte("p"), 10)
	if err != nil {
		t.Fatalf("Scan = %v", err)
	}
	if len(got) != 3 {
		t.Fatalf("Scan returned %d keys, want 3", len(got))
	}
	for _, k := range got {
		k[0] = 'X'
	}
	_ = append(got[0], "overflow"...)
	want(t, "keys after mutating a returned page", scan(t, s, "o", "p", 10), []string{"o1", "o2", "o3"})
	if string(got[1]) != "X2" {
		t.Errorf("appending to one returned key changed another to %q", got[1])
	}
	// Delete must not keep the caller's slices either.
	k := []byte("o1")
	if err := s.KV.Delete(ctxFor(t), k); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	k[1] = '2'
	want(t, "keys after reusing a deleted key's slice", scan(t, s, "o", "p", 10), []string{"o2", "o3"})
}

func testConcurrent(t *testing.T, s Store) {
	const workers, perWorker = 4, 50
	for w := range workers {
		for i := range perWorker {
			put(t, s, fmt.Sprintf("c%d/%03d", w, i))
		}
	}
	ctx := ctxFor(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers*2)
	for w := range workers {
		// One goroutine deletes its own keys page by page while another
		// scans everything; neither may see an error or disorder.
		wg.Add(2)
		go func() {
			defer wg.Done()
			start, end := fmt.Sprintf("c%d/", w), fmt.Sprintf("c%d0", w)
			for {
				keys, err := s.KV.Scan(ctx, []byte(start), []byte(end), 7)
				if err != nil {
					errs <- fmt.Errorf("scan: %w", err)
					return
				}
				if len(keys) == 0 {
					return
				}
				if err := s.KV.Delete(ctx, keys...); err != nil {
					errs <- fmt.Errorf("delete: %w", err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 10 {
				keys, err := s.KV.Scan(ctx, []byte("c"), []byte("d"), 1000)
				if err != nil {
					errs <- fmt.Errorf("scan: %w", err)
					return
				}
				if !slices.IsSortedFunc(keys, bytes.Compare) {
					errs <- errors.New("a concurrent Scan returned keys out of order")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want(t, "keys left after concurrent deletes", scan(t, s, "c", "d", 1000), nil)
}

func testCancelled(t *testing.T, s Store) {
	put(t, s, "x1", "x2")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.KV.Scan(ctx, []byte("x"), []byte("y"), 10); err == nil {
		t.Errorf("Scan with a cancelled context = nil error, want an error")
	}
	if err := s.KV.Delete(ctx, []byte("x1")); err == nil {
		t.Errorf("Delete with a cancelled context = nil error, want an error")
	}
}

func testSweep(t *testing.T, s Store) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const prefix = "sweep/"
	var expired, live []string
	for i := range 300 {
		id := fmt.Sprintf("e%03d", i)
		at := now.Add(-time.Hour - time.Duration(i+1)*time.Second) // past retention
		if i%3 == 0 {
			at = now.Add(-time.Hour + time.Duration(i)*time.Second) // within it
			live = append(live, id)
		} else {
			expired = append(expired, id)
		}
		put(t, s, markerKey(t, prefix, at, id))
	}
	put(t, s, "sweep2/00000000000000000001/other", "swee")
	var mu sync.Mutex
	var cleared []string
	sw, err := retention.New(sweepKV(s.KV), retention.Config{
		Prefix:    prefix,
		Retention: time.Hour,
		PageSize:  16,
		Clock:     retention.NewManualClock(now),
		Clear: func(_ context.Context, id string) error {
			mu.Lock()
			defer mu.Unlock()
			cleared = append(cleared, id)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sw.Pass(ctxFor(t))
	if err != nil {
		t.Fatalf("Pass() error = %v", err)
	}
	sort.Strings(cleared)
	want(t, "ids cleared", cleared, expired)
	if st.Cleared != len(expired) {
		t.Errorf("Pass().Cleared = %d, want %d", st.Cleared, len(expired))
	}
	left := scanAll(t, s, prefix, "sweep0", 100)
	if len(left) != len(live) {
		t.Errorf("markers left = %d, want %d", len(left), len(live))
	}
	want(t, "keys of other prefixes", scan(t, s, "sweep2", "sweep3", 10), []string{"sweep2/00000000000000000001/other"})
	want(t, "keys of other prefixes", scan(t, s, "swee", "swee\x00", 10), []string{"swee"})
}

// testSweepRetries runs a sweep whose Clear fails for some ids: on a KV
// that is a retention.Mover their markers are moved past the cutoff,
// so the next pass does not read them; after their retry delay they are
// cleared. Foreign keys under the prefix are left alone throughout.
func testSweepRetries(t *testing.T, s Store) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const prefix = "retry/"
	failing := map[string]bool{}
	for i := range 40 {
		id := fmt.Sprintf("r%02d", i)
		if i%4 == 0 {
			failing[id] = true
		}
		put(t, s, markerKey(t, prefix, now.Add(-2*time.Hour+time.Duration(i)*time.Millisecond), id))
	}
	foreign := []string{"retry/0042/state", "retry/00000000000000000001/", "retry/99999999999999999999x"}
	put(t, s, foreign...)
	clock := retention.NewManualClock(now)
	var mu sync.Mutex
	calls := map[string]int{}
	sw, err := retention.New(sweepKV(s.KV), retention.Config{
		Prefix: prefix, Retention: time.Hour, PageSize: 8, Clock: clock, RetryDelay: time.Minute, MaxRetryDelay: time.Hour,
		Logger: slog.New(slog.DiscardHandler),
		Clear: func(_ context.Context, id string) error {
			mu.Lock()
			defer mu.Unlock()
			calls[id]++
			if failing[id] && calls[id] == 1 {
				return errors.New("kvtest: downstream down")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sw.Pass(ctxFor(t))
	if err != nil {
		t.Fatalf("first Pass() error = %v", err)
	}
	if st.Cleared != 30 || st.Failed != 10 || st.Retried != 10 {
		t.Errorf("first Pass() = %+v, want 30 cleared, 10 failed and retried", st)
	}
	_, isMover := s.KV.(retention.Mover)
	left := scanAll(t, s, prefix, "retry0", 100)
	if len(left) != 10+len(foreign) {
		t.Errorf("keys left after the first pass = %q, want the 10 failed markers and the foreign keys", left)
	}
	switch {
	case isMover && (st.PutCalls < 1 || st.PutCalls > 5):
		// 40 markers in pages of 8: the failed ones of a page move in one call.
		t.Errorf("first Pass().PutCalls = %d, want 1 to 5: a Mover moves the failed markers of a page in one call", st.PutCalls)
	case !isMover && st.PutCalls != 0:
		t.Errorf("first Pass().PutCalls = %d, want 0: a KV that is no Mover keeps the delays in memory", st.PutCalls)
	}

	clock.Set(now.Add(30 * time.Second)) // within every retry delay
	if st, err = sw.Pass(ctxFor(t)); err != nil {
		t.Fatalf("second Pass() error = %v", err)
	}
	if st.Cleared+st.Failed != 0 {
		t.Errorf("second Pass() = %+v, want no Clear before the retry delay", st)
	}
	if isMover && st.Scanned > 1+len(foreign) {
		t.Errorf("second Pass() read %d keys: rescheduled markers must be past the cutoff", st.Scanned)
	}

	clock.Set(now.Add(2 * time.Minute)) // past every retry delay (1m + a fifth)
	if st, err = sw.Pass(ctxFor(t)); err != nil {
		t.Fatalf("third Pass() error = %v", err)
	}
	if st.Cleared != 10 || st.Foreign != len(foreign) {
		t.Errorf("third Pass() = %+v, want the 10 retried cleared and %d foreign keys seen", st, len(foreign))
	}
	mu.Lock()
	for id := range failing {
		if calls[id] != 2 {
			t.Errorf("Clear(%q) called %d times, want 2", id, calls[id])
		}
	}
	mu.Unlock()
	want(t, "keys left at the end", scanAll(t, s, prefix, "retry0", 100), sortedCopy(foreign))
}

// sweepKV returns the KV the Sweep behaviours give retention.New: the
// store's own, but for a retention.ClearDeleter, whose clear (and runs)
// it hides. Those behaviours clear through Config.Clear, which New refuses
// beside a ClearDeleter, to see which ids were cleared: the suite cannot
// see a store's entities. Scan, Delete and Move are still the store's.
func sweepKV(kv retention.KV) retention.KV {
	if _, ok := kv.(retention.ClearDeleter); !ok {
		return kv
	}
	if m, ok := kv.(retention.Mover); ok {
		return struct {
			retention.KV
			retention.Mover
		}{kv, m}
	}
	return struct{ retention.KV }{kv}
}

func sortedCopy(keys []string) []string {
	keys = slices.Clone(keys)
	sort.Strings(keys)
	return keys
}

// RequireServersEnv names the environment variable that, when set, turns a
// missing server address into a test failure instead of a skip. The
// repository's test script sets it after starting the servers.
const RequireServersEnv = "RETENTION_REQUIRE_SERVERS"

// ServerAddr returns the value of the environment variable env, which names
// a test server for an adapter. When it is empty the test is skipped with a
// message saying how to run it, or fails when RequireServersEnv is set.
func ServerAddr(t testing.TB, env string) string {
	t.Helper()
	if v := os.Getenv(env); v != "" {
		return v
	}
	msg := fmt.Sprintf("%s is not set: run ./scripts/test from the repository root, which starts the servers, or set it yourself", env)
	if os.Getenv(RequireServersEnv) != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// testSweepBacklog checks Sweep.Backlog, a health check's reads through
// the KV: the oldest due marker, its age, the count capped at the limit,
// and nothing due once a pass cleared it.
func testSweepBacklog(t *testing.T, s Store) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const prefix = "backlog/"
	for i := range 50 {
		at := now.Add(-time.Hour - time.Duration(i+1)*time.Second) // due i+1 seconds ago
		if i >= 40 {
			at = now.Add(-time.Hour + time.Duration(i)*time.Second) // not due yet
		}
		put(t, s, markerKey(t, prefix, at, fmt.Sprintf("e%03d", i)))
	}
	// A foreign key in front of the markers, and keys of other prefixes.
	put(t, s, prefix+"0000000000/foreign", "backlog0/00000000000000000001/other", "backlo")
	sw, err := retention.New(sweepKV(s.KV), retention.Config{
		Prefix:    prefix,
		Retention: time.Hour,
		Clock:     retention.NewManualClock(now),
		Clear:     func(context.Context, string) error { return nil },
		Logger:    slog.New(slog.DiscardHandler), // the foreign key is meant
	})
	if err != nil {
		t.Fatal(err)
	}
	oldest := now.Add(-40 * time.Second)
	for _, tt := range []struct {
		limit int
		want  retention.Backlog
	}{
		{100, retention.Backlog{OldestID: "e039", OldestDue: oldest, Age: 40 * time.Second, Due: 40}},
		{40, retention.Backlog{OldestID: "e039", OldestDue: oldest, Age: 40 * time.Second, Due: 40}},
		{7, retention.Backlog{OldestID: "e039", OldestDue: oldest, Age: 40 * time.Second, Due: 7, More: true}},
	} {
		got, err := sw.Backlog(ctxFor(t), tt.limit)
		if err != nil {
			t.Fatalf("Backlog(%d) error = %v", tt.limit, err)
		}
		if !got.OldestDue.Equal(tt.want.OldestDue) {
			t.Errorf("Backlog(%d).OldestDue = %v, want %v", tt.limit, got.OldestDue, tt.want.OldestDue)
		}
		got.OldestDue, tt.want.OldestDue = time.Time{}, time.Time{}
		if got != tt.want {
			t.Errorf("Backlog(%d) = %+v, want %+v", tt.limit, got, tt.want)
		}
	}
	if _, err := sw.Pass(ctxFor(t)); err != nil {
		t.Fatalf("Pass() error = %v", err)
	}
	got, err := sw.Backlog(ctxFor(t), 100)
	if err != nil {
		t.Fatalf("Backlog(100) after a pass error = %v", err)
	}
	if got != (retention.Backlog{}) {
		t.Errorf("Backlog(100) after a pass = %+v, want nothing due", got)
	}
}
