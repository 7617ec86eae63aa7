package rediskv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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

// runSet is a marker set holding expired entities, each with two state
// keys named by the templates of an AtomicKV made by WithStateKeys.
type runSet struct {
	rdb      redis.UniversalClient
	set, tag string
	kv       *rediskv.KV
	akv      *rediskv.AtomicKV
	at       time.Time // when the entities finished: two hours before now
	now      time.Time
	keys     []string // every state key written, for the cleanup
}

func newRunSet(t testing.TB) *runSet { return newRunSetOn(t, connect(t)) }

// newRunSetOn is newRunSet on rdb: a server or a cluster.
func newRunSetOn(t testing.TB, rdb redis.UniversalClient) *runSet {
	set := freshKey(t, rdb)
	r := &runSet{rdb: rdb, set: set, tag: strings.TrimSuffix(set, ":markers"), now: time.Now()}
	r.at = r.now.Add(-2 * time.Hour)
	var err error
	r.kv, err = rediskv.New(rdb, set)
	require.NoError(t, err)
	r.akv, err = r.kv.WithStateKeys(r.tag+":state:<id>", r.tag+":log:<id>:lines")
	require.NoError(t, err)
	t.Cleanup(func() {
		for len(r.keys) > 0 {
			n := min(len(r.keys), 1000)
			r.rdb.Unlink(context.Background(), r.keys[:n]...)
			r.keys = r.keys[n:]
		}
	})
	return r
}

func (r *runSet) stateKeys(id string) []string {
	return []string{r.tag + ":state:" + id, r.tag + ":log:" + id + ":lines"}
}

// add writes the state keys of ids and a marker each, finished d after
// r.at, and returns the markers.
func (r *runSet) add(t testing.TB, d time.Duration, ids ...string) [][]byte {
	ctx := context.Background()
	pipe := r.rdb.Pipeline()
	var markers [][]byte
	for _, id := range ids {
		for _, k := range r.stateKeys(id) {
			pipe.Set(ctx, k, "done", 0)
			r.keys = append(r.keys, k)
		}
		key, err := retention.MarkerKey("runs/", r.at.Add(d), id)
		require.NoError(t, err)
		pipe.ZAdd(ctx, r.set, redis.Z{Member: string(key)})
		markers = append(markers, key)
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	return markers
}

// ids returns n ids made of the name and a number.
func ids(name string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%05d", name, i)
	}
	return out
}

// left returns how many of the state keys of ids exist.
func (r *runSet) left(t testing.TB, ids ...string) int {
	var keys []string
	for _, id := range ids {
		keys = append(keys, r.stateKeys(id)...)
	}
	n := 0
	for len(keys) > 0 {
		m := min(len(keys), 1000)
		c, err := r.rdb.Exists(context.Background(), keys[:m]...).Result()
		require.NoError(t, err)
		n += int(c)
		keys = keys[m:]
	}
	return n
}

func (r *runSet) sweep(t testing.TB, kv retention.KV, cfg retention.Config) *retention.Sweep {
	cfg.Prefix, cfg.Retention, cfg.Clock = "runs/", time.Hour, retention.NewManualClock(r.now)
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := retention.New(kv, cfg)
	require.NoError(t, err)
	return s
}

// expiredEnd is the end of the sweep's expired range at r.now.
func (r *runSet) expiredEnd(t testing.TB) []byte {
	key, err := retention.MarkerKey("runs/", r.now.Add(-time.Hour), "x")
	require.NoError(t, err)
	return key[:len(key)-2]
}

// countingKV counts a sweep's calls to an AtomicKV and keeps where each
// Scan started.
type countingKV struct {
	*rediskv.AtomicKV
	mu            sync.Mutex
	scans         [][]byte
	runs, batches int
}

func (c *countingKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	c.mu.Lock()
	c.scans = append(c.scans, bytes.Clone(start))
	c.mu.Unlock()
	return c.AtomicKV.Scan(ctx, start, end, limit)
}

func (c *countingKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	c.mu.Lock()
	c.runs++
	c.mu.Unlock()
	return c.AtomicKV.ClearRun(ctx, prefix, from, end, limit)
}

// RunStore implements retention.RunClearer.
func (c *countingKV) RunStore() retention.RunClearer { return c }

