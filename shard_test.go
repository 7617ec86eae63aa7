package retention

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

func TestShardOfIsStable(t *testing.T) {
	t.Parallel()
	// Golden values: a marker written by one version is swept by the
	// shard of every other. Changing one of them loses markers.
	tests := []struct {
		id   string
		n    int
		want int
	}{
		{"a", 16, 11},
		{"x", 16, 5},
		{"run-1", 16, 10},
		{"run-2", 16, 1},
		{"job-42", 16, 9},
		{"01J9ZKQ3M4X8V6T2B7N5C0RDEW", 16, 2},
		{"", 16, 6},
		{"run-1", 1000, 122},
		{"run-2", 1000, 433},
		{"job-42", 1000, 753},
		{"a", 7, 1},
		{"x", 7, 5},
		{"run-1", 1, 0},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, ShardOf(tt.id, tt.n), "ShardOf(%q, %d)", tt.id, tt.n)
		h := fnv.New64a()
		_, _ = h.Write([]byte(tt.id))
		k := h.Sum64() // MurmurHash3's fmix64, as its reference code has it
		k ^= k >> 33
		k *= 0xff51afd7ed558ccd
		k ^= k >> 33
		k *= 0xc4ceb9fe1a85ec53
		k ^= k >> 33
		assert.Equal(t, int(k%uint64(tt.n)), ShardOf(tt.id, tt.n), "ShardOf(%q, %d) is not fmix64(FNV-1a 64) modulo n", tt.id, tt.n)
	}
	for _, n := range []int{0, -1} {
		assert.Panics(t, func() { ShardOf("a", n) }, "ShardOf(\"a\", %d)", n)
	}
}

// TestShardOfSpreads checks that ids of common shapes fall evenly over the
// shards: the chi-square statistic of 200 ids a shard stays within five
// standard deviations of its mean (deterministic: the ids are fixed).
func TestShardOfSpreads(t *testing.T) {
	t.Parallel()
	families := []struct {
		name string
		id   func(rng *rand.Rand, i int) string
	}{
		{"sequential", func(_ *rand.Rand, i int) string { return "run-" + strconv.Itoa(i) }},
		{"zero-padded", func(_ *rand.Rand, i int) string { return fmt.Sprintf("%020d", i) }},
		{"strided", func(_ *rand.Rand, i int) string { return fmt.Sprintf("job_%08x", i*7919) }},
		{"random hex", func(rng *rand.Rand, _ int) string { return fmt.Sprintf("%016x%016x", rng.Uint64(), rng.Uint64()) }},
	}
	for _, f := range families {
		for _, n := range []int{2, 3, 7, 16, 64, 100, 1000} {
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			const perShard = 200
			counts := make([]int, n)
			for i := range perShard * n {
				counts[ShardOf(f.id(rng, i), n)]++
			}
			chi2 := 0.0
			for _, c := range counts {
				d := float64(c - perShard)
				chi2 += d * d / perShard
			}
			df := float64(n - 1)
			bound := df + 5*math.Sqrt(2*df)
			assert.Less(t, chi2, bound, "%s ids over %d shards: chi-square %.1f, want below %.1f (df %v)", f.name, n, chi2, bound, df)
			t.Logf("%s ids over %d shards: chi-square %.1f (df %v, bound %.1f)", f.name, n, chi2, df, bound)
		}
	}
}

func TestShardPrefix(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "runs/done/s000/", ShardPrefix("runs/done/", 0))
	assert.Equal(t, "runs/done/s007/", ShardPrefix("runs/done/", 7))
	assert.Equal(t, "runs/done/s999/", ShardPrefix("runs/done/", MaxShards-1))
	for _, bad := range []int{-1, MaxShards} {
		assert.Panics(t, func() { ShardPrefix("runs/", bad) }, "ShardPrefix(%d)", bad)
	}
	// Every shard's prefix is one New takes, and no shard's sweep, nor the
	// sweep of the prefix itself (which drains markers written before
	// sharding), reads another's keys.
	mem := NewMemKV()
	for i := range 12 {
		mark(t, mem, ShardPrefix("runs/", i), "id-"+strconv.Itoa(i), t0.Add(-48*time.Hour))
	}
	plain, _ := newSweep(t, mem, Config{Prefix: "runs/", Clear: newClears().clear})
	st, err := plain.Pass(t.Context())
	require.NoError(t, err)
	assert.Zero(t, st.Scanned+st.Foreign+st.Cleared+st.Malformed, "the sweep of the prefix read the shards' keys: %+v", st)
	for i := range 12 {
		c := newClears()
		s, _ := newSweep(t, mem, Config{Prefix: ShardPrefix("runs/", i), Clear: c.clear})
		st, err := s.Pass(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, st.Cleared, "shard %d", i)
		assert.Zero(t, st.Foreign, "shard %d read another's keys", i)
		assert.Equal(t, 1, c.count("id-"+strconv.Itoa(i)), "shard %d", i)
	}
	assert.Zero(t, mem.Len())
}

func TestNewShardedRefuses(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, string) error { return nil }
	okLease := func(int, string) (Locker, error) { return &fakeLocker{}, nil }
	errNoLease := errors.New("no such table")
	tests := []struct {
		name string
		cfg  Config
		sc   ShardConfig
		want string
		is   error
	}{
		{"no shards", Config{}, ShardConfig{}, "ShardConfig.Shards must be 1 to 1000, got 0", ErrInvalidConfig},
		{"too many shards", Config{}, ShardConfig{Shards: MaxShards + 1}, "ShardConfig.Shards", ErrInvalidConfig},
		{"negative heartbeat", Config{}, ShardConfig{Shards: 4, Heartbeat: -time.Second}, "ShardConfig.Heartbeat", ErrInvalidConfig},
		{"sub-millisecond heartbeat", Config{}, ShardConfig{Shards: 4, Heartbeat: time.Microsecond}, "ShardConfig.Heartbeat", ErrInvalidConfig},
		{"a sweep's lease", Config{Lease: &fakeLocker{}}, ShardConfig{Shards: 4}, "set ShardConfig.Lease", ErrInvalidConfig},
		{"lease without replica", Config{}, ShardConfig{Shards: 4, Lease: okLease}, "Config.Replica is empty", ErrInvalidConfig},
		{"prefix ending in an id byte", Config{Prefix: "runs"}, ShardConfig{Shards: 4}, "Config.Prefix \"runs\" ends in", ErrInvalidConfig},
		{"no retention", Config{Retention: -1}, ShardConfig{Shards: 4}, "Config.Retention", ErrInvalidConfig},
		{"lease error", Config{Replica: "a"}, ShardConfig{Shards: 4, Lease: func(int, string) (Locker, error) { return nil, errNoLease }},
			`ShardConfig.Lease(0, "runs/s000/")`, errNoLease},
		{"nil locker", Config{Replica: "a"}, ShardConfig{Shards: 4, Lease: func(int, string) (Locker, error) { return nil, nil }},
			"returned a nil Locker", ErrInvalidConfig},
		{"KV error", Config{}, ShardConfig{Shards: 4, KV: func(int, string) (KV, error) { return nil, errNoLease }},
			"ShardConfig.KV(0)", errNoLease},
		{"nil KV", Config{}, ShardConfig{Shards: 4, KV: func(int, string) (KV, error) { return nil, nil }},
			"ShardConfig.KV(0) returned a nil KV", ErrInvalidConfig},
		{"shard KV that cannot clear", Config{Clear: nil}, ShardConfig{Shards: 4, KV: func(int, string) (KV, error) { return NewMemKV(), nil }},
			"Config.Clear or Config.ClearBatch must be set", ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			if cfg.Prefix == "" {
				cfg.Prefix = "runs/"
			}
			if cfg.Retention == 0 {
				cfg.Retention = time.Hour
			}
			if tt.name != "shard KV that cannot clear" {
				cfg.Clear = noop
			}
			s, err := NewSharded(NewMemKV(), cfg, tt.sc)
			require.ErrorIs(t, err, tt.is, "NewSharded() = %v, want %v", err, tt.is)
			assert.Contains(t, err.Error(), tt.want)
			assert.Nil(t, s)
		})
	}
}

func TestShardedNotConfigured(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]*Sharded{"zero": {}, "nil": nil} {
		ctx := t.Context()
		_, _, err := s.Pass(ctx)
		assert.ErrorIs(t, err, ErrNotConfigured, "%s Sharded.Pass", name)
		assert.ErrorContains(t, err, "retention.NewSharded")
		assert.ErrorIs(t, s.Run(ctx), ErrNotConfigured, "%s Sharded.Run", name)
		_, _, err = s.Backlog(ctx, 10)
		assert.ErrorIs(t, err, ErrNotConfigured, "%s Sharded.Backlog", name)
		_, err = s.Pending(ctx, 10)
		assert.ErrorIs(t, err, ErrNotConfigured, "%s Sharded.Pending", name)
		_, err = s.MarkerKey(t0, "a")
		assert.ErrorIs(t, err, ErrNotConfigured, "%s Sharded.MarkerKey", name)
		assert.Equal(t, -1, s.Shard("a"), "%s Sharded.Shard", name)
		assert.Nil(t, s.Shards(), "%s Sharded.Shards", name)
	}
}

