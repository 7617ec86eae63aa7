package retention_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/marksweep/retention"
)

// health reports a sweep as unhealthy when its oldest uncleared entity is
// more than 15 minutes past due, or when some ids are parked: the check a
// readiness probe or an admin page makes without Prometheus.
func health(ctx context.Context, sweep *retention.Sweep) error {
	b, err := sweep.Backlog(ctx, 100)
	if err != nil {
		return err
	}
	if b.Age > 15*time.Minute {
		return fmt.Errorf("%s: %s behind (%d due, oldest %s)", sweep.Prefix(), b.Age, b.Due, b.OldestID)
	}
	if b.Parked > 0 {
		return fmt.Errorf("%s: %d ids parked", sweep.Prefix(), b.Parked)
	}
	return nil
}

func ExampleSweep_Backlog() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	_ = retention.Mark(ctx, kv, "runs/done/", "run-1", now.Add(-25*time.Hour))
	_ = retention.Mark(ctx, kv, "runs/done/", "run-2", now.Add(-24*time.Hour-20*time.Minute))
	sweep, err := retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: 24 * time.Hour,
		Clock: retention.NewManualClock(now), Clear: deleteRun,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(health(ctx, sweep)) // before any pass
	_, _ = sweep.Pass(ctx)
	fmt.Println(health(ctx, sweep))
	// Output:
	// runs/done/: 1h0m0s behind (2 due, oldest run-1)
	// <nil>
}

func ExampleSweep_Pending() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := retention.NewManualClock(now)
	_ = retention.Mark(ctx, kv, "runs/done/", "run-1", now.Add(-26*time.Hour))
	_ = retention.Mark(ctx, kv, "runs/done/", "run-2", now.Add(-25*time.Hour))
	sweep, err := retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: 24 * time.Hour, Clock: clock,
		RetryDelay: time.Minute,
		Clear: func(_ context.Context, id string) error {
			if id == "run-1" {
				return errors.New("state store down")
			}
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = retention.Mark(ctx, kv, "runs/done/", "run-3", now.Add(-24*time.Hour-time.Minute))
	_, _ = sweep.Pass(ctx)                                                                 // run-1 fails, run-2 and run-3 go
	_ = retention.Mark(ctx, kv, "runs/done/", "run-4", now.Add(-24*time.Hour-time.Second)) // written late
	pending, _ := sweep.Pending(ctx, 10)
	for _, m := range pending {
		fmt.Printf("%s %s due %s attempts %d\n", m.ID, m.State, m.Due.Format(time.TimeOnly), m.Attempts)
	}
	// Output:
	// run-1 retrying due 10:00:00 attempts 1
	// run-4 due due 11:59:59 attempts 0
}

func ExampleSweep_Requeue() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := retention.NewManualClock(now)
	_ = retention.Mark(ctx, kv, "runs/done/", "run-1", now.Add(-25*time.Hour))
	fixed := false
	sweep, err := retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: 24 * time.Hour, Clock: clock,
		MaxAttempts: 2, // park an id after two failed clears in a row
		Clear: func(_ context.Context, id string) error {
			if !fixed {
				return errors.New("bad data")
			}
			fmt.Println("cleared", id)
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		st, _ := sweep.Pass(ctx)
		fmt.Println("failed", st.Failed, "parked", st.Parked)
		clock.Advance(time.Hour) // past the retry delay
	}
	parked, _ := sweep.Parked(ctx, 10)
	fmt.Println("parked:", parked[0].ID)
	fixed = true
	n, _ := sweep.Requeue(ctx, "run-1")
	fmt.Println("requeued", n)
	_, _ = sweep.Pass(ctx)
	// Output:
	// failed 1 parked 0
	// failed 1 parked 1
	// parked: run-1
	// requeued 1
	// cleared run-1
}