func (c *countingKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	c.mu.Lock()
	c.batches++
	c.mu.Unlock()
	return c.AtomicKV.ClearAndDelete(ctx, ids, keys)
}

// TestRunsClearABacklog: a sweep over an AtomicKV made by WithStateKeys
// clears the expired markers by runs of BatchSize, each one script call:
// no Scan reads the expired range, and the state keys of both templates
// go with their markers; the unexpired stay.
func TestRunsClearABacklog(t *testing.T) {
	tests := []struct {
		name     string
		n, batch int
		wantRuns int
	}{
		{"one run short of its limit", 40, 100, 1},
		{"runs of 300 and a short one", 1000, 300, 4},
		{"a run that finds the range empty after full ones", 600, 300, 3},
		{"runs of 4000", 9000, 4000, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRunSet(t)
			expired := ids("e", tt.n)
			r.add(t, 0, expired...)
			late := r.add(t, 90*time.Minute, "late")
			c := &countingKV{AtomicKV: r.akv}
			st, err := r.sweep(t, c, retention.Config{BatchSize: tt.batch}).Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.n, st.Cleared, "Pass().Cleared")
			assert.Equal(t, tt.wantRuns, c.runs, "ClearRun calls")
			assert.Equal(t, tt.wantRuns, st.ClearCalls, "Pass().ClearCalls: the runs")
			assert.Zero(t, c.batches, "ClearAndDelete calls")
			assert.Zero(t, st.DeleteCalls, "Pass().DeleteCalls")
			end := r.expiredEnd(t)
			for _, start := range c.scans {
				assert.GreaterOrEqual(t, string(start), string(end), "a Scan from %q, in the expired range", start)
			}
			assert.Zero(t, r.left(t, expired...), "state keys of expired entities left")
			assert.Equal(t, 2, r.left(t, "late"), "the unexpired entity's state keys")
			assert.Equal(t, []string{string(late[0])}, members(t, r.rdb, r.set))
		})
	}
}

// TestRunRefusedForAKeyNotAMarker: a run that meets a member that is not
// prefix, 20 digits, '/' and an id ValidateID accepts changes nothing and
// says which member, with an error matching ErrMalformedMarker; the same
// run without it clears.
func TestRunRefusedForAKeyNotAMarker(t *testing.T) {
	stamp := "00000000000000000001"
	tests := []struct {
		name, key, why string
	}{
		{"an id with a byte ValidateID refuses", "runs/" + stamp + "/a.b", "id"},
		{"an id of 129 bytes", "runs/" + stamp + "/" + strings.Repeat("i", 129), "129 bytes"},
		{"an empty id", "runs/" + stamp + "/", ""},
		{"no '/' after the digits", "runs/" + stamp + "xa", ""},
		{"19 digits", "runs/" + stamp[1:] + "/a", ""},
		{"a letter among the digits", "runs/0000000000000000000x/a", ""},
		{"a time after MaxMarkerTime", "runs/00000253402300800000/a", ""},
		{"a retry-range key, no marker", "runs/r00000000000000000001/00000000000000000001/1/a", "is not"},
		{"a key outside the prefix", "other/" + stamp + "/a", ""},
	}
	// Within the prefix's range, every member starts with the prefix, and
	// the script checks the rest only.
	ranges := []struct{ name, from, end string }{{"whole set", "", "\xff"}, {"prefix's range", "runs/", "runs0"}}
	for _, tt := range tests {
		for _, rg := range ranges {
			if !strings.HasPrefix(tt.key, rg.from) {
				continue
			}
			t.Run(tt.name+", "+rg.name, func(t *testing.T) {
				r := newRunSet(t)
				ctx := context.Background()
				good := ids("g", 3)
				r.add(t, 0, good...)
				require.NoError(t, r.rdb.ZAdd(ctx, r.set, redis.Z{Member: tt.key}).Err())
				from, end := []byte(rg.from), []byte(rg.end)

				keys, err := r.akv.ClearRun(ctx, "runs/", from, end, 10)
				require.ErrorIs(t, err, retention.ErrMalformedMarker)
				assert.ErrorContains(t, err, fmt.Sprintf("%q", tt.key), "the error names the member")
				assert.ErrorContains(t, err, tt.why)
				assert.Nil(t, keys)
				assert.Len(t, members(t, r.rdb, r.set), 4, "markers left")
				assert.Equal(t, 6, r.left(t, good...), "state keys left")

				require.NoError(t, r.rdb.ZRem(ctx, r.set, tt.key).Err())
				keys, err = r.akv.ClearRun(ctx, "runs/", from, end, 10)
				require.NoError(t, err)
				assert.Len(t, keys, 3)
				assert.Zero(t, r.left(t, good...), "state keys left")
			})
		}
	}
}

