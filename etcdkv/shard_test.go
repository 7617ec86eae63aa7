package etcdkv_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
	"github.com/marksweep/retention/kvtest"
)

// etcdFleet runs the replicas of TestShardedSweepOnOneKeyspace, each with
// a client and a Sharded of its own, follows from their Observers who
// holds each shard, and records who cleared each entity.
type etcdFleet struct {
	t    *testing.T
	addr string
	ns   string // the namespace of every key: markers, replicas' keys, leases, entities
	cfg  retention.Config
	sc   retention.ShardConfig
	ttl  time.Duration

	mu      sync.Mutex
	owners  []string            // by shard: the replica that last took its lease, "" once it gave it up
	clearer map[string][]string // by entity: the replicas whose Clear deleted its state, in order
	stops   map[string]func() error
}

// etcdWatch is a replica's Observer.
type etcdWatch struct {
	f    *etcdFleet
	name string
}

func (w etcdWatch) ObservePass(string, retention.Stats, error) {}
func (w etcdWatch) ObserveLags(string, []time.Duration)        {}
func (w etcdWatch) ObservePage(string, retention.Stats)        {}
func (w etcdWatch) ObserveLease(prefix string, e retention.LeaseEvent) {
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
		// Another replica may have taken it before this event came in.
		if w.f.owners[shard] == w.name {
			w.f.owners[shard] = ""
		}
	}
}

// stateKey is the key of entity id's state, which its Clear deletes.
func (f *etcdFleet) stateKey(id string) string { return f.ns + "state/" + id }

// start starts replica name's Run on a client of its own: each shard's
// lease is an etcdkv.Locker named by the shard's prefix, and its Clear
// deletes the entity's state key and records the replica's name.
func (f *etcdFleet) start(name string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(f.addr, ","), DialTimeout: 5 * time.Second})
	require.NoError(f.t, err)
	kv, err := etcdkv.New(cli, f.ns, nil)
	require.NoError(f.t, err)
	cfg := f.cfg
	cfg.Replica = name
	cfg.Observer = etcdWatch{f: f, name: name}
	cfg.Clear = func(ctx context.Context, id string) error {
		if _, err := cli.Delete(ctx, f.stateKey(id)); err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.clearer[id] = append(f.clearer[id], name)
		return nil
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if os.Getenv("SHARD_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", name)
	}
	sc := f.sc
	sc.Lease = func(_ int, prefix string) (retention.Locker, error) {
		return etcdkv.NewLocker(cli, f.ns+"lease/"+strings.TrimSuffix(prefix, "/"), &etcdkv.LockerOptions{TTL: f.ttl})
	}
	s, err := retention.NewSharded(kv, cfg, sc)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	f.stops[name] = func() error {
		cancel()
		err := <-done
		assert.NoError(f.t, cli.Close(), "%s's client", name)
		return err
	}
}

func (f *etcdFleet) stop(name string) {
	require.ErrorIs(f.t, f.stops[name](), context.Canceled, "%s's Run", name)
	delete(f.stops, name)
}

