package retention

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The soak runs in synctest time: hangs end when the fake clock reaches the
// timeouts, stalls and latencies cost no real time, and no timeout fires
// because the machine is slow, so the run is both long in sweep time and
// short in real time.
const (
	soakPrefix    = "runs/"
	soakRetention = 10 * time.Second
	soakFaulty    = 5 * time.Second // how long faults are on and the writer writes
	soakBacklog   = 1500            // expired markers waiting when Run starts
	soakInterval  = 100 * time.Millisecond
	soakMaxRetry  = 200 * time.Millisecond
	soakCheckStep = 20 * time.Millisecond
	soakStep      = 250 * time.Millisecond // how long one fault scenario lasts

	// soakLag is how far past its due time an expired entity may still be
	// waiting once faults are off: Run sleeps at most Interval (lengthened by
	// Jitter) between passes.
	soakLag = 2 * soakInterval
	// soakSettle bounds how long after the faults stop the entities they
	// held back are cleared: a marker rescheduled just before is due after
	// at most MaxRetryDelay plus jitter, and a stalled clear ends within
	// its stall.
	soakSettle = 2*soakMaxRetry + 4*soakInterval
)

// soakForeign are keys under the prefix that are not markers: data keys and
// near-misses of the marker shape. A sweep must never delete them.
var soakForeign = []string{
	soakPrefix + "123",
	soakPrefix + "0042/state",
	soakPrefix + "0000000000000000004",          // 19 digits
	soakPrefix + "0000000000000000004/x",        // 19 digits and an id
	soakPrefix + "00000000000000000042",         // 20 digits, no separator
	soakPrefix + "000000000000000000420/x",      // 21 digits
	soakPrefix + "00000000000000000042/",        // 20 digits, '/', no id
	soakPrefix + "99999999999999999999-state/x", // 20 digits, then not '/'
}

// soakScenarios are the fault mixes the soak switches between, one every
// soakStep.
var soakScenarios = []struct {
	name string
	set  func(*faultKV, *faultClear)
}{
	{"calm", func(*faultKV, *faultClear) {}},
	{"mixed", func(kv *faultKV, c *faultClear) {
		for op := range numFaultOps {
			kv.set(op, storeErr, 0.01)
			kv.set(op, storeSlow, 0.05)
			kv.set(op, storeHang, 0.003)
			kv.set(op, storeLost, 0.01)
		}
		kv.set(opDelete, storePartial, 0.01)
		c.set(clearErr, 0.04)
		c.set(clearPanic, 0.02)
		c.set(clearHang, 0.01)
		c.set(clearStall, 0.01)
		c.set(clearGoexit, 0.01)
	}},
	{"store down", func(kv *faultKV, _ *faultClear) {
		for op := range numFaultOps {
			kv.set(op, storeHang, 0.5)
			kv.set(op, storeErr, 0.5)
		}
	}},
	{"store flaky", func(kv *faultKV, _ *faultClear) {
		for op := range numFaultOps {
			kv.set(op, storeErr, 0.05)
			kv.set(op, storeSlow, 0.3) // up to 20ms, below StoreTimeout
			kv.set(op, storeLost, 0.05)
		}
		kv.set(opDelete, storePartial, 0.1)
	}},
	{"downstream down", func(_ *faultKV, c *faultClear) { c.set(clearErr, 1) }},
	{"downstream slow", func(_ *faultKV, c *faultClear) {
		c.set(clearHang, 0.2)
		c.set(clearStall, 0.1)
	}},
	{"outage", func(kv *faultKV, c *faultClear) { // both down, or nearly
		for op := range numFaultOps {
			kv.set(op, storeErr, 0.2)
			kv.set(op, storeHang, 0.05)
			kv.set(op, storeLost, 0.05)
		}
		kv.set(opDelete, storePartial, 0.1)
		c.set(clearErr, 0.5)
		c.set(clearHang, 0.1)
	}},
	{"buggy clears", func(_ *faultKV, c *faultClear) {
		c.set(clearPanic, 0.1)
		c.set(clearGoexit, 0.1)
	}},
}

