package kvtest_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestMemKV runs the suite with the example's factory.
func TestMemKV(t *testing.T) {
	kvtest.Run(t, memStore)
}

// Each broken KV breaks one rule of the contract; the suite must notice, in
// the behaviour named by catches.
var broken = map[string]struct {
	wrap    func(*retention.MemKV) retention.KV
	catches []string
}{
	"unsorted":          {func(m *retention.MemKV) retention.KV { return unsorted{m} }, []string{"AscendingByteOrder"}},
	"end inclusive":     {func(m *retention.MemKV) retention.KV { return endInclusive{m} }, []string{"StartInclusiveEndExclusive", "PrefixIsolation"}},
	"limit ignored":     {func(m *retention.MemKV) retention.KV { return limitIgnored{m} }, []string{"LimitAndShortPage", "PageSizesAgree"}},
	"short pages":       {func(m *retention.MemKV) retention.KV { return shortPages{m} }, []string{"LimitAndShortPage", "PageSizesAgree", "SweepBacklog"}},
	"aliasing slices":   {func(m *retention.MemKV) retention.KV { return &aliasing{MemKV: m} }, []string{"CallerOwnsSlices"}},
	"error on missing":  {func(m *retention.MemKV) retention.KV { return errOnMissing{m} }, []string{"DeleteMissingKey", "BatchDelete"}},
	"ignores context":   {func(m *retention.MemKV) retention.KV { return ignoresCtx{m} }, []string{"CancelledContext"}},
	"moves missing":     {func(m *retention.MemKV) retention.KV { return movesMissing{m} }, []string{"MoveSkipsMissingFrom"}},
	"moves in steps":    {func(m *retention.MemKV) retention.KV { return movesInSteps{m} }, []string{"MovePairsWhole"}},
	"moves any lengths": {func(m *retention.MemKV) retention.KV { return movesAnyLengths{m} }, []string{"MoveLengthsAndContext"}},
	"hides deadlines":   {func(m *retention.MemKV) retention.KV { return hidesDeadlines{m} }, []string{"SweepDryRun"}},
	// RunClearers, each a runMem with one rule broken.
	"run unsorted":         {func(m *retention.MemKV) retention.KV { return runUnsorted{newRunMem(m)} }, []string{"ClearRunLimitAndOrder", "ClearRunStartInclusiveEndExclusive"}},
	"run limit ignored":    {func(m *retention.MemKV) retention.KV { return runLimitIgnored{newRunMem(m)} }, []string{"ClearRunLimitAndOrder", "ClearRunStartInclusiveEndExclusive"}},
	"run end inclusive":    {func(m *retention.MemKV) retention.KV { return runEndInclusive{newRunMem(m)} }, []string{"ClearRunStartInclusiveEndExclusive"}},
	"run unchecked":        {func(m *retention.MemKV) retention.KV { return runUnchecked{newRunMem(m)} }, []string{"ClearRunRefusesNonMarkers"}},
	"run refused partway":  {func(m *retention.MemKV) retention.KV { return runPartway{newRunMem(m)} }, []string{"ClearRunRefusesNonMarkers"}},
	"run store embedded":   {func(m *retention.MemKV) retention.KV { return runStoreEmbedded{newRunMem(m)} }, []string{"ClearRunStore"}},
	"run unsupported late": {func(m *retention.MemKV) retention.KV { return runUnsupportedLate{newRunMem(m)} }, []string{"ClearRunLimitAndOrder", "ClearRunStartInclusiveEndExclusive"}},
	"run ignores context":  {func(m *retention.MemKV) retention.KV { return runIgnoresCtx{newRunMem(m)} }, []string{"ClearRunCancelledContext"}},
	// RunCounters, each a countMem with one rule broken.
	"count times wrong": {func(m *retention.MemKV) retention.KV { return countMem{newRunMem(m), countTimesWrong} }, []string{"CountRunLimitAndOrder", "CountRunStartInclusiveEndExclusive"}},
	"count last wrong":  {func(m *retention.MemKV) retention.KV { return countMem{newRunMem(m), countLastWrong} }, []string{"CountRunLimitAndOrder", "CountRunStartInclusiveEndExclusive"}},
	"count one too many": {func(m *retention.MemKV) retention.KV {
		return countMem{newRunMem(m), func(c retention.RunCount) retention.RunCount { c.N++; return c }}
	}, []string{"CountRunLimitAndOrder", "CountRunStartInclusiveEndExclusive"}},
	"count first wrong": {func(m *retention.MemKV) retention.KV {
		return countMem{newRunMem(m), func(c retention.RunCount) retention.RunCount { c.First--; return c }}
	}, []string{"CountRunLimitAndOrder", "CountRunStartInclusiveEndExclusive"}},
}

