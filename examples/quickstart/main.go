// Quickstart: a tiny job service keeps each finished job's output for two
// seconds, and a retention sweep clears it in the background.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/marksweep/retention"
)

const (
	jobPrefix    = "jobs/"      // job state: jobs/<id>
	markerPrefix = "jobs-done/" // terminal markers: jobs-done/<ts>/<id>
	keep         = 2 * time.Second
)

func main() {
	ctx := context.Background()
	kv := retention.NewMemKV() // state and markers share one store
	start := time.Now()

	// job-3's first clear fails, to show that a failed clear is retried.
	var failedOnce atomic.Bool
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    markerPrefix,
		Retention: keep,
		Interval:  time.Second,
		Clear: func(ctx context.Context, id string) error {
			if id == "job-3" && !failedOnce.Swap(true) {
				return errors.New("output store unavailable")
			}
			return kv.Delete(ctx, []byte(jobPrefix+id))
		},
		OnPass: func(st retention.Stats, err error) {
			next := "none"
			if !st.NextDue.IsZero() {
				next = fmt.Sprintf("in %v", time.Until(st.NextDue).Round(10*time.Millisecond))
			}
			fmt.Printf("%5.1fs  pass: cleared %d, failed %d, next due %s\n",
				time.Since(start).Seconds(), st.Cleared, st.Failed, next)
			if err != nil {
				fmt.Println("        pass error:", err)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sweep.Run(runCtx) }()

	// The service finishes a job every 400ms. A real service writes the
	// state and the marker in one transaction; MemKV has none, so here they
	// are two writes.
	for i := 1; i <= 5; i++ {
		id := fmt.Sprintf("job-%d", i)
		if err := kv.Put(ctx, []byte(jobPrefix+id), []byte("output of "+id)); err != nil {
			log.Fatal(err)
		}
		if err := retention.Mark(ctx, kv, markerPrefix, id, time.Now()); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%5.1fs  finished %s\n", time.Since(start).Seconds(), id)
		time.Sleep(400 * time.Millisecond)
	}

	time.Sleep(3 * time.Second)
	stop()
	<-done

	left, err := kv.Scan(ctx, []byte(jobPrefix), []byte("jobs0"), 100)
	if err != nil {
		log.Fatal(err)
	}
	markers, err := kv.Scan(ctx, []byte(markerPrefix), []byte("jobs-done0"), 100)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%5.1fs  done: %d job states and %d markers left\n", time.Since(start).Seconds(), len(left), len(markers))
}
