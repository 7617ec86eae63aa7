package retention_test

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/marksweep/retention"
)

// budgetedSweeps gives two sweeps over one database one delete budget:
// together they clear at most 20,000 entities a second.
func budgetedSweeps(kv retention.KV, clearRun, clearJob func(context.Context, []string) error) (runs, jobs *retention.Sweep, err error) {
	budget := rate.NewLimiter(20_000, 1_000) // entities a second, burst
	runs, err = retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: 7 * 24 * time.Hour, ClearBatch: clearRun, Limiter: budget,
	})
	if err != nil {
		return nil, nil, err
	}
	jobs, err = retention.New(kv, retention.Config{
		Prefix: "jobs/done/", Retention: 24 * time.Hour, ClearBatch: clearJob, Limiter: budget,
	})
	return runs, jobs, err
}

func ExampleConfig_limiter() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	longAgo := time.Now().Add(-30 * 24 * time.Hour)
	for i := range 3000 {
		_ = retention.Mark(ctx, kv, "runs/done/", fmt.Sprintf("run-%d", i), longAgo)
	}
	noop := func(context.Context, []string) error { return nil }
	runs, _, err := budgetedSweeps(kv, noop, noop)
	if err != nil {
		fmt.Println(err)
		return
	}
	// 3,000 entities at 20,000 a second with a burst of 1,000: the pass
	// waits about 0.1s for the budget (Stats.BudgetWait).
	st, err := runs.Pass(ctx)
	fmt.Println("cleared", st.Cleared, err, st.BudgetWait > 50*time.Millisecond)
	// Output:
	// cleared 3000 <nil> true
}
