package retention_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/marksweep/retention"
)

// jobStore keeps jobs and their markers in one store, so that it can clear
// a batch of jobs and delete their markers in one step: a
// retention.ClearDeleter. pgkv.KV.WithClear, rediskv.KV.WithClear and
// sqlkv.KV.WithClear make one over a real database, in one transaction.
type jobStore struct {
	*retention.MemKV // the markers; its Move makes the store a Mover
	mu               sync.Mutex
	jobs             map[string]string
}

// ClearAndDelete deletes the jobs and their markers together, and only if
// every marker is still there, so that a call sent twice clears nothing twice.
func (s *jobStore) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if _, ok, err := s.Get(ctx, k); err != nil || !ok {
			return fmt.Errorf("marker %q: %w", k, retention.ErrMarkerGone)
		}
	}
	for _, id := range ids {
		delete(s.jobs, id)
	}
	return s.Delete(ctx, keys...)
}

func ExampleClearDeleter() {
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	store := &jobStore{MemKV: retention.NewMemKV(), jobs: map[string]string{}}
	for i, id := range []string{"job-1", "job-2", "job-3"} {
		store.jobs[id] = "succeeded"
		_ = retention.Mark(ctx, store, "jobs/done/", id, now.Add(time.Duration(i-3)*time.Hour))
	}
	// Neither Clear nor ClearBatch: the store clears, in the step that
	// deletes the markers.
	sweep, err := retention.New(store, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 90 * time.Minute,
		Clock:     retention.NewManualClock(now),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	st, err := sweep.Pass(ctx)
	fmt.Println("cleared", st.Cleared, "calls", st.ClearCalls, err)
	fmt.Println("jobs left", len(store.jobs), "markers left", store.Len())
	// Output:
	// cleared 2 calls 1 <nil>
	// jobs left 1 markers left 1
}
