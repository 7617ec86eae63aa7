package sqlkv_test

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/sqlkv"
)

// The crash tests kill a process that sweeps through an AtomicKV or an
// AtomicTableKV with SIGKILL, again and again, and check the database
// after every kill. The child process is this test binary run again with
// crashEnvStore set.
const (
	crashEnvStore = "RETENTION_CRASH_STORE" // see crashStore
	crashEnvSeed  = "RETENTION_CRASH_SEED"
	crashEnvConc  = "RETENTION_CRASH_CONCURRENCY"
	crashEnvClear = "RETENTION_CRASH_CLEAR" // see crashChildren.clears

	crashPrefix = "crash/"
	// 24 kills cleared 2,300 ids of 20,000, whatever the backlog beyond
	// them: 8,000 keep the child busy up to the last kill, and take a
	// fifth of the time to write and to check after every kill.
	crashExpired   = 8000
	crashUnexpired = 800
	crashPoison    = 120 // expired ids whose delete fails half the time
	crashKills     = 24
	crashTimeout   = 20 * time.Millisecond // the child's ClearTimeout, with Concurrency 2
	// With Concurrency 1, the ClearTimeout and the batches of the runs: a
	// run that fails stops the runs until its ids are cleared, and a run
	// of 10 under the race detector on a loaded machine outlasted 100ms.
	crashRunTimeout = 300 * time.Millisecond
	crashRunBatch   = 10
	// The page the sweep reads itself after a run failed, before it tries
	// a run again: with 1,000, one timeout under a loaded machine's race
	// detector left a child no run to clear.
	crashRunPage = 50
)

