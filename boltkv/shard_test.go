package boltkv_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
)

// shardCount is an Observer that counts what each shard's passes cleared.
type shardCount struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
	passes []int
	clears []int
}

func (c *shardCount) ObservePass(prefix string, st retention.Stats, err error) {
	shard, perr := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(prefix, c.prefix+"s"), "/"))
	if !assert.NoError(c.t, perr, "the shard of %q", prefix) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.passes[shard]++
	c.clears[shard] += st.Cleared
}
func (c *shardCount) ObserveLags(string, []time.Duration)       {}
func (c *shardCount) ObservePage(string, retention.Stats)       {}
func (c *shardCount) ObserveLease(string, retention.LeaseEvent) {}
func (c *shardCount) counts() (passes, clears []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.passes...), append([]int(nil), c.clears...)
}

// TestShardedSweepOnOneBucket runs a sharded sweep of 8 shards, prefixes
// of one bbolt bucket, while a writer finishes entities (the entity's row
// in a bucket of its own and its marker, of Sharded.MarkerKey, in one
// bbolt transaction), and reads each shard's Backlog as it goes: every
// shard is swept, every entity cleared (its row gone, its Clear
// recorded), every shard's Backlog empty once the writer stops, and no
// key left in the marker bucket. bbolt is one process (the file is
// locked), and the root package has no in-process Locker, so one Sharded
// with no Lease sweeps every shard, as ShardConfig.Lease's nil means.
func TestShardedSweepOnOneBucket(t *testing.T) {
	const (
		shards   = 8
		keep     = 200 * time.Millisecond // Retention
		interval = 500 * time.Millisecond
		limit    = 15 * time.Second // bounds a failing wait only
	)
	ctx := context.Background()
	db := openDB(t)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	jobs := []byte("jobs")
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(jobs)
		return err
	}))
	left := func() (n int) {
		require.NoError(t, db.View(func(tx *bbolt.Tx) error {
			n = tx.Bucket(jobs).Stats().KeyN
			return nil
		}))
		return n
	}

	var (
		mu      sync.Mutex
		clears  = map[string]int{}
		cleared atomic.Int64
	)
	obs := &shardCount{t: t, prefix: "jobs/done/", passes: make([]int, shards), clears: make([]int, shards)}
	s, err := retention.NewSharded(kv, retention.Config{
		Prefix: "jobs/done/", Retention: keep, Interval: interval,
		MinInterval: 50 * time.Millisecond,
		Observer:    obs,
		Logger:      slog.New(slog.DiscardHandler),
		Clear: func(ctx context.Context, id string) error {
			if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(jobs).Delete([]byte(id)) }); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if clears[id]++; clears[id] == 1 {
				cleared.Add(1)
			}
			return nil
		},
	}, retention.ShardConfig{Shards: shards})
	require.NoError(t, err)

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	var runErr error
	stop := sync.OnceFunc(func() {
		cancel()
		runErr = <-done
	})
	defer stop()

	// The writer: 5 entities every 20ms, each with its marker in the
	// transaction that writes its row.
	var written atomic.Int64
	wctx, stopWriting := context.WithCancel(ctx)
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for wctx.Err() == nil {
			if !assert.NoError(t, db.Update(func(tx *bbolt.Tx) error {
				for range 5 {
					id := fmt.Sprintf("job-%06d", written.Load())
					key, err := s.MarkerKey(time.Now(), id)
					if err != nil {
						return err
					}
					if err := tx.Bucket(jobs).Put([]byte(id), []byte("finished")); err != nil {
						return err
					}
					if err := kv.MarkKeyTx(tx, key); err != nil {
						return err
					}
					written.Add(1)
				}
				return nil
			})) {
				return
			}
			select {
			case <-wctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	defer func() {
		stopWriting()
		<-writing
	}()

	// While the writer writes: each shard's Backlog, until each shard's
	// passes have cleared something.
	start := time.Now()
	for {
		_, clearedBy := obs.counts()
		if slices.Min(clearedBy) >= 10 && cleared.Load() >= 200 {
			break
		}
		require.Less(t, time.Since(start), limit, "cleared by shard %v, %d in all", clearedBy, cleared.Load())
		time.Sleep(20 * time.Millisecond)
	}
	total, per, err := s.Backlog(ctx, 1000)
	require.NoError(t, err)
	require.Len(t, per, shards)
	dues := make([]int, shards)
	for i, b := range per {
		dues[i] = b.Due
	}
	t.Logf("while writing (%d written, %d cleared, after %v): Backlog due %d (by shard %v), oldest %q %v past due",
		written.Load(), cleared.Load(), time.Since(start).Round(time.Millisecond), total.Due, dues, total.OldestID, total.Age.Round(time.Millisecond))

	// The writer stops; the sweep clears the rest.
	stopWriting()
	<-writing
	drained := time.Now()
	for left() > 0 && time.Since(drained) < limit {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d entities written; the last cleared %v after the writer stopped", written.Load(), time.Since(drained).Round(time.Millisecond))
	// A marker is deleted after its Clear returns: the last Backlog may
	// still see one for a moment.
	for time.Since(drained) < limit {
		if total, _, err = s.Backlog(ctx, 1000); err != nil || total == (retention.Backlog{}) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, err)
	stop()
	require.ErrorIs(t, runErr, context.Canceled, "Run")

	assert.Zero(t, left(), "entities' rows left")
	total, per, err = s.Backlog(ctx, 1000)
	require.NoError(t, err)
	assert.Equal(t, retention.Backlog{}, total, "Backlog in all")
	for i, b := range per {
		assert.Equal(t, retention.Backlog{}, b, "shard %d's Backlog", i)
	}
	var keysLeft []string
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("markers")).ForEach(func(k, _ []byte) error {
			keysLeft = append(keysLeft, string(k))
			return nil
		})
	}))
	assert.Empty(t, keysLeft, "keys left in the marker bucket")

	mu.Lock()
	defer mu.Unlock()
	lost, twice := 0, 0
	for i := range int(written.Load()) {
		switch n := clears[fmt.Sprintf("job-%06d", i)]; {
		case n == 0:
			lost++
		case n > 1:
			twice++
		}
	}
	assert.Zero(t, lost, "entities never cleared")
	assert.Len(t, clears, int(written.Load()), "entities cleared that were never written")
	passes, clearedBy := obs.counts()
	t.Logf("cleared: %d lost, %d more than once (a Clear is at least once); by shard %v in %v passes", lost, twice, clearedBy, passes)
}
