package rediskv_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/rediskv"
)

// The crash test kills a process that sweeps an AtomicKV with SIGKILL,
// again and again, and checks after every kill that no entity was lost or
// cleared twice. The child process is this test binary run again with
// rcrashEnvSet set.
const (
	rcrashEnvSet   = "RETENTION_RCRASH_SET"   // the marker set's key
	rcrashEnvStart = "RETENTION_RCRASH_START" // the parent's start, Unix nanoseconds: the children's clocks agree on it
	rcrashEnvSeed  = "RETENTION_RCRASH_SEED"  // the child's fault seed
	rcrashEnvConc  = "RETENTION_RCRASH_CONC"  // the child's Concurrency

	rcrashPrefix    = "runs/"
	rcrashRetention = time.Hour
	rcrashExpired   = 20_000
	rcrashUnexpired = 1_000
	rcrashKills     = 24
	rcrashChild     = "rcrash-child" // the children's client name, in CLIENT LIST
	rcrashTimeout   = 100 * time.Millisecond

	// Held entities: one in rcrashHeldEvery of the expired ids in one
	// band of rcrashBand in three (280 ids), each held until a moment of
	// its own between rcrashHoldFrom and rcrashHoldFrom+rcrashHoldSpan
	// after the parent's start: most children meet holds, and every hold
	// is over before the final pass. The other bands, the oldest first,
	// hold none, so that a child with Concurrency 1 that starts in one
	// clears it by runs: a sweep that keeps a hold in memory asks for no
	// run, and one that meets a held id keeps it.
	rcrashHeldEvery = 25
	rcrashBand      = 1000
	rcrashHoldFrom  = 10 * time.Second
	rcrashHoldSpan  = 20 * time.Second
)

// rcrashBase is "now" when the test starts: the unexpired entities
// finished then, and fall due long after the test.
var rcrashBase = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func rcrashID(expired bool, i int) string {
	if expired {
		return fmt.Sprintf("x%05d", i)
	}
	return fmt.Sprintf("u%04d", i)
}

// rcrashPoison reports whether id always fails to clear in a child.
func rcrashPoison(id string) bool {
	i, err := strconv.Atoi(id[1:])
	return err == nil && id[0] == 'x' && i%101 == 0
}

// rcrashHold returns the end of the hold on id, on the children's clock
// (rcrashClock), and whether id is held at all.
func rcrashHold(id string) (time.Time, bool) {
	i, err := strconv.Atoi(id[1:])
	if err != nil || id[0] != 'x' || i/rcrashBand%3 != 1 || i%rcrashHeldEvery != 7 {
		return time.Time{}, false
	}
	spread := time.Duration(i*7919%int(rcrashHoldSpan/time.Millisecond)) * time.Millisecond
	return rcrashBase.Add(rcrashHoldFrom + spread), true
}

// rcrashHoldEnd is when the last hold ends, on the children's clock.
var rcrashHoldEnd = rcrashBase.Add(rcrashHoldFrom + rcrashHoldSpan)

// rcrashMarker is the marker the test writes for an entity: expired ones
// spread over a few seconds two hours back.
func rcrashMarker(expired bool, i int) []byte {
	t := rcrashBase
	if expired {
		t = rcrashBase.Add(-2*time.Hour + time.Duration(i)*time.Millisecond/4)
	}
	key, err := retention.MarkerKey(rcrashPrefix, t, rcrashID(expired, i))
	if err != nil {
		panic(err)
	}
	return key
}

// rcrashState is the key of an entity's state: it has the set's hash tag.
func rcrashState(set, id string) string {
	return strings.TrimSuffix(set, ":markers") + ":state:" + id
}

// rcrashAtomic is the AtomicKV over kv, whose set is set: its template
// names rcrashState's keys, so it clears runs too.
func rcrashAtomic(kv *rediskv.KV, set string) (*rediskv.AtomicKV, error) {
	return kv.WithStateKeys(rcrashState(set, "<id>"))
}

// rcrashClock reads rcrashBase plus the real time since the parent
// started, the same in every child, so a marker one child rescheduled
// falls due for the next at the same moment.
type rcrashClock struct{ start time.Time }

func (c rcrashClock) Now() time.Time { return rcrashBase.Add(time.Since(c.start)) }

