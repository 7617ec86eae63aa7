package retention

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		{"a sweep's lease", Config{Lease: &fakeLocker{}}, ShardConfig{Shards: 4}, "does not run under one lease", ErrInvalidConfig},
		{"prefix ending in an id byte", Config{Prefix: "runs"}, ShardConfig{Shards: 4}, "Config.Prefix \"runs\" ends in", ErrInvalidConfig},
		{"no retention", Config{Retention: -1}, ShardConfig{Shards: 4}, "Config.Retention", ErrInvalidConfig},
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
