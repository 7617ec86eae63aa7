package rediskv_test

import (
	"context"
	"fmt"
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

const leaseTTL = 1500 * time.Millisecond

func newHarness(t testing.TB) leasetest.Harness {
	return newHarnessOn(t, connect(t), func(t testing.TB) redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"), PoolSize: 8})
	})
}

// newHarnessOn is the fleet proofs' harness on the Redis of admin, a
// server or a cluster, whose replicas connect with newClient. Every key of
// a harness shares one hash tag: the marker set, the lease key and the
// entities' state keys.
func newHarnessOn(t testing.TB, admin redis.UniversalClient, newClient func(t testing.TB) redis.UniversalClient) leasetest.Harness {
	markers := freshKey(t, admin)
	tag := markers[:len(markers)-len(":markers")]
	state := func(id string) string { return tag + ":state:" + id }
	leaseKey := tag + ":lease"
	t.Cleanup(func() {
		ctx := context.Background()
		// On a cluster KEYS asks one node: the master of the tag's slot.
		var node redis.Cmdable = admin
		if c, ok := admin.(*redis.ClusterClient); ok {
			master, err := c.MasterForKey(ctx, markers)
			if err != nil {
				return
			}
			node = master
		}
		keys, _ := node.Keys(ctx, tag+":*").Result()
		for len(keys) > 0 {
			n := min(len(keys), 1000)
			admin.Unlink(ctx, keys[:n]...)
			keys = keys[n:]
		}
	})
	writer, err := rediskv.New(admin, markers)
	require.NoError(t, err)
	return leasetest.Harness{
		TTL: leaseTTL,
		NewReplica: func(t testing.TB) leasetest.Replica {
			rdb := newClient(t)
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
		opts    *rediskv.LockerOptions
		wantErr string
	}{
		{"defaults", rdb, "lease", nil, ""},
		{"ttl", rdb, "lease", &rediskv.LockerOptions{TTL: time.Second}, ""},
		{"nil client", nil, "lease", nil, "rediskv: client must not be nil"},
		{"empty key", rdb, "", nil, "rediskv: lease key must not be empty"},
		{"short ttl", rdb, "lease", &rediskv.LockerOptions{TTL: time.Millisecond}, "rediskv: LockerOptions.TTL must be at least 30ms, got 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := rediskv.NewLocker(tt.rdb, tt.key, tt.opts)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, l)
				return
			}
			require.NoError(t, err)
		})
	}
}

// TestFencedDeleteChunks deletes more markers in one fenced call than Lua's
// unpack takes at once.
func TestFencedDeleteChunks(t *testing.T) {
	rdb := connect(t)
	markers := freshKey(t, rdb)
	ctx := context.Background()
	kv, err := rediskv.New(rdb, markers)
	require.NoError(t, err)
	l, err := rediskv.NewLocker(rdb, markers+":lease", nil)
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	t.Cleanup(func() { rdb.Del(context.Background(), markers+":lease") })
	const n = 10_001
	keys := make([][]byte, n)
	members := make([]redis.Z, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%06d", i)
		members[i] = redis.Z{Member: string(keys[i])}
	}
	require.NoError(t, rdb.ZAdd(ctx, markers, members...).Err())
	fenced, ok := lease.(retention.Fencer).Fence(kv)
	require.True(t, ok)
	require.NoError(t, fenced.Delete(ctx, keys...))
	assert.Zero(t, rdb.ZCard(ctx, markers).Val())
}

// TestFenceCrossSlot: on a cluster, a fenced write whose keys hash to two
// slots fails with ErrCrossSlot instead of going out unfenced.
func TestFenceCrossSlot(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	key := freshKey(t, rdb)
	l, err := rediskv.NewLocker(rdb, key+":lease", nil)
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	t.Cleanup(func() { rdb.Del(context.Background(), key+":lease") })

	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	tests := []struct {
		name    string
		markers string
		wantErr error
	}{
		{"different slots", "runs:done", rediskv.ErrCrossSlot},
		{"one hash tag", key[:strings.IndexByte(key, '}')+1] + ":done", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := rediskv.New(cluster, tt.markers)
			require.NoError(t, err)
			fenced, ok := lease.(retention.Fencer).Fence(kv)
			require.True(t, ok)
			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			err = fenced.Delete(cctx, []byte("k"))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.ErrorIs(t, fenced.(retention.Putter).Put(cctx, []byte("k"), nil), tt.wantErr)
				return
			}
			assert.NotErrorIs(t, err, rediskv.ErrCrossSlot) // the unreachable cluster fails it otherwise
		})
	}
}