// TestCrashAtomic: a child process runs a Sweep over 20,000 expired and
// 1,000 unexpired entities of an AtomicKV made by WithStateKeys, each a
// state key and a marker, and is killed with SIGKILL, then started again,
// rcrashKills times. Children alternate Concurrency 1, which clears the
// expired range by runs (ClearRun) where it can, and 4, which reads pages
// and clears them by batches (ClearAndDelete). In the child, a wrapper
// around the AtomicKV fails every batch that holds a poison id (the sweep
// bisects it down to the id and reschedules its marker), and lets about
// one clear (batch or run) in twelve commit and then wait past
// ClearTimeout before it returns, as a reply lost after the commit. A run
// has no failure of its own id by id: a script deletes every key or none.
// One expired id in 25 of one band of 1,000 in three is held (rcrashHold):
// until its hold ends the wrapper refuses a batch that holds one, changing
// nothing, with a retention.BatchError naming the held ids (one Hold for
// the whole call when all its ids are held until the same moment), and the
// sweep moves their markers to held keys; it refuses a run that would take
// one (a run cannot hold an id), and the sweep reads the page instead. The
// parent kills a child at a random moment: early, after some commits
// (batches or runs), right after a reschedule (Put or Move), right after
// a clear whose ClearTimeout fired, or right after a batch refused for a
// hold.
//
// The parent counts every committed clear of every id: MONITOR, on a
// connection of its own, shows each command a script runs, and the clear
// and run scripts run their UNLINK of the state keys only once every check
// passed, so an UNLINK naming an id's state key is one commit of a clear
// of that id. State keys are never written again, so a second commit for
// an id is a second clear, even though its UNLINK finds nothing to delete.
//
// After every kill, once the server has no connection of the child left:
// no id was committed twice; an expired entity's state exists exactly when
// one marker of its id does (a state without a marker is lost, a marker
// without a state will clear its id again, two markers may clear it
// twice); a state is gone exactly when its id was committed; unexpired
// entities are untouched; no held id was committed before its hold's end
// (by the time MONITOR shows), nor is gone while its hold lasts; a held
// key is a held id's, at its hold's end (or, where the hold ended before
// the move, at most a second after the check). Finally, once every hold
// is over, one pass in this process, without faults, clears the rest (by
// runs, where the expired range holds any), and every expired id, held
// ones included, was committed exactly once; some child committed runs.
func TestCrashAtomic(t *testing.T) {
	if set := os.Getenv(rcrashEnvSet); set != "" {
		rcrashRun(t, set)
		return
	}
	if testing.Short() {
		t.Skip("crash test: starts and kills dozens of processes")
	}
	addr := kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR")
	start := time.Now()
	seed := rand.Uint64()
	if s := os.Getenv("RETENTION_RCRASH_SEED0"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set RETENTION_RCRASH_SEED0 to repeat the kills)", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	admin := connect(t)
	ctx := context.Background()
	set := freshKey(t, admin)
	rcrashSetup(t, admin, set)
	mon := newMonitor(t, addr, strings.TrimSuffix(set, ":markers")+":state:")

	v := &rcrashViolations{}
	kinds := map[string]int{}
	runs := 0 // runs the children committed
	holds := rcrashHoldCount{ids: map[string]bool{}}
	for n := 1; n <= rcrashKills; n++ {
		// How to pick the moment: at random early on, or on the k-th line
		// the child prints of a kind; on a hold's only while holds last.
		kind, k := "early", 0
		switch r := rng.IntN(24); {
		case r < 4:
		case r < 9:
			kind, k = "clear", 1+rng.IntN(25)
		case r < 15:
			kind, k = "reschedule", 1+rng.IntN(12)
		case r < 19 && rcrashHoldEnd.Sub(rcrashClock{start}.Now()) > 5*time.Second:
			kind, k = "hold", 1+rng.IntN(4)
		default:
			kind, k = "timeout", 1+rng.IntN(3)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashAtomic$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			rcrashEnvSet+"="+set,
			rcrashEnvStart+"="+strconv.FormatInt(start.UnixNano(), 10),
			rcrashEnvSeed+"="+strconv.FormatUint(rng.Uint64(), 10),
			rcrashEnvConc+"="+strconv.Itoa([]int{4, 1}[n%2]), // the first by runs, from the oldest band
		)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		lines := make(chan string, 1024)
		childHolds := rcrashHoldCount{ids: map[string]bool{}} // the reader's until lines closes
		childRuns := 0                                        // likewise
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				childHolds.add(sc.Text())
				if sc.Text() == "RUN" {
					childRuns++
				}
				lines <- sc.Text()
			}
		}()
		got := kind
		if kind == "early" {
			time.Sleep(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
		} else {
			got = rcrashWait(lines, kind, k, 4*time.Second)
		}
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		for range lines { // the pipe's reader ends
		}
		if ps := cmd.ProcessState; ps != nil && ps.Exited() {
			require.Failf(t, "child exited by itself", "child %d: %s\n%s", n, ps, stderr.String())
		}
		kinds[got]++
		holds.merge(childHolds)
		runs += childRuns
		rcrashSettle(t, admin, mon, n)
		v.check(t, admin, set, mon, start, n, got)
	}

	if d := rcrashHoldEnd.Sub(rcrashClock{start}.Now()); d > 0 {
		t.Logf("waiting %v for the last hold to end", d.Round(time.Millisecond))
		time.Sleep(d)
	}

	// One pass without faults clears the rest, rescheduled markers and
	// poison ids included: its clock is past every retry but before the
	// unexpired entities fall due.
	kv, err := rediskv.New(admin, set)
	require.NoError(t, err)
	akv, err := rcrashAtomic(kv, set)
	require.NoError(t, err)
	s, err := retention.New(akv, retention.Config{
		Prefix: rcrashPrefix, Retention: rcrashRetention, BatchSize: 100, PageSize: 1000,
		Clock:  retention.NewManualClock(rcrashClock{start}.Now().Add(30 * time.Minute)),
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	rcrashSettle(t, admin, mon, rcrashKills+1)
	v.check(t, admin, set, mon, start, rcrashKills+1, "final")
	left, err := admin.ZCard(ctx, set).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(rcrashUnexpired), left, "markers left after the final pass: the unexpired ones")
	commits := mon.snapshot()
	once := 0
	for i := range rcrashExpired {
		if commits[rcrashID(true, i)] == 1 {
			once++
		}
	}
	t.Logf("kills by moment: %v; runs committed by children: %d; final pass: %d cleared in %d calls, %d failed, %d held",
		kinds, runs, st.Cleared, st.ClearCalls, st.Failed, st.Held)
	t.Logf("children's holds: %s; held keys at a check: at most %d", holds, v.heldKeys)
	t.Logf("expired ids committed exactly once: %d of %d; %s", once, rcrashExpired, v.summary())
	var afterOrphan, afterDouble, unseen int
	for id := range v.ids["committed twice"] {
		switch {
		case v.ids["marker without state"][id]:
			afterOrphan++
		case v.ids["two markers"][id]:
			afterDouble++
		default:
			unseen++
		}
	}
	t.Logf("ids committed twice: %d seen before with a marker and no state, %d with two markers, %d in neither state at a check",
		afterOrphan, afterDouble, unseen)
	assert.Equal(t, rcrashExpired, once, "expired ids committed exactly once")
	assert.NotEmpty(t, holds.ids, "no child refused a batch for a hold: the test did not exercise holds")
	assert.Positive(t, runs, "no child committed a run: the test did not exercise runs")
	v.report(t)
}

