package rediskv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/rediskv"
)

// proofLeaseKey is the lease key of the process proofs for the marker set
// key: the same hash tag, as on a cluster it must have.
func proofLeaseKey(markers string) string {
	return markers[:strings.IndexByte(markers, '}')+1] + ":lease"
}

// connectReplica connects a replica process of TestProcesses: store is the
// marker set's key.
func connectReplica(_ context.Context, addr, store string, ttl time.Duration) (retention.KV, retention.Locker, func(), error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
	kv, err := rediskv.New(rdb, store)
	if err != nil {
		rdb.Close()
		return nil, nil, nil, err
	}
	locker, err := rediskv.NewLocker(rdb, proofLeaseKey(store), &rediskv.LockerOptions{TTL: ttl})
	if err != nil {
		rdb.Close()
		return nil, nil, nil, err
	}
	return kv, locker, func() { _ = rdb.Close() }, nil
}

func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	admin := connect(t)
	leasetest.RunProcesses(t, leasetest.Engine{
		Addr:    kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"),
		TTL:     1500 * time.Millisecond,
		Connect: connectReplica,
		Setup: func(t testing.TB, keys [][]byte) string {
			markers := freshKey(t, admin)
			t.Cleanup(func() { admin.Del(context.Background(), proofLeaseKey(markers)) })
			members := make([]redis.Z, len(keys))
			for i, k := range keys {
				members[i] = redis.Z{Member: string(k)}
			}
			require.NoError(t, admin.ZAdd(context.Background(), markers, members...).Err())
			return markers
		},
		TakeAway: func(t testing.TB, store string) {
			require.NoError(t, admin.Del(context.Background(), proofLeaseKey(store)).Err())
		},
		Remaining: func(ctx context.Context, store string) (int, error) {
			n, err := admin.ZCard(ctx, store).Result()
			return int(n), err
		},
	})
}