// TestSweepLeavesAForeignKeyARunRefused: a key in the expired range that
// is no marker makes the run refuse; the sweep reads that page itself,
// leaves the key, and clears the rest, after the page by runs again.
func TestSweepLeavesAForeignKeyARunRefused(t *testing.T) {
	r := newRunSet(t)
	ctx := context.Background()
	expired := ids("e", 250)
	r.add(t, 0, expired...)
	foreign := "runs/0000000/not-a-marker" // sorts before every marker
	require.NoError(t, r.rdb.ZAdd(ctx, r.set, redis.Z{Member: foreign}).Err())
	c := &countingKV{AtomicKV: r.akv}
	st, err := r.sweep(t, c, retention.Config{BatchSize: 100, PageSize: 100}).Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 250, st.Cleared, "Pass().Cleared")
	assert.Equal(t, 1, st.Foreign, "Pass().Foreign")
	assert.Zero(t, st.FailedCalls, "Pass().FailedCalls: a refused run is no failure")
	assert.Equal(t, 3, c.runs, "runs: refused, then after the page of 100 keys: 100 and 51")
	assert.Equal(t, 1, c.batches, "the page's batch of 99 markers")
	assert.Zero(t, r.left(t, expired...), "state keys left")
	assert.Equal(t, []string{foreign}, members(t, r.rdb, r.set))
}

// Unwrap lets a lease put its fence on the context of the countingKV's
// writes, which the AtomicKV applies.
func (c *countingKV) Unwrap() retention.KV { return c.AtomicKV }

// TestLeasedSweepClearsByRuns: under a rediskv lease, a sweep over an
// AtomicKV made by WithStateKeys clears by fenced runs, whether the lease
// fences the AtomicKV itself or a wrapper's writes reach it with the fence
// on their context; over one made by WithClear, which cannot clear runs,
// it reads pages and clears them by ClearAndDelete.
func TestLeasedSweepClearsByRuns(t *testing.T) {
	for _, tt := range []struct {
		name     string
		runs     bool // WithStateKeys, else WithClear
		wrapped  bool
		maxScans int
	}{
		{"WithStateKeys, fenced view", true, false, 2},
		{"WithStateKeys, wrapped", true, true, 2},
		{"WithClear, fenced view", false, false, 100},
		{"WithClear, wrapped", false, true, 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRunSet(t)
			expired := ids("e", 500)
			r.add(t, 0, expired...)
			akv := r.akv
			if !tt.runs {
				var err error
				akv, err = r.kv.WithClear(func(ids []string) []string {
					var keys []string
					for _, id := range ids {
						keys = append(keys, r.stateKeys(id)...)
					}
					return keys
				})
				require.NoError(t, err)
			}
			var kv retention.KV = akv
			c := &countingKV{AtomicKV: akv}
			if tt.wrapped {
				kv = c
			}
			locker, err := rediskv.NewLocker(r.rdb, leaseKeyOf(r.set), nil)
			require.NoError(t, err)
			st, err := r.sweep(t, kv, retention.Config{BatchSize: 100, PageSize: 100, Lease: locker}).LeasedPass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 500, st.Cleared, "Pass().Cleared")
			assert.Zero(t, r.left(t, expired...), "state keys left")
			assert.Empty(t, members(t, r.rdb, r.set), "markers left")
			if tt.runs {
				assert.LessOrEqual(t, st.ScanCalls, tt.maxScans, "Pass().ScanCalls")
			} else {
				assert.Greater(t, st.ScanCalls, 5, "Pass().ScanCalls: a page of 100 at a time")
			}
			if tt.wrapped {
				assert.Equal(t, map[bool]int{true: 6, false: 1}[tt.runs], c.runs, "ClearRun calls through the wrapper")
			}
		})
	}
}

