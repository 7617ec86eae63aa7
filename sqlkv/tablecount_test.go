package sqlkv_test

// A counted run (AtomicTableKV.CountRun, no ClearFunc) whose rows change
// between the reads that find it (its end, its first row) and its DELETE:
// another connection un-finishes a row of the run and finishes a new one
// inside it just before the DELETE. The run's answer must be what it
// deleted, and a sweep with an Observer must neither fail its pass nor
// give up its runs. On PostgreSQL and MariaDB (SQLite's transaction holds
// the write lock).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/sqlkv"
)

// crTable is a jobs table with two views: the sweeper's, over a database
// whose statements pass through a hook, and a plain one for the other
// writers.
type crTable struct {
	*jobsTable
	hooked *sql.DB
	sweep  *sqlkv.AtomicTableKV // over hooked
	other  *sqlkv.AtomicTableKV // over the plain db, same side table
	before atomic.Pointer[func(q string)]
}

func newCRTable(t *testing.T, dl dialect) *crTable {
	t.Helper()
	j := newJobsTable(t, dl, true)
	c := &crTable{jobsTable: j}
	dsn := ""
	switch dl.d {
	case sqlkv.MySQL:
		dsn = kvtest.ServerAddr(t, "RETENTION_MYSQL_DSN")
	case sqlkv.PostgreSQL:
		dsn = kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	default:
		t.Fatalf("no hooked %s", dl.name)
	}
	c.hooked = sql.OpenDB(hookConnector{drv: j.db.Driver(), dsn: dsn, before: func(q string) {
		if f := c.before.Load(); f != nil {
			(*f)(q)
		}
	}})
	t.Cleanup(func() { _ = c.hooked.Close() })
	ctx := context.Background()
	sideName := fmt.Sprintf("%s_side", j.name)
	_, _ = j.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+sideName)
	require.NoError(t, sqlkv.Migrate(ctx, j.db, dl.d, sideName))
	t.Cleanup(func() { _, _ = j.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+sideName) })
	mk := func(db *sql.DB) *sqlkv.AtomicTableKV {
		side, err := sqlkv.New(db, dl.d, sideName)
		require.NoError(t, err)
		kv, err := sqlkv.NewTable(ctx, side, sqlkv.Table{Name: j.name, ID: "id", Time: "finished",
			TimeUnit: j.unit, Filter: "state IN ('done', 'failed')", Prefix: tablePrefix})
		require.NoError(t, err)
		return kv.WithClear(nil)
	}
	c.sweep, c.other = mk(c.hooked), mk(j.db)
	return c
}

// beforeRunDelete arms f to run once, just before the sweeper's range
// DELETE of the jobs table, on a goroutine of its own that the DELETE
// waits for up to 2s (a write that waits for the run's locks would
// otherwise wait for itself). wait returns f's error once it is done.
func (c *crTable) beforeRunDelete(t *testing.T, f func() error) (wait func() error) {
	var once atomic.Bool
	done := make(chan error, 1)
	h := func(q string) {
		rest, ok := strings.CutPrefix(q, "DELETE FROM ")
		if w := strings.Fields(rest); ok && len(w) > 0 && strings.Trim(w[0], "`\"") == c.name && once.CompareAndSwap(false, true) {
			go func() { done <- f() }()
			select {
			case err := <-done:
				done <- err
			case <-time.After(2 * time.Second):
				t.Logf("the concurrent write still waits as the DELETE goes")
			}
		}
	}
	c.before.Store(&h)
	return func() error {
		if !once.Load() {
			return errors.New("the hook never fired")
		}
		return <-done
	}
}

// exec runs a statement on the plain database.
func (c *crTable) exec(s string, args ...any) error {
	if _, err := c.db.ExecContext(context.Background(), q(c.dl.d, s), args...); err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	return nil
}

// swap un-finishes row out and finishes row in at the time at.
func (c *crTable) swap(out, in int64, at time.Time) error {
	if err := c.exec(fmt.Sprintf("UPDATE %s SET state = 'running', finished = NULL WHERE id = %d", c.name, out)); err != nil {
		return err
	}
	return c.exec("INSERT INTO "+c.name+" (id, state, finished) VALUES (?, 'done', ?)", in, c.timeArg(at))
}

// crRow is a row as the test wrote it.
type crRow struct {
	id int64
	at time.Time
}

func (r crRow) ms() int64 {
	ms := r.at.UnixMilli()
	if time.UnixMilli(ms).Before(r.at) {
		ms++
	}
	return ms
}

// checkCount checks c, what CountRun answered, against the rows it
// actually deleted: those of candidates no longer in the table.
func checkCount(t *testing.T, j *jobsTable, c retention.RunCount, candidates []crRow) {
	t.Helper()
	left, _ := j.ids(t)
	t.Logf("left: %v", left)
	var gone []crRow
	for _, r := range candidates {
		if !left[r.id] {
			gone = append(gone, r)
		}
	}
	slices.SortFunc(gone, func(a, b crRow) int {
		if a.ms() != b.ms() {
			return int(a.ms() - b.ms())
		}
		return int(a.id - b.id)
	})
	require.Equal(t, len(gone), c.N, "N against the rows deleted")
	if len(gone) == 0 {
		return
	}
	require.Equal(t, gone[0].ms(), c.First, "First against the first row deleted (%d)", gone[0].id)
	last := gone[len(gone)-1]
	require.Equal(t, string(rowKey(t, last.at, last.id)), string(c.Last), "Last against the last row deleted")
	if c.Times != nil {
		var ms []int64
		for _, r := range gone {
			ms = append(ms, r.ms())
		}
		require.Equal(t, ms, c.Times)
	}
}

var crDialects = []dialect{dialects[1], dialects[2]} // MariaDB, PostgreSQL

