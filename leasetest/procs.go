package leasetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// Engine connects the process proofs (RunProcesses) to one engine: the
// replicas are separate processes, re-executions of the test binary, that
// reach the server through TCP proxies the test controls.
type Engine struct {
	// Addr is the server's host:port. Each replica connects through a proxy
	// that forwards to it.
	Addr string

	// TTL is the TTL the replicas' Lockers use; keep it short (1 to 3s).
	TTL time.Duration

	// Setup, run in the test process, creates a fresh store holding the
	// given marker keys and returns a name for it that Connect, TakeAway and
	// Remaining understand. It removes the store with t.Cleanup.
	Setup func(t testing.TB, keys [][]byte) string

	// Connect, run in a replica process, connects to the store called store
	// through addr (a proxy's address) and returns the replica's KV, a
	// Locker with the given TTL, and a function that closes what it opened.
	// It must be the function the test binary's TestMain passes to
	// ReplicaMain.
	Connect ConnectFunc

	// TakeAway, run in the test process, takes the lease of store away from
	// its holder from outside, without telling the holder: the way an
	// operator, an expiry or a revocation would.
	TakeAway func(t testing.TB, store string)

	// Remaining, run in the test process, counts the markers left in store.
	Remaining func(ctx context.Context, store string) (int, error)

	// Duplicates, when set, run in the test process, counts the entities of
	// store that were cleared more than once, as the store recorded it in
	// the transactions that cleared them. Set it for an engine whose KV is
	// a retention.ClearDeleter under a fencing lease: the proofs then
	// require none, even when the lease is taken away mid-pass.
	Duplicates func(ctx context.Context, store string) (int, error)

	// Runs, when set, says that the replicas' KV is a retention.RunClearer
	// the sweep takes runs from (ClearRun; the replicas sweep with
	// Concurrency 1 and no ValidateID, Limiter nor DryRun): each proof then
	// requires that the replicas cleared markers by runs, and Frozen that
	// the holder froze in one, so that the proofs cannot pass over pages
	// while runs, and their fence, go unchecked.
	Runs bool
}

// ConnectFunc connects a replica process to a store; see Engine.Connect.
type ConnectFunc func(ctx context.Context, addr, store string, ttl time.Duration) (kv retention.KV, locker retention.Locker, close func(), err error)

// Environment variables that turn a re-executed test binary into a replica.
const (
	envReplica  = "LEASETEST_REPLICA_LOG" // the replica's log file
	envAddr     = "LEASETEST_REPLICA_ADDR"
	envStore    = "LEASETEST_REPLICA_STORE"
	envTTL      = "LEASETEST_REPLICA_TTL"
	envInterval = "LEASETEST_REPLICA_INTERVAL"
	envFreeze   = "LEASETEST_REPLICA_FREEZE" // a flag file: the first replica to create it stops itself
	envHold     = "LEASETEST_REPLICA_HOLD"   // a request file: the replica that removes it holds its next deletion
)

// Replica timing: a busy holder deletes a page of 10 markers about every
// 20ms, the load, and the others try for the lease every interval.
const (
	procPrefix   = "proof/"
	procPageSize = 10
	procClear    = 2 * time.Millisecond
	procInterval = 250 * time.Millisecond
	procMarkers  = 20_000
	freezeAfter  = 5                // deletions a replica of Frozen makes before it stops itself in the next
	holdLimit    = 30 * time.Second // the longest a replica holds a deletion for a test that went away
)