// TestLeaseRenewedPastTTL holds a lease past its TTL: renewals keep it.
// The lease is lost only when no renewal gets through for most of a TTL,
// which a busy machine (every core loaded, the race detector on) must not
// cause: the TTL leaves a renewal seconds to be scheduled, and the hold
// spans four renewals.
func TestLeaseRenewedPastTTL(t *testing.T) {
	rdb := connect(t)
	key := freshKey(t, rdb)
	const ttl = 3 * time.Second
	l, err := rediskv.NewLocker(rdb, key, &rediskv.LockerOptions{TTL: ttl})
	require.NoError(t, err)
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	time.Sleep(ttl + ttl/3)
	select {
	case <-lease.Lost():
		t.Fatal("the lease was lost while its holder renewed it")
	default:
	}
	left, err := rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Positive(t, left)
	require.NoError(t, lease.Release(ctx))
	assert.Zero(t, rdb.Exists(ctx, key).Val(), fmt.Sprintf("%s deleted on release", key))
}

// TestStaleHolderCannotRelease: a holder whose key was taken over must not
// delete the new holder's key.
func TestStaleHolderCannotRelease(t *testing.T) {
	rdb := connect(t)
	key := freshKey(t, rdb)
	l, err := rediskv.NewLocker(rdb, key, &rediskv.LockerOptions{TTL: time.Second})
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

func TestSlot(t *testing.T) {
	tests := []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3}, // the CRC16 check value of the cluster spec
		{"{123456789}.anything", 0x31C3},
		{"foo{}{bar}", rediskv.Slot("foo{}{bar}")},
		{"{}", rediskv.Slot("{}")},
	}
	for _, tt := range tests {
		if got := rediskv.Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
	assert.Equal(t, rediskv.Slot("{user1000}.following"), rediskv.Slot("{user1000}.followers"))
	assert.NotEqual(t, rediskv.Slot("foo{}{bar}"), rediskv.Slot("bar"), "an empty first tag means the whole key")
}

// TestLeaseLostBeforeExpiry cuts a holder off from Redis: its renewals
// never arrive, and it must give the lease up (close Lost) while the key
// still exists with its token, a safety margin (a tenth of the TTL) before
// Redis can expire it and another replica take it.
func TestLeaseLostBeforeExpiry(t *testing.T) {
	admin := connect(t)
	ctx := context.Background()
	key := freshKey(t, admin)
	proxy := newBlackhole(t, kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"))
	holder := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = holder.Close() })
	const ttl = time.Second
	l, err := rediskv.NewLocker(holder, key, &rediskv.LockerOptions{TTL: ttl})
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	token := admin.Get(ctx, key).Val()
	require.NotEmpty(t, token)

	time.Sleep(ttl / 2) // a renewal or so gets through
	cut := time.Now()
	proxy.Cut()
	select {
	case <-lease.Lost():
	case <-time.After(5 * ttl):
		t.Fatal("Lost still open long after the key expired")
	}
	left, err := admin.PTTL(ctx, key).Result()
	require.NoError(t, err)
	t.Logf("Lost closed %v after the cut, with the key's PTTL at %v (margin %v)", time.Since(cut).Round(time.Millisecond), left, ttl/10)
	assert.Equal(t, token, admin.Get(ctx, key).Val(), "the key still holds the holder's token when Lost closes")
	assert.Greater(t, left, time.Duration(0), "the key had not expired when Lost closed")
	assert.GreaterOrEqual(t, left, ttl/20, "Lost closed at least about a tenth of the TTL before the key expires")
	other, err := rediskv.NewLocker(admin, key, &rediskv.LockerOptions{TTL: ttl})
	require.NoError(t, err)
	_, err = other.TryAcquire(ctx)
	require.ErrorIs(t, err, retention.ErrLeaseHeld, "no other replica can take the lease before the old holder gave it up")
	proxy.Close() // the holder's calls in flight fail now, rather than at their ReadTimeout
}
