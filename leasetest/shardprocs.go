package leasetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// ShardEngine connects the sharded fleet proof (RunShardedProcesses) to one
// engine: 4 replica processes of a retention.Sharded sweep of 16 shards,
// re-executions of the test binary, over the engine's real server.
type ShardEngine struct {
	// TTL is the TTL of each shard's lease. Zero means 3s.
	TTL time.Duration

	// Heartbeat is the replicas' ShardConfig.Heartbeat. Zero means a sixth
	// of TTL.
	Heartbeat time.Duration

	// Interval is the replicas' Config.Interval; TTL + Interval bounds the
	// takeover of a shard. Zero means TTL.
	Interval time.Duration

	// Setup, run in the test process, creates a fresh store for a sweep of
	// shards shards under Prefix, whose replica processes are named by
	// processes (see ShardProcess.Process), and returns a name for it that
	// the other functions understand. It removes the store with t.Cleanup.
	Setup func(t testing.TB, shards int, processes []string) string

	// Connect, run in a replica process, connects to the store called
	// store.
	Connect ShardConnectFunc

	// Finish, run in the test process, records that the entities ids
	// finished: the state of ids[i], as the replicas' clears expect it, and
	// its marker keys[i], in shard retention.ShardOf(ids[i], shards) under
	// Prefix, each entity's state and marker in one transaction.
	Finish func(ctx context.Context, store string, ids []string, keys [][]byte) error

	// Clears, run in the test process, returns for each of ids the
	// processes that cleared it (ShardProcess.Process), once per clear, as
	// the store recorded them in the transactions that deleted the
	// markers.
	Clears func(ctx context.Context, store string, ids []string) (map[string][]string, error)

	// Remaining, run in the test process, counts the markers left in every
	// shard of store.
	Remaining func(ctx context.Context, store string) (int, error)

	// Members, when set, run in the test process, counts the replicas' keys
	// (the <prefix>#m keys a sharded Run shares the shards by) left in
	// store: the proof then requires none once every Run returned.
	Members func(ctx context.Context, store string) (int, error)
}

// ShardConnectFunc connects a replica process of RunShardedProcesses to a
// store; see ShardEngine.Connect.
type ShardConnectFunc func(ctx context.Context, store string, p ShardProcess) (ShardReplica, error)

// ShardProcess describes the replica process that connects.
type ShardProcess struct {
	// Shards is the number of shards of the sweep.
	Shards int
	// Replica is the replica's Config.Replica. A replica restarted after a
	// SIGKILL keeps its name.
	Replica string
	// Process names this process alone, over the whole proof: its clears
	// must record it, for ShardEngine.Clears.
	Process string
	// TTL is the TTL of the shards' leases.
	TTL time.Duration
}

// ShardReplica is a replica process's way to the store.
type ShardReplica struct {
	// KV is the KV given to retention.NewSharded: it keeps the replicas'
	// keys, and every shard's markers unless ShardKV is set.
	KV retention.KV

	// ShardKV, when set, is ShardConfig.KV: the store of each shard's
	// markers.
	ShardKV func(shard int, prefix string) (retention.KV, error)

	// Lease is ShardConfig.Lease: each shard's fencing Locker, with the
	// TTL of ShardProcess.
	Lease func(shard int, prefix string) (retention.Locker, error)

	// Close closes what Connect opened.
	Close func()
}

// The sharded fleet proof's shape, as issue 42 asks it.
const (
	shardCount    = 16
	shardReplicas = 4
	shardKeep     = time.Second            // Config.Retention
	shardMinPass  = 250 * time.Millisecond // Config.MinInterval: a pass of a shard at most 4 times a second, on 2 cores under -race
	shardBatch    = 10                     // entities the writer finishes every shardWriteGap: 200 a second
	shardWriteGap = 50 * time.Millisecond
	shardTimeout  = 2 * time.Minute // a replica's -test.timeout: one whose test process died ends by then
)

// Environment variables that turn a re-execution of the test into a
// replica of the sharded fleet proof.
const (
	envShardLog     = "LEASETEST_SHARD_LOG" // the replica's event log
	envShardStore   = "LEASETEST_SHARD_STORE"
	envShardReplica = "LEASETEST_SHARD_REPLICA"
	envShardProcess = "LEASETEST_SHARD_PROCESS"
)