// TestCrashAtomicSQLite: a child process sweeps 8,000 expired and 800
// unexpired jobs of a SQLite file through an AtomicKV whose ClearFunc
// deletes the jobs and records every cleared id with a token of its
// transaction in a cleared table. A trigger fails the delete of poison
// jobs half the time, so batches fail, bisect and reschedule their
// markers; some batches sleep about as long as the ClearTimeout before
// they return, so timeouts fire while the batch may still commit. The
// child is killed with SIGKILL at random moments of its sweep, right
// after a reschedule, a cleared batch or a timed-out batch, crashKills
// times. Every other child sweeps with Concurrency 1, in runs
// (AtomicKV.ClearRun) while no id in the range waits, the others with 2,
// in batches of the pages they read. After every kill the file must show:
// every job present has exactly one marker and every marker a job, no id
// cleared by two committed transactions, and no unexpired job touched. A
// final clean sweep, in runs, must leave no expired job.
func TestCrashAtomicSQLite(t *testing.T) {
	if st, ok := crashStoreFromEnv(t); ok {
		crashChild(t, st, crashSweep)
		return
	}
	if testing.Short() {
		t.Skip("crash test: starts and kills dozens of processes")
	}
	t.Parallel()
	file := filepath.Join(t.TempDir(), "crash.db")
	admin := openSQLite(t, file)
	ctx := context.Background()
	require.NoError(t, sqlkv.Migrate(ctx, admin, sqlkv.SQLite, "markers"))
	_, err := admin.ExecContext(ctx, `CREATE TABLE jobs (id TEXT PRIMARY KEY, expired INTEGER NOT NULL, poison INTEGER NOT NULL);
CREATE TABLE cleared (id TEXT NOT NULL, tx TEXT NOT NULL);
CREATE TRIGGER poison BEFORE DELETE ON jobs WHEN OLD.poison AND abs(random()) % 2 = 0
BEGIN SELECT RAISE(ABORT, 'job is poisoned'); END`)
	require.NoError(t, err)

	seed := mrand.Uint64()
	t.Logf("seed %d", seed)
	rng := mrand.New(mrand.NewPCG(seed, seed))
	now := time.Now()
	poison := map[int]bool{}
	for _, i := range rng.Perm(crashExpired)[:crashPoison] {
		poison[i] = true
	}
	tx, err := admin.BeginTx(ctx, nil)
	require.NoError(t, err)
	kv, err := sqlkv.New(admin, sqlkv.SQLite, "markers")
	require.NoError(t, err)
	for i := range crashExpired + crashUnexpired {
		exp := i < crashExpired
		id, at := fmt.Sprintf("x%05d", i), now.Add(-2*time.Hour+time.Duration(i)*time.Millisecond)
		if !exp {
			id, at = fmt.Sprintf("u%05d", i), now.Add(time.Duration(i)*time.Millisecond)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO jobs VALUES (?, ?, ?)", id, exp, poison[i])
		require.NoError(t, err)
		require.NoError(t, kv.MarkTx(ctx, tx, crashPrefix, id, at))
	}
	require.NoError(t, tx.Commit())

	worst, said := crashChildren{test: "TestCrashAtomicSQLite", store: crashStore{dl: dialects[0], name: file}, kills: crashKills,
		check: func([]string) crashState { return crashCheck(t, admin) }}.run(t, rng)
	runs := said["run"]

	// A clean sweep: no poison, no sleep, every retry due.
	_, err = admin.ExecContext(ctx, "DROP TRIGGER poison")
	require.NoError(t, err)
	s := crashSweep(t, admin, retention.NewManualClock(now.Add(10*time.Minute)), 1, nil, nil)
	for range 10 {
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		if st.Cleared == 0 && st.Failed == 0 {
			break
		}
	}
	final := crashCheck(t, admin)
	t.Logf("after the final sweep: %s", final)
	worst = worst.max(final)
	assert.Zero(t, final.expiredLeft, "expired jobs left after the final sweep")
	assert.Equal(t, crashExpired, final.clearedIDs, "every expired id was cleared")
	assert.Zero(t, worst.lost, "a job without a marker: it is never cleared")
	assert.Zero(t, worst.orphans, "a marker without its job: cleared again")
	assert.Zero(t, worst.dupMarkers, "an id with two markers")
	assert.Zero(t, worst.doubleCleared, "an id cleared by two committed transactions")
	assert.Zero(t, worst.unexpiredTouched, "an unexpired job touched")
	assert.Positive(t, runs, "no child cleared a run")
}

// crashStore is the store a child sweeps: a SQLite file, or tables of a
// server whose address the child inherits (RETENTION_POSTGRES_DSN,
// RETENTION_MYSQL_DSN). crashEnvStore holds the dialect's name, a colon
// and name.
type crashStore struct {
	dl dialect
	// name is the SQLite file, or what the server's tables are named
	// after.
	name string
}

func (s crashStore) env() string { return crashEnvStore + "=" + s.dl.name + ":" + s.name }

// crashStoreFromEnv returns the store of crashEnvStore: ok is false in
// the parent, where it is not set.
func crashStoreFromEnv(t testing.TB) (st crashStore, ok bool) {
	v := os.Getenv(crashEnvStore)
	if v == "" {
		return crashStore{}, false
	}
	name, rest, _ := strings.Cut(v, ":")
	for _, dl := range dialects {
		if dl.name == name {
			return crashStore{dl: dl, name: rest}, true
		}
	}
	t.Fatalf("%s=%q: no such dialect", crashEnvStore, v)
	return crashStore{}, false
}

// crashChildren is how a crash test starts its children and kills them.
type crashChildren struct {
	test  string // the test function the child runs
	store crashStore
	kills int
	// clears are the ways a child of Concurrency 1 may clear, told in
	// crashEnvClear (not set when there are none, and for Concurrency
	// 2). Each such child takes the way whose children cleared the
	// fewest runs so far, so that every way is covered however the kills
	// fall. A way whose children cleared no run in c.kills kills (on a
	// busy machine, kills that came before any run) gets up to c.kills/2
	// more children of its own, each killed right after its first run.
	clears []string
	// check reads the store after a kill. sessions are the ids of the
	// server sessions the child opened (none on SQLite): the server may
	// still run a statement the killed child sent, and land its COMMIT,
	// until it sees the socket close, so a check on a server waits for
	// them to end (waitSessionsGone) before it reads, and the next child
	// starts only then.
	check func(sessions []string) crashState
}

// runsOfWay returns how many runs of its own way of clearing a child
// said it cleared: a child that counts may still clear a run of keys (one
// its store could not count), which proves nothing of counted runs.
func runsOfWay(way string, seen map[string]int) int {
	switch way {
	case "counted":
		return seen["counted"] - seen["timed"]
	case "timed":
		return seen["timed"]
	}
	return seen["run"] - seen["counted"]
}

// run starts the test binary again as a child that runs c.test, and kills
// it with SIGKILL at a random moment of its sweep, or right after a
// reschedule, a cleared batch or a timed-out batch, c.kills times, every
// other child with Concurrency 1. After every kill it checks the store;
// it returns the worst state seen and how many times the children said
// each word.
func (c crashChildren) run(t *testing.T, rng *mrand.Rand) (worst crashState, said map[string]int) {
	start := time.Now()
	said = map[string]int{}
	modes := map[string]int{}
	runs, given := map[string]int{}, map[string]int{} // of each way of clearing: the runs its children cleared, its children
	// without returns a way whose children cleared no run yet, if any.
	without := func() (string, bool) {
		for _, way := range c.clears {
			if runs[way] == 0 {
				return way, true
			}
		}
		return "", false
	}
	for kill := 1; ; kill++ {
		// Where to kill: at a random moment, after the k-th batch cleared,
		// right after the k-th reschedule, or right after the k-th batch
		// whose timeout fired.
		mode := []string{"time", "cleared", "resched", "timeout"}[rng.IntN(4)]
		k := 1 + rng.IntN(5)
		delay := time.Duration(rng.Int64N(int64(400 * time.Millisecond)))
		conc := 1 + kill%2
		short, extra := without()
		if kill > c.kills {
			if !extra || kill > c.kills+c.kills/2 {
				break
			}
			// Killed right after the word that shows a run of its way.
			mode, k, conc = map[string]string{"counted": "counted", "timed": "timed"}[short], 1, 1
			if mode == "" {
				mode = "run"
			}
		}
		modes[mode]++

		cmd := exec.Command(os.Args[0], "-test.run=^"+c.test+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), c.store.env(), crashEnvSeed+"="+strconv.FormatUint(rng.Uint64(), 10),
			crashEnvConc+"="+strconv.Itoa(conc))
		way := ""
		if conc == 1 && len(c.clears) > 0 {
			way = slices.MinFunc(c.clears, func(a, b string) int {
				return cmp.Or(cmp.Compare(runs[a], runs[b]), cmp.Compare(given[a], given[b]))
			})
			if kill > c.kills {
				way = short
			}
			given[way]++
			cmd.Env = append(cmd.Env, crashEnvClear+"="+way)
		}
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		seen := map[string]int{}
		var sessions []string
		// The moments count from when the child starts sweeping, not from
		// when its process starts, which takes longer on a loaded machine:
		// a kill before the first Scan would find nothing.
		timer := time.NewTimer(30 * time.Second)
	wait:
		for {
			select {
			case <-timer.C:
				break wait
			case line, ok := <-lines:
				if !ok {
					require.Failf(t, "child exited by itself", "kill %d:\n%s", kill, stderr.String())
				}
				word, rest, _ := strings.Cut(line, " ")
				switch word {
				case "session":
					sessions = append(sessions, rest)
					continue
				case "start":
					switch mode {
					case "time":
						timer.Reset(delay)
					case "run", "counted", "timed":
						timer.Reset(20 * time.Second) // a run comes soon, if late on a busy machine
					default:
						timer.Reset(3 * time.Second) // nothing of the kind: kill anyway
					}
					continue
				}
				seen[word]++
				if word == mode && seen[word] >= k {
					break wait
				}
			}
		}
		timer.Stop()
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		for line := range lines { // what the child wrote before it died
			if rest, ok := strings.CutPrefix(line, "session "); ok {
				sessions = append(sessions, rest)
			}
		}
		err = cmd.Wait()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "kill %d:\n%s", kill, stderr.String())
		if way != "" {
			runs[way] += runsOfWay(way, seen)
		}

		st := c.check(sessions)
		how := fmt.Sprintf("concurrency %d", conc)
		if way != "" {
			how += ", " + way
		}
		t.Logf("kill %2d (%s, %s %d; child saw %v): %s", kill, how, mode, k, seen, st)
		worst = worst.max(st)
		for word, n := range seen {
			said[word] += n
		}
	}
	kills := 0
	for _, n := range modes {
		kills += n
	}
	t.Logf("%d kills in %v (%v)", kills, time.Since(start).Round(time.Millisecond), modes)
	if len(c.clears) > 0 {
		t.Logf("children of concurrency 1 by their way of clearing: %v, the runs they cleared: %v", given, runs)
	}
	return worst, said
}

