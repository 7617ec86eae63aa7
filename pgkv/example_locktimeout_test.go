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
)

// newLockAwareSweep clears jobs atomically; a batch that meets a job row
// the application holds locked fails within 50ms instead of waiting, and
// the sweep clears the other jobs of the batch without it.
func newLockAwareSweep(kv *pgkv.KV) (*retention.Sweep, error) {
	akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM jobs WHERE id = ANY($1)", ids)
		return nil
	}, pgkv.LockTimeout(50*time.Millisecond))
	if err != nil {
		return nil, err
	}
	return retention.New(akv, retention.Config{
		Prefix:       "jobs/done/",
		Retention:    24 * time.Hour,
		BatchSize:    100,
		ClearTimeout: 10 * time.Second, // for a slow call; locks fail at 50ms
		MaxAttempts:  10,               // park a job that fails 10 times (8.5 to 10 min)
	})
}

// The application locks job rows (SELECT ... FOR UPDATE) while it works
// on them: the sweep's atomic clear gives up on such a row quickly.
func ExampleLockTimeout() {
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
	sweep, err := newLockAwareSweep(kv)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}
