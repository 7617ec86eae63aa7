// SQLite: a single-binary job service that keeps its jobs and their
// retention markers in one SQLite file (modernc.org/sqlite, pure Go). A
// job's row and its marker are written in one transaction, and the sweep
// deletes the row in the transaction that deletes the marker, so each job
// is cleared exactly once even if the process dies mid-sweep. Jobs
// finished before a restart are swept after it.
//
//	go run ./examples/sqlite              # a fresh file in a temporary directory
//	go run ./examples/sqlite -db jobs.db  # keep the file between runs
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

const keep = time.Second

func main() {
	path := flag.String("db", "", "SQLite file (default: a new temporary file)")
	flag.Parse()
	if *path == "" {
		dir, err := os.MkdirTemp("", "retention-sqlite")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		*path = filepath.Join(dir, "jobs.db")
	}
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("%4.1fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	// First life: finish three jobs, then stop without sweeping.
	lifetime(*path, say, []string{"job-1", "job-2", "job-3"}, 0)
	say("process stopped; down for 1.5s, longer than the %v retention", keep)
	time.Sleep(1500 * time.Millisecond)

	// Second life: the first pass clears what the first life left due, then
	// two new jobs are cleared as they fall due.
	lifetime(*path, say, []string{"job-4", "job-5"}, 2500*time.Millisecond)
}

// lifetime opens the database, finishes the given jobs and, when runFor is
// not zero, runs the sweep for that long before closing the database.
func lifetime(path string, say func(string, ...any), finish []string, runFor time.Duration) {
	// A busy timeout, so that the sweep and the service wait for each
	// other's writes; WAL, so that reads do not wait; BEGIN IMMEDIATE, so
	// that a transaction takes the write lock before it reads.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sqlkv.Migrate(ctx, db, sqlkv.SQLite, "retention_markers"); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, outcome TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	kv, err := sqlkv.New(db, sqlkv.SQLite, "retention_markers")
	if err != nil {
		log.Fatal(err)
	}
	say("process started; %d jobs on disk", countJobs(ctx, db))

	done := make(chan error, 1)
	if runFor > 0 {
		atomic, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
			for _, id := range ids {
				if _, err := tx.ExecContext(ctx, "DELETE FROM jobs WHERE id = ?", id); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
		sweep, err := retention.New(atomic, retention.Config{
			Prefix:    "jobs/done/",
			Retention: keep,
			Interval:  200 * time.Millisecond,
			OnPass: func(st retention.Stats, err error) {
				if st.Cleared > 0 || err != nil {
					say("pass cleared %d jobs (err: %v); %d jobs left", st.Cleared, err, countJobs(context.Background(), db))
				}
			},
		})
		if err != nil {
			log.Fatal(err)
		}
		go func() { done <- sweep.Run(ctx) }()
	}
	for _, id := range finish {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO jobs (id, outcome) VALUES (?, 'succeeded')", id); err != nil {
			log.Fatal(err)
		}
		if err := kv.MarkTx(ctx, tx, "jobs/done/", id, time.Now()); err != nil {
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
		say("finished %s (row and marker in one transaction)", id)
	}
	if runFor == 0 {
		return
	}
	time.Sleep(runFor)
	cancel()
	<-done
	n := countJobs(context.Background(), db)
	say("stopped the sweep; %d jobs left", n)
	if n != 0 {
		log.Fatalf("%d jobs left, want 0", n)
	}
}

func countJobs(ctx context.Context, db *sql.DB) int {
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil {
		log.Fatal(err)
	}
	return n
}