// newSharded builds a Sharded of shards shards over kv with a manual
// clock at t0, filling in what cfg leaves out as newSweep does.
func newSharded(t testing.TB, kv KV, cfg Config, shards int) (*Sharded, *ManualClock) {
	t.Helper()
	clock := NewManualClock(t0)
	if cfg.Clock == nil {
		cfg.Clock = clock
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "runs/"
	}
	if cfg.Retention == 0 {
		cfg.Retention = time.Hour
	}
	s, err := NewSharded(kv, cfg, ShardConfig{Shards: shards})
	require.NoError(t, err)
	return s, clock
}

// TestShardedMarkersClearedByTheirShard writes markers with the sharded
// MarkerKey: each lies under its id's shard, and that shard's pass clears
// it once it is strictly older than Retention, not before.
func TestShardedMarkersClearedByTheirShard(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			s, clock := newSharded(t, kind.wrap(mem), Config{Clear: c.clear}, 8)
			finished := map[string]time.Time{}
			due := make([]int, 8)
			for i := range 240 {
				id := "run-" + strconv.Itoa(i)
				at := t0.Add(-[]time.Duration{2 * time.Hour, time.Hour, 30 * time.Minute}[i%3])
				key, err := s.MarkerKey(at, id)
				require.NoError(t, err)
				require.True(t, strings.HasPrefix(string(key), ShardPrefix("runs/", ShardOf(id, 8))), "key %q", key)
				require.NoError(t, mem.Put(t.Context(), key, nil))
				finished[id] = at
				if i%3 == 0 {
					due[s.Shard(id)]++
				}
			}
			total, shards, err := s.Pass(t.Context())
			require.NoError(t, err)
			require.Len(t, shards, 8)
			assert.Equal(t, 80, total.Cleared, "Pass() cleared %d, want the 80 markers two hours old", total.Cleared)
			for i, st := range shards {
				assert.Equal(t, due[i], st.Cleared, "shard %d cleared %d, want its %d due markers", i, st.Cleared, due[i])
			}
			for id, at := range finished {
				want := 0
				if at.Equal(t0.Add(-2 * time.Hour)) {
					want = 1
				}
				assert.Equal(t, want, c.count(id), "clears of %s, finished %v before the pass", id, t0.Sub(at))
			}
			// Exactly Retention old is kept; a millisecond later it is not.
			clock.Advance(time.Millisecond)
			total, _, err = s.Pass(t.Context())
			require.NoError(t, err)
			assert.Equal(t, 80, total.Cleared, "the markers an hour old, a millisecond past Retention")
			clock.Advance(30 * time.Minute)
			total, _, err = s.Pass(t.Context())
			require.NoError(t, err)
			assert.Equal(t, 80, total.Cleared)
			assert.Equal(t, 240, c.total(), "every id cleared once")
			assert.Zero(t, mem.Len())
		})
	}
}

// shardAtomicKV is a ClearDeleter over a MemKV for a sharded sweep of
// "runs/" in n shards: it clears ids and deletes their markers under one
// lock, only if every marker is there, and checks that each marker lies
// in its id's shard and is expired.
type shardAtomicKV struct {
	*MemKV
	n         int
	clock     Clock
	retention time.Duration
	mu        sync.Mutex
	cleared   map[string]int
	problems  []string
}

func (a *shardAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, key := range keys {
		prefix := string(key[:len("runs/s000/")])
		at, id, err := ParseMarkerKey(prefix, key)
		if err != nil || prefix != ShardPrefix("runs/", ShardOf(string(id), a.n)) {
			a.problems = append(a.problems, fmt.Sprintf("%q is no marker of its id's shard (%v)", key, err))
		}
		if !a.clock.Now().After(at.Add(a.retention)) {
			a.problems = append(a.problems, fmt.Sprintf("%q cleared early", key))
		}
		if _, ok, _ := a.MemKV.Get(ctx, key); !ok {
			return fmt.Errorf("%w: %q", ErrMarkerGone, key)
		}
	}
	for _, id := range ids {
		a.cleared[id]++
	}
	return a.MemKV.Delete(ctx, keys...)
}

// TestShardedAtomicClearsOnce passes two sharded sweeps (two replicas
// without a lease) over one atomic store at once, again and again: every
// expired entity is cleared exactly once, by its shard, and none early.
func TestShardedAtomicClearsOnce(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	clock := NewManualClock(t0)
	a := &shardAtomicKV{MemKV: mem, n: 16, clock: clock, retention: time.Hour, cleared: map[string]int{}}
	var replicas []*Sharded
	for range 2 {
		s, err := NewSharded(a, Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, BatchSize: 8, PageSize: 16}, ShardConfig{Shards: 16})
		require.NoError(t, err)
		replicas = append(replicas, s)
	}
	for i := range 1000 {
		key, err := replicas[0].MarkerKey(t0.Add(-time.Duration(i)*time.Minute), "job-"+strconv.Itoa(i))
		require.NoError(t, err)
		require.NoError(t, mem.Put(t.Context(), key, nil))
	}
	for range 3 {
		var wg sync.WaitGroup
		for _, s := range replicas {
			wg.Go(func() {
				_, _, err := s.Pass(t.Context())
				assert.NoError(t, err)
			})
		}
		wg.Wait()
		clock.Advance(5 * time.Hour)
	}
	assert.Empty(t, a.problems)
	require.Len(t, a.cleared, 1000)
	for id, n := range a.cleared {
		require.Equal(t, 1, n, "%s cleared %d times", id, n)
	}
	assert.Zero(t, mem.Len())
}

func TestShardedBacklogAndPending(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	s, clock := newSharded(t, mem, Config{Clear: c.clear}, 4)
	for i := range 20 {
		key, err := s.MarkerKey(t0.Add(-time.Hour-time.Duration(i+1)*time.Minute), "run-"+strconv.Itoa(i))
		require.NoError(t, err)
		require.NoError(t, mem.Put(t.Context(), key, nil))
	}
	key, err := s.MarkerKey(t0, "later")
	require.NoError(t, err)
	require.NoError(t, mem.Put(t.Context(), key, nil))

	total, shards, err := s.Backlog(t.Context(), 100)
	require.NoError(t, err)
	require.Len(t, shards, 4)
	assert.Equal(t, 20, total.Due, "Backlog() total Due")
	sum := 0
	for i, b := range shards {
		sum += b.Due
		assert.Equal(t, i == s.Shard("run-19"), b.OldestID == "run-19", "shard %d's oldest is %q", i, b.OldestID)
	}
	assert.Equal(t, 20, sum, "the shards' Due add up to the total")
	assert.Equal(t, "run-19", total.OldestID, "the oldest of all shards")
	assert.Equal(t, 20*time.Minute, total.Age)

	pending, err := s.Pending(t.Context(), 5)
	require.NoError(t, err)
	var ids []string
	for _, m := range pending {
		ids = append(ids, m.ID)
	}
	assert.Equal(t, []string{"run-19", "run-18", "run-17", "run-16", "run-15"}, ids, "the longest past due of all shards first")

	c.set("run-3", errBoom)
	_, _, err = s.Pass(t.Context())
	require.NoError(t, err)
	total, shards, err = s.Backlog(t.Context(), 100)
	require.NoError(t, err)
	assert.Equal(t, 0, total.Due)
	assert.Equal(t, 1, total.Retrying)
	assert.Equal(t, 1, shards[s.Shard("run-3")].Retrying)
	clock.Advance(time.Hour + time.Millisecond)
	total, _, err = s.Backlog(t.Context(), 100)
	require.NoError(t, err)
	assert.Equal(t, 1, total.Due, "the later marker is due")
}

// TestShardedRunWithoutLease runs every shard in one process: all are
// swept, and the shards are claimed as a Sweep's Run claims its sweep.
func TestShardedRunWithoutLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		c := newClears()
		s, err := NewSharded(mem, Config{Prefix: "runs/", Retention: time.Hour, Clear: c.clear}, ShardConfig{Shards: 8})
		require.NoError(t, err)
		for i := range 100 {
			key, err := s.MarkerKey(time.Now().Add(-2*time.Hour), "run-"+strconv.Itoa(i))
			require.NoError(t, err)
			require.NoError(t, mem.Put(t.Context(), key, nil))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		assert.Equal(t, 100, c.total())
		assert.Zero(t, mem.Len())

		assert.ErrorIs(t, s.Run(t.Context()), ErrRunning, "a second Run")
		assert.ErrorIs(t, s.Shards()[3].Run(t.Context()), ErrRunning, "a shard's own Run")

		key, err := s.MarkerKey(time.Now(), "run-late")
		require.NoError(t, err)
		require.NoError(t, mem.Put(t.Context(), key, nil))
		time.Sleep(time.Hour + time.Second)
		assert.Equal(t, 1, c.count("run-late"), "swept when due")
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		_, err = s.Shards()[3].Pass(t.Context())
		assert.NoError(t, err, "a shard passes on its own once Run returned")
	})
}