// runBehaviours are the behaviours of Run that check a RunClearer, and
// countBehaviours those that check a RunCounter.
var (
	runBehaviours = []string{
		"ClearRunStore", "ClearRunLimitAndOrder", "ClearRunStartInclusiveEndExclusive",
		"ClearRunRefusesNonMarkers", "ClearRunCancelledContext",
	}
	countBehaviours = []string{
		"CountRunLimitAndOrder", "CountRunStartInclusiveEndExclusive", "CountRunRefusesNonMarkers", "CountRunCancelledContext",
	}
)

// TestRunClearers runs the suite over RunClearers that keep the contract,
// in a child process to read which behaviours ran: a runMem passes every
// ClearRun behaviour, and one that cannot clear runs, and says so before
// changing anything, has them skipped (but ClearRunStore).
func TestRunClearers(t *testing.T) {
	if os.Getenv("KVTEST_GOOD") != "" {
		t.Skip("in the child process")
	}
	for _, tt := range []struct {
		name string
		want string // of every ClearRun behaviour but ClearRunStore
	}{
		{"run", "PASS"},
		{"unsupported", "SKIP"},
		{"count", "PASS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := runChild("TestGoodChild", "KVTEST_GOOD", tt.name)
			require.NoError(t, err, "the suite failed a %s RunClearer:\n%s", tt.name, out)
			for _, behaviour := range runBehaviours {
				state := tt.want
				if behaviour == "ClearRunStore" {
					state = "PASS"
				}
				require.Contains(t, string(out), "--- "+state+": TestGoodChild/"+behaviour, "output:\n%s", out)
			}
			for _, behaviour := range countBehaviours {
				state := cmp.Or(map[bool]string{true: "PASS"}[tt.name == "count"], "SKIP")
				require.Contains(t, string(out), "--- "+state+": TestGoodChild/"+behaviour, "output:\n%s", out)
			}
		})
	}
}

func TestGoodChild(t *testing.T) {
	good := map[string]func(*retention.MemKV) retention.KV{
		"run":         func(m *retention.MemKV) retention.KV { return newRunMem(m) },
		"unsupported": func(m *retention.MemKV) retention.KV { return runUnsupported{newRunMem(m)} },
		"count":       func(m *retention.MemKV) retention.KV { return countMem{newRunMem(m), nil} },
	}
	wrap, ok := good[os.Getenv("KVTEST_GOOD")]
	if !ok {
		t.Skip("run by TestRunClearers")
	}
	kvtest.Run(t, func(testing.TB) kvtest.Store {
		mem := retention.NewMemKV()
		return kvtest.Store{KV: wrap(mem), Put: func(ctx context.Context, key []byte) error { return mem.Put(ctx, key, nil) }}
	})
}

func TestBrokenKVsAreCaught(t *testing.T) {
	if os.Getenv("KVTEST_BROKEN") != "" {
		t.Skip("in the child process")
	}
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := runChild("TestBrokenChild", "KVTEST_BROKEN", name)
			require.Error(t, err, "the suite passed a KV that is %s:\n%s", name, out)
			for _, behaviour := range b.catches {
				require.Contains(t, string(out), "--- FAIL: TestBrokenChild/"+behaviour, "output:\n%s", out)
			}
			require.Contains(t, string(out), "--- PASS: TestBrokenChild/",
				"unrelated behaviours still pass; output:\n%s", out)
		})
	}
}

