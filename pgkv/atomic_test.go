package pgkv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// newJobsKV returns a KV over a fresh marker table beside a jobs table,
// and an AtomicKV of WithClear that deletes a batch's jobs.
func newJobsKV(t testing.TB, pool *pgxpool.Pool) (kv *pgkv.KV, akv *pgkv.AtomicKV, markers, jobs string) {
	t.Helper()
	markers = freshTable(t, pool)
	jobs, _ = jobsTable(t, pool, markers)
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err = kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		return nil
	})
	require.NoError(t, err)
	return kv, akv, markers, jobs
}

// jobsTable creates a table of entities next to the marker table, with a
// child table whose rows pin a job (a foreign key without cascade).
func jobsTable(t testing.TB, pool *pgxpool.Pool, markers string) (jobs, pins string) {
	t.Helper()
	jobs, pins = markers+"_jobs", markers+"_pins"
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id text PRIMARY KEY);
CREATE TABLE %s (job text REFERENCES %s (id))`, jobs, pins, jobs))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pins+", "+jobs) })
	return jobs, pins
}

// deleteJobs is the ClearFunc of a jobs table of jobsTable: it deletes the
// batch's jobs by id.
func deleteJobs(jobs string) pgkv.ClearFunc {
	return func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[])", ids)
		return nil
	}
}

// finishJobs writes n jobs and their markers, each pair in one transaction.
func finishJobs(t testing.TB, pool *pgxpool.Pool, kv *pgkv.KV, jobs string, n int, at time.Time) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	batch := &pgx.Batch{}
	for i := range n {
		id := fmt.Sprintf("j%05d", i)
		ids = append(ids, id)
		batch.Queue("INSERT INTO "+jobs+" (id) VALUES ($1)", id)
		key, err := retention.MarkerKey("jobs/done/", at.Add(time.Duration(i)*time.Millisecond), id)
		require.NoError(t, err)
		require.NoError(t, kv.Put(ctx, key, nil))
	}
	require.NoError(t, pool.SendBatch(ctx, batch).Close())
	return ids
}

func count(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// TestAtomicClear: entities and markers go in one transaction per batch; a
// job pinned by a foreign key fails its batch, which the sweep bisects down
// to that job, leaving both its row and its marker, and nothing half done.
func TestAtomicClear(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, pins := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	var mu sync.Mutex
	calls := 0
	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		mu.Lock()
		calls++
		mu.Unlock()
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		return nil
	})
	require.NoError(t, err)
	now := time.Now()
	finishJobs(t, pool, kv, jobs, 1000, now.Add(-2*time.Hour))
	_, err = pool.Exec(ctx, "INSERT INTO "+pins+" (job) VALUES ('j00421')")
	require.NoError(t, err)

	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, PageSize: 500, BatchSize: 100,
		Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 999, st.Cleared)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, count(t, pool, jobs), "only the pinned job is left")
	assert.Equal(t, 1, count(t, pool, markers), "and its marker, rescheduled")
	assert.Zero(t, st.DeleteCalls, "the batches deleted their markers")
	assert.Equal(t, 1, st.PutCalls, "the sweep moved the pinned job's marker in one step")
	assert.LessOrEqual(t, calls, 10+2*7, "10 batches and the bisection of one")
}

// TestAtomicClearRollsBack: when any statement of the batch fails, neither
// the entities nor the markers go.
func TestAtomicClearRollsBack(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		b.Queue("SELECT 1 / 0") // a later statement fails
		return nil
	})
	require.NoError(t, err)
	ids := finishJobs(t, pool, kv, jobs, 5, time.Now().Add(-2*time.Hour))
	keys, err := kv.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 10)
	require.NoError(t, err)
	require.Error(t, akv.ClearAndDelete(ctx, ids, keys))
	assert.Equal(t, 5, count(t, pool, jobs))
	assert.Equal(t, 5, count(t, pool, markers))

	_, err = kv.WithClear(nil)
	require.Error(t, err)
}

// TestFencedAtomicClear: under a lease, the marker deletion checks the
// lease in the same transaction; once the lease is taken from outside, a
// clear by the old holder changes nothing and reports the loss.
func TestFencedAtomicClear(t *testing.T) {
	pool := connect(t)
	kv, akv, markers, jobs := newJobsKV(t, pool)
	leases := freshLeaseTable(t, pool)
	ctx := context.Background()
	ids := finishJobs(t, pool, kv, jobs, 10, time.Now().Add(-2*time.Hour))
	keys, err := kv.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 10)
	require.NoError(t, err)

	locker, err := pgkv.NewLocker(pool, "atomic", &pgkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, ok := lease.(retention.Fencer).Fence(akv)
	require.True(t, ok)
	fenced, ok := view.(retention.ClearDeleter)
	require.True(t, ok, "the fenced view of an AtomicKV still clears atomically")

	require.NoError(t, fenced.ClearAndDelete(ctx, ids[:5], keys[:5]), "while the lease is held")
	assert.Equal(t, 5, count(t, pool, jobs))
	assert.Equal(t, 5, count(t, pool, markers))

	// Taken from outside, the holder not told: nothing more is cleared.
	_, err = pool.Exec(ctx, "UPDATE "+leases+" SET holder = 'thief', fence = fence + 1 WHERE name = 'atomic'")
	require.NoError(t, err)
	err = fenced.ClearAndDelete(ctx, ids[5:], keys[5:])
	require.ErrorIs(t, err, retention.ErrLeaseLost)
	assert.Equal(t, 5, count(t, pool, jobs), "the entities stay")
	assert.Equal(t, 5, count(t, pool, markers), "and their markers")
	select {
	case <-lease.Lost():
	default:
		t.Error("Lost is open after a refused clear")
	}
}

// TestAtomicClearFuncStatementsWithQuotesAndSemicolons: the ClearFunc's statements, joined into one
// simple-protocol query, with comments, dollar quotes, E” strings and
// NamedArgs, clear exactly the batch.
func TestAtomicClearFuncStatementsWithQuotesAndSemicolons(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE TABLE "+jobs+"_log (id text, note text)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs+"_log") })
	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[]) -- $2 in a comment", ids)
		b.Queue("/* $1 /* nested $2 */ still $3 */ INSERT INTO "+jobs+"_log SELECT unnest($1::text[]), $$it's $1 $$ || E'\\' $2' || $tag$ $1 $tag$ || $2", ids, "x")
		b.Queue("INSERT INTO "+jobs+"_log SELECT unnest(@ids::text[]), @note", pgx.NamedArgs{"ids": ids, "note": "n'amed"})
		return nil
	})
	require.NoError(t, err)
	ids := finishJobs(t, pool, kv, jobs, 5, time.Now().Add(-2*time.Hour))
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, st.Cleared, "stats %+v", st)
	assert.Equal(t, 0, count(t, pool, jobs))
	assert.Equal(t, 10, count(t, pool, jobs+"_log"))
	var note string
	require.NoError(t, pool.QueryRow(ctx, "SELECT note FROM "+jobs+"_log WHERE note <> 'n''amed' LIMIT 1").Scan(&note))
	assert.Equal(t, "it's $1 ' $2 $1 x", note)
	_ = ids
}

// TestAtomicBigBatch: one ClearAndDelete of many keys (one
// simple-protocol message; its markers go as a range).
func TestAtomicBigBatch(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(deleteJobs(jobs))
	require.NoError(t, err)
	const n = 65536
	_, err = pool.Exec(ctx, fmt.Sprintf("INSERT INTO %s SELECT 'j' || lpad(g::text, 6, '0') FROM generate_series(0, %d) g", jobs, n-1))
	require.NoError(t, err)
	var keys [][]byte
	at := time.Now().Add(-2 * time.Hour)
	for i := range n {
		k, err := retention.MarkerKey("jobs/done/", at.Add(time.Duration(i)*time.Microsecond), fmt.Sprintf("j%06d", i))
		require.NoError(t, err)
		keys = append(keys, k)
	}
	_, err = pool.Exec(ctx, "INSERT INTO "+markers+" SELECT unnest($1::bytea[])", keys)
	require.NoError(t, err)
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, PageSize: n, BatchSize: n})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, st.Cleared, "stats %+v", st)
	assert.Equal(t, 0, count(t, pool, jobs))
}

// TestAtomicIDsOfACustomRule: ids a custom ValidateID allows, sent through
// the simple protocol (client-side interpolation of a text[]), reach the
// ClearFunc's statement unchanged.
func TestAtomicIDsOfACustomRule(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(deleteJobs(jobs))
	require.NoError(t, err)
	ids := []string{`a"b`, `c\d`, `NULL`, ` sp `, `{x}`, `a,b`, `é`, `'q'`, `$1`, `--c`, `e'\'`}
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour,
		ValidateID: func(string) error { return nil }})
	require.NoError(t, err)
	at := time.Now().Add(-2 * time.Hour)
	for _, id := range ids {
		_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (id) VALUES ($1)", id)
		require.NoError(t, err)
		key, err := s.MarkerKey(at, id)
		require.NoError(t, err)
		require.NoError(t, kv.Put(ctx, key, nil))
	}
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, len(ids), st.Cleared, "stats %+v", st)
	assert.Equal(t, 0, count(t, pool, jobs), "every job deleted")
}