// rcrashWait reads the child's lines until the k-th of kind ("reschedule"
// counts PUT and MOVE lines), and returns kind, or "idle" when the child
// printed no such line within d.
func rcrashWait(lines <-chan string, kind string, k int, d time.Duration) string {
	deadline := time.After(d)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return "exited"
			}
			switch {
			case kind == "clear" && (line == "CLEAR" || line == "RUN"),
				kind == "reschedule" && (line == "PUT" || line == "MOVE"),
				kind == "timeout" && line == "TIMEOUT",
				kind == "hold" && strings.HasPrefix(line, "HOLD "):
				if k--; k == 0 {
					return kind
				}
			}
		case <-deadline:
			return "idle"
		}
	}
}

// rcrashSetup writes every entity's state and marker.
func rcrashSetup(t *testing.T, admin *redis.Client, set string) {
	ctx := context.Background()
	pipe := admin.Pipeline()
	var states []string
	add := func(expired bool, i int) {
		id := rcrashID(expired, i)
		states = append(states, rcrashState(set, id))
		pipe.Set(ctx, rcrashState(set, id), "done", 0)
		pipe.ZAdd(ctx, set, redis.Z{Member: string(rcrashMarker(expired, i))})
	}
	for i := range rcrashExpired {
		add(true, i)
	}
	for i := range rcrashUnexpired {
		add(false, i)
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		for len(states) > 0 {
			n := min(len(states), 1000)
			admin.Unlink(context.Background(), states[:n]...)
			states = states[n:]
		}
	})
}

