// Postgres: a job service whose outcomes and markers live in PostgreSQL,
// each job's marker written in the transaction that records its outcome.
//
//	RETENTION_POSTGRES_DSN=postgres://user@127.0.0.1:5432/db go run ./examples/postgres
//
// It creates the tables retention_example_jobs and retention_example_markers
// and drops them when it is done.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

const (
	jobsTable    = "retention_example_jobs"
	markersTable = "retention_example_markers"
	keep         = time.Second
)

func main() {
	dsn := os.Getenv("RETENTION_POSTGRES_DSN")
	if dsn == "" {
		fmt.Fprintln(os.Stderr, "set RETENTION_POSTGRES_DSN to a PostgreSQL connection string, e.g.\n"+
			"  RETENTION_POSTGRES_DSN=postgres://user@127.0.0.1:5432/db go run ./examples/postgres\n"+
			"or run it with servers started for you: ./scripts/test --exec go run ./examples/postgres")
		os.Exit(2)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+jobsTable+" (id text PRIMARY KEY, outcome text NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	if err := pgkv.Migrate(ctx, pool, markersTable); err != nil {
		log.Fatal(err)
	}
	defer func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobsTable+", "+markersTable)
	}()
	kv, err := pgkv.New(pool, markersTable)
	if err != nil {
		log.Fatal(err)
	}

	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("%4.1fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: keep,
		Clear: func(ctx context.Context, id string) error {
			_, err := pool.Exec(ctx, "DELETE FROM "+jobsTable+" WHERE id = $1", id)
			return err
		},
		OnPass: func(st retention.Stats, err error) {
			say("pass: cleared %d, failed %d, error %v; %d jobs stored", st.Cleared, st.Failed, err, countJobs(pool))
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sweep.Run(runCtx) }()

	for i := 1; i <= 4; i++ {
		id := fmt.Sprintf("job-%d", i)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+jobsTable+" VALUES ($1, 'succeeded')", id); err != nil {
				return err
			}
			return kv.MarkTx(ctx, tx, "jobs/done/", id, time.Now())
		})
		if err != nil {
			log.Fatal(err)
		}
		say("finished %s", id)
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(2 * keep)
	stop()
	<-done
	say("done: %d jobs stored", countJobs(pool))
}

func countJobs(pool *pgxpool.Pool) int {
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+jobsTable).Scan(&n); err != nil {
		return -1
	}
	return n
}
