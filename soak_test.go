package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"

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
		kv.set(opMove, storePartial, 0.01)
		c.set(clearErr, 0.04)
		c.set(clearPanic, 0.02)
		c.set(clearHang, 0.01)
		c.set(clearStall, 0.01)
		c.set(clearGoexit, 0.01)
		c.set(clearLost, 0.01)
		c.set(clearLate, 0.005)
		c.set(clearNamed, 0.02)
		c.set(clearPartial, 0.01)
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
		kv.set(opMove, storePartial, 0.1)
	}},
	{"downstream down", func(_ *faultKV, c *faultClear) { c.set(clearErr, 1) }},
	{"downstream slow", func(_ *faultKV, c *faultClear) {
		c.set(clearHang, 0.2)
		c.set(clearStall, 0.1)
		c.set(clearLate, 0.05)
	}},
	{"ambiguous", func(kv *faultKV, c *faultClear) { // replies lost: did it happen?
		for op := range numFaultOps {
			kv.set(op, storeLost, 0.05)
		}
		c.set(clearLost, 0.2)
		c.set(clearLate, 0.05)
		c.set(clearPartial, 0.1)
	}},
	{"refusals", func(_ *faultKV, c *faultClear) { c.set(clearNamed, 0.5) }},
	{"reschedules fail", func(kv *faultKV, c *faultClear) { // clears fail, and so do the moves or puts that put them off
		for _, op := range []faultOp{opPut, opMove} {
			kv.set(op, storeErr, 0.1)
			kv.set(op, storeSlow, 0.1)
			kv.set(op, storeHang, 0.05)
			kv.set(op, storeLost, 0.2)
		}
		kv.set(opMove, storePartial, 0.3)
		kv.set(opDelete, storePartial, 0.1)
		c.set(clearErr, 0.3)
		c.set(clearNamed, 0.2)
	}},
	{"outage", func(kv *faultKV, c *faultClear) { // both down, or nearly
		for op := range numFaultOps {
			kv.set(op, storeErr, 0.2)
			kv.set(op, storeHang, 0.05)
			kv.set(op, storeLost, 0.05)
		}
		kv.set(opDelete, storePartial, 0.1)
		kv.set(opMove, storePartial, 0.1)
		c.set(clearErr, 0.5)
		c.set(clearHang, 0.1)
	}},
	{"buggy clears", func(_ *faultKV, c *faultClear) {
		c.set(clearPanic, 0.1)
		c.set(clearGoexit, 0.1)
	}},
}

// soakEntity is one finished entity of the soak, and what became of it.
type soakEntity struct {
	id      string
	finish  time.Time
	present bool // not cleared
	calls   int  // clear calls
	cleared int  // clears the sweep was told of
	effects int  // clears that happened
	commits int  // ClearAndDelete commits
	// holdUntil, for one entity in soakHoldEvery, is the end of a hold:
	// its clears return Hold until then, and it is due then.
	holdUntil time.Time
}

// soakHoldEvery: one entity in so many is held past its retention.
const soakHoldEvery = 25

// due returns when e must be cleared: its retention's end, or its hold's.
func (e *soakEntity) due() time.Time {
	return maxTime(e.finish.Add(soakRetention), e.holdUntil)
}

// soakState is what the soak knows about its entities and their clears.
//
// Where a clear mode tells the sweep an id is cleared, the soak counts it in
// cleared: when Clear returns nil, ClearBatch returns nil or a BatchError
// that does not name the id, or a ClearAndDelete commits. Where the clear
// happens (which a lost reply, a partial batch or a late one may do without
// telling), it counts it in effects.
//
// An entity's id is a letter and its number, its index in ents: the checks,
// which run every few milliseconds over every entity, then walk slices
// rather than look ids up in maps.
type soakState struct {
	t   testing.TB
	mem *MemKV
	// atomic is set for a ClearDeleter, which clears an entity and deletes
	// its marker in one step: then at every check an entity is present iff
	// exactly one marker of its id is, and no id is committed twice.
	atomic bool

	mu       sync.Mutex
	ents     []soakEntity
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
	return &soakState{t: t, mem: mem, reported: map[string]bool{}}
}