// rcrashSettle waits until the server has no connection of the killed
// child left, so that no command it sent is still to run, and until the
// monitor has read every line up to now.
func rcrashSettle(t *testing.T, admin *redis.Client, mon *monitor, n int) {
	ctx := context.Background()
	require.Eventually(t, func() bool {
		list, err := admin.ClientList(ctx).Result()
		return err == nil && !strings.Contains(list, "name="+rcrashChild)
	}, 10*time.Second, 5*time.Millisecond, "the killed child's connections close")
	mon.sync(t, admin, fmt.Sprintf("rcrash-sync-%d", n))
}

// rcrashHoldCount counts the holds children returned, from their HOLD
// lines.
type rcrashHoldCount struct {
	calls, whole, n int // refused calls, those refused with one Hold, ids held
	ids             map[string]bool
}

// add counts line when it tells of a hold: "HOLD batch|whole <id>...".
func (c *rcrashHoldCount) add(line string) {
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "HOLD" {
		return
	}
	c.calls++
	if f[1] == "whole" {
		c.whole++
	}
	for _, id := range f[2:] {
		c.n++
		c.ids[id] = true
	}
}

func (c *rcrashHoldCount) merge(o rcrashHoldCount) {
	c.calls, c.whole, c.n = c.calls+o.calls, c.whole+o.whole, c.n+o.n
	for id := range o.ids {
		c.ids[id] = true
	}
}

func (c rcrashHoldCount) String() string {
	return fmt.Sprintf("%d holds of %d ids in %d refused calls (%d by one Hold)", c.n, len(c.ids), c.calls, c.whole)
}

// rcrashViolations collects the ids each check after a kill found at
// fault, by kind of fault, and the first few findings.
type rcrashViolations struct {
	ids      map[string]map[string]bool // kind -> ids
	examples []string
	heldKeys int // the most held keys a check saw
}

// The kinds of fault, in the order a check looks for them.
var rcrashKinds = []string{"committed twice", "lost", "marker without state", "two markers", "state/commit mismatch", "unexpired touched",
	"held cleared early", "bad held key"}

func (v *rcrashViolations) add(kind, id, format string, args ...any) {
	if v.ids == nil {
		v.ids = map[string]map[string]bool{}
	}
	if v.ids[kind] == nil {
		v.ids[kind] = map[string]bool{}
	}
	if v.ids[kind][id] {
		return
	}
	v.ids[kind][id] = true
	if len(v.examples) < 12 {
		v.examples = append(v.examples, fmt.Sprintf(format, args...))
	}
}

