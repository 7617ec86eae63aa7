package sqlkv_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// finishJob records a job's outcome and writes its marker in one
// transaction: both commit or neither does.
func finishJob(ctx context.Context, db *sql.DB, kv *sqlkv.KV, id, outcome string, at time.Time) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO jobs (id, outcome) VALUES (?, ?)", id, outcome); err != nil {
		return err
	}
	if err := kv.MarkTx(ctx, tx, "jobs/done/", id, at); err != nil {
		return err
	}
	return tx.Commit()
}

// newJobSweep deletes a job's row in the transaction that deletes its
// marker: each job is cleared exactly once, whatever crashes.
func newJobSweep(kv *sqlkv.KV, clock retention.Clock) (*retention.Sweep, error) {
	atomic, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, "DELETE FROM jobs WHERE id = ?", id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return retention.New(atomic, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		Clock:     clock,
	})
}

func ExampleKV_WithClear() {
	dir, err := os.MkdirTemp("", "sqlkv-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// A busy timeout, WAL and BEGIN IMMEDIATE: see sqlkv.SQLite.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "jobs.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := sqlkv.Migrate(ctx, db, sqlkv.SQLite, "retention_markers"); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE jobs (id TEXT PRIMARY KEY, outcome TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	kv, err := sqlkv.New(db, sqlkv.SQLite, "retention_markers")
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for i, id := range []string{"job-1", "job-2", "job-3"} {
		// job-3 finished an hour ago: within the 24h retention.
		at := now.Add(-48*time.Hour + time.Duration(i)*time.Minute)
		if id == "job-3" {
			at = now.Add(-time.Hour)
		}
		if err := finishJob(ctx, db, kv, id, "succeeded", at); err != nil {
			log.Fatal(err)
		}
	}
	sweep, err := newJobSweep(kv, retention.NewManualClock(now))
	if err != nil {
		log.Fatal(err)
	}
	st, err := sweep.Pass(ctx)
	if err != nil {
		log.Fatal(err)
	}
	var left string
	if err := db.QueryRowContext(ctx, "SELECT group_concat(id) FROM jobs").Scan(&left); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("cleared %d, jobs left: %s\n", st.Cleared, left)
	// Output: cleared 2, jobs left: job-3
}

func ExampleNewLocker() {
	dir, err := os.MkdirTemp("", "sqlkv-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "jobs.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := sqlkv.Migrate(ctx, db, sqlkv.SQLite, "retention_markers"); err != nil {
		log.Fatal(err)
	}
	if err := sqlkv.MigrateLeases(ctx, db, sqlkv.SQLite, sqlkv.DefaultLeaseTable); err != nil {
		log.Fatal(err)
	}
	kv, err := sqlkv.New(db, sqlkv.SQLite, "retention_markers")
	if err != nil {
		log.Fatal(err)
	}
	// Processes of one host that share the file take turns with it.
	locker, err := sqlkv.NewLocker(kv, "jobs-retention", &sqlkv.LockerOptions{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	lease, err := locker.TryAcquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_, err = locker.TryAcquire(ctx)
	fmt.Println("a second TryAcquire:", err != nil)
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: a second TryAcquire: true
}