func TestMemberKeyRoundTrip(t *testing.T) {
	t.Parallel()
	m := member{name: "web-7/a#b", heartbeat: 1500 * time.Millisecond, run: 1 << 60, beat: 12345, failing: true, held: []byte{0b1010_0001, 0, 0x80}}
	key := appendMemberKey(nil, "runs/", &m)
	require.True(t, strings.HasPrefix(string(key), "runs/#m"), "key %q", key)
	got, err := parseMemberKey("runs/", key)
	require.NoError(t, err)
	assert.Equal(t, m, got)
	assert.Equal(t, 4, got.count())
	for i, want := range map[int]bool{0: true, 1: false, 5: true, 7: true, 23: true, 22: false, 24: false, 1000: false} {
		assert.Equal(t, want, got.holds(i), "holds(%d)", i)
	}
	lower, upper := memberRange("runs/")
	assert.True(t, string(key) >= string(lower) && string(key) < string(upper), "%q lies outside the members' range", key)
	// No sweep reads it: it is no marker of any prefix.
	assert.Error(t, CheckMarkerKey(key))

	for _, bad := range []string{"runs/", "runs/#m", "runs/#mAA", "runs/#h" + string(key[len("runs/#m"):]), "other/#m" + string(key[len("runs/#m"):])} {
		_, err := parseMemberKey("runs/", []byte(bad))
		assert.Error(t, err, "parseMemberKey(%q)", bad)
	}
}

func FuzzParseMemberKey(f *testing.F) {
	f.Add(appendMemberKey(nil, "runs/", &member{name: "a", heartbeat: time.Second, held: []byte{1}}))
	f.Add([]byte("runs/#m"))
	f.Fuzz(func(t *testing.T, key []byte) {
		m, err := parseMemberKey("runs/", key)
		if err != nil {
			return
		}
		again, err := parseMemberKey("runs/", appendMemberKey(nil, "runs/", &m))
		require.NoError(t, err)
		require.Equal(t, m, again)
	})
}

// The fleet of a test: replicas (goroutines, each its own Sharded) over one
// MemKV, with a lease table in the bubble's time, as a store's is.

// leaseTable is the leases of a store: a lease is held until TTL after its
// holder's last renewal.
type leaseTable struct {
	mu       sync.Mutex
	ttl      time.Duration
	rows     map[string]*tableLease
	acquired int // leases taken
}

func newLeaseTable(ttl time.Duration) *leaseTable {
	return &leaseTable{ttl: ttl, rows: map[string]*tableLease{}}
}

// owners returns the replica that holds each name's lease, "" for none.
func (t *leaseTable) owners(names []string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, len(names))
	for i, name := range names {
		if r := t.rows[name]; r != nil && time.Now().Before(r.expires) {
			out[i] = r.owner
		}
	}
	return out
}

// node is one replica's way to the store. freeze makes it a paused
// process: its store calls wait, and its leases are not renewed.
type node struct {
	mem   *MemKV
	name  string
	table *leaseTable
	mu    sync.Mutex
	gate  chan struct{} // nil, or closed when thawed
}

func (n *node) freeze() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gate = make(chan struct{})
}

func (n *node) thaw() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gate != nil {
		close(n.gate)
		n.gate = nil
	}
}

func (n *node) frozen() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gate != nil
}

// wait returns once the node is not frozen, or ctx is done.
func (n *node) wait(ctx context.Context) error {
	n.mu.Lock()
	g := n.gate
	n.mu.Unlock()
	if g == nil {
		return ctx.Err()
	}
	select {
	case <-g:
		return ctx.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// nodeKV is the store as a node reaches it.
type nodeKV struct{ n *node }

func (k nodeKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := k.n.wait(ctx); err != nil {
		return nil, err
	}
	return k.n.mem.Scan(ctx, start, end, limit)
}

func (k nodeKV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := k.n.wait(ctx); err != nil {
		return err
	}
	return k.n.mem.Delete(ctx, keys...)
}

func (k nodeKV) Put(ctx context.Context, key, value []byte) error {
	if err := k.n.wait(ctx); err != nil {
		return err
	}
	return k.n.mem.Put(ctx, key, value)
}

func (k nodeKV) Move(ctx context.Context, from, to [][]byte) error {
	if err := k.n.wait(ctx); err != nil {
		return err
	}
	return k.n.mem.Move(ctx, from, to)
}

// atomicNodeKV is a nodeKV whose store clears entities in the transaction
// that deletes their markers: clear is that transaction's work, under the
// store's lock.
type atomicNodeKV struct {
	nodeKV
	clear func(ids []string)
}

func (k atomicNodeKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if err := k.n.wait(ctx); err != nil {
		return err
	}
	k.n.table.mu.Lock() // the store's one lock, as fencedNode takes it
	defer k.n.table.mu.Unlock()
	return k.commit(ctx, ids, keys)
}

func (k atomicNodeKV) commit(ctx context.Context, ids []string, keys [][]byte) error {
	for _, key := range keys {
		if _, ok, _ := k.n.mem.Get(ctx, key); !ok {
			return fmt.Errorf("%w: %q", ErrMarkerGone, key)
		}
	}
	k.clear(ids)
	return k.n.mem.Delete(ctx, keys...)
}

// nodeLocker makes a node's leases of one name.
type nodeLocker struct {
	n    *node
	name string
}

type tableLease struct {
	t       *leaseTable
	n       *node
	name    string
	owner   string
	expires time.Time // guarded by t.mu
	lost    chan struct{}
	lose    sync.Once
	done    chan struct{}
	release sync.Once
}

func (l *nodeLocker) TryAcquire(ctx context.Context) (Lease, error) {
	if err := l.n.wait(ctx); err != nil {
		return nil, err
	}
	t := l.n.table
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.rows[l.name]; r != nil && time.Now().Before(r.expires) {
		return nil, fmt.Errorf("%s holds %s: %w", r.owner, l.name, ErrLeaseHeld)
	}
	lease := &tableLease{t: t, n: l.n, name: l.name, owner: l.n.name, expires: time.Now().Add(t.ttl),
		lost: make(chan struct{}), done: make(chan struct{})}
	t.rows[l.name] = lease
	t.acquired++
	go lease.keep()
	return lease, nil
}

// keep renews the lease every third of the TTL, but not while its node is
// frozen, and gives it up a tenth of the TTL before it could expire,
// counted from the last renewal sent, as the adapters' lockers do.
func (l *tableLease) keep() {
	ttl := l.t.ttl
	renew := time.NewTicker(ttl / 3)
	defer renew.Stop()
	deadline := time.NewTimer(ttl * 9 / 10)
	defer deadline.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-deadline.C:
			l.gone()
			return
		case <-renew.C:
			if l.n.frozen() {
				continue
			}
			sent := time.Now()
			l.t.mu.Lock()
			ok := l.t.rows[l.name] == l && sent.Before(l.expires)
			if ok {
				l.expires = sent.Add(ttl)
			}
			l.t.mu.Unlock()
			if !ok {
				l.gone()
				return
			}
			deadline.Reset(ttl * 9 / 10)
		}
	}
}

func (l *tableLease) gone() { l.lose.Do(func() { close(l.lost) }) }

func (l *tableLease) Lost() <-chan struct{} { return l.lost }

func (l *tableLease) Release(ctx context.Context) error {
	l.release.Do(func() { close(l.done) })
	l.gone()
	if err := l.n.wait(ctx); err != nil {
		return err // a frozen replica cannot reach the store: the lease expires
	}
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	if l.t.rows[l.name] == l {
		delete(l.t.rows, l.name)
	}
	return nil
}

// held reports, under the table's lock, whether the lease is still held.
func (l *tableLease) held() bool {
	return l.t.rows[l.name] == l && time.Now().Before(l.expires)
}

func (l *tableLease) Fence(kv KV) (KV, bool) {
	switch k := kv.(type) {
	case atomicNodeKV:
		if k.n == l.n {
			return fencedAtomicNode{fencedNode{k.nodeKV, l}, k}, true
		}
	case nodeKV:
		if k.n == l.n {
			return fencedNode{k, l}, true
		}
	}
	return nil, false
}

// fencedNode writes only while its lease is held, checked under the lease
// table's lock in the same step as the write.
type fencedNode struct {
	nodeKV
	l *tableLease
}

func (f fencedNode) fenced(ctx context.Context, write func() error) error {
	if err := f.n.wait(ctx); err != nil {
		return err
	}
	f.l.t.mu.Lock()
	defer f.l.t.mu.Unlock()
	if !f.l.held() {
		f.l.gone()
		return fmt.Errorf("fence of %s: %w", f.l.name, ErrLeaseLost)
	}
	return write()
}