// finish records a new entity, named kind and its number, as finished at
// at and writes its marker, as a service would when the entity reaches its
// terminal state: in one step under the MemKV's lock, as a transaction
// would.
func (s *soakState) finish(kind byte, at time.Time) {
	s.mem.mu.Lock()
	defer s.mem.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	id := fmt.Sprintf("%c%06d", kind, len(s.ents))
	key, err := MarkerKey(soakPrefix, at, id)
	if err != nil {
		s.problemLocked("MarkerKey "+id, "MarkerKey(%q): %v", id, err)
		return
	}
	s.mem.putLocked(key, nil)
	e := soakEntity{id: id, finish: at, present: true}
	if n := len(s.ents); n%soakHoldEvery == 7 {
		// Held past its retention by up to the faulty time.
		e.holdUntil = at.Add(soakRetention + time.Duration(1+n%5)*soakFaulty/5)
	}
	s.ents = append(s.ents, e)
}

// holds is the refusal of a ClearDeleter's call of ids: a BatchError
// holding the ids that are held now, or nil.
func (s *soakState) holds(ids []string) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	be := BatchError{}
	for _, id := range ids {
		if e := s.entityLocked(id); e != nil && now.Before(e.holdUntil) {
			be[id] = Hold(e.holdUntil)
		}
	}
	if len(be) == 0 {
		return nil
	}
	return be
}

// soakNumber returns the number of the entity of id, or -1.
func soakNumber[S string | []byte](id S) int {
	if len(id) < 2 {
		return -1
	}
	n := 0
	for i := 1; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' || n > 1<<24 {
			return -1
		}
		n = 10*n + int(id[i]-'0')
	}
	return n
}

