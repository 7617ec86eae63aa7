package pgkv_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/pgkv"
)

// pgFleet runs the replicas of TestShardedFleetOnOneTable, each with a
// pool and a Sharded of its own, and follows from their Observers who
// holds each shard.
type pgFleet struct {
	t                        *testing.T
	markers, leases, cleared string // tables
	jobs                     string
	cfg                      retention.Config
	sc                       retention.ShardConfig
	ttl                      time.Duration

	mu     sync.Mutex
	owners []string // by shard: the replica that last took its lease, "" once it gave it up
	stops  map[string]func() error
}

// pgWatch is a replica's Observer.
type pgWatch struct {
	f    *pgFleet
	name string
}

func (w pgWatch) ObservePass(string, retention.Stats, error) {}
func (w pgWatch) ObserveLags(string, []time.Duration)        {}
func (w pgWatch) ObservePage(string, retention.Stats)        {}
func (w pgWatch) ObserveLease(prefix string, e retention.LeaseEvent) {
	shard, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(prefix, w.f.cfg.Prefix+"s"), "/"))
	if !assert.NoError(w.f.t, err, "the shard of %q", prefix) {
		return
	}
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	switch e {
	case retention.LeaseAcquired:
		w.f.owners[shard] = w.name
	case retention.LeaseLost, retention.LeaseReleased:
		if w.f.owners[shard] == w.name {
			w.f.owners[shard] = ""
		}
	}
}

// start starts replica name's Run on a pool of its own: its shards' leases
// are rows of one lease table named by the shards' prefixes, its clears
// delete the jobs and log each id with the replica's name in the
// transaction that deletes their markers.
func (f *pgFleet) start(name string) {
	pool, err := pgxpool.New(context.Background(), kvtest.ServerAddr(f.t, "RETENTION_POSTGRES_DSN"))
	require.NoError(f.t, err)
	kv, err := pgkv.New(pool, f.markers)
	require.NoError(f.t, err)
	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+f.jobs+" WHERE id = ANY($1::text[])", ids)
		b.Queue("INSERT INTO "+f.cleared+" (id, replica) SELECT unnest($1::text[]), $2", ids, name)
		return nil
	})
	require.NoError(f.t, err)
	cfg := f.cfg
	cfg.Replica = name
	cfg.Observer = pgWatch{f: f, name: name}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if os.Getenv("SHARD_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", name)
	}
	sc := f.sc
	sc.Lease = func(_ int, prefix string) (retention.Locker, error) {
		return pgkv.NewLocker(pool, prefix, &pgkv.LockerOptions{TTL: f.ttl, Table: f.leases})
	}
	s, err := retention.NewSharded(akv, cfg, sc)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	f.stops[name] = func() error {
		cancel()
		err := <-done
		pool.Close()
		return err
	}
}

func (f *pgFleet) stop(name string) {
	require.ErrorIs(f.t, f.stops[name](), context.Canceled, "%s's Run", name)
	delete(f.stops, name)
}

func (f *pgFleet) held() (owners []string, counts map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	counts = map[string]int{}
	for _, o := range f.owners {
		if o != "" {
			counts[o]++
		}
	}
	return append([]string(nil), f.owners...), counts
}

// balanced reports whether every shard is held, by the replicas named
// alone, each within one of the even share.
func (f *pgFleet) balanced(names ...string) bool {
	owners, counts := f.held()
	even := float64(len(owners)) / float64(len(names))
	total := 0
	for _, name := range names {
		if math.Abs(float64(counts[name])-even) > 1 {
			return false
		}
		total += counts[name]
	}
	return total == len(owners)
}