// runChild runs the test named test in a child process, with the
// environment variable env set to value, and returns its output. The tests
// that call it expect the child to fail: the suite fails its test on
// purpose there, which must not fail this process.
func runChild(test, env, value string) ([]byte, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+value)
	return cmd.CombinedOutput()
}

func TestBrokenChild(t *testing.T) {
	name := os.Getenv("KVTEST_BROKEN")
	if name == "" {
		t.Skip("run by TestBrokenKVsAreCaught")
	}
	kvtest.Run(t, func(testing.TB) kvtest.Store {
		mem := retention.NewMemKV()
		kv := broken[name].wrap(mem)
		put := func(ctx context.Context, key []byte) error { return mem.Put(ctx, key, nil) }
		if a, ok := kv.(*aliasing); ok {
			put = a.put
		}
		return kvtest.Store{KV: kv, Put: put}
	})
}

type unsorted struct{ *retention.MemKV }

func (k unsorted) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	keys, err := k.MemKV.Scan(ctx, start, end, limit)
	slices.Reverse(keys)
	return keys, err
}

type endInclusive struct{ *retention.MemKV }

func (k endInclusive) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return k.MemKV.Scan(ctx, start, append(slices.Clone(end), 0), limit)
}

type limitIgnored struct{ *retention.MemKV }

func (k limitIgnored) Scan(ctx context.Context, start, end []byte, _ int) ([][]byte, error) {
	return k.MemKV.Scan(ctx, start, end, 1<<20)
}

type shortPages struct{ *retention.MemKV }

func (k shortPages) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return k.MemKV.Scan(ctx, start, end, max(limit-1, 1))
}

// aliasing hands out the slices it stores, so a caller's change reaches it.
type aliasing struct {
	*retention.MemKV
	mu    sync.Mutex
	canon map[string][]byte
}

func (k *aliasing) put(ctx context.Context, key []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.canon == nil {
		k.canon = map[string][]byte{}
	}
	k.canon[string(key)] = slices.Clone(key)
	return k.MemKV.Put(ctx, key, nil)
}

func (k *aliasing) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	keys, err := k.MemKV.Scan(ctx, start, end, limit)
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, key := range keys {
		if c, ok := k.canon[string(key)]; ok {
			keys[i] = c
		}
	}
	return keys, err
}

type errOnMissing struct{ *retention.MemKV }

func (k errOnMissing) Delete(ctx context.Context, keys ...[]byte) error {
	for _, key := range keys {
		if _, ok, _ := k.Get(ctx, key); !ok {
			return os.ErrNotExist
		}
	}
	return k.MemKV.Delete(ctx, keys...)
}

type ignoresCtx struct{ *retention.MemKV }

func (k ignoresCtx) Scan(_ context.Context, start, end []byte, limit int) ([][]byte, error) {
	return k.MemKV.Scan(context.Background(), start, end, limit)
}

func (k ignoresCtx) Delete(_ context.Context, keys ...[]byte) error {
	return k.MemKV.Delete(context.Background(), keys...)
}

// movesMissing writes each to key whether or not its from key exists.
type movesMissing struct{ *retention.MemKV }

func (k movesMissing) Move(ctx context.Context, from, to [][]byte) error {
	if err := k.Delete(ctx, from...); err != nil {
		return err
	}
	for _, key := range to {
		if err := k.Put(ctx, key, nil); err != nil {
			return err
		}
	}
	return nil
}

// movesInSteps checks that a from key exists and moves it in separate
// steps, with a pause between, so that racing Moves all find it.
type movesInSteps struct{ *retention.MemKV }