// TestFencedRunAfterLeaseLost: the fenced view's run checks the lease
// key's token in its script; once the lease is taken from outside, a run
// changes nothing, reports the loss and closes Lost.
func TestFencedRunAfterLeaseLost(t *testing.T) {
	r := newRunSet(t)
	ctx := context.Background()
	all := ids("f", 20)
	r.add(t, 0, all...)
	lease := acquire(t, r.rdb, r.set)
	view, ok := lease.(retention.Fencer).Fence(r.akv)
	require.True(t, ok)
	rc, ok := view.(retention.RunClearer)
	require.True(t, ok, "the fenced view of an AtomicKV clears runs")
	end := r.expiredEnd(t)

	keys, err := rc.ClearRun(ctx, "runs/", nil, end, 10)
	require.NoError(t, err)
	assert.Len(t, keys, 10)
	assert.Zero(t, r.left(t, all[:10]...))

	require.NoError(t, r.rdb.Set(ctx, leaseKeyOf(r.set), "thief", 0).Err())
	for _, when := range []string{"found by the script", "known in the process"} {
		keys, err = rc.ClearRun(ctx, "runs/", nil, end, 10)
		require.ErrorIs(t, err, retention.ErrLeaseLost, when)
		assert.Nil(t, keys, when)
		assert.Len(t, members(t, r.rdb, r.set), 10, "markers left, %s", when)
		assert.Equal(t, 20, r.left(t, all[10:]...), "state keys left, %s", when)
	}
	select {
	case <-lease.Lost():
	default:
		t.Error("Lost is open after a refused run")
	}
}

