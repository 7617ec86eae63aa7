package pgkv_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// TestExampleCode runs the example functions that the docs show
// (openMarkers, finishRun, newFleetSweep, newAtomicSweep, newRunSweep,
// newBatchSweep)
// against PostgreSQL, on the tables they name.
func TestExampleCode(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	const tables = "retention_markers, runs, jobs, " + pgkv.DefaultLeaseTable
	_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+tables+`;
CREATE TABLE runs (id text PRIMARY KEY, state text NOT NULL);
CREATE TABLE jobs (id text PRIMARY KEY)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+tables)
		assert.NoError(t, err)
	})
	count := func(sql string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	// markers counts the markers left under prefix: not the fleet's
	// record that newFleetSweep (Config.Replica) keeps beside them in the
	// same table, which no sweep clears.
	markers := func(prefix string) int {
		rows, err := pool.Query(ctx, "SELECT key FROM retention_markers")
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		require.NoError(t, err)
		n := 0
		for _, k := range keys {
			if _, _, err := retention.ParseMarkerKey(prefix, k); err == nil {
				n++
			}
		}
		return n
	}
	longAgo := time.Now().Add(-30 * 24 * time.Hour)

	kv, err := openMarkers(ctx, pool)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO runs VALUES ('run-1', 'running')")
	require.NoError(t, err)
	require.NoError(t, finishRun(ctx, pool, kv, "run-1", longAgo))
	require.Equal(t, 1, count("SELECT count(*) FROM runs WHERE state = 'done'"), "finishRun's update")
	require.Equal(t, 1, count("SELECT count(*) FROM retention_markers"), "finishRun's marker")

	// The fleet sweep takes its lease and clears the run.
	sweep, err := newFleetSweep(ctx, pool, kv, func(ctx context.Context, id string) error {
		_, err := pool.Exec(ctx, "DELETE FROM runs WHERE id = $1", id)
		return err
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sweep.Run(runCtx) }()
	require.Eventually(t, func() bool {
		return count("SELECT count(*) FROM runs") == 0 && markers("runs/done/") == 0
	}, 30*time.Second, 10*time.Millisecond, "the fleet sweep did not clear run-1") // StartJitter is up to 10s
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	// The atomic, the run and the batch sweep each clear a job with its
	// marker.
	atomicSweep, err := newAtomicSweep(kv)
	require.NoError(t, err)
	runSweep, err := newRunSweep(kv)
	require.NoError(t, err)
	batch, err := newBatchSweep(pool, kv)
	require.NoError(t, err)
	for _, s := range []*retention.Sweep{atomicSweep, runSweep, batch} {
		_, err = pool.Exec(ctx, "INSERT INTO jobs VALUES ('job-1')")
		require.NoError(t, err)
		require.NoError(t, kv.MarkTx(ctx, pool, "jobs/done/", "job-1", longAgo))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
		assert.Zero(t, count("SELECT count(*) FROM jobs"), "the job after the Pass")
		assert.Zero(t, markers("jobs/done/"), "the marker after the Pass")
	}
}
