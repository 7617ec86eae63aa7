package retention_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/marksweep/retention"
)

// newShardedSweep is one replica's sweep of finished jobs in 16 shards:
// lease makes the lease of a shard (a store's NewLocker of a name per
// shard), pod names the replica. The Limiter is the budget of the whole
// fleet.
func newShardedSweep(kv retention.KV, lease func(shard int, prefix string) (retention.Locker, error), pod string,
	clearJob func(context.Context, string) error) (*retention.Sharded, error) {
	return retention.NewSharded(kv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		Clear:     clearJob,
		Replica:   pod,
		Limiter:   rate.NewLimiter(500, 50), // 500 jobs a second, whatever the replicas
	}, retention.ShardConfig{Shards: 16, Lease: lease})
}

// markJob writes the marker of a finished job under its shard's prefix. A
// real service writes the key in the transaction that records the job's
// outcome, as with a sweep of one shard.
func markJob(ctx context.Context, kv retention.Putter, sweep *retention.Sharded, id string, finished time.Time) error {
	key, err := sweep.MarkerKey(finished, id)
	if err != nil {
		return err
	}
	return kv.Put(ctx, key, nil)
}

// runBesideOldMarkers runs the sharded sweep and, beside it, a Sweep of
// the prefix itself that clears the markers written before the sweep was
// sharded (their Config but for its Lease, with one of its own); stop that
// one once its Backlog stays empty. No shard's key lies where it reads.
func runBesideOldMarkers(ctx context.Context, sharded *retention.Sharded, old *retention.Sweep) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Run(ctx) }()
	err := sharded.Run(ctx)
	cancel() // the old sweep stops with the sharded one
	if oldErr := <-oldDone; !errors.Is(oldErr, context.Canceled) {
		err = errors.Join(err, oldErr)
	}
	return err
}

func ExampleSharded_MarkerKey() {
	sweep, err := retention.NewSharded(retention.NewMemKV(), retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		Clear:     func(context.Context, string) error { return nil },
	}, retention.ShardConfig{Shards: 16})
	if err != nil {
		fmt.Println(err)
		return
	}
	finished := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	key, _ := sweep.MarkerKey(finished, "job-42") // or retention.MarkerKey(retention.ShardPrefix(prefix, retention.ShardOf(id, 16)), ...)
	fmt.Printf("%s\n", key)
	fmt.Println(sweep.Shard("job-42"), retention.ShardOf("job-42", 16), retention.ShardPrefix("jobs/done/", 9))
	// Output:
	// jobs/done/s009/00000001795953600000/job-42
	// 9 9 jobs/done/s009/
}

func ExampleSharded_Pass() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	sweep, err := retention.NewSharded(kv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		Clock:     retention.NewManualClock(now),
		Clear:     func(context.Context, string) error { return nil },
	}, retention.ShardConfig{Shards: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{"job-1", "job-2", "job-3", "job-4", "job-5", "job-6"} {
		_ = markJob(ctx, kv, sweep, id, now.Add(-48*time.Hour))
	}
	_ = markJob(ctx, kv, sweep, "job-7", now) // not due for a day

	total, shards, err := sweep.Pass(ctx)
	fmt.Println("cleared", total.Cleared, err)
	for i, st := range shards {
		fmt.Printf("shard %d (%s): cleared %d\n", i, sweep.Shards()[i].Prefix(), st.Cleared)
	}
	backlog, _, _ := sweep.Backlog(ctx, 100)
	fmt.Println("due", backlog.Due, "next due in", total.NextDue.Sub(now))
	// Output:
	// cleared 6 <nil>
	// shard 0 (jobs/done/s000/): cleared 1
	// shard 1 (jobs/done/s001/): cleared 1
	// shard 2 (jobs/done/s002/): cleared 3
	// shard 3 (jobs/done/s003/): cleared 1
	// due 0 next due in 24h0m0s
}

func ExampleSharded_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	kv := retention.NewMemKV()
	lockers := map[string]*localLocker{} // a store's NewLocker, one lease per name
	lease := func(_ int, prefix string) (retention.Locker, error) {
		if lockers[prefix] == nil {
			lockers[prefix] = &localLocker{}
		}
		return lockers[prefix], nil
	}
	var (
		mu      sync.Mutex
		cleared []string
	)
	clearJob := func(_ context.Context, id string) error {
		mu.Lock()
		defer mu.Unlock()
		if cleared = append(cleared, id); len(cleared) == 2 {
			cancel() // the example ends once both are cleared
		}
		return nil
	}
	sharded, err := newShardedSweep(kv, lease, "pod-1", clearJob)
	if err != nil {
		fmt.Println(err)
		return
	}
	oldLease := &localLocker{} // the lease the sweep had before it was sharded
	old, err := retention.New(kv, retention.Config{Prefix: "jobs/done/", Retention: 24 * time.Hour, Clear: clearJob, Replica: "pod-1", Lease: oldLease})
	if err != nil {
		fmt.Println(err)
		return
	}
	longAgo := time.Now().Add(-48 * time.Hour)
	_ = retention.Mark(ctx, kv, "jobs/done/", "job-1", longAgo) // written before the sweep was sharded
	_ = markJob(ctx, kv, sharded, "job-2", longAgo)

	err = runBesideOldMarkers(ctx, sharded, old)
	slices.Sort(cleared)
	fmt.Println("cleared", cleared)
	fmt.Println("Run returned:", err)
	// Output:
	// cleared [job-1 job-2]
	// Run returned: context canceled
}