func (f fencedNode) Delete(ctx context.Context, keys ...[]byte) error {
	return f.fenced(ctx, func() error { return f.n.mem.Delete(ctx, keys...) })
}

func (f fencedNode) Put(ctx context.Context, key, value []byte) error {
	return f.fenced(ctx, func() error { return f.n.mem.Put(ctx, key, value) })
}

func (f fencedNode) Move(ctx context.Context, from, to [][]byte) error {
	return f.fenced(ctx, func() error { return f.n.mem.Move(ctx, from, to) })
}

type fencedAtomicNode struct {
	fencedNode
	a atomicNodeKV
}

func (f fencedAtomicNode) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return f.fenced(ctx, func() error { return f.a.commit(ctx, ids, keys) })
}

// fleetLog records what the replicas of a fleet test cleared, and when.
type fleetLog struct {
	mu        sync.Mutex
	shards    int
	retention time.Duration
	start     time.Time
	finished  map[string]time.Time
	cleared   map[string][]string // id: the replicas that cleared it
	inflight  []int               // by shard: clears under way
	overlaps  int                 // clears of a shard while another replica's was under way
	early     []string
	perSecond map[int]int // clears by second of the test
}

func newFleetLog(shards int, retention time.Duration) *fleetLog {
	return &fleetLog{shards: shards, retention: retention, start: time.Now(), finished: map[string]time.Time{},
		cleared: map[string][]string{}, inflight: make([]int, shards), perSecond: map[int]int{}}
}

func (g *fleetLog) finish(id string, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.finished[id] = at
}

func (g *fleetLog) record(replica string, ids []string) {
	now := time.Now()
	for _, id := range ids {
		g.cleared[id] = append(g.cleared[id], replica)
		if at, ok := g.finished[id]; ok && !now.After(at.Add(g.retention)) {
			g.early = append(g.early, id)
		}
		g.perSecond[int(now.Sub(g.start)/time.Second)]++
	}
}

// clear is the Config.Clear of a replica: it takes a while, and notes a
// clear of a shard while another is under way.
func (g *fleetLog) clear(replica string, takes time.Duration) func(context.Context, string) error {
	return func(_ context.Context, id string) error {
		shard := ShardOf(id, g.shards)
		g.mu.Lock()
		g.inflight[shard]++
		if g.inflight[shard] > 1 {
			g.overlaps++
		}
		g.mu.Unlock()
		if takes > 0 {
			time.Sleep(takes)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		g.inflight[shard]--
		g.record(replica, []string{id})
		return nil
	}
}

// atomicClear is the work of an atomic store's transaction for a replica.
func (g *fleetLog) atomicClear(replica string) func([]string) {
	return func(ids []string) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.record(replica, ids)
	}
}

// shardFleet runs the replicas of a test.
type shardFleet struct {
	t        testing.TB
	mem      *MemKV
	table    *leaseTable
	log      *fleetLog
	atomic   bool
	clearFor time.Duration
	cfg      Config
	sc       ShardConfig
	budget   func() *rate.Limiter // each replica's Config.Limiter, nil for none
	nodes    map[string]*node
	stops    map[string]func() error
	shardeds map[string]*Sharded // by process, if not nil
}

func (f *shardFleet) start(name string) { f.startAs(name, name, f.sc) }

// startAs starts the process name as the replica named replica, with sc.
func (f *shardFleet) startAs(name, replica string, sc ShardConfig) {
	n := &node{mem: f.mem, name: name, table: f.table}
	f.nodes[name] = n
	cfg := f.cfg
	cfg.Replica = replica
	if os.Getenv("SHARD_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", name)
	}
	var kv KV = nodeKV{n}
	if f.atomic {
		kv = atomicNodeKV{nodeKV{n}, f.log.atomicClear(name)}
	} else {
		cfg.Clear = f.log.clear(name, f.clearFor)
	}
	if f.budget != nil {
		cfg.Limiter = f.budget()
	}
	sc.Lease = func(_ int, prefix string) (Locker, error) { return &nodeLocker{n: n, name: prefix}, nil }
	s, err := NewSharded(kv, cfg, sc)
	require.NoError(f.t, err)
	if f.shardeds != nil {
		f.shardeds[name] = s
	}
	ctx, cancel := context.WithCancel(f.t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	f.stops[name] = func() error {
		cancel()
		return <-done
	}
}

func (f *shardFleet) stop(name string) {
	require.ErrorIs(f.t, f.stops[name](), context.Canceled, "%s's Run", name)
	delete(f.stops, name)
}

// held returns who holds each shard, and how many each replica holds.
func (f *shardFleet) held() (owners []string, counts map[string]int) {
	names := make([]string, f.sc.Shards)
	for i := range names {
		names[i] = ShardPrefix(f.cfg.Prefix, i)
	}
	owners = f.table.owners(names)
	counts = map[string]int{}
	for _, o := range owners {
		if o != "" {
			counts[o]++
		}
	}
	return owners, counts
}

