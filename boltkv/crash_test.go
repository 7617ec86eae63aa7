package boltkv_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
)

// The crash test kills a process that sweeps a bbolt file with SIGKILL, again
// and again, and checks after every kill that no marker went without its
// Clear. The child process is this test binary run again with crashEnvDir
// set.
const (
	crashEnvDir   = "RETENTION_CRASH_DIR"   // the child's working directory: the db and the clear log
	crashEnvStart = "RETENTION_CRASH_START" // the parent's start, Unix nanoseconds: the child's clocks agree on it
	crashEnvSeed  = "RETENTION_CRASH_SEED"  // the child's fault seed
	crashEnvConc  = "RETENTION_CRASH_CONC"  // the child's Concurrency

	crashPrefix    = "runs/done/"
	crashRetention = time.Hour
	crashExpired   = 5000
	crashUnexpired = 1000
	crashKills     = 24
)

var (
	crashMarkers  = []byte("markers")
	crashEntities = []byte("entities")
	// crashBase is "now" when the test starts; the unexpired entities
	// finished then, so they fall due an hour later, long after the test.
	crashBase = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
)

// crashOpts opens the test's databases. NoSync is deliberate: the test
// kills processes, it does not cut power. Once a write(2) returns, the data
// is in the OS page cache, which a SIGKILL does not touch, so every commit
// bbolt finished (its meta page written after the pages it points to)
// survives the kill with or without fsync. fsync would only slow the child
// by orders of magnitude on some disks without changing what is proved: the
// order in which the sweep clears and deletes. The clear log is not
// fsynced for the same reason.
var crashOpts = &bbolt.Options{NoSync: true, Timeout: 10 * time.Second}

func crashID(expired bool, i int) string {
	if expired {
		return fmt.Sprintf("x%04d", i)
	}
	return fmt.Sprintf("u%04d", i)
}

// crashClock reads crashBase plus the real time since the parent started,
// the same in every child, so a marker rescheduled by one child falls due
// for the next one at the same moment. A frozen clock would leave every
// rescheduled marker to the final pass, and no kill would hit its retry.
type crashClock struct{ start time.Time }

func (c crashClock) Now() time.Time { return crashBase.Add(time.Since(c.start)) }