func (k movesInSteps) Move(ctx context.Context, from, to [][]byte) error {
	for i, key := range from {
		_, ok, err := k.Get(ctx, key)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		time.Sleep(time.Millisecond)
		if err := k.Put(ctx, to[i], nil); err != nil {
			return err
		}
		if err := k.Delete(ctx, key); err != nil {
			return err
		}
	}
	return nil
}

// movesAnyLengths moves the pairs it can make of from and to, and ignores
// the rest.
type movesAnyLengths struct{ *retention.MemKV }

func (k movesAnyLengths) Move(ctx context.Context, from, to [][]byte) error {
	n := min(len(from), len(to))
	return k.MemKV.Move(ctx, from[:n], to[:n])
}

// hidesDeadlines leaves out of Scan the keys of markers with a deadline
// of their own (retention.DeadlineKey), as a store that keeps markers in
// columns parsed from the key, and knows only the shape of MarkerKey, may.
type hidesDeadlines struct{ *retention.MemKV }

func (k hidesDeadlines) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	keys, err := k.MemKV.Scan(ctx, start, end, limit)
	return slices.DeleteFunc(keys, func(key []byte) bool { return bytes.Contains(key, []byte("/d0/")) }), err
}

// runMem is a RunClearer over a MemKV that keeps the contract: a run, and
// a ClearAndDelete, is read, checked and deleted under one lock. It
// clears no entities: there are none.
type runMem struct {
	*retention.MemKV
	mu *sync.Mutex
}

func newRunMem(m *retention.MemKV) runMem { return runMem{m, new(sync.Mutex)} }

func (k runMem) ClearAndDelete(ctx context.Context, _ []string, keys [][]byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range keys {
		if _, ok, err := k.Get(ctx, key); err != nil || !ok {
			return cmp.Or(err, retention.ErrMarkerGone)
		}
	}
	return k.Delete(ctx, keys...)
}

func (k runMem) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	keys, err := k.Scan(ctx, from, end, limit)
	if err != nil {
		return nil, err
	}
	for _, key := range keys {
		if err := runMarker(prefix, key); err != nil {
			return nil, err
		}
	}
	return keys, k.Delete(ctx, keys...)
}

func (k runMem) RunStore() retention.RunClearer { return k }

// runMarker returns an error matching retention.ErrMalformedMarker unless
// key is a marker of prefix whose id retention.ValidateID accepts; a key
// of the retry or parked range, which ParseMarkerKey reads too, is none.
func runMarker(prefix string, key []byte) error {
	if _, _, err := retention.ParseMarkerKey(prefix, key); err != nil {
		return err
	}
	if c := key[len(prefix)]; c < '0' || c > '9' {
		return fmt.Errorf("%w: %q is a key of the retry or parked range", retention.ErrMalformedMarker, key)
	}
	return nil
}

// runUnsupported cannot clear runs, and says so before it changes anything.
type runUnsupported struct{ runMem }

func (k runUnsupported) ClearRun(context.Context, string, []byte, []byte, int) ([][]byte, error) {
	return nil, fmt.Errorf("kvtest: no runs here: %w", errors.ErrUnsupported)
}

func (k runUnsupported) RunStore() retention.RunClearer { return k }

// runUnsorted returns a run's keys in descending order.
type runUnsorted struct{ runMem }

func (k runUnsorted) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	keys, err := k.runMem.ClearRun(ctx, prefix, from, end, limit)
	slices.Reverse(keys)
	return keys, err
}

func (k runUnsorted) RunStore() retention.RunClearer { return k }

// runLimitIgnored takes every key of the range.
type runLimitIgnored struct{ runMem }

func (k runLimitIgnored) ClearRun(ctx context.Context, prefix string, from, end []byte, _ int) ([][]byte, error) {
	return k.runMem.ClearRun(ctx, prefix, from, end, 1<<20)
}

func (k runLimitIgnored) RunStore() retention.RunClearer { return k }

// runEndInclusive takes the key at end too.
type runEndInclusive struct{ runMem }

func (k runEndInclusive) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return k.runMem.ClearRun(ctx, prefix, from, append(slices.Clone(end), 0), limit)
}