// balanced reports whether every shard is held, by the replicas named
// alone, each within one of the even share.
func (f *shardFleet) balanced(names ...string) bool {
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

// waitBalanced polls every 100ms until balanced (names), at most limit,
// and returns how long it took.
func (f *shardFleet) waitBalanced(limit time.Duration, names ...string) time.Duration {
	start := time.Now()
	for !f.balanced(names...) && time.Since(start) < limit {
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// takenFrom polls every 50ms until none of shards is held by from, at
// most limit after since, and returns how long after since each was held
// by another replica, -1 for one that was not.
func (f *shardFleet) takenFrom(from string, shards []int, since time.Time, limit time.Duration) []time.Duration {
	took := make([]time.Duration, len(shards))
	done := make([]bool, len(shards))
	for left := len(shards); left > 0 && time.Since(since) <= limit; time.Sleep(50 * time.Millisecond) {
		owners, _ := f.held()
		for k, i := range shards {
			if !done[k] && owners[i] != "" && owners[i] != from {
				took[k], done[k] = time.Since(since), true
				left--
			}
		}
	}
	for k := range took {
		if !done[k] {
			took[k] = -1
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

// TestShardedFleetBalancesAndTakesOver runs 16 shards on 4 replicas while
// entities finish: the shards spread 4 a replica; one replica stops and
// another freezes (its store calls hang, its leases are not renewed), and
// the other two take their shards, each within TTL + Interval; both come
// back and get their share. No shard is swept by two replicas at once,
// nothing is cleared early, every entity is cleared (exactly once on the
// atomic path).
func TestShardedFleetBalancesAndTakesOver(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		name := "Clear"
		if atomic {
			name = "atomic"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { fleetScenario(t, atomic) })
		})
	}
}

func fleetScenario(t *testing.T, atomic bool) {
	const (
		shards    = 16
		ttl       = 3 * time.Second
		heartbeat = 500 * time.Millisecond
		interval  = 5 * time.Second
		retention = time.Second
	)
	mem := NewMemKV()
	f := &shardFleet{
		t: t, mem: mem, table: newLeaseTable(ttl), log: newFleetLog(shards, retention), atomic: atomic, clearFor: 5 * time.Millisecond,
		cfg:   Config{Prefix: "jobs/", Retention: retention, Interval: interval, StoreTimeout: time.Second},
		sc:    ShardConfig{Shards: shards, Heartbeat: heartbeat},
		nodes: map[string]*node{}, stops: map[string]func() error{},
	}
	writer, err := NewSharded(mem, Config{Prefix: "jobs/", Retention: retention, Clear: func(context.Context, string) error { return nil }},
		ShardConfig{Shards: shards})
	require.NoError(t, err)
	wctx, stopWriting := context.WithCancel(t.Context())
	written := 0
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for wctx.Err() == nil {
			for range 2 {
				id := "job-" + strconv.Itoa(written)
				now := time.Now()
				key, err := writer.MarkerKey(now, id)
				if !assert.NoError(t, err) {
					return
				}
				f.log.finish(id, now)
				assert.NoError(t, mem.Put(t.Context(), key, nil))
				written++
			}
			_ = sleep(wctx, 50*time.Millisecond)
		}
	}()

	all := []string{"r0", "r1", "r2", "r3"}
	for _, name := range all {
		f.start(name)
	}
	took := f.waitBalanced(4*ttl, all...)
	time.Sleep(4*ttl - took)
	owners, counts := f.held()
	assert.True(t, f.balanced(all...), "after 4 TTLs: held %v (%v)", counts, owners)
	t.Logf("4 replicas, 16 shards: 4 each within one after %v; after 4 TTLs %v", took, counts)

	// r0 stops: its Run returns, its leases are released. The others take
	// them up to lo at their next Heartbeat, the rest at the one after.
	gone := heldBy(owners, "r0")
	stopped := time.Now()
	f.stop("r0")
	times := f.takenFrom("r0", gone, stopped, ttl+interval)
	t.Logf("r0 stopped: its shards %v taken after %v", gone, times)
	for k, d := range times {
		assert.True(t, d >= 0 && d <= 2*heartbeat+100*time.Millisecond, "r0's shard %d taken after %v, want within two Heartbeats", gone[k], d)
	}
	took = f.waitBalanced(4*ttl, "r1", "r2", "r3")
	_, counts = f.held()
	t.Logf("3 replicas: within one of even after %v: %v", took, counts)
	assert.True(t, f.balanced("r1", "r2", "r3"), "3 replicas: %v", counts)

	// r1 freezes: its store calls hang and its leases are not renewed.
	owners, _ = f.held()
	frozen := heldBy(owners, "r1")
	f.nodes["r1"].freeze()
	times = f.takenFrom("r1", frozen, time.Now(), ttl+interval)
	t.Logf("r1 frozen: its shards %v taken after %v (TTL %v, Heartbeat %v, Interval %v)", frozen, times, ttl, heartbeat, interval)
	for k, d := range times {
		assert.True(t, d >= 0 && d <= ttl+interval, "r1's shard %d taken after %v, want within TTL + Interval", frozen[k], d)
	}
	took = f.waitBalanced(4*ttl, "r2", "r3")
	_, counts = f.held()
	t.Logf("2 replicas: within one of even after %v: %v", took, counts)
	assert.True(t, f.balanced("r2", "r3"), "2 replicas: %v", counts)

	// r1 resumes and r0 starts again: each gets its share.
	f.nodes["r1"].thaw()
	f.start("r0")
	took = f.waitBalanced(6*ttl, all...)
	owners, counts = f.held()
	t.Logf("r1 resumed and r0 restarted: 4 replicas within one of even after %v: %v", took, counts)
	assert.True(t, f.balanced(all...), "after r1 and r0 came back: %v (%v)", counts, owners)

	stopWriting()
	<-writing
	time.Sleep(retention + interval)
	for _, name := range all {
		f.stop(name)
	}

	g := f.log
	g.mu.Lock()
	defer g.mu.Unlock()
	assert.Zero(t, g.overlaps, "clears of a shard by two replicas at once")
	assert.Empty(t, g.early, "ids cleared before Retention")
	twice := 0
	for i := range written {
		id := "job-" + strconv.Itoa(i)
		by := g.cleared[id]
		require.NotEmpty(t, by, "%s was never cleared (of %d written)", id, written)
		if len(by) > 1 {
			twice++
			assert.False(t, atomic, "%s cleared by %v on the atomic path", id, by)
		}
	}
	t.Logf("%d entities, %d cleared more than once", written, twice)
	for i := range shards {
		prefix := ShardPrefix("jobs/", i)
		for _, key := range keysUnder(t, mem, prefix) {
			_, _, err := ParseMarkerKey(prefix, []byte(key))
			assert.Error(t, err, "marker %q left", key)
		}
	}
	lower, upper := memberRange("jobs/")
	keys, err := mem.Scan(t.Context(), lower, upper, 10)
	require.NoError(t, err)
	assert.Empty(t, keys, "replicas' keys left after every Run returned")
}

// TestShardedFleetBudget gives a fleet of 1 and of 4 replicas one budget
// of 200 clears a second over 16 shards with a deep backlog: the fleet
// clears within 5% of it, whichever replicas hold the shards.
func TestShardedFleetBudget(t *testing.T) {
	for _, replicas := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d replicas", replicas), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const (
					shards = 16
					limit  = 200
					from   = 10 // seconds: measured from here, after the shards are shared out
					until  = 60
				)
				mem := NewMemKV()
				f := &shardFleet{
					t: t, mem: mem, table: newLeaseTable(3 * time.Second), log: newFleetLog(shards, time.Hour),
					cfg:    Config{Prefix: "jobs/", Retention: time.Hour, StoreTimeout: time.Second},
					sc:     ShardConfig{Shards: shards, Heartbeat: 500 * time.Millisecond},
					budget: func() *rate.Limiter { return rate.NewLimiter(limit, 4) },
					nodes:  map[string]*node{}, stops: map[string]func() error{},
				}
				for i := range 16000 {
					require.NoError(t, Mark(t.Context(), mem, ShardPrefix("jobs/", ShardOf("job-"+strconv.Itoa(i), shards)),
						"job-"+strconv.Itoa(i), time.Now().Add(-2*time.Hour)))
				}
				var names []string
				for i := range replicas {
					names = append(names, "r"+strconv.Itoa(i))
					f.start(names[i])
				}
				// Under a deep backlog a shard changes hands after the page
				// under way: 256 markers at 200/16 a second a shard.
				took := f.waitBalanced((until-1)*time.Second, names...)
				time.Sleep(until*time.Second - took)
				assert.True(t, f.balanced(names...), "the shards are shared out")
				_, counts := f.held()
				for _, name := range names {
					f.stop(name)
				}
				g := f.log
				g.mu.Lock()
				defer g.mu.Unlock()
				total, lo, hi := 0, math.MaxInt, 0
				for s := from; s < until; s++ {
					total += g.perSecond[s]
					lo, hi = min(lo, g.perSecond[s]), max(hi, g.perSecond[s])
				}
				got := float64(total) / (until - from)
				t.Logf("%d replicas holding %v (within one of even after %v): %.1f clears/s from %ds to %ds (budget %d/s, error %+.2f%%), per second %d to %d",
					replicas, counts, took, got, from, until, limit, 100*(got/limit-1), lo, hi)
				assert.InEpsilon(t, limit, got, 0.05, "the fleet's rate")
			})
		})
	}
}

// TestShardedRunUnfenced: a shard's lease that cannot fence the store ends
// Run with ErrUnfenced, as Sweep.Run does, leases released.
func TestShardedRunUnfenced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		s, err := NewSharded(mem, Config{Prefix: "runs/", Retention: time.Hour, Replica: "a", Clear: newClears().clear},
			ShardConfig{Shards: 4, Lease: func(int, string) (Locker, error) { return fenceLocker{}, nil }})
		require.NoError(t, err)
		key := mark(t, mem, ShardPrefix("runs/", 1), "r1", time.Now().Add(-2*time.Hour))
		err = s.Run(t.Context())
		require.ErrorIs(t, err, ErrUnfenced, "Run() = %v", err)
		assert.True(t, has(t, mem, key), "nothing swept unfenced")
		assert.Empty(t, keysUnder(t, mem, "runs/#m"), "the replica's key is deleted")
	})
}

// TestShardedRunPanics: a panic of OnPass on a shard's goroutine reaches
// the caller of Run, as it does from Sweep.Run, once every lease is
// released and every goroutine has ended.
func TestShardedRunPanics(t *testing.T) {
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("lease %v", leased), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := NewMemKV()
				table := newLeaseTable(3 * time.Second)
				n := &node{mem: mem, name: "a", table: table}
				cfg := Config{Prefix: "runs/", Retention: time.Hour, Clear: newClears().clear, OnPass: func(st Stats, _ error) {
					if st.Cleared > 0 {
						panic("boom")
					}
				}}
				sc := ShardConfig{Shards: 4}
				var kv KV = mem
				if leased {
					cfg.Replica, kv = "a", nodeKV{n}
					sc.Lease = func(_ int, p string) (Locker, error) { return &nodeLocker{n: n, name: p}, nil }
				}
				s, err := NewSharded(kv, cfg, sc)
				require.NoError(t, err)
				mark(t, mem, ShardPrefix("runs/", 2), "r1", time.Now().Add(-2*time.Hour))
				got := func() (v any) {
					defer func() { v = recover() }()
					_ = s.Run(t.Context())
					return nil
				}()
				assert.Equal(t, "boom", got, "Run's panic")
				owners := table.owners([]string{ShardPrefix("runs/", 0), ShardPrefix("runs/", 1), ShardPrefix("runs/", 2), ShardPrefix("runs/", 3)})
				assert.Equal(t, []string{"", "", "", ""}, owners, "leases left held")
			})
		})
	}
}

