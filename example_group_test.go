package retention_test

import (
	"context"
	"fmt"
	"time"

	"github.com/marksweep/retention"
)

// runGroup sweeps runs and batches, under two prefixes, from one loop under
// one lease (nil: none). The sweeps leave Config.Lease nil: the group's
// lease covers them.
func runGroup(ctx context.Context, kv retention.KV, lease retention.Locker, clearRun, clearBatch func(context.Context, string) error) error {
	runs, err := retention.New(kv, retention.Config{Prefix: "runs/done/", Retention: 7 * 24 * time.Hour, Clear: clearRun})
	if err != nil {
		return err
	}
	batches, err := retention.New(kv, retention.Config{Prefix: "batches/done/", Retention: 24 * time.Hour, Clear: clearBatch})
	if err != nil {
		return err
	}
	group, err := retention.NewGroup(retention.GroupConfig{Lease: lease, Jitter: 0.2}, runs, batches)
	if err != nil {
		return err
	}
	return group.Run(ctx) // one pass of each sweep per round, in order
}

func ExampleGroup_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	kv := retention.NewMemKV()
	longAgo := time.Now().Add(-30 * 24 * time.Hour)
	_ = retention.Mark(ctx, kv, "runs/done/", "run-1", longAgo)
	_ = retention.Mark(ctx, kv, "batches/done/", "batch-1", longAgo)

	clearRun := func(ctx context.Context, id string) error {
		fmt.Println("clearing run", id)
		return nil
	}
	clearBatch := func(ctx context.Context, id string) error {
		fmt.Println("clearing batch", id)
		cancel() // the example ends after the first round
		return nil
	}
	err := runGroup(ctx, kv, nil, clearRun, clearBatch)
	fmt.Println("Run returned:", err)
	// Output:
	// clearing run run-1
	// clearing batch batch-1
	// Run returned: context canceled
}

func ExampleGroup_Pass() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	_ = retention.Mark(ctx, kv, "runs/done/", "run-1", clock.Now().Add(-2*time.Hour))
	_ = retention.Mark(ctx, kv, "batches/done/", "batch-1", clock.Now().Add(-2*time.Hour))
	_ = retention.Mark(ctx, kv, "batches/done/", "batch-2", clock.Now().Add(-3*time.Hour))
	keep := func(context.Context, string) error { return nil }

	runs, err := retention.New(kv, retention.Config{Prefix: "runs/done/", Retention: 3 * time.Hour, Clock: clock, Clear: keep})
	if err != nil {
		fmt.Println(err)
		return
	}
	batches, err := retention.New(kv, retention.Config{Prefix: "batches/done/", Retention: time.Hour, Clock: clock, Clear: keep})
	if err != nil {
		fmt.Println(err)
		return
	}
	group, err := retention.NewGroup(retention.GroupConfig{}, runs, batches)
	if err != nil {
		fmt.Println(err)
		return
	}
	stats, err := group.Pass(ctx) // one pass of each sweep, without the lease
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("runs: cleared %d, batches: cleared %d\n", stats[0].Cleared, stats[1].Cleared)
	// Output:
	// runs: cleared 0, batches: cleared 2
}

func ExampleNewGroup() {
	kv := retention.NewMemKV()
	keep := func(context.Context, string) error { return nil }
	runs, _ := retention.New(kv, retention.Config{Prefix: "runs/", Retention: time.Hour, Clear: keep})
	runs2024, _ := retention.New(kv, retention.Config{Prefix: "runs/2024/", Retention: time.Hour, Clear: keep})
	_, err := retention.NewGroup(retention.GroupConfig{}, runs, runs2024)
	fmt.Println(err)
	// Output:
	// retention: invalid config: prefixes "runs/" and "runs/2024/" overlap: the markers of one lie where the other sweeps, so it would read them at every pass (as foreign keys)
}
