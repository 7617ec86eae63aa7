package rediskv_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
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

func TestShardTags(t *testing.T) {
	tests := []struct {
		n         int
		wantSlots []int
	}{
		{1, []int{8192}},
		{2, []int{4096, 12288}},
		{3, []int{2730, 8192, 13653}},
		{4, []int{2048, 6144, 10240, 14336}},
	}
	for _, tt := range tests {
		tags, err := rediskv.ShardTags("sweeps", tt.n)
		require.NoError(t, err)
		require.Len(t, tags, tt.n)
		for i, tag := range tags {
			assert.True(t, strings.HasPrefix(tag, fmt.Sprintf("{sweeps:%d:", i)) && strings.HasSuffix(tag, "}"), "ShardTags(sweeps, %d)[%d] = %q", tt.n, i, tag)
			assert.Equal(t, tt.wantSlots[i], rediskv.Slot(tag+":done"), "Slot(%q)", tag+":done")
		}
		again, err := rediskv.ShardTags("sweeps", tt.n)
		require.NoError(t, err)
		assert.Equal(t, tags, again, "the tags depend on the name and n alone")
	}

	// Many shards: one slot each, in order, every part of the slot space.
	tags, err := rediskv.ShardTags("jobs/done", 1000)
	require.NoError(t, err)
	for i, tag := range tags {
		s := rediskv.Slot(tag)
		require.Equal(t, (2*i+1)*16384/2000, s, "Slot(%q), tag %d of 1000", tag, i)
	}

	for _, bad := range []struct {
		name    string
		n       int
		wantErr string
	}{
		{"", 3, `rediskv: ShardTags: name "" must not be empty nor hold '{' or '}'`},
		{"a{b", 3, `rediskv: ShardTags: name "a{b" must not be empty nor hold '{' or '}'`},
		{"a}b", 3, `rediskv: ShardTags: name "a}b" must not be empty nor hold '{' or '}'`},
		{"sweeps", 0, "rediskv: ShardTags: n must be 1 to 16384, got 0"},
		{"sweeps", 16385, "rediskv: ShardTags: n must be 1 to 16384, got 16385"},
	} {
		tags, err := rediskv.ShardTags(bad.name, bad.n)
		assert.EqualError(t, err, bad.wantErr)
		assert.Nil(t, tags)
	}
}

// TestShardTagsReach checks the bound of ShardTags' search: the four-digit
// base-36 numbers reach every slot. CRC16 is linear, so the slots of
// suffixes of one length after any prefix are those after none, each
// XORed with one value that depends on the prefix alone: all of them
// after none means all of them after any.
func TestShardTagsReach(t *testing.T) {
	var reached [16384]bool
	n := 0
	for k := 36 * 36 * 36; k < 36*36*36*36; k++ {
		if s := rediskv.Slot(strconv.FormatInt(int64(k), 36)); !reached[s] {
			reached[s] = true
			n++
		}
	}
	assert.Equal(t, 16384, n, "slots reached")
}

// clusterOwners returns the address of the master that serves each slot,
// as CLUSTER SHARDS tells.
func clusterOwners(t testing.TB, rdb *redis.ClusterClient) map[int]string {
	t.Helper()
	shards, err := rdb.ClusterShards(context.Background()).Result()
	require.NoError(t, err)
	owners := map[int]string{}
	for _, shard := range shards {
		master := ""
		for _, node := range shard.Nodes {
			if node.Role == "master" {
				master = net.JoinHostPort(node.IP, strconv.FormatInt(node.Port, 10))
			}
		}
		require.NotEmpty(t, master, "shard %v has a master", shard.Slots)
		for _, r := range shard.Slots {
			for s := r.Start; s <= r.End; s++ {
				owners[int(s)] = master
			}
		}
	}
	require.Len(t, owners, 16384, "every slot is served")
	return owners
}

// TestSlotIsClusterKeyslot: Slot agrees with the cluster's CLUSTER KEYSLOT.
func TestSlotIsClusterKeyslot(t *testing.T) {
	rdb := connectCluster(t)
	keys := []string{"runs:done", "{runs}:done", "{runs}:lease", "foo{}{bar}", "{}", "{a}{b}", "a{b", "a}b{c}", "", "\xff\x00"}
	tags, err := rediskv.ShardTags("sweeps", 16)
	require.NoError(t, err)
	keys = append(keys, tags...)
	for _, key := range keys {
		want, err := rdb.ClusterKeySlot(context.Background(), key).Result()
		require.NoError(t, err)
		assert.Equal(t, int(want), rediskv.Slot(key), "Slot(%q)", key)
	}
}

