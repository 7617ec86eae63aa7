package pgkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

func keysOf(t testing.TB, kv retention.KV) []string {
	t.Helper()
	keys, err := kv.Scan(context.Background(), []byte{0}, []byte{0xff}, 1000)
	require.NoError(t, err)
	var s []string
	for _, k := range keys {
		s = append(s, string(k))
	}
	return s
}

func bs(keys ...string) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// TestMove: each pair moves whole, only when its from exists; under a
// lease, only while the lease is held.
func TestMove(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	for _, k := range []string{"a", "b", "c", "e"} {
		require.NoError(t, kv.Put(ctx, []byte(k), nil))
	}
	require.NoError(t, kv.Move(ctx, bs("a", "x", "c"), bs("a2", "x2", "e")))
	assert.Equal(t, []string{"a2", "b", "e"}, keysOf(t, kv), "a moved, x was missing, c moved onto an existing e")
	require.NoError(t, kv.Move(ctx, nil, nil))
	require.Error(t, kv.Move(ctx, bs("a2"), nil))

	leases := freshLeaseTable(t, pool)
	locker, err := pgkv.NewLocker(pool, "move", &pgkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, ok := lease.(retention.Fencer).Fence(kv)
	require.True(t, ok)
	mover, ok := view.(retention.Mover)
	require.True(t, ok, "the fenced view is a Mover")
	require.NoError(t, mover.Move(ctx, bs("a2"), bs("a3")))
	assert.Equal(t, []string{"a3", "b", "e"}, keysOf(t, kv))

	_, err = pool.Exec(ctx, "UPDATE "+leases+" SET holder = 'thief', fence = fence + 1")
	require.NoError(t, err)
	require.ErrorIs(t, mover.Move(ctx, bs("a3"), bs("a4")), retention.ErrLeaseLost)
	assert.Equal(t, []string{"a3", "b", "e"}, keysOf(t, kv), "a refused move changes nothing")
}

// TestAtomicClearMarkerGone: a ClearAndDelete commits only when every one
// of its keys exists; a call sent again changes nothing and says so, fenced
// or not, and the entities a ClearFunc would clear stay.
func TestAtomicClearMarkerGone(t *testing.T) {
	pool := connect(t)
	kv, akv, markers, jobs := newJobsKV(t, pool)
	ctx := context.Background()
	ids := finishJobs(t, pool, kv, jobs, 6, time.Now().Add(-2*time.Hour))
	keys, err := kv.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 10)
	require.NoError(t, err)

	// An id with two markers: both go, with the one entity.
	second, err := retention.MarkerKey("jobs/done/", time.Now().Add(-time.Hour), ids[0])
	require.NoError(t, err)
	require.NoError(t, kv.Put(ctx, second, nil))
	require.NoError(t, akv.ClearAndDelete(ctx, ids[:2], append(append([][]byte{}, keys[:2]...), second)))
	assert.Equal(t, 4, count(t, pool, jobs))
	assert.Equal(t, 4, count(t, pool, markers))

	// Sent again (its reply lost): nothing happens, not even to an entity
	// that came back under the same id.
	_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" (id) VALUES ($1)", ids[0])
	require.NoError(t, err)
	err = akv.ClearAndDelete(ctx, ids[:2], keys[:2])
	require.ErrorIs(t, err, retention.ErrMarkerGone)
	assert.NotErrorIs(t, err, retention.ErrLeaseLost)
	assert.Equal(t, 5, count(t, pool, jobs))

	// One marker of a batch gone: the others and every entity stay.
	require.NoError(t, kv.Delete(ctx, keys[3]))
	require.ErrorIs(t, akv.ClearAndDelete(ctx, ids[2:5], keys[2:5]), retention.ErrMarkerGone)
	assert.Equal(t, 5, count(t, pool, jobs))
	assert.Equal(t, 3, count(t, pool, markers))

	// A ClearFunc that refuses sends nothing, and its error comes back as is.
	refusing, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM " + jobs)
		return retention.BatchError{ids[0]: errors.New("pinned")}
	})
	require.NoError(t, err)
	err = refusing.ClearAndDelete(ctx, ids[5:], keys[5:])
	var be retention.BatchError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 5, count(t, pool, jobs))
	assert.Equal(t, 3, count(t, pool, markers))

	// Fenced, a gone marker is still ErrMarkerGone and the lease stays held.
	leases := freshLeaseTable(t, pool)
	locker, err := pgkv.NewLocker(pool, "gone", &pgkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, ok := lease.(retention.Fencer).Fence(akv)
	require.True(t, ok)
	fenced := view.(retention.ClearDeleter)
	err = fenced.ClearAndDelete(ctx, ids[2:5], keys[2:5])
	require.ErrorIs(t, err, retention.ErrMarkerGone)
	assert.NotErrorIs(t, err, retention.ErrLeaseLost)
	select {
	case <-lease.Lost():
		t.Fatal("a gone marker closed Lost")
	default:
	}
	require.NoError(t, fenced.ClearAndDelete(ctx, []string{ids[2], ids[4]}, [][]byte{keys[2], keys[4]}))
	assert.Equal(t, 3, count(t, pool, jobs))
	assert.Equal(t, 1, count(t, pool, markers))
}

// TestMoveOntoItselfKeepsTheKey: retention.Mover says each from[i] is replaced
// by to[i]; MemKV, Redis, etcd and bbolt keep the key when to == from.
func TestMoveOntoItselfKeepsTheKey(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	require.NoError(t, kv.Put(ctx, []byte("a"), nil))
	require.NoError(t, kv.Move(ctx, bs("a"), bs("a")))
	assert.Equal(t, []string{"a"}, keysOf(t, kv), "a Move of a key onto itself must keep it")

	leases := freshLeaseTable(t, pool)
	locker, err := pgkv.NewLocker(pool, "self", &pgkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, _ := lease.(retention.Fencer).Fence(kv)
	require.NoError(t, kv.Put(ctx, []byte("b"), nil))
	require.NoError(t, view.(retention.Mover).Move(ctx, bs("b"), bs("b")))
	assert.Contains(t, keysOf(t, kv), "b", "a fenced Move of a key onto itself must keep it")
}