func (k runEndInclusive) RunStore() retention.RunClearer { return k }

// runUnchecked deletes the run whatever its keys are.
type runUnchecked struct{ runMem }

func (k runUnchecked) ClearRun(ctx context.Context, _ string, from, end []byte, limit int) ([][]byte, error) {
	keys, err := k.Scan(ctx, from, end, limit)
	if err != nil {
		return nil, err
	}
	return keys, k.Delete(ctx, keys...)
}

func (k runUnchecked) RunStore() retention.RunClearer { return k }

// runPartway checks and deletes a run's keys one at a time, so that a
// refused run has lost the markers before the key it refuses.
type runPartway struct{ runMem }

func (k runPartway) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	keys, err := k.Scan(ctx, from, end, limit)
	if err != nil {
		return nil, err
	}
	for _, key := range keys {
		if err := runMarker(prefix, key); err != nil {
			return nil, err
		}
		if err := k.Delete(ctx, key); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

func (k runPartway) RunStore() retention.RunClearer { return k }

// countMem is a RunCounter over a runMem: its runs answer with their
// count, reshaped by broken when not nil.
type countMem struct {
	runMem
	broken func(retention.RunCount) retention.RunCount
}

func (k countMem) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (retention.RunCount, error) {
	keys, err := k.ClearRun(ctx, prefix, from, end, limit)
	if err != nil {
		return retention.RunCount{}, err
	}
	var c retention.RunCount
	for i, key := range keys {
		at, _, _ := retention.ParseMarkerKey(prefix, key)
		if i == 0 {
			c.First = at.UnixMilli()
		}
		if times {
			c.Times = append(c.Times, at.UnixMilli())
		}
		c.N, c.Last = i+1, key
	}
	if k.broken != nil && len(keys) > 0 {
		c = k.broken(c)
	}
	return c, nil
}

func (k countMem) RunStore() retention.RunClearer { return k }

// countTimesWrong answers every time but the last a millisecond late.
func countTimesWrong(c retention.RunCount) retention.RunCount {
	for i := range len(c.Times) - 1 {
		c.Times[i]++
	}
	if len(c.Times) == 1 {
		c.Times = append(c.Times, c.Times[0])
	}
	return c
}

// countLastWrong answers the first key as the last.
func countLastWrong(c retention.RunCount) retention.RunCount {
	c.Last = append(c.Last[:len(c.Last):len(c.Last)], 'x')
	return c
}

// runStoreEmbedded inherits the RunStore of the runMem it embeds, as a
// wrapper that declares only ClearRun would.
type runStoreEmbedded struct{ runMem }

func (k runStoreEmbedded) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return k.runMem.ClearRun(ctx, prefix, from, end, limit)
}

// runUnsupportedLate says it cannot clear runs after it cleared one.
type runUnsupportedLate struct{ runMem }

func (k runUnsupportedLate) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	if _, err := k.runMem.ClearRun(ctx, prefix, from, end, limit); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("kvtest: no runs here: %w", errors.ErrUnsupported)
}

func (k runUnsupportedLate) RunStore() retention.RunClearer { return k }

// runIgnoresCtx clears a run whatever its context says.
type runIgnoresCtx struct{ runMem }

func (k runIgnoresCtx) ClearRun(_ context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return k.runMem.ClearRun(context.Background(), prefix, from, end, limit)
}

func (k runIgnoresCtx) RunStore() retention.RunClearer { return k }

func BenchmarkMemKV(b *testing.B) {
	kvtest.Benchmark(b, memStore)
}

func BenchmarkRunMem(b *testing.B) {
	kvtest.Benchmark(b, func(testing.TB) kvtest.Store { return runMemStore(&countedRuns{}) })
}

// countedRuns is a runMem that counts its calls.
type countedRuns struct {
	runMem
	runs, clears *atomic.Int64
}

func (k countedRuns) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	k.clears.Add(1)
	return k.runMem.ClearAndDelete(ctx, ids, keys)
}

