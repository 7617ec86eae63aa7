package rediskv_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/rediskv"
)

// clusterShardProcsEngine is the leasetest.ShardEngine of the test cluster,
// laid out as newClusterSweep lays a sweep out: shard i's markers in the
// set <tag>:done of ShardTags(name, 16)[i], its lease in <tag>:lease, the
// replicas' keys in {<name>}:replicas. The store's name is the sweep's.
//
// A script deletes keys but cannot count, so each process records its
// clears by deleting keys of its own: the writer sets, beside each
// entity's state <tag>:state:<id>, a key <tag>:by:<process>:<id> for every
// process, and a process's AtomicKV (WithStateKeys, a RunClearer) deletes
// the state and its own key in the script that deletes the marker. The
// keys gone tell which processes cleared an entity; a second clear by the
// same process would not show, but it would need the marker back.
func clusterShardProcsEngine(t *testing.T) leasetest.ShardEngine {
	addrs := strings.Split(kvtest.ServerAddr(t, clusterEnv), ",")
	var (
		admin     *redis.ClusterClient // the test process's, made by Setup
		tags      []string
		processes []string
		mu        sync.Mutex
		written   []string // every key Finish set, for the cleanup
	)
	state := func(tag, id string) string { return tag + ":state:" + id }
	by := func(tag, process, id string) string { return tag + ":by:" + process + ":" + id }
	tagOf := func(id string) string { return tags[retention.ShardOf(id, len(tags))] }
	return leasetest.ShardEngine{
		TTL:       3 * time.Second,
		Heartbeat: 500 * time.Millisecond,
		Interval:  3 * time.Second,
		Setup: func(t testing.TB, shards int, procs []string) string {
			admin = connectCluster(t)
			var name string
			name, tags = clusterSweepName(t, admin, shards)
			processes = procs
			t.Cleanup(func() {
				mu.Lock()
				defer mu.Unlock()
				unlinkAll(admin, written)
			})
			return name
		},
		Connect: func(_ context.Context, name string, p leasetest.ShardProcess) (leasetest.ShardReplica, error) {
			shardTags, err := rediskv.ShardTags(name, p.Shards)
			if err != nil {
				return leasetest.ShardReplica{}, err
			}
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 8})
			replicas, err := rediskv.New(rdb, "{"+name+"}:replicas")
			if err != nil {
				_ = rdb.Close()
				return leasetest.ShardReplica{}, err
			}
			return leasetest.ShardReplica{
				KV: replicas,
				ShardKV: func(shard int, _ string) (retention.KV, error) {
					tag := shardTags[shard]
					kv, err := rediskv.New(rdb, tag+":done")
					if err != nil {
						return nil, err
					}
					return kv.WithStateKeys(state(tag, "<id>"), by(tag, p.Process, "<id>"))
				},
				Lease: func(shard int, _ string) (retention.Locker, error) {
					return rediskv.NewLocker(rdb, shardTags[shard]+":lease", &rediskv.LockerOptions{TTL: p.TTL})
				},
				Close: func() { _ = rdb.Close() },
			}, nil
		},
		// Each shard's entities, their state and marker, in a MULTI of its
		// own: a MULTI names keys of one slot.
		Finish: func(ctx context.Context, _ string, ids []string, keys [][]byte) error {
			byTag := map[string][]int{}
			for i, id := range ids {
				byTag[tagOf(id)] = append(byTag[tagOf(id)], i)
			}
			for tag, idx := range byTag {
				kv, err := rediskv.New(admin, tag+":done")
				if err != nil {
					return err
				}
				var set []string
				for _, i := range idx {
					set = append(set, state(tag, ids[i]))
					for _, p := range processes {
						set = append(set, by(tag, p, ids[i]))
					}
				}
				mu.Lock()
				written = append(written, set...)
				mu.Unlock()
				_, err = admin.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
					for _, k := range set {
						pipe.Set(ctx, k, "", 0)
					}
					for _, i := range idx {
						if err := kv.MarkKeyTx(ctx, pipe, keys[i]); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
			return nil
		},
		Clears: func(ctx context.Context, _ string, ids []string) (map[string][]string, error) {
			clears := map[string][]string{}
			for chunk := range slices.Chunk(ids, 500) {
				states := make([]*redis.IntCmd, len(chunk))
				bys := make([][]*redis.IntCmd, len(chunk))
				_, err := admin.Pipelined(ctx, func(pipe redis.Pipeliner) error {
					for i, id := range chunk {
						states[i] = pipe.Exists(ctx, state(tagOf(id), id))
						for _, p := range processes {
							bys[i] = append(bys[i], pipe.Exists(ctx, by(tagOf(id), p, id)))
						}
					}
					return nil
				})
				if err != nil {
					return nil, err
				}
				for i, id := range chunk {
					for k, p := range processes {
						if bys[i][k].Val() == 0 {
							clears[id] = append(clears[id], p)
						}
					}
					if cleared := len(clears[id]) > 0; cleared == (states[i].Val() == 1) {
						return nil, fmt.Errorf("%s: its state present %v, cleared by %v: a script deletes both or neither", id, !cleared, clears[id])
					}
				}
			}
			return clears, nil
		},
		Remaining: func(ctx context.Context, _ string) (int, error) {
			n := 0
			for i, tag := range tags {
				members, err := admin.ZRange(ctx, tag+":done", 0, -1).Result()
				if err != nil {
					return 0, err
				}
				for _, m := range members {
					// The shard's own keys (its wake key, its passes) are
					// not markers.
					if _, _, err := retention.ParseMarkerKey(retention.ShardPrefix(leasetest.Prefix, i), []byte(m)); err == nil {
						n++
					}
				}
			}
			return n, nil
		},
		Members: func(ctx context.Context, name string) (int, error) {
			n, err := admin.ZLexCount(ctx, "{"+name+"}:replicas", "["+leasetest.Prefix+"#m", "("+leasetest.Prefix+"#n").Result()
			return int(n), err
		},
	}
}

