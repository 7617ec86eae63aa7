package pgkv_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

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
	return func(b *pgx.Batch, ids []string) error {
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
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
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
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
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
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	leases := freshLeaseTable(t, pool)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		return nil
	})
	require.NoError(t, err)
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
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
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