// crashState is what the file shows after a kill.
type crashState struct {
	expiredLeft, clearedIDs                  int
	lost, orphans, dupMarkers, doubleCleared int
	unexpiredTouched                         int
}

func (s crashState) String() string {
	return fmt.Sprintf("%d expired left, %d ids cleared; violations: %d jobs without marker, %d markers without job, %d ids with several markers, %d ids cleared twice, %d unexpired touched",
		s.expiredLeft, s.clearedIDs, s.lost, s.orphans, s.dupMarkers, s.doubleCleared, s.unexpiredTouched)
}

func (s crashState) max(o crashState) crashState {
	return crashState{
		expiredLeft: o.expiredLeft, clearedIDs: o.clearedIDs,
		lost: max(s.lost, o.lost), orphans: max(s.orphans, o.orphans), dupMarkers: max(s.dupMarkers, o.dupMarkers),
		doubleCleared: max(s.doubleCleared, o.doubleCleared), unexpiredTouched: max(s.unexpiredTouched, o.unexpiredTouched),
	}
}

// crashCheck reads the three tables of a file no process writes to.
func crashCheck(t testing.TB, db *sql.DB) crashState {
	t.Helper()
	ctx := context.Background()
	markers := map[string]int{} // id -> markers (a marker or a retry key: the id follows the last '/')
	rows, err := db.QueryContext(ctx, "SELECT marker FROM markers")
	require.NoError(t, err)
	for rows.Next() {
		var key []byte
		require.NoError(t, rows.Scan(&key))
		markers[string(key[strings.LastIndexByte(string(key), '/')+1:])]++
	}
	require.NoError(t, rows.Err())
	jobs := map[string]bool{} // id -> expired
	rows, err = db.QueryContext(ctx, "SELECT id, expired FROM jobs")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var expired bool
		require.NoError(t, rows.Scan(&id, &expired))
		jobs[id] = expired
	}
	require.NoError(t, rows.Err())
	txs := map[string]map[string]bool{} // id -> the transactions that cleared it
	rows, err = db.QueryContext(ctx, "SELECT id, tx FROM cleared")
	require.NoError(t, err)
	for rows.Next() {
		var id, tx string
		require.NoError(t, rows.Scan(&id, &tx))
		if txs[id] == nil {
			txs[id] = map[string]bool{}
		}
		txs[id][tx] = true
	}
	require.NoError(t, rows.Err())

	var s crashState
	unexpiredOK := 0
	for id, expired := range jobs {
		if expired {
			s.expiredLeft++
		}
		if markers[id] == 0 {
			s.lost++
		}
		if !expired && markers[id] == 1 {
			unexpiredOK++
		}
	}
	for id, n := range markers {
		if _, ok := jobs[id]; !ok {
			s.orphans++
		}
		if n > 1 {
			s.dupMarkers++
		}
	}
	s.clearedIDs = len(txs)
	for id, set := range txs {
		if len(set) > 1 {
			s.doubleCleared++
		}
		if strings.HasPrefix(id, "u") {
			s.unexpiredTouched++
		}
	}
	s.unexpiredTouched += crashUnexpired - unexpiredOK
	return s
}

