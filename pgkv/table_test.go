package pgkv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
	"github.com/marksweep/retention/sqlkv"
)

// tableOfJobs is a jobs table of the tests of Tables: jobs whose finished
// rows in state done are the markers, their artifacts and a ledger of the
// ids cleared, one row per commit.
type tableOfJobs struct {
	pool                          *pgxpool.Pool
	tables                        *pgkv.Tables
	side, jobs, artifacts, ledger string
	expired, unexpired, active    []int64
}

// newTableOfJobs creates the tables, with 20 jobs done two hours ago, 5 done
// just now and 5 running, each with two artifacts.
func newTableOfJobs(t *testing.T, pool *pgxpool.Pool) *tableOfJobs {
	t.Helper()
	ctx := context.Background()
	side := freshTable(t, pool) // a name of its own; Tables.Migrate makes the side table
	_, err := pool.Exec(ctx, "DROP TABLE "+side)
	require.NoError(t, err)
	j := &tableOfJobs{pool: pool, side: side, jobs: side + "_jobs", artifacts: side + "_artifacts", ledger: side + "_ledger"}
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %s, %s, %s, %s", j.jobs, j.artifacts, j.ledger, side))
		assert.NoError(t, err)
	})
	for _, s := range []string{
		"CREATE TABLE " + j.jobs + " (id bigint PRIMARY KEY, state text NOT NULL, finished_at timestamptz)",
		"CREATE INDEX ON " + j.jobs + " (finished_at, id) WHERE state = 'done'",
		"CREATE TABLE " + j.artifacts + " (job_id bigint NOT NULL, name text NOT NULL, PRIMARY KEY (job_id, name))",
		"CREATE TABLE " + j.ledger + " (job_id bigint NOT NULL, note text NOT NULL)",
	} {
		_, err := pool.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	now := time.Now()
	for id := int64(1); id <= 30; id++ {
		state, at := "done", any(now.Add(-2*time.Hour+time.Duration(id)*time.Second))
		switch {
		case id > 25:
			state, at = "running", nil
			j.active = append(j.active, id)
		case id > 20:
			at = now
			j.unexpired = append(j.unexpired, id)
		default:
			j.expired = append(j.expired, id)
		}
		_, err := pool.Exec(ctx, "INSERT INTO "+j.jobs+" VALUES ($1, $2, $3)", id, state, at)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "INSERT INTO "+j.artifacts+" VALUES ($1, 'log'), ($1, 'report')", id)
		require.NoError(t, err)
	}
	j.tables, err = pgkv.NewTables(pool, side, nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, j.tables.Close()) })
	require.NoError(t, j.tables.Migrate(ctx))
	require.NoError(t, j.tables.Migrate(ctx), "Migrate again")
	return j
}

// spec is the jobs table as the markers of the prefix "jobs/".
func (j *tableOfJobs) spec() sqlkv.Table {
	return sqlkv.Table{Name: j.jobs, ID: "id", Time: "finished_at", Filter: "state = 'done'", Prefix: "jobs/"}
}

// table is the TableKV of spec, from j's Tables.
func (j *tableOfJobs) table(t *testing.T) *sqlkv.TableKV {
	t.Helper()
	tkv, err := j.tables.Table(context.Background(), j.spec())
	require.NoError(t, err)
	return tkv
}

// ids returns the ids of query's rows, in order.
func (j *tableOfJobs) ids(t *testing.T, query string) []int64 {
	t.Helper()
	rows, err := j.pool.Query(context.Background(), query)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// clearArtifacts deletes the jobs' artifacts and writes them in the
// ledger, the second statement with named arguments.
func (j *tableOfJobs) clearArtifacts(_ context.Context, b *pgx.Batch, ids []string) error {
	b.Queue("DELETE FROM "+j.artifacts+" WHERE job_id = ANY($1::bigint[])", ids)
	b.Queue("INSERT INTO "+j.ledger+" SELECT unnest(@ids::bigint[]), @note", pgx.NamedArgs{"ids": ids, "note": "cleared"})
	return nil
}

// TestTablesSweepRowsAndWhatDependsOnThem sweeps a jobs table through
// Tables, in runs and in batches of pages: every expired job goes with
// its artifacts, in one commit each (the ledger), and the unexpired and
// running jobs stay with theirs.
func TestTablesSweepRowsAndWhatDependsOnThem(t *testing.T) {
	for _, tc := range []struct {
		name        string
		concurrency int // 1 clears in runs; 2 in batches of pages
	}{
		{"runs", 1},
		{"batches", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := newTableOfJobs(t, connect(t))
			s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(j.clearArtifacts)), retention.Config{
				Prefix: "jobs/", Retention: time.Hour, BatchSize: 7, PageSize: 7, Concurrency: tc.concurrency,
			})
			require.NoError(t, err)
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, len(j.expired), st.Cleared)

			kept := append(append([]int64{}, j.unexpired...), j.active...)
			assert.Equal(t, kept, j.ids(t, "SELECT id FROM "+j.jobs+" ORDER BY id"))
			assert.Equal(t, kept, j.ids(t, "SELECT DISTINCT job_id FROM "+j.artifacts+" ORDER BY job_id"))
			assert.Equal(t, j.expired, j.ids(t, "SELECT job_id FROM "+j.ledger+" WHERE note = 'cleared' ORDER BY job_id"),
				"each expired job in the ledger once")
		})
	}
}