// TestShardedForgetsGoneReplicas: the key of a replica that died (it no
// longer changes) stops counting after three of its Heartbeats, and is
// deleted after thirty; a replica's own key goes when its Run returns.
func TestShardedForgetsGoneReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		n := &node{mem: mem, name: "a", table: newLeaseTable(3 * time.Second)}
		dead := appendMemberKey(nil, "runs/", &member{name: "dead", heartbeat: time.Second, beat: 9, held: []byte{0, 0}})
		require.NoError(t, mem.Put(t.Context(), dead, nil))
		s, err := NewSharded(nodeKV{n}, Config{Prefix: "runs/", Retention: time.Hour, Replica: "a", Clear: newClears().clear},
			ShardConfig{Shards: 16, Heartbeat: time.Second, Lease: func(_ int, p string) (Locker, error) { return &nodeLocker{n: n, name: p}, nil }})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		held := func() int {
			names := make([]string, 16)
			for i := range names {
				names[i] = ShardPrefix("runs/", i)
			}
			k := 0
			for _, o := range n.table.owners(names) {
				if o == "a" {
					k++
				}
			}
			return k
		}
		time.Sleep(1500 * time.Millisecond) // a replica takes shards from its second round on
		assert.Equal(t, 8, held(), "the dead replica counts while its key is fresh: half the shards")
		time.Sleep(2 * time.Second)
		assert.Equal(t, 16, held(), "after three of its Heartbeats it is gone: every shard")
		assert.True(t, has(t, mem, dead), "its key stays until it is stale")
		time.Sleep(28 * time.Second)
		assert.False(t, has(t, mem, dead), "deleted after thirty of its Heartbeats")
		assert.Len(t, keysUnder(t, mem, "runs/#m"), 1, "this replica's own key")
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.Empty(t, keysUnder(t, mem, "runs/#m"), "deleted when Run returned")
	})
}

// lostMemberWrites writes the replicas' keys, then fails the first lose
// writes as if their replies were lost.
type lostMemberWrites struct {
	nodeKV
	lose atomic.Int32
}

func (k *lostMemberWrites) lost() error {
	if k.lose.Add(-1) >= 0 {
		return fmt.Errorf("write reply lost: %w", errInjected)
	}
	return nil
}

func (k *lostMemberWrites) Put(ctx context.Context, key, value []byte) error {
	if err := k.nodeKV.Put(ctx, key, value); err != nil {
		return err
	}
	return k.lost()
}

func (k *lostMemberWrites) Move(ctx context.Context, from, to [][]byte) error {
	if err := k.nodeKV.Move(ctx, from, to); err != nil {
		return err
	}
	return k.lost()
}

// TestShardedDeletesItsOwnKeysLeft: a replica's key written by a call whose
// reply was lost is deleted at the next read, and at Run's end if Run ends
// first; the key of an earlier Run under the replica's name is deleted at
// the first read, not counted as a replica until it is stale.
func TestShardedDeletesItsOwnKeysLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		n := &node{mem: mem, name: "a", table: newLeaseTable(3 * time.Second)}
		earlier := appendMemberKey(nil, "runs/", &member{name: "a", heartbeat: time.Second, run: 7, beat: 9, held: []byte{0xff, 0xff}})
		require.NoError(t, mem.Put(t.Context(), earlier, nil))
		kv := &lostMemberWrites{nodeKV: nodeKV{n}}
		kv.lose.Store(2) // the first round's write and the next
		s, err := NewSharded(kv, Config{Prefix: "runs/", Retention: time.Hour, Replica: "a", Clear: newClears().clear, AllowUnfenced: true},
			ShardConfig{Shards: 16, Heartbeat: time.Second, Lease: func(_ int, p string) (Locker, error) { return &nodeLocker{n: n, name: p}, nil }})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		assert.False(t, has(t, mem, earlier), "the earlier Run's key, at the first read")
		assert.Empty(t, keysUnder(t, mem, "runs/#m"), "the first write's, its reply lost, deleted by the read after it")
		time.Sleep(500 * time.Millisecond) // between rounds
		for range 6 {
			time.Sleep(time.Second)
			assert.Len(t, keysUnder(t, mem, "runs/#m"), 1, "the answered write's key alone")
		}

		kv.lose.Store(1 << 20) // every write's reply lost from now on
		time.Sleep(1500 * time.Millisecond)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.Empty(t, keysUnder(t, mem, "runs/#m"), "deleted when Run returned, the unanswered ones too")
	})
}

// TestShardedBudgetFollowsTheLimiter: a replica's part of the budget is the
// fleet's limit times the shards it holds over all shards, and follows a
// change of Config.Limiter within a Heartbeat; outside a Run with leases
// it is the whole budget.
func TestShardedBudgetFollowsTheLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		table := newLeaseTable(3 * time.Second)
		fleet := rate.NewLimiter(160, 8)
		var shardeds []*Sharded
		var stops []func() error
		for _, name := range []string{"a", "b"} {
			n := &node{mem: mem, name: name, table: table}
			s, err := NewSharded(nodeKV{n}, Config{Prefix: "runs/", Retention: time.Hour, Replica: name, Clear: newClears().clear, Limiter: fleet},
				ShardConfig{Shards: 16, Heartbeat: time.Second, Lease: func(_ int, p string) (Locker, error) { return &nodeLocker{n: n, name: p}, nil }})
			require.NoError(t, err)
			assert.Equal(t, rate.Limit(160), s.budget.Limit(), "before Run: the whole budget")
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			shardeds = append(shardeds, s)
			stops = append(stops, func() error { cancel(); return <-done })
			time.Sleep(100 * time.Millisecond) // b joins after a has taken every shard
		}
		time.Sleep(5 * time.Second)
		for _, s := range shardeds {
			assert.Equal(t, rate.Limit(80), s.budget.Limit(), "8 of 16 shards: half the budget")
			assert.Equal(t, 4, s.budget.Burst(), "and half the burst")
		}
		fleet.SetLimit(320)
		fleet.SetBurst(2)
		time.Sleep(time.Second)
		for _, s := range shardeds {
			assert.Equal(t, rate.Limit(160), s.budget.Limit(), "the fleet's new limit, halved")
			assert.Equal(t, 1, s.budget.Burst(), "the fleet's new burst, halved")
		}
		require.ErrorIs(t, stops[0](), context.Canceled)
		assert.Equal(t, rate.Limit(320), shardeds[0].budget.Limit(), "after Run: the whole budget")
		time.Sleep(2 * time.Second)
		assert.Equal(t, rate.Limit(320), shardeds[1].budget.Limit(), "b holds every shard")
		require.ErrorIs(t, stops[1](), context.Canceled)
	})
}

// failingLocker fails every TryAcquire, as a lease store that is down does.
type failingLocker struct{ tries *atomic.Int64 }

func (l failingLocker) TryAcquire(context.Context) (Lease, error) {
	l.tries.Add(1)
	return nil, errBoom
}

// TestShardedLeaseStoreDownTriesOneShardARound: while every try of a
// lease fails in the store, a replica tries one shard a Heartbeat, not
// every shard.
func TestShardedLeaseStoreDownTriesOneShardARound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tries atomic.Int64
		s, err := NewSharded(NewMemKV(), Config{Prefix: "runs/", Retention: time.Hour, Replica: "a", Clear: newClears().clear},
			ShardConfig{Shards: 16, Heartbeat: time.Second, Lease: func(int, string) (Locker, error) { return failingLocker{&tries}, nil }})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second+time.Millisecond)
		defer cancel()
		require.ErrorIs(t, s.Run(ctx), context.DeadlineExceeded)
		assert.Equal(t, int64(16+9), tries.Load(), "none in the first round, 16 in the second, then one in each of 9")
	})
}

// TestNewShardedLeaseNeedsAPutMover: with a lease, the KV given to
// NewSharded keeps the replicas' keys: a read-only one is refused, even
// when every shard has a KV of its own.
func TestNewShardedLeaseNeedsAPutMover(t *testing.T) {
	t.Parallel()
	_, err := NewSharded(readOnlyKV{NewMemKV()}, Config{Prefix: "runs/", Retention: time.Hour, Replica: "a", Clear: newClears().clear},
		ShardConfig{Shards: 2, Lease: func(int, string) (Locker, error) { return &fakeLocker{}, nil },
			KV: func(int, string) (KV, error) { return NewMemKV(), nil }})
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.ErrorContains(t, err, "not a Putter and a Mover")
}

