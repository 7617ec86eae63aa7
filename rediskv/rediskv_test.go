package rediskv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/rediskv"
)

func TestMain(m *testing.M) {
	leasetest.ReplicaMain(connectReplica) // returns unless this process is a replica of TestProcesses
	goleak.VerifyTestMain(m)
}

func connect(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"), PoolSize: 32})
	t.Cleanup(func() { assert.NoError(t, rdb.Close()) })
	require.NoError(t, rdb.Ping(context.Background()).Err())
	return rdb
}

var keySeq atomic.Int64

// freshKey returns a set key, hash-tagged as in Redis Cluster, that is
// deleted when t ends.
func freshKey(t testing.TB, rdb redis.Cmdable) string {
	key := fmt.Sprintf("{test-%d-%d}:markers", os.Getpid(), keySeq.Add(1))
	t.Cleanup(func() { assert.NoError(t, rdb.Del(context.Background(), key).Err()) })
	return key
}

func newStore(t testing.TB) kvtest.Store {
	rdb := connect(t)
	key := freshKey(t, rdb)
	kv, err := rediskv.New(rdb, key)
	require.NoError(t, err)
	return kvtest.Store{
		KV:  kv,
		Put: func(ctx context.Context, k []byte) error { return kv.Put(ctx, k, nil) },
		PutMany: func(ctx context.Context, keys [][]byte) error {
			members := make([]redis.Z, len(keys))
			for i, k := range keys {
				members[i] = redis.Z{Member: string(k)}
			}
			return rdb.ZAdd(ctx, key, members...).Err()
		},
	}
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, newStore)
}

// TestConformanceAtomicKV runs the suite over an AtomicKV of
// WithStateKeys, a retention.RunClearer: it checks ClearRun's members;
// the tests of atomic_test.go check its state keys.
//
// Over an AtomicKV of WithClear, which cannot clear runs, it checks that
// ClearRun says so (errors.ErrUnsupported) having changed nothing.
func TestConformanceAtomicKV(t *testing.T) {
	t.Run("WithStateKeys", func(t *testing.T) { kvtest.Run(t, newAtomicStore) })
	t.Run("WithClear", func(t *testing.T) {
		kvtest.Run(t, func(t testing.TB) kvtest.Store {
			r := newRunSet(t)
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

// newAtomicStore is a kvtest.Store over an AtomicKV of WithStateKeys.
func newAtomicStore(t testing.TB) kvtest.Store {
	r := newRunSet(t)
	return kvtest.Store{KV: r.akv, Put: func(ctx context.Context, k []byte) error { return r.kv.Put(ctx, k, nil) }}
}

func BenchmarkSweep(b *testing.B) {
	kvtest.Benchmark(b, newStore)
}

// BenchmarkSweepAtomic is BenchmarkSweep over an AtomicKV of WithStateKeys:
// runs at concurrency 1, ClearAndDelete at 16.
func BenchmarkSweepAtomic(b *testing.B) {
	kvtest.Benchmark(b, newAtomicStore)
}

func TestNew(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	tests := []struct {
		name    string
		rdb     redis.Cmdable
		key     string
		wantErr string
	}{
		{"valid", rdb, "markers", ""},
		{"nil client", nil, "markers", "rediskv: client must not be nil"},
		{"empty key", rdb, "", "rediskv: key must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := rediskv.New(tt.rdb, tt.key)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, kv)
				return
			}
			require.NoError(t, err)
		})
	}
}

func TestWrongType(t *testing.T) {
	rdb := connect(t)
	key := freshKey(t, rdb)
	require.NoError(t, rdb.Set(context.Background(), key, "a string", 0).Err())
	kv, err := rediskv.New(rdb, key)
	require.NoError(t, err)
	_, err = kv.Scan(context.Background(), []byte("a"), []byte("b"), 1)
	require.ErrorContains(t, err, "WRONGTYPE")
	assert.ErrorContains(t, err, "rediskv: scan")
}

func TestPutRefusesValue(t *testing.T) {
	rdb := connect(t)
	kv, err := rediskv.New(rdb, freshKey(t, rdb))
	require.NoError(t, err)
	require.ErrorContains(t, kv.Put(context.Background(), []byte("k"), []byte("v")), "stores keys only")
}

func TestMarkTxCommitsWithState(t *testing.T) {
	rdb := connect(t)
	key := freshKey(t, rdb)
	kv, err := rediskv.New(rdb, key)
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	state := key + ":state:r1"
	t.Cleanup(func() { rdb.Del(context.Background(), state) })
	errAbort := errors.New("abort")

	// The MULTI is abandoned: neither state nor marker is written.
	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, state, "succeeded", 0)
		require.NoError(t, kv.MarkTx(ctx, pipe, "runs/", "r1", now))
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	assert.Zero(t, rdb.Exists(ctx, state, key).Val())

	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		return kv.MarkTx(ctx, pipe, "runs/", "", now)
	})
	require.ErrorIs(t, err, retention.ErrInvalidID)
	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		return kv.MarkTx(ctx, pipe, "runs/", "r1", time.Unix(now.UnixMilli(), 0))
	})
	require.ErrorIs(t, err, retention.ErrInvalidTime, "seconds taken for milliseconds")

	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, state, "succeeded", 0)
		return kv.MarkTx(ctx, pipe, "runs/", "r1", now)
	})
	require.NoError(t, err)
	keys, err := kv.Scan(ctx, []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	want, err := retention.MarkerKey("runs/", now, "r1")
	require.NoError(t, err)
	assert.Equal(t, [][]byte{want}, keys)
	assert.Equal(t, "succeeded", rdb.Get(ctx, state).Val())
}

// TestEndToEnd keeps runs and markers in one Redis: 10,000 runs finish at
// spread-out times, each marked in the MULTI that records its outcome, and a
// sweep clears exactly those past retention.
func TestEndToEnd(t *testing.T) {
	rdb := connect(t)
	key := freshKey(t, rdb)
	kv, err := rediskv.New(rdb, key)
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const n, window = 10_000, 24 * time.Hour
	finished := func(i int) time.Time { return now.Add(-time.Duration(i) * 17 * time.Second) }
	stateKey := func(id string) string { return key + ":state:" + id } // same hash tag as the set
	for first := 0; first < n; first += 100 {
		_, err := rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			for i := first; i < first+100; i++ {
				id := fmt.Sprintf("run-%05d", i)
				pipe.Set(ctx, stateKey(id), "succeeded", 0)
				if err := kv.MarkTx(ctx, pipe, "runs/done/", id, finished(i)); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for i := range n {
			rdb.Del(context.Background(), stateKey(fmt.Sprintf("run-%05d", i)))
		}
	})

	sweep, err := retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: window, Clock: retention.NewManualClock(now), Concurrency: 8,
		Clear: func(ctx context.Context, id string) error { return rdb.Del(ctx, stateKey(id)).Err() },
	})
	require.NoError(t, err)
	st, err := sweep.Pass(ctx)
	require.NoError(t, err)

	pipe := rdb.Pipeline()
	exists := make([]*redis.IntCmd, n)
	for i := range n {
		exists[i] = pipe.Exists(ctx, stateKey(fmt.Sprintf("run-%05d", i)))
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	wantCleared := 0
	for i := range n {
		expired := now.Sub(finished(i)) > window
		if expired {
			wantCleared++
		}
		assert.Equal(t, !expired, exists[i].Val() == 1, "run-%05d finished %v ago", i, now.Sub(finished(i)))
	}
	assert.Equal(t, wantCleared, st.Cleared)
	assert.Equal(t, int64(n-wantCleared), rdb.ZCard(ctx, key).Val())
}
