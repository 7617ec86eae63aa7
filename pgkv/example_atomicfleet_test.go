package pgkv_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
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

// newAtomicFleetSweep clears each job exactly once across a fleet: the
// store deletes a batch of jobs in the transaction that deletes their
// markers, and that transaction checks that this replica still holds the
// lease. Marker ids are strings: the cast compares them with the jobs'
// bigint ids.
func newAtomicFleetSweep(ctx context.Context, pool *pgxpool.Pool, kv *pgkv.KV) (*retention.Sweep, error) {
	if err := pgkv.MigrateLeases(ctx, pool, pgkv.DefaultLeaseTable); err != nil {
		return nil, err
	}
	lease, err := pgkv.NewLocker(pool, "jobs-retention", nil) // TTL 10s
	if err != nil {
		return nil, err
	}
	akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM jobs WHERE id = ANY($1::bigint[])", ids)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return retention.New(akv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		BatchSize: 500,
		Lease:     lease,
		Jitter:    0.2,
	})
}

// finishJob records a job's outcome and its marker in one transaction.
func finishJob(ctx context.Context, pool *pgxpool.Pool, kv *pgkv.KV, id int64, at time.Time) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO jobs (id, state) VALUES ($1, 'succeeded')", id); err != nil {
			return err
		}
		return kv.MarkTx(ctx, tx, "jobs/done/", fmt.Sprint(id), at)
	})
}

// Every replica of a job service runs this sweep: the one holding the lease
// clears finished jobs a day after they finished, each exactly once.
func ExampleNewLocker_atomicClear() {
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
	if err := finishJob(ctx, pool, kv, 1, time.Now()); err != nil {
		log.Fatal(err)
	}
	sweep, err := newAtomicFleetSweep(ctx, pool, kv)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}

// TestExampleAtomicFleet runs the example's code against the server, in a
// schema of its own: two replicas' LeasedPass at once clear every expired
// job exactly once and leave the others.
func TestExampleAtomicFleet(t *testing.T) {
	ctx := context.Background()
	admin := connect(t)
	schema := fmt.Sprintf("example_fleet_%d", tableSeq.Add(1))
	_, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	cfg, err := pgxpool.ParseConfig(kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	_, err = pool.Exec(ctx, "CREATE TABLE jobs (id bigint PRIMARY KEY, state text NOT NULL)")
	require.NoError(t, err)
	kv, err := openMarkers(ctx, pool)
	require.NoError(t, err)
	now := time.Now()
	for id := range int64(300) {
		at := now.Add(-25 * time.Hour) // expired
		if id >= 250 {
			at = now.Add(-time.Hour) // not yet
		}
		require.NoError(t, finishJob(ctx, pool, kv, id, at))
	}

	var replicas [2]*retention.Sweep
	for i := range replicas {
		replicas[i], err = newAtomicFleetSweep(ctx, pool, kv)
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	cleared := make([]int, len(replicas))
	for i, r := range replicas {
		wg.Go(func() {
			st, err := r.LeasedPass(ctx)
			if !errors.Is(err, retention.ErrLeaseHeld) {
				assert.NoError(t, err)
			}
			cleared[i] = st.Cleared
		})
	}
	wg.Wait()
	// Whichever replica lost the race for the lease sweeps now.
	for i, r := range replicas {
		st, err := r.LeasedPass(ctx)
		require.NoError(t, err)
		cleared[i] += st.Cleared
	}
	require.Equal(t, 250, cleared[0]+cleared[1], "cleared by the two replicas: %v", cleared)
	var jobs, markers int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&jobs))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM retention_markers").Scan(&markers))
	require.Equal(t, 50, jobs, "jobs left")
	require.Equal(t, 50, markers, "markers left")
}
