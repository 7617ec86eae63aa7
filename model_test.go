package retention

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"
)

// This file checks Sweep.Pass against a model of what a pass may do,
// written plainly, over randomised runs.
//
// A run is drawn from one seed: the clear mode (Config.Clear,
// Config.ClearBatch, or a ClearDeleter store), the store's abilities (Mover,
// Putter only, or neither), Concurrency, PageSize, BatchSize, the entities
// and their markers, how often calls fail and how often the process
// "crashes". The world — the markers in a MemKV and each entity's state —
// changes only under one lock, through modelKV (the store the sweep sees)
// and the clear functions. Every change is checked there, and every pass
// is checked when it ends; the first failure of a run keeps a trace.
//
// The model, per id:
//
//   - A marker may go only once a clear of its id returned nil or
//     ErrLiveAgain, or with its entity in a ClearDeleter's commit, or when
//     another marker of the id stays (a reschedule). An entity that was not
//     cleared and not reported live again always has a marker: a marker
//     gone with its entity still there is a lost clear.
//   - Clear, ClearBatch and ClearAndDelete get only ids that had an
//     expired marker when the pass started; no marker that was unexpired
//     then is deleted or moved; foreign keys are never deleted; malformed
//     ones go without a clear.
//   - Clear and ClearBatch clear at least once. A second clear that takes
//     effect is allowed only when the model can say why (see clearEffect):
//     the earlier one took effect but did not report success, its pass
//     failed or crashed, or the id had another marker not yet expired.
//     Within one pass an id is cleared at most once unless the earlier
//     call failed having taken effect.
//   - A ClearDeleter commits each entity at most once, ever, on a store
//     that is a Mover; a second commit is allowed only when the first left
//     another marker of the id (written as a duplicate, or a reschedule by
//     Put and Delete interrupted on a store without Move). On a Mover an
//     entity is present iff a marker of it is (for ids with one marker).
//   - Two markers of one id expired in one pass: one clear in that pass,
//     and both markers go (checked after each pass that returned nil).
//   - Once faults stop, modelSettle passes, the clock moved past
//     MaxRetryDelay before each, clear every expired entity and leave no
//     expired marker.
//
// The store and the clear functions the sweep is given are in
// model_fakes_test.go; TestModelCalm checks the model itself on runs
// without faults, where even a core without batch clears must pass.
//
// A crash: a store call or clear, drawn at random, marks the process dead
// (before or after its effect) and cancels the pass; every later call of
// that process fails and changes nothing. The run checks the world, drops
// the Sweep and goes on with a new one (fresh memory) over the same store.
//
// Runs happen in synctest bubbles, so ClearTimeout and StoreTimeout cost no
// real time. Each call's fault is drawn from a hash of the seed and the
// call (process, pass, operation, arguments, occurrence), not from a shared
// stream, so that a seed replays the same faults whatever order concurrent
// calls come in; with Concurrency > 1 the interleaving can still differ
// between replays.
//
// RETENTION_MODEL_RUNS sets the number of random runs (default
// modelDefaultRuns, a quarter of it with -short), RETENTION_MODEL_FIRST
// the first of their seeds (default random); RETENTION_MODEL_SEED replays
// one seed and prints its whole trace. Seeds that failed once go in modelSeeds
// (model_seeds_test.go).

const (
	modelPrefix      = "runs/"
	modelRetention   = time.Hour
	modelRetry       = 10 * time.Millisecond
	modelMaxRetry    = 100 * time.Millisecond
	modelTimeout     = 50 * time.Millisecond // ClearTimeout and StoreTimeout, in synctest time
	modelSettle      = 2                     // passes with faults off that must clear every expired entity
	modelDefaultRuns = 240
)

// errCrashed is what every call of a crashed process returns.
var errCrashed = errors.New("model: the process crashed")

type modelMode int

const (
	modelClear modelMode = iota
	modelBatch
	modelAtomic // a ClearDeleter store
)

func (m modelMode) String() string { return [...]string{"Clear", "ClearBatch", "ClearDeleter"}[m] }

type modelStore int

const (
	modelMover    modelStore = iota // Putter and Mover
	modelPutter                     // Putter only: delays kept in memory, as read-only (the sweep moves markers only on a Mover)
	modelReadOnly                   // neither: retry delays kept in memory
)

func (s modelStore) String() string { return [...]string{"mover", "putter", "read-only"}[s] }

// modelConfig is a run, drawn from its seed.
type modelConfig struct {
	seed        uint64
	mode        modelMode
	store       modelStore
	concurrency int
	pageSize    int
	batchSize   int
	entities    int
	steps       []time.Duration // clock advance before each pass of the faulty phase
	faultRate   float64         // chance that a store call or clear goes wrong
	crashRate   float64         // chance that a store call or clear crashes the process
	rng         *rand.Rand      // the rest of the run's draws: entities, writes
	calm        bool            // no duplicate markers and no live-again entities (TestModelCalm)
	runs        bool            // the ClearDeleter is a RunClearer too
	counts      bool            // and a RunCounter
	observe     bool            // an Observer: counted runs are asked for their times
	budget      bool            // a Config.Limiter that grants at once: its waits, runs' included, in every call
}