// entityLocked returns the entity of id, or nil; s.mu is held, and the
// pointer is good until it is released.
func (s *soakState) entityLocked(id string) *soakEntity {
	if n := soakNumber(id); n >= 0 && n < len(s.ents) && s.ents[n].id == id {
		return &s.ents[n]
	}
	return nil
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

// called runs first in every clear call, for each of its ids: invariant
// (b), no clear of an id before its retention ran out, nor of an id that is
// not an entity.
func (s *soakState) called(id string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entityLocked(id)
	switch {
	case e == nil:
		s.problemLocked("unknown "+id, "clear of %q: not an entity", id)
		return
	case now.Sub(e.finish) <= soakRetention:
		s.problemLocked("early "+id, "clear of %q at %v, only %v after it finished: retention is %v",
			id, now, now.Sub(e.finish), soakRetention)
	}
	e.calls++
}

// effect is the real clear of an entity, for Clear and ClearBatch. A held
// entity is not cleared: it returns Hold.
func (s *soakState) effect(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entityLocked(id); e != nil {
		if time.Now().Before(e.holdUntil) {
			return Hold(e.holdUntil)
		}
		e.effects++
		e.present = false
	}
	return nil
}

// returned runs in a Clear that returns nil, just before it returns.
func (s *soakState) returned(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entityLocked(id); e != nil {
		e.cleared++
	}
}

// returnedBatch runs in a ClearBatch of ids that returns err, just before
// it returns: it counts the ids err reports cleared.
func (s *soakState) returnedBatch(ids []string, err error) {
	var perID BatchError
	switch {
	case err == nil:
	case errors.As(err, &perID):
		for id := range perID {
			if !slices.Contains(ids, id) {
				return // fails the call as a whole
			}
		}
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := perID[id]; !ok {
			if e := s.entityLocked(id); e != nil {
				e.cleared++
			}
		}
	}
}

// committed runs in a ClearAndDelete that commits, with the MemKV's lock
// held, once keys are deleted: it clears the entities of ids. No id may be
// committed twice, and keys must be markers of ids, at least one each.
func (s *soakState) committed(ids []string, keys [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	has := make([]bool, len(ids))
	for _, key := range keys {
		_, id, err := ParseMarkerKey(soakPrefix, key)
		i := slices.Index(ids, string(id))
		switch {
		case err != nil:
			s.problemLocked("commit key "+string(key), "ClearAndDelete(%q) deleted %q, not a marker: %v", ids, key, err)
		case i < 0:
			s.problemLocked("commit key "+string(key), "ClearAndDelete(%q) deleted %q, a marker of another id", ids, key)
		default:
			has[i] = true
		}
	}
	for i, id := range ids {
		if !has[i] {
			s.problemLocked("commit id "+id, "ClearAndDelete(%q, %q) cleared %q without a marker of it", ids, keys, id)
		}
		e := s.entityLocked(id)
		if e == nil {
			continue // called reported it
		}
		e.commits++
		e.effects++
		e.cleared++
		e.present = false
		if e.commits > 1 {
			s.problemLocked("twice "+id, "ClearAndDelete committed %q %d times (%d calls)", id, e.commits, e.calls)
		}
	}
}

// snapshot returns how many markers each entity has, by number, and the
// foreign keys present, read under the MemKV's lock: an entity and its
// marker are written in one step under it, so every entity it counts for
// was written before. For an atomic clear it checks, under the same lock,
// that an entity is present iff exactly one marker of it is.
func (s *soakState) snapshot() (markers []int32, foreign map[string]bool) {
	m := s.mem
	m.mu.RLock()
	defer m.mu.RUnlock()
	s.mu.Lock()
	n := len(s.ents)
	s.mu.Unlock()
	markers, foreign = make([]int32, n), map[string]bool{}
	end := []byte(soakPrefix + "\xff")
	for x := m.seek([]byte(soakPrefix), nil); x != nil && bytes.Compare(x.key, end) < 0; x = x.next[0] {
		_, id, err := ParseMarkerKey(soakPrefix, x.key)
		if err != nil {
			foreign[string(x.key)] = true
			continue
		}
		if i := soakNumber(id); i >= 0 && i < n {
			markers[i]++
		} else {
			s.problem("marker %q of no entity", x.key)
		}
	}
	if !s.atomic {
		return markers, foreign
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range markers {
		if e := &s.ents[i]; e.present != (k == 1) {
			s.problemLocked("presence "+e.id, "entity %q present %v with %d markers (%d calls, %d commits)",
				e.id, e.present, k, e.calls, e.commits)
		}
	}
	return markers, foreign
}

// check tests invariant (a): no id loses its last marker before the sweep
// was told it is cleared. The order matters: the markers are read before
// the clears reported. Reading the clears first would miss one that
// returned, and had its marker deleted, in between.
func (s *soakState) check() {
	s.checks.Add(1)
	markers, foreign := s.snapshot()

	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range markers {
		if e := &s.ents[i]; k == 0 && e.cleared == 0 {
			s.problemLocked("lost "+e.id, "marker of %q gone, but the sweep was never told it is cleared (%d calls, %d clears)",
				e.id, e.calls, e.effects)
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
	markers, _ := s.snapshot()
	s.mu.Lock()
	defer s.mu.Unlock()
	var late []string
	for i, k := range markers {
		if e := &s.ents[i]; e.due().Before(cutoff) && (k > 0 || e.cleared == 0) {
			late = append(late, e.id)
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
	p.sum.Duplicates += st.Duplicates
	p.sum.Held += st.Held
	p.sum.ClearCalls += st.ClearCalls
}

func (p *soakPasses) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%d passes (%d failed): cleared %d, failed %d, retried %d, deferred %d, held %d, duplicates %d, malformed %d, live again %d, foreign keys seen %d; %d clear calls, %d scans, %d deletes, %d puts or moves",
		p.n, p.failed, p.sum.Cleared, p.sum.Failed, p.sum.Retried, p.sum.Deferred, p.sum.Held, p.sum.Duplicates, p.sum.Malformed, p.sum.LiveAgain, p.sum.Foreign,
		p.sum.ClearCalls, p.sum.ScanCalls, p.sum.DeleteCalls, p.sum.PutCalls)
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

// soakStore is what the soak's store can do besides Scan and Delete, which
// decides how the sweep reschedules a failed marker.
type soakStore int

const (
	soakMover   soakStore = iota // Move: one atomic step per marker
	soakPutOnly                  // Put, then Delete: a failure in between leaves two markers
	soakNoPut                    // neither: retry delays are kept in memory
)

// soakMode is how the soak's entities are cleared.
type soakMode int

const (
	soakClear  soakMode = iota // Config.Clear
	soakBatch                  // Config.ClearBatch
	soakAtomic                 // a ClearDeleter
	soakRuns                   // a RunClearer
	soakCounts                 // a RunCounter
)

// soakAtomicKV is the soak's ClearDeleter: a faultAtomic whose calls count
// as clear calls of their ids.
type soakAtomicKV struct {
	*faultAtomic
	state *soakState
}

func (a soakAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	for _, id := range ids {
		a.state.called(id)
	}
	return a.faultAtomic.ClearAndDelete(ctx, ids, keys)
}

// soakRunKV is the soak's RunClearer: a run is read through the faulty
// store and committed as a soakAtomicKV's ClearAndDelete, with its faults;
// with an error it returns the run's keys, or half the time none, as when
// the reply was lost.
type soakRunKV struct {
	soakAtomicKV
	runs, committed *atomic.Int64 // calls, and those that committed
}

func (r soakRunKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	r.runs.Add(1)
	keys, err := r.Scan(ctx, from, end, limit)
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	ids := make([]string, len(keys))
	for i, key := range keys {
		_, id, err := ParseMarkerKey(prefix, key)
		if err != nil {
			return nil, err
		}
		ids[i] = string(id)
	}
	if err := r.ClearAndDelete(ctx, slices.Compact(slices.Sorted(slices.Values(ids))), keys); err != nil {
		if r.c.rnd.float() < 0.5 {
			return nil, err
		}
		return keys, err
	}
	r.committed.Add(1)
	return keys, nil
}

// RunStore implements RunClearer.
func (r soakRunKV) RunStore() RunClearer { return r }

// soakCountKV is the soak's RunCounter: its runs are soakRunKV's, refused
// when they would take two markers of one id, and answered with their
// count, or with the keys soakRunKV returns with an error.
type soakCountKV struct{ soakRunKV }

func (c soakCountKV) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (RunCount, error) {
	keys, err := c.Scan(ctx, from, end, limit)
	if err != nil {
		return RunCount{}, err
	}
	seen := map[string]bool{}
	for _, key := range keys {
		if _, id, err := ParseMarkerKey(prefix, key); err == nil {
			if seen[string(id)] {
				return RunCount{}, fmt.Errorf("%w: two markers of %s in the run", ErrMalformedMarker, id)
			}
			seen[string(id)] = true
		}
	}
	keys, err = c.ClearRun(ctx, prefix, from, end, limit)
	if err != nil {
		return RunCount{Keys: keys}, err
	}
	return countOfKeys(prefix, keys, times), nil
}

// RunStore implements RunClearer.
func (c soakCountKV) RunStore() RunClearer { return c }

// TestSoakFaults runs Run over a store and clears that fail in every way
// faultKV, faultClear and faultAtomic know, while a writer keeps finishing
// entities, and checks the invariants all along: (a) no id loses its last
// marker before the sweep was told it is cleared, (b) no clear before the
// retention ran out, and no foreign key is deleted; then, once the faults
// stop, (c) every expired entity is cleared within a bounded time and only
// unexpired markers stay. Each way of rescheduling (Move, Put, in memory)
// and each clear mode (Clear, ClearBatch, a ClearDeleter) has a variant; the
// atomic one checks too that no entity is ever cleared twice and that an
// entity is present iff exactly one marker of it is.
//
// RETENTION_SOAK_SEED replays the draws of a logged seed (not the
// interleaving of goroutines); -run picks the variant.
func TestSoakFaults(t *testing.T) {
	for _, v := range []soakVariant{
		{"mover/concurrency=1", 1, soakMover, soakClear, 0, false},
		{"mover/concurrency=8", 8, soakMover, soakClear, 0, false},
		{"put-only/concurrency=4", 4, soakPutOnly, soakClear, 0, false},
		{"no-put/concurrency=4", 4, soakNoPut, soakClear, 0, false},
		{"batch/concurrency=4", 4, soakMover, soakBatch, 0, false},
		{"atomic/concurrency=4", 4, soakMover, soakAtomic, 0, false},
		{"runs/concurrency=1", 1, soakMover, soakRuns, 0, false},
		{"runs/budget", 1, soakMover, soakRuns, 2000, false},
		{"runs/counted", 1, soakMover, soakCounts, 0, false},
		{"runs/counted/observed", 1, soakMover, soakCounts, 0, true},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			seed := rand.Uint64()
			if env := os.Getenv("RETENTION_SOAK_SEED"); env != "" {
				var err error
				seed, err = strconv.ParseUint(env, 10, 64)
				require.NoError(t, err, "RETENTION_SOAK_SEED")
			}
			synctest.Test(t, func(t *testing.T) { soak(t, v, seed) })
		})
	}
}

// soakVariant is one way TestSoakFaults runs.
type soakVariant struct {
	name        string
	concurrency int
	store       soakStore
	mode        soakMode
	budget      float64 // a Config.Limiter of this many entities a second (fake time), 0 for none
	observe     bool    // an Observer: counted runs are asked for their times
}

func soak(t *testing.T, v soakVariant, seed uint64) {
	rnd := newFaultRand(t, seed)
	mem := NewMemKV()
	state := newSoakState(t, mem)
	fkv := newFaultKV(mem, rnd, 20*time.Millisecond)
	fkv.enable(true)
	fc := newFaultClear(state.effect, rnd, 150*time.Millisecond)
	fc.enable(true)

	ctx := context.Background()
	for _, key := range soakForeign {
		require.NoError(t, mem.Put(ctx, []byte(key), nil))
	}
	start := time.Now()
	for range soakBacklog {
		state.finish('b', start.Add(-soakRetention-time.Duration(rnd.float()*float64(soakRetention))))
	}

	logs := newCountHandler()
	passes := soakPasses{logs: logs}
	var kv KV = fkv
	switch v.store {
	case soakPutOnly:
		kv = putOnlyKV{fkv, fkv}
	case soakNoPut:
		kv = readOnlyKV{fkv}
	}
	cfg := Config{
		Prefix:        soakPrefix,
		Retention:     soakRetention,
		PageSize:      16,
		Concurrency:   v.concurrency,
		Interval:      soakInterval,
		Jitter:        0.1,
		Logger:        slog.New(logs),
		OnPass:        passes.onPass,
		ClearTimeout:  50 * time.Millisecond,
		StoreTimeout:  50 * time.Millisecond,
		RetryDelay:    10 * time.Millisecond,
		MaxRetryDelay: soakMaxRetry,
	}
	if v.observe {
		cfg.Observer = &recorder{}
	}
	if v.budget > 0 {
		cfg.Limiter = rate.NewLimiter(rate.Limit(v.budget), 50)
	}
	switch v.mode {
	case soakClear:
		cfg.Clear = func(ctx context.Context, id string) error {
			state.called(id)
			err := fc.clear(ctx, id)
			if err == nil {
				state.returned(id)
			}
			return err
		}
	case soakBatch:
		cfg.BatchSize = 4
		cfg.ClearBatch = func(ctx context.Context, ids []string) error {
			for _, id := range ids {
				state.called(id)
			}
			err := fc.clearBatch(ctx, ids)
			state.returnedBatch(ids, err)
			return err
		}
	case soakAtomic, soakRuns, soakCounts:
		require.Equal(t, soakMover, v.store, "an atomic clear needs a Mover, or a reschedule may leave two markers")
		state.atomic = true
		cfg.BatchSize = 4
		kv = soakAtomicKV{&faultAtomic{faultKV: fkv, c: fc, commit: state.committed, refuse: state.holds}, state}
		if v.mode == soakRuns || v.mode == soakCounts {
			runs, committed := new(atomic.Int64), new(atomic.Int64)
			kv = soakRunKV{kv.(soakAtomicKV), runs, committed}
			if v.mode == soakCounts {
				kv = soakCountKV{kv.(soakRunKV)}
			}
			defer func() { t.Logf("runs: %d, %d committed", runs.Load(), committed.Load()) }()
		}
	}
	s, err := New(kv, cfg)
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
		for {
			select {
			case <-stopWriter:
				return
			case <-time.After(rnd.duration(3 * time.Millisecond)):
			}
			if !state.writing() {
				continue
			}
			age := time.Duration(rnd.float() * 1.2 * float64(soakRetention))
			state.finish('w', time.Now().Add(-age))
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
	markers, foreign := state.snapshot()
	state.mu.Lock()
	defer state.mu.Unlock()
	unexpired, dupClears, maxCalls, maxCommits := 0, 0, 0, 0
	for i, e := range state.ents {
		due := e.due()
		switch {
		case due.Before(end.Add(-soakLag)):
			assert.Zero(t, markers[i], "marker of %q left %v after it fell due", e.id, end.Sub(due))
			assert.NotZero(t, e.cleared, "%q never cleared", e.id)
		case due.After(end):
			unexpired++
			switch {
			case e.holdUntil.IsZero() || e.finish.Add(soakRetention).After(end):
				assert.Equal(t, int32(1), markers[i], "markers of unexpired %q", e.id)
				assert.Zero(t, e.calls, "clear calls of unexpired %q", e.id)
			case v.store == soakPutOnly:
				// Held, and rewritten by Put then Delete: a Delete that
				// failed leaves two held keys until the hold's end, as a
				// failed clear's reschedule does (docs/clearing.md).
				assert.Contains(t, []int32{1, 2}, markers[i], "markers of held %q", e.id)
			default:
				assert.Equal(t, int32(1), markers[i], "markers of held %q", e.id)
			}
			assert.True(t, e.present, "unexpired %q cleared", e.id)
		}
		if e.effects > 1 {
			dupClears++
		}
		maxCalls = max(maxCalls, e.calls)
		maxCommits = max(maxCommits, e.commits)
	}
	assert.Len(t, foreign, len(soakForeign), "foreign keys left")
	assert.Greater(t, unexpired, 1000, "the soak must end with unexpired markers to check")

	if state.atomic {
		assert.Zero(t, dupClears, "entities cleared more than once by an atomic clear")
	}
	t.Logf("end: %d entities, %d unexpired, %d cleared more than once, most clear calls of one id %d (commits %d), %d invariant checks",
		len(state.ents), unexpired, dupClears, maxCalls, maxCommits, state.checks.Load())
	t.Logf("end; store: %s", fkv.report())
	t.Logf("end; clears: %s", fc.report())
	t.Logf("end; %s", &passes)
	passes.mu.Lock()
	defer passes.mu.Unlock()
	t.Logf("end; log records: %d error, %d warn, %d info, %d debug; at most %d between two passes",
		logs.error.Load(), logs.warn.Load(), logs.info.Load(), logs.debug.Load(), passes.mostRecords)
	// However many clears fail, a pass logs at most a line per kind of
	// trouble (failed, panicked and put-off clears, failed calls, parked
	// markers, malformed and foreign keys) and a summary, and Run a line
	// when the pass failed.
	assert.LessOrEqual(t, passes.mostRecords, int64(9), "log records between two passes")
}
