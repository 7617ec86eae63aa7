package sqlkv_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// TestCrashTable is TestCrashAtomicSQLite over a table whose rows are the
// markers (an AtomicTableKV), on each dialect: a child process sweeps
// 8,000 expired and 800 unexpired finished jobs, and 400 still running
// (4,000 expired more whenever a kill leaves fewer than half); a trigger
// fails the delete of poison jobs (one in 16) half the time, so batches
// fail, bisect and move their rows' markers to the side table; some
// batches sleep about as long as the ClearTimeout. Children of
// Concurrency 1 clear in runs: with a ClearFunc, or as the table's whole
// state in runs the store counts (RunCounter, the jobs table's trigger
// then logs the ids deleted), with or without an Observer, which asks for
// the runs' times (on PostgreSQL, without one the DELETE returns no row).
// The finish times are Unix milliseconds, and timestamptz on PostgreSQL
// (River's finalized_at), the jobs of one millisecond in another order by
// time than by id.
// The child is killed with SIGKILL at random moments, again and again.
// After every kill, once the server has ended the child's sessions, the
// tables must show: every finished job present has exactly one marker
// (its row, or a key of the side table that shadows it), no side key or
// shadow without its job, no id cleared by two committed transactions, no
// unexpired or running job touched. A final clean sweep must leave no
// expired job.
func TestCrashTable(t *testing.T) {
	if st, ok := crashStoreFromEnv(t); ok {
		c := newTableCrash(st.dl.d, st.name)
		c.clear = os.Getenv(crashEnvClear)
		crashChild(t, st, c.sweep)
		return
	}
	if testing.Short() {
		t.Skip("crash test: starts and kills dozens of processes")
	}
	t.Parallel()
	forEach(t, tableCrashTest)
}

