package rediskv_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/rediskv"
)

// finishRun records a run's outcome and its marker in one MULTI. The state
// key carries the marker set's hash tag, {runs}, so that on Redis Cluster
// both live in one slot.
func finishRun(ctx context.Context, rdb *redis.Client, kv *rediskv.KV, id string, at time.Time) error {
	_, err := rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, "{runs}:state:"+id, "succeeded", 0)
		return kv.MarkTx(ctx, pipe, "runs/done/", id, at)
	})
	return err
}

// A service keeps runs and their markers in one Redis; every replica runs
// the sweep.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	kv, err := rediskv.New(rdb, "{runs}:done")
	if err != nil {
		log.Fatal(err)
	}
	if err := finishRun(ctx, rdb, kv, "run-1", time.Now()); err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Clear: func(ctx context.Context, id string) error {
			return rdb.Del(ctx, "{runs}:state:"+id).Err()
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
}

// orderNumber is a custom id rule: "order." and digits, which the default
// rule refuses for its '.'.
func orderNumber(id string) error {
	digits, ok := strings.CutPrefix(id, "order.")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("%q is not order.<digits>", id)
	}
	return nil
}

// finishOrder records an order's outcome and its marker in one MULTI. The
// sweep's MarkerKey checks the id by the sweep's rule, and MarkKeyTx queues
// the key it returns.
func finishOrder(ctx context.Context, rdb *redis.Client, kv *rediskv.KV, sweep *retention.Sweep, id string, at time.Time) error {
	key, err := sweep.MarkerKey(at, id)
	if err != nil {
		return err
	}
	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, "{orders}:state:"+id, "shipped", 0)
		return kv.MarkKeyTx(ctx, pipe, key)
	})
	return err
}

// A sweep whose ids follow their own rule (Config.ValidateID) writes its
// markers with MarkKeyTx: MarkTx checks ids by the default rule.
func ExampleKV_MarkKeyTx() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	kv, err := rediskv.New(rdb, "{orders}:done")
	if err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:     "orders/done/",
		Retention:  30 * 24 * time.Hour,
		ValidateID: orderNumber,
		Clear: func(ctx context.Context, id string) error {
			return rdb.Del(ctx, "{orders}:state:"+id).Err()
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := finishOrder(ctx, rdb, kv, sweep, "order.42", time.Now()); err != nil {
		log.Fatal(err)
	}
}

// newAtomicKV deletes a batch of runs' state keys with their markers, in
// one script.
func newAtomicKV(kv *rediskv.KV) (*rediskv.AtomicKV, error) {
	return kv.WithClear(func(ids []string) []string {
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = "{runs}:state:" + id
		}
		return keys
	})
}

// Runs' state and their markers live in one Redis: the store deletes both
// in one script, so each run is cleared exactly once.
func ExampleKV_WithClear() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	kv, err := rediskv.New(rdb, "{runs}:done")
	if err != nil {
		log.Fatal(err)
	}
	akv, err := newAtomicKV(kv)
	if err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(akv, retention.Config{Prefix: "runs/done/", Retention: 7 * 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(context.Background()))
}

// Runs' state lives in keys named by the run's id, so templates can name
// them: the store then reads, checks and clears each run of expired
// markers in one script call, and the sweep reads no page of them.
func ExampleKV_WithStateKeys() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	kv, err := rediskv.New(rdb, "{runs}:done")
	if err != nil {
		log.Fatal(err)
	}
	akv, err := kv.WithStateKeys("{runs}:state:<id>", "{runs}:log:<id>")
	if err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(akv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		BatchSize: 1000, // a run's size: what Redis does in one script call
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(context.Background()))
}

// Replicas of a service share one marker set; the lease lets one of them
// sweep at a time, and fences its marker deletes. The lease key carries the
// set's hash tag.
func ExampleNewLocker() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	kv, err := rediskv.New(rdb, "{runs}:done")
	if err != nil {
		log.Fatal(err)
	}
	lease, err := rediskv.NewLocker(rdb, "{runs}:lease", &rediskv.LockerOptions{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Lease:     lease,
		Clear: func(ctx context.Context, id string) error {
			return rdb.Del(ctx, "{runs}:state:"+id).Err()
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(context.Background()))
}

// Sweeps that share a Redis Cluster spread over its masters when each
// keeps its keys under a tag of its own: ShardTags gives tags that hash to
// slots spread evenly over the 16384, the same ones wherever and whenever
// they are computed.
func ExampleShardTags() {
	tags, err := rediskv.ShardTags("runs", 3)
	if err != nil {
		log.Fatal(err)
	}
	for _, tag := range tags {
		fmt.Println(tag+":done", rediskv.Slot(tag+":done"))
	}
	// Output:
	// {runs:0:4mk}:done 2730
	// {runs:1:1zd}:done 8192
	// {runs:2:f1k}:done 13653
}

// newClusterSweep returns one replica's sweep of finished runs in
// sc.Shards shards spread over the masters of a Redis Cluster. Shard i keeps
// its keys under the tag rediskv.ShardTags(name, sc.Shards)[i]: its markers
// in <tag>:done, its runs' state in <tag>:state:<id>, deleted with their
// markers in one script, and the lease that fences it in <tag>:lease. The
// replicas' keys, which they share the shards out by, live in a set of
// their own, {<name>}:replicas. cfg is a sweep's Config, Replica included;
// sc's Shards and Heartbeat are kept, its KV and Lease made here.
func newClusterSweep(rdb *redis.ClusterClient, name string, cfg retention.Config, sc retention.ShardConfig,
	lease *rediskv.LockerOptions) (*retention.Sharded, error) {
	tags, err := rediskv.ShardTags(name, sc.Shards)
	if err != nil {
		return nil, err
	}
	replicas, err := rediskv.New(rdb, "{"+name+"}:replicas")
	if err != nil {
		return nil, err
	}
	sc.KV = func(shard int, _ string) (retention.KV, error) {
		kv, err := rediskv.New(rdb, tags[shard]+":done")
		if err != nil {
			return nil, err
		}
		return kv.WithStateKeys(tags[shard] + ":state:<id>")
	}
	sc.Lease = func(shard int, _ string) (retention.Locker, error) {
		return rediskv.NewLocker(rdb, tags[shard]+":lease", lease)
	}
	return retention.NewSharded(replicas, cfg, sc)
}

// finishShardedRun records a run's outcome and its marker in one MULTI on
// the slot of the run's shard: tags are rediskv.ShardTags(name, n) of the
// sweep's name and number of shards, computed once. Every writer and
// replica finds the run's keys under the same tag.
func finishShardedRun(ctx context.Context, rdb *redis.ClusterClient, sweep *retention.Sharded, tags []string, id string, at time.Time) error {
	key, err := sweep.MarkerKey(at, id)
	if err != nil {
		return err
	}
	tag := tags[sweep.Shard(id)]
	kv, err := rediskv.New(rdb, tag+":done")
	if err != nil {
		return err
	}
	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, tag+":state:"+id, "succeeded", 0)
		return kv.MarkKeyTx(ctx, pipe, key)
	})
	return err
}
