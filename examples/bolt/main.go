// Bolt: a job service that keeps its state in a bbolt file and survives a
// restart. Jobs finished before the restart are swept after it: the first
// pass of Run happens at once and finds their markers on disk.
//
//	go run ./examples/bolt              # a fresh file in a temporary directory
//	go run ./examples/bolt -db jobs.db  # keep the file between runs
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
)

const keep = time.Second

var jobs = []byte("jobs")

func main() {
	path := flag.String("db", "", "bbolt file (default: a new temporary file)")
	flag.Parse()
	if *path == "" {
		dir, err := os.MkdirTemp("", "retention-bolt")
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
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	kv, err := boltkv.New(db, "markers")
	if err != nil {
		log.Fatal(err)
	}
	say("process started; %d jobs on disk", countJobs(db))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	firstPass := make(chan struct{})
	var once sync.Once
	if runFor > 0 {
		sweep, err := retention.New(kv, retention.Config{
			Prefix:    "jobs/done/",
			Retention: keep,
			Clear: func(_ context.Context, id string) error {
				return db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(jobs).Delete([]byte(id)) })
			},
			OnPass: func(st retention.Stats, err error) {
				defer once.Do(func() { close(firstPass) })
				if st.Cleared > 0 || err != nil {
					say("pass cleared %d (oldest %v overdue), error %v; %d jobs on disk", st.Cleared, st.MaxLag.Round(time.Millisecond), err, countJobs(db))
				}
			},
		})
		if err != nil {
			log.Fatal(err)
		}
		go func() { done <- sweep.Run(ctx) }()
		<-firstPass // shown first for a tidy demo; a service need not wait
	} else {
		close(done)
	}

	for _, id := range finish {
		// The outcome and the marker commit in one transaction.
		err := db.Update(func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(jobs)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(id), []byte("succeeded")); err != nil {
				return err
			}
			return kv.MarkTx(tx, "jobs/done/", id, time.Now())
		})
		if err != nil {
			log.Fatal(err)
		}
		say("finished %s", id)
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(runFor)
	cancel()
	<-done
}

func countJobs(db *bbolt.DB) int {
	n := 0
	_ = db.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket(jobs); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	return n
}