func newModelConfig(seed uint64) modelConfig {
	r := rand.New(rand.NewPCG(seed, 0x6d6f64656c))
	c := modelConfig{seed: seed, rng: r}
	c.mode = modelMode(r.IntN(3))
	// Drawn apart, so that a seed draws the rest as it did before runs.
	c.runs = c.mode == modelAtomic && rand.New(rand.NewPCG(seed, 0x72756e73)).IntN(2) == 0
	c.budget = rand.New(rand.NewPCG(seed, 0x62756467)).IntN(3) == 0
	c.counts = c.runs && rand.New(rand.NewPCG(seed, 0x636f756e)).IntN(2) == 0
	c.observe = rand.New(rand.NewPCG(seed, 0x6f627376)).IntN(2) == 0
	switch x := r.IntN(20); {
	case x < 12:
		c.store = modelMover
	case x < 17:
		c.store = modelPutter
	default:
		c.store = modelReadOnly
	}
	c.concurrency = 1
	if r.IntN(2) == 0 {
		c.concurrency = 2 + r.IntN(3)
	}
	c.pageSize = 2 + r.IntN(5)
	if c.mode != modelClear {
		c.batchSize = 1 + r.IntN(4)
	}
	c.entities = 8 + r.IntN(20)
	steps := []time.Duration{time.Millisecond, 30 * time.Millisecond, 150 * time.Millisecond,
		5 * time.Minute, 12 * time.Minute, 25 * time.Minute}
	for range 4 + r.IntN(7) {
		c.steps = append(c.steps, steps[r.IntN(len(steps))])
	}
	c.faultRate = [...]float64{0, 0.05, 0.15, 0.3}[r.IntN(4)]
	if r.IntN(5) < 3 {
		c.crashRate = 0.01 + 0.04*r.Float64()
	}
	return c
}

func (c modelConfig) String() string {
	mode := c.mode.String()
	if c.runs {
		mode += "+runs"
	}
	if c.counts {
		mode += "+counts"
	}
	if c.budget {
		mode += "+budget"
	}
	if c.observe {
		mode += "+observed"
	}
	return fmt.Sprintf("mode=%v store=%v concurrency=%d page=%d batch=%d entities=%d passes=%d faults=%.2f crashes=%.3f",
		mode, c.store, c.concurrency, c.pageSize, c.batchSize, c.entities, len(c.steps), c.faultRate, c.crashRate)
}

// modelEntity is one entity of the world.
type modelEntity struct {
	present   bool // its state is there: not cleared
	live      bool // live again: every clear of it that gets through answers ErrLiveAgain
	dup       bool // written with more than one marker
	acked     bool // a clear of it returned nil to the sweep
	liveAcked bool // the sweep was told ErrLiveAgain for it
	effects   []*modelEffect
	// holdUntil, when set, is the end of a hold: every clear of it before
	// then returns Hold(holdUntil) and clears nothing. holdTold holds the
	// processes that were told so: none of them may try it again before,
	// but for a run that takes a further marker of it no such call had
	// (see checkRunHold). holdKeys holds the markers of those calls.
	holdUntil time.Time
	holdTold  map[int]bool
	holdKeys  map[string]bool
}

// heldAt reports whether e is held at now.
func (e *modelEntity) heldAt(now time.Time) bool {
	return !e.holdUntil.IsZero() && now.Before(e.holdUntil)
}

// modelEffect is a clear (or commit) of an entity that took effect.
type modelEffect struct {
	pass         int
	state        modelAck
	hadUnexpired bool // the id had a marker not yet expired when the pass started
	leftAfter    int  // markers of the id left just after a commit (ClearDeleter)
	passFailed   bool // its pass returned an error or crashed
}

type modelAck int

const (
	ackPending modelAck = iota // the call has not returned
	acked                      // the sweep was told the id was cleared
	unacked                    // the call failed, panicked, timed out or crashed
)

// modelPass is what the model knows of the pass in progress.
type modelPass struct {
	n            int
	inc          *modelProcess
	cutoffMs     int64
	expiredKeys  map[string]bool
	expiredIDs   map[string]bool
	unexpiredIDs map[string]bool
	acked        map[string]bool // ids acked (or live-acked) in this pass
	together     map[string]bool // ids two of whose markers one Scan of this pass returned
}

// pagewise reports whether the sweep may clear id again in this pass: on
// a store that leaves no duplicates when it crashes (a Mover, or one that
// cannot write), the pass looks for further markers of an id only on the
// page of the first, so an id the writer gave two markers that never met
// in one Scan is cleared once per page that holds one.
func (w *modelWorld) pagewise(id string) bool {
	e := w.entities[id]
	return e != nil && e.dup && !w.pass.together[id]
}

// modelProcess is one incarnation of the sweeping process: a Sweep with
// its memory. A crash ends it.
type modelProcess struct {
	n       int
	sweep   *Sweep
	crashed bool
	cancel  context.CancelFunc // the pass's
}

type modelViolation struct {
	kind, id, msg string
	pass          int
	at            int // index in the trace
}

