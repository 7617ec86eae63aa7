package rediskv_test

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

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/rediskv"
)

// clusterSweepName returns a name for newClusterSweep that no other test
// uses, and deletes the keys of its n shards and its replicas' set when t
// ends (the runs' state keys are the test's to delete).
func clusterSweepName(t testing.TB, rdb *redis.ClusterClient, n int) (name string, tags []string) {
	t.Helper()
	name = fmt.Sprintf("sharded-%d-%d", os.Getpid(), keySeq.Add(1))
	tags, err := rediskv.ShardTags(name, n)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		assert.NoError(t, rdb.Del(ctx, "{"+name+"}:replicas").Err())
		for _, tag := range tags {
			assert.NoError(t, rdb.Del(ctx, tag+":done", tag+":lease").Err())
		}
	})
	return name, tags
}

// unlinkAll deletes keys, of any slots, in one pipeline.
func unlinkAll(rdb *redis.ClusterClient, keys []string) {
	ctx := context.Background()
	_, _ = rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, k := range keys {
			pipe.Unlink(ctx, k)
		}
		return nil
	})
}

// existing counts the keys of keys that exist, of any slots.
func existing(t testing.TB, rdb *redis.ClusterClient, keys []string) int {
	t.Helper()
	ctx := context.Background()
	cmds := make([]*redis.IntCmd, len(keys))
	_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = pipe.Exists(ctx, k)
		}
		return nil
	})
	require.NoError(t, err)
	n := 0
	for _, c := range cmds {
		n += int(c.Val())
	}
	return n
}

// markersLeft counts the markers of every shard's set: its members under
// the shard's prefix that are marker-shaped (the fleet's own keys, such as
// the history of its passes, are not).
func markersLeft(t testing.TB, rdb *redis.ClusterClient, prefix string, tags []string) int {
	t.Helper()
	n := 0
	for i, tag := range tags {
		members, err := rdb.ZRange(context.Background(), tag+":done", 0, -1).Result()
		require.NoError(t, err)
		for _, m := range members {
			if _, _, err := retention.ParseMarkerKey(retention.ShardPrefix(prefix, i), []byte(m)); err == nil {
				n++
			}
		}
	}
	return n
}

// TestClusterShardConformance runs the conformance suite over the store of
// a few shards of newClusterSweep, one on each master of the test
// cluster: the AtomicKV of WithStateKeys over the set of the shard's tag.
func TestClusterShardConformance(t *testing.T) {
	kvtest.ServerAddr(t, clusterEnv)
	for _, shard := range []int{0, 7, 15} {
		t.Run(fmt.Sprintf("shard %d of 16", shard), func(t *testing.T) {
			kvtest.Run(t, func(t testing.TB) kvtest.Store {
				rdb := connectCluster(t)
				_, tags := clusterSweepName(t, rdb, 16)
				kv, err := rediskv.New(rdb, tags[shard]+":done")
				require.NoError(t, err)
				akv, err := kv.WithStateKeys(tags[shard] + ":state:<id>")
				require.NoError(t, err)
				return kvtest.Store{KV: akv, Put: func(ctx context.Context, k []byte) error { return kv.Put(ctx, k, nil) }}
			})
		})
	}
}

// TestClusterShardedMarkersSpread writes 4,800 runs with finishShardedRun
// to sweeps of newClusterSweep and counts, on each master of the test
// cluster, the markers and state keys of the shards' slots it holds (each
// master counts its own: CLUSTER COUNTKEYSINSLOT, ZCARD, MEMORY USAGE).
// Each shard's set and its runs' state live on one master, the one
// CLUSTER SHARDS names for the slot; the markers spread over the masters
// as the shards do (ShardOf spreads the ids evenly over the shards); with
// a number of shards that three divides, within 10% of even. One Pass
// clears every run with its marker.
func TestClusterShardedMarkersSpread(t *testing.T) {
	for _, n := range []int{16, 24} {
		t.Run(fmt.Sprintf("%d shards", n), func(t *testing.T) { testClusterShardedMarkersSpread(t, n) })
	}
}