func (f *etcdFleet) held() (owners []string, counts map[string]int) {
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
func (f *etcdFleet) balanced(names ...string) bool {
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

// waitBalanced polls until balanced or limit, which only bounds a failing
// run: it asserts nothing about speed.
func (f *etcdFleet) waitBalanced(limit time.Duration, names ...string) time.Duration {
	start := time.Now()
	for !f.balanced(names...) && time.Since(start) < limit {
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// waitCleared polls until enough holds of how many entities that match
// each replica cleared (an entity once per replica, however often), and
// requires it within limit, which only bounds a failing run.
func (f *etcdFleet) waitCleared(limit time.Duration, match func(id string) bool, enough func(by map[string]int) bool) time.Duration {
	start := time.Now()
	for {
		by := map[string]int{}
		f.mu.Lock()
		for id, rs := range f.clearer {
			if match(id) {
				for _, r := range slices.Compact(slices.Sorted(slices.Values(rs))) {
					by[r]++
				}
			}
		}
		f.mu.Unlock()
		if enough(by) {
			return time.Since(start)
		}
		require.Less(f.t, time.Since(start), limit, "cleared by replica %v: not enough", by)
		time.Sleep(20 * time.Millisecond)
	}
}

// count returns how many keys lie in [start, end) of the namespace.
func (f *etcdFleet) count(ctx context.Context, admin *clientv3.Client, start, end string) int {
	resp, err := admin.Get(ctx, f.ns+start, clientv3.WithRange(f.ns+end), clientv3.WithCountOnly())
	require.NoError(f.t, err)
	return int(resp.Count)
}

// TestShardedSweepOnOneKeyspace runs a sharded sweep of 8 shards, prefixes
// of one etcd namespace, on 3 replicas with clients of their own, each
// shard's lease an etcdkv.Locker named by its prefix, while a writer
// finishes entities (the entity's state key and its marker, of
// Sharded.MarkerKey, in one Txn): the replicas share the shards within
// one of even and each clears entities; one stops and the other two take
// every shard it held, share them within one of even and clear what is
// written in them since. Then every entity is cleared (its state key
// gone, its Clear recorded), no marker and no replica's key is left.
// etcdkv has no atomic clear (no ClearDeleter), so the clears are at least
// once: the test requires none lost and reports how many ran twice.
func TestShardedSweepOnOneKeyspace(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet takes a few seconds")
	}
	const (
		shards    = 8
		ttl       = 2 * time.Second // etcdkv.MinLeaseTTL is 1s; etcd may raise very short TTLs
		heartbeat = 500 * time.Millisecond
		interval  = time.Second
		keep      = 300 * time.Millisecond // Retention
		limit     = 15 * time.Second       // bounds a failing wait only
	)
	require.LessOrEqual(t, 3*heartbeat, ttl, "a Heartbeat at most a third of the TTL")
	ctx := context.Background()
	admin := connect(t)
	f := &etcdFleet{
		t: t, addr: kvtest.ServerAddr(t, "RETENTION_ETCD_ENDPOINTS"), ns: freshNamespace(t, admin), ttl: ttl,
		cfg: retention.Config{
			Prefix: "jobs/done/", Retention: keep, Interval: interval,
			MinInterval:  100 * time.Millisecond, // 2 cores, -race, other tests beside
			StoreTimeout: 5 * time.Second,
		},
		sc:      retention.ShardConfig{Shards: shards, Heartbeat: heartbeat},
		owners:  make([]string, shards),
		clearer: map[string][]string{},
		stops:   map[string]func() error{},
	}

	// The writer: 5 entities every 50ms, each with its marker in one Txn.
	kv, err := etcdkv.New(admin, f.ns, nil)
	require.NoError(t, err)
	writer, err := retention.NewSharded(kv, retention.Config{Prefix: f.cfg.Prefix, Retention: keep, Clear: func(context.Context, string) error { return nil }},
		retention.ShardConfig{Shards: shards})
	require.NoError(t, err)
	var (
		written []string
		n       atomic.Int64 // len(written), for the test's goroutine
	)
	wctx, stopWriting := context.WithCancel(ctx)
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for wctx.Err() == nil {
			for range 5 {
				id := fmt.Sprintf("job-%06d", len(written))
				key, err := writer.MarkerKey(time.Now(), id)
				if !assert.NoError(t, err) {
					return
				}
				mark, err := kv.MarkKeyOp(key)
				if !assert.NoError(t, err) {
					return
				}
				_, err = admin.Txn(ctx).Then(clientv3.OpPut(f.stateKey(id), "finished"), mark).Commit()
				if !assert.NoError(t, err) {
					return
				}
				written = append(written, id)
				n.Add(1)
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

	all := []string{"r0", "r1", "r2"}
	for _, name := range all {
		f.start(name)
	}
	took := f.waitBalanced(limit, all...)
	owners, counts := f.held()
	require.True(t, f.balanced(all...), "3 replicas: held %v (%v)", counts, owners)
	t.Logf("3 replicas, 8 shards: within one of even after %v: %v", took.Round(time.Millisecond), counts)
	took = f.waitCleared(limit, func(string) bool { return true }, func(by map[string]int) bool {
		return by["r0"] >= 25 && by["r1"] >= 25 && by["r2"] >= 25
	})
	t.Logf("each replica cleared 25 entities %v later", took.Round(time.Millisecond))

	// r0 stops: its Run returns, giving its leases up and deleting its
	// replica's key; r1 and r2 must take every shard it held.
	owners, _ = f.held()
	var gone []int
	for i, o := range owners {
		if o == "r0" {
			gone = append(gone, i)
		}
	}
	stopped := time.Now()
	f.stop("r0")
	after := n.Load() // the entities from here on are r1's and r2's to clear
	times := make([]time.Duration, len(gone))
	for k := range times {
		times[k] = -1
	}
	for left := len(gone); left > 0 && time.Since(stopped) < limit; time.Sleep(20 * time.Millisecond) {
		owners, _ := f.held()
		for k, i := range gone {
			if times[k] < 0 && owners[i] != "" && owners[i] != "r0" {
				times[k] = time.Since(stopped)
				left--
			}
		}
	}
	owners, _ = f.held()
	t.Logf("r0 stopped: its shards %v taken after %v by %v (TTL %v, Heartbeat %v, Interval %v)", gone, times, owners, ttl, heartbeat, interval)
	for k, d := range times {
		require.True(t, d >= 0, "r0's shard %d not taken by r1 or r2 within %v", gone[k], limit)
	}
	took = f.waitBalanced(limit, "r1", "r2")
	owners, counts = f.held()
	require.True(t, f.balanced("r1", "r2"), "2 replicas: %v (%v)", counts, owners)
	t.Logf("2 replicas: within one of even after %v more: %v", took.Round(time.Millisecond), counts)
	// The shards r0 held are swept: entities written in them since it
	// stopped are cleared.
	inGone := func(id string) bool {
		num, err := strconv.Atoi(strings.TrimPrefix(id, "job-"))
		return err == nil && int64(num) >= after && slices.Contains(gone, retention.ShardOf(id, shards))
	}
	took = f.waitCleared(limit, inGone, func(by map[string]int) bool { return by["r1"]+by["r2"] >= 25 })
	t.Logf("r1 and r2 cleared 25 entities written in r0's shards after it stopped, %v later", took.Round(time.Millisecond))

	// The writer stops; r1 and r2 clear the rest.
	stopWriting()
	<-writing
	drained := time.Now()
	for f.count(ctx, admin, "state/", "state0") > 0 && time.Since(drained) < limit {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d entities written; the last cleared %v after the writer stopped", len(written), time.Since(drained).Round(time.Millisecond))
	f.stop("r1")
	f.stop("r2")

	assert.Zero(t, f.count(ctx, admin, "state/", "state0"), "entities' state left")
	resp, err := admin.Get(ctx, f.ns+f.cfg.Prefix+"s", clientv3.WithRange(f.ns+f.cfg.Prefix+"t"), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var markersLeft []string
	records := map[string]int{}
	for _, kv := range resp.Kvs {
		// A shard's own fleet keys (<shard prefix>#<kind>...: its record of
		// passes, its lease's free key) stay; anything else under a shard's
		// prefix is a marker: due, retrying, held or parked.
		rest := strings.TrimPrefix(string(kv.Key), f.ns+f.cfg.Prefix)
		if len(rest) > 6 && rest[5] == '#' {
			records[rest[5:7]]++
			continue
		}
		markersLeft = append(markersLeft, rest)
	}
	assert.Empty(t, markersLeft, "markers left")
	assert.Zero(t, f.count(ctx, admin, f.cfg.Prefix+"#m", f.cfg.Prefix+"#n"), "replicas' keys left after every Run returned")

	f.mu.Lock()
	defer f.mu.Unlock()
	lost, twice, byTwo := 0, 0, 0
	by := map[string]int{}
	for _, id := range written {
		rs := f.clearer[id]
		switch {
		case len(rs) == 0:
			lost++
			t.Errorf("%s never cleared", id)
			continue
		case len(rs) > 1:
			twice++
			if rs[0] != rs[len(rs)-1] {
				byTwo++
			}
		}
		by[rs[0]]++
	}
	assert.Len(t, f.clearer, len(written), "entities cleared that were never written")
	t.Logf("cleared: %d lost, %d cleared more than once (%d by two replicas; etcdkv's clears are at least once), first clears by replica %v; the shards' fleet keys left by kind %v",
		lost, twice, byTwo, by, records)
}