func (e ShardEngine) withDefaults() ShardEngine {
	if e.TTL == 0 {
		e.TTL = 3 * time.Second
	}
	if e.Heartbeat == 0 {
		e.Heartbeat = e.TTL / 6
	}
	if e.Interval == 0 {
		e.Interval = e.TTL
	}
	return e
}

// RunShardedProcesses proves a sharded sweep on the engine's real server
// with replicas as processes, as issue 42 asks: 4 replica processes run a
// retention.Sharded sweep of 16 shards, each shard under its own fenced
// lease, with an atomic clear that records the process in the transaction
// that deletes the markers, while the test finishes 200 entities a second
// (a Retention of 1s). Each replica logs when it acquires, loses and
// releases each shard's lease. In turn:
//
//   - the replicas start together: within 2 TTLs every shard is held, each
//     replica holding within one of the even share (4);
//   - once each has cleared 25 entities, one replica is SIGKILLed and
//     another SIGSTOPped at once: every shard of theirs is taken by one of
//     the other two within TTL + Interval, and within 2 TTLs the two hold
//     8 each, within one;
//   - the stopped one is resumed (SIGCONT: its leases are gone) and the
//     killed one restarted under its name: within 2 TTLs the four hold
//     within one of 4;
//   - one replica stops (SIGTERM: its Run returns and releases its
//     shards): its shards are taken within TTL + Interval (a Heartbeat or
//     two), and within 2 TTLs the other three hold within one of 5⅓;
//   - the writer stops, the replicas clear the rest and stop (SIGTERM),
//     each exiting cleanly.
//
// Then no marker is left, every entity was cleared (0 lost), none twice
// and none by two processes, as the store recorded the clears
// (ShardEngine.Clears), and no replica's key is left (ShardEngine.Members).
// The takeover and balance times are logged.
//
// The replicas are re-executions of the test binary that run the same test
// (its -test.run), in which RunShardedProcesses runs the replica and
// returns: what the test does before calling it, the replicas do too, so
// keep that to what they may repeat (skips, clients, building the
// ShardEngine).
func RunShardedProcesses(t *testing.T, e ShardEngine) {
	e = e.withDefaults()
	if logPath := os.Getenv(envShardLog); logPath != "" {
		if err := runShardReplica(e, logPath); err != nil {
			t.Fatalf("replica %s: %v", os.Getenv(envShardProcess), err)
		}
		return
	}
	if e.Heartbeat*3 > e.TTL {
		t.Fatalf("ShardEngine.Heartbeat %v is more than a third of TTL %v: a frozen replica's shards would not be taken within TTL + Interval", e.Heartbeat, e.TTL)
	}
	processes := []string{"r0.1", "r1.1", "r2.1", "r3.1", "r0.2"} // the fifth: r0 restarted
	f := &shardFleet{t: t, e: e, dir: t.TempDir()}
	f.store = e.Setup(t, shardCount, processes)
	begun := time.Now()
	w := f.write()
	defer w.stop()
	bound := e.TTL + e.Interval
	t.Logf("%d replica processes, %d shards, TTL %v, Heartbeat %v, Interval %v: a takeover within %v, balance within %v",
		shardReplicas, shardCount, e.TTL, e.Heartbeat, e.Interval, bound, 2*e.TTL)

	// Start together.
	for i := range shardReplicas {
		f.start(fmt.Sprintf("r%d", i), processes[i])
	}
	started := f.waitStarted(0, 1, 2, 3)
	took, ok := f.waitBalanced(started, 2*e.TTL, 0, 1, 2, 3)
	f.logHeld("4 replicas started", took, ok, 0, 1, 2, 3)
	// Strike mid-run: each replica has cleared a few pages of its shards.
	f.waitClearing(time.Now(), 25, 0, 1, 2, 3)

	// SIGKILL r0 and SIGSTOP r1.
	owners := f.owners()
	dead, frozen := heldByProc(owners, 0), heldByProc(owners, 1)
	struck := time.Now()
	if err := f.procs[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := f.procs[1].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	<-f.procs[0].done
	f.checkTaken("r0 SIGKILLed", dead, struck, bound, 0, 1)
	f.checkTaken("r1 SIGSTOPped", frozen, struck, bound, 0, 1)
	took, ok = f.waitBalanced(struck, 2*e.TTL, 2, 3)
	f.logHeld("r0 killed and r1 stopped", took, ok, 2, 3)

	// SIGCONT r1, restart r0.
	resumed := time.Now()
	if err := f.procs[1].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	f.start("r0", processes[4])
	restarted := f.waitStarted(4)
	took, ok = f.waitBalanced(latest(resumed, restarted), 2*e.TTL, 1, 2, 3, 4)
	f.logHeld("r1 resumed and r0 restarted", took, ok, 1, 2, 3, 4)
	f.checkLostOnResume(1, frozen, resumed)

	// SIGTERM r3.
	owners = f.owners()
	left := heldByProc(owners, 3)
	stopped := time.Now()
	f.stop(3)
	f.checkTaken("r3 stopped (SIGTERM)", left, stopped, bound, 3)
	took, ok = f.waitBalanced(stopped, 2*e.TTL, 1, 2, 4)
	f.logHeld("r3 stopped", took, ok, 1, 2, 4)

	// The writer stops; the replicas clear the rest and stop.
	written := w.stop()
	drained := time.Now()
	limit := shardKeep + e.Interval + 2*e.TTL
	remaining := f.remaining()
	for ; remaining > 0 && time.Since(drained) < limit; remaining = f.remaining() {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d entities written over %v; the markers all gone %v after the writer stopped (%d left)",
		len(written), drained.Sub(begun).Round(time.Millisecond), time.Since(drained).Round(time.Millisecond), remaining)
	for _, i := range []int{1, 2, 4} {
		f.stop(i)
	}
	if remaining != 0 {
		t.Errorf("%d markers left %v after the writer stopped, want 0", remaining, limit)
	}
	f.checkClears(written)
	if e.Members != nil {
		n, err := e.Members(context.Background(), f.store)
		if err != nil {
			t.Fatalf("Members = %v", err)
		}
		if n != 0 {
			t.Errorf("%d replicas' keys left after every Run returned, want 0 (r0's from before its SIGKILL too: it was restarted under its name)", n)
		}
	}
}

// shardFleet is the replica processes of RunShardedProcesses.
type shardFleet struct {
	t     testing.TB
	e     ShardEngine
	store string
	dir   string
	procs []*shardProc
}

type shardProc struct {
	process  string // ShardProcess.Process
	cmd      *exec.Cmd
	log, out string
	done     chan struct{} // closed when the process has exited
	err      error         // Wait's, once done is closed
}

// start starts a replica process of the replica named replica.
func (f *shardFleet) start(replica, process string) {
	t := f.t
	i := len(f.procs)
	p := &shardProc{
		process: process,
		log:     filepath.Join(f.dir, process+".log"),
		out:     filepath.Join(f.dir, process+".out"),
		done:    make(chan struct{}),
	}
	out, err := os.Create(p.out)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(os.Args[0], "-test.run="+runPattern(t.Name()), "-test.timeout="+shardTimeout.String())
	p.cmd.Env = append(os.Environ(),
		envShardLog+"="+p.log,
		envShardStore+"="+f.store,
		envShardReplica+"="+replica,
		envShardProcess+"="+process,
	)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		out.Close()
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		out.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		// Whatever state it is in, it goes: SIGCONT in case it was stopped.
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			f.dump(i)
		}
	})
	f.procs = append(f.procs, p)
}

