package rediskv_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/rediskv"
)

// clusterEnv names the test cluster's masters, comma-separated: scripts/test
// starts three and sets it.
const clusterEnv = "RETENTION_REDIS_CLUSTER"

// newClusterClient connects to the test cluster, and closes the client when
// t ends.
func newClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := strings.Split(kvtest.ServerAddr(t, clusterEnv), ",")
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 8})
	t.Cleanup(func() { assert.NoError(t, rdb.Close()) })
	return rdb
}

// connectCluster is newClusterClient, checked: every master answers.
func connectCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rdb := newClusterClient(t)
	require.NoError(t, rdb.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		return m.Ping(ctx).Err()
	}))
	return rdb
}

// newClusterStore is newStore on the cluster.
func newClusterStore(t testing.TB) kvtest.Store {
	rdb := connectCluster(t)
	key := freshKey(t, rdb)
	kv, err := rediskv.New(rdb, key)
	require.NoError(t, err)
	return kvtest.Store{
		KV:  kv,
		Put: func(ctx context.Context, k []byte) error { return kv.Put(ctx, k, nil) },
	}
}

// TestClusterConformance runs the conformance suite over a KV and the
// AtomicKVs on a Redis Cluster of three masters, each store's keys under
// one hash tag: the set, and the state keys WithStateKeys' runs name in
// their script.
func TestClusterConformance(t *testing.T) {
	kvtest.ServerAddr(t, clusterEnv) // skip once, not in every behaviour
	t.Run("KV", func(t *testing.T) { kvtest.Run(t, newClusterStore) })
	t.Run("WithStateKeys", func(t *testing.T) {
		kvtest.Run(t, func(t testing.TB) kvtest.Store {
			r := newRunSetOn(t, connectCluster(t))
			return kvtest.Store{KV: r.akv, Put: func(ctx context.Context, k []byte) error { return r.kv.Put(ctx, k, nil) }}
		})
	})
	t.Run("WithClear", func(t *testing.T) {
		kvtest.Run(t, func(t testing.TB) kvtest.Store {
			r := newRunSetOn(t, connectCluster(t))
			akv, err := r.kv.WithClear(func(ids []string) []string {
				var keys []string
				for _, id := range ids {
					keys = append(keys, r.stateKeys(id)...)
				}
				return keys
			})
			require.NoError(t, err)
			return kvtest.Store{KV: akv, Put: func(ctx context.Context, k []byte) error { return r.kv.Put(ctx, k, nil) }}
		})
	})
}

// TestClusterFleet runs the fleet proofs on the cluster: replicas with
// cluster clients of their own, the lease key and state keys under the
// marker set's hash tag.
func TestClusterFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet proofs take a while")
	}
	kvtest.ServerAddr(t, clusterEnv)
	leasetest.Run(t, func(t testing.TB) leasetest.Harness {
		return newHarnessOn(t, connectCluster(t), func(t testing.TB) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(kvtest.ServerAddr(t, clusterEnv), ","), PoolSize: 8})
		})
	})
}
