package retention_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/marksweep/retention"
)

// newJobBatchSweep clears jobs a batch at a time: one call deletes up to
// BatchSize ids. A BatchError names the ids that failed; the others of the
// batch count as cleared.
func newJobBatchSweep(kv retention.KV, clock retention.Clock, deleteJobs func(context.Context, []string) (failed map[string]error, err error)) (*retention.Sweep, error) {
	return retention.New(kv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		Clock:     clock,
		BatchSize: 500,
		ClearBatch: func(ctx context.Context, ids []string) error {
			failed, err := deleteJobs(ctx, ids)
			if err != nil {
				return err // the whole batch failed: the sweep splits it to find the ids at fault
			}
			if len(failed) > 0 {
				return retention.BatchError(failed)
			}
			return nil
		},
	})
}

func ExampleConfig_clearBatch() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := retention.NewManualClock(now)
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		_ = retention.Mark(ctx, kv, "jobs/done/", id, now.Add(-48*time.Hour))
	}
	deleteJobs := func(_ context.Context, ids []string) (map[string]error, error) {
		fmt.Println("delete", strings.Join(ids, " "))
		return map[string]error{"job-2": errors.New("foreign key violation")}, nil
	}
	sweep, err := newJobBatchSweep(kv, clock, deleteJobs)
	if err != nil {
		fmt.Println(err)
		return
	}
	st, err := sweep.Pass(ctx)
	fmt.Println("cleared", st.Cleared, "failed", st.Failed, "calls", st.ClearCalls, err)
	// Output:
	// delete job-1 job-2 job-3
	// cleared 2 failed 1 calls 1 <nil>
}