// runPattern returns the -test.run pattern that runs the test called name
// (a subtest's name holds its parents', separated by '/') alone.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// stop ends replica process i with SIGTERM, as a deployment would, and
// requires that it exits cleanly: its Run returned, and the test it runs
// as passed, with no goroutine left where the package checks for them.
func (f *shardFleet) stop(i int) {
	p := f.procs[i]
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		f.t.Errorf("replica %s did not exit within 30s of SIGTERM", p.process)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if p.err != nil {
		f.t.Errorf("replica %s, stopped by SIGTERM: %v, want a clean exit", p.process, p.err)
	}
}

// dump logs what replica process i wrote, for a failure's post-mortem.
func (f *shardFleet) dump(i int) {
	p := f.procs[i]
	var b strings.Builder
	evs, err := readEvents(p.log)
	if err != nil {
		fmt.Fprintf(&b, "reading its log: %v\n", err)
	}
	for _, ev := range evs {
		fmt.Fprintf(&b, "%s %s %s\n", ev.at.Format("15:04:05.000000"), ev.name, strings.Join(ev.fields, " "))
	}
	out, _ := os.ReadFile(p.out)
	f.t.Logf("replica %s's events:\n%soutput:\n%s", p.process, b.String(), out)
}

// shardWriter finishes shardBatch entities every shardWriteGap.
type shardWriter struct {
	mu      sync.Mutex
	written []string
	cancel  context.CancelFunc
	done    chan struct{}
}