// tableCrashTest is TestCrashTable on one dialect: on a server, in tables
// of its own.
func tableCrashTest(t *testing.T, dl dialect) {
	ctx := context.Background()
	st := crashStore{dl: dl, name: fmt.Sprintf("crash_%d_%d", os.Getpid(), tableSeq.Add(1))}
	if dl.d == sqlkv.SQLite {
		st.name = filepath.Join(t.TempDir(), "crash.db")
	}
	admin := dl.open(t, st.name)
	c := newTableCrash(dl.d, st.name)
	c.create(t, admin)

	seed := mrand.Uint64()
	t.Logf("seed %d", seed)
	rng := mrand.New(mrand.NewPCG(seed, seed))
	now := time.Now()
	// insert adds n jobs from id first: the first old of them done
	// long ago, one in 16 poisoned, the next crashUnexpired done recently
	// and the rest running.
	insert := func(first, n, old int) {
		rows := make([]string, n)
		for i := range rows {
			id := first + i
			state, at := "done", c.timeLit(now.Add(-2*time.Hour+time.Duration(id/3)*time.Millisecond).UnixMilli(), id)
			switch {
			case i >= old+crashUnexpired:
				state, at = "running", "NULL"
			case i >= old:
				at = c.timeLit(now.Add(time.Duration(i)*time.Millisecond).UnixMilli(), id)
			}
			poison := i < old && rng.IntN(16) == 0
			rows[i] = fmt.Sprintf("(%d, '%s', %s, %t)", id, state, at, poison)
		}
		tx, err := admin.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		for len(rows) > 0 {
			part := rows[:min(500, len(rows))]
			rows = rows[len(part):]
			_, err := tx.ExecContext(ctx, "INSERT INTO "+c.jobs+" (id, state, finished, poison) VALUES "+strings.Join(part, ", "))
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
	}
	insert(1, tableCrashExpired+crashUnexpired+tableCrashRunning, tableCrashExpired)
	// Runs clear thousands of jobs before a kill: when fewer than half
	// are left, a kill adds as many more, so every child has a backlog.
	expired, next := tableCrashExpired, tableCrashExpired+crashUnexpired+tableCrashRunning+1
	// A killed child's last statement may still run on the server after
	// the kill, holding its locks, and a COMMIT it sent may land later:
	// check waits for the child's sessions to end, so that it reads what
	// the kill left and the next child does not start behind those
	// locks. How often they were still there, and the longest wait:
	var lingered int
	var waited time.Duration
	check := func(sessions []string) crashState {
		w, left := waitSessionsGone(t, admin, dl.d, sessions)
		if len(left) > 0 {
			lingered++
			t.Logf("%d sessions of the killed child still there, ended in %v: %q", len(left), w.Round(time.Millisecond), left)
		}
		waited = max(waited, w)
		st := c.check(t, admin, now)
		if st.expiredLeft < tableCrashExpired/2 {
			insert(next, tableCrashExpired/2, tableCrashExpired/2)
			expired += tableCrashExpired / 2
			next += tableCrashExpired / 2
		}
		return st
	}
	worst, said := crashChildren{test: "TestCrashTable", store: st, kills: crashKills,
		clears: []string{"ids", "counted", "timed"}, check: check}.run(t, rng)
	if dl.d != sqlkv.SQLite {
		t.Logf("after %d of %d kills the child's sessions were still there, for up to %v", lingered, crashKills, waited.Round(time.Millisecond))
	}

	drop := "DROP TRIGGER " + c.poison
	if dl.d == sqlkv.PostgreSQL {
		drop += " ON " + c.jobs
	}
	_, err := admin.ExecContext(ctx, drop)
	require.NoError(t, err)
	s := c.sweep(t, admin, retention.NewManualClock(now.Add(10*time.Minute)), 1, nil, nil)
	for range 10 {
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		if st.Cleared == 0 && st.Failed == 0 {
			break
		}
	}
	final := c.check(t, admin, now)
	t.Logf("after the final sweep: %s", final)
	worst = worst.max(final)
	assert.Zero(t, final.expiredLeft, "expired jobs left after the final sweep")
	assert.Equal(t, expired, final.clearedIDs, "every expired id was cleared")
	assert.Zero(t, worst.lost, "a finished job without a marker: it is never cleared")
	assert.Zero(t, worst.orphans, "a side key or shadow without its job")
	assert.Zero(t, worst.dupMarkers, "a job with two markers")
	assert.Zero(t, worst.doubleCleared, "an id cleared by two committed transactions")
	assert.Zero(t, worst.unexpiredTouched, "an unexpired or running job touched")
	t.Logf("runs: %d, %d of them counted, %d of those timed; batches: %d", said["run"], said["counted"], said["timed"], said["batch"])
	assert.Positive(t, said["run"], "no child cleared a run")
	assert.Positive(t, said["counted"]-said["timed"], "no child counted a run without its times")
	assert.Positive(t, said["timed"], "no child counted a run with its times")
	assert.Positive(t, said["batch"], "no child cleared a batch")
}

// tableCrashRunning is how many jobs of the table crash test run: no
// marker, never touched. Runs over the table clear several thousand jobs
// before a kill: tableCrashExpired keeps the children busy up to the last.
const (
	tableCrashRunning = 400
	tableCrashExpired = 8_000
)

// tableCrash is the database of a table crash test: the jobs, the side
// table of their markers, the ids cleared (id, tx), the mode that says
// whether the jobs' trigger logs the ids it deletes, and the triggers,
// named after one prefix (on PostgreSQL, each trigger's function too).
type tableCrash struct {
	d                                        sqlkv.Dialect
	jobs, side, cleared, mode, poison, logID string
	// clear is how a sweep of Concurrency 1 with a sleep (a child's)
	// clears: "counted" in runs the store counts, "timed" so too with an
	// Observer, which asks for their times, and otherwise with a
	// ClearFunc.
	clear string
}

// newTableCrash names the tables: on SQLite, in the file of that name.
func newTableCrash(d sqlkv.Dialect, name string) *tableCrash {
	if d == sqlkv.SQLite {
		name = "crash"
	}
	return &tableCrash{d: d, jobs: name + "_jobs", side: name + "_markers", cleared: name + "_cleared",
		mode: name + "_mode", poison: name + "_poison", logID: name + "_log"}
}

// create makes the tables and the triggers, dropped when t ends: the
// poison trigger fails the delete of a poisoned job half the time, and
// the log trigger, while the mode says counted, logs the id of every job
// deleted with a token of its transaction (on MariaDB, of its row: a
// second committed delete still shows as a second token).
func (c *tableCrash) create(t testing.TB, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	tables := []string{c.jobs, c.cleared, c.mode, c.side}
	drop := func() {
		for _, tb := range tables {
			_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb)
			assert.NoError(t, err)
		}
		if c.d == sqlkv.PostgreSQL {
			_, err := db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+c.poison+", "+c.logID)
			assert.NoError(t, err)
		}
	}
	drop()
	if c.d != sqlkv.SQLite {
		t.Cleanup(drop)
	}
	require.NoError(t, sqlkv.Migrate(ctx, db, c.d, c.side))
	var stmts []string
	switch c.d {
	case sqlkv.SQLite:
		stmts = []string{
			"CREATE TABLE " + c.jobs + " (id INTEGER PRIMARY KEY, state TEXT NOT NULL, finished INTEGER, poison INTEGER NOT NULL)",
			"CREATE TABLE " + c.cleared + " (id INTEGER NOT NULL, tx TEXT NOT NULL)",
			"CREATE TABLE " + c.mode + " (counted INTEGER NOT NULL)",
			"CREATE TRIGGER " + c.poison + " BEFORE DELETE ON " + c.jobs + " WHEN OLD.poison AND abs(random()) % 2 = 0" +
				" BEGIN SELECT RAISE(ABORT, 'job is poisoned'); END",
			"CREATE TRIGGER " + c.logID + " AFTER DELETE ON " + c.jobs + " WHEN (SELECT counted FROM " + c.mode + ")" +
				" BEGIN INSERT INTO " + c.cleared + " (id, tx) VALUES (OLD.id, hex(randomblob(8))); END",
		}
	case sqlkv.PostgreSQL:
		stmts = []string{
			"CREATE TABLE " + c.jobs + " (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, finished timestamptz NULL, poison BOOLEAN NOT NULL)",
			"CREATE TABLE " + c.cleared + " (id BIGINT NOT NULL, tx VARCHAR(40) NOT NULL)",
			"CREATE TABLE " + c.mode + " (counted BOOLEAN NOT NULL)",
			"CREATE FUNCTION " + c.poison + "() RETURNS trigger AS $$ BEGIN" +
				" IF OLD.poison AND random() < 0.5 THEN RAISE EXCEPTION 'job is poisoned'; END IF; RETURN OLD; END $$ LANGUAGE plpgsql",
			"CREATE TRIGGER " + c.poison + " BEFORE DELETE ON " + c.jobs + " FOR EACH ROW EXECUTE FUNCTION " + c.poison + "()",
			"CREATE FUNCTION " + c.logID + "() RETURNS trigger AS $$ BEGIN IF (SELECT counted FROM " + c.mode + ") THEN" +
				" INSERT INTO " + c.cleared + " (id, tx) VALUES (OLD.id, txid_current()::text); END IF; RETURN NULL; END $$ LANGUAGE plpgsql",
			"CREATE TRIGGER " + c.logID + " AFTER DELETE ON " + c.jobs + " FOR EACH ROW EXECUTE FUNCTION " + c.logID + "()",
		}
	case sqlkv.MySQL:
		stmts = []string{
			"CREATE TABLE " + c.jobs + " (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, finished BIGINT NULL, poison BOOL NOT NULL)",
			"CREATE TABLE " + c.cleared + " (id BIGINT NOT NULL, tx VARCHAR(40) NOT NULL)",
			"CREATE TABLE " + c.mode + " (counted BOOL NOT NULL)",
			"CREATE TRIGGER " + c.poison + " BEFORE DELETE ON " + c.jobs + " FOR EACH ROW" +
				" IF OLD.poison AND RAND() < 0.5 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'job is poisoned'; END IF",
			"CREATE TRIGGER " + c.logID + " AFTER DELETE ON " + c.jobs + " FOR EACH ROW" +
				" IF (SELECT counted FROM " + c.mode + ") THEN INSERT INTO " + c.cleared + " (id, tx) VALUES (OLD.id, UUID()); END IF",
		}
	}
	stmts = append(stmts,
		"CREATE INDEX "+c.jobs+"_finished ON "+c.jobs+" (finished, id)",
		"INSERT INTO "+c.mode+" VALUES (FALSE)")
	for _, s := range stmts {
		_, err := db.ExecContext(ctx, s)
		require.NoError(t, err, s)
	}
}