// TestCrashSIGKILL: a child process runs a Sweep over 5,000 expired and
// 1,000 unexpired markers of a bbolt file, its Clear logging each id to a
// clear log before deleting the entity's state, and is killed with SIGKILL
// at random moments, then started again on the same file, crashKills times.
// Children alternate Concurrency 1 and 4, and about one Clear in 12 fails
// (error, panic or runtime.Goexit), so kills also land in the rescheduling
// of failed markers. After every kill: bbolt opens and checks clean, no id
// has two markers (the KV is a retention.Mover, which reschedules in one
// transaction), every id whose markers are all gone has a Clear that
// returned nil in the log, every entity whose state is gone was logged
// before, and no unexpired entity was touched. Finally one pass in this
// process clears the rest.
func TestCrashSIGKILL(t *testing.T) {
	if dir := os.Getenv(crashEnvDir); dir != "" {
		crashChild(t, dir)
		return
	}
	if testing.Short() {
		t.Skip("crash test: starts and kills dozens of processes")
	}
	start := time.Now()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	dir := t.TempDir()
	dbPath, logPath := filepath.Join(dir, "crash.db"), filepath.Join(dir, "clear.log")
	crashSetup(t, dbPath)

	// The kills cover about three quarters of the backlog on average, so
	// that most runs end with a kill mid-backlog and leave work to the
	// final pass, and some run the backlog dry and kill idle children.
	var kills, early, idle, finished, left int
	for kills < crashKills {
		n := kills + 1
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashSIGKILL$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			crashEnvDir+"="+dir,
			crashEnvStart+"="+strconv.FormatInt(start.UnixNano(), 10),
			crashEnvSeed+"="+strconv.FormatUint(rng.Uint64(), 10),
			crashEnvConc+"="+strconv.Itoa([]int{1, 4}[n%2]),
		)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		before := fileSize(t, logPath)
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()

		// Kill at a random moment: a fifth of the time within 30ms of the
		// start (before or while the child opens the db and makes its first
		// pass), otherwise once the clear log has grown by a random amount
		// (a random point of the backlog) plus a random few hundred µs.
		var growth int64
		if rng.IntN(5) == 0 {
			early++
			growth = -1
			time.Sleep(time.Duration(rng.Int64N(int64(30 * time.Millisecond))))
		} else {
			growth = rng.Int64N(8 << 10) // the whole backlog logs about 110 KiB
		}
		lastGrowth, lastSize := time.Now(), before
	wait:
		for growth >= 0 {
			select {
			case err := <-exited:
				require.Failf(t, "child exited by itself", "child %d: %v\n%s", n, err, out.String())
			case <-time.After(200 * time.Microsecond):
			}
			size := fileSize(t, logPath)
			switch {
			case size-before >= growth:
				time.Sleep(time.Duration(rng.Int64N(int64(500 * time.Microsecond))))
				break wait
			case size != lastSize:
				lastGrowth, lastSize = time.Now(), size
			case time.Since(lastGrowth) > 300*time.Millisecond:
				idle++ // the log stands still: nothing left to clear, or a slow start
				break wait
			}
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		err := <-exited
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "child %d:\n%s", n, out.String())
		require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "child %d:\n%s", n, out.String())
		kills++

		left = crashCheck(t, dbPath, logPath, fmt.Sprintf("after kill %d", kills))
		if t.Failed() {
			t.Logf("child %d output:\n%s", n, out.String())
			return
		}
		if left == 0 && finished == 0 {
			finished = kills
		}
	}
	calls, oks := crashReadLog(t, logPath)
	t.Logf("%d kills in %v (%d early, %d idle); backlog done after kill %d (0: not done), %d expired left; %d Clear calls logged, %d returned nil",
		kills, time.Since(start).Round(time.Millisecond), early, idle, finished, left, calls.total, oks.total)

	// One pass to completion in this process, at a time when every retry
	// is due and no unexpired entity is.
	db, err := bbolt.Open(dbPath, 0o600, crashOpts)
	require.NoError(t, err)
	kv, err := boltkv.New(db, string(crashMarkers))
	require.NoError(t, err)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    crashPrefix,
		Retention: crashRetention,
		Clock:     retention.NewManualClock(crashBase.Add(10 * time.Minute)),
		Clear:     crashClear(db, logf, nil),
		Logger:    slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	st, err := sweep.Pass(t.Context())
	require.NoError(t, err)
	t.Logf("final pass: %+v", st)
	assert.Zero(t, st.Failed)
	assert.GreaterOrEqual(t, st.Cleared, left, "cleared by the final pass")
	assert.Zero(t, st.Malformed)
	require.NoError(t, db.Close())
	require.NoError(t, logf.Close())

	assert.Zero(t, crashCheck(t, dbPath, logPath, "after the final pass"), "expired markers left")
	db, err = bbolt.Open(dbPath, 0o600, crashOpts)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		markers, entities := tx.Bucket(crashMarkers), tx.Bucket(crashEntities)
		assert.Equal(t, crashUnexpired, markers.Stats().KeyN, "markers left: the unexpired ones")
		assert.Equal(t, crashUnexpired, entities.Stats().KeyN, "entities left: the unexpired ones")
		return nil
	}))
	calls, oks = crashReadLog(t, logPath)
	for i := range crashExpired {
		assert.NotZero(t, oks.of[crashID(true, i)], "expired %s never cleared", crashID(true, i))
	}
	dups := 0
	for _, n := range oks.of {
		if n > 1 {
			dups++
		}
	}
	t.Logf("end: %d Clear calls logged, %d returned nil, %d ids cleared more than once", calls.total, oks.total, dups)
}

// crashSetup writes the entities and their markers, each marker in the
// transaction that records its entity, as a service would.
func crashSetup(t *testing.T, path string) {
	db, err := bbolt.Open(path, 0o600, crashOpts)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	kv, err := boltkv.New(db, string(crashMarkers))
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		entities, err := tx.CreateBucketIfNotExists(crashEntities)
		if err != nil {
			return err
		}
		for _, expired := range []bool{true, false} {
			n, finish := crashUnexpired, crashBase
			if expired {
				n = crashExpired
			}
			for i := range n {
				if expired {
					finish = crashBase.Add(-3*time.Hour + time.Duration(i)*100*time.Millisecond)
				}
				id := crashID(expired, i)
				if err := entities.Put([]byte(id), []byte("state")); err != nil {
					return err
				}
				if err := kv.MarkTx(tx, crashPrefix, id, finish); err != nil {
					return err
				}
			}
		}
		return nil
	}))
}

// crashClear returns the Clear of the test: it logs the call, deletes the
// entity's state, and logs the success just before it returns nil. Each
// log line goes out in one write(2) on an O_APPEND file, so a kill leaves
// at most the last line cut short. faults, when not nil, draws an outcome
// for each call after it is logged.
func crashClear(db *bbolt.DB, logf *os.File, faults func() string) func(context.Context, string) error {
	return func(_ context.Context, id string) error {
		if _, err := logf.WriteString(id + " call\n"); err != nil {
			return err
		}
		if faults != nil {
			switch f := faults(); f {
			case "error":
				return errors.New("injected clear error")
			case "panic":
				panic("injected clear panic")
			case "goexit":
				runtime.Goexit()
			}
		}
		err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(crashEntities).Delete([]byte(id)) })
		if err != nil {
			return err
		}
		if _, err := logf.WriteString(id + " ok\n"); err != nil {
			return err
		}
		return nil
	}
}