func (f *shardFleet) write() *shardWriter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &shardWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for n := 0; ctx.Err() == nil; {
			ids := make([]string, shardBatch)
			keys := make([][]byte, shardBatch)
			now := time.Now()
			for i := range ids {
				ids[i] = fmt.Sprintf("e-%06d", n)
				n++
				k, err := retention.MarkerKey(retention.ShardPrefix(Prefix, retention.ShardOf(ids[i], shardCount)), now, ids[i])
				if err != nil {
					f.t.Errorf("MarkerKey(%q) = %v", ids[i], err)
					return
				}
				keys[i] = k
			}
			// Not ctx: a Finish cut short leaves entities that may or may
			// not have been written.
			if err := f.e.Finish(context.Background(), f.store, ids, keys); err != nil {
				f.t.Errorf("Finish = %v", err)
				return
			}
			w.mu.Lock()
			w.written = append(w.written, ids...)
			w.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(shardWriteGap):
			}
		}
	}()
	return w
}

// stop stops the writer and returns the ids it finished.
func (w *shardWriter) stop() []string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written
}

// readEvents reads a replica's log; a missing log has no events.
func readEvents(path string) ([]event, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []event
	for line := range strings.Lines(string(b)) {
		parts := strings.Fields(line)
		if len(parts) < 2 || !strings.HasSuffix(line, "\n") {
			continue // a line cut short, by SIGKILL or as it is written
		}
		ns, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, event{at: time.Unix(0, ns), name: parts[1], fields: parts[2:]})
	}
	return out, nil
}

// procEvent is an event of replica process proc.
type procEvent struct {
	proc int
	event
}

// events returns every replica process's events, in time order: the
// processes share the host's clock.
func (f *shardFleet) events() []procEvent {
	var all []procEvent
	for i, p := range f.procs {
		evs, err := readEvents(p.log)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, ev := range evs {
			all = append(all, procEvent{i, ev})
		}
	}
	slices.SortStableFunc(all, func(a, b procEvent) int { return a.at.Compare(b.at) })
	return all
}

// owners replays the lease events: the process that holds each shard, -1
// for none. A SIGKILLed or SIGSTOPped process holds its shards here until
// another acquires them.
func (f *shardFleet) owners() []int {
	owners := make([]int, shardCount)
	for i := range owners {
		owners[i] = -1
	}
	for _, ev := range f.events() {
		s := ev.int(0)
		if s < 0 || s >= shardCount {
			continue
		}
		switch ev.name {
		case retention.LeaseAcquired.String():
			owners[s] = ev.proc
		case retention.LeaseLost.String(), retention.LeaseReleased.String():
			if owners[s] == ev.proc {
				owners[s] = -1
			}
		}
	}
	return owners
}

func heldByProc(owners []int, proc int) []int {
	var out []int
	for s, o := range owners {
		if o == proc {
			out = append(out, s)
		}
	}
	return out
}

// balanced reports whether every shard is held by one of procs, each
// holding within one of the even share, and how many each holds.
func balanced(owners []int, procs []int) (bool, []int) {
	counts := make([]int, len(procs))
	held := 0
	for _, o := range owners {
		if k := slices.Index(procs, o); k >= 0 {
			counts[k]++
			held++
		}
	}
	even := float64(len(owners)) / float64(len(procs))
	ok := held == len(owners)
	for _, c := range counts {
		ok = ok && math.Abs(float64(c)-even) <= 1
	}
	return ok, counts
}

