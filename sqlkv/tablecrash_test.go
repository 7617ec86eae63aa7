package sqlkv_test

import (
	"context"
	"database/sql"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// TestCrashTableSQLite is TestCrashAtomicSQLite over a table whose rows
// are the markers (an AtomicTableKV): a child process sweeps 8,000
// expired and 800 unexpired finished jobs, and 400 still running, of a
// SQLite file (4,000 expired more whenever a kill leaves fewer than
// half); a trigger fails the delete of poison jobs (one in 16) half the
// time, so batches fail, bisect and move their rows' markers to the side
// table; some batches sleep about as long as the ClearTimeout. The child is
// killed with SIGKILL at random moments, again and again. After every
// kill the file must show: every finished job present has exactly one
// marker (its row, or a key of the side table that shadows it), no side
// key or shadow without its job, no id cleared by two committed
// transactions, no unexpired or running job touched. A final clean sweep
// must leave no expired job.
func TestCrashTableSQLite(t *testing.T) {
	if file := os.Getenv(crashEnvFile); file != "" {
		crashChild(t, file, tableCrashSweep)
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
	_, err := admin.ExecContext(ctx, `CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL, finished INTEGER, poison INTEGER NOT NULL);
CREATE INDEX jobs_finished ON jobs (finished, id);
CREATE TABLE cleared (id INTEGER NOT NULL, tx TEXT NOT NULL);
CREATE TRIGGER poison BEFORE DELETE ON jobs WHEN OLD.poison AND abs(random()) % 2 = 0
BEGIN SELECT RAISE(ABORT, 'job is poisoned'); END;
CREATE TABLE mode (counted INTEGER NOT NULL);
INSERT INTO mode VALUES (0);
CREATE TRIGGER log_delete AFTER DELETE ON jobs WHEN (SELECT counted FROM mode)
BEGIN INSERT INTO cleared (id, tx) VALUES (OLD.id, hex(randomblob(8))); END`)
	require.NoError(t, err)

	seed := mrand.Uint64()
	t.Logf("seed %d", seed)
	rng := mrand.New(mrand.NewPCG(seed, seed))
	now := time.Now()
	// insert adds n jobs from id first: the first old of them done
	// long ago, one in 16 poisoned, the next crashUnexpired done recently
	// and the rest running.
	insert := func(first, n, old int) {
		tx, err := admin.BeginTx(ctx, nil)
		require.NoError(t, err)
		for i := range n {
			id := first + i
			state, at := "done", any(now.Add(-2*time.Hour+time.Duration(id/3)*time.Millisecond).UnixMilli())
			switch {
			case i >= old+crashUnexpired:
				state, at = "running", nil
			case i >= old:
				at = now.Add(time.Duration(i) * time.Millisecond).UnixMilli()
			}
			poison := i < old && rng.IntN(16) == 0
			_, err := tx.ExecContext(ctx, "INSERT INTO jobs VALUES (?, ?, ?, ?)", id, state, at, poison)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
	}
	insert(1, tableCrashExpired+crashUnexpired+tableCrashRunning, tableCrashExpired)
	// Runs clear thousands of jobs before a kill: when fewer than half
	// are left, a kill adds as many more, so every child has a backlog.
	expired, next := tableCrashExpired, tableCrashExpired+crashUnexpired+tableCrashRunning+1
	check := func() crashState {
		st := tableCrashCheck(t, admin, now)
		if st.expiredLeft < tableCrashExpired/2 {
			insert(next, tableCrashExpired/2, tableCrashExpired/2)
			expired += tableCrashExpired / 2
			next += tableCrashExpired / 2
		}
		return st
	}
	worst, said := killChildren(t, rng, "TestCrashTableSQLite", file, check)

	_, err = admin.ExecContext(ctx, "DROP TRIGGER poison")
	require.NoError(t, err)
	s := tableCrashSweep(t, admin, retention.NewManualClock(now.Add(10*time.Minute)), 1, nil, nil)
	for range 10 {
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		if st.Cleared == 0 && st.Failed == 0 {
			break
		}
	}
	final := tableCrashCheck(t, admin, now)
	t.Logf("after the final sweep: %s", final)
	worst = worst.max(final)
	assert.Zero(t, final.expiredLeft, "expired jobs left after the final sweep")
	assert.Equal(t, expired, final.clearedIDs, "every expired id was cleared")
	assert.Zero(t, worst.lost, "a finished job without a marker: it is never cleared")
	assert.Zero(t, worst.orphans, "a side key or shadow without its job")
	assert.Zero(t, worst.dupMarkers, "a job with two markers")
	assert.Zero(t, worst.doubleCleared, "an id cleared by two committed transactions")
	assert.Zero(t, worst.unexpiredTouched, "an unexpired or running job touched")
	assert.Positive(t, said["run"], "no child cleared a run")
	assert.Positive(t, said["counted"], "no child counted a run")
	t.Logf("runs: %d, %d of them counted", said["run"], said["counted"])
}

// tableCrashRunning is how many jobs of the table crash test run: no
// marker, never touched. Runs over the table clear several thousand jobs
// before a kill: tableCrashExpired keeps the children busy up to the last.
const (
	tableCrashRunning = 400
	tableCrashExpired = 8_000
)

// tableCrashSweep is crashSweep over the jobs table as the marker store.
func tableCrashSweep(t testing.TB, db *sql.DB, clock retention.Clock, conc int, sleep func() time.Duration, say func(string)) *retention.Sweep {
	t.Helper()
	side, err := sqlkv.New(db, sqlkv.SQLite, "markers")
	require.NoError(t, err)
	table, err := sqlkv.NewTable(context.Background(), side, sqlkv.Table{Name: "jobs", ID: "id", Time: "finished",
		TimeUnit: sqlkv.UnixMilli, Filter: "state = 'done'", Prefix: crashPrefix})
	require.NoError(t, err)
	// Half the children that clear in runs clear the rows alone, as the
	// table's whole state, in runs the store counts (RunCounter); the
	// jobs table's trigger then logs the ids deleted.
	counted := sleep != nil && conc == 1 && mrand.IntN(2) == 0
	_, err = db.ExecContext(context.Background(), "UPDATE mode SET counted = ?", counted)
	require.NoError(t, err)
	clearIDs := func(ctx context.Context, tx *sql.Tx, ids []string) error {
		token := txToken()
		for _, id := range ids {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO cleared (id, tx) VALUES (?, ?)", n, token); err != nil {
				return err
			}
		}
		if sleep != nil {
			time.Sleep(sleep()) // not cut short by ctx: the commit then races the timeout
		}
		return nil
	}
	if counted {
		clearIDs = nil
	}
	akv := table.WithClear(clearIDs)
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
	if counted && mrand.IntN(2) == 0 {
		cfg.Observer = &lagCounter{} // its runs asked for their times
	}
	s, err := retention.New(&crashKV{akv: akv, say: say}, cfg)
	require.NoError(t, err)
	return s
}

// tableCrashCheck reads the jobs, the side table and the cleared ids of a
// file no process writes to.
func tableCrashCheck(t testing.TB, db *sql.DB, now time.Time) crashState {
	t.Helper()
	return jobsCheck{db: db, d: sqlkv.SQLite, jobs: "jobs", side: "markers", cleared: "cleared", prefix: crashPrefix,
		cutoff: now.Add(-time.Hour).UnixMilli(), untouched: crashUnexpired + tableCrashRunning}.check(t)
}

// jobsCheck names the tables of a jobs table whose finished rows in
// state done are the markers: the jobs (id, state, finished), the side
// table, and the ids cleared (id, tx).
type jobsCheck struct {
	db                          *sql.DB
	d                           sqlkv.Dialect
	jobs, side, cleared, prefix string
	// cutoff is the finish time, as the column holds it, before which a
	// done job is expired.
	cutoff any
	// untouched is how many jobs are unexpired, running, or not done:
	// never cleared, and never with a side key.
	untouched int
}

// check reads the tables in one snapshot: every expired job present has
// exactly one marker (its row, or a key of the side table that shadows
// it), no side key or shadow is without its job, no id was cleared by two
// committed transactions, and no other job was touched.
func (c jobsCheck) check(t testing.TB) crashState {
	t.Helper()
	ctx := context.Background()
	tx, err := c.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil { // SQLite takes no isolation level: it is serializable
		tx, err = c.db.BeginTx(ctx, nil)
	}
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	read := func(query string, args []any, row func(*sql.Rows) error) {
		rows, err := tx.QueryContext(ctx, q(c.d, query), args...)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			require.NoError(t, row(rows))
		}
		require.NoError(t, rows.Err())
	}
	type job struct {
		done, expired bool
	}
	jobs := map[int64]job{}
	read("SELECT id, state = 'done', CASE WHEN finished < ? THEN 1 ELSE 0 END FROM "+c.jobs, []any{c.cutoff}, func(r *sql.Rows) error {
		var id int64
		var done bool
		var expired int
		err := r.Scan(&id, &done, &expired)
		jobs[id] = job{done: done, expired: expired == 1}
		return err
	})
	side := map[int64]int{} // id -> side keys standing for its job
	shadows := map[int64]bool{}
	read("SELECT marker FROM "+c.side, nil, func(r *sql.Rows) error {
		var key []byte
		if err := r.Scan(&key); err != nil {
			return err
		}
		if rest, ok := cutPrefix(key, c.prefix+"~"); ok {
			id, err := strconv.ParseInt(rest, 10, 64)
			require.NoError(t, err, "shadow %q", key)
			shadows[id] = true
			return nil
		}
		_, rawID, err := retention.ParseMarkerKey(c.prefix, key)
		require.NoError(t, err, "side key %q", key)
		id, err := strconv.ParseInt(string(rawID), 10, 64)
		require.NoError(t, err, "side key %q", key)
		side[id]++
		return nil
	})
	txs := map[int64]map[string]bool{}
	read("SELECT id, tx FROM "+c.cleared, nil, func(r *sql.Rows) error {
		var id int64
		var tx string
		if err := r.Scan(&id, &tx); err != nil {
			return err
		}
		if txs[id] == nil {
			txs[id] = map[string]bool{}
		}
		txs[id][tx] = true
		return nil
	})

	var s crashState
	kept := 0 // unexpired, running and other jobs untouched
	for id, j := range jobs {
		if !j.done || !j.expired {
			if side[id] == 0 && !shadows[id] && txs[id] == nil {
				kept++
			}
			continue
		}
		s.expiredLeft++
		markers := side[id]
		if !shadows[id] {
			markers++ // the row itself
		}
		switch {
		case markers == 0:
			s.lost++
		case markers > 1:
			s.dupMarkers++
		}
		if shadows[id] != (side[id] > 0) {
			s.lost++ // a shadow with no key, or a key beside its row's own marker
		}
	}
	for id := range side {
		if _, ok := jobs[id]; !ok {
			s.orphans++
		}
	}
	for id := range shadows {
		if _, ok := jobs[id]; !ok {
			s.orphans++
		}
	}
	s.clearedIDs = len(txs)
	for _, set := range txs {
		if len(set) > 1 {
			s.doubleCleared++
		}
	}
	s.unexpiredTouched = c.untouched - kept
	return s
}

func cutPrefix(key []byte, prefix string) (string, bool) {
	if len(key) < len(prefix) || string(key[:len(prefix)]) != prefix {
		return "", false
	}
	return string(key[len(prefix):]), true
}
