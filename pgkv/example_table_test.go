package pgkv_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
	"github.com/marksweep/retention/sqlkv"
)

// A service keeps its jobs in one table, with a finished_at column set
// when a job ends: the finished rows are the markers, and no marker row is
// written. The sweep deletes each expired job with its artifacts in one
// transaction, under a lease that every replica competes for. The table
// needs an index on (finished_at, id), here one whose WHERE is the
// filter:
//
//	CREATE INDEX jobs_retention ON jobs (finished_at, id) WHERE state IN ('completed', 'cancelled');
func ExampleTables() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// The side table holds the few keys a row cannot: retry, held and
	// parked markers.
	tables, err := pgkv.NewTables(pool, "retention_side", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tables.Close()
	if err := tables.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := pgkv.MigrateLeases(ctx, pool, pgkv.DefaultLeaseTable); err != nil {
		log.Fatal(err)
	}
	jobs, err := tables.Table(ctx, sqlkv.Table{
		Name: "jobs", ID: "id", Time: "finished_at",
		Filter: "state IN ('completed', 'cancelled')",
		Prefix: "jobs/done/",
	})
	if err != nil {
		log.Fatal(err) // matches sqlkv.ErrNoIndex, naming the CREATE INDEX, without the index
	}
	locker, err := tables.NewLocker("jobs-retention", nil)
	if err != nil {
		log.Fatal(err)
	}
	clearArtifacts := func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM artifacts WHERE job_id = ANY($1::bigint[])", ids)
		return nil
	}
	sweep, err := retention.New(jobs.WithClear(pgkv.TableClear(clearArtifacts)), retention.Config{
		Prefix:    "jobs/done/",
		Retention: 7 * 24 * time.Hour,
		Lease:     locker,
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}