// deleteJobsSQL is the WithClearSQL statement of a jobs table of
// jobsTable.
func deleteJobsSQL(jobs string) string {
	return "DELETE FROM " + jobs + " WHERE id = ANY($1)"
}

// newRunKV returns a KV over a fresh marker table, its jobs table (see
// jobsTable) and an AtomicKV whose clear is deleteJobsSQL.
func newRunKV(t testing.TB, pool *pgxpool.Pool) (kv *pgkv.KV, akv *pgkv.AtomicKV, markers, jobs, pins string) {
	t.Helper()
	return newRunKVOf(t, pool, deleteJobsSQL)
}

// newRunKVOf is newRunKV with the clear statement stmt(jobs).
func newRunKVOf(t testing.TB, pool *pgxpool.Pool, stmt func(jobs string) string) (kv *pgkv.KV, akv *pgkv.AtomicKV, markers, jobs, pins string) {
	t.Helper()
	markers = freshTable(t, pool)
	jobs, pins = jobsTable(t, pool, markers)
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err = kv.WithClearSQL(stmt(jobs))
	require.NoError(t, err)
	return kv, akv, markers, jobs, pins
}

// runForms are clear statements of the two forms a run takes (see
// WithClearSQL), each deleting the jobs of $1 of a jobs table of
// jobsTable, and failing should $1 hold an id the default rule refuses:
// a DELETE, a CTE of the run statement, and a chain of CTEs, a statement
// after it.
var runForms = []struct {
	name string
	stmt func(jobs string) string
}{
	{"inline", func(jobs string) string {
		return "DELETE FROM " + jobs + " WHERE id = ANY($1) AND " + noBadID
	}},
	{"after", func(jobs string) string {
		return "WITH g AS (SELECT unnest($1) AS id WHERE " + noBadID + ") DELETE FROM " + jobs + " j USING g WHERE j.id = g.id"
	}},
}