// waitStarted waits until the processes procs have logged their start,
// and returns when the last of them did.
func (f *shardFleet) waitStarted(procs ...int) time.Time {
	deadline := time.Now().Add(startLimit)
	for {
		var last time.Time
		n := 0
		for _, ev := range f.events() {
			if ev.name == "start" && slices.Contains(procs, ev.proc) {
				n++
				last = latest(last, ev.at)
			}
		}
		if n == len(procs) {
			return last
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d of %d replica processes started within %v", n, len(procs), startLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// waitClearing waits until each of procs has cleared at least n entities
// after from.
func (f *shardFleet) waitClearing(from time.Time, n int64, procs ...int) {
	f.t.Helper()
	deadline := time.Now().Add(startLimit)
	for {
		cleared := map[int]int64{}
		for _, ev := range f.events() {
			if ev.name == "cleared" && ev.at.After(from) {
				cleared[ev.proc] += ev.int(1)
			}
		}
		busy := 0
		for _, i := range procs {
			if cleared[i] >= n {
				busy++
			}
		}
		if busy == len(procs) {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d of %d replicas cleared %d entities within %v: %v", busy, len(procs), n, startLimit, cleared)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitBalanced waits until balanced(procs), at most limit after from, and
// returns how long after from it found them so.
func (f *shardFleet) waitBalanced(from time.Time, limit time.Duration, procs ...int) (time.Duration, bool) {
	for {
		if ok, _ := balanced(f.owners(), procs); ok {
			return time.Since(from), true
		}
		if time.Since(from) > limit {
			return time.Since(from), false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logHeld logs who holds how many shards after a step, and fails the test
// unless waitBalanced found them balanced.
func (f *shardFleet) logHeld(step string, took time.Duration, ok bool, procs ...int) {
	f.t.Helper()
	_, counts := balanced(f.owners(), procs)
	var held []string
	for k, i := range procs {
		held = append(held, fmt.Sprintf("%s:%d", f.procs[i].process, counts[k]))
	}
	if !ok {
		f.t.Errorf("%s: not within one of even %v after, held %v (owners %v), want within one of even within 2 TTLs",
			step, took.Round(time.Millisecond), held, f.owners())
		return
	}
	f.t.Logf("%s: every shard held, within one of even, %v after: %v", step, took.Round(time.Millisecond), held)
}

// checkTaken waits until a process other than victims acquired each of
// shards after from, at most bound and 5s more (to tell how late), and
// requires each within bound.
func (f *shardFleet) checkTaken(step string, shards []int, from time.Time, bound time.Duration, victims ...int) {
	f.t.Helper()
	took := make([]time.Duration, len(shards))
	for {
		for k := range took {
			took[k] = -1
		}
		for _, ev := range f.events() {
			if ev.name != retention.LeaseAcquired.String() || !ev.at.After(from) || slices.Contains(victims, ev.proc) {
				continue
			}
			if k := slices.Index(shards, int(ev.int(0))); k >= 0 && took[k] < 0 {
				took[k] = ev.at.Sub(from)
			}
		}
		if !slices.Contains(took, -1) || time.Since(from) > bound+5*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var worst time.Duration
	rounded := make([]string, len(took))
	for k, d := range took {
		if d < 0 || d > bound {
			f.t.Errorf("%s: shard %d taken after %v, want within TTL + Interval (%v); -1: not within %v",
				step, shards[k], d.Round(time.Millisecond), bound, bound+5*time.Second)
		}
		worst = max(worst, d)
		rounded[k] = d.Round(time.Millisecond).String()
	}
	f.t.Logf("%s: its shards %v taken after %v (at most %v, bound %v)", step, shards, rounded, worst.Round(time.Millisecond), bound)
}

// checkLostOnResume logs how many of the shards that process i held when
// it was stopped it logged lost or released after it resumed, and how
// soon: it learns of the loss when it wakes.
func (f *shardFleet) checkLostOnResume(i int, shards []int, resumed time.Time) {
	lost := map[int64]bool{}
	var first time.Time
	for _, ev := range f.events() {
		if ev.proc != i || ev.at.Before(resumed) {
			continue
		}
		if ev.name == retention.LeaseLost.String() || ev.name == retention.LeaseReleased.String() {
			if slices.Contains(shards, int(ev.int(0))) && !lost[ev.int(0)] {
				lost[ev.int(0)] = true
				if first.IsZero() {
					first = ev.at
				}
			}
		}
	}
	f.t.Logf("%s resumed: it logged the loss of %d of the %d shards it held when stopped, the first %s after SIGCONT",
		f.procs[i].process, len(lost), len(shards), since(first, resumed))
}

func (f *shardFleet) remaining() int {
	n, err := f.e.Remaining(context.Background(), f.store)
	if err != nil {
		f.t.Fatalf("Remaining = %v", err)
	}
	return n
}

// checkClears requires that the store recorded one clear of each written
// entity.
func (f *shardFleet) checkClears(written []string) {
	clears, err := f.e.Clears(context.Background(), f.store, written)
	if err != nil {
		f.t.Fatalf("Clears = %v", err)
	}
	var lost, twice, byTwo []string
	per := map[string]int{}
	for _, id := range written {
		by := clears[id]
		for _, p := range by {
			per[p]++
		}
		switch {
		case len(by) == 0:
			lost = append(lost, id)
		case len(by) > 1:
			twice = append(twice, id)
			if slices.ContainsFunc(by, func(p string) bool { return p != by[0] }) {
				byTwo = append(byTwo, id)
			}
		}
	}
	var byProc []string
	for _, p := range f.procs {
		byProc = append(byProc, fmt.Sprintf("%s:%d", p.process, per[p.process]))
	}
	f.t.Logf("%d entities: %d cleared once, %d lost, %d cleared twice, %d by two processes; cleared by process %v",
		len(written), len(written)-len(lost)-len(twice), len(lost), len(twice), len(byTwo), byProc)
	if len(lost) > 0 {
		f.t.Errorf("%d entities never cleared, want 0: %v", len(lost), firstN(lost, 10))
	}
	if len(twice) > 0 {
		f.t.Errorf("%d entities cleared more than once (%d of them by two processes), want 0: %v", len(twice), len(byTwo), firstN(twice, 10))
		for _, id := range firstN(twice, 10) {
			f.t.Logf("%s cleared by %v", id, clears[id])
		}
	}
}

func firstN(ids []string, n int) []string { return ids[:min(n, len(ids))] }

// runShardReplica runs this process as a replica of the sharded fleet
// proof until SIGTERM.
func runShardReplica(e ShardEngine, logPath string) error {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	log := &eventLog{w: f}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	p := ShardProcess{Shards: shardCount, Replica: os.Getenv(envShardReplica), Process: os.Getenv(envShardProcess), TTL: e.TTL}
	r, err := e.Connect(ctx, os.Getenv(envShardStore), p)
	if err != nil {
		return fmt.Errorf("connecting to the store: %w", err)
	}
	defer r.Close()
	sc := retention.ShardConfig{Shards: shardCount, Heartbeat: e.Heartbeat, Lease: r.Lease}
	atomicKV := func(shard int, kv retention.KV) (retention.KV, error) {
		if _, ok := kv.(retention.ClearDeleter); !ok {
			return nil, fmt.Errorf("the KV of shard %d (%T) is not a retention.ClearDeleter: the proof counts clears the store records", shard, kv)
		}
		return kv, nil
	}
	if r.ShardKV != nil {
		sc.KV = func(shard int, prefix string) (retention.KV, error) {
			kv, err := r.ShardKV(shard, prefix)
			if err != nil {
				return nil, err
			}
			return atomicKV(shard, kv)
		}
	} else if _, err := atomicKV(0, r.KV); err != nil {
		return err
	}
	s, err := retention.NewSharded(r.KV, retention.Config{
		Prefix:       Prefix,
		Retention:    shardKeep,
		Interval:     e.Interval,
		MinInterval:  shardMinPass,
		StoreTimeout: 2 * time.Second,
		Replica:      p.Replica,
		Observer:     shardLog{log},
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, sc)
	if err != nil {
		return err
	}
	log.add("start")
	err = s.Run(ctx)
	log.add("stop")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// shardLog is a replica's Observer: it logs "<event> <shard>" when the
// replica acquires, loses or releases a shard's lease, and "cleared <shard>
// <n>" after a page that cleared n entities.
type shardLog struct{ log *eventLog }

func (shardLog) ObservePass(string, retention.Stats, error) {}
func (shardLog) ObserveLags(string, []time.Duration)        {}

func (o shardLog) ObservePage(prefix string, page retention.Stats) {
	if page.Cleared > 0 {
		o.add(prefix, "cleared", page.Cleared)
	}
}

func (o shardLog) ObserveLease(prefix string, e retention.LeaseEvent) {
	if e != retention.LeaseHeld {
		o.add(prefix, e.String())
	}
}

// add logs "<event> <shard> <fields>".
func (o shardLog) add(prefix, event string, fields ...any) {
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(prefix, Prefix+"s"), "/"))
	if err != nil {
		o.log.add("bad-prefix", strconv.Quote(prefix))
		return
	}
	o.log.add(event, append([]any{n}, fields...)...)
}