// TestShardTagsSpreadOverMasters: on the test cluster, whose three masters
// own a third of the slots each (redis-cli --cluster create), n tags of
// ShardTags spread over the masters within one of even (where the markers
// of sharded sweeps go: TestClusterShardedMarkersSpread).
func TestShardTagsSpreadOverMasters(t *testing.T) {
	rdb := connectCluster(t)
	owners := clusterOwners(t, rdb)
	masters := map[string]bool{}
	for _, addr := range owners {
		masters[addr] = true
	}
	require.Len(t, masters, 3, "the test cluster has three masters")

	for _, n := range []int{2, 3, 4, 6, 16, 100} {
		tags, err := rediskv.ShardTags("spread", n)
		require.NoError(t, err)
		per := map[string]int{}
		for _, tag := range tags {
			per[owners[rediskv.Slot(tag)]]++
		}
		for addr := range masters {
			assert.InDelta(t, float64(n)/3, per[addr], 1, "%d tags: %d on %s (%v)", n, per[addr], addr, per)
		}
	}
}

// wrappedCluster is a client of one's own around a cluster client: the KV
// cannot see that it is a cluster's.
type wrappedCluster struct{ *redis.ClusterClient }

// TestClusterCrossSlot: keys that one script names off the marker set's
// slot are refused before anything is sent, with ErrCrossSlot: a
// template at WithStateKeys, a state key of WithClear's KeysFunc at the
// clear, a lease key at the fenced write. Through a client that hides the
// cluster, Redis refuses the script (CROSSSLOT), which matches
// ErrCrossSlot too, having changed nothing.
func TestClusterCrossSlot(t *testing.T) {
	admin := connectCluster(t)
	ctx := context.Background()
	universal := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: strings.Split(kvtest.ServerAddr(t, clusterEnv), ",")})
	t.Cleanup(func() { assert.NoError(t, universal.Close()) })
	set := freshKey(t, admin)
	tag := strings.TrimSuffix(set, ":markers")
	offSlot := func(id string) string { return "state:" + id } // no hash tag
	require.NotEqual(t, rediskv.Slot(set), rediskv.Slot(offSlot("a")))
	t.Cleanup(func() { admin.Del(context.Background(), offSlot("a"), tag+":state:a", tag+":lease", "lease") })

	at := time.Now().Add(-2 * time.Hour)
	marker, err := retention.MarkerKey("runs/", at, "a")
	require.NoError(t, err)
	for _, tt := range []struct {
		name string
		rdb  redis.UniversalClient
		// checked: the KV sees a cluster and refuses before sending.
		checked bool
	}{
		{"UniversalClient", universal, true},
		{"wrapped", wrappedCluster{admin}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := rediskv.New(tt.rdb, set)
			require.NoError(t, err)
			require.NoError(t, kv.Put(ctx, marker, nil))
			require.NoError(t, admin.Set(ctx, offSlot("a"), "done", 0).Err())
			require.NoError(t, admin.Set(ctx, tag+":state:a", "done", 0).Err())

			_, err = kv.WithStateKeys("state:<id>")
			if tt.checked {
				require.ErrorContains(t, err, "give it the marker set")
			} else {
				require.NoError(t, err, "no check without a cluster client")
			}

			akv, err := kv.WithClear(func(ids []string) []string {
				keys := []string{}
				for _, id := range ids {
					keys = append(keys, tag+":state:"+id, offSlot(id))
				}
				return keys
			})
			require.NoError(t, err)
			err = akv.ClearAndDelete(ctx, []string{"a"}, [][]byte{marker})
			require.ErrorIs(t, err, rediskv.ErrCrossSlot)
			if tt.checked {
				assert.ErrorContains(t, err, fmt.Sprintf("state key %q", offSlot("a")))
			} else {
				assert.ErrorContains(t, err, "CROSSSLOT")
			}
			assert.Equal(t, int64(1), admin.Exists(ctx, offSlot("a")).Val(), "no key deleted")
			assert.Equal(t, int64(1), admin.Exists(ctx, tag+":state:a").Val(), "no key deleted")
			assert.Equal(t, []string{string(marker)}, members(t, admin, set), "the marker stays")

			locker, err := rediskv.NewLocker(tt.rdb, "lease", &rediskv.LockerOptions{TTL: 5 * time.Second})
			require.NoError(t, err)
			lease, err := locker.TryAcquire(ctx)
			require.NoError(t, err)
			defer func() { assert.NoError(t, lease.Release(ctx)) }()
			view, ok := lease.(retention.Fencer).Fence(kv)
			require.True(t, ok)
			err = view.Delete(ctx, marker)
			require.ErrorIs(t, err, rediskv.ErrCrossSlot)
			if !tt.checked {
				assert.ErrorContains(t, err, "CROSSSLOT")
			}
			assert.Equal(t, []string{string(marker)}, members(t, admin, set), "the marker stays")
		})
	}
}