// TestTableClearRefusesAndRollsBack: a ClearFunc that fails, a statement
// that fails and a statement with a result callback each fail the clear
// with an error saying so, and the transaction rolls back: the rows, their
// artifacts and the markers all stay.
func TestTableClearRefusesAndRollsBack(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name  string
		clear func(j *tableOfJobs) pgkv.ClearFunc
		want  func(t *testing.T, err error)
	}{
		{"the clear fails", func(*tableOfJobs) pgkv.ClearFunc {
			return func(context.Context, *pgx.Batch, []string) error { return boom }
		}, func(t *testing.T, err error) { assert.ErrorIs(t, err, boom) }},
		{"a statement fails", func(j *tableOfJobs) pgkv.ClearFunc {
			return func(_ context.Context, b *pgx.Batch, ids []string) error {
				b.Queue("DELETE FROM "+j.artifacts+" WHERE job_id = ANY($1::bigint[])", ids)
				b.Queue("INSERT INTO " + j.ledger + " VALUES (1, NULL)") // note is NOT NULL
				return nil
			}
		}, func(t *testing.T, err error) { assert.ErrorContains(t, err, "statement 2") }},
		{"a statement has a result callback", func(j *tableOfJobs) pgkv.ClearFunc {
			return func(_ context.Context, b *pgx.Batch, ids []string) error {
				b.Queue("DELETE FROM "+j.artifacts+" WHERE job_id = ANY($1::bigint[])", ids).Exec(func(pgconn.CommandTag) error { return nil })
				return nil
			}
		}, func(t *testing.T, err error) { assert.ErrorContains(t, err, "result callback") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			j := newTableOfJobs(t, connect(t))
			tkv := j.table(t)
			akv := tkv.WithClear(pgkv.TableClear(tc.clear(j)))
			keys, err := tkv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 100)
			require.NoError(t, err)
			require.Len(t, keys, len(j.expired)+len(j.unexpired))
			ids := make([]string, 3)
			for i := range ids {
				_, id, err := retention.ParseMarkerKey("jobs/", keys[i])
				require.NoError(t, err)
				ids[i] = string(id)
			}
			tc.want(t, akv.ClearAndDelete(ctx, ids, keys[:3]))

			after, err := tkv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 100)
			require.NoError(t, err)
			assert.Equal(t, keys, after, "every marker stays")
			assert.Len(t, j.ids(t, "SELECT id FROM "+j.jobs), 30, "every job stays")
			assert.Len(t, j.ids(t, "SELECT job_id FROM "+j.artifacts), 60, "every artifact stays")
			assert.Empty(t, j.ids(t, "SELECT job_id FROM "+j.ledger))
		})
	}
}

// TestTablesLockerFencesItsTables: a sweep under a lease of its Tables'
// NewLocker clears; under a lease of another handle's Locker (another
// Tables of the same pool) its writes cannot be fenced, and the pass
// fails with retention.ErrUnfenced, having deleted nothing.
func TestTablesLockerFencesItsTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := connect(t)
	j := newTableOfJobs(t, pool)
	leases := freshLeases(t, pool)
	other, err := pgkv.NewTables(pool, "other_side", nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, other.Close()) })

	sweepUnder := func(tables *pgkv.Tables) (retention.Stats, error) {
		locker, err := tables.NewLocker("jobs", &pgkv.LockerOptions{Table: leases, TTL: time.Second})
		require.NoError(t, err)
		s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(j.clearArtifacts)), retention.Config{
			Prefix: "jobs/", Retention: time.Hour, Lease: locker,
		})
		require.NoError(t, err)
		return s.LeasedPass(ctx)
	}
	_, err = sweepUnder(other)
	require.ErrorIs(t, err, retention.ErrUnfenced)
	assert.Len(t, j.ids(t, "SELECT id FROM "+j.jobs), 30, "nothing deleted")

	st, err := sweepUnder(j.tables)
	require.NoError(t, err)
	assert.Equal(t, len(j.expired), st.Cleared)
	assert.Len(t, j.ids(t, "SELECT id FROM "+j.jobs), 10)
}