// soakEntity is one finished entity of the soak.
type soakEntity struct {
	finish time.Time
}

// soakState is what the soak knows about its entities and their clears.
type soakState struct {
	t   testing.TB
	mem *MemKV

	mu       sync.Mutex
	entities map[string]soakEntity
	marked   []string        // ids whose marker was written, in order
	calls    map[string]int  // Clear calls per id
	cleared  map[string]int  // Clear calls per id that returned nil
	problems []string        // invariant violations, reported at the end
	reported map[string]bool // what problems holds already, by check and id

	checks  atomic.Int64
	stopped atomic.Bool // the writer stopped writing
}

func (s *soakState) writing() bool { return !s.stopped.Load() }
func (s *soakState) stopWriting()  { s.stopped.Store(true) }

// requireNoProblems stops the test if an invariant was violated.
func (s *soakState) requireNoProblems() {
	s.t.Helper()
	s.mu.Lock()
	problems := slices.Clone(s.problems)
	s.mu.Unlock()
	require.Empty(s.t, problems[:min(len(problems), 20)], "invariant violations (%d, the first 20 shown)", len(problems))
}

func newSoakState(t testing.TB, mem *MemKV) *soakState {
	return &soakState{
		t: t, mem: mem,
		entities: map[string]soakEntity{},
		calls:    map[string]int{},
		cleared:  map[string]int{},
		reported: map[string]bool{},
	}
}

// finish records entity id as finished at at and writes its marker, as a
// service would when the entity reaches its terminal state.
func (s *soakState) finish(id string, at time.Time) {
	s.mu.Lock()
	s.entities[id] = soakEntity{finish: at}
	s.mu.Unlock()
	key, err := MarkerKey(soakPrefix, at, id)
	if err != nil {
		s.problem("MarkerKey(%q): %v", id, err)
		return
	}
	if err := s.mem.Put(context.Background(), key, nil); err != nil {
		s.problem("Put(%q): %v", key, err)
		return
	}
	s.mu.Lock()
	s.marked = append(s.marked, id)
	s.mu.Unlock()
}

func (s *soakState) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problemLocked(format, format, args...)
}

// problemLocked records a violation once per what, with s.mu held.
func (s *soakState) problemLocked(what, format string, args ...any) {
	if !s.reported[what] {
		s.reported[what] = true
		s.problems = append(s.problems, fmt.Sprintf(format, args...))
	}
}

// called runs first in every Clear: invariant (b), Clear is never called for
// an id before its retention ran out, nor for an id that is not an entity.
func (s *soakState) called(id string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[id]++
	e, ok := s.entities[id]
	switch {
	case !ok:
		s.problemLocked("unknown "+id, "Clear(%q): not an entity", id)
	case now.Sub(e.finish) <= soakRetention:
		s.problemLocked("early "+id, "Clear(%q) at %v, only %v after it finished: retention is %v",
			id, now, now.Sub(e.finish), soakRetention)
	}
}

// done runs last in a Clear that returns nil, just before it returns.
func (s *soakState) done(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleared[id]++
	return nil
}

// snapshot returns the ids that have a marker and the foreign keys present,
// read in one MemKV Scan, which holds the store's lock throughout.
func (s *soakState) snapshot() (ids map[string]int, foreign map[string]bool) {
	keys, err := s.mem.Scan(context.Background(), []byte(soakPrefix), []byte(soakPrefix+"\xff"), math.MaxInt32)
	if err != nil {
		s.problem("snapshot scan: %v", err)
		return nil, nil
	}
	ids, foreign = make(map[string]int, len(keys)), map[string]bool{}
	for _, key := range keys {
		if _, id, err := ParseMarkerKey(soakPrefix, key); err == nil {
			ids[string(id)]++
		} else {
			foreign[string(key)] = true
		}
	}
	return ids, foreign
}

