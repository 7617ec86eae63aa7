package retention_test

import (
	"context"
	"fmt"
	"time"

	"github.com/marksweep/retention"
)

// finishRun records that a run finished at t. A real service writes the
// marker in the transaction that records the run's outcome: every adapter
// has a MarkTx (etcdkv a MarkOp) for that.
func finishRun(ctx context.Context, kv *retention.MemKV, runID string, t time.Time) error {
	key, err := retention.MarkerKey("runs/done/", t, runID)
	if err != nil {
		return err
	}
	return kv.Put(ctx, key, nil)
}

// startRunSweep clears each run's state a week after it finished, in the
// background until ctx is done.
func startRunSweep(ctx context.Context, kv retention.KV, deleteRunState func(context.Context, string) error) error {
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Clear:     deleteRunState, // must be idempotent: nil when nothing is left
	})
	if err != nil {
		return err
	}
	go sweep.Run(ctx) // first pass at once, then whenever the next marker falls due
	return nil
}

func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv := retention.NewMemKV() // or your own store behind retention.KV
	_ = finishRun(ctx, kv, "run-1", time.Now().Add(-8*24*time.Hour))
	_ = finishRun(ctx, kv, "run-2", time.Now())

	cleared := make(chan string)
	err := startRunSweep(ctx, kv, func(ctx context.Context, id string) error {
		select {
		case cleared <- id:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("cleared", <-cleared)
	// Output:
	// cleared run-1
}

func ExampleSweep_Pass() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))

	// Two runs finished: one two hours ago, one ten minutes ago. A real
	// service writes the marker in the transaction that records the outcome.
	_ = retention.Mark(ctx, kv, "runs/done/", "run-1", clock.Now().Add(-2*time.Hour))
	_ = retention.Mark(ctx, kv, "runs/done/", "run-2", clock.Now().Add(-10*time.Minute))

	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: time.Hour,
		Clock:     clock,
		Clear: func(ctx context.Context, id string) error {
			fmt.Println("clearing", id)
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	st, err := sweep.Pass(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("cleared %d, %d marker left, next due %s\n", st.Cleared, kv.Len(), st.NextDue.Format(time.Kitchen))
	// Output:
	// clearing run-1
	// cleared 1, 1 marker left, next due 12:50PM
}

func ExampleSweep_Run() {
	kv := retention.NewMemKV()
	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	_ = retention.Mark(context.Background(), kv, "jobs/", "job-1", clock.Now().Add(-3*time.Hour))
	_ = retention.Mark(context.Background(), kv, "jobs/", "job-2", clock.Now().Add(-40*time.Minute))

	ctx, cancel := context.WithCancel(context.Background())
	passes := 0
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "jobs/",
		Retention: time.Hour,
		Clock:     clock,
		// The manual clock does not move by itself; a short Interval keeps
		// the example quick while OnPass moves the clock on.
		Interval: 10 * time.Millisecond,
		Clear:    func(context.Context, string) error { return nil },
		OnPass: func(st retention.Stats, err error) {
			passes++
			next := "none"
			if !st.NextDue.IsZero() {
				next = st.NextDue.Format(time.Kitchen)
			}
			fmt.Printf("%s pass %d: cleared %d, next due %s\n", clock.Now().Format(time.Kitchen), passes, st.Cleared, next)
			if passes == 3 {
				cancel()
			}
			clock.Advance(15 * time.Minute)
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = sweep.Run(ctx) // first pass at once; returns when ctx is cancelled
	fmt.Println("Run returned:", err)
	// Output:
	// 12:00PM pass 1: cleared 1, next due 12:20PM
	// 12:15PM pass 2: cleared 0, next due 12:20PM
	// 12:30PM pass 3: cleared 1, next due none
	// Run returned: context canceled
}