// noBadID is a condition that holds unless $1 holds an id the default
// rule refuses, which fails the statement.
const noBadID = `(SELECT count(*) FROM unnest($1) AS x WHERE CASE WHEN x ~ '^[-0-9A-Za-z_]{1,128}$' THEN false ELSE ('a bad id reached the clear: ' || x)::int > 0 END) = 0`

// expiredEnd is the end of the range of markers of "jobs/done/" expired an
// hour before now.
func expiredEnd(now time.Time) []byte {
	return fmt.Appendf([]byte("jobs/done/"), "%0*d", retention.TimestampWidth, now.Add(-time.Hour).UnixMilli())
}

// TestRunsClearTheBacklog: over an AtomicKV of WithClearSQL the sweep
// clears the expired range in runs the database picks, one call each,
// and never scans it: its Scans are the key past the range and the retry
// range's. The unexpired markers and their jobs stay.
func TestRunsClearTheBacklog(t *testing.T) {
	for _, form := range runForms {
		t.Run(form.name, func(t *testing.T) { testRunsClearTheBacklog(t, form.stmt) })
	}
}

func testRunsClearTheBacklog(t *testing.T, stmt func(string) string) {
	pool := connect(t)
	kv, akv, markers, jobs, _ := newRunKVOf(t, pool, stmt)
	ctx := context.Background()
	now := time.Now()
	finishJobs(t, pool, kv, jobs, 2500, now.Add(-2*time.Hour))
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" VALUES ('late')")
	require.NoError(t, err)
	require.NoError(t, kv.MarkTx(ctx, pool, "jobs/done/", "late", now))

	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, BatchSize: 1000, PageSize: 1000,
		Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2500, st.Cleared)
	assert.Equal(t, 3, st.ClearCalls, "runs of 1000, 1000 and 500")
	assert.Equal(t, 2, st.ScanCalls, "the key past the expired range and the retry range")
	assert.Zero(t, st.DeleteCalls)
	assert.Equal(t, 1, count(t, pool, jobs), "only the unexpired job is left")
	assert.Equal(t, 1, count(t, pool, markers), "and its marker")
}

// TestRunReturnsItsKeys: ClearRun takes the first limit keys of the
// range, and returns them as they were, ascending, whatever bytes they
// share: markers at the edges of the rule (an id of 128 bytes, the epoch,
// MaxMarkerTime) included, and a prefix that is no text.
func TestRunReturnsItsKeys(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	for _, prefix := range []string{"jobs/done/", "\xff,'\x00/"} {
		kv, akv, markers, jobs, _ := newRunKV(t, pool)
		var want [][]byte
		for i, tc := range []struct {
			at time.Time
			id string
		}{
			{time.UnixMilli(0), "epoch"},
			{time.UnixMilli(1), strings.Repeat("x", retention.MaxIDLen)},
			{time.UnixMilli(1_700_000_000_000), "a"},
			{time.UnixMilli(1_700_000_000_000), "b"},
			{time.UnixMilli(1_700_000_000_001), "A-z_09"},
			{time.UnixMilli(1_700_000_000_999), "c"},
			{retention.MaxMarkerTime, "last"},
		} {
			key, err := retention.MarkerKey(prefix, tc.at, tc.id)
			require.NoError(t, err, "marker %d", i)
			require.NoError(t, kv.Put(ctx, key, nil))
			_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" VALUES ($1) ON CONFLICT DO NOTHING", tc.id)
			require.NoError(t, err)
			want = append(want, key)
		}
		end := []byte(prefix + ":")
		for _, limit := range []int{1, 2, 3} {
			keys, err := akv.ClearRun(ctx, prefix, []byte(prefix), end, limit)
			require.NoError(t, err, "prefix %q, limit %d", prefix, limit)
			assert.Equal(t, want[:limit], keys, "prefix %q, limit %d", prefix, limit)
			want = want[limit:]
		}
		keys, err := akv.ClearRun(ctx, prefix, []byte(prefix), end, 100)
		require.NoError(t, err)
		assert.Equal(t, want, keys, "prefix %q, the rest", prefix)
		keys, err = akv.ClearRun(ctx, prefix, []byte(prefix), end, 100)
		require.NoError(t, err)
		assert.Empty(t, keys, "prefix %q, an empty range", prefix)
		assert.Zero(t, count(t, pool, markers))
		assert.Zero(t, count(t, pool, jobs))
	}
}