func (k countedRuns) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	k.runs.Add(1)
	return k.runMem.ClearRun(ctx, prefix, from, end, limit)
}

func (k countedRuns) RunStore() retention.RunClearer { return k }

// runMemStore returns a Store over a new countedRuns that counts into c
// (into counters of its own when c has none).
func runMemStore(c *countedRuns) kvtest.Store {
	if c.runs == nil {
		c.runs, c.clears = new(atomic.Int64), new(atomic.Int64)
	}
	m := retention.NewMemKV()
	c.runMem = newRunMem(m)
	return kvtest.Store{KV: *c, Put: func(ctx context.Context, key []byte) error { return m.Put(ctx, key, nil) }}
}

// clearDeleterOnly is a ClearDeleter that takes no runs, or fails every
// call when down; it counts its calls.
type clearDeleterOnly struct {
	*retention.MemKV
	calls *atomic.Int64
	down  bool
}

func (k clearDeleterOnly) ClearAndDelete(ctx context.Context, _ []string, keys [][]byte) error {
	k.calls.Add(1)
	if k.down {
		return errors.New("down")
	}
	return k.Delete(ctx, keys...)
}

// benchFailed runs kvtest.Benchmark over newStore once per sub-benchmark
// and reports whether it failed: testing.Benchmark's result cannot say,
// as with sub-benchmarks its N is 1 whether they failed or not.
func benchFailed(t *testing.T, newStore kvtest.Factory) (failed bool) {
	t.Helper()
	require.NoError(t, flag.Set("test.benchtime", "1x"))
	t.Cleanup(func() { _ = flag.Set("test.benchtime", "1s") })
	testing.Benchmark(func(b *testing.B) {
		kvtest.Benchmark(b, newStore)
		failed = b.Failed()
	})
	return failed
}

// TestBenchmarkLetsAClearDeleterClearItself: Benchmark sets no Clear
// (which New refuses beside a ClearDeleter) over a store that clears
// itself: a RunClearer clears by runs at concurrency 1 and by
// ClearAndDelete at 16, a ClearDeleter by ClearAndDelete; a plain KV gets
// a no-op Clear; and a store whose clears fail fails the benchmark.
func TestBenchmarkLetsAClearDeleterClearItself(t *testing.T) {
	for _, tc := range []struct {
		name       string
		store      func(calls, runs *atomic.Int64) kvtest.Factory
		fails      bool
		calls, run bool // ClearAndDelete and ClearRun called
	}{
		{"RunClearer", func(calls, runs *atomic.Int64) kvtest.Factory {
			return func(testing.TB) kvtest.Store { return runMemStore(&countedRuns{runs: runs, clears: calls}) }
		}, false, true, true},
		{"ClearDeleter", func(calls, _ *atomic.Int64) kvtest.Factory {
			return func(testing.TB) kvtest.Store { return deleterStore(clearDeleterOnly{calls: calls}) }
		}, false, true, false},
		{"MemKV", func(_, _ *atomic.Int64) kvtest.Factory { return memStore }, false, false, false},
		{"failing ClearDeleter", func(calls, _ *atomic.Int64) kvtest.Factory {
			return func(testing.TB) kvtest.Store { return deleterStore(clearDeleterOnly{calls: calls, down: true}) }
		}, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls, runs atomic.Int64
			assert.Equal(t, tc.fails, benchFailed(t, tc.store(&calls, &runs)), "the benchmark failed")
			assert.Equal(t, tc.calls, calls.Load() > 0, "ClearAndDelete calls: %d", calls.Load())
			assert.Equal(t, tc.run, runs.Load() > 0, "ClearRun calls: %d", runs.Load())
		})
	}
}

// deleterStore returns a Store over k with a new MemKV.
func deleterStore(k clearDeleterOnly) kvtest.Store {
	k.MemKV = retention.NewMemKV()
	return kvtest.Store{KV: k, Put: func(ctx context.Context, key []byte) error { return k.Put(ctx, key, nil) }}
}