// modelWorld is the store and the entities, and the model's view of them.
type modelWorld struct {
	cfg   modelConfig
	mem   *MemKV
	clock *ManualClock

	mu         sync.Mutex
	entities   map[string]*modelEntity
	foreign    map[string]bool
	malformed  map[string]bool // key -> expired when written (must be gone at the end)
	faults     bool
	passN      int
	pass       *modelPass
	procs      int
	seen       map[string]int // occurrences of each call in the pass, for its draw
	trace      []string
	violations []modelViolation
	reported   map[string]bool
	reasons    map[string]int // second clears the model allowed, by reason
	crashes    int
	holds      int // clears told "held"
	runAsks    int // held ids a run asked again for a further marker (see checkRunHold)
	failed     int // passes that returned an error
	nextID     int
}

func newModelWorld(cfg modelConfig) *modelWorld {
	w := &modelWorld{
		cfg:       cfg,
		mem:       NewMemKV(),
		clock:     NewManualClock(t0),
		entities:  map[string]*modelEntity{},
		foreign:   map[string]bool{},
		malformed: map[string]bool{},
		faults:    true,
		reported:  map[string]bool{},
		reasons:   map[string]int{},
		seen:      map[string]int{},
	}
	ctx := context.Background()
	for _, k := range soakForeign {
		w.foreign[k] = true
		_ = w.mem.Put(ctx, []byte(k), nil)
	}
	r := cfg.rng
	var total time.Duration
	for _, s := range cfg.steps {
		total += s
	}
	// A marker-shaped key with a refused id, expired: deleted without a
	// clear. One past the year 9999 only goes when a pass reads past every
	// marker, and need not.
	old := t0.Add(-modelRetention - 20*time.Minute)
	for _, id := range []string{"bad.id", strings.Repeat("x", MaxIDLen+1)} {
		k, _ := appendKey(nil, modelPrefix, old.Add(time.Duration(r.IntN(600))*time.Second), id)
		w.malformed[string(k)] = true
		_ = w.mem.Put(ctx, k, nil)
	}
	far := modelPrefix + "99999999999999999999/x"
	w.malformed[far] = false
	_ = w.mem.Put(ctx, []byte(far), nil)

	for range cfg.entities {
		// From well expired to expiring after the last pass.
		span := modelRetention + 40*time.Minute + total
		at := t0.Add(-modelRetention - 30*time.Minute + time.Duration(r.Int64N(int64(span))))
		if r.IntN(8) == 0 {
			// Exactly Retention old at one of the passes: kept then, cleared after.
			var sum time.Duration
			for _, s := range cfg.steps[:1+r.IntN(len(cfg.steps))] {
				sum += s
			}
			at = t0.Add(sum - modelRetention)
		}
		w.addEntity(r, at.Truncate(time.Millisecond))
	}
	return w
}

// addEntity writes a new entity finished at at, with its marker (two, now
// and then), as its service would. w.mu is held or not needed.
func (w *modelWorld) addEntity(r *rand.Rand, at time.Time) {
	id := fmt.Sprintf("e%03d", w.nextID)
	w.nextID++
	e := &modelEntity{present: true, live: r.IntN(10) == 0 && !w.cfg.calm, holdTold: map[int]bool{}, holdKeys: map[string]bool{}}
	w.entities[id] = e
	// Holds come from a stream of their own, so that the draws above are
	// those of the seeds kept before holds existed.
	if h := rand.New(rand.NewPCG(w.cfg.seed, 0x686f6c64+uint64(w.nextID))); h.IntN(6) == 0 && !w.cfg.calm {
		var total time.Duration
		for _, s := range w.cfg.steps {
			total += s
		}
		// Ending during the faulty passes, before the settling ones (the
		// clock is past t0+total by then); for an entity written late, it
		// may be over already.
		e.holdUntil = t0.Add(time.Duration(h.Int64N(int64(total)/2 + 1))).Truncate(time.Millisecond).Add(time.Millisecond)
	}
	times := []time.Time{at}
	if r.IntN(7) == 0 && !w.cfg.calm {
		e.dup = true
		d := time.Duration(1+r.IntN(3)) * time.Millisecond
		if r.IntN(3) == 0 {
			d = time.Duration(1+r.IntN(20)) * time.Minute
		}
		times = append(times, at.Add(d))
	}
	for _, t := range times {
		k, err := MarkerKey(modelPrefix, t, id)
		if err != nil {
			panic(err)
		}
		_ = w.mem.Put(context.Background(), k, nil)
	}
	w.tracef("write %s: markers at %s%s%s%s", id, w.times(times), cond(e.live, ", live again", ""), cond(e.dup, ", duplicate", ""),
		cond(e.holdUntil.IsZero(), "", fmt.Sprintf(", held until %+.3fs", e.holdUntil.Sub(t0).Seconds())))
}

func cond(c bool, a, b string) string {
	if c {
		return a
	}
	return b
}

func (w *modelWorld) times(ts []time.Time) string {
	var s []string
	for _, t := range ts {
		s = append(s, fmt.Sprintf("%+.3fs", t.Sub(t0).Seconds()))
	}
	return strings.Join(s, ",")
}

// short names a key for the trace: id@time since t0 for a marker.
func (w *modelWorld) short(key []byte) string {
	k := key
	after := ""
	if n := len(k); n > 0 && k[n-1] == 0 {
		k, after = k[:n-1], "after "
	}
	if ms, id, foreign, err := parseKey(modelPrefix, k); err == nil && !foreign {
		return fmt.Sprintf("%s%s@%+.3fs", after, id, float64(ms-t0.UnixMilli())/1000)
	}
	return after + strconv.Quote(string(k))
}