func forEachServer(t *testing.T, f func(t *testing.T, dl dialect)) {
	for _, dl := range crDialects {
		t.Run(dl.name, func(t *testing.T) {
			t.Parallel()
			f(t, dl)
		})
	}
}

var crBase = time.UnixMilli(1_700_000_000_000)

// TestCountedRunTellsItsRowsWhenOneLeaves: a row of the run, its first or
// its last (its cut), is un-finished and another row finishes inside the
// run just before its DELETE. The answer (N, First, Last, Times) is the
// rows deleted, or the run is refused having deleted nothing.
func TestCountedRunTellsItsRowsWhenOneLeaves(t *testing.T) {
	forEachServer(t, func(t *testing.T, dl dialect) {
		for _, tc := range []struct {
			name string
			out  int64 // the id of the row that leaves
		}{{"first row", 1}, {"cut", 3}} {
			for _, times := range []bool{false, true} {
				t.Run(fmt.Sprint(tc.name, "/times=", times), func(t *testing.T) {
					c := newCRTable(t, dl)
					ctx := context.Background()
					var rows []crRow
					for i := int64(1); i <= 5; i++ {
						r := crRow{i, crBase.Add(time.Duration(i) * time.Millisecond)}
						c.finish(t, r.id, "done", r.at)
						rows = append(rows, r)
					}
					in := crRow{10, crBase.Add(2 * time.Millisecond)}
					rows = append(rows, in)
					wait := c.beforeRunDelete(t, func() error { return c.swap(tc.out, in.id, in.at) })
					got, err := c.sweep.CountRun(ctx, tablePrefix, []byte(tablePrefix), tableEnd(crBase.UnixMilli()+100), 3, times)
					require.NoError(t, wait(), "the concurrent write")
					t.Logf("CountRun = N %d First %d Last %q Times %v, %v", got.N, got.First, got.Last, got.Times, err)
					if err != nil {
						require.ErrorIs(t, err, retention.ErrMalformedMarker)
						left, _ := c.ids(t)
						require.Len(t, left, 6, "a refused run deletes nothing")
						return
					}
					checkCount(t, c.jobsTable, got, rows)
				})
			}
		}
	})
}

// TestCountedRunsSurviveAJobRetriedMidRun: through a Sweep with an
// Observer, the same change of the cut's row, a legitimate write by the
// table's owner (a finished job retried), neither fails the pass nor
// breaks the run's contract.
func TestCountedRunsSurviveAJobRetriedMidRun(t *testing.T) {
	forEachServer(t, func(t *testing.T, dl dialect) {
		c := newCRTable(t, dl)
		ctx := context.Background()
		for i := int64(1); i <= 5; i++ {
			c.finish(t, i, "done", crBase.Add(time.Duration(i)*time.Millisecond))
		}
		wait := c.beforeRunDelete(t, func() error { return c.swap(3, 10, crBase.Add(2*time.Millisecond)) })
		s, err := retention.New(c.sweep, retention.Config{Prefix: tablePrefix, Retention: time.Hour, BatchSize: 3,
			Clock: retention.NewManualClock(crBase.Add(2 * time.Hour)), Observer: &lagCounter{}})
		require.NoError(t, err)
		st, err := s.Pass(ctx)
		require.NoError(t, wait(), "the concurrent write")
		t.Logf("Pass = %+v, %v", st, err)
		require.NoError(t, err, "a retried job made the pass fail")
	})
}

// TestCountedRunOnSQLiteTakesNoLock: SQLite's transaction holds the write
// lock from its start, so a counted run there neither locks its cut's row
// nor reads the shadows again after its DELETE, which the servers need
// (TestCountedRunTellsItsRowsWhenOneLeaves): one statement a read it
// needs, and the DELETE.
func TestCountedRunOnSQLiteTakesNoLock(t *testing.T) {
	ctx := context.Background()
	dsn := sqliteDSN(filepath.Join(t.TempDir(), "jobs.db"))
	plain, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	var stmts []string
	db := sql.OpenDB(hookConnector{drv: plain.Driver(), dsn: dsn, before: func(q string) { stmts = append(stmts, q) }})
	t.Cleanup(func() { _ = db.Close() })
	for _, s := range []string{
		"CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT NOT NULL, finished INTEGER)",
		"CREATE INDEX jobs_finished ON jobs (finished, id)",
	} {
		_, err := plain.ExecContext(ctx, s)
		require.NoError(t, err)
	}
	for id := range int64(10) {
		_, err := plain.ExecContext(ctx, "INSERT INTO jobs VALUES (?, 'done', ?)", id+1, 1_000+id)
		require.NoError(t, err)
	}
	require.NoError(t, sqlkv.Migrate(ctx, plain, sqlkv.SQLite, "side"))
	side, err := sqlkv.New(db, sqlkv.SQLite, "side")
	require.NoError(t, err)
	table, err := sqlkv.NewTable(ctx, side, sqlkv.Table{Name: "jobs", ID: "id", Time: "finished",
		TimeUnit: sqlkv.UnixMilli, Filter: "state = 'done'", Prefix: tablePrefix})
	require.NoError(t, err)

	stmts = nil
	c, err := table.WithClear(nil).CountRun(ctx, tablePrefix, []byte(tablePrefix), []byte(tablePrefix+"~"), 5, false)
	require.NoError(t, err)
	assert.Equal(t, 5, c.N)
	assert.Equal(t, int64(1_000), c.First)
	assert.Len(t, stmts, 5, "the shadows, the run's end, the side keys in it, its first row, the DELETE; got:\n%s", strings.Join(stmts, "\n"))
	var left int
	require.NoError(t, plain.QueryRowContext(ctx, "SELECT count(*) FROM jobs").Scan(&left))
	assert.Equal(t, 5, left)
}