// TestTwoSweepsWithoutALeaseClearEachEntityOnce: two sweeps over one set,
// with no lease, one clearing by runs and one by pages of batches, never
// clear an entity twice: a run reads its markers in its script, and a
// batch commits only if all its markers are still there. MONITOR shows
// each UNLINK the scripts run; each names each state key once.
func TestTwoSweepsWithoutALeaseClearEachEntityOnce(t *testing.T) {
	r := newRunSet(t)
	mon := newMonitor(t, kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"), r.tag+":state:")
	expired := ids("e", 3000)
	for i := 0; i < len(expired); i += 500 { // times in the order of the ids
		r.add(t, time.Duration(i)*time.Millisecond, expired[i:i+500]...)
	}
	ctx := context.Background()
	runs := r.sweep(t, r.akv, retention.Config{BatchSize: 50})
	pages := r.sweep(t, r.akv, retention.Config{BatchSize: 50, PageSize: 200, Concurrency: 4})
	var wg sync.WaitGroup
	stats := make([]retention.Stats, 2)
	for i, s := range []*retention.Sweep{runs, pages} {
		wg.Go(func() {
			st, err := s.Pass(ctx)
			assert.NoError(t, err)
			stats[i] = st
		})
	}
	wg.Wait()
	mon.sync(t, r.rdb, "two-sweeps")
	t.Logf("runs cleared %d, pages %d (%d found gone)", stats[0].Cleared, stats[1].Cleared, stats[1].Gone)
	assert.Equal(t, len(expired), stats[0].Cleared+stats[1].Cleared, "Cleared, both sweeps")
	assert.Positive(t, stats[0].Cleared, "the runs' sweep cleared")
	commits := mon.snapshot()
	for _, id := range expired {
		if !assert.Equal(t, 1, commits[id], "UNLINKs of %s's state key", id) {
			break
		}
	}
	assert.Zero(t, r.left(t, expired...), "state keys left")
	assert.Empty(t, members(t, r.rdb, r.set), "markers left")
}

// TestRunClearsADuplicateIDOnce: a run that holds two markers of an id
// unlinks its state keys once and removes both markers; the sweep counts
// the second a duplicate.
func TestRunClearsADuplicateIDOnce(t *testing.T) {
	r := newRunSet(t)
	mon := newMonitor(t, kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"), r.tag+":state:")
	r.add(t, 0, "a", "b", "c")
	r.add(t, time.Second, "b")
	st, err := r.sweep(t, r.akv, retention.Config{}).Pass(context.Background())
	require.NoError(t, err)
	mon.sync(t, r.rdb, "duplicates")
	assert.Equal(t, 3, st.Cleared, "Pass().Cleared")
	assert.Equal(t, 1, st.Duplicates, "Pass().Duplicates")
	assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, mon.snapshot(), "UNLINKs of each state key")
	assert.Zero(t, r.left(t, "a", "b", "c"), "state keys left")
	assert.Empty(t, members(t, r.rdb, r.set), "markers left")
}

// TestRunsNeedStateKeys: an AtomicKV made by WithClear says it cannot
// clear runs, with an error matching errors.ErrUnsupported: without a
// round trip (its client has no server), and through a lease's fenced
// view too.
func TestRunsNeedStateKeys(t *testing.T) {
	ctx := context.Background()
	keysOf := func(ids []string) []string { return ids }
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer dead.Close()
	kv, err := rediskv.New(dead, "{runs}:done")
	require.NoError(t, err)
	akv, err := kv.WithClear(keysOf)
	require.NoError(t, err)
	_, err = akv.ClearRun(ctx, "runs/", nil, []byte("runs0"), 10)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.ErrorContains(t, err, "WithStateKeys")

	rdb := connect(t)
	set := freshKey(t, rdb)
	kv, err = rediskv.New(rdb, set)
	require.NoError(t, err)
	akv, err = kv.WithClear(keysOf)
	require.NoError(t, err)
	view, ok := acquire(t, rdb, set).(retention.Fencer).Fence(akv)
	require.True(t, ok)
	_, err = view.(retention.RunClearer).ClearRun(ctx, "runs/", nil, []byte("runs0"), 10)
	require.ErrorIs(t, err, errors.ErrUnsupported)
}

// TestWithStateKeysRefusesTemplates: WithStateKeys refuses, naming the
// template and what is wrong, templates that could delete what they must
// not, or that a script could not reach on Redis Cluster or a Ring.
func TestWithStateKeysRefusesTemplates(t *testing.T) {
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer single.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	tests := []struct {
		name      string
		rdb       redis.Cmdable
		templates []string
		wantErr   string // "" when accepted
	}{
		{"one template", single, []string{"{runs}:state:<id>"}, ""},
		{"templates the id's end sets apart", single, []string{"{runs}:job:<id>", "{runs}:job:<id>:log", "{runs}:log:<id>"}, ""},
		{"a template without a hash tag on one server", single, []string{"state:<id>"}, ""},
		{"none", single, nil, `rediskv: WithStateKeys: no template: give at least one key with "<id>" in it`},
		{"no <id>", single, []string{"{runs}:state"}, `template "{runs}:state" holds no "<id>"`},
		{"{id}, a hash tag", single, []string{"{runs}:state:{id}"}, `template "{runs}:state:{id}" holds no "<id>"`},
		{"<id> twice", single, []string{"{runs}:<id>:<id>"}, `template "{runs}:<id>:<id>" holds "<id>" 2 times, want it once`},
		{"a template given twice", single, []string{"{runs}:s:<id>", "{runs}:s:<id>"}, `templates "{runs}:s:<id>" and "{runs}:s:<id>" are the same`},
		{"one naming the marker set", single, []string{"{runs}:<id>"}, `template "{runs}:<id>" names the marker set "{runs}:done" itself, for the id "done"`},
		{"an id's end running into the other's", single, []string{"{runs}:job:<id>", "{runs}:job:<id>-log"},
			`templates "{runs}:job:<id>" and "{runs}:job:<id>-log" both name "{runs}:job:a-log", for the ids "a-log" and "a"`},
		{"an id's start running into the other's", single, []string{"{runs}:job<id>", "{runs}:jobs<id>"},
			`templates "{runs}:job<id>" and "{runs}:jobs<id>" both name "{runs}:jobsa", for the ids "sa" and "a"`},
		{"both ends", single, []string{"{runs}:j<id>:x", "{runs}:jo<id>b:x"},
			`templates "{runs}:j<id>:x" and "{runs}:jo<id>b:x" both name "{runs}:joab:x", for the ids "oab" and "a"`},
		{"the set's hash tag on a cluster", cluster, []string{"{runs}:state:<id>", "log:<id>:{runs}"}, ""},
		{"no hash tag on a cluster", cluster, []string{"state:<id>"},
			`template "state:<id>" hashes to a slot that depends on the id: give it the marker set "{runs}:done"'s hash tag, outside "<id>"`},
		{"the id in the hash tag on a cluster", cluster, []string{"{runs:<id>}:state"}, "hashes to a slot that depends on the id"},
		{"another hash tag on a cluster", cluster, []string{"{jobs}:state:<id>"},
			fmt.Sprintf(`template "{jobs}:state:<id>" hashes to slot %d, the marker set "{runs}:done" to slot %d: give them one hash tag`,
				rediskv.Slot("{jobs}"), rediskv.Slot("{runs}"))},
		{"the set's hash tag on a ring", ring, []string{"{runs}:state:<id>"}, ""},
		{"no hash tag on a ring", ring, []string{"state:<id>"}, "hashes to a slot that depends on the id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := rediskv.New(tt.rdb, "{runs}:done")
			require.NoError(t, err)
			akv, err := kv.WithStateKeys(tt.templates...)
			if tt.wantErr == "" {
				require.NoError(t, err, "WithStateKeys(%q)", tt.templates)
				assert.NotNil(t, akv)
				return
			}
			require.ErrorContains(t, err, tt.wantErr, "WithStateKeys(%q)", tt.templates)
			assert.Nil(t, akv)
		})
	}
}