func (w *modelWorld) shortAll(keys [][]byte) string {
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = w.short(k)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// markerIDOf returns the id of a valid marker key, and the time ms that
// makes it expired for a pass whose cutoff is above it: the marker time of
// a marker; for one of the retry range, the later of its finish time and
// its retry time less the retention (it is read once both have come);
// never for one of the parked range.
func markerIDOf(key []byte) (ms int64, id string, ok bool) {
	ms, b, foreign, err := parseKey(modelPrefix, key)
	if err != nil && len(key) > len(modelPrefix) {
		if infix := key[len(modelPrefix)]; infix == retryInfix || infix == parkedInfix {
			var k retryKey
			k, foreign, err = parseRetryKey(modelPrefix, infix, key)
			b, ms = k.id, max(k.finished, k.at-modelRetention.Milliseconds())
			if infix == parkedInfix {
				ms = math.MaxInt64
			}
		}
	}
	if err != nil || foreign || validateIDBytes(b) != nil {
		return 0, "", false
	}
	return ms, string(b), true
}

func (w *modelWorld) tracef(format string, args ...any) {
	p := 0
	if w.pass != nil {
		p = w.pass.n
	}
	w.trace = append(w.trace, fmt.Sprintf("p%d ", p)+fmt.Sprintf(format, args...))
}

func (w *modelWorld) violate(kind, id, format string, args ...any) {
	if w.reported[kind+" "+id] {
		return
	}
	w.reported[kind+" "+id] = true
	if e := w.entities[id]; e != nil && e.dup {
		kind += " (duplicate id)" // a separate finding: the id was written with two markers
	}
	msg := fmt.Sprintf(format, args...)
	w.tracef("!! %s %s: %s", kind, id, msg)
	p := 0
	if w.pass != nil {
		p = w.pass.n
	}
	w.violations = append(w.violations, modelViolation{kind: kind, id: id, msg: msg, pass: p, at: len(w.trace) - 1})
}

// markers returns the marker keys of the store, by id.
func (w *modelWorld) markers() map[string][]string {
	keys, err := w.mem.Scan(context.Background(), []byte(modelPrefix), []byte(modelPrefix+"\xff"), math.MaxInt32)
	if err != nil {
		panic(err)
	}
	m := map[string][]string{}
	for _, k := range keys {
		if _, id, ok := markerIDOf(k); ok {
			m[id] = append(m[id], string(k))
		}
	}
	return m
}

func (w *modelWorld) has(key []byte) bool {
	_, ok, _ := w.mem.Get(context.Background(), key)
	return ok
}

// atomicMover reports whether entities must be present iff they have a
// marker: a ClearDeleter that can Move.
func (w *modelWorld) atomicMover() bool {
	return w.cfg.mode == modelAtomic && w.cfg.store == modelMover
}

// check tests what must hold at every moment, after each change of the
// world: no lost clear, and on the atomic path over a Mover, an entity is
// present iff it has a marker.
func (w *modelWorld) check(what string) {
	m := w.markers()
	for _, id := range slices.Sorted(maps.Keys(w.entities)) {
		e, n := w.entities[id], len(m[id])
		if n == 0 && e.present && !e.liveAcked {
			w.violate("lost clear", id, "the last marker of %s went (%s), but its entity was never cleared nor reported live again", id, what)
		}
		if w.atomicMover() && !e.dup && !e.live && !e.present && n > 0 {
			w.violate("marker without entity", id, "%s has a marker again (%s) after its entity was cleared: its next clear commits twice", id, what)
		}
	}
	for k := range w.foreign {
		if !w.has([]byte(k)) {
			w.violate("foreign key deleted", k, "%s", what)
		}
	}
}

// modelTimes matches the times that short gives markers.
var modelTimes = regexp.MustCompile(`@[-+][0-9.]+s`)

// draw is a call's decision: its random source, fault and crash.
type modelDraw struct {
	rng        *rand.Rand
	fault      int  // 0: none, else 1..n
	crashAfter bool // the process dies once the call has had its effect
}

// enter starts a call of process inc, with w.mu held: it refuses the call
// of a crashed process, may crash the process, and draws the call's fault
// (1 to nFaults, or 0). The error is errCrashed: the call must do nothing.
func (w *modelWorld) enter(inc *modelProcess, op, desc string, nFaults int) (modelDraw, error) {
	if inc.crashed {
		w.tracef("%s %s -> refused, crashed", op, desc)
		return modelDraw{}, errCrashed
	}
	// Marker times are left out: a rescheduled marker's time has the
	// retry's jitter, which is not drawn from the seed.
	key := fmt.Sprintf("i%d p%d %s %s", inc.n, w.pass.n, op, modelTimes.ReplaceAllString(desc, ""))
	occ := w.seen[key]
	w.seen[key]++
	h := fnv.New64a()
	fmt.Fprintf(h, "%s#%d", key, occ)
	d := modelDraw{rng: rand.New(rand.NewPCG(h.Sum64(), w.cfg.seed))}
	if !w.faults {
		return d, nil
	}
	if d.rng.Float64() < w.cfg.crashRate {
		inc.crashed = true
		inc.cancel()
		w.crashes++
		if d.rng.IntN(2) == 0 {
			w.tracef("%s %s -> CRASH before it", op, desc)
			return modelDraw{}, errCrashed
		}
		d.crashAfter = true
		return d, nil
	}
	if d.rng.Float64() < w.cfg.faultRate {
		d.fault = 1 + d.rng.IntN(nFaults)
	}
	return d, nil
}

// checkIDs checks the ids of a clear call against the pass: each an
// entity's, expired when the pass started, and not cleared already in it.
func (w *modelWorld) checkIDs(op string, ids []string) {
	for _, id := range ids {
		switch {
		case w.entities[id] == nil:
			w.violate("not an entity", id, "%s got id %q, which no entity has", op, id)
		case !w.pass.expiredIDs[id]:
			w.violate("early clear", id, "%s got %s, which had no expired marker when the pass started", op, id)
		case w.pass.acked[id] && !w.pagewise(id):
			w.violate("cleared twice in a pass", id, "%s got %s again after a clear of it succeeded in this pass", op, id)
		}
	}
}

// clearEffect records that a clear (Clear or ClearBatch) of id took
// effect, after checking that the model allows it if it is not the first.
func (w *modelWorld) clearEffect(id, how string) *modelEffect {
	e, p := w.entities[id], w.pass
	if n := len(e.effects); n > 0 {
		prev := e.effects[n-1]
		reason := ""
		switch {
		case prev.pass == p.n:
			if prev.state == unacked {
				reason = "the earlier clear in this pass took effect but failed"
			} else if w.pagewise(id) {
				reason = "the writer's second marker of the id was on another page, on a store the pass dedupes page by page"
			}
		case prev.state != acked:
			reason = "the earlier clear took effect but failed or crashed"
		case prev.passFailed:
			reason = "the pass of the earlier clear failed or crashed"
		case prev.hadUnexpired:
			reason = "the id had another marker, unexpired at the earlier clear"
		case e.dup:
			reason = "the writer gave the id two markers, which a store deduped page by page may clear apiece"
		}
		switch {
		case reason == "" && prev.pass == p.n:
			w.violate("cleared twice", id, "%s cleared again (%s) in pass %d, whose earlier clear of it %s",
				id, how, p.n, cond(prev.state == acked, "succeeded", "was still running"))
		case reason == "":
			w.violate("cleared twice", id, "%s cleared again (%s); its clear in pass %d was acknowledged, its pass succeeded, and no other marker was waiting",
				id, how, prev.pass)
		default:
			w.reasons[w.cfg.mode.String()+": "+reason]++
			w.tracef("%s cleared again, allowed: %s", id, reason)
		}
	}
	e.present = false
	ef := &modelEffect{pass: p.n, hadUnexpired: p.unexpiredIDs[id]}
	e.effects = append(e.effects, ef)
	return ef
}

// commitEffect records a ClearDeleter's commit of id, after checking that
// the model allows it if it is not the first. left is the number of
// markers of id after the commit.
func (w *modelWorld) commitEffect(id string, left int) *modelEffect {
	e, p := w.entities[id], w.pass
	if n := len(e.effects); n > 0 {
		prev := e.effects[n-1]
		reason := ""
		if prev.leftAfter > 0 && prev.pass == p.n && w.pagewise(id) {
			reason = "the writer's second marker of the id was on another page, on a store the pass dedupes page by page"
		}
		if prev.leftAfter > 0 && prev.pass != p.n {
			switch {
			case w.cfg.store != modelMover:
				reason = "the id had another marker after its first commit, on a store without Move"
			case prev.passFailed:
				reason = "the id had another marker after its first commit, whose pass failed"
			case prev.hadUnexpired:
				reason = "the id had another marker, unexpired at its first commit"
			case w.entities[id].dup:
				reason = "the writer gave the id two markers, which a store deduped page by page may clear apiece"
			}
		}
		if reason == "" {
			w.violate("committed twice", id, "%s cleared again by ClearAndDelete; first committed in pass %d (%s), leaving %d markers of it",
				id, prev.pass, [...]string{"reply pending", "acknowledged", "reply lost or failed"}[prev.state], prev.leftAfter)
		} else {
			w.reasons[w.cfg.mode.String()+": "+reason]++
			w.tracef("%s committed again, allowed: %s", id, reason)
		}
	}
	// Committed: whatever the reply, a read of the markers tells the sweep.
	e.present, e.acked = false, true
	ef := &modelEffect{pass: p.n, hadUnexpired: p.unexpiredIDs[id], leftAfter: left}
	e.effects = append(e.effects, ef)
	return ef
}

// held records that process inc was told id is held by a call that held
// keys (those of a ClearDeleter; of them, id's markers are kept).
func (w *modelWorld) held(inc *modelProcess, id string, keys ...[]byte) {
	if e := w.entities[id]; e != nil {
		e.holdTold[inc.n] = true
		w.holds++
		for _, k := range keys {
			if _, kid, ok := markerIDOf(k); ok && kid == id {
				e.holdKeys[string(k)] = true
			}
		}
	}
}

// checkHold checks a clear of id by process inc: not before the end of a
// hold the process was told of.
func (w *modelWorld) checkHold(inc *modelProcess, op, id string) {
	if e := w.entities[id]; e != nil && e.holdTold[inc.n] && e.heldAt(w.clock.Now()) {
		w.violate("held id tried early", id, "%s of %s at %+.3fs, held until %+.3fs, and the process was told so",
			op, id, w.clock.Now().Sub(t0).Seconds(), e.holdUntil.Sub(t0).Seconds())
	}
}

// checkRunHold is checkHold for a ClearRun whose run is keys. The sweep
// keeps runs off only while a marker it read of a waiting id may be in
// the markers' range: a further marker of an id the writer marked twice,
// which no call that was told of the hold held, is the store's to answer
// (it answers Hold again, changing nothing), as docs/policies.md says.
func (w *modelWorld) checkRunHold(inc *modelProcess, id string, keys [][]byte) {
	e := w.entities[id]
	if e == nil || !e.dup || !e.holdTold[inc.n] || !e.heldAt(w.clock.Now()) {
		w.checkHold(inc, "ClearRun", id)
		return
	}
	for _, k := range keys {
		if _, kid, ok := markerIDOf(k); ok && kid == id && e.holdKeys[string(k)] {
			w.checkHold(inc, "ClearRun", id)
			return
		}
	}
	w.runAsks++
	w.tracef("%s asked again by a run, allowed: a further marker of it, which no call told of the hold held", id)
}

func (w *modelWorld) ack(id string, live bool) {
	e := w.entities[id]
	if e == nil {
		return
	}
	if live {
		e.liveAcked = true
	} else {
		e.acked = true
	}
	w.pass.acked[id] = true
}

// checkRemove checks keys the sweep deletes or moves away: never a foreign
// key, never a marker that was unexpired when the pass started.
func (w *modelWorld) checkRemove(op string, keys [][]byte) {
	for _, k := range keys {
		switch {
		case w.foreign[string(k)]:
			w.violate("foreign key deleted", string(k), "%s of foreign key %q", op, k)
		case !w.has(k):
		default:
			if _, id, ok := markerIDOf(k); ok && !w.pass.expiredKeys[string(k)] {
				w.violate("early delete", id, "%s of %s, which was not expired when the pass started", op, w.short(k))
			}
		}
	}
}

// checkDeleted checks that the markers a Delete removed were those of ids
// cleared (or live again), or that another marker of their id stays.
func (w *modelWorld) checkDeleted(keys [][]byte) {
	m := w.markers()
	for _, k := range keys {
		_, id, ok := markerIDOf(k)
		e := w.entities[id]
		if !ok || e == nil || len(m[id]) > 0 || e.acked || e.liveAcked {
			continue
		}
		w.violate("deleted before cleared", id, "the last marker of %s was deleted, but no clear of it returned nil or ErrLiveAgain", id)
	}
}

// newProcess starts a process: a new Sweep, with fresh memory, over the
// world's store.
func (w *modelWorld) newProcess() *modelProcess {
	w.procs++
	inc := &modelProcess{n: w.procs}
	cfg := Config{
		Prefix:        modelPrefix,
		Retention:     modelRetention,
		Clock:         w.clock,
		PageSize:      w.cfg.pageSize,
		Concurrency:   w.cfg.concurrency,
		ClearTimeout:  modelTimeout,
		StoreTimeout:  modelTimeout,
		RetryDelay:    modelRetry,
		MaxRetryDelay: modelMaxRetry,
		Logger:        slog.New(slog.DiscardHandler),
	}
	switch w.cfg.mode {
	case modelClear:
		cfg.Clear = func(ctx context.Context, id string) error { return w.clear(inc, ctx, id) }
	case modelBatch:
		cfg.ClearBatch = func(ctx context.Context, ids []string) error { return w.clearBatch(inc, ctx, ids) }
	}
	if w.cfg.mode != modelClear {
		// A batch is cut from one page: a larger size means the page's.
		cfg.BatchSize = min(w.cfg.batchSize, w.cfg.pageSize)
	}
	if w.cfg.observe {
		cfg.Observer = &recorder{}
	}
	if w.cfg.budget {
		// Real time, which the model does not advance: a budget that
		// grants at once, so that its path runs and the model stays fast.
		cfg.Limiter = rate.NewLimiter(1e9, 1)
	}
	s, err := New(w.kvFor(inc), cfg)
	if err != nil {
		panic(err)
	}
	inc.sweep = s
	return inc
}

// runPass runs one pass of process inc and checks it.
func (w *modelWorld) runPass(ctx context.Context, inc *modelProcess) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.beginPass(inc, cancel)
	st, err := inc.sweep.Pass(pctx)
	w.endPass(inc, st, err)
	return err
}