// sweep is crashSweep over the jobs table as the marker store.
func (c *tableCrash) sweep(t testing.TB, db *sql.DB, clock retention.Clock, conc int, sleep func() time.Duration, say func(string)) *retention.Sweep {
	t.Helper()
	side, err := sqlkv.New(db, c.d, c.side)
	require.NoError(t, err)
	table, err := sqlkv.NewTable(context.Background(), side, sqlkv.Table{Name: c.jobs, ID: "id", Time: "finished",
		TimeUnit: c.unit(), Filter: "state = 'done'", Prefix: crashPrefix})
	require.NoError(t, err)
	// A child that clears in counted runs clears the rows alone, as the
	// table's whole state; the jobs table's trigger then logs the ids
	// deleted.
	counted := sleep != nil && conc == 1 && (c.clear == "counted" || c.clear == "timed")
	_, err = db.ExecContext(context.Background(), q(c.d, "UPDATE "+c.mode+" SET counted = ?"), counted)
	require.NoError(t, err)
	clearIDs := func(ctx context.Context, tx *sql.Tx, ids []string) error {
		token := txToken()
		for _, id := range ids {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q(c.d, "INSERT INTO "+c.cleared+" (id, tx) VALUES (?, ?)"), n, token); err != nil {
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
	if counted && c.clear == "timed" {
		cfg.Observer = &lagCounter{} // its runs asked for their times
	}
	s, err := retention.New(&crashKV{akv: akv, say: say}, cfg)
	require.NoError(t, err)
	return s
}

// check reads the jobs, the side table and the cleared ids, which no
// process writes to.
func (c *tableCrash) check(t testing.TB, db *sql.DB, now time.Time) crashState {
	t.Helper()
	var cutoff any = now.Add(-time.Hour).UnixMilli()
	if c.unit() == sqlkv.Timestamp {
		cutoff = now.Add(-time.Hour)
	}
	return jobsCheck{db: db, d: c.d, jobs: c.jobs, side: c.side, cleared: c.cleared, prefix: crashPrefix,
		cutoff: cutoff, untouched: crashUnexpired + tableCrashRunning}.check(t)
}

// unit is how the jobs' finish times are kept: timestamptz on PostgreSQL,
// as River's finalized_at, whose runs count the rows of their last
// millisecond (see runEnd); Unix milliseconds elsewhere.
func (c *tableCrash) unit() sqlkv.TimeUnit {
	if c.d == sqlkv.PostgreSQL {
		return sqlkv.Timestamp
	}
	return sqlkv.UnixMilli
}

// timeLit is the SQL literal of the finish time ms of job id. A
// timestamptz is ms plus some microseconds that id scatters, so that the
// jobs of a millisecond are in another order by time than by id.
func (c *tableCrash) timeLit(ms int64, id int) string {
	if c.unit() == sqlkv.Timestamp {
		return fmt.Sprintf("'epoch'::timestamptz + interval '1 millisecond' * %d + interval '1 microsecond' * %d", ms, id*7919%1000)
	}
	return strconv.FormatInt(ms, 10)
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