// TestFenceRefusesATemplateNamingTheLeaseKey: a lease does not fence an
// AtomicKV one of whose templates names the lease key for some id, since
// a clear of that id would delete the lease: its writes fail.
func TestFenceRefusesATemplateNamingTheLeaseKey(t *testing.T) {
	r := newRunSet(t)
	akv, err := r.kv.WithStateKeys(r.tag + ":markers:<id>") // the lease key is r.set + ":lease"
	require.NoError(t, err)
	r.add(t, 0, "a")
	view, ok := acquire(t, r.rdb, r.set).(retention.Fencer).Fence(akv)
	require.True(t, ok)
	_, err = view.(retention.RunClearer).ClearRun(context.Background(), "runs/", nil, r.expiredEnd(t), 10)
	require.ErrorContains(t, err, fmt.Sprintf(`state key template %q names the lease key %q, for the id "lease"`, r.tag+":markers:<id>", leaseKeyOf(r.set)))
	err = view.(retention.Mover).Move(context.Background(), nil, nil)
	require.ErrorContains(t, err, "names the lease key")
	assert.Len(t, members(t, r.rdb, r.set), 1, "markers left")
}

// TestRunTakesMarkersAtTheEdges: markers at the edges of what ValidateID
// and MarkerKey allow (the longest id, every byte an id may hold, the
// latest time and the epoch) are cleared by a run.
func TestRunTakesMarkersAtTheEdges(t *testing.T) {
	r := newRunSet(t)
	ctx := context.Background()
	edge := []string{strings.Repeat("L", 128), "azAZ09_-", "latest", "epoch"}
	var want []string
	for _, id := range edge {
		at := r.at
		switch id {
		case "latest":
			at = retention.MaxMarkerTime
		case "epoch":
			at = time.UnixMilli(0)
		}
		key, err := retention.MarkerKey("runs/", at, id)
		require.NoError(t, err)
		require.NoError(t, r.rdb.ZAdd(ctx, r.set, redis.Z{Member: string(key)}).Err())
		for _, k := range r.stateKeys(id) {
			require.NoError(t, r.rdb.Set(ctx, k, "done", 0).Err())
			r.keys = append(r.keys, k)
		}
		want = append(want, string(key))
	}
	keys, err := r.akv.ClearRun(ctx, "runs/", []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	got := make([]string, len(keys))
	for i, k := range keys {
		got[i] = string(k)
	}
	assert.ElementsMatch(t, want, got)
	assert.True(t, slices.IsSorted(got), "ClearRun's keys ascending: %q", got)
	assert.Zero(t, r.left(t, edge...), "state keys left")
	assert.Empty(t, members(t, r.rdb, r.set), "markers left")
}