// crashSweep makes the sweep of the crash test over a wrapper of its
// AtomicKV, with Concurrency conc. sleep, when not nil, gives how long a
// batch sleeps before it returns (0: none); say, when not nil, is told of
// each reschedule, cleared batch or run and timed-out batch or run.
func crashSweep(t testing.TB, db *sql.DB, clock retention.Clock, conc int, sleep func() time.Duration, say func(string)) *retention.Sweep {
	t.Helper()
	kv, err := sqlkv.New(db, sqlkv.SQLite, "markers")
	require.NoError(t, err)
	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		var raw [8]byte
		_, _ = rand.Read(raw[:])
		token := hex.EncodeToString(raw[:])
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, "DELETE FROM jobs WHERE id = ?", id); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO cleared (id, tx) VALUES (?, ?)", id, token); err != nil {
				return err
			}
		}
		if sleep != nil {
			// Not cut short by ctx: the commit then races the timeout.
			time.Sleep(sleep())
		}
		return nil
	})
	require.NoError(t, err)
	if say == nil {
		say = func(string) {}
	}
	batch, page, timeout := 100, 1000, crashTimeout
	if conc == 1 {
		batch, page, timeout = crashRunBatch, crashRunPage, crashRunTimeout
	}
	cfg := retention.Config{
		Prefix: crashPrefix, Retention: time.Hour, Clock: clock,
		PageSize: page, BatchSize: batch, Concurrency: conc,
		Logger: slog.New(slog.DiscardHandler),
	}
	if sleep != nil {
		cfg.ClearTimeout, cfg.RetryDelay, cfg.MaxRetryDelay, cfg.Interval = timeout, 5*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
		if conc == 1 {
			// Runs under a delete budget: each waits for its tokens, which
			// a kill may cut short. Faster than the children clear.
			cfg.Limiter = rate.NewLimiter(20_000, batch)
		}
	}
	s, err := retention.New(&crashKV{akv: akv, say: say}, cfg)
	require.NoError(t, err)
	return s
}

