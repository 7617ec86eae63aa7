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
	"github.com/marksweep/retention/rediskv"
)

// TestAtomicClear: entities' keys and markers go in one script per batch,
// every entity and marker is gone, and the sweep deletes no marker itself.
func TestAtomicClear(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	set := freshKey(t, rdb)
	tag := strings.TrimSuffix(set, ":markers")
	stateKey := func(id string) string { return tag + ":state:" + id }
	kv, err := rediskv.New(rdb, set)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(ids []string) []string {
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = stateKey(id)
		}
		return keys
	})
	require.NoError(t, err)
	now := time.Now()
	var stateKeys []string
	for i := range 1000 {
		id := fmt.Sprintf("r%04d", i)
		stateKeys = append(stateKeys, stateKey(id))
		_, err := rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Set(ctx, stateKey(id), "done", 0)
			return kv.MarkTx(ctx, pipe, "runs/", id, now.Add(-2*time.Hour))
		})
		require.NoError(t, err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), stateKeys...) })
	_, err = kv.WithClear(nil)
	require.Error(t, err)

	s, err := retention.New(akv, retention.Config{Prefix: "runs/", Retention: time.Hour, PageSize: 500, BatchSize: 250,
		Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1000, st.Cleared)
	assert.Zero(t, st.DeleteCalls, "the script deleted the markers with the state")
	assert.Equal(t, 4, st.ClearCalls)
	assert.Zero(t, rdb.Exists(ctx, stateKeys...).Val())
	assert.Zero(t, rdb.ZCard(ctx, set).Val())
}

// TestFencedAtomicClear: under a lease, the script checks the lease key's
// token; once the lease is taken from outside, the old holder's clear
// changes nothing and reports the loss.
func TestFencedAtomicClear(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	set := freshKey(t, rdb)
	tag := strings.TrimSuffix(set, ":markers")
	leaseKey := tag + ":lease"
	t.Cleanup(func() { rdb.Del(context.Background(), leaseKey) })
	kv, err := rediskv.New(rdb, set)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(ids []string) []string {
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = tag + ":state:" + id
		}
		return keys
	})
	require.NoError(t, err)
	var ids []string
	var keys [][]byte
	for i := range 10 {
		id := fmt.Sprintf("f%d", i)
		ids = append(ids, id)
		require.NoError(t, rdb.Set(ctx, tag+":state:"+id, "x", 0).Err())
		key, err := retention.MarkerKey("runs/", time.Now().Add(-2*time.Hour), id)
		require.NoError(t, err)
		require.NoError(t, kv.Put(ctx, key, nil))
		keys = append(keys, key)
	}
	locker, err := rediskv.NewLocker(rdb, leaseKey, &rediskv.LockerOptions{TTL: 5 * time.Second})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, ok := lease.(retention.Fencer).Fence(akv)
	require.True(t, ok)
	fenced, ok := view.(retention.ClearDeleter)
	require.True(t, ok, "the fenced view of an AtomicKV still clears atomically")

	require.NoError(t, fenced.ClearAndDelete(ctx, ids[:5], keys[:5]))
	assert.Equal(t, int64(5), rdb.ZCard(ctx, set).Val())

	require.NoError(t, rdb.Set(ctx, leaseKey, "thief", 0).Err()) // taken from outside
	err = fenced.ClearAndDelete(ctx, ids[5:], keys[5:])
	require.ErrorIs(t, err, retention.ErrLeaseLost)
	assert.Equal(t, int64(5), rdb.ZCard(ctx, set).Val(), "the markers stay")
	for _, id := range ids[5:] {
		assert.Equal(t, int64(1), rdb.Exists(ctx, tag+":state:"+id).Val(), "and the state of %s", id)
	}
	select {
	case <-lease.Lost():
	default:
		t.Error("Lost is open after a refused clear")
	}
}

// TestClearMarkerGone: a batch with a marker that is no longer in the set
// changes nothing, plain or fenced, and says which marker; sent again after
// it committed, it clears nothing twice. More keys than ids (an id with two
// markers) go together.
func TestClearMarkerGone(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			set := freshKey(t, rdb)
			tag := strings.TrimSuffix(set, ":markers")
			state := func(id string) string { return tag + ":state:" + id }
			kv, err := rediskv.New(rdb, set)
			require.NoError(t, err)
			akv, err := kv.WithClear(func(ids []string) []string {
				keys := make([]string, len(ids))
				for i, id := range ids {
					keys[i] = state(id)
				}
				return keys
			})
			require.NoError(t, err)
			var cd retention.ClearDeleter = akv
			if fenced {
				view, ok := acquire(t, rdb, set).(retention.Fencer).Fence(akv)
				require.True(t, ok)
				cd = view.(retention.ClearDeleter)
			}
			t0 := time.Now().Add(-2 * time.Hour)
			marker := func(id string, d time.Duration) []byte {
				key, err := retention.MarkerKey("runs/", t0.Add(d), id)
				require.NoError(t, err)
				return key
			}
			ids := []string{"a", "b", "c"}
			for _, id := range ids {
				require.NoError(t, rdb.Set(ctx, state(id), "done", 0).Err())
				require.NoError(t, kv.Put(ctx, marker(id, 0), nil))
			}
			t.Cleanup(func() { rdb.Del(context.Background(), state("a"), state("b"), state("c")) })
			require.NoError(t, kv.Put(ctx, marker("b", time.Second), nil)) // b has two markers

			gone := marker("z", 0) // never written
			err = cd.ClearAndDelete(ctx, []string{"a", "z"}, [][]byte{marker("a", 0), gone})
			require.ErrorIs(t, err, retention.ErrMarkerGone)
			assert.ErrorContains(t, err, string(gone))
			assert.Equal(t, int64(3), rdb.Exists(ctx, state("a"), state("b"), state("c")).Val(), "no state deleted")
			assert.Equal(t, int64(4), rdb.ZCard(ctx, set).Val(), "no marker deleted")

			batch := [][]byte{marker("a", 0), marker("b", 0), marker("b", time.Second)}
			require.NoError(t, cd.ClearAndDelete(ctx, []string{"a", "b", "b"}, batch))
			assert.Equal(t, int64(1), rdb.Exists(ctx, state("a"), state("b"), state("c")).Val())
			assert.Equal(t, []string{string(marker("c", 0))}, members(t, rdb, set))

			// The same batch again, as after a reply that never came.
			require.NoError(t, rdb.Set(ctx, state("a"), "a new entity of the same id", 0).Err())
			err = cd.ClearAndDelete(ctx, []string{"a", "b", "b"}, batch)
			require.ErrorIs(t, err, retention.ErrMarkerGone)
			assert.Equal(t, "a new entity of the same id", rdb.Get(ctx, state("a")).Val(), "cleared once only")
		})
	}
}