// crashChild sweeps until it is killed.
func crashChild(t *testing.T, dir string) {
	startNs, err := strconv.ParseInt(os.Getenv(crashEnvStart), 10, 64)
	require.NoError(t, err)
	seed, err := strconv.ParseUint(os.Getenv(crashEnvSeed), 10, 64)
	require.NoError(t, err)
	conc, err := strconv.Atoi(os.Getenv(crashEnvConc))
	require.NoError(t, err)

	db, err := bbolt.Open(filepath.Join(dir, "crash.db"), 0o600, crashOpts)
	require.NoError(t, err)
	kv, err := boltkv.New(db, string(crashMarkers))
	require.NoError(t, err)
	logf, err := os.OpenFile(filepath.Join(dir, "clear.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	require.NoError(t, err)

	// Some clears fail (error, panic, Goexit), so that kills also hit
	// failed markers and their rescheduling.
	rng := rand.New(rand.NewPCG(seed, seed))
	var mu sync.Mutex
	fault := func() string {
		mu.Lock()
		defer mu.Unlock()
		switch x := rng.IntN(100); {
		case x < 5:
			return "error"
		case x < 7:
			return "panic"
		case x < 8:
			return "goexit"
		}
		return "ok"
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:        crashPrefix,
		Retention:     crashRetention,
		Clock:         crashClock{start: time.Unix(0, startNs)},
		Clear:         crashClear(db, logf, fault),
		PageSize:      8,
		Concurrency:   conc,
		Interval:      20 * time.Millisecond,
		Logger:        slog.New(slog.DiscardHandler),
		RetryDelay:    5 * time.Millisecond,
		MaxRetryDelay: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	err = sweep.Run(context.Background())
	t.Fatalf("Run returned %v; the child should run until it is killed", err)
}

// crashLog counts log lines per id.
type crashLog struct {
	of    map[string]int
	total int
}

// crashReadLog reads the clear log: the ids whose Clear was called, and
// those whose Clear returned nil. A last line without its newline was cut
// short by a kill and is ignored.
func crashReadLog(t *testing.T, path string) (calls, oks crashLog) {
	t.Helper()
	calls.of, oks.of = map[string]int{}, map[string]int{}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return calls, oks
	}
	require.NoError(t, err)
	r := bufio.NewReader(bytes.NewReader(data))
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		id, what, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		switch {
		case ok && what == "call":
			calls.of[id]++
			calls.total++
		case ok && what == "ok":
			oks.of[id]++
			oks.total++
		default:
			require.Failf(t, "bad clear log line", "%q", line)
		}
	}
	return calls, oks
}

// crashCheck checks the db and the clear log against each other and returns
// how many expired entities still have a marker.
func crashCheck(t *testing.T, dbPath, logPath, when string) (left int) {
	t.Helper()
	calls, oks := crashReadLog(t, logPath)
	db, err := bbolt.Open(dbPath, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	require.NoError(t, err, "%s: open", when)
	defer func() { require.NoError(t, db.Close()) }()
	err = db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			assert.NoError(t, err, "%s: bbolt check", when)
		}
		markers := map[string]int{}
		b := tx.Bucket(crashMarkers)
		require.NotNil(t, b, "%s: markers bucket", when)
		require.NoError(t, b.ForEach(func(k, _ []byte) error {
			_, id, err := retention.ParseMarkerKey(crashPrefix, k)
			if assert.NoError(t, err, "%s: marker key", when) {
				markers[string(id)]++
			}
			return nil
		}))
		entities := tx.Bucket(crashEntities)
		require.NotNil(t, entities, "%s: entities bucket", when)
		for _, expired := range []bool{true, false} {
			n := crashUnexpired
			if expired {
				n = crashExpired
			}
			for i := range n {
				id := crashID(expired, i)
				state := entities.Get([]byte(id)) != nil
				if !expired {
					assert.True(t, markers[id] == 1 && state && calls.of[id] == 0,
						"%s: unexpired %s touched: %d markers, state present %v, %d Clear calls", when, id, markers[id], state, calls.of[id])
					continue
				}
				if markers[id] > 0 {
					left++
				} else {
					assert.NotZero(t, oks.of[id], "%s: markers of %s gone, but no Clear of it returned nil (%d calls logged)", when, id, calls.of[id])
				}
				if !state {
					assert.NotZero(t, calls.of[id], "%s: state of %s gone, but no Clear of it logged", when, id)
				} else {
					assert.Zero(t, oks.of[id], "%s: a Clear of %s returned nil, but its state is there", when, id)
				}
			}
		}
		// A sweep over a Mover reschedules a failed marker in one
		// transaction: no kill can leave it at its old key and its new.
		_, isMover := any((*boltkv.KV)(nil)).(retention.Mover)
		for id, n := range markers {
			if !strings.HasPrefix(id, "x") && !strings.HasPrefix(id, "u") {
				assert.Failf(t, "unknown marker", "%s: marker of unknown id %q", when, id)
			}
			if isMover && n > 1 {
				assert.Failf(t, "two markers of one id", "%s: %s has %d markers at once", when, id, n)
			}
		}
		return nil
	})
	require.NoError(t, err)
	return left
}

func fileSize(t *testing.T, path string) int64 {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	require.NoError(t, err)
	return fi.Size()
}