// TestStatementsArePreparedOncePerPooledConnection: over a pool, the
// statement of a run, and those that delete a batch's markers (by range,
// key by key), are each prepared on a connection the first time they run
// there, and executed from then on; a connection that lost them
// (DEALLOCATE, DISCARD ALL) prepares them again. Over a connection or a
// transaction, whose state the AtomicKV cannot know, they go as text and
// prepare nothing. Either way every call clears what it names.
func TestStatementsArePreparedOncePerPooledConnection(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		db   func(t *testing.T, pool *pgxpool.Pool) (rowDB, func())
		want int // of the statements a kind prepares on the connection, 0 or 1
	}{
		{"pool", func(t *testing.T, pool *pgxpool.Pool) (rowDB, func()) { return pool, func() {} }, 1},
		{"conn", func(t *testing.T, pool *pgxpool.Pool) (rowDB, func()) {
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			return conn.Conn(), conn.Release
		}, 0},
		{"tx", func(t *testing.T, pool *pgxpool.Pool) (rowDB, func()) {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			return tx, func() { require.NoError(t, tx.Commit(ctx)) }
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := connect(t)
			pool := poolOf(t, 1)
			writer, _, _, jobs, _ := newRunKV(t, admin)
			markers := strings.TrimSuffix(jobs, "_jobs")
			finishJobs(t, admin, writer, jobs, 29, time.Now().Add(-2*time.Hour))

			db, done := tc.db(t, pool)
			kv, err := pgkv.New(db, markers)
			require.NoError(t, err)
			akv, err := kv.WithClearSQL(deleteJobsSQL(jobs))
			require.NoError(t, err)
			prepared := func() (n int, at time.Time) {
				t.Helper()
				require.NoError(t, db.QueryRow(ctx, `SELECT count(*), coalesce(min(prepare_time), 'epoch') FROM pg_prepared_statements
					WHERE name LIKE 'pgkv_%' AND statement LIKE '%' || $1 || '%'`, pgx.QueryExecModeSimpleProtocol, markers).Scan(&n, &at))
				return n, at
			}
			run := func(limit int) int {
				t.Helper()
				keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), limit)
				require.NoError(t, err)
				return len(keys)
			}

			assert.Equal(t, 10, run(10))
			n, first := prepared()
			assert.Equal(t, tc.want, n, "prepared after one run")
			assert.Equal(t, 10, run(10))
			n, again := prepared()
			assert.Equal(t, tc.want, n, "prepared after two runs")
			assert.Equal(t, first, again, "prepared once")
			if tc.want > 0 {
				_, err := db.Exec(ctx, "DISCARD ALL", pgx.QueryExecModeSimpleProtocol)
				require.NoError(t, err)
				n, _ = prepared()
				require.Zero(t, n, "DISCARD ALL drops it")
			}
			assert.Equal(t, 5, run(5))
			n, _ = prepared()
			assert.Equal(t, tc.want, n, "prepared again after it was lost")

			clearTwoBatches(t, kv, akv, 4, func(batch int) {
				n, _ = prepared()
				assert.Equal(t, (2+batch)*tc.want, n, "prepared after batch %d (a range, then key by key)", batch)
			})
			done()
			assert.Zero(t, count(t, admin, markers))
			assert.Zero(t, count(t, admin, jobs))
		})
	}
}

