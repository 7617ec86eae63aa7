package sqlkv_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// createJobTables is the schema a job service already has, plus the index
// a table sweep reads by: its finish time and id, with the filter's WHERE.
func createJobTables(ctx context.Context, db *sql.DB) error {
	for _, stmt := range []string{
		`CREATE TABLE jobs (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL, finished_ms INTEGER)`,
		`CREATE TABLE job_logs (job_id INTEGER NOT NULL, line TEXT NOT NULL)`,
		`CREATE INDEX jobs_done ON jobs (finished_ms, id) WHERE state IN ('succeeded', 'cancelled')`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// newJobTableSweep sweeps the jobs table itself: a job is a marker once its
// finish time is set and its state is final, and its logs go in the
// transaction that deletes it. The side table keeps what a row cannot: the
// markers of jobs whose clear failed, held or parked.
func newJobTableSweep(ctx context.Context, db *sql.DB, clock retention.Clock) (*retention.Sweep, error) {
	if err := sqlkv.Migrate(ctx, db, sqlkv.SQLite, "jobs_retention"); err != nil {
		return nil, err
	}
	side, err := sqlkv.New(db, sqlkv.SQLite, "jobs_retention")
	if err != nil {
		return nil, err
	}
	table, err := sqlkv.NewTable(ctx, side, sqlkv.Table{
		Name: "jobs", ID: "id", Time: "finished_ms", TimeUnit: sqlkv.UnixMilli,
		Filter: "state IN ('succeeded', 'cancelled')",
		Prefix: "jobs/done/",
	})
	if err != nil {
		return nil, err // sqlkv.ErrNoIndex names the CREATE INDEX to run
	}
	atomic := table.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		for _, id := range ids {
			n, err := strconv.ParseInt(id, 10, 64) // zero-padded to 20 digits
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "DELETE FROM job_logs WHERE job_id = ?", n); err != nil {
				return err
			}
		}
		return nil
	})
	return retention.New(atomic, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		Clock:     clock,
	})
}

func ExampleNewTable() {
	dir, err := os.MkdirTemp("", "sqlkv-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "jobs.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := createJobTables(ctx, db); err != nil {
		log.Fatal(err)
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for id, job := range map[int]struct {
		state string
		ago   time.Duration
	}{
		1: {"succeeded", 48 * time.Hour},
		2: {"cancelled", 30 * time.Hour},
		3: {"succeeded", time.Hour}, // within the retention
		4: {"running", 0},           // no finish time: no marker
	} {
		var finished any
		if job.state != "running" {
			finished = now.Add(-job.ago).UnixMilli()
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO jobs VALUES (?, 'report', ?, ?)", id, job.state, finished); err != nil {
			log.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO job_logs VALUES (?, 'done')", id); err != nil {
			log.Fatal(err)
		}
	}
	sweep, err := newJobTableSweep(ctx, db, retention.NewManualClock(now))
	if err != nil {
		log.Fatal(err)
	}
	st, err := sweep.Pass(ctx)
	if err != nil {
		log.Fatal(err)
	}
	var jobs, logs string
	if err := db.QueryRowContext(ctx, "SELECT group_concat(id) FROM (SELECT id FROM jobs ORDER BY id)").Scan(&jobs); err != nil {
		log.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT group_concat(job_id) FROM (SELECT job_id FROM job_logs ORDER BY job_id)").Scan(&logs); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("cleared %d; jobs left: %s; logs left: %s\n", st.Cleared, jobs, logs)
	// Output: cleared 2; jobs left: 3,4; logs left: 3,4
}