// check tests invariant (a): no id loses its last marker before a Clear of
// it returned nil. The order matters: ids marked are read before the scan,
// and the clears that returned nil after it. Reading the clears first would
// miss one that returned, and had its marker deleted, in between.
func (s *soakState) check() {
	s.checks.Add(1)
	s.mu.Lock()
	marked := s.marked[:len(s.marked):len(s.marked)]
	s.mu.Unlock()

	ids, foreign := s.snapshot()
	if ids == nil {
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range marked {
		if ids[id] == 0 && s.cleared[id] == 0 {
			s.problemLocked("lost "+id, "marker of %q gone, but no Clear of it returned nil (%d calls)", id, s.calls[id])
		}
	}
	for key := range foreign {
		if !slices.Contains(soakForeign, key) {
			s.problemLocked("key "+key, "unknown key %q in the store", key)
		}
	}
	for _, key := range soakForeign {
		if !foreign[key] {
			s.problemLocked("foreign "+key, "foreign key %q deleted", key)
		}
	}
}

// overdue returns the ids that fell due before cutoff-Retention but have a
// marker still or were never cleared.
func (s *soakState) overdue(cutoff time.Time) []string {
	s.mu.Lock()
	marked := s.marked[:len(s.marked):len(s.marked)]
	s.mu.Unlock()
	ids, _ := s.snapshot()
	s.mu.Lock()
	defer s.mu.Unlock()
	var late []string
	for _, id := range marked {
		if s.entities[id].finish.Add(soakRetention).Before(cutoff) && (ids[id] > 0 || s.cleared[id] == 0) {
			late = append(late, id)
		}
	}
	return late
}

// soakPasses sums what Run's OnPass reports.
type soakPasses struct {
	logs countHandler

	mu        sync.Mutex
	n, failed int
	sum       Stats
	// records is the count of log records at the last pass; mostRecords
	// the most logged between two passes.
	records, mostRecords int64
}

func (p *soakPasses) onPass(st Stats, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	records := p.logs.total()
	p.mostRecords = max(p.mostRecords, records-p.records)
	p.records = records
	if err != nil {
		p.failed++
	}
	p.sum.Cleared += st.Cleared
	p.sum.Failed += st.Failed
	p.sum.Malformed += st.Malformed
	p.sum.LiveAgain += st.LiveAgain
	p.sum.ScanCalls += st.ScanCalls
	p.sum.DeleteCalls += st.DeleteCalls
	p.sum.Retried += st.Retried
	p.sum.Foreign += st.Foreign
	p.sum.PutCalls += st.PutCalls
	p.sum.Deferred += st.Deferred
}

func (p *soakPasses) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%d passes (%d failed): cleared %d, failed %d, retried %d, deferred %d, malformed %d, live again %d, foreign keys seen %d; %d scans, %d deletes, %d puts",
		p.n, p.failed, p.sum.Cleared, p.sum.Failed, p.sum.Retried, p.sum.Deferred, p.sum.Malformed, p.sum.LiveAgain, p.sum.Foreign,
		p.sum.ScanCalls, p.sum.DeleteCalls, p.sum.PutCalls)
}

// countHandler is a slog.Handler that counts records by level.
type countHandler struct{ debug, info, warn, error *atomic.Int64 }

func newCountHandler() countHandler {
	return countHandler{new(atomic.Int64), new(atomic.Int64), new(atomic.Int64), new(atomic.Int64)}
}

func (h countHandler) total() int64 {
	return h.debug.Load() + h.info.Load() + h.warn.Load() + h.error.Load()
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countHandler) WithGroup(string) slog.Handler            { return h }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		h.error.Add(1)
	case r.Level >= slog.LevelWarn:
		h.warn.Add(1)
	case r.Level >= slog.LevelInfo:
		h.info.Add(1)
	default:
		h.debug.Add(1)
	}
	return nil
}

