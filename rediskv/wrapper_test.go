package rediskv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/rediskv"
)

// wrapKV is a user's wrapper of a rediskv store, as one that logs or
// traces its calls: the lease cannot fence it, but it has Unwrap, so Run
// puts the fence on the context of its writes and the store applies it.
// It counts the writes that succeeded after takenAt was set.
type wrapKV struct {
	inner interface {
		retention.KV
		retention.Putter
		retention.Mover
	}
	takenAt atomic.Pointer[time.Time] // when the lease was taken from outside

	mu      sync.Mutex
	writes  map[string]int // successful writes, by op
	late    map[string]int // of them, those started after takenAt
	refused int            // writes refused by the fence
}

func (w *wrapKV) Unwrap() retention.KV { return w.inner }

func (w *wrapKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return w.inner.Scan(ctx, start, end, limit)
}

func (w *wrapKV) Delete(ctx context.Context, keys ...[]byte) error {
	return w.record("delete", func() error { return w.inner.Delete(ctx, keys...) })
}

func (w *wrapKV) Put(ctx context.Context, key, value []byte) error {
	return w.record("put", func() error { return w.inner.Put(ctx, key, value) })
}

func (w *wrapKV) Move(ctx context.Context, from, to [][]byte) error {
	return w.record("move", func() error { return w.inner.Move(ctx, from, to) })
}

func (w *wrapKV) record(op string, write func() error) error {
	taken := w.takenAt.Load()
	err := write()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.writes[op]++
		if taken != nil {
			w.late[op]++
		}
	case errors.Is(err, retention.ErrLeaseLost):
		w.refused++
	}
	return err
}

// wrapAtomicKV wraps an AtomicKV: its clears go through the wrapper too.
type wrapAtomicKV struct {
	*wrapKV
	atomic *rediskv.AtomicKV
}

func (w *wrapAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	time.Sleep(2 * time.Millisecond) // a slow store: the takeover lands mid-pass
	return w.record("clear", func() error { return w.atomic.ClearAndDelete(ctx, ids, keys) })
}

// TestFenceThroughWrapper sweeps through a wrapper under a rediskv Locker
// and takes the lease away mid-pass: from then on, none of the old
// holder's writes may take effect, though they reach the store through the
// wrapper rather than through a view the lease made.
//
// With an AtomicKV it fails on core commit 268eaaf: batch.go hands
// ClearAndDelete the pass's context (batching.ctx), not p.writeCtx's, so
// the clears carry no fence and hundreds commit after the takeover.
func TestFenceThroughWrapper(t *testing.T) {
	for _, clearDeleter := range []bool{false, true} {
		t.Run(fmt.Sprintf("atomic=%v", clearDeleter), func(t *testing.T) {
			rdb := connect(t)
			ctx := context.Background()
			set := freshKey(t, rdb)
			tag := strings.TrimSuffix(set, ":markers")
			leaseKey := tag + ":lease"
			state := func(id string) string { return tag + ":state:" + id }
			kv, err := rediskv.New(rdb, set)
			require.NoError(t, err)
			const n = 2000
			stateKeys := make([]string, n)
			_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				for i := range n {
					id := fmt.Sprintf("w%04d", i)
					stateKeys[i] = state(id)
					pipe.Set(ctx, state(id), "done", 0)
					if err := kv.MarkTx(ctx, pipe, "runs/", id, time.Now().Add(-2*time.Hour)); err != nil {
						return err
					}
				}
				return nil
			})
			require.NoError(t, err)
			t.Cleanup(func() { rdb.Del(context.Background(), append(stateKeys, leaseKey)...) })

			w := &wrapKV{inner: kv, writes: map[string]int{}, late: map[string]int{}}
			var store retention.KV = w
			cfg := retention.Config{Prefix: "runs/", Retention: time.Hour, PageSize: 20, Concurrency: 1}
			if clearDeleter {
				akv, err := kv.WithClear(func(ids []string) []string {
					keys := make([]string, len(ids))
					for i, id := range ids {
						keys[i] = state(id)
					}
					return keys
				})
				require.NoError(t, err)
				w.inner = akv
				store = &wrapAtomicKV{wrapKV: w, atomic: akv}
				cfg.BatchSize = 5
			} else {
				cfg.Clear = func(ctx context.Context, id string) error {
					time.Sleep(time.Millisecond)
					if strings.HasSuffix(id, "7") {
						return errors.New("this one fails: its marker is rescheduled")
					}
					return rdb.Del(ctx, state(id)).Err()
				}
			}
			locker, err := rediskv.NewLocker(rdb, leaseKey, &rediskv.LockerOptions{TTL: 3 * time.Second})
			require.NoError(t, err)
			cfg.Lease = locker
			s, err := retention.New(store, cfg)
			require.NoError(t, err)

			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(runCtx) }()
			require.Eventually(t, func() bool {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.writes["delete"]+w.writes["clear"] >= 3 && (clearDeleter || w.writes["put"]+w.writes["move"] >= 1)
			}, 10*time.Second, time.Millisecond, "the sweep writes through the wrapper")

			// Take the lease and read the set in one step: from here on,
			// the set must not change.
			var snapshot *redis.StringSliceCmd
			_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, leaseKey, "thief", time.Minute)
				snapshot = pipe.ZRange(ctx, set, 0, -1)
				return nil
			})
			require.NoError(t, err)
			now := time.Now()
			w.takenAt.Store(&now)
			before := snapshot.Val()
			require.NotEmpty(t, before, "the takeover came before the end of the backlog")

			time.Sleep(1500 * time.Millisecond) // past the old holder's next renewal
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)

			w.mu.Lock()
			defer w.mu.Unlock()
			t.Logf("writes through the wrapper: %v; after the takeover: %v; refused by the fence: %d", w.writes, w.late, w.refused)
			assert.Empty(t, w.late, "writes of the old holder that succeeded after the takeover")
			assert.Equal(t, before, members(t, rdb, set), "the set after the takeover")
			assert.Equal(t, "thief", rdb.Get(ctx, leaseKey).Val())
		})
	}
}
