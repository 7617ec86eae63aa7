package etcdkv_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
)

// TestMoveAgreesWithMemKV makes random Moves over a handful of keys, with
// keys shared between pairs and pairs that move a key onto itself, and a
// MaxTxnOps that splits them into several transactions: the keys left must
// be those a MemKV leaves, which moves the pairs one after the other.
func TestMoveAgreesWithMemKV(t *testing.T) {
	cli := connect(t)
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	for round := range 40 {
		ns := freshNamespace(t, cli)
		kv, err := etcdkv.New(cli, ns, &etcdkv.Options{MaxTxnOps: 3 + rng.IntN(4)})
		require.NoError(t, err)
		mem := retention.NewMemKV()
		key := func() []byte { return fmt.Appendf(nil, "k%d", rng.IntN(8)) }
		for range 5 {
			k := key()
			require.NoError(t, kv.Put(ctx, k, nil))
			require.NoError(t, mem.Put(ctx, k, nil))
		}
		var from, to [][]byte
		for range rng.IntN(10) {
			from, to = append(from, key()), append(to, key())
		}
		require.NoError(t, kv.Move(ctx, from, to), "round %d: Move(%q, %q)", round, from, to)
		require.NoError(t, mem.Move(ctx, from, to))
		got, err := kv.Scan(ctx, []byte("k"), []byte("l"), 100)
		require.NoError(t, err)
		want, err := mem.Scan(ctx, []byte("k"), []byte("l"), 100)
		require.NoError(t, err)
		require.Equal(t, want, got, "round %d: keys after Move(%q, %q)", round, from, to)
	}
}

// TestFencedMoveBatches moves more markers in one fenced call than one
// transaction holds, and nothing once the lease is gone.
func TestFencedMoveBatches(t *testing.T) {
	cli := connect(t)
	ns := freshNamespace(t, cli)
	ctx := context.Background()
	kv, err := etcdkv.New(cli, ns, nil)
	require.NoError(t, err)
	l, err := etcdkv.NewLocker(cli, ns+"lease", &etcdkv.LockerOptions{TTL: leaseTTL})
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	const n = 2*etcdkv.DefaultMaxTxnOps + 1
	from, to := make([][]byte, n), make([][]byte, n)
	for i := range from {
		from[i], to[i] = fmt.Appendf(nil, "a/%04d", i), fmt.Appendf(nil, "b/%04d", i)
		require.NoError(t, kv.Put(ctx, from[i], nil))
	}
	fenced, ok := lease.(retention.Fencer).Fence(kv)
	require.True(t, ok)
	m, ok := fenced.(retention.Mover)
	require.True(t, ok, "the fenced view (%T) is not a retention.Mover", fenced)
	require.NoError(t, m.Move(ctx, from[:n-1], to[:n-1]))
	moved, err := kv.Scan(ctx, []byte("b/"), []byte("b0"), 2*n)
	require.NoError(t, err)
	require.Len(t, moved, n-1)

	revokeHolder(t, cli, ns+"lease")
	err = m.Move(ctx, from[n-1:], to[n-1:])
	require.ErrorIs(t, err, retention.ErrLeaseLost)
	left, err := kv.Scan(ctx, []byte("a/"), []byte("a0"), 2*n)
	require.NoError(t, err)
	require.Equal(t, from[n-1:], left, "a refused Move moved nothing")
	select {
	case <-lease.Lost():
	default:
		t.Error("Lost is open after the fence refused a Move")
	}
}