func testClusterShardedMarkersSpread(t *testing.T, n int) {
	rdb := connectCluster(t)
	ctx := context.Background()
	owners := clusterOwners(t, rdb)
	name, tags := clusterSweepName(t, rdb, n)
	sweep, err := newClusterSweep(rdb, name, retention.Config{
		Prefix: "runs/done/", Retention: 7 * 24 * time.Hour, Replica: "writer", Logger: slog.New(slog.DiscardHandler),
	}, retention.ShardConfig{Shards: n}, nil)
	require.NoError(t, err)

	const runs = 4800
	stateKeys := make([]string, runs)
	for i := range stateKeys {
		id := fmt.Sprintf("run-%05d", i)
		stateKeys[i] = tags[sweep.Shard(id)] + ":state:" + id
	}
	t.Cleanup(func() { unlinkAll(rdb, stateKeys) })
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < runs; i += 8 {
				id := fmt.Sprintf("run-%05d", i)
				if !assert.NoError(t, finishShardedRun(ctx, rdb, sweep, tags, id, time.Now().Add(-30*24*time.Hour))) {
					return
				}
			}
		})
	}
	wg.Wait()

	type load struct {
		shards, markers int
		bytes           int64
	}
	var mu sync.Mutex
	per := map[string]*load{}
	require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		addr := m.Options().Addr
		l := &load{}
		for _, tag := range tags {
			// A master counts only its own slots' keys: zero for the others'.
			keys, err := m.ClusterCountKeysInSlot(ctx, rediskv.Slot(tag)).Result()
			if err != nil || keys == 0 {
				if err != nil {
					return err
				}
				continue
			}
			assert.Equal(t, owners[rediskv.Slot(tag)], addr, "the master CLUSTER SHARDS names for %s", tag)
			markers, err := m.ZCard(ctx, tag+":done").Result()
			if err != nil {
				return err
			}
			assert.Equal(t, markers+1, keys, "%s: the set and the state of each of its runs on one master", tag)
			bytes, err := m.MemoryUsage(ctx, tag+":done").Result()
			if err != nil {
				return err
			}
			l.shards++
			l.markers += int(markers)
			l.bytes += bytes
		}
		mu.Lock()
		per[addr] = l
		mu.Unlock()
		return nil
	}))
	require.Len(t, per, 3, "the test cluster has three masters")
	shards, markers, bytes := 0, 0, int64(0)
	for _, l := range per {
		shards += l.shards
		markers += l.markers
		bytes += l.bytes
	}
	require.Equal(t, n, shards, "every shard's set on one master")
	require.Equal(t, runs, markers, "every run marked once")
	even := float64(runs) / 3
	for addr, l := range per {
		// The masters hold n / 3 shards, within one; the ids spread
		// evenly over the shards.
		assert.InDelta(t, float64(n)/3, l.shards, 1, "shards on %s", addr)
		ofShards := float64(runs) * float64(l.shards) / float64(n)
		assert.InEpsilon(t, ofShards, l.markers, 0.1, "%s: %d markers for %d of %d shards", addr, l.markers, l.shards, n)
		if n%3 == 0 {
			assert.InEpsilon(t, even, l.markers, 0.1, "%s: %d markers, even is %.0f", addr, l.markers, even)
			assert.InEpsilon(t, float64(bytes)/3, l.bytes, 0.1, "%s: %d bytes of markers of %d", addr, l.bytes, bytes)
		}
		t.Logf("%s: %d of %d shards, %d markers (%+.1f%% of even), %d bytes (%+.1f%% of even)", addr, l.shards, n,
			l.markers, 100*(float64(l.markers)/even-1), l.bytes, 100*(float64(l.bytes)*3/float64(bytes)-1))
	}

	total, _, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, runs, total.Cleared, "Pass().Cleared")
	assert.Zero(t, markersLeft(t, rdb, "runs/done/", tags), "markers left")
	assert.Zero(t, existing(t, rdb, stateKeys), "state keys left")
}

// clusterFleet runs the replicas of TestClusterShardedFleet, each with a
// cluster client and a sweep of newClusterSweep of its own, and follows
// from their Observers who holds each shard and how many runs each
// cleared.
type clusterFleet struct {
	t     *testing.T
	addrs []string
	name  string
	cfg   retention.Config
	sc    retention.ShardConfig
	lease *rediskv.LockerOptions

	mu      sync.Mutex
	owners  []string       // by shard: the replica that last took its lease, "" once it gave it up
	cleared map[string]int // by replica: runs cleared, as its pages tell
	stops   map[string]func() error
	kills   map[string]func()
}

