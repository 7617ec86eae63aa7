package rediskv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/rediskv"
)

const leaseTTL = 1500 * time.Millisecond

func newHarness(t testing.TB) leasetest.Harness {
	admin := connect(t)
	markers := freshKey(t, admin)
	tag := markers[:len(markers)-len(":markers")]
	state := func(id string) string { return tag + ":state:" + id }
	leaseKey := tag + ":lease"
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := admin.Keys(ctx, tag+":*").Result()
		if len(keys) > 0 {
			admin.Del(ctx, keys...)
		}
	})
	writer, err := rediskv.New(admin, markers)
	require.NoError(t, err)
	return leasetest.Harness{
		TTL: leaseTTL,
		NewReplica: func(t testing.TB) leasetest.Replica {
			rdb := redis.NewClient(&redis.Options{Addr: kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"), PoolSize: 8})
			closed := false
			t.Cleanup(func() {
				if !closed {
					assert.NoError(t, rdb.Close())
				}
			})
			kv, err := rediskv.New(rdb, markers)
			require.NoError(t, err)
			locker, err := rediskv.NewLocker(rdb, leaseKey, leaseTTL)
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
			pipe := admin.Pipeline()
			cmds := make([]*redis.IntCmd, len(ids))
			for i, id := range ids {
				cmds[i] = pipe.Exists(ctx, state(id))
			}
			if _, err := pipe.Exec(ctx); err != nil {
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

func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet proofs take a while")
	}
	leasetest.Run(t, newHarness)
}

func TestNewLocker(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	tests := []struct {
		name    string
		rdb     redis.Cmdable
		key     string
		ttl     time.Duration
		wantErr string
	}{
		{"valid", rdb, "lease", time.Second, ""},
		{"nil client", nil, "lease", time.Second, "rediskv: client must not be nil"},
		{"empty key", rdb, "", time.Second, "rediskv: lease key must not be empty"},
		{"short ttl", rdb, "lease", time.Millisecond, "rediskv: lease TTL must be at least 30ms, got 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := rediskv.NewLocker(tt.rdb, tt.key, tt.ttl)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, l)
				return
			}
			require.NoError(t, err)
		})
	}
}

// TestLeaseRenewedPastTTL holds a lease for several TTLs: renewals keep it.
func TestLeaseRenewedPastTTL(t *testing.T) {
	rdb := connect(t)
	key := freshKey(t, rdb)
	l, err := rediskv.NewLocker(rdb, key, 90*time.Millisecond)
	require.NoError(t, err)
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	select {
	case <-lease.Lost():
		t.Fatal("the lease was lost while its holder renewed it")
	default:
	}
	ttl, err := rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Positive(t, ttl)
	require.NoError(t, lease.Release(ctx))
	assert.Zero(t, rdb.Exists(ctx, key).Val(), fmt.Sprintf("%s deleted on release", key))
}

// TestStaleHolderCannotRelease: a holder whose key was taken over must not
// delete the new holder's key.
func TestStaleHolderCannotRelease(t *testing.T) {
	rdb := connect(t)
	key := freshKey(t, rdb)
	l, err := rediskv.NewLocker(rdb, key, time.Second)
	require.NoError(t, err)
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, rdb.Set(ctx, key, "someone else", time.Minute).Err())
	select {
	case <-lease.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder did not notice that its key changed hands")
	}
	require.NoError(t, lease.Release(ctx))
	assert.Equal(t, "someone else", rdb.Get(ctx, key).Val())
}