// TestSoakFaults runs Run over a store and clears that fail in every way
// faultKV and faultClear know, while a writer keeps finishing entities, and
// checks the invariants all along: (a) no id loses its last marker before a
// Clear of it returned nil, (b) no Clear before the retention ran out, and
// no foreign key is deleted; then, once the faults stop, (c) every expired
// entity is cleared within a bounded time and only unexpired markers stay.
func TestSoakFaults(t *testing.T) {
	for _, tt := range []struct {
		name        string
		concurrency int
		noPut       bool // hide Put: retry delays are then kept in memory
	}{
		{"concurrency=1", 1, false},
		{"concurrency=8", 8, false},
		{"no-put/concurrency=4", 4, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			seed := rand.Uint64()
			if env := os.Getenv("RETENTION_SOAK_SEED"); env != "" {
				var err error
				seed, err = strconv.ParseUint(env, 10, 64)
				require.NoError(t, err, "RETENTION_SOAK_SEED")
			}
			synctest.Test(t, func(t *testing.T) { soak(t, tt.concurrency, tt.noPut, seed) })
		})
	}
}

func soak(t *testing.T, concurrency int, noPut bool, seed uint64) {
	rnd := newFaultRand(t, seed)
	mem := NewMemKV()
	state := newSoakState(t, mem)
	fkv := newFaultKV(mem, rnd, 20*time.Millisecond)
	fkv.enable(true)
	fc := newFaultClear(state.done, rnd, 150*time.Millisecond)
	fc.enable(true)

	ctx := context.Background()
	for _, key := range soakForeign {
		require.NoError(t, mem.Put(ctx, []byte(key), nil))
	}
	start := time.Now()
	for i := range soakBacklog {
		state.finish(fmt.Sprintf("b%05d", i), start.Add(-soakRetention-time.Duration(rnd.float()*float64(soakRetention))))
	}

	logs := newCountHandler()
	passes := soakPasses{logs: logs}
	var kv KV = fkv
	if noPut {
		kv = readOnlyKV{fkv}
	}
	s, err := New(kv, Config{
		Prefix:        soakPrefix,
		Retention:     soakRetention,
		Clear:         func(ctx context.Context, id string) error { state.called(id); return fc.clear(ctx, id) },
		PageSize:      16,
		Concurrency:   concurrency,
		Interval:      soakInterval,
		Jitter:        0.1,
		Logger:        slog.New(logs),
		OnPass:        passes.onPass,
		ClearTimeout:  50 * time.Millisecond,
		StoreTimeout:  50 * time.Millisecond,
		RetryDelay:    10 * time.Millisecond,
		MaxRetryDelay: soakMaxRetry,
	})
	require.NoError(t, err)

	// stop ends every goroutine of the soak; deferred too, so that a failed
	// require leaves none behind for synctest to call a deadlock.
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	stopWriter, stopChecker := make(chan struct{}), make(chan struct{})
	var bg sync.WaitGroup
	stop := sync.OnceValue(func() error {
		close(stopWriter)
		close(stopChecker)
		bg.Wait()
		stopRun()
		err := <-runDone
		fc.running.Wait()
		return err
	})
	defer stop()
	go func() { runDone <- s.Run(runCtx) }()

	// The writer finishes an entity every 1.5ms on average; some are
	// expired already (a service catching up), most expire during the soak
	// or after it.
	var written atomic.Int64
	bg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriter:
				return
			case <-time.After(rnd.duration(3 * time.Millisecond)):
			}
			if !state.writing() {
				continue
			}
			age := time.Duration(rnd.float() * 1.2 * float64(soakRetention))
			state.finish(fmt.Sprintf("w%06d", i), time.Now().Add(-age))
			written.Add(1)
		}
	})
	bg.Go(func() {
		for {
			state.check()
			select {
			case <-stopChecker:
				return
			case <-time.After(soakCheckStep):
			}
		}
	})

	// Every scenario comes up in each round of len(soakScenarios) steps, in
	// a random order.
	steps := map[string]int{}
	var order []int
	for end := time.Now().Add(soakFaulty); time.Now().Before(end); time.Sleep(soakStep) {
		if len(order) == 0 {
			order = rnd.perm(len(soakScenarios))
		}
		sc := soakScenarios[order[0]]
		order = order[1:]
		steps[sc.name]++
		fkv.reset()
		fc.reset()
		sc.set(fkv, fc)
	}
	state.stopWriting()
	fkv.enable(false)
	fc.enable(false)
	faultsOff := time.Now()
	t.Logf("faults on for %v: %d entities written, %d in the backlog; %v-steps of each scenario: %v",
		soakFaulty, written.Load(), soakBacklog, soakStep, steps)
	t.Logf("faults off; store: %s", fkv.report())
	t.Logf("faults off; clears: %s", fc.report())
	t.Logf("faults off; %s", &passes)
	state.requireNoProblems()

	// (c) Once the faults stop, what expired meanwhile is cleared within
	// soakSettle, and from then on Run keeps up within soakLag.
	var late []string
	for time.Since(faultsOff) <= soakSettle {
		if late = state.overdue(faultsOff); len(late) == 0 {
			break
		}
		time.Sleep(soakCheckStep)
	}
	state.requireNoProblems()
	require.Empty(t, late[:min(len(late), 20)], "%d entities expired before the faults stopped are not cleared %v after (the first 20 shown)", len(late), soakSettle)
	t.Logf("everything expired when the faults stopped was cleared %v after", time.Since(faultsOff))
	for keepUp := time.Now().Add(time.Second); time.Now().Before(keepUp); time.Sleep(soakCheckStep) {
		late = state.overdue(time.Now().Add(-soakLag))
		require.Empty(t, late[:min(len(late), 20)], "%d entities more than %v overdue with faults off (the first 20 shown)", len(late), soakLag)
	}

	require.ErrorIs(t, stop(), context.Canceled)
	state.check()
	state.requireNoProblems()
	end := time.Now()

	// The store ends with the unexpired markers, each entity's once, and
	// the foreign keys; nothing unexpired was ever cleared.
	ids, foreign := state.snapshot()
	state.mu.Lock()
	defer state.mu.Unlock()
	unexpired, dupClears, maxCalls := 0, 0, 0
	for id, e := range state.entities {
		due := e.finish.Add(soakRetention)
		switch {
		case due.Before(end.Add(-soakLag)):
			assert.Zero(t, ids[id], "marker of %q left %v after it fell due", id, end.Sub(due))
			assert.NotZero(t, state.cleared[id], "%q never cleared", id)
		case due.After(end):
			unexpired++
			assert.Equal(t, 1, ids[id], "markers of unexpired %q", id)
			assert.Zero(t, state.calls[id], "Clear calls of unexpired %q", id)
		}
		if state.cleared[id] > 1 {
			dupClears++
		}
		maxCalls = max(maxCalls, state.calls[id])
	}
	assert.Len(t, foreign, len(soakForeign), "foreign keys left")
	assert.Greater(t, unexpired, 1000, "the soak must end with unexpired markers to check")

	t.Logf("end: %d entities, %d unexpired, %d cleared more than once, most Clear calls of one id %d, %d invariant checks",
		len(state.entities), unexpired, dupClears, maxCalls, state.checks.Load())
	t.Logf("end; store: %s", fkv.report())
	t.Logf("end; clears: %s", fc.report())
	t.Logf("end; %s", &passes)
	passes.mu.Lock()
	defer passes.mu.Unlock()
	t.Logf("end; log records: %d error, %d warn, %d info, %d debug; at most %d between two passes",
		logs.error.Load(), logs.warn.Load(), logs.info.Load(), logs.debug.Load(), passes.mostRecords)
	// However many clears fail, a pass logs at most a line per kind of
	// trouble (failed and panicked clears, malformed and foreign keys) and a
	// summary, and Run a line when the pass failed.
	assert.LessOrEqual(t, passes.mostRecords, int64(6), "log records between two passes")
}