// poolOf returns a pool of at most conns connections to the test server,
// closed when the test ends; of one, every call uses the same.
func poolOf(t testing.TB, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(kvtestDSN(t))
	require.NoError(t, err)
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestPreparedStatementsPerConnectionAreBounded: a connection keeps at
// most maxPrepared statements prepared, each holding server memory for
// its life; past that, statements of other tables go as text there, and
// those prepared go on being executed.
func TestPreparedStatementsPerConnectionAreBounded(t *testing.T) {
	ctx := context.Background()
	pgkv.SetMaxPrepared(t, 5)
	admin := connect(t)
	pool := poolOf(t, 1)
	prepared := func(table string) (n int, at time.Time) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(max(prepare_time), 'epoch') FROM pg_prepared_statements
			WHERE name LIKE 'pgkv_%' AND statement ~ ($1 || '[^0-9]')`, pgx.QueryExecModeSimpleProtocol, table).Scan(&n, &at))
		return n, at
	}
	run := func(akv *pgkv.AtomicKV, want int) {
		t.Helper()
		keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), 10)
		require.NoError(t, err)
		assert.Len(t, keys, want)
	}
	var tables []string
	var writers []*pgkv.KV
	var akvs []*pgkv.AtomicKV
	for range 3 {
		writer, _, _, jobs, _ := newRunKV(t, admin)
		markers := strings.TrimSuffix(jobs, "_jobs")
		tables, writers = append(tables, markers), append(writers, writer)
		finishJobs(t, admin, writer, jobs, 14, time.Now().Add(-2*time.Hour))
		kv, err := pgkv.New(pool, markers)
		require.NoError(t, err)
		akv, err := kv.WithClearSQL(deleteJobsSQL(jobs))
		require.NoError(t, err)
		akvs = append(akvs, akv)
		run(akv, 10)
		clearTwoBatches(t, kv, akv, 4, func(int) {})
		assert.Zero(t, count(t, admin, markers), "every marker of %s deleted", markers)
		assert.Zero(t, count(t, admin, jobs), "every job of %s cleared", jobs)
	}
	all, _ := prepared("")
	assert.Equal(t, 5, all, "prepared on the connection")
	first, at := prepared(tables[0])
	assert.Equal(t, 3, first, "the first table's run and its two batch statements")
	second, _ := prepared(tables[1])
	assert.Equal(t, 2, second, "what the bound left for the second table")
	third, _ := prepared(tables[2])
	assert.Zero(t, third, "the third table's statements went as text")

	// The first table's statements are still executed, not prepared again.
	finishJobs(t, admin, writers[0], tables[0]+"_jobs", 3, time.Now().Add(-2*time.Hour))
	run(akvs[0], 3)
	_, again := prepared(tables[0])
	assert.Equal(t, at, again, "prepared once")
	all, _ = prepared("")
	assert.Equal(t, 5, all)
}

// TestCallsBehindAPoolerThatForgetsPreparedStatements: behind a pooler
// that gives each transaction another server connection (PgBouncer in
// transaction mode), an EXECUTE may find no prepared statement however
// often it is prepared; runs and batches then go as text, and clear what
// they name.
func TestCallsBehindAPoolerThatForgetsPreparedStatements(t *testing.T) {
	ctx := context.Background()
	r := newProxiedRun(t, 27, func(_ *pgxpool.Config, proxy *cutProxy) { proxy.forgetPrepared() })
	admin, markers, jobs, kv, akv, proxy := r.admin, r.markers, r.jobs, r.kv, r.akv, r.proxy

	for _, want := range []int{10, 10} {
		keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), 10)
		require.NoError(t, err)
		assert.Len(t, keys, want)
	}
	clearTwoBatches(t, kv, akv, 7, func(int) {})
	keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), 10)
	require.NoError(t, err)
	assert.Empty(t, keys)
	assert.Equal(t, []string{"PREPARE", "EXECUTE", "WITH"}, proxy.queries()[:3],
		"the first call prepares, finds nothing prepared, and sends the text")
	assert.NotContains(t, proxy.queries()[3:], "PREPARE", "and no call prepares again")
	assert.Zero(t, count(t, admin, markers))
	assert.Zero(t, count(t, admin, jobs))
}

// proxiedRun is a marker table of expired jobs (see newRunKV), a KV and an
// AtomicKV of WithClearSQL over it through a pool whose connections go
// through a cutProxy that cuts nothing.
type proxiedRun struct {
	admin, pool   *pgxpool.Pool
	proxy         *cutProxy
	kv            *pgkv.KV
	akv           *pgkv.AtomicKV
	markers, jobs string
}

// newProxiedRun returns a proxiedRun of n jobs; tune adjusts the pool's
// configuration and the proxy first.
func newProxiedRun(t *testing.T, n int, tune func(*pgxpool.Config, *cutProxy)) proxiedRun {
	t.Helper()
	var r proxiedRun
	r.admin = connect(t)
	writer, _, markers, jobs, _ := newRunKV(t, r.admin)
	r.markers, r.jobs = markers, jobs
	finishJobs(t, r.admin, writer, jobs, n, time.Now().Add(-2*time.Hour))
	cfg, proxy := proxied(t, "never cut")
	tune(cfg, proxy)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r.pool, r.proxy = pool, proxy
	r.kv, err = pgkv.New(pool, markers)
	require.NoError(t, err)
	r.akv, err = r.kv.WithClearSQL(deleteJobsSQL(jobs))
	require.NoError(t, err)
	return r
}

// clearTwoBatches clears the n markers left under jobs/done/ through akv's
// ClearAndDelete in two batches, the first half a range of the table, the
// rest key by key (out of order), calling after with 0, then 1.
func clearTwoBatches(t *testing.T, kv *pgkv.KV, akv *pgkv.AtomicKV, n int, after func(batch int)) {
	t.Helper()
	ctx := context.Background()
	keys, ids := doneMarkers(t, kv, n)
	require.NoError(t, akv.ClearAndDelete(ctx, ids[:n/2], keys[:n/2]), "a range")
	after(0)
	rest := slices.Clone(keys[n/2:])
	slices.Reverse(rest)
	require.NoError(t, akv.ClearAndDelete(ctx, ids[n/2:], rest), "keys out of order")
	after(1)
}

// doneMarkers returns the n markers left under jobs/done/, ascending, and
// their ids; it fails the test when there are not n.
func doneMarkers(t *testing.T, kv *pgkv.KV, n int) (keys [][]byte, ids []string) {
	t.Helper()
	keys, err := kv.Scan(context.Background(), []byte("jobs/done/0"), []byte("jobs/done:"), n+1)
	require.NoError(t, err)
	require.Len(t, keys, n)
	ids = make([]string, n)
	for i, k := range keys {
		ids[i] = string(k[bytes.LastIndexByte(k, '/')+1:])
	}
	return keys, ids
}

// TestAConnectionPreparesBeforeItsFirstExecute: a pooled connection
// remembers what it prepared, so its first call prepares first rather
// than send an EXECUTE the server refuses (an ERROR in its log); when the
// server forgot (DISCARD ALL), the refused EXECUTE makes it prepare again.
// Another session's statement of the same name and text is used as is.
func TestAConnectionPreparesBeforeItsFirstExecute(t *testing.T) {
	ctx := context.Background()
	var cfg *pgxpool.Config
	r := newProxiedRun(t, 40, func(c *pgxpool.Config, _ *cutProxy) { c.MaxConns = 1; cfg = c })
	admin, markers, jobs, pool, akv, proxy := r.admin, r.markers, r.jobs, r.pool, r.akv, r.proxy
	run := func() {
		t.Helper()
		keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), 10)
		require.NoError(t, err)
		require.Len(t, keys, 10)
	}

	run()
	run()
	assert.Equal(t, []string{"PREPARE", "EXECUTE", "EXECUTE"}, proxy.queries())
	_, err := pool.Exec(ctx, "DISCARD ALL", pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	run()
	assert.Equal(t, []string{"PREPARE", "EXECUTE", "EXECUTE", "DISCARD", "EXECUTE", "PREPARE", "EXECUTE"}, proxy.queries())

	// A new connection on which the statement is already prepared, as a
	// pooler can give one: its PREPARE fails, and the EXECUTE goes.
	var prepare string
	require.NoError(t, pool.QueryRow(ctx, "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'pgkv_%'",
		pgx.QueryExecModeSimpleProtocol).Scan(&prepare))
	other, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Exec(ctx, prepare, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	kv, err := pgkv.New(other, markers)
	require.NoError(t, err)
	akv, err = kv.WithClearSQL(deleteJobsSQL(jobs))
	require.NoError(t, err)
	run()
	assert.Equal(t, []string{"PREPARE", "EXECUTE"}, proxy.queries()[len(proxy.queries())-2:])
	assert.Zero(t, count(t, admin, markers))
	assert.Zero(t, count(t, admin, jobs))
}

// TestAStatementOfTheCallersThatNamesNoPreparedStatementFailsOnce: a
// clear whose own statement fails for want of a prepared statement (a
// DEALLOCATE of one that does not exist) is not taken for the server
// having forgotten pgkv's: the call goes once, fails with that error and
// changes nothing, and the KV goes on executing what it prepared.
func TestAStatementOfTheCallersThatNamesNoPreparedStatementFailsOnce(t *testing.T) {
	ctx := context.Background()
	r := newProxiedRun(t, 4, func(c *pgxpool.Config, _ *cutProxy) { c.MaxConns = 1 })
	akv, err := r.kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+r.jobs+" WHERE id = ANY($1)", ids)
		b.Queue("DEALLOCATE not_pgkv_at_all")
		return nil
	})
	require.NoError(t, err)
	keys, ids := doneMarkers(t, r.kv, 4)

	err = akv.ClearAndDelete(ctx, ids, keys)
	require.ErrorContains(t, err, "not_pgkv_at_all")
	assert.Equal(t, []string{"PREPARE", "EXECUTE"}, r.proxy.queries(), "sent once, not again as if forgotten, nor as text")
	assert.Equal(t, 4, count(t, r.admin, r.markers), "nothing deleted")
	assert.Equal(t, 4, count(t, r.admin, r.jobs), "nothing cleared")

	got, err := r.akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), 10)
	require.NoError(t, err)
	assert.Len(t, got, 4)
	assert.Equal(t, []string{"PREPARE", "EXECUTE", "PREPARE", "EXECUTE"}, r.proxy.queries(), "still prepared")
	assert.Zero(t, count(t, r.admin, r.jobs))
}

// rowDB is a pgkv.DB that also reads one row: a pool, a connection or a
// transaction.
type rowDB interface {
	pgkv.DB
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TestRunRefusedForAKeyNotAMarker: a key of the run that is no marker of
// the prefix with an id of the default rule makes ClearRun change nothing
// and say so (retention.ErrMalformedMarker), wherever the key is in the
// run; a sweep then reads that page and clears the markers around it.
func TestRunRefusedForAKeyNotAMarker(t *testing.T) {
	pool := connect(t)
	at := time.Now().Add(-2 * time.Hour)
	stamp := fmt.Sprintf("%0*d", retention.TimestampWidth, at.UnixMilli())
	for _, tc := range []struct {
		name, suffix string
		malformed    bool // a marker the page path deletes, not a foreign key it leaves
	}{
		{"foreign shape", "0000000/not-a-marker", false},
		{"a colon in the timestamp", stamp[:retention.TimestampWidth-1] + ":/x", false},
		{"no slash", stamp + "0x", false},
		{"empty id", stamp + "/", false},
		{"a space in the id", stamp + "/a b", true},
		{"a NUL in the id", stamp + "/a\x00b", true},
		{"a backslash in the id", stamp + "/a\\b", true},
		{"a comma in the id", stamp + "/a," + stamp + "/b", true},
		{"a byte outside ASCII", stamp + "/\xe9", true},
		{"an id of 129 bytes", stamp + "/" + strings.Repeat("x", retention.MaxIDLen+1), true},
	} {
		for _, form := range runForms {
			t.Run(tc.name+"/"+form.name, func(t *testing.T) {
				testRunRefused(t, pool, form.stmt, []byte("jobs/done/"+tc.suffix), at, tc.malformed)
			})
		}
	}
}

// testRunRefused checks that a run refuses bad, a key of the range among
// 9 markers finished a millisecond apart around at, changing nothing (the
// clear statement fails should it see a bad id), and that the sweep then
// clears the markers by pages, deleting bad when it is a malformed marker,
// or leaving it.
func testRunRefused(t *testing.T, pool *pgxpool.Pool, stmt func(string) string, bad []byte, at time.Time, malformed bool) {
	ctx := context.Background()
	kv, akv, markers, jobs, _ := newRunKVOf(t, pool, stmt)
	now := time.Now()
	finishJobs(t, pool, kv, jobs, 9, at.Add(-4*time.Millisecond))
	_, err := pool.Exec(ctx, "INSERT INTO "+markers+" VALUES ($1)", bad)
	require.NoError(t, err)

	keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), expiredEnd(now), 100)
	require.ErrorIs(t, err, retention.ErrMalformedMarker)
	assert.Nil(t, keys)
	assert.Equal(t, 10, count(t, pool, markers), "nothing changed")
	assert.Equal(t, 9, count(t, pool, jobs), "nothing changed")

	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 9, st.Cleared, "stats %+v", st)
	assert.Zero(t, count(t, pool, jobs))
	if malformed {
		assert.Equal(t, 1, st.Malformed, "stats %+v", st)
		assert.Zero(t, count(t, pool, markers))
	} else {
		assert.Equal(t, 1, st.Foreign, "stats %+v", st)
		assert.Equal(t, 1, count(t, pool, markers), "the foreign key stays")
	}
}

// TestRunOfARangeBeyondThePrefix: keys of [from, end) outside the
// prefix's markers are not markers: a run that would take one is refused,
// and one that stops short of them clears.
func TestRunOfARangeBeyondThePrefix(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	kv, akv, markers, jobs, _ := newRunKV(t, pool)
	finishJobs(t, pool, kv, jobs, 3, time.Now().Add(-2*time.Hour))
	for _, key := range []string{"jobs/a", "jobs/done/" + strings.Repeat("9", retention.TimestampWidth) + "/late", "jobs/z"} {
		_, err := pool.Exec(ctx, "INSERT INTO "+markers+" VALUES ($1)", []byte(key))
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		name     string
		from, to string
		limit    int
	}{
		{"a key before the prefix", "jobs/", "jobs/done:", 100},
		{"a key past MaxMarkerTime", "jobs/done/", "jobs/done:", 100},
		{"a key past the prefix", "jobs/done/", "jobs/zz", 4},
	} {
		keys, err := akv.ClearRun(ctx, "jobs/done/", []byte(tc.from), []byte(tc.to), tc.limit)
		assert.ErrorIs(t, err, retention.ErrMalformedMarker, tc.name)
		assert.Nil(t, keys, tc.name)
		assert.Equal(t, 6, count(t, pool, markers), "%s: nothing changed", tc.name)
	}
	keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/"), []byte("jobs/zz"), 2)
	require.NoError(t, err, "the run stops short of what is past the prefix")
	assert.Len(t, keys, 2)
	assert.Equal(t, 1, count(t, pool, jobs))
	assert.Equal(t, 4, count(t, pool, markers))
}

// TestRunRefusedWhenTheClearFails: a run whose clear statement fails
// (a job pinned by a foreign key) changes nothing and returns the
// statement's error; the sweep then bisects the page down to that job and
// clears the others in the same pass.
func TestRunRefusedWhenTheClearFails(t *testing.T) {
	for _, form := range runForms {
		t.Run(form.name, func(t *testing.T) { testRunRefusedWhenTheClearFails(t, form.stmt) })
	}
}

func testRunRefusedWhenTheClearFails(t *testing.T, stmt func(string) string) {
	pool := connect(t)
	ctx := context.Background()
	kv, akv, markers, jobs, pins := newRunKVOf(t, pool, stmt)
	now := time.Now()
	finishJobs(t, pool, kv, jobs, 50, now.Add(-2*time.Hour))
	_, err := pool.Exec(ctx, "INSERT INTO "+pins+" (job) VALUES ('j00021')")
	require.NoError(t, err)

	keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), expiredEnd(now), 100)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "23503", pgErr.Code, "foreign_key_violation")
	assert.NotErrorIs(t, err, retention.ErrMalformedMarker)
	assert.Nil(t, keys)
	assert.Equal(t, 50, count(t, pool, markers), "nothing changed")
	assert.Equal(t, 50, count(t, pool, jobs), "nothing changed")

	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 49, st.Cleared, "stats %+v", st)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, count(t, pool, jobs), "only the pinned job is left")
	assert.Equal(t, 1, count(t, pool, markers), "and its marker, rescheduled")
}

// TestRunDuplicatesClearOnce: a run that holds two markers of one id
// deletes both and clears the entity once; the sweep counts the second a
// duplicate.
func TestRunDuplicatesClearOnce(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	_, err := pool.Exec(ctx, "CREATE TABLE "+jobs+"_log (id text, txid bigint)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs+"_log") })
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClearSQL("WITH d AS (DELETE FROM " + jobs + " WHERE id = ANY($1) RETURNING id) INSERT INTO " + jobs + "_log SELECT id, txid_current() FROM d")
	require.NoError(t, err)
	now := time.Now()
	ids := finishJobs(t, pool, kv, jobs, 5, now.Add(-2*time.Hour))
	require.NoError(t, kv.MarkTx(ctx, pool, "jobs/done/", ids[2], now.Add(-90*time.Minute)))

	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, st.Cleared, "stats %+v", st)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, 1, st.ClearCalls, "one run")
	assert.Zero(t, count(t, pool, markers))
	assert.Zero(t, count(t, pool, jobs))
	assert.Equal(t, 5, count(t, pool, jobs+"_log"), "each job cleared once")
}

// TestTwoSweepsRunNoEntityTwice: two sweeps without a lease, each on a
// pool of its own, pass over one backlog at once in runs: every job is
// cleared by exactly one committed transaction, and every marker goes.
func TestTwoSweepsRunNoEntityTwice(t *testing.T) {
	admin := connect(t)
	ctx := context.Background()
	markers := freshTable(t, admin)
	jobs, _ := jobsTable(t, admin, markers)
	_, err := admin.Exec(ctx, "CREATE TABLE "+jobs+"_log (id text, txid bigint)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs+"_log") })
	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)
	now := time.Now()
	const n = 3000
	finishJobs(t, admin, writer, jobs, n, now.Add(-2*time.Hour))

	var wg sync.WaitGroup
	stats := make([]retention.Stats, 2)
	for i := range stats {
		pool := connect(t)
		kv, err := pgkv.New(pool, markers)
		require.NoError(t, err)
		akv, err := kv.WithClearSQL("WITH d AS (DELETE FROM " + jobs + " WHERE id = ANY($1) RETURNING id) INSERT INTO " + jobs + "_log SELECT id, txid_current() FROM d")
		require.NoError(t, err)
		s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, BatchSize: 100, PageSize: 100,
			Clock: retention.NewManualClock(now)})
		require.NoError(t, err)
		wg.Go(func() {
			for range 3 {
				st, err := s.Pass(ctx)
				assert.NoError(t, err)
				stats[i].Cleared += st.Cleared
				stats[i].ClearCalls += st.ClearCalls
			}
		})
	}
	wg.Wait()
	t.Logf("sweeps' stats: %+v", stats)
	assert.Zero(t, count(t, admin, jobs))
	assert.Zero(t, count(t, admin, markers))
	var logged, distinct, twice int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*), count(DISTINCT id), (SELECT count(*) FROM (SELECT id FROM "+jobs+"_log GROUP BY id HAVING count(*) > 1) d) FROM "+jobs+"_log").Scan(&logged, &distinct, &twice))
	assert.Equal(t, n, logged, "one clear per job")
	assert.Equal(t, n, distinct)
	assert.Zero(t, twice)
	assert.LessOrEqual(t, stats[0].Cleared+stats[1].Cleared, n, "no job counted twice")
}

// TestFencedRunAfterTheLeaseIsLost: under a lease, a run checks the lease
// in the statement that deletes its markers; once the lease is taken from
// outside, a run by the old holder changes nothing and reports the loss.
// A sweep under a Locker clears in runs.
func TestFencedRunAfterTheLeaseIsLost(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	kv, akv, markers, jobs, _ := newRunKV(t, pool)
	leases := freshLeaseTable(t, pool)
	now := time.Now()
	finishJobs(t, pool, kv, jobs, 30, now.Add(-2*time.Hour))
	locker, err := pgkv.NewLocker(pool, "runs", &pgkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
	require.NoError(t, err)

	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, BatchSize: 10, PageSize: 10,
		Clock: retention.NewManualClock(now), Lease: locker})
	require.NoError(t, err)
	st, err := s.LeasedPass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 30, st.Cleared, "stats %+v", st)
	assert.Equal(t, 2, st.ScanCalls, "runs, no scan of the expired range")
	finishJobs(t, pool, kv, jobs, 20, now.Add(-2*time.Hour))

	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, ok := lease.(retention.Fencer).Fence(akv)
	require.True(t, ok)
	fenced, ok := view.(retention.RunClearer)
	require.True(t, ok, "the fenced view of an AtomicKV still clears runs")
	keys, err := fenced.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), expiredEnd(now), 10)
	require.NoError(t, err, "while the lease is held")
	assert.Len(t, keys, 10)
	assert.Equal(t, 10, count(t, pool, jobs))

	_, err = pool.Exec(ctx, "UPDATE "+leases+" SET holder = 'thief', fence = fence + 1 WHERE name = 'runs'")
	require.NoError(t, err)
	keys, err = fenced.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), expiredEnd(now), 10)
	require.ErrorIs(t, err, retention.ErrLeaseLost)
	assert.Nil(t, keys)
	assert.Equal(t, 10, count(t, pool, jobs), "the entities stay")
	assert.Equal(t, 10, count(t, pool, markers), "and their markers")
	select {
	case <-lease.Lost():
	default:
		t.Error("Lost is open after a refused run")
	}
	_, err = fenced.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), expiredEnd(now), 10)
	require.ErrorIs(t, err, retention.ErrLeaseLost, "and from then on, with no round trip")
}

// TestWithClearSQLRefuses: WithClearSQL checks its statement before any
// round trip and says what is wrong with it; an AtomicKV of WithClear
// cannot clear runs, and says so without a round trip.
func TestWithClearSQLRefuses(t *testing.T) {
	t.Parallel()
	// No server: neither talks to it, and pgxpool connects lazily.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	defer pool.Close()
	kv, err := pgkv.New(pool, "markers")
	require.NoError(t, err)
	for _, tc := range []struct{ stmt, want string }{
		{"", "empty"},
		{"DELETE FROM jobs", "does not refer to $1"},
		{"DELETE FROM jobs WHERE id = ANY($1) AND kind = $2", "refers to $2"},
		{"DELETE FROM jobs WHERE id = ANY($1); DELETE FROM kids WHERE job = ANY($1)", "second statement"},
		{"DELETE FROM jobs WHERE id = ANY($1) AND note = 'open", "not closed"},
		{"DELETE FROM jobs WHERE id = ANY($1) AND a$1 = 0", "pgx would read"},
	} {
		_, err := kv.WithClearSQL(tc.stmt)
		if assert.Error(t, err, "WithClearSQL(%q)", tc.stmt) {
			assert.Contains(t, err.Error(), "pgkv: WithClearSQL: ")
			assert.Contains(t, err.Error(), tc.want, "WithClearSQL(%q)", tc.stmt)
		}
	}
	_, err = kv.WithClearSQL("DELETE FROM jobs WHERE id = ANY($1)", pgkv.LockTimeout(-time.Second))
	assert.Error(t, err, "a bad option")
	_, err = kv.WithClearSQL("DELETE FROM jobs WHERE id = ANY($1)", nil)
	assert.ErrorContains(t, err, "pgkv: WithClearSQL: nil AtomicOption")

	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error { return nil })
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	keys, err := akv.ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), 10)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Nil(t, keys)
	assert.NoError(t, ctx.Err(), "no round trip")
}

// TestWithClearSQLClearsPages: the statement of WithClearSQL clears the
// batches of pages too (Concurrency 2, no runs), with the batch's ids as
// $1: a chain of CTEs that deletes the rows pinning a job first, with
// quotes and comments holding $1 and $2, clears each job once.
func TestWithClearSQLClearsPages(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	markers := freshTable(t, pool)
	jobs, pins := jobsTable(t, pool, markers)
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClearSQL(`/* the ids: $1, not $2 */ WITH p AS (DELETE FROM ` + pins + ` WHERE job = ANY($1) RETURNING 1) -- $2
DELETE FROM ` + jobs + ` WHERE id = ANY($1::text[]) AND 'it''s $2' <> $$ $2 $$ AND (SELECT count(*) FROM p) >= 0;`)
	require.NoError(t, err)
	now := time.Now()
	ids := finishJobs(t, pool, kv, jobs, 300, now.Add(-2*time.Hour))
	for _, id := range ids[:50] {
		_, err := pool.Exec(ctx, "INSERT INTO "+pins+" VALUES ($1)", id)
		require.NoError(t, err)
	}
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, BatchSize: 40, PageSize: 100, Concurrency: 2,
		Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 300, st.Cleared, "stats %+v", st)
	assert.Equal(t, 4, st.ScanCalls-2, "the expired range read page by page: three of 100 and the empty one after")
	assert.Zero(t, count(t, pool, jobs))
	assert.Zero(t, count(t, pool, pins))
	assert.Zero(t, count(t, pool, markers))
}