// TestShardedKVPerShard keeps each shard's markers in a store of its own,
// as the sets of a Redis Cluster's slots, and the replicas' keys in
// another: two replicas share the shards out, each under a lease fenced
// on its shard's store, and clear every marker from the store it lies in.
func TestShardedKVPerShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const shards = 4
		fleetMem := NewMemKV()
		mems := make([]*MemKV, shards)
		for i := range mems {
			mems[i] = NewMemKV()
		}
		table := newLeaseTable(3 * time.Second)
		log := newFleetLog(shards, time.Hour)
		var stops []func() error
		for _, name := range []string{"a", "b"} {
			fleetNode := &node{mem: fleetMem, name: name, table: table}
			nodes := make([]*node, shards)
			for i := range nodes {
				nodes[i] = &node{mem: mems[i], name: name, table: table}
			}
			s, err := NewSharded(nodeKV{fleetNode}, Config{Prefix: "runs/", Retention: time.Hour, Replica: name, Clear: log.clear(name, 0)},
				ShardConfig{Shards: shards, Heartbeat: 500 * time.Millisecond,
					KV:    func(i int, _ string) (KV, error) { return nodeKV{nodes[i]}, nil },
					Lease: func(i int, p string) (Locker, error) { return &nodeLocker{n: nodes[i], name: p}, nil }})
			require.NoError(t, err)
			if name == "a" {
				for i := range 200 {
					id := "run-" + strconv.Itoa(i)
					key, err := s.MarkerKey(time.Now().Add(-2*time.Hour), id)
					require.NoError(t, err)
					require.NoError(t, mems[s.Shard(id)].Put(t.Context(), key, nil))
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			stops = append(stops, func() error { cancel(); return <-done })
		}
		time.Sleep(5 * time.Second)
		names := []string{ShardPrefix("runs/", 0), ShardPrefix("runs/", 1), ShardPrefix("runs/", 2), ShardPrefix("runs/", 3)}
		owners := table.owners(names)
		counts := map[string]int{}
		for _, o := range owners {
			counts[o]++
		}
		assert.Equal(t, map[string]int{"a": 2, "b": 2}, counts, "shard holders %v", owners)
		assert.Len(t, keysUnder(t, fleetMem, "runs/#m"), 2, "the replicas' keys, in the KV given to NewSharded")
		for _, stop := range stops {
			require.ErrorIs(t, stop(), context.Canceled)
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		assert.Len(t, log.cleared, 200)
		assert.Zero(t, log.overlaps)
		for i, mem := range mems {
			for _, key := range keysUnder(t, mem, "runs/") {
				_, _, err := ParseMarkerKey(names[i], []byte(key))
				assert.Error(t, err, "marker %q left in shard %d's store", key, i)
			}
			assert.Empty(t, keysUnder(t, mem, "runs/#m"), "no replica's key in shard %d's store", i)
		}
	})
}

// TestShardedAtomicKVPerShard: shards whose stores are ClearDeleters clear
// in them, with no Clear, whatever the KV given to NewSharded is.
func TestShardedAtomicKVPerShard(t *testing.T) {
	t.Parallel()
	clock := NewManualClock(t0)
	stores := make([]*shardAtomicKV, 2)
	for i := range stores {
		stores[i] = &shardAtomicKV{MemKV: NewMemKV(), n: 2, clock: clock, retention: time.Hour, cleared: map[string]int{}}
	}
	s, err := NewSharded(NewMemKV(), Config{Prefix: "runs/", Retention: time.Hour, Clock: clock},
		ShardConfig{Shards: 2, KV: func(i int, _ string) (KV, error) { return stores[i], nil }})
	require.NoError(t, err)
	for i := range 50 {
		id := "run-" + strconv.Itoa(i)
		key, err := s.MarkerKey(t0.Add(-2*time.Hour), id)
		require.NoError(t, err)
		require.NoError(t, stores[s.Shard(id)].Put(t.Context(), key, nil))
	}
	total, _, err := s.Pass(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 50, total.Cleared)
	for i, a := range stores {
		assert.Empty(t, a.problems, "shard %d", i)
		assert.Zero(t, a.Len(), "shard %d", i)
		assert.NotEmpty(t, a.cleared, "shard %d cleared in its own store", i)
	}
}

// TestShardedJoinUnderBacklog: a replica that joins three busy with a deep
// backlog under a budget gets its share once the pages under way are
// over, PageSize markers at a shard's part of the budget, not the passes.
func TestShardedJoinUnderBacklog(t *testing.T) {
	for _, page := range []int{256, 32} {
		t.Run(fmt.Sprintf("pages of %d", page), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const (
					shards = 16
					limit  = 200
				)
				mem := NewMemKV()
				f := &shardFleet{
					t: t, mem: mem, table: newLeaseTable(3 * time.Second), log: newFleetLog(shards, time.Hour),
					cfg:    Config{Prefix: "jobs/", Retention: time.Hour, StoreTimeout: time.Second, PageSize: page},
					sc:     ShardConfig{Shards: shards, Heartbeat: 500 * time.Millisecond},
					budget: func() *rate.Limiter { return rate.NewLimiter(limit, 4) },
					nodes:  map[string]*node{}, stops: map[string]func() error{},
				}
				for i := range 16000 {
					id := "job-" + strconv.Itoa(i)
					require.NoError(t, Mark(t.Context(), mem, ShardPrefix("jobs/", ShardOf(id, shards)), id, time.Now().Add(-2*time.Hour)))
				}
				all := []string{"r0", "r1", "r2", "r3"}
				for _, name := range all[:3] {
					f.start(name)
				}
				f.waitBalanced(time.Minute, all[:3]...)
				require.True(t, f.balanced(all[:3]...))
				f.start("r3")
				took := f.waitBalanced(2*time.Minute, all...)
				_, counts := f.held()
				pageTime := time.Duration(float64(page) / (float64(limit) / shards) * float64(time.Second))
				t.Logf("pages of %d (%v at a shard's part of the budget): r3 joined, within one of even after %v: %v", page, pageTime, took, counts)
				assert.True(t, f.balanced(all...), "%v", counts)
				assert.LessOrEqual(t, took, pageTime+2*time.Second, "r3 waited longer than a page")
				for _, name := range all {
					f.stop(name)
				}
			})
		})
	}
}

// TestShardedFleetBurstIsShared: replicas spend the fleet's burst between
// them, not each the whole of it: a backlog that falls due at once on an
// idle fleet of 4 is cleared in its first second at most the burst and
// the limit of one budget (each replica with the fleet's burst cleared 408
// under a 100/s budget of burst 100; one replica 109).
func TestShardedFleetBurstIsShared(t *testing.T) {
	for _, replicas := range []int{1, 4} {
		t.Run(strconv.Itoa(replicas), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newIdleFleet(t, 16)
				fleet := rate.NewLimiter(100, 100)
				f.budget = func() *rate.Limiter { return fleet }
				var names []string
				for i := range replicas {
					names = append(names, "r"+strconv.Itoa(i))
					f.start(names[i])
				}
				defer func() {
					for _, n := range names {
						f.stop(n)
					}
				}()
				f.waitBalanced(time.Minute, names...)
				time.Sleep(10 * time.Second)
				due := time.Now().Add(2 * time.Second)
				for i := range 3000 {
					id := "job-" + strconv.Itoa(i)
					require.NoError(t, Mark(t.Context(), f.mem, ShardPrefix("jobs/", ShardOf(id, 16)), id, due.Add(-time.Hour)))
				}
				f.log.mu.Lock()
				f.log.start, f.log.perSecond = due, map[int]int{}
				f.log.mu.Unlock()
				time.Sleep(8 * time.Second)
				f.log.mu.Lock()
				busiest, seconds := 0, maps.Clone(f.log.perSecond)
				f.log.mu.Unlock()
				for _, n := range seconds {
					busiest = max(busiest, n)
				}
				t.Logf("%d replicas: clears by second %v", replicas, seconds)
				assert.LessOrEqual(t, busiest, 200+16, "a second of one budget: its burst and its limit (and a batch per shard in flight)")
				assert.Greater(t, busiest, 50, "the backlog is cleared")
			})
		})
	}
}

// newIdleFleet is a fleet of a test over shards shards with no markers
// written: a 3s lease TTL, a 500ms Heartbeat and a 5s Interval.
func newIdleFleet(t testing.TB, shards int) *shardFleet {
	return &shardFleet{
		t: t, mem: NewMemKV(), table: newLeaseTable(3 * time.Second), log: newFleetLog(shards, time.Hour),
		cfg:   Config{Prefix: "jobs/", Retention: time.Hour, Interval: 5 * time.Second, StoreTimeout: time.Second},
		sc:    ShardConfig{Shards: shards, Heartbeat: 500 * time.Millisecond},
		nodes: map[string]*node{}, stops: map[string]func() error{},
	}
}

// acquired is how many leases were taken so far.
func (f *shardFleet) acquired() int {
	f.table.mu.Lock()
	defer f.table.mu.Unlock()
	return f.table.acquired
}

// evenly reports whether every shard is held, by the replicas named alone,
// each holding the shards over them rounded down or up.
func (f *shardFleet) evenly(names ...string) bool {
	owners, counts := f.held()
	lo, hi := len(owners)/len(names), (len(owners)+len(names)-1)/len(names)
	total := 0
	for _, n := range names {
		if counts[n] < lo || counts[n] > hi {
			return false
		}
		total += counts[n]
	}
	return total == len(owners)
}

