package pgkv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	pool                       *pgxpool.Pool
	tables                     *pgkv.Tables
	jobs, artifacts, ledger    string
	expired, unexpired, active []int64
}

// newTableOfJobs creates the tables, with 20 jobs done two hours ago, 5 done
// just now and 5 running, each with two artifacts.
func newTableOfJobs(t *testing.T, pool *pgxpool.Pool) *tableOfJobs {
	t.Helper()
	ctx := context.Background()
	side := freshTable(t, pool) // a name of its own; Tables.Migrate makes the side table
	_, err := pool.Exec(ctx, "DROP TABLE "+side)
	require.NoError(t, err)
	j := &tableOfJobs{pool: pool, jobs: side + "_jobs", artifacts: side + "_artifacts", ledger: side + "_ledger"}
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
	j.tables, err = pgkv.NewTables(pool, side)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, j.tables.Close()) })
	require.NoError(t, j.tables.Migrate(ctx))
	require.NoError(t, j.tables.Migrate(ctx), "Migrate again")
	return j
}

// table is the jobs table as the markers of the prefix "jobs/".
func (j *tableOfJobs) table(t *testing.T) *sqlkv.TableKV {
	t.Helper()
	tkv, err := j.tables.Table(context.Background(), sqlkv.Table{Name: j.jobs, ID: "id", Time: "finished_at", Filter: "state = 'done'", Prefix: "jobs/"})
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
	leases := fmt.Sprintf("leases_%d_%d", os.Getpid(), tableSeq.Add(1))
	require.NoError(t, pgkv.MigrateLeases(ctx, pool, leases))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+leases) })
	other, err := pgkv.NewTables(pool, "other_side")
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
	_, err := pgkv.NewTables(nil, "side")
	assert.ErrorContains(t, err, "pool must not be nil")
	_, err = pgkv.NewTables(connect(t), "")
	assert.ErrorIs(t, err, sqlkv.ErrInvalidTable)
	assert.ErrorContains(t, err, "side table")
}