// ReplicaMain runs this process as a replica of the process proofs when the
// test binary was re-executed as one, and then exits; otherwise it returns
// at once. Call it first in the TestMain of a package that calls
// RunProcesses, with the same function as Engine.Connect.
func ReplicaMain(connect ConnectFunc) {
	logPath := os.Getenv(envReplica)
	if logPath == "" {
		return
	}
	if err := runReplica(connect, logPath); err != nil {
		fmt.Fprintln(os.Stderr, "leasetest replica:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runReplica(connect ConnectFunc, logPath string) error {
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	interval, err := time.ParseDuration(os.Getenv(envInterval))
	if err != nil {
		return err
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	log := &eventLog{w: f}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	kv, locker, closeStore, err := connect(ctx, os.Getenv(envAddr), os.Getenv(envStore), ttl)
	if err != nil {
		return err
	}
	defer closeStore()
	ll := &loggingLocker{Locker: locker, log: log, freeze: os.Getenv(envFreeze), hold: os.Getenv(envHold)}
	cfg := retention.Config{
		Prefix:    procPrefix,
		Retention: time.Millisecond, // every marker is long expired
		Interval:  interval,
		PageSize:  procPageSize,
		Lease:     ll,
		Clear: func(ctx context.Context, id string) error {
			return sleepCtx(ctx, procClear)
		},
	}
	if _, ok := kv.(retention.ClearDeleter); ok {
		cfg.Clear, cfg.BatchSize = nil, procPageSize // the store clears, a page at a time
	}
	sweep, err := retention.New(logKV(kv, ll, 0), cfg)
	if err != nil {
		return err
	}
	log.add("start")
	err = sweep.Run(ctx)
	log.add("stop")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// eventLog writes one line per event, "<unix ns> <event> <fields>", with
// one write call each, so that what was written survives a SIGKILL.
type eventLog struct {
	mu sync.Mutex
	w  *os.File
}

func (l *eventLog) add(event string, fields ...any) {
	line := strconv.FormatInt(time.Now().UnixNano(), 10) + " " + event
	for _, f := range fields {
		line += " " + strings.ReplaceAll(fmt.Sprint(f), "\n", " ")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.WriteString(line + "\n")
}

// loggingLocker logs acquisitions and losses, numbering the leases it hands
// out; its leases fence through the lease they wrap.
type loggingLocker struct {
	retention.Locker
	log *eventLog
	seq atomic.Int64 // the number of the last lease handed out

	freeze  string // see envFreeze
	deletes atomic.Int64
	hold    string // see envHold
}

func (l *loggingLocker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	l.log.add("acquire-start")
	lease, err := l.Locker.TryAcquire(ctx)
	switch {
	case errors.Is(err, retention.ErrLeaseHeld):
		l.log.add("acquire-held")
		return nil, err
	case err != nil:
		l.log.add("acquire-err", err)
		return nil, err
	}
	n := l.seq.Add(1)
	l.log.add("acquire-ok", n)
	go func() {
		<-lease.Lost()
		l.log.add("lost", n)
	}()
	ll := loggingLease{Lease: lease, n: n, locker: l}
	if f, ok := lease.(retention.Fencer); ok {
		return fencingLoggingLease{loggingLease: ll, f: f}, nil
	}
	return ll, nil
}

type loggingLease struct {
	retention.Lease
	n      int64
	locker *loggingLocker
}

type fencingLoggingLease struct {
	loggingLease
	f retention.Fencer
}

// Fence fences the store inside logKV's wrapper and wraps the view the
// same way, so that the pass's writes are logged under this lease.
func (l fencingLoggingLease) Fence(kv retention.KV) (retention.KV, bool) {
	lkv := loggedKV(kv)
	if lkv == nil {
		return l.f.Fence(kv)
	}
	fenced, ok := l.f.Fence(lkv.KV)
	if !ok {
		return nil, false
	}
	return logKV(fenced, lkv.locker, l.n), true
}

// logKV wraps kv in a loggingKV, keeping it a ClearDeleter if it is one,
// and a RunClearer if the sweep would take runs from it.
func logKV(kv retention.KV, l *loggingLocker, lease int64) retention.KV {
	lkv := &loggingKV{KV: kv, locker: l, lease: lease}
	cd, ok := kv.(retention.ClearDeleter)
	if !ok {
		return lkv
	}
	lcd := &loggingClearDeleter{loggingKV: lkv, cd: cd}
	// A RunClearer whose RunStore is of another type, such as a wrapper
	// that embeds one, is read page by page (see retention.RunClearer):
	// declaring its runs here would prove a sweep that never happens.
	if rc, ok := kv.(retention.RunClearer); ok && reflect.TypeOf(rc.RunStore()) == reflect.TypeOf(kv) {
		return &loggingRunClearer{loggingClearDeleter: lcd, rc: rc}
	}
	return lcd
}

// loggedKV returns the loggingKV of one of logKV's wrappers, or nil.
func loggedKV(kv retention.KV) *loggingKV {
	switch k := kv.(type) {
	case *loggingKV:
		return k
	case *loggingClearDeleter:
		return k.loggingKV
	case *loggingRunClearer:
		return k.loggingKV
	}
	return nil
}

// loggingClearDeleter logs a ClearAndDelete as the Delete of its markers.
type loggingClearDeleter struct {
	*loggingKV
	cd retention.ClearDeleter
}

func (k *loggingClearDeleter) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return k.logged(ctx, opClear, len(keys), func(ctx context.Context) (int, error) {
		return len(keys), k.cd.ClearAndDelete(ctx, ids, keys)
	})
}

// loggingRunClearer logs a ClearRun as the Delete of up to limit markers,
// and declares RunStore so that the sweep takes runs through it. A store
// that cannot clear runs after all (errors.ErrUnsupported, as pgkv's
// AtomicKV of WithClear) logs its one run as a delete-err, before the
// sweep reads pages.
type loggingRunClearer struct {
	*loggingClearDeleter
	rc retention.RunClearer
}

func (k *loggingRunClearer) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) (keys [][]byte, err error) {
	err = k.logged(ctx, opRun, limit, func(ctx context.Context) (int, error) {
		keys, err = k.rc.ClearRun(ctx, prefix, from, end, limit)
		return len(keys), err
	})
	return keys, err
}

func (k *loggingRunClearer) RunStore() retention.RunClearer { return k }

// loggingKV logs every Delete: its start, and its outcome when it returns.
type loggingKV struct {
	retention.KV
	locker *loggingLocker
	lease  int64 // the lease fencing it; 0: unfenced, the last lease taken
}

var deleteSeq atomic.Int64

// The kinds of deletion, the last field of a delete-start line.
const (
	opDelete = "delete" // Delete
	opClear  = "clear"  // ClearAndDelete
	opRun    = "run"    // ClearRun
)

func (k *loggingKV) Delete(ctx context.Context, keys ...[]byte) error {
	return k.logged(ctx, opDelete, len(keys), func(ctx context.Context) (int, error) {
		return len(keys), k.KV.Delete(ctx, keys...)
	})
}

// logged runs del, a deletion of kind of up to n markers that returns how
// many it deleted, between its log lines: "delete-start op lease n kind",
// then "delete-ok op lease deleted" or the error. A run's n is its limit,
// the most it may delete, and only its delete-ok says how many it did: an
// empty run deletes nothing.
func (k *loggingKV) logged(ctx context.Context, kind string, n int, del func(context.Context) (int, error)) error {
	lease := k.lease
	if lease == 0 {
		lease = k.locker.seq.Load()
	}
	op := deleteSeq.Add(1)
	if k.locker.maybeHold(lease) {
		// Held where the pass has looked at its lease for the last time
		// and is about to write: past the hold, only the store can refuse
		// the write, as after maybeFreeze.
		ctx = context.WithoutCancel(ctx)
	}
	k.locker.log.add("delete-start", op, lease, n, kind)
	if k.locker.maybeFreeze(op, kind) {
		// Stopped as if past every client-side look at the lease, the
		// adapter's own ctx check included, with the request about to go
		// out: only the store can refuse it now.
		ctx = context.WithoutCancel(ctx)
	}
	deleted, err := del(ctx)
	switch {
	case err == nil:
		k.locker.log.add("delete-ok", op, lease, deleted)
	case errors.Is(err, retention.ErrLeaseLost):
		k.locker.log.add("delete-refused", op, lease)
	default:
		k.locker.log.add("delete-err", op, lease, err)
	}
	return err
}

// maybeFreeze stops this process with SIGSTOP, once per fleet, after a few
// Deletes, and reports whether it did: between the pass's last look at Lost
// and the store's write, where only a fence can stop a write of a holder
// that has been replaced.
func (l *loggingLocker) maybeFreeze(op int64, kind string) bool {
	if l.freeze == "" || l.deletes.Add(1) <= freezeAfter {
		return false
	}
	f, err := os.OpenFile(l.freeze, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return false // another replica froze, or will
	}
	f.Close()
	l.log.add("freeze", op, kind)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	// The stop lands on all threads a moment later, not necessarily before
	// Kill returns: wait for the test's word that it resumed us, so that the
	// Delete cannot be on the wire while the process is stopped.
	for !exists(l.freeze + ".resumed") {
		time.Sleep(time.Millisecond)
	}
	l.log.add("resume")
	return true
}

// maybeHold, when the test asked for it and no other replica took the
// request, holds a deletion before it starts until the test says go, and
// reports whether it did: the test takes the lease away meanwhile, so that
// the deletion starts after another holder took the lease while the pass
// still believes it holds it. It says it holds with the file hold+".held"
// (after logging "hold lease"), and waits for hold+".go", which it
// removes.
func (l *loggingLocker) maybeHold(lease int64) bool {
	if l.hold == "" || os.Remove(l.hold) != nil {
		return false
	}
	l.log.add("hold", lease)
	if err := os.WriteFile(l.hold+".held", nil, 0o644); err != nil {
		l.log.add("hold-err", err)
		return false
	}
	for deadline := time.Now().Add(holdLimit); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if os.Remove(l.hold+".go") == nil {
			break
		}
	}
	l.log.add("go")
	return true
}

// RunProcesses runs the proofs with replicas as separate processes against
// the engine's real server, each as a subtest. Each replica logs, with
// timestamps, when it tried for the lease and got it, and when each
// deletion started and returned, and how: a Delete, a ClearAndDelete, or
// a run (ClearRun) of a RunClearer, which the replicas sweep by runs as a
// sweep of their configuration does (see Engine.Runs). Any of them is a
// "Delete" below.
//
//   - TakenAwayWhileBusy: two replicas; while the holder deletes a page
//     every ~20ms, its lease is taken away from outside (Engine.TakeAway)
//     and taken at once by a new holder in the test process, which keeps
//     it for a TTL. The holder's next Delete waits meanwhile, past its
//     pass's last look at the lease, and starts once the new holder's
//     TryAcquire returned: no Delete of the old holder that started after
//     that may succeed, and there must be one.
//   - HostCrash: three replicas, each through its own proxy; the holder's
//     proxy turns into a black hole (connections stay open, nothing gets
//     through) and the holder is then SIGKILLed; another replica must take
//     the lease within TTL plus one retry interval (plus slack for loaded
//     machines) and go on deleting.
//   - Frozen: two replicas; the holder stops itself with SIGSTOP inside a
//     Delete, past every client-side look at its lease (as a GC pause or a
//     descheduled thread can stop it just before the request goes out),
//     another takes over after the TTL, and the holder is resumed with
//     SIGCONT: no Delete of the resumed holder's old lease may succeed once
//     the other holds it.
//
// The test binary's TestMain must call ReplicaMain first.
func RunProcesses(t *testing.T, e Engine) {
	t.Run("TakenAwayWhileBusy", func(t *testing.T) { testTakenAway(t, e) })
	t.Run("HostCrash", func(t *testing.T) { testHostCrash(t, e) })
	t.Run("Frozen", func(t *testing.T) { testFrozen(t, e) })
}

// procFleet is a set of replica processes over one store.
type procFleet struct {
	t     testing.TB
	e     Engine
	store string
	dir   string
	procs []*replicaProc
}

type replicaProc struct {
	cmd   *exec.Cmd
	log   string
	proxy *Proxy
	done  chan struct{} // closed when the process has exited
}

func newProcFleet(t testing.TB, e Engine) *procFleet {
	keys := make([][]byte, procMarkers)
	at := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range keys {
		k, err := retention.MarkerKey(procPrefix, at.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("m%05d", i))
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	return &procFleet{t: t, e: e, store: e.Setup(t, keys), dir: t.TempDir()}
}

// start starts a replica process connected through a proxy of its own,
// with extra environment variables.
func (f *procFleet) start(env ...string) {
	t := f.t
	i := len(f.procs)
	p := NewProxy(t, f.e.Addr)
	logPath := filepath.Join(f.dir, fmt.Sprintf("replica-%d.log", i))
	out, err := os.Create(filepath.Join(f.dir, fmt.Sprintf("replica-%d.out", i)))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envReplica+"="+logPath,
		envAddr+"="+p.Addr(),
		envStore+"="+f.store,
		envTTL+"="+f.e.TTL.String(),
		envInterval+"="+procInterval.String(),
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replicaProc{cmd: cmd, log: logPath, proxy: p, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(r.done)
	}()
	t.Cleanup(func() {
		// Whatever state it is in, it goes: SIGCONT in case it was stopped.
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(f.dir, fmt.Sprintf("replica-%d.out", i)))
			if len(b) > 0 {
				t.Logf("replica %d output:\n%s", i, b)
			}
		}
	})
	f.procs = append(f.procs, r)
}

// stop ends a replica with SIGTERM, as a deployment would.
func (f *procFleet) stop(i int) {
	r := f.procs[i]
	_ = r.cmd.Process.Signal(syscall.SIGCONT)
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(15 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

func (f *procFleet) stopAll() {
	for i := range f.procs {
		f.stop(i)
	}
}

// event is one line of a replica's log.
type event struct {
	at     time.Time
	name   string
	fields []string
}

func (e event) int(i int) int64 {
	if i >= len(e.fields) {
		return -1
	}
	n, _ := strconv.ParseInt(e.fields[i], 10, 64)
	return n
}

func (e event) field(i int) string {
	if i >= len(e.fields) {
		return ""
	}
	return e.fields[i]
}

func (f *procFleet) events(i int) []event {
	file, err := os.Open(f.procs[i].log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	defer file.Close()
	var out []event
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		parts := strings.Fields(sc.Text())
		if len(parts) < 2 {
			continue // a line cut short by SIGKILL
		}
		ns, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, event{at: time.Unix(0, ns), name: parts[1], fields: parts[2:]})
	}
	return out
}

// holder waits until a replica holds the lease and has deleted a few
// pages, and returns it with the number of its lease.
func (f *procFleet) holder(limit time.Duration) (int, int64) {
	f.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		for i := range f.procs {
			var lease, oks int64
			for _, e := range f.events(i) {
				switch e.name {
				case "acquire-ok":
					lease, oks = e.int(0), 0
				case "delete-ok":
					if e.int(1) == lease && e.int(2) > 0 {
						oks++
					}
				case "lost":
					if e.int(0) == lease {
						lease = 0
					}
				}
			}
			if lease > 0 && oks >= 3 {
				return i, lease
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.t.Fatalf("no replica held the lease and deleted markers within %v", limit)
	return -1, 0
}

// takeover waits until a lease other than the old holder's is acquired
// after since, by another replica or by the old holder itself once it
// noticed the loss, and returns who took it and when TryAcquire returned.
func (f *procFleet) takeover(old int, oldLease int64, since time.Time, limit time.Duration) (int, time.Time, bool) {
	deadline := time.Now().Add(limit)
	for {
		who, when := -1, time.Time{}
		for i := range f.procs {
			for _, e := range f.events(i) {
				if e.name == "acquire-ok" && e.at.After(since) && (i != old || e.int(0) != oldLease) {
					if who < 0 || e.at.Before(when) {
						who, when = i, e.at
					}
					break
				}
			}
		}
		if who >= 0 {
			return who, when, true
		}
		if time.Now().After(deadline) {
			return -1, time.Time{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// overlap reads the old holder's log: its deletions under the given lease
// that started after the new holder's TryAcquire returned, by outcome, how
// many of them were runs, and when it first learned of the loss. A
// deletion that succeeded counts even if it deleted nothing (an empty
// run): a fenced write must be refused whatever it holds.
type overlap struct {
	succeeded, refused, failed int
	runs                       int
	lost                       time.Time
}

func (f *procFleet) overlap(i int, lease int64, after time.Time) overlap {
	var o overlap
	type start struct {
		at  time.Time
		run bool
	}
	started := map[int64]start{}
	for _, e := range f.events(i) {
		switch {
		case e.name == "lost" && e.int(0) == lease:
			o.lost = e.at
		case e.name == "delete-start" && e.int(1) == lease:
			started[e.int(0)] = start{e.at, e.field(3) == opRun}
		case strings.HasPrefix(e.name, "delete-") && e.int(1) == lease:
			st, ok := started[e.int(0)]
			if !ok || !st.at.After(after) {
				continue
			}
			if st.run {
				o.runs++
			}
			switch e.name {
			case "delete-ok":
				o.succeeded++
			case "delete-refused":
				o.refused++
			default:
				o.failed++
			}
		}
	}
	return o
}

// holdNext asks the replicas to hold their next deletion (see maybeHold)
// and waits until one, the holder, does; it returns that replica and the
// lease the deletion is made under. The hold ends with resume.
func (f *procFleet) holdNext(hold string, limit time.Duration) (int, int64) {
	f.t.Helper()
	deadline := time.Now().Add(limit)
	waitFor := func(path string, want bool, failure string) {
		for exists(path) != want {
			if time.Now().After(deadline) {
				f.t.Fatalf("%s within %v", failure, limit)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// The last hold's go must be taken before a new request, which would
	// otherwise find it and not hold.
	waitFor(hold+".go", false, "no replica took the word to end its hold")
	if err := os.Remove(hold + ".held"); err != nil && !errors.Is(err, os.ErrNotExist) {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		f.t.Fatal(err)
	}
	waitFor(hold+".held", true, "no replica held a deletion")
	who, lease, at := -1, int64(0), time.Time{}
	for i := range f.procs {
		for _, e := range f.events(i) {
			if e.name == "hold" && e.at.After(at) {
				who, lease, at = i, e.int(0), e.at
			}
		}
	}
	if who < 0 {
		f.t.Fatal("a replica held a deletion but logged no hold")
	}
	return who, lease
}

// resume ends the hold of holdNext.
func (f *procFleet) resume(hold string) {
	if err := os.WriteFile(hold+".go", nil, 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// deletedAfter counts replica i's deletions that started after t and
// deleted markers: a run that found none is no progress.
func (f *procFleet) deletedAfter(i int, t time.Time) int {
	started := map[int64]time.Time{}
	n := 0
	for _, e := range f.events(i) {
		switch e.name {
		case "delete-start":
			started[e.int(0)] = e.at
		case "delete-ok":
			if at, ok := started[e.int(0)]; ok && at.After(t) && e.int(2) > 0 {
				n++
			}
		}
	}
	return n
}

// waitDeletes waits until the replicas other than old have made n
// successful Deletes, together, that started after t.
func (f *procFleet) waitDeletes(old int, t time.Time, n int, limit time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		got := 0
		for i := range f.procs {
			if i != old {
				got += f.deletedAfter(i, t)
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the replicas but %d made %d successful Deletes in %v, want %d", old, got, limit, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *procFleet) remaining() int {
	n, err := f.e.Remaining(context.Background(), f.store)
	if err != nil {
		f.t.Fatalf("Remaining = %v", err)
	}
	return n
}

// startLimit bounds how long a replica takes to start, connect and take a
// free lease on a loaded machine.
const startLimit = 30 * time.Second

func testTakenAway(t *testing.T, e Engine) {
	f := newProcFleet(t, e)
	hold := filepath.Join(f.dir, "hold")
	f.start(envHold + "=" + hold)
	f.start(envHold + "=" + hold)
	// The new holder is a thief in this process, so that it can take the
	// lease the moment it is free, before the old holder could notice and
	// take it back.
	ctx := context.Background()
	_, thief, closeThief, err := e.Connect(ctx, e.Addr, f.store, e.TTL)
	if err != nil {
		t.Fatal(err)
	}
	defer closeThief()
	var (
		old      int
		lease    int64
		takenAt  time.Time
		acquired time.Time
		stolen   retention.Lease
	)
	for attempt := 1; ; attempt++ {
		f.holder(startLimit)
		// The holder's next deletion waits while the lease is taken away
		// and taken, and then starts while its pass still believes it
		// holds the lease: only the fence can refuse it. Left to run, the
		// holder mostly learns of the loss from a write refused before the
		// thief's TryAcquire returns, and the proof checks nothing.
		old, lease = f.holdNext(hold, startLimit)
		takenAt = time.Now()
		e.TakeAway(t, f.store)
		stolen, err = thief.TryAcquire(ctx)
		acquired = time.Now()
		f.resume(hold)
		if err == nil {
			break
		}
		if !errors.Is(err, retention.ErrLeaseHeld) || attempt == 5 {
			t.Fatalf("the thief's TryAcquire right after taking the lease away = %v (attempt %d)", err, attempt)
		}
		// The other replica took the lease first; try again.
	}
	released := false
	defer func() {
		if !released {
			_ = stolen.Release(ctx)
		}
	}()
	// Hold it past the old holder's next renewal: with or without a fence,
	// it finds out by then.
	time.Sleep(e.TTL)
	released = true
	if err := stolen.Release(ctx); err != nil {
		t.Errorf("the thief's Release = %v", err)
	}
	time.Sleep(2 * procInterval)
	f.stopAll()

	o := f.overlap(old, lease, acquired)
	t.Logf("lease taken away from replica %d and acquired by another holder %v later; the old holder noticed %v after that",
		old, acquired.Sub(takenAt).Round(time.Millisecond), since(o.lost, acquired))
	checked := o.succeeded + o.refused + o.failed
	t.Logf("old holder's Deletes started after the new holder acquired the lease: %d checked, %d succeeded, %d refused by the fence, %d failed otherwise (%d of them runs)",
		checked, o.succeeded, o.refused, o.failed, o.runs)
	if checked == 0 {
		t.Errorf("no Delete of the old holder started after the new holder acquired the lease, want the one it held: the proof checked nothing")
	}
	if o.succeeded != 0 {
		t.Errorf("%d Deletes of the old holder that started after the new holder acquired the lease succeeded, want 0", o.succeeded)
	}
	if left := f.remaining(); left >= procMarkers {
		t.Errorf("%d markers left of %d: nobody deleted anything", left, procMarkers)
	}
	f.checkRuns()
	f.checkDuplicates()
}

// checkRuns logs the runs the replicas took and, when the engine says they
// take runs (Engine.Runs), requires some that cleared markers.
func (f *procFleet) checkRuns() {
	var started, cleared, markers int
	for i := range f.procs {
		runs := map[int64]bool{} // op numbers are the replica's own
		for _, e := range f.events(i) {
			switch {
			case e.name == "delete-start" && e.field(3) == opRun:
				started++
				runs[e.int(0)] = true
			case e.name == "delete-ok" && runs[e.int(0)] && e.int(2) > 0:
				cleared++
				markers += int(e.int(2))
			}
		}
	}
	if started == 0 && !f.e.Runs {
		return
	}
	f.t.Logf("runs (ClearRun) the replicas started: %d; %d of them cleared %d markers", started, cleared, markers)
	if f.e.Runs && cleared == 0 {
		f.t.Errorf("the replicas cleared no marker by a run (ClearRun), want some: Engine.Runs says their sweeps take runs, yet they read pages")
	}
}

// checkDuplicates requires, when the engine can count them, that no entity
// was cleared twice.
func (f *procFleet) checkDuplicates() {
	if f.e.Duplicates == nil {
		return
	}
	n, err := f.e.Duplicates(context.Background(), f.store)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Logf("entities cleared more than once, as the store recorded them: %d", n)
	if n != 0 {
		f.t.Errorf("%d entities were cleared more than once, want 0", n)
	}
}

func testHostCrash(t *testing.T, e Engine) {
	f := newProcFleet(t, e)
	for range 3 {
		f.start()
	}
	old, lease := f.holder(startLimit)
	// The host vanishes: nothing gets through any more and no connection
	// closes, as far as the server can tell; the process dies behind it.
	crashedAt := time.Now()
	f.procs[old].proxy.Blackhole()
	_ = f.procs[old].cmd.Process.Kill()
	bound := e.TTL + procInterval + 5*time.Second // slack for loaded machines
	next, acquired, ok := f.takeover(old, lease, crashedAt, bound)
	if !ok {
		t.Fatalf("no replica took over within %v of the holder's host crash (TTL %v)", bound, e.TTL)
	}
	took := acquired.Sub(crashedAt)
	// The fleet goes on deleting: the replica that took over, or one that
	// took the lease from it in turn (on a loaded machine a new holder
	// may miss its first renewal, and rightly lose the lease).
	f.waitDeletes(old, acquired, 5, 10*time.Second)
	f.stopAll()
	t.Logf("holder's host crashed (replica %d); replica %d took over %v later (TTL %v, retry interval %v)",
		old, next, took.Round(time.Millisecond), e.TTL, procInterval)
	f.checkRuns()
	f.checkDuplicates()
}

func testFrozen(t *testing.T, e Engine) {
	f := newProcFleet(t, e)
	flag := filepath.Join(f.dir, "frozen")
	f.start(envFreeze + "=" + flag)
	f.start(envFreeze + "=" + flag)
	var (
		old      = -1
		lease    int64
		frozenAt time.Time
		frozenIn string // the kind of deletion it froze in
	)
	deadline := time.Now().Add(startLimit)
	for old < 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no replica froze within %v", startLimit)
		}
		time.Sleep(10 * time.Millisecond)
		for i := range f.procs {
			for _, ev := range f.events(i) {
				switch ev.name {
				case "delete-start":
					lease = ev.int(1)
				case "freeze":
					old, frozenAt, frozenIn = i, ev.at, ev.field(1)
				}
			}
			if old >= 0 {
				break
			}
		}
	}
	bound := e.TTL + procInterval + 5*time.Second
	next, acquired, ok := f.takeover(old, lease, frozenAt, bound)
	if !ok {
		t.Fatalf("no replica took over within %v of the holder freezing (TTL %v)", bound, e.TTL)
	}
	f.waitDeletes(old, acquired, 5, 10*time.Second)
	resumedAt := time.Now()
	if err := os.WriteFile(flag+".resumed", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.procs[old].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(e.TTL)
	f.stopAll()

	// The Delete the holder froze in started before the takeover and runs
	// after it: count by when Deletes returned. None of the old lease's was
	// on the wire while the holder was frozen, so any that returned after
	// the takeover also reached the store after it.
	var succeeded, refused, failed int
	var failures []string
	for _, ev := range f.events(old) {
		if !strings.HasPrefix(ev.name, "delete-") || ev.name == "delete-start" || ev.int(1) != lease || !ev.at.After(acquired) {
			continue
		}
		switch ev.name {
		case "delete-ok":
			succeeded++
		case "delete-refused":
			refused++
		default:
			failed++
			failures = append(failures, strings.Join(ev.fields[2:], " "))
		}
	}
	o := f.overlap(old, lease, acquired)
	t.Logf("holder (replica %d) froze in a deletion (%s) for %v; replica %d took over %v after the freeze; the resumed holder noticed %v after resuming",
		old, frozenIn, resumedAt.Sub(frozenAt).Round(time.Millisecond), next, acquired.Sub(frozenAt).Round(time.Millisecond), since(o.lost, resumedAt))
	t.Logf("resumed holder's Deletes that returned after the takeover: %d succeeded, %d refused by the fence, %d failed otherwise %q",
		succeeded, refused, failed, failures)
	if e.Runs && frozenIn != opRun {
		t.Errorf("the holder froze in a %q, want a run: Engine.Runs says the replicas' sweeps take runs", frozenIn)
	}
	f.checkRuns()
	f.checkDuplicates()
	if succeeded != 0 {
		t.Errorf("%d Deletes of the resumed holder succeeded after another replica acquired the lease, want 0", succeeded)
		f.dump(old, frozenAt.Add(-time.Second))
		f.dump(next, frozenAt.Add(-time.Second))
	}
}

// dump logs replica i's events from t on, for a failure's post-mortem.
func (f *procFleet) dump(i int, from time.Time) {
	var b strings.Builder
	for _, ev := range f.events(i) {
		if ev.at.Before(from) {
			continue
		}
		fmt.Fprintf(&b, "%s %s %s\n", ev.at.Format("15:04:05.000000"), ev.name, strings.Join(ev.fields, " "))
	}
	f.t.Logf("replica %d's log from %s:\n%s", i, from.Format("15:04:05.000000"), b.String())
}

func since(t, ref time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(ref).Round(time.Millisecond).String()
}