// TestShardedSettlesWithoutFlapping starts replicas at random moments over
// shard counts below, at and above their number, then stops one and maybe
// starts another, three times: each time the fleet settles with every
// replica at the shards over them rounded down or up, and then no lease
// changes hands for 20 Heartbeats.
func TestShardedSettlesWithoutFlapping(t *testing.T) {
	for _, c := range []struct{ shards, replicas int }{{1, 2}, {2, 3}, {4, 6}, {7, 4}, {17, 5}, {33, 6}} {
		t.Run(fmt.Sprintf("%d shards %d replicas", c.shards, c.replicas), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(c.replicas), uint64(c.shards)))
				f := newIdleFleet(t, c.shards)
				var names []string
				next := 0
				startOne := func() {
					name := "r" + strconv.Itoa(next)
					next++
					names = append(names, name)
					f.start(name)
				}
				for range c.replicas {
					time.Sleep(time.Duration(rng.IntN(700)) * time.Millisecond)
					startOne()
				}
				for step := range 3 {
					start := time.Now()
					for !f.evenly(names...) && time.Since(start) < time.Minute {
						time.Sleep(100 * time.Millisecond)
					}
					took := time.Since(start)
					_, counts := f.held()
					require.True(t, f.evenly(names...), "step %d: %v after %v", step, counts, took)
					before, owners := f.acquired(), slices.Clone(f.table.owners(shardNames(f)))
					time.Sleep(20 * f.sc.Heartbeat)
					after, counts2 := f.held()
					assert.Equal(t, before, f.acquired(), "step %d: leases taken once settled: %v, then %v", step, counts, counts2)
					assert.Equal(t, owners, after, "step %d", step)
					t.Logf("step %d: %v of %d replicas after %v", step, counts2, len(names), took)
					k := rng.IntN(len(names))
					f.stop(names[k])
					names = slices.Delete(names, k, k+1)
					if len(names) == 0 || rng.IntN(2) == 0 {
						time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
						startOne()
					}
				}
				for _, n := range names {
					f.stop(n)
				}
			})
		})
	}
}

func shardNames(f *shardFleet) []string {
	names := make([]string, f.sc.Shards)
	for i := range names {
		names[i] = ShardPrefix(f.cfg.Prefix, i)
	}
	return names
}

// TestShardedChurnKeepsEveryGuarantee runs three replicas over 7 shards
// while entities finish, under a budget, with pages of 16, and at random
// moments stops one, starts one, freezes one or thaws it, 25 times: no
// shard is cleared by two replicas at once, nothing early, every entity
// is cleared, and on the atomic path once.
func TestShardedChurnKeepsEveryGuarantee(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		for seed := range 2 {
			t.Run(fmt.Sprintf("atomic %v seed %d", atomic, seed), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { churnScenario(t, atomic, uint64(seed)) })
			})
		}
	}
}

func churnScenario(t *testing.T, atomic bool, seed uint64) {
	const shards = 7
	rng := rand.New(rand.NewPCG(seed, 99))
	f := newIdleFleet(t, shards)
	f.atomic, f.clearFor = atomic, 3*time.Millisecond
	f.log = newFleetLog(shards, time.Second)
	f.cfg.Retention, f.cfg.PageSize = time.Second, 16
	if atomic {
		f.cfg.BatchSize = 4
	}
	f.budget = func() *rate.Limiter { return rate.NewLimiter(400, 8) }
	writer, err := NewSharded(f.mem, Config{Prefix: "jobs/", Retention: time.Second, Clear: func(context.Context, string) error { return nil }},
		ShardConfig{Shards: shards})
	require.NoError(t, err)
	wctx, stopWriting := context.WithCancel(t.Context())
	written := 0
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for wctx.Err() == nil {
			for range 5 {
				id := "job-" + strconv.Itoa(written)
				now := time.Now()
				key, err := writer.MarkerKey(now, id)
				if !assert.NoError(t, err) {
					return
				}
				f.log.finish(id, now)
				assert.NoError(t, f.mem.Put(t.Context(), key, nil))
				written++
			}
			_ = sleep(wctx, 20*time.Millisecond)
		}
	}()
	var live []string
	next := 0
	startOne := func() {
		name := "r" + strconv.Itoa(next)
		next++
		f.start(name)
		live = append(live, name)
	}
	for range 3 {
		startOne()
	}
	frozen := ""
	for range 25 {
		time.Sleep(time.Duration(200+rng.IntN(2500)) * time.Millisecond)
		switch op, k := rng.IntN(4), rng.IntN(len(live)); {
		case op == 0 && len(live) > 1 && live[k] != frozen:
			f.stop(live[k])
			live = slices.Delete(live, k, k+1)
		case op == 1:
			startOne()
		case op == 2 && frozen == "" && len(live) > 1:
			frozen = live[k]
			f.nodes[frozen].freeze()
		case op == 3 && frozen != "":
			f.nodes[frozen].thaw()
			frozen = ""
		}
	}
	if frozen != "" {
		f.nodes[frozen].thaw()
	}
	stopWriting()
	<-writing
	time.Sleep(20 * time.Second)
	for _, n := range live {
		f.stop(n)
	}
	g := f.log
	g.mu.Lock()
	defer g.mu.Unlock()
	assert.Zero(t, g.overlaps, "clears of a shard by two replicas at once")
	assert.Empty(t, g.early, "ids cleared before Retention")
	lost, twice := 0, 0
	for i := range written {
		switch by := g.cleared["job-"+strconv.Itoa(i)]; {
		case len(by) == 0:
			lost++
		case len(by) > 1:
			twice++
		}
	}
	assert.Zero(t, lost, "entities never cleared, of %d", written)
	if atomic {
		assert.Zero(t, twice, "entities cleared twice on the atomic path, of %d", written)
	}
	t.Logf("%d entities, %d cleared more than once", written, twice)
}

// TestShardedIgnoresKeysThatDoNotParse: keys in the replicas' range that
// are no replica's key are neither counted nor deleted.
func TestShardedIgnoresKeysThatDoNotParse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newIdleFleet(t, 8)
		garbage := []string{"jobs/#m", "jobs/#m!!!", "jobs/#mAQ", "jobs/#m" + strings.Repeat("A", 300)}
		for _, k := range garbage {
			require.NoError(t, f.mem.Put(t.Context(), []byte(k), nil))
		}
		f.start("a")
		f.start("b")
		time.Sleep(10 * time.Second)
		_, counts := f.held()
		assert.True(t, f.evenly("a", "b"), "held %v", counts)
		f.stop("a")
		f.stop("b")
		assert.ElementsMatch(t, garbage, keysUnder(t, f.mem, "jobs/#m"))
	})
}

// TestShardedFrozenPastStaleRejoins: a replica frozen for longer than
// thirty Heartbeats finds its key deleted when it thaws; it writes it
// anew and gets its share back.
func TestShardedFrozenPastStaleRejoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newIdleFleet(t, 8)
		f.start("a")
		f.start("b")
		f.waitBalanced(10*time.Second, "a", "b")
		require.True(t, f.evenly("a", "b"))
		f.nodes["b"].freeze()
		time.Sleep(40 * time.Second)
		assert.Len(t, keysUnder(t, f.mem, "jobs/#m"), 1, "b's key deleted as stale")
		_, counts := f.held()
		assert.Equal(t, map[string]int{"a": 8}, counts)
		f.nodes["b"].thaw()
		took := f.waitBalanced(20*time.Second, "a", "b")
		_, counts = f.held()
		assert.True(t, f.evenly("a", "b"), "after b thawed: %v", counts)
		t.Logf("b thawed: within one of even after %v", took)
		assert.Len(t, keysUnder(t, f.mem, "jobs/#m"), 2)
		f.stop("a")
		f.stop("b")
	})
}

// TestShardedLogsTwoReplicasOfOneName: two Runs under one Config.Replica
// are seen as one replica by the others, so that a third can be left with
// no shard: each of the two logs an error within a few Heartbeats. A
// replica restarted under its name, whose earlier Run's key is left in
// the store, logs none.
func TestShardedLogsTwoReplicasOfOneName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newIdleFleet(t, 16)
		logs := map[string]*syncBuffer{}
		startLogged := func(proc, replica string) {
			logs[proc] = &syncBuffer{mu: make(chan struct{}, 1)}
			f.cfg.Logger = slog.New(slog.NewTextHandler(logs[proc], nil))
			f.startAs(proc, replica, f.sc)
		}
		const twin = "another replica runs under this Config.Replica"
		// An earlier Run of c that died: its key stays, unchanged.
		dead := appendMemberKey(nil, "jobs/", &member{name: "c", heartbeat: 500 * time.Millisecond, run: 7, beat: 3, held: []byte{0, 0}})
		require.NoError(t, f.mem.Put(t.Context(), dead, nil))
		startLogged("c", "c")
		startLogged("b", "b")
		time.Sleep(5 * time.Second)
		f.stop("b")
		startLogged("b", "b") // restarted cleanly
		time.Sleep(5 * time.Second)
		for _, proc := range []string{"b", "c"} {
			assert.NotContains(t, logs[proc].String(), twin, "%s", proc)
		}

		startLogged("a1", "a")
		time.Sleep(300 * time.Millisecond)
		startLogged("a2", "a")
		time.Sleep(3 * time.Second)
		for _, proc := range []string{"a1", "a2"} {
			assert.Equal(t, 1, strings.Count(logs[proc].String(), twin), "%s's log:\n%s", proc, logs[proc])
		}
		for _, proc := range []string{"b", "c"} {
			assert.NotContains(t, logs[proc].String(), twin, "%s", proc)
		}
		for _, proc := range []string{"a1", "a2", "b", "c"} {
			f.stop(proc)
		}
	})
}
