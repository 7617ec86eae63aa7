package pgkv_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/pgkv"
)

// newJobFilesSweep clears jobs whose rows live beside their markers and
// whose files lie in dir/<id>: the files first, under the call's context,
// then the rows, in the transaction that deletes the markers. A crash
// between the two leaves the marker, and the next try finds no files left.
func newJobFilesSweep(kv *pgkv.KV, dir string) (*retention.Sweep, error) {
	akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
		failed := retention.BatchError{}
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return err // ClearTimeout, or the sweep is stopping: nothing is sent
			}
			if err := os.RemoveAll(filepath.Join(dir, id)); err != nil { // nil when none is left
				failed[id] = err
			}
		}
		if len(failed) > 0 {
			return failed // nothing is sent; the other ids go again at once
		}
		b.Queue("DELETE FROM jobs WHERE id = ANY($1)", ids)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: 24 * time.Hour})
}

// newHeldJobFilesSweeps clears jobs that may be on hold (jobs.hold_until),
// with files in dir/<id>: the transaction that deletes a batch's markers
// decides the holds, deletes the rows of the jobs, none held, and writes
// a marker for their files, which the second sweep deletes a minute later.
func newHeldJobFilesSweeps(kv *pgkv.KV, clock retention.Clock, dir string) (*retention.Group, error) {
	files, err := retention.New(kv, retention.Config{
		Prefix:    "jobs/files/",
		Retention: time.Minute,
		Clock:     clock,
		Clear: func(ctx context.Context, id string) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return os.RemoveAll(filepath.Join(dir, id)) // nil when none is left
		},
	})
	if err != nil {
		return nil, err
	}
	akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
		keys := make([]string, len(ids))
		for i, id := range ids {
			key, err := files.MarkerKey(clock.Now(), id)
			if err != nil {
				return err
			}
			keys[i] = string(key)
		}
		// A hold placed from here on waits for this transaction to end.
		b.Queue("SELECT FROM jobs WHERE id = ANY($1) FOR UPDATE", ids)
		pgkv.QueueHolds(b, "SELECT id, hold_until FROM jobs WHERE id = ANY($1) AND hold_until > now()", ids)
		b.Queue("DELETE FROM jobs WHERE id = ANY($1)", ids)
		b.Queue("INSERT INTO retention_markers (key) SELECT convert_to(k, 'UTF8') FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING", keys)
		return nil
	})
	if err != nil {
		return nil, err
	}
	jobs, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: 24 * time.Hour, Clock: clock})
	if err != nil {
		return nil, err
	}
	return retention.NewGroup(retention.GroupConfig{}, jobs, files)
}

// holdJob puts job id on hold until until; it locks the job's row, so a
// clear that locked it first is waited for, and the hold then finds no job.
func holdJob(ctx context.Context, pool *pgxpool.Pool, id string, until time.Time) (held bool, err error) {
	tag, err := pool.Exec(ctx, "UPDATE jobs SET hold_until = $2 WHERE id = $1", id, until)
	return tag.RowsAffected() == 1, err
}

// Jobs keep rows beside their markers and files on disk, and may be held:
// the holds are decided in the clear's transaction, which deletes the rows
// and hands the files to a second sweep.
func ExampleQueueHolds() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	kv, err := openMarkers(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	sweeps, err := newHeldJobFilesSweeps(kv, retention.SystemClock, "/var/lib/jobs")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweeps.Run(ctx))
}

// examplePool returns a pool whose tables are in a schema of its own,
// dropped when t ends, so that the examples' tables (jobs,
// retention_markers) meet no other test's.
func examplePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	admin := connect(t)
	schema := fmt.Sprintf("example_files_%d_%d", os.Getpid(), tableSeq.Add(1))
	_, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	cfg, err := pgxpool.ParseConfig(kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// jobWithFiles writes job id's row, its files in dir/<id>, and its marker,
// finished at at.
func jobWithFiles(t *testing.T, pool *pgxpool.Pool, kv *pgkv.KV, dir, id string, at time.Time) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, id), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, id, "out.log"), []byte("done\n"), 0o644))
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO jobs (id) VALUES ($1)", id); err != nil {
			return err
		}
		return kv.MarkTx(ctx, tx, "jobs/done/", id, at)
	}))
}