func (f *pgFleet) waitBalanced(limit time.Duration, names ...string) time.Duration {
	start := time.Now()
	for !f.balanced(names...) && time.Since(start) < limit {
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestShardedFleetOnOneTable runs a sharded sweep of 16 shards, prefixes
// of one marker table, on 4 replicas with pools of their own, each
// shard's lease a row of one lease table named by its prefix, while a
// writer finishes jobs (the job's row and its marker, of
// Sharded.MarkerKey, in one transaction): the replicas hold 4 shards each
// within 2 TTLs; one stops and the other three take its shards within TTL
// + Interval and share them within one of even; it starts again and gets
// its share. Every job is cleared exactly once: the atomic clear logs each
// id in the transaction that deletes the job and its marker, and the log
// holds every job once.
func TestShardedFleetOnOneTable(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet takes a while")
	}
	const (
		shards    = 16
		ttl       = 3 * time.Second
		heartbeat = 500 * time.Millisecond
		interval  = 2 * time.Second
		keep      = time.Second // Retention
	)
	pool := connect(t)
	ctx := context.Background()
	markers := freshTable(t, pool)
	f := &pgFleet{
		t: t, markers: markers, leases: markers + "_leases", jobs: markers + "_jobs", cleared: markers + "_cleared", ttl: ttl,
		cfg: retention.Config{
			Prefix: "jobs/done/", Retention: keep, Interval: interval,
			MinInterval:  250 * time.Millisecond, // a pass of a shard at most 4 times a second: 2 cores, -race
			StoreTimeout: 2 * time.Second,
		},
		sc:     retention.ShardConfig{Shards: shards, Heartbeat: heartbeat},
		owners: make([]string, shards),
		stops:  map[string]func() error{},
	}
	require.NoError(t, pgkv.MigrateLeases(ctx, pool, f.leases))
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id text COLLATE "C" PRIMARY KEY);
CREATE TABLE %s (id text NOT NULL, replica text NOT NULL)`, f.jobs, f.cleared))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+f.jobs+", "+f.cleared+", "+f.leases)
		assert.NoError(t, err)
	})

	// The writer: 10 jobs every 50ms, each with its marker in one
	// transaction.
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	writer, err := retention.NewSharded(kv, retention.Config{Prefix: "jobs/done/", Retention: keep, Clear: func(context.Context, string) error { return nil }},
		retention.ShardConfig{Shards: shards})
	require.NoError(t, err)
	written := 0
	wctx, stopWriting := context.WithCancel(context.Background())
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for wctx.Err() == nil {
			for range 10 {
				id := fmt.Sprintf("job-%06d", written)
				key, err := writer.MarkerKey(time.Now(), id)
				if !assert.NoError(t, err) {
					return
				}
				if !assert.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "INSERT INTO "+f.jobs+" (id) VALUES ($1)", id); err != nil {
						return err
					}
					return kv.MarkKeyTx(ctx, tx, key)
				})) {
					return
				}
				written++
			}
			select {
			case <-wctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() {
		stopWriting()
		<-writing
		for name, stop := range f.stops {
			_ = stop()
			delete(f.stops, name)
		}
	}()

	all := []string{"r0", "r1", "r2", "r3"}
	started := time.Now()
	for _, name := range all {
		f.start(name)
	}
	took := f.waitBalanced(4*ttl, all...)
	time.Sleep(2*ttl - time.Since(started))
	owners, counts := f.held()
	require.True(t, f.balanced(all...), "after 2 TTLs: held %v (%v)", counts, owners)
	t.Logf("4 replicas, 16 shards: within one of even (4 each) after %v; after 2 TTLs (%v) %v", took.Round(time.Millisecond), 2*ttl, counts)

	// r0 stops: its Run returns, giving its leases up and deleting its
	// replica's key.
	var gone []int
	for i, o := range owners {
		if o == "r0" {
			gone = append(gone, i)
		}
	}
	stopped := time.Now()
	f.stop("r0")
	times := make([]time.Duration, len(gone))
	for k := range times {
		times[k] = -1
	}
	for left := len(gone); left > 0 && time.Since(stopped) <= ttl+interval; time.Sleep(20 * time.Millisecond) {
		owners, _ := f.held()
		for k, i := range gone {
			if times[k] < 0 && owners[i] != "" && owners[i] != "r0" {
				times[k] = time.Since(stopped)
				left--
			}
		}
	}
	t.Logf("r0 stopped: its shards %v taken after %v (TTL %v, Heartbeat %v, Interval %v)", gone, times, ttl, heartbeat, interval)
	for k, d := range times {
		assert.True(t, d >= 0 && d <= ttl+interval, "r0's shard %d taken after %v, want within TTL + Interval", gone[k], d)
	}
	took = f.waitBalanced(4*ttl, "r1", "r2", "r3")
	owners, counts = f.held()
	assert.True(t, f.balanced("r1", "r2", "r3"), "3 replicas: %v (%v)", counts, owners)
	t.Logf("3 replicas: within one of even after %v more: %v", took.Round(time.Millisecond), counts)

	f.start("r0")
	took = f.waitBalanced(4*ttl, all...)
	owners, counts = f.held()
	assert.True(t, f.balanced(all...), "r0 back: %v (%v)", counts, owners)
	t.Logf("r0 started again: within one of even after %v: %v", took.Round(time.Millisecond), counts)

	// The writer stops; the replicas clear the rest.
	stopWriting()
	<-writing
	drained := time.Now()
	for count(t, pool, f.jobs) > 0 && time.Since(drained) < keep+interval+ttl {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d jobs written; the last cleared %v after the writer stopped", written, time.Since(drained).Round(time.Millisecond))
	for _, name := range all {
		f.stop(name)
	}

	assert.Zero(t, count(t, pool, f.jobs), "jobs left")
	var markersLeft, cleared, distinct, replicasLeft int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+markers+" WHERE key >= 'jobs/done/s' AND key < 'jobs/done/t' AND key NOT LIKE 'jobs/done/s___/#%'").Scan(&markersLeft))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM "+f.cleared).Scan(&cleared, &distinct))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+markers+" WHERE key >= 'jobs/done/#m' AND key < 'jobs/done/#n'").Scan(&replicasLeft))
	assert.Zero(t, markersLeft, "markers left")
	assert.Equal(t, written, distinct, "jobs cleared")
	assert.Equal(t, distinct, cleared, "clears logged: each job exactly once")
	assert.Zero(t, replicasLeft, "replicas' keys left after every Run returned")
	rows, err := pool.Query(ctx, "SELECT replica, count(*) FROM "+f.cleared+" GROUP BY replica ORDER BY replica")
	require.NoError(t, err)
	by, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var name string
		var n int
		err := r.Scan(&name, &n)
		return fmt.Sprintf("%s:%d", name, n), err
	})
	require.NoError(t, err)
	t.Logf("cleared by replica: %v", by)
}