// fleetWatch is a replica's Observer.
type fleetWatch struct {
	f    *clusterFleet
	name string
}

func (w fleetWatch) ObservePass(string, retention.Stats, error) {}
func (w fleetWatch) ObserveLags(string, []time.Duration)        {}

func (w fleetWatch) ObservePage(_ string, page retention.Stats) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	w.f.cleared[w.name] += page.Cleared
}

func (w fleetWatch) ObserveLease(prefix string, e retention.LeaseEvent) {
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

// start starts replica name's Run on a client of its own.
func (f *clusterFleet) start(name string) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: f.addrs, PoolSize: 8})
	cfg := f.cfg
	cfg.Replica = name
	cfg.Observer = fleetWatch{f: f, name: name}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if os.Getenv("SHARD_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", name)
	}
	s, err := newClusterSweep(rdb, f.name, cfg, f.sc, f.lease)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	f.stops[name] = func() error {
		cancel()
		err := <-done
		_ = rdb.Close() // an error if kill closed it
		return err
	}
	f.kills[name] = func() { _ = rdb.Close() }
}

// stop ends replica name's Run, which gives its shards up.
func (f *clusterFleet) stop(name string) {
	require.ErrorIs(f.t, f.stops[name](), context.Canceled, "%s's Run", name)
	delete(f.stops, name)
}