// TestNewTablesRefusesBadInput: a nil pool and an empty side table name
// are refused, naming what is wrong.
func TestNewTablesRefusesBadInput(t *testing.T) {
	_, err := pgkv.NewTables(nil, "side", nil)
	assert.ErrorContains(t, err, "pool must not be nil")
	_, err = pgkv.NewTables(connect(t), "", nil)
	assert.ErrorIs(t, err, sqlkv.ErrInvalidTable)
	assert.ErrorContains(t, err, "side table")
}

// freshLeases returns a new lease table made by pgkv.MigrateLeases.
func freshLeases(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	leases := fmt.Sprintf("leases_%d_%d", os.Getpid(), tableSeq.Add(1))
	require.NoError(t, pgkv.MigrateLeases(context.Background(), pool, leases))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+leases) })
	return leases
}

// TestTablesNewLockerRefusesBadOptions: a TTL too short is refused,
// naming pgkv's LockerOptions field; a lease table MigrateLeases did not
// make fails TryAcquire with an error matching sqlkv.ErrNoLeaseTable, as
// NewLocker's doc says.
func TestTablesNewLockerRefusesBadOptions(t *testing.T) {
	t.Parallel()
	pool := connect(t)
	j := newTableOfJobs(t, pool)

	_, err := j.tables.NewLocker("jobs", &pgkv.LockerOptions{TTL: time.Millisecond})
	assert.ErrorContains(t, err, "pgkv: LockerOptions.TTL must be at least")

	missing := fmt.Sprintf("no_leases_%d_%d", os.Getpid(), tableSeq.Add(1))
	l, err := j.tables.NewLocker("jobs", &pgkv.LockerOptions{Table: missing})
	require.NoError(t, err)
	_, err = l.TryAcquire(context.Background())
	assert.ErrorIs(t, err, sqlkv.ErrNoLeaseTable)
}

// TestTablesLockerSharesLeasesWithPgkvLocker: a fleet part on
// pgkv.NewLocker, part on Tables.NewLocker (mid-upgrade), over one lease
// table of pgkv.MigrateLeases: one lease, one holder at a time, and the
// fence grows across both. A nil opts is the defaults (the lease table
// DefaultLeaseTable, the TTL DefaultLeaseTTL).
func TestTablesLockerSharesLeasesWithPgkvLocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := connect(t)
	j := newTableOfJobs(t, pool)
	leases := freshLeases(t, pool)
	name := "shared_" + leases

	tl, err := j.tables.NewLocker(name, &pgkv.LockerOptions{Table: leases})
	require.NoError(t, err)
	pl, err := pgkv.NewLocker(pool, name, &pgkv.LockerOptions{Table: leases})
	require.NoError(t, err)
	fence := func() int64 {
		var f int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT fence FROM "+leases+" WHERE name = $1", name).Scan(&f))
		return f
	}

	a, err := tl.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = pl.TryAcquire(ctx)
	assert.ErrorIs(t, err, retention.ErrLeaseHeld, "pgkv's TryAcquire() under a Tables lease")
	require.NoError(t, a.Release(ctx))
	b, err := pl.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = tl.TryAcquire(ctx)
	assert.ErrorIs(t, err, retention.ErrLeaseHeld, "Tables' TryAcquire() under a pgkv lease")
	require.NoError(t, b.Release(ctx))
	assert.Equal(t, int64(2), fence())

	// nil opts: the defaults.
	require.NoError(t, pgkv.MigrateLeases(ctx, pool, pgkv.DefaultLeaseTable))
	dl, err := j.tables.NewLocker(name, nil)
	require.NoError(t, err)
	d, err := dl.TryAcquire(ctx)
	require.NoError(t, err)
	var left time.Duration
	require.NoError(t, pool.QueryRow(ctx, "SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1e6)::bigint * 1000 FROM "+
		pgkv.DefaultLeaseTable+" WHERE name = $1", name).Scan(&left))
	assert.InDelta(t, pgkv.DefaultLeaseTTL.Seconds(), left.Seconds(), 1, "the default TTL")
	require.NoError(t, d.Release(ctx))
}