// crashKV forwards to an AtomicKV (or an AtomicTableKV) and tells of what
// it did.
type crashKV struct {
	akv atomicStore
	say func(string)
}

// atomicStore is what the crash tests' sweeps clear through.
type atomicStore interface {
	retention.RunClearer
	retention.Mover
	retention.Putter
}

func (c *crashKV) Unwrap() retention.KV { return c.akv }

func (c *crashKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return c.akv.Scan(ctx, start, end, limit)
}

func (c *crashKV) Delete(ctx context.Context, keys ...[]byte) error {
	return c.akv.Delete(ctx, keys...)
}

func (c *crashKV) Put(ctx context.Context, key, value []byte) error {
	err := c.akv.Put(ctx, key, value)
	if err == nil {
		c.say("resched put")
	}
	return err
}

func (c *crashKV) Move(ctx context.Context, from, to [][]byte) error {
	err := c.akv.Move(ctx, from, to)
	if err == nil {
		c.say(fmt.Sprintf("resched move %d", len(from)))
	}
	return err
}

func (c *crashKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	err := c.akv.ClearAndDelete(ctx, ids, keys)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.say(fmt.Sprintf("timeout %d err=%v", len(ids), err != nil))
	case err == nil:
		c.say(fmt.Sprintf("batch %d", len(ids)))
		c.say(fmt.Sprintf("cleared %d", len(ids)))
	}
	return err
}

func (c *crashKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	keys, err := c.akv.ClearRun(ctx, prefix, from, end, limit)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.say(fmt.Sprintf("timeout run err=%v", err != nil))
	case err == nil && len(keys) > 0:
		c.say(fmt.Sprintf("run %d", len(keys)))
		c.say(fmt.Sprintf("cleared %d", len(keys)))
	}
	return keys, err
}

// CountRun implements retention.RunCounter, for a store that is one.
func (c *crashKV) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (retention.RunCount, error) {
	rc, ok := c.akv.(retention.RunCounter)
	if !ok {
		return retention.RunCount{}, fmt.Errorf("a %T counts no runs: %w", c.akv, errors.ErrUnsupported)
	}
	n, err := rc.CountRun(ctx, prefix, from, end, limit, times)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.say(fmt.Sprintf("timeout run err=%v", err != nil))
	case err == nil && n.N > 0:
		c.say(fmt.Sprintf("run %d", n.N))
		c.say(fmt.Sprintf("counted %d", n.N))
		if times {
			c.say(fmt.Sprintf("timed %d", n.N)) // asked by an Observer
		}
		c.say(fmt.Sprintf("cleared %d", n.N))
	}
	return n, err
}

// RunStore implements retention.RunClearer.
func (c *crashKV) RunStore() retention.RunClearer { return c }