// TestClusterShardedProcessesKilledAndStopped runs
// leasetest.RunShardedProcesses on the test cluster: 4 replica processes of
// a sweep of 16 shards spread over the three masters, each with a cluster
// client of its own; one SIGKILLed and one SIGSTOPped mid-run, then
// resumed and restarted, then one stopped: each shard taken within TTL +
// Interval, the shares within one of even within 2 TTLs, and every entity
// cleared exactly once, by one process, with its marker.
func TestClusterShardedProcessesKilledAndStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	leasetest.RunShardedProcesses(t, clusterShardProcsEngine(t))
}

// TestClusterShardFleet runs the fleet proofs (leasetest.Run) on shards of
// a sweep laid out as newClusterSweep lays it out, one on each master of
// the test cluster: the marker set, the lease key and the entities' state
// under the shard's tag of ShardTags(name, 16).
func TestClusterShardFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet proofs take a while")
	}
	kvtest.ServerAddr(t, clusterEnv)
	for _, shard := range []int{0, 7, 15} {
		t.Run(fmt.Sprintf("shard %d of 16", shard), func(t *testing.T) {
			t.Parallel()
			leasetest.Run(t, func(t testing.TB) leasetest.Harness {
				admin := connectCluster(t)
				_, tags := clusterSweepName(t, admin, 16)
				return newShardHarness(t, admin, tags[shard])
			})
		})
	}
}

// newShardHarness is the fleet proofs' harness over the keys of a shard of
// tag on the test cluster: the marker set <tag>:done, the lease key
// <tag>:lease and the state keys <tag>:state:<id>; each replica has a
// cluster client of its own.
func newShardHarness(t testing.TB, admin *redis.ClusterClient, tag string) leasetest.Harness {
	markers, leaseKey := tag+":done", tag+":lease"
	state := func(id string) string { return tag + ":state:" + id }
	var (
		mu     sync.Mutex
		states []string
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		unlinkAll(admin, states)
	})
	writer, err := rediskv.New(admin, markers)
	require.NoError(t, err)
	return leasetest.Harness{
		TTL: leaseTTL,
		NewReplica: func(t testing.TB) leasetest.Replica {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(kvtest.ServerAddr(t, clusterEnv), ","), PoolSize: 8})
			closed := false
			t.Cleanup(func() {
				if !closed {
					assert.NoError(t, rdb.Close())
				}
			})
			kv, err := rediskv.New(rdb, markers)
			require.NoError(t, err)
			locker, err := rediskv.NewLocker(rdb, leaseKey, &rediskv.LockerOptions{TTL: leaseTTL})
			require.NoError(t, err)
			return leasetest.Replica{
				KV:     kv,
				Locker: locker,
				Clear:  func(ctx context.Context, id string) error { return rdb.Del(ctx, state(id)).Err() },
				// The process dies: its connections close and renewals stop.
				Kill: func() {
					closed = true
					_ = rdb.Close()
				},
			}
		},
		Finish: func(ctx context.Context, prefix string, ids []string, at time.Time) error {
			mu.Lock()
			for _, id := range ids {
				states = append(states, state(id))
			}
			mu.Unlock()
			_, err := admin.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				for _, id := range ids {
					pipe.Set(ctx, state(id), "succeeded", 0)
					if err := writer.MarkTx(ctx, pipe, prefix, id, at); err != nil {
						return err
					}
				}
				return nil
			})
			return err
		},
		Present: func(ctx context.Context, ids []string) (map[string]bool, error) {
			cmds := make([]*redis.IntCmd, len(ids))
			_, err := admin.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				for i, id := range ids {
					cmds[i] = pipe.Exists(ctx, state(id))
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			present := map[string]bool{}
			for i, id := range ids {
				present[id] = cmds[i].Val() == 1
			}
			return present, nil
		},
		// As if the key expired: the holder finds out at its next renewal.
		Expire: func(t testing.TB) { require.NoError(t, admin.Del(context.Background(), leaseKey).Err()) },
	}
}