// check reads the store, with no child running, and checks the
// invariants. start is the parent's start, from which the children's
// clocks count.
func (v *rcrashViolations) check(t *testing.T, admin *redis.Client, set string, mon *monitor, start time.Time, n int, kind string) {
	ctx := context.Background()
	now := rcrashClock{start}.Now() // before the reads: a hold that lasts past it lasted through them
	markers, err := admin.ZRange(ctx, set, 0, -1).Result()
	require.NoError(t, err)
	perID := map[string][]string{}
	for _, m := range markers {
		_, id, err := retention.ParseMarkerKey(rcrashPrefix, []byte(m))
		require.NoError(t, err, "a marker the sweep wrote")
		perID[string(id)] = append(perID[string(id)], m)
	}
	pipe := admin.Pipeline()
	exists := map[string]*redis.IntCmd{}
	for i := range rcrashExpired {
		exists[rcrashID(true, i)] = pipe.Exists(ctx, rcrashState(set, rcrashID(true, i)))
	}
	for i := range rcrashUnexpired {
		exists[rcrashID(false, i)] = pipe.Exists(ctx, rcrashState(set, rcrashID(false, i)))
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	commits, firstAt := mon.snapshot(), mon.firstCommits()
	at := fmt.Sprintf("after kill %d (%s)", n, kind)
	for i := range rcrashExpired {
		id := rcrashID(true, i)
		state, m, c := exists[id].Val() == 1, len(perID[id]), commits[id]
		switch {
		case c > 1:
			v.add("committed twice", id, "%s: %s committed %d times", at, id, c)
		case state && m == 0:
			v.add("lost", id, "%s: %s has its state and no marker: never cleared", at, id)
		case !state && m > 0:
			v.add("marker without state", id, "%s: %s has %d markers and no state: it will be cleared again", at, id, m)
		case m > 1:
			v.add("two markers", id, "%s: %s has %d markers %q", at, id, m, perID[id])
		case state == (c == 1):
			v.add("state/commit mismatch", id, "%s: %s: state present %v, %d commits", at, id, state, c)
		}
	}
	// Held ids: committed only once the hold is over, present while it
	// lasts; a held key only for a held id, at its hold's end, or later
	// where the hold ended before the sweep moved the marker (then at most
	// a RetryDelay after the move, which came before now).
	heldKeys := 0
	for id, ms := range perID {
		for _, m := range ms {
			keyUntil, ok := rcrashHeldKeyUntil(m)
			if !ok {
				continue
			}
			heldKeys++
			until, held := rcrashHold(id)
			if !held || keyUntil.Before(until) || keyUntil.After(latest(until, now).Add(time.Second)) {
				v.add("bad held key", id, "%s: held key %q: %s held %v until %s", at, m, id, held, until.Format(time.RFC3339Nano))
			}
		}
	}
	v.heldKeys = max(v.heldKeys, heldKeys)
	for i := range rcrashExpired {
		id := rcrashID(true, i)
		until, held := rcrashHold(id)
		if !held {
			continue
		}
		untilReal := start.Add(until.Sub(rcrashBase))
		if c, ok := firstAt[id]; ok && c.Before(untilReal) {
			v.add("held cleared early", id, "%s: %s committed at %s, held until %s", at, id, c.Format(time.RFC3339Nano), untilReal.Format(time.RFC3339Nano))
		}
		if exists[id].Val() != 1 && until.After(now) {
			v.add("held cleared early", id, "%s: %s is gone while held until %s", at, id, until.Format(time.RFC3339Nano))
		}
	}
	for i := range rcrashUnexpired {
		id := rcrashID(false, i)
		if exists[id].Val() != 1 || commits[id] != 0 || len(perID[id]) != 1 || perID[id][0] != string(rcrashMarker(false, i)) {
			v.add("unexpired touched", id, "%s: unexpired %s touched: state %d, commits %d, markers %q", at, id, exists[id].Val(), commits[id], perID[id])
		}
	}
}

// rcrashHeldKeyUntil returns the time a held key
// (runs/r<until>/<finished>/h<attempts>/<id>) holds its id until, and false
// for any other key.
func rcrashHeldKeyUntil(key string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(key, rcrashPrefix+"r")
	if !ok || len(rest) < 2*retention.TimestampWidth+4 || !strings.HasPrefix(rest[retention.TimestampWidth+1+retention.TimestampWidth:], "/h") {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(rest[:retention.TimestampWidth], 10, 64)
	return time.UnixMilli(ms), err == nil
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// summary counts the ids at fault, by kind.
func (v *rcrashViolations) summary() string {
	parts := make([]string, len(rcrashKinds))
	for i, kind := range rcrashKinds {
		parts[i] = fmt.Sprintf("%s %d", kind, len(v.ids[kind]))
	}
	return "ids at fault: " + strings.Join(parts, ", ")
}

func (v *rcrashViolations) report(t *testing.T) {
	if len(v.examples) > 0 {
		t.Errorf("%s; first findings:\n%s", v.summary(), strings.Join(v.examples, "\n"))
	}
}

// monitor counts, from a MONITOR connection, the commits of the clear
// script per id: its UNLINKs of state keys under statePrefix, and keeps
// the server's time of each id's first.
type monitor struct {
	conn        net.Conn
	statePrefix string
	done        chan struct{}

	mu      sync.Mutex
	commits map[string]int
	first   map[string]time.Time
	seen    map[string]chan struct{} // sync tokens waited for
	err     error
}

func newMonitor(t *testing.T, addr, statePrefix string) *monitor {
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = io.WriteString(conn, "MONITOR\r\n")
	require.NoError(t, err)
	m := &monitor{conn: conn, statePrefix: statePrefix, done: make(chan struct{}),
		commits: map[string]int{}, first: map[string]time.Time{}, seen: map[string]chan struct{}{}}
	go m.read()
	t.Cleanup(func() {
		conn.Close()
		<-m.done
	})
	return m
}

func (m *monitor) read() {
	defer close(m.done)
	r := bufio.NewReaderSize(m.conn, 1<<20)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			m.mu.Lock()
			m.err = err
			m.mu.Unlock()
			return
		}
		m.line(strings.TrimRight(line, "\r\n"))
	}
}

// line takes one line of MONITOR: +<time> [<db> <client>] "cmd" "arg" ...
// where time is the server's Unix time in seconds, to the microsecond.
func (m *monitor) line(line string) {
	stamp, rest, ok := strings.Cut(line, "[")
	if !ok {
		return
	}
	client, rest, ok := strings.Cut(rest, "] ")
	if !ok {
		return
	}
	args := strings.Split(strings.Trim(rest, `"`), `" "`)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case strings.HasSuffix(client, " lua") && strings.EqualFold(args[0], "unlink"):
		for _, key := range args[1:] {
			if id, ok := strings.CutPrefix(key, m.statePrefix); ok {
				m.commits[id]++
				if _, ok := m.first[id]; !ok {
					m.first[id] = monitorTime(stamp)
				}
			}
		}
	case strings.EqualFold(args[0], "echo") && len(args) == 2:
		if ch, ok := m.seen[args[1]]; ok {
			close(ch)
			delete(m.seen, args[1])
		}
	}
}

