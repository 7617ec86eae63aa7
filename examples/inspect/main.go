// Inspect: what an admin page or a CLI shows of a sweep. A job service
// keeps its jobs in a bbolt file and clears them a day after they finish.
// By a manual clock, a few passes leave one job of each kind: cleared, one
// whose clear keeps failing (retrying, then parked after two attempts), one
// on legal hold (retention.Hold), one kept a month by a deadline of its own
// (retention.DeadlineKey), and two due. Then it prints Sweep.Pending as a
// table, the Backlog, and what a dry run would clear, before a last pass
// clears it. The output is the same at every run.
//
//	go run ./examples/inspect
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
)

const prefix = "jobs/done/"

var jobs = []byte("jobs")

// t0 is when the story starts: the manual clock reads it at the first pass.
var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

// holdUntil is the end of job-04's legal hold.
var holdUntil = t0.Add(7 * 24 * time.Hour)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "retention-inspect")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := bbolt.Open(filepath.Join(dir, "jobs.db"), 0o600, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	kv, err := boltkv.New(db, "markers")
	if err != nil {
		return err
	}

	clock := retention.NewManualClock(t0)
	cfg := retention.Config{
		Prefix:    prefix,
		Retention: 24 * time.Hour,
		Clock:     clock,
		// A failed clear waits a minute, plus up to a fifth of it at
		// random: the times below are printed to the minute, which the
		// jitter does not reach.
		RetryDelay:  time.Minute,
		MaxAttempts: 2,
		Logger:      slog.New(slog.DiscardHandler), // the passes are printed below
		Clear: func(_ context.Context, id string) error {
			switch id {
			case "job-03":
				return errors.New("output bucket refuses the delete")
			case "job-04":
				return retention.Hold(holdUntil)
			case "job-05":
				return errors.New("output store unavailable")
			}
			return db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(jobs).Delete([]byte(id)) })
		},
	}
	sweep, err := retention.New(kv, cfg)
	if err != nil {
		return err
	}

	// Each job's state and its marker commit in one transaction. The
	// marker of job-06, a failed run kept for a month, carries its own
	// deadline instead of its finish time.
	deadline, err := sweep.DeadlineKey(t0.Add(30*24*time.Hour), "job-06")
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(jobs)
		if err != nil {
			return err
		}
		for _, j := range []struct {
			id       string
			finished time.Duration // before t0
		}{
			{"job-01", 30 * time.Hour},
			{"job-02", 30 * time.Hour},
			{"job-03", 26 * time.Hour},
			{"job-04", 25 * time.Hour},
			{"job-05", 24*time.Hour - 3*time.Minute},
			{"job-07", 24*time.Hour - 5*time.Minute - 15*time.Second},
			{"job-08", 24*time.Hour - 5*time.Minute - 20*time.Second},
		} {
			if err := b.Put([]byte(j.id), []byte("succeeded")); err != nil {
				return err
			}
			if err := kv.MarkTx(tx, prefix, j.id, t0.Add(-j.finished)); err != nil {
				return err
			}
		}
		if err := b.Put([]byte("job-06"), []byte("failed")); err != nil {
			return err
		}
		return kv.MarkKeyTx(tx, deadline)
	})
	if err != nil {
		return err
	}

	pass := func() error {
		st, err := sweep.Pass(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("%s  pass: cleared %d, failed %d, held %d, parked %d\n",
			clock.Now().Format("15:04:05"), st.Cleared, st.Failed, st.Held, st.Parked)
		return nil
	}
	// 09:00: job-01 and job-02 are cleared, job-03 fails, job-04 is held.
	if err := pass(); err != nil {
		return err
	}
	// 09:05: job-03 fails again and is parked; job-05, due since 09:03,
	// fails for the first time.
	clock.Set(t0.Add(5 * time.Minute))
	if err := pass(); err != nil {
		return err
	}

	clock.Set(t0.Add(5*time.Minute + 30*time.Second))
	fmt.Printf("\n%s  Sweep.Pending(ctx, 20):\n", clock.Now().Format("15:04:05"))
	due, err := sweep.Pending(ctx, 20)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tSTATE\tDUE\tATTEMPTS\tNEXT")
	for _, m := range due {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", m.ID, m.State, minute(m.Due), m.Attempts, minute(m.Next))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Println("(job-06 is not listed: its deadline, Dec 31, is ahead, so it is not due yet and Backlog counts it nowhere)")

	b, err := sweep.Backlog(ctx, 100)
	if err != nil {
		return err
	}
	fmt.Printf("\nBacklog: oldest %s, due %s, %v ago; due %d, retrying %d, held %d, parked %d, more %v\n",
		b.OldestID, minute(b.OldestDue), b.Age, b.Due, b.Retrying, b.Held, b.Parked, b.More)

	// A dry run of the same sweep: it counts, and changes nothing.
	dryCfg := cfg
	dryCfg.DryRun = true
	dryCfg.Clear = func(_ context.Context, id string) error { return fmt.Errorf("dry run called Clear(%s)", id) }
	dry, err := retention.New(kv, dryCfg)
	if err != nil {
		return err
	}
	st, err := dry.Pass(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("\ndry run: Stats.WouldClear %d, Cleared %d\n", st.WouldClear, st.Cleared)
	after, err := sweep.Pending(ctx, 20)
	if err != nil {
		return err
	}
	if !slices.Equal(after, due) {
		return fmt.Errorf("the dry run changed what is pending: %v, then %v", due, after)
	}
	fmt.Printf("Sweep.Pending after the dry run: the same %d markers\n", len(after))
	if err := pass(); err != nil {
		return err
	}
	fmt.Printf("jobs left: %s\n", jobsLeft(db))
	return nil
}

// minute formats t to the minute, or "-" for the zero time.
func minute(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("Jan 2 15:04")
}

// jobsLeft lists the ids of the jobs bucket.
func jobsLeft(db *bbolt.DB) []string {
	var ids []string
	_ = db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(jobs).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids
}