func (w *modelWorld) beginPass(inc *modelProcess, cancel context.CancelFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.passN++
	now := w.clock.Now()
	p := &modelPass{
		n: w.passN, inc: inc, cutoffMs: cutoffMillis(now.Add(-modelRetention)),
		expiredKeys: map[string]bool{}, expiredIDs: map[string]bool{}, unexpiredIDs: map[string]bool{},
		acked: map[string]bool{}, together: map[string]bool{},
	}
	var expired []string
	for id, keys := range w.markers() {
		for _, k := range keys {
			if ms, _, _ := markerIDOf([]byte(k)); ms < p.cutoffMs {
				p.expiredKeys[k] = true
				p.expiredIDs[id] = true
				expired = append(expired, w.short([]byte(k)))
			} else {
				p.unexpiredIDs[id] = true
			}
		}
	}
	sort.Strings(expired)
	w.pass = p
	w.seen = map[string]int{}
	inc.cancel = cancel
	w.tracef("== pass %d, process %d, clock %+.3fs: expired %v", p.n, inc.n, now.Sub(t0).Seconds(), expired)
}

func (w *modelWorld) endPass(inc *modelProcess, st Stats, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pass
	failed := err != nil || inc.crashed
	if err != nil {
		w.failed++
	}
	for _, e := range w.entities {
		for _, ef := range e.effects {
			if ef.pass == p.n {
				ef.passFailed = failed
			}
		}
	}
	w.check("end of pass")
	if !failed {
		// Every marker that was expired at the start of a pass that
		// succeeded, of an id cleared or live again in it, is gone; but
		// for a marker the writer added on another page, on a store the
		// pass dedupes page by page: its own clear may have failed.
		m := w.markers()
		for _, id := range slices.Sorted(maps.Keys(p.acked)) {
			if w.pagewise(id) {
				continue
			}
			for _, k := range m[id] {
				if p.expiredKeys[k] {
					w.violate("marker left", id, "%s was cleared in a pass that succeeded, but its expired marker %s stays", id, w.short([]byte(k)))
				}
			}
		}
	}
	w.tracef("== pass %d -> err=%v crashed=%v; cleared %d, failed %d, retried %d, live %d, malformed %d, clear calls %d",
		p.n, err, inc.crashed, st.Cleared, st.Failed, st.Retried, st.LiveAgain, st.Malformed, st.ClearCalls)
}