// held returns who holds each shard, and how many each replica holds.
func (f *clusterFleet) held() (owners []string, counts map[string]int) {
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
func (f *clusterFleet) balanced(names ...string) bool {
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

// waitBalanced polls every 50ms until balanced(names), at most limit, and
// returns how long it took.
func (f *clusterFleet) waitBalanced(limit time.Duration, names ...string) time.Duration {
	start := time.Now()
	for !f.balanced(names...) && time.Since(start) < limit {
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// takenFrom polls every 20ms until none of shards is held by from, at
// most limit after since, and returns how long after since each was taken
// by another replica, -1 for one that was not.
func (f *clusterFleet) takenFrom(from string, shards []int, since time.Time, limit time.Duration) []time.Duration {
	took := make([]time.Duration, len(shards))
	for k := range took {
		took[k] = -1
	}
	for left := len(shards); left > 0 && time.Since(since) <= limit; time.Sleep(20 * time.Millisecond) {
		owners, _ := f.held()
		for k, i := range shards {
			if took[k] < 0 && owners[i] != "" && owners[i] != from {
				took[k] = time.Since(since)
				left--
			}
		}
	}
	return took
}

func heldBy(owners []string, name string) []int {
	var out []int
	for i, o := range owners {
		if o == name {
			out = append(out, i)
		}
	}
	return out
}

// TestClusterShardedFleet runs the sweep of newClusterSweep, 16 shards
// over the test cluster's three masters, on 4 replicas, each with a
// cluster client of its own, while a writer finishes runs with
// finishShardedRun: the replicas hold 4 shards each within 2 TTLs; one
// stops (its Run returns) and one dies (its client closes: no renewal,
// no release, its replica's key left behind), and the others take their
// shards within TTL + Interval and share them within one of even; the
// stopped one starts again and gets its share. Every run is cleared
// exactly once (the runs of WithStateKeys: the replicas' pages clear as
// many runs as were written, none of their state keys nor markers is
// left).
func TestClusterShardedFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet takes a while")
	}
	admin := connectCluster(t)
	const (
		shards    = 16
		ttl       = 3 * time.Second
		heartbeat = 500 * time.Millisecond
		interval  = 2 * time.Second
		keep      = time.Second // Retention
	)
	name, tags := clusterSweepName(t, admin, shards)
	f := &clusterFleet{
		t: t, addrs: strings.Split(kvtest.ServerAddr(t, clusterEnv), ","), name: name,
		cfg: retention.Config{
			Prefix: "runs/done/", Retention: keep, Interval: interval,
			MinInterval:  250 * time.Millisecond, // a pass of a shard at most 4 times a second: 2 cores, -race
			StoreTimeout: 2 * time.Second,
		},
		sc:      retention.ShardConfig{Shards: shards, Heartbeat: heartbeat},
		lease:   &rediskv.LockerOptions{TTL: ttl},
		owners:  make([]string, shards),
		cleared: map[string]int{},
		stops:   map[string]func() error{},
		kills:   map[string]func(){},
	}

	// The writer: 10 runs every 50ms, each in a MULTI with its state.
	writer, err := newClusterSweep(admin, name, retention.Config{Prefix: "runs/done/", Retention: keep, Replica: "writer"}, f.sc, nil)
	require.NoError(t, err)
	var stateKeys []string
	t.Cleanup(func() { unlinkAll(admin, stateKeys) })
	wctx, stopWriting := context.WithCancel(context.Background())
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for wctx.Err() == nil {
			for range 10 {
				id := fmt.Sprintf("run-%06d", len(stateKeys))
				if !assert.NoError(t, finishShardedRun(context.Background(), admin, writer, tags, id, time.Now())) {
					return
				}
				stateKeys = append(stateKeys, tags[writer.Shard(id)]+":state:"+id)
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
	gone := heldBy(owners, "r0")
	stopped := time.Now()
	f.stop("r0")
	times := f.takenFrom("r0", gone, stopped, ttl+interval)
	t.Logf("r0 stopped: its shards %v taken after %v (TTL %v, Heartbeat %v, Interval %v)", gone, times, ttl, heartbeat, interval)
	for k, d := range times {
		assert.True(t, d >= 0 && d <= ttl+interval, "r0's shard %d taken after %v, want within TTL + Interval", gone[k], d)
	}
	took = f.waitBalanced(4*ttl, "r1", "r2", "r3")
	owners, counts = f.held()
	assert.True(t, f.balanced("r1", "r2", "r3"), "3 replicas: %v (%v)", counts, owners)
	t.Logf("3 replicas: within one of even after %v: %v", took.Round(time.Millisecond), counts)

	// r1 dies: its client closes, so it renews nothing, releases nothing,
	// and its replica's key stays as it was.
	dead := heldBy(owners, "r1")
	died := time.Now()
	f.kills["r1"]()
	times = f.takenFrom("r1", dead, died, ttl+interval)
	t.Logf("r1 died: its shards %v taken after %v", dead, times)
	for k, d := range times {
		assert.True(t, d >= 0 && d <= ttl+interval, "r1's shard %d taken after %v, want within TTL + Interval", dead[k], d)
	}
	took = f.waitBalanced(4*ttl, "r2", "r3")
	_, counts = f.held()
	assert.True(t, f.balanced("r2", "r3"), "2 replicas: %v", counts)
	t.Logf("2 replicas: within one of even after %v: %v", took.Round(time.Millisecond), counts)

	// r0 starts again and gets its share.
	f.start("r0")
	took = f.waitBalanced(4*ttl, "r0", "r2", "r3")
	owners, counts = f.held()
	assert.True(t, f.balanced("r0", "r2", "r3"), "r0 back: %v (%v)", counts, owners)
	t.Logf("r0 started again: within one of even after %v: %v", took.Round(time.Millisecond), counts)

	// The writer stops; the replicas clear the rest.
	stopWriting()
	<-writing
	drained := time.Now()
	for markersLeft(t, admin, "runs/done/", tags) > 0 && time.Since(drained) < keep+interval+ttl {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d runs written; the last cleared %v after the writer stopped", len(stateKeys), time.Since(drained).Round(time.Millisecond))
	if os.Getenv("SHARD_DEBUG") != "" {
		owners, _ = f.held()
		for i, tag := range tags {
			m, _ := admin.ZRange(context.Background(), tag+":done", 0, 2).Result()
			t.Logf("shard %d held by %s: %d left %q", i, owners[i], admin.ZCard(context.Background(), tag+":done").Val(), m)
		}
	}
	for _, name := range []string{"r0", "r2", "r3"} {
		f.stop(name)
	}
	err = f.stops["r1"]()
	delete(f.stops, "r1")
	t.Logf("r1's Run, its client closed: %v", err)

	assert.Zero(t, markersLeft(t, admin, "runs/done/", tags), "markers left")
	assert.Zero(t, existing(t, admin, stateKeys), "state keys left")
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0
	for _, n := range f.cleared {
		total += n
	}
	assert.Equal(t, len(stateKeys), total, "runs cleared by the replicas' pages (%v), of %d written: each exactly once", f.cleared, len(stateKeys))
	left, err := admin.ZRange(context.Background(), "{"+name+"}:replicas", 0, -1).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, len(left), 1, "replicas' keys left: r1's alone, which the others delete after 30 of its Heartbeats")
}
