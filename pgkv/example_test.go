package pgkv_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// openMarkers creates the marker table if needed and returns a KV over it.
func openMarkers(ctx context.Context, pool *pgxpool.Pool) (*pgkv.KV, error) {
	// Idempotent and safe from many replicas at once.
	if err := pgkv.Migrate(ctx, pool, "retention_markers"); err != nil {
		return nil, err
	}
	return pgkv.New(pool, "retention_markers") // "schema.table" works too; names are quoted
}

// finishRun records a run's outcome and its marker in one transaction:
// both commit or neither does.
func finishRun(ctx context.Context, pool *pgxpool.Pool, kv *pgkv.KV, id string, at time.Time) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE runs SET state = 'done' WHERE id = $1", id); err != nil {
			return err
		}
		return kv.MarkTx(ctx, tx, "runs/done/", id, at)
	})
}

// A service keeps runs and their markers in one PostgreSQL database; every
// replica runs the sweep.
func Example() {
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
	if err := finishRun(ctx, pool, kv, "run-1", time.Now()); err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Clear: func(ctx context.Context, id string) error {
			_, err := pool.Exec(ctx, "DELETE FROM runs WHERE id = $1", id)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}

// orderNumber is a custom id rule: "order." and digits, which the default
// rule refuses for its '.'.
func orderNumber(id string) error {
	digits, ok := strings.CutPrefix(id, "order.")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("%q is not order.<digits>", id)
	}
	return nil
}

// finishOrder records an order's outcome and its marker in one
// transaction. The sweep's MarkerKey checks the id by the sweep's rule, and
// MarkKeyTx writes the key it returns.
func finishOrder(ctx context.Context, pool *pgxpool.Pool, kv *pgkv.KV, sweep *retention.Sweep, id string, at time.Time) error {
	key, err := sweep.MarkerKey(at, id)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE orders SET state = 'shipped' WHERE id = $1", id); err != nil {
			return err
		}
		return kv.MarkKeyTx(ctx, tx, key)
	})
}

// A sweep whose ids follow their own rule (Config.ValidateID) writes its
// markers with MarkKeyTx: MarkTx checks ids by the default rule.
func ExampleKV_MarkKeyTx() {
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
	sweep, err := retention.New(kv, retention.Config{
		Prefix:     "orders/done/",
		Retention:  30 * 24 * time.Hour,
		ValidateID: orderNumber,
		Clear: func(ctx context.Context, id string) error {
			_, err := pool.Exec(ctx, "DELETE FROM orders WHERE id = $1", id)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := finishOrder(ctx, pool, kv, sweep, "order.42", time.Now()); err != nil {
		log.Fatal(err)
	}
}

// newBatchSweep clears up to 500 jobs in one statement.
func newBatchSweep(pool *pgxpool.Pool, kv *pgkv.KV) (*retention.Sweep, error) {
	return retention.New(kv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		PageSize:  1000,
		BatchSize: 500,
		ClearBatch: func(ctx context.Context, ids []string) error {
			_, err := pool.Exec(ctx, "DELETE FROM jobs WHERE id = ANY($1)", ids)
			return err
		},
	})
}

// A sweep clears the jobs of a page in batches, one statement each.
func Example_clearBatch() {
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
	sweep, err := newBatchSweep(pool, kv)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}

// newAtomicSweep clears a job in the transaction that deletes its marker,
// so that each job is cleared exactly once.
func newAtomicSweep(kv *pgkv.KV) (*retention.Sweep, error) {
	akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM jobs WHERE id = ANY($1)", ids)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: 24 * time.Hour, BatchSize: 500})
}

// Jobs and their markers live in one database: the store deletes a batch
// of jobs with their markers, in one transaction.
func ExampleKV_WithClear() {
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
	sweep, err := newAtomicSweep(kv)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}

// newRunSweep clears jobs as newAtomicSweep does, with one statement the
// database binds to each batch's ids: the database then picks each batch
// too (a run of up to 10,000 markers), in one round trip.
func newRunSweep(kv *pgkv.KV) (*retention.Sweep, error) {
	akv, err := kv.WithClearSQL("DELETE FROM jobs WHERE id = ANY($1)")
	if err != nil {
		return nil, err
	}
	return retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: 24 * time.Hour, BatchSize: 10_000, PageSize: 10_000})
}

// Jobs and their markers live in one database, and one statement clears
// the jobs: the database picks each batch of expired markers, deletes
// them and their jobs, in one transaction and one round trip.
func ExampleKV_WithClearSQL() {
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
	sweep, err := newRunSweep(kv)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}

// newFleetSweep makes a sweep that one replica of the fleet runs at a time.
func newFleetSweep(ctx context.Context, pool *pgxpool.Pool, kv *pgkv.KV, clearRun func(context.Context, string) error) (*retention.Sweep, error) {
	if err := pgkv.MigrateLeases(ctx, pool, pgkv.DefaultLeaseTable); err != nil { // once, like Migrate
		return nil, err
	}
	lease, err := pgkv.NewLocker(pool, "runs-retention", &pgkv.LockerOptions{TTL: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	pod, err := os.Hostname() // in Kubernetes, the pod's name
	if err != nil {
		return nil, err
	}
	return retention.New(kv, retention.Config{
		Prefix:      "runs/done/",
		Retention:   7 * 24 * time.Hour,
		Clear:       clearRun,
		Lease:       lease,
		Replica:     pod,              // the fleet's record and wake-ups: every console shows who sweeps
		Jitter:      0.2,              // replicas that start together do not wake together
		StartJitter: 10 * time.Second, // nor pass together at start-up
	})
}

// Replicas of a service share one marker table; the lease lets one of them
// sweep at a time, and fences its marker deletes.
func ExampleNewLocker() {
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
	sweep, err := newFleetSweep(ctx, pool, kv, func(ctx context.Context, id string) error {
		_, err := pool.Exec(ctx, "DELETE FROM runs WHERE id = $1", id)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}