// finalCheck runs once the faults stopped and modelSettle passes ran.
func (w *modelWorld) finalCheck() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.check("final")
	m := w.markers()
	for _, id := range slices.Sorted(maps.Keys(m)) {
		for _, k := range m[id] {
			if ms, _, _ := markerIDOf([]byte(k)); ms < w.pass.cutoffMs {
				w.violate("not settled", id, "expired marker %s still there %d passes after the faults stopped", w.short([]byte(k)), modelSettle)
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(w.entities)) {
		e := w.entities[id]
		if e.present && !e.live && len(m[id]) == 0 {
			w.violate("not settled", id, "entity %s neither cleared nor marked", id)
		}
		if w.atomicMover() && !e.live && !e.dup && e.present != (len(m[id]) > 0) {
			w.violate("marker without entity", id, "at rest, %s present=%v with %d markers", id, e.present, len(m[id]))
		}
	}
	for k, expired := range w.malformed {
		if expired && w.has([]byte(k)) {
			w.violate("not settled", k, "malformed key %q, expired, still there", k)
		}
	}
}

// modelResult is what a run leaves for the report.
type modelResult struct {
	cfg        modelConfig
	violations []modelViolation
	trace      []string
	reasons    map[string]int
	crashes    int
	passes     int
	failed     int
	holds      int
	runAsks    int
}

// runModel plays the run of seed.
func runModel(seed uint64) *modelResult { return runModelConfig(newModelConfig(seed)) }

// runModelConfig plays the run of cfg.
func runModelConfig(cfg modelConfig) *modelResult {
	w := newModelWorld(cfg)
	ctx := context.Background()
	inc := w.newProcess()
	r := cfg.rng
	for _, step := range cfg.steps {
		w.clock.Advance(step)
		if r.IntN(3) == 0 {
			now := w.clock.Now()
			w.mu.Lock()
			for range 1 + r.IntN(3) {
				// Mostly already expired: a service catching up.
				at := now.Add(-modelRetention - 10*time.Minute + time.Duration(r.Int64N(int64(20*time.Minute))))
				w.addEntity(r, at.Truncate(time.Millisecond))
			}
			w.mu.Unlock()
		}
		_ = w.runPass(ctx, inc)
		if inc.crashed {
			inc = w.newProcess()
		}
	}
	w.mu.Lock()
	w.faults = false
	w.tracef("== faults off")
	w.mu.Unlock()
	for range modelSettle {
		w.clock.Advance(2*modelMaxRetry + time.Millisecond)
		if err := w.runPass(ctx, inc); err != nil {
			w.mu.Lock()
			w.violate("pass failed without faults", "", "%v", err)
			w.mu.Unlock()
		}
	}
	w.finalCheck()
	return &modelResult{cfg: cfg, violations: w.violations, trace: w.trace, reasons: w.reasons,
		crashes: w.crashes, passes: w.passN, failed: w.failed, holds: w.holds, runAsks: w.runAsks}
}

// TestModelCalm checks the model itself: with no faults, no crashes, no
// duplicate markers and no live-again entities, every clear mode passes it
// even a core without batch clears. A failure here is more
// likely the model's.
func TestModelCalm(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 60; seed++ {
		cfg := newModelConfig(seed)
		cfg.faultRate, cfg.crashRate, cfg.calm = 0, 0, true
		var res *modelResult
		synctest.Test(t, func(*testing.T) { res = runModelConfig(cfg) })
		if len(res.violations) > 0 {
			t.Fatalf("calm run:\n%s", res.report(false))
		}
	}
}

// runModelSeed runs seed in a synctest bubble of its own.
func runModelSeed(t *testing.T, seed uint64) *modelResult {
	var res *modelResult
	synctest.Test(t, func(*testing.T) { res = runModel(seed) })
	return res
}

// report describes a failed run: its seed and config, its violations, and
// the trace around the first one: the lines naming its id, and the lines
// just before it.
func (r *modelResult) report(full bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (%v): %d violations\n", r.cfg.seed, r.cfg, len(r.violations))
	for i, v := range r.violations {
		if i == 8 {
			fmt.Fprintf(&b, "  ...\n")
			break
		}
		fmt.Fprintf(&b, "  pass %d: %s %s: %s\n", v.pass, v.kind, v.id, v.msg)
	}
	if full {
		fmt.Fprintf(&b, "trace:\n")
		for _, l := range r.trace {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	} else if len(r.violations) > 0 {
		v := r.violations[0]
		fmt.Fprintf(&b, "trace of %s up to the first violation (and the lines before it):\n", v.id)
		const before = 8
		for i, l := range r.trace[:v.at+1] {
			if i >= v.at-before || (v.id != "" && mentions(l, v.id)) || strings.HasPrefix(l[strings.IndexByte(l, ' ')+1:], "== pass") && i >= v.at-60 {
				fmt.Fprintf(&b, "  %s\n", l)
			}
		}
	}
	fmt.Fprintf(&b, "replay: RETENTION_MODEL_SEED=%d go test -race -run 'TestModel$' .\n", r.cfg.seed)
	return b.String()
}

// mentions reports whether trace line l names id as a whole word.
func mentions(l, id string) bool {
	for i := 0; ; {
		j := strings.Index(l[i:], id)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(id)
		if (j == 0 || !idByte(l[j-1])) && (end == len(l) || !idByte(l[end])) {
			return true
		}
		i = j + 1
	}
}

// modelRuns is the number of random runs of TestModel.
func modelRuns(t testing.TB) int {
	if s := os.Getenv("RETENTION_MODEL_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("RETENTION_MODEL_RUNS=%q: %v", s, err)
		}
		return n
	}
	if testing.Short() {
		return modelDefaultRuns / 4
	}
	return modelDefaultRuns
}

// TestModel runs the model over random seeds. A failure prints the seed,
// the run and a trace; keep the seed in modelSeeds.
func TestModel(t *testing.T) {
	if s := os.Getenv("RETENTION_MODEL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RETENTION_MODEL_SEED=%q: %v", s, err)
		}
		res := runModelSeed(t, seed)
		t.Logf("%d passes (%d failed), %d crashes; second clears allowed: %v", res.passes, res.failed, res.crashes, res.reasons)
		if len(res.violations) > 0 {
			t.Error(res.report(true))
		}
		return
	}
	runs := modelRuns(t)
	base := rand.Uint64()
	if s := os.Getenv("RETENTION_MODEL_FIRST"); s != "" {
		var err error
		if base, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("RETENTION_MODEL_FIRST=%q: %v", s, err)
		}
	}
	t.Logf("seeds %d to %d", base, base+uint64(runs)-1)
	const parts = 4
	var mu sync.Mutex
	var failing []*modelResult
	kinds := map[string][]uint64{} // runs per kind of violation
	reasons := map[string]int{}
	var crashes, passes, holds, runAsks int
	for part := range parts {
		t.Run(fmt.Sprintf("part%d", part), func(t *testing.T) {
			t.Parallel()
			for i := part; i < runs; i += parts {
				res := runModelSeed(t, base+uint64(i))
				mu.Lock()
				crashes += res.crashes
				passes += res.passes
				holds += res.holds
				runAsks += res.runAsks
				for r, n := range res.reasons {
					reasons[r] += n
				}
				if len(res.violations) > 0 {
					failing = append(failing, res)
					seen := map[string]bool{}
					for _, v := range res.violations {
						if !seen[v.kind] {
							seen[v.kind] = true
							kinds[v.kind] = append(kinds[v.kind], res.cfg.seed)
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	t.Cleanup(func() {
		t.Logf("%d runs, %d passes, %d crashes, %d holds (%d asked again by a run at a further marker); second clears the model allowed: %v",
			runs, passes, crashes, holds, runAsks, reasons)
		if len(failing) == 0 {
			return
		}
		sort.Slice(failing, func(i, j int) bool { return failing[i].cfg.seed < failing[j].cfg.seed })
		var seeds []string
		for _, r := range failing {
			seeds = append(seeds, strconv.FormatUint(r.cfg.seed, 10))
		}
		var b strings.Builder
		for _, kind := range slices.Sorted(maps.Keys(kinds)) {
			s := kinds[kind]
			slices.Sort(s)
			fmt.Fprintf(&b, "\n  %s: %d runs, e.g. seeds %v", kind, len(s), s[:min(len(s), 4)])
		}
		t.Errorf("%d of %d runs broke the model; by kind of violation:%s\nseeds: %s", len(failing), runs, b.String(), strings.Join(seeds, " "))
		for _, r := range failing[:min(len(failing), 3)] {
			t.Error(r.report(false))
		}
	})
}
