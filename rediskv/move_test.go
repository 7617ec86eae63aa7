package rediskv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/rediskv"
)

// members returns the set's members in order.
func members(t testing.TB, rdb redis.Cmdable, set string) []string {
	t.Helper()
	got, err := rdb.ZRange(context.Background(), set, 0, -1).Result()
	require.NoError(t, err)
	return got
}

func TestMove(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	tests := []struct {
		name     string
		before   []string
		from, to []string
		want     []string
	}{
		{"one pair", []string{"a"}, []string{"a"}, []string{"b"}, []string{"b"}},
		{"missing from writes nothing", []string{"c"}, []string{"a"}, []string{"b"}, []string{"c"}},
		{"some pairs missing", []string{"a", "c"}, []string{"a", "x", "c"}, []string{"b", "y", "d"}, []string{"b", "d"}},
		{"to exists already", []string{"a", "b"}, []string{"a"}, []string{"b"}, []string{"b"}},
		{"onto itself", []string{"a"}, []string{"a"}, []string{"a"}, []string{"a"}},
		{"chained pairs run in order", []string{"a"}, []string{"a", "b"}, []string{"b", "c"}, []string{"c"}},
		{"nothing", []string{"a"}, nil, nil, []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set := freshKey(t, rdb)
			for _, m := range tt.before {
				require.NoError(t, rdb.ZAdd(ctx, set, redis.Z{Member: m}).Err())
			}
			kv, err := rediskv.New(rdb, set)
			require.NoError(t, err)
			require.NoError(t, kv.Move(ctx, bytesOf(tt.from), bytesOf(tt.to)))
			got := members(t, rdb, set)
			if len(tt.want) == 0 {
				assert.Empty(t, got)
				return
			}
			assert.Equal(t, tt.want, got, "Move(%q, %q)", tt.from, tt.to)
		})
	}
}

func TestMoveRefusesMismatch(t *testing.T) {
	rdb := connect(t)
	kv, err := rediskv.New(rdb, freshKey(t, rdb))
	require.NoError(t, err)
	err = kv.Move(context.Background(), bytesOf([]string{"a", "b"}), bytesOf([]string{"c"}))
	require.EqualError(t, err, "rediskv: Move of 2 keys to 1 keys")
}

// TestMoveLarge moves more pairs in one call than Lua's unpack takes at
// once, plain and fenced.
func TestMoveLarge(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			set := freshKey(t, rdb)
			kv, err := rediskv.New(rdb, set)
			require.NoError(t, err)
			var mover retention.Mover = kv
			if fenced {
				lease := acquire(t, rdb, set)
				view, ok := lease.(retention.Fencer).Fence(kv)
				require.True(t, ok)
				mover = view.(retention.Mover)
			}
			const n = 9_001
			from, to := make([][]byte, n), make([][]byte, n)
			zs := make([]redis.Z, n)
			for i := range n {
				from[i] = fmt.Appendf(nil, "a%05d", i)
				to[i] = fmt.Appendf(nil, "b%05d", i)
				zs[i] = redis.Z{Member: string(from[i])}
			}
			require.NoError(t, rdb.ZAdd(ctx, set, zs...).Err())
			require.NoError(t, mover.Move(ctx, from, to))
			got := members(t, rdb, set)
			require.Len(t, got, n)
			assert.Equal(t, "b00000", got[0])
			assert.Equal(t, fmt.Sprintf("b%05d", n-1), got[n-1])
		})
	}
}

// TestFencedMove: the fenced view moves while the lease key holds the
// token, and once the lease is taken from outside it moves nothing, says
// so, and closes Lost.
func TestFencedMove(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	set := freshKey(t, rdb)
	require.NoError(t, rdb.ZAdd(ctx, set, redis.Z{Member: "a"}, redis.Z{Member: "c"}).Err())
	kv, err := rediskv.New(rdb, set)
	require.NoError(t, err)
	lease := acquire(t, rdb, set)
	view, ok := lease.(retention.Fencer).Fence(kv)
	require.True(t, ok)
	mover, ok := view.(retention.Mover)
	require.True(t, ok, "the fenced view of a KV is a Mover")

	require.NoError(t, mover.Move(ctx, bytesOf([]string{"a", "x"}), bytesOf([]string{"b", "y"})))
	assert.Equal(t, []string{"b", "c"}, members(t, rdb, set))

	require.NoError(t, rdb.Set(ctx, leaseKeyOf(set), "thief", 0).Err())
	err = mover.Move(ctx, bytesOf([]string{"c"}), bytesOf([]string{"d"}))
	require.ErrorIs(t, err, retention.ErrLeaseLost)
	assert.Equal(t, []string{"b", "c"}, members(t, rdb, set), "nothing moved")
	select {
	case <-lease.Lost():
	default:
		t.Error("Lost is open after a refused move")
	}
}

func bytesOf(keys []string) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// leaseKeyOf is the lease key beside the set key: the same hash tag.
func leaseKeyOf(set string) string { return set + ":lease" }

// acquire takes a lease on set's lease key with a long TTL, released and
// deleted when t ends.
func acquire(t testing.TB, rdb redis.Cmdable, set string) retention.Lease {
	t.Helper()
	ctx := context.Background()
	l, err := rediskv.NewLocker(rdb, leaseKeyOf(set), &rediskv.LockerOptions{TTL: 10 * time.Second})
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, lease.Release(context.Background()))
		rdb.Del(context.Background(), leaseKeyOf(set))
	})
	return lease
}