// filesLeft returns the ids whose files are left in dir.
func filesLeft(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

// rowsOf returns the first column of sql's rows, as text.
func rowsOf(t *testing.T, pool *pgxpool.Pool, sql string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// TestExampleJobFiles runs newJobFilesSweep: a job whose transaction
// fails after its files went keeps its row and marker, and the next try,
// finding no files, clears it.
func TestExampleJobFiles(t *testing.T) {
	ctx := context.Background()
	pool := examplePool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE jobs (id text PRIMARY KEY); CREATE TABLE pins (job text REFERENCES jobs (id))")
	require.NoError(t, err)
	kv, err := openMarkers(ctx, pool)
	require.NoError(t, err)
	dir := t.TempDir()
	longAgo := time.Now().Add(-25 * time.Hour)
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		jobWithFiles(t, pool, kv, dir, id, longAgo)
	}
	_, err = pool.Exec(ctx, "INSERT INTO pins VALUES ('job-2')") // its DELETE fails
	require.NoError(t, err)

	s, err := newJobFilesSweep(kv, dir)
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, st.Cleared, "Pass().Cleared = %d, want 2", st.Cleared)
	assert.Equal(t, 1, st.Failed, "Pass().Failed = %d, want 1", st.Failed)
	assert.Empty(t, filesLeft(t, dir), "files left: job-2's went before its transaction failed")
	assert.Equal(t, []string{"job-2"}, rowsOf(t, pool, "SELECT id FROM jobs"), "jobs left")
	assert.Equal(t, 1, count(t, pool, "retention_markers"), "markers left: job-2's")

	_, err = pool.Exec(ctx, "DELETE FROM pins")
	require.NoError(t, err)
	require.Eventually(t, func() bool { // after its retry delay, 1s or so
		st, err := s.Pass(ctx)
		return err == nil && st.Cleared == 1
	}, 30*time.Second, 50*time.Millisecond, "job-2 was not cleared once its pin went")
	assert.Empty(t, rowsOf(t, pool, "SELECT id FROM jobs"), "jobs left")
	assert.Zero(t, count(t, pool, "retention_markers"), "markers left")
}

// TestExampleHeldJobFiles runs newHeldJobFilesSweeps: a held job keeps its
// row, files and marker; the others' rows go at once and their files a
// minute later; once the hold is lifted and over, the held job goes the
// same way.
func TestExampleHeldJobFiles(t *testing.T) {
	ctx := context.Background()
	pool := examplePool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE jobs (id text PRIMARY KEY, hold_until timestamptz)")
	require.NoError(t, err)
	kv, err := openMarkers(ctx, pool)
	require.NoError(t, err)
	dir := t.TempDir()
	now := time.Now()
	clock := retention.NewManualClock(now)
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		jobWithFiles(t, pool, kv, dir, id, now.Add(-25*time.Hour))
	}
	held, err := holdJob(ctx, pool, "job-2", now.Add(time.Hour))
	require.NoError(t, err)
	require.True(t, held, "holdJob found no job-2")

	sweeps, err := newHeldJobFilesSweeps(kv, clock, dir)
	require.NoError(t, err)
	pass := func() (jobs, files retention.Stats) {
		t.Helper()
		st, err := sweeps.Pass(ctx)
		require.NoError(t, err)
		return st[0], st[1]
	}
	jobs, files := pass()
	assert.Equal(t, 2, jobs.Cleared, "jobs Cleared = %d, want 2", jobs.Cleared)
	assert.Equal(t, 1, jobs.Held, "jobs Held = %d, want 1", jobs.Held)
	assert.Zero(t, files.Cleared, "files Cleared: not due for a minute")
	assert.Equal(t, []string{"job-2"}, rowsOf(t, pool, "SELECT id FROM jobs"), "jobs left")
	assert.Equal(t, []string{"job-1", "job-2", "job-3"}, filesLeft(t, dir), "files left")

	clock.Advance(2 * time.Minute)
	_, files = pass()
	assert.Equal(t, 2, files.Cleared, "files Cleared = %d, want 2", files.Cleared)
	assert.Equal(t, []string{"job-2"}, filesLeft(t, dir), "files left")

	_, err = pool.Exec(ctx, "UPDATE jobs SET hold_until = NULL") // lifted
	require.NoError(t, err)
	clock.Advance(2 * time.Hour) // past the hold's end, when its marker falls due
	jobs, _ = pass()
	assert.Equal(t, 1, jobs.Cleared, "jobs Cleared = %d after the hold, want 1", jobs.Cleared)
	clock.Advance(2 * time.Minute)
	_, files = pass()
	assert.Equal(t, 1, files.Cleared, "files Cleared = %d after the hold, want 1", files.Cleared)
	assert.Empty(t, filesLeft(t, dir), "files left")
	assert.Empty(t, rowsOf(t, pool, "SELECT id FROM jobs"), "jobs left")
	assert.Zero(t, count(t, pool, "retention_markers"), "markers left")

	held, err = holdJob(ctx, pool, "job-2", now.Add(time.Hour))
	require.NoError(t, err)
	assert.False(t, held, "holdJob of a cleared job")
}