// TestTablesLeaseLostMidClearCommitsNothing: a takeover while a call's
// ClearFunc runs (inside the rows' transaction) fails the pass with
// ErrLeaseLost, and that call commits nothing: no job goes without its
// artifacts, and none after the takeover.
func TestTablesLeaseLostMidClearCommitsNothing(t *testing.T) {
	for _, concurrency := range []int{1, 2} {
		t.Run(fmt.Sprint("concurrency ", concurrency), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := connect(t)
			j := newTableOfJobs(t, pool)
			leases := freshLeases(t, pool)
			locker, err := j.tables.NewLocker("jobs", &pgkv.LockerOptions{Table: leases, TTL: 2 * time.Second})
			require.NoError(t, err)
			var calls atomic.Int32
			clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
				if calls.Add(1) == 2 {
					// Another replica takes the lease over: the row names it now.
					_, err := pool.Exec(ctx, "UPDATE "+leases+" SET holder = 'thief', fence = fence + 1, expires_at = clock_timestamp() + interval '1 hour'")
					if err != nil {
						return err
					}
				}
				return j.clearArtifacts(ctx, b, ids)
			}
			s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
				Prefix: "jobs/", Retention: time.Hour, BatchSize: 5, PageSize: 5, Concurrency: concurrency, Lease: locker,
			})
			require.NoError(t, err)
			st, err := s.LeasedPass(ctx)
			t.Logf("LeasedPass() = %+v, %v", st, err)
			assert.ErrorIs(t, err, retention.ErrLeaseLost)
			j.noOrphans(t)
			gone := 30 - len(j.ids(t, "SELECT id FROM "+j.jobs))
			assert.LessOrEqual(t, gone, 5*concurrency, "jobs cleared: the first call's, and with 2 calls at a time one more at most")
			assert.Equal(t, gone, st.Cleared, "Stats.Cleared")
		})
	}
}

// TestTablesCloseLeavesThePool: Close twice is fine, the pool stays open
// and holds no connection of the closed handle; closing while a pass runs
// commits or rolls back each call whole, and the pass ends with an error.
func TestTablesCloseLeavesThePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := connect(t)
	j := newTableOfJobs(t, pool)
	tables, err := pgkv.NewTables(pool, j.side, nil)
	require.NoError(t, err)
	tkv, err := tables.Table(ctx, j.spec())
	require.NoError(t, err)

	inClear := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
		once.Do(func() {
			close(inClear)
			<-release
		})
		return j.clearArtifacts(ctx, b, ids)
	}
	s, err := retention.New(tkv.WithClear(pgkv.TableClear(clear)), retention.Config{
		Prefix: "jobs/", Retention: time.Hour, BatchSize: 5, PageSize: 5, Concurrency: 2,
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	var st retention.Stats
	go func() {
		var err error
		st, err = s.Pass(ctx)
		done <- err
	}()
	<-inClear
	require.NoError(t, tables.Close())
	close(release)
	err = <-done
	t.Logf("Pass() = %+v, %v", st, err)
	assert.Error(t, err, "a pass over a closed handle")
	j.noOrphans(t)

	assert.NoError(t, tables.Close(), "Close again")
	assert.NoError(t, pool.Ping(ctx), "the pool after Close")
	assert.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond,
		"pool connections left acquired")
}

// TestTablesFencedClearIdleEndsWithTheTTL: under a lease of
// Tables.NewLocker, a ClearFunc that stalls in Go (a frozen client, as
// far as the server can tell) inside the rows' transaction longer than
// the TTL has its session ended by the server
// (idle_in_transaction_session_timeout), and its call commits nothing.
func TestTablesFencedClearIdleEndsWithTheTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := connect(t)
	j := newTableOfJobs(t, pool)
	leases := freshLeases(t, pool)
	locker, err := j.tables.NewLocker("jobs", &pgkv.LockerOptions{Table: leases, TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	var once sync.Once
	stalled := false
	clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
		once.Do(func() {
			stalled = true
			time.Sleep(time.Second) // ignores ctx, as a frozen process would
		})
		return j.clearArtifacts(ctx, b, ids)
	}
	s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
		Prefix: "jobs/", Retention: time.Hour, BatchSize: 5, PageSize: 5, Lease: locker,
	})
	require.NoError(t, err)
	st, err := s.LeasedPass(ctx)
	t.Logf("LeasedPass() = %+v, %v", st, err)
	require.True(t, stalled)
	j.noOrphans(t)
}