// sync sends token with ECHO and waits until the monitor read it: every
// command the server ran before is counted then.
func (m *monitor) sync(t *testing.T, admin redis.Cmdable, token string) {
	ch := make(chan struct{})
	m.mu.Lock()
	m.seen[token] = ch
	m.mu.Unlock()
	require.NoError(t, admin.Echo(context.Background(), token).Err())
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		m.mu.Lock()
		defer m.mu.Unlock()
		require.Failf(t, "the monitor did not see the sync token", "%s: %v", token, m.err)
	}
}

// monitorTime parses the time that starts a MONITOR line, "+1700000000.123456 ",
// or returns the zero time.
func monitorTime(stamp string) time.Time {
	sec, usec, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(stamp, "+")), ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt(usec, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}
	}
	return time.Unix(s, us*1000)
}

// firstCommits returns the server's time of each id's first commit.
func (m *monitor) firstCommits() map[string]time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]time.Time, len(m.first))
	for id, at := range m.first {
		out[id] = at
	}
	return out
}

func (m *monitor) snapshot() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int, len(m.commits))
	for id, n := range m.commits {
		out[id] = n
	}
	return out
}

// rcrashRun is the child: it sweeps until it is killed, printing a line
// for each commit (CLEAR for a batch, RUN for a run), reschedule (PUT,
// MOVE) and clear that committed and timed out (TIMEOUT).
func rcrashRun(t *testing.T, set string) {
	startNs, err := strconv.ParseInt(os.Getenv(rcrashEnvStart), 10, 64)
	require.NoError(t, err)
	seed, err := strconv.ParseUint(os.Getenv(rcrashEnvSeed), 10, 64)
	require.NoError(t, err)
	conc, err := strconv.Atoi(os.Getenv(rcrashEnvConc))
	require.NoError(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("RETENTION_REDIS_ADDR"), ClientName: rcrashChild, PoolSize: 8})
	kv, err := rediskv.New(rdb, set)
	require.NoError(t, err)
	akv, err := rcrashAtomic(kv, set)
	require.NoError(t, err)
	clock := rcrashClock{time.Unix(0, startNs)}
	f := &faultyKV{AtomicKV: akv, rng: rand.New(rand.NewPCG(seed, seed)), clock: clock}
	s, err := retention.New(f, retention.Config{
		Prefix: rcrashPrefix, Retention: rcrashRetention,
		BatchSize: 50, PageSize: 200, Concurrency: conc,
		ClearTimeout: rcrashTimeout, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 2 * time.Second,
		Clock:  clock,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	err = s.Run(context.Background())
	t.Fatalf("Run returned %v before the kill", err)
}

// faultyKV is the child's store: the AtomicKV, with holds and faults in
// its clears, and a line printed for every write and refusal the parent
// may kill on.
type faultyKV struct {
	*rediskv.AtomicKV
	clock retention.Clock
	mu    sync.Mutex
	rng   *rand.Rand
}

var errPoison = errors.New("rcrash: a poison id is in the batch")

func say(line string) { _, _ = os.Stdout.WriteString(line + "\n") }

func (f *faultyKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if err := f.holds(ids); err != nil {
		return err
	}
	for _, id := range ids {
		if rcrashPoison(id) {
			return errPoison // the sweep bisects the batch down to the id
		}
	}
	f.mu.Lock()
	lostReply := f.rng.IntN(12) == 0
	f.mu.Unlock()
	if err := f.AtomicKV.ClearAndDelete(ctx, ids, keys); err != nil {
		return err
	}
	say("CLEAR")
	if lostReply {
		<-ctx.Done() // ClearTimeout: the reply never came
		say("TIMEOUT")
		return ctx.Err()
	}
	return nil
}

// holds refuses, changing nothing, a batch that holds an id whose hold
// lasts: as a ClearDeleter must, with a retention.BatchError naming the
// held ids with retention.Hold (the sweep sends the others again), or with
// one Hold for the whole call when every id of it is held until the same
// moment. It prints "HOLD batch|whole <id>...".
func (f *faultyKV) holds(ids []string) error {
	now := f.clock.Now()
	perID := retention.BatchError{}
	var held []string
	var last time.Time
	same := true
	for _, id := range ids {
		if until, ok := rcrashHold(id); ok && now.Before(until) {
			perID[id] = retention.Hold(until)
			held = append(held, id)
			same = same && (last.IsZero() || until.Equal(last))
			last = until
		}
	}
	switch {
	case len(held) == 0:
		return nil
	case len(held) == len(ids) && same:
		say("HOLD whole " + strings.Join(held, " "))
		return retention.Hold(last)
	}
	say("HOLD batch " + strings.Join(held, " "))
	return perID
}

var errHeldInRun = errors.New("rcrash: a held id is in the run")

// ClearRun refuses, changing nothing, a run that would take an id whose
// hold lasts, having read the run first (only this child writes the set,
// and its Concurrency 1 sweep makes one call at a time); the sweep then
// reads the page and clears it by batches, which holds return. Otherwise
// it clears the run, and one in twelve loses its reply as ClearAndDelete
// does.
func (f *faultyKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	keys, err := f.Scan(ctx, from, end, limit)
	if err != nil {
		return nil, err
	}
	now := f.clock.Now()
	for _, key := range keys {
		if _, id, err := retention.ParseMarkerKey(prefix, key); err == nil {
			if until, ok := rcrashHold(string(id)); ok && now.Before(until) {
				return nil, errHeldInRun
			}
		}
	}
	f.mu.Lock()
	lostReply := f.rng.IntN(12) == 0
	f.mu.Unlock()
	keys, err = f.AtomicKV.ClearRun(ctx, prefix, from, end, limit)
	if err != nil || len(keys) == 0 {
		return keys, err
	}
	say("RUN")
	if lostReply {
		<-ctx.Done()
		say("TIMEOUT")
		return nil, ctx.Err()
	}
	return keys, nil
}

// RunStore implements retention.RunClearer.
func (f *faultyKV) RunStore() retention.RunClearer { return f }

// Put and Move widen the window after a reschedule a little, so that a
// kill on its line lands there more often.
func (f *faultyKV) Put(ctx context.Context, key, value []byte) error {
	err := f.AtomicKV.Put(ctx, key, value)
	if err == nil {
		say("PUT")
		time.Sleep(time.Millisecond)
	}
	return err
}

func (f *faultyKV) Move(ctx context.Context, from, to [][]byte) error {
	err := f.AtomicKV.Move(ctx, from, to)
	if err == nil {
		say("MOVE")
		time.Sleep(time.Millisecond)
	}
	return err
}