// crashChild sweeps the store with the sweep that sweepOf makes, until it
// is killed.
func crashChild(t *testing.T, st crashStore, sweepOf func(t testing.TB, db *sql.DB, clock retention.Clock, conc int, sleep func() time.Duration, say func(string)) *retention.Sweep) {
	seed, err := strconv.ParseUint(os.Getenv(crashEnvSeed), 10, 64)
	require.NoError(t, err)
	rng := mrand.New(mrand.NewPCG(seed, seed))
	conc, err := strconv.Atoi(os.Getenv(crashEnvConc))
	require.NoError(t, err)
	// One batch in 8 sleeps; one run in 32, since a run that fails stops
	// the runs until its ids are cleared.
	odds, timeout := 8, crashTimeout
	if conc == 1 {
		odds, timeout = 32, crashRunTimeout
	}
	var mu sync.Mutex
	sleep := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(odds) != 0 {
			return 0
		}
		// About the ClearTimeout: some commit before it fires, some after,
		// some are cancelled.
		return time.Duration((0.5 + rng.Float64()) * float64(timeout))
	}
	var out sync.Mutex
	say := func(line string) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintln(os.Stdout, line)
	}
	var db *sql.DB
	if st.dl.d == sqlkv.SQLite {
		db = openSQLite(t, st.name)
	} else {
		db = openTelling(t, st.dl, say)
	}
	// A connection open before the first clear, whose ClearTimeout opening
	// one under the race detector would take up.
	require.NoError(t, db.PingContext(context.Background()))
	s := sweepOf(t, db, nil, conc, sleep, say)
	say("start")
	err = s.Run(context.Background())
	t.Fatalf("Run returned: %v", err)
}

// openTelling opens the server of dl through a connector that says
// "session ID" of every connection it opens, before it is used: the
// parent waits for them to end after a kill.
func openTelling(t testing.TB, dl dialect, say func(string)) *sql.DB {
	plain := dl.open(t, "")
	env, id := "RETENTION_MYSQL_DSN", "SELECT CONNECTION_ID()"
	if dl.d == sqlkv.PostgreSQL {
		env, id = "RETENTION_POSTGRES_DSN", "SELECT pg_backend_pid()"
	}
	db := sql.OpenDB(tellingConnector{drv: plain.Driver(), dsn: kvtest.ServerAddr(t, env), id: id, say: say})
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// tellingConnector opens connections of drv, and says the server's id
// of each with say, which query id reads.
type tellingConnector struct {
	drv     driver.Driver
	dsn, id string
	say     func(string)
}

func (c tellingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	id, err := func() (driver.Value, error) {
		rows, err := conn.(driver.QueryerContext).QueryContext(ctx, c.id, nil)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		v := make([]driver.Value, 1)
		if err := rows.Next(v); err != nil {
			return nil, err
		}
		return v[0], nil
	}()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if b, ok := id.([]byte); ok { // MySQL's text protocol
		id = string(b)
	}
	c.say(fmt.Sprint("session ", id))
	return conn, nil
}

func (c tellingConnector) Driver() driver.Driver { return c.drv }

// waitSessionsGone waits until none of the server sessions of ids is
// left, up to a minute: a session's transaction has then ended. It
// returns how long it waited, and what those left when it began were
// doing.
func waitSessionsGone(t testing.TB, db *sql.DB, d sqlkv.Dialect, ids []string) (waited time.Duration, left []string) {
	t.Helper()
	if len(ids) == 0 {
		return 0, nil
	}
	for _, id := range ids {
		_, err := strconv.ParseUint(id, 10, 64)
		require.NoError(t, err, "session id %q", id)
	}
	query := "SELECT concat_ws(' ', command, state, left(info, 60)) FROM information_schema.processlist WHERE id IN (" + strings.Join(ids, ", ") + ")"
	if d == sqlkv.PostgreSQL {
		query = "SELECT concat_ws(' ', state, left(query, 60)) FROM pg_stat_activity WHERE pid IN (" + strings.Join(ids, ", ") + ")"
	}
	start := time.Now()
	for i := 0; ; i++ {
		var now []string
		rows, err := db.QueryContext(context.Background(), query)
		require.NoError(t, err)
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			now = append(now, s)
		}
		require.NoError(t, rows.Err())
		if i == 0 {
			left = now
		}
		if len(now) == 0 {
			return time.Since(start), left
		}
		require.Less(t, time.Since(start), time.Minute, "sessions of a killed child still there: %q", now)
		time.Sleep(5 * time.Millisecond)
	}
}
