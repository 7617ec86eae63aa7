package retention

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeLocker is an in-memory Locker shared by the replicas of a test. The
// test can take the lease away from its holder with expire.
type fakeLocker struct {
	mu       sync.Mutex
	holder   *fakeLease
	acquires int
	fail     error // returned by TryAcquire when set
}

type fakeLease struct {
	l        *fakeLocker
	name     string
	lost     chan struct{}
	once     sync.Once
	released bool
}

func (f *fakeLocker) TryAcquire(ctx context.Context) (Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acquires++
	if f.fail != nil {
		return nil, f.fail
	}
	if f.holder != nil {
		return nil, fmt.Errorf("fake: %w", ErrLeaseHeld)
	}
	f.holder = &fakeLease{l: f, lost: make(chan struct{})}
	return f.holder, nil
}

// expire takes the lease from its holder, as a TTL running out would.
func (f *fakeLocker) expire() {
	f.mu.Lock()
	h := f.holder
	f.holder = nil
	f.mu.Unlock()
	if h != nil {
		h.once.Do(func() { close(h.lost) })
	}
}

// steal gives the lease to an outside holder, as another replica taking
// over an expired lease would.
func (f *fakeLocker) steal() {
	f.mu.Lock()
	h := f.holder
	f.holder = &fakeLease{l: f, name: "outsider", lost: make(chan struct{})}
	f.mu.Unlock()
	if h != nil {
		h.once.Do(func() { close(h.lost) })
	}
}

func (f *fakeLocker) held() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holder != nil
}

func (f *fakeLocker) attempts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acquires
}

func (l *fakeLease) Lost() <-chan struct{} { return l.lost }

func (l *fakeLease) Release(context.Context) error {
	l.l.mu.Lock()
	if l.l.holder == l {
		l.l.holder = nil
	}
	l.released = true
	l.l.mu.Unlock()
	l.once.Do(func() { close(l.lost) })
	return nil
}

// replica is one Run of a sweep over a shared store, as one process of a
// fleet would run it.
type replica struct {
	name   string
	sweep  *Sweep
	cancel context.CancelFunc
	done   chan error
}

// clearLog records which replicas cleared each id.
type clearLog struct {
	mu sync.Mutex
	by map[string][]string
}

func (c *clearLog) add(id, replica string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string][]string{}
	}
	c.by[id] = append(c.by[id], replica)
}

func (c *clearLog) of(id string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.by[id]
}

func startReplicas(t testing.TB, n int, kv KV, cfg Config, clears *clearLog) []*replica {
	t.Helper()
	var rs []*replica
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		c := cfg
		c.Clear = func(_ context.Context, id string) error {
			clears.add(id, name)
			return nil
		}
		s, err := New(kv, c)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		r := &replica{name: name, sweep: s, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- s.Run(ctx) }()
		rs = append(rs, r)
	}
	return rs
}

func stopReplicas(t testing.TB, rs []*replica) {
	t.Helper()
	for _, r := range rs {
		r.cancel()
		require.ErrorIs(t, <-r.done, context.Canceled)
	}
}

func TestRunWithLeaseOneReplicaSweeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		locker := &fakeLocker{}
		var clears clearLog
		for i := range 50 {
			mark(t, kv, "runs/", fmt.Sprintf("a%02d", i), time.Now().Add(-2*time.Hour))
		}
		rs := startReplicas(t, 4, kv, Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Minute, PageSize: 7, Lease: locker}, &clears)
		synctest.Wait()
		holders := map[string]bool{}
		for i := range 50 {
			by := clears.of(fmt.Sprintf("a%02d", i))
			require.Len(t, by, 1, "a%02d cleared by %v", i, by)
			holders[by[0]] = true
		}
		assert.Len(t, holders, 1, "one replica sweeps")
		assert.Zero(t, kv.Len())

		// The holder dies (its lease expires): another replica takes over
		// within one Interval and clears what falls due later.
		locker.expire()
		for i := range 20 {
			mark(t, kv, "runs/", fmt.Sprintf("b%02d", i), time.Now().Add(-2*time.Hour))
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		for i := range 20 {
			assert.Len(t, clears.of(fmt.Sprintf("b%02d", i)), 1)
		}
		assert.Zero(t, kv.Len())
		stopReplicas(t, rs)
		assert.False(t, locker.held(), "the holder releases the lease when it stops")
	})
}

func TestRunWithoutLeaseEveryReplicaSweeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		var clears clearLog
		for i := range 50 {
			mark(t, kv, "runs/", fmt.Sprintf("a%02d", i), time.Now().Add(-2*time.Hour))
		}
		rs := startReplicas(t, 4, kv, Config{Prefix: "runs/", Retention: time.Hour, PageSize: 7}, &clears)
		synctest.Wait()
		stopReplicas(t, rs)
		total := 0
		for i := range 50 {
			by := clears.of(fmt.Sprintf("a%02d", i))
			assert.NotEmpty(t, by, "every marker cleared at least once")
			total += len(by)
		}
		assert.Zero(t, kv.Len())
		t.Logf("without a lease: %d clears for 50 markers", total)
	})
}

func TestLeaseLostMidPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		kv := &fakeKV{canPut: true, MemKV: mem}
		locker := &fakeLocker{}
		for i := range 20 {
			mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), time.Now().Add(-2*time.Hour))
		}
		var deletesAtLoss atomic.Int64
		var log passLog
		s, err := New(kv.store(), Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Minute, PageSize: 4, Lease: locker,
			Clear: func(ctx context.Context, id string) error {
				if id == "m09" {
					locker.steal()
					<-ctx.Done() // the loss reaches the pass
					deletesAtLoss.Store(kv.deletes.Load())
					return ctx.Err()
				}
				return nil
			},
			OnPass: log.onPass,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()

		require.Equal(t, int64(2), deletesAtLoss.Load(), "two pages were deleted before the loss")
		assert.Equal(t, 1, locker.attempts(), "no try to take the lease straight back after losing it")
		assert.Equal(t, deletesAtLoss.Load(), kv.deletes.Load(), "no delete after the loss was learned")
		assert.Equal(t, 12, mem.Len(), "the page in flight and the rest stay")
		require.Equal(t, 1, log.len())
		assert.ErrorIs(t, log.err(0), ErrLeaseLost)
		assert.ErrorIs(t, log.err(0), context.Canceled)

		// Without the lease, the replica only polls for it.
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		assert.Equal(t, 1, log.len(), "no pass without the lease")
		assert.GreaterOrEqual(t, locker.attempts(), 4)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

func TestRunAcquireErrorBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker := &fakeLocker{fail: errors.New("store unreachable")}
		s, err := New(NewMemKV(), Config{Prefix: "runs/", Retention: time.Hour, Interval: 10 * time.Second, Lease: locker,
			Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		// Attempts at 0s, 1s, 3s, 7s, 15s, 25s, 35s.
		time.Sleep(36 * time.Second)
		synctest.Wait()
		assert.Equal(t, 7, locker.attempts())
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

func TestRunJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = time.Minute
		start := time.Now()
		var mu sync.Mutex
		passes := map[int][]time.Duration{}
		var cancels []context.CancelFunc
		var dones []chan error
		for r := range 4 {
			s, err := New(NewMemKV(), Config{Prefix: "runs/", Retention: time.Hour, Interval: interval,
				Jitter: 0.5, StartJitter: 10 * time.Second,
				Clear: func(context.Context, string) error { return nil },
				OnPass: func(Stats, error) {
					mu.Lock()
					passes[r] = append(passes[r], time.Since(start))
					mu.Unlock()
				}})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			cancels, dones = append(cancels, cancel), append(dones, done)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		for i := range cancels {
			cancels[i]()
			require.ErrorIs(t, <-dones[i], context.Canceled)
		}
		firsts := map[time.Duration]bool{}
		for r, ts := range passes {
			require.GreaterOrEqual(t, len(ts), 7, "replica %d", r)
			assert.Less(t, ts[0], 10*time.Second, "first pass of replica %d after %v", r, ts[0])
			firsts[ts[0]] = true
			for i := 1; i < len(ts); i++ {
				gap := ts[i] - ts[i-1]
				assert.GreaterOrEqual(t, gap, interval, "replica %d gap %d", r, i)
				assert.Less(t, gap, interval*3/2, "replica %d gap %d", r, i)
			}
		}
		assert.Greater(t, len(firsts), 1, "replicas that start together do not pass together")
	})
}

func TestNewGroupValidation(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	sweep := func(prefix string, lease Locker) *Sweep {
		s, err := New(kv, Config{Prefix: prefix, Retention: time.Hour, Lease: lease, Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		return s
	}
	tests := []struct {
		name    string
		cfg     GroupConfig
		sweeps  []*Sweep
		wantMsg string
	}{
		{"two disjoint prefixes", GroupConfig{}, []*Sweep{sweep("runs/", nil), sweep("batches/", nil)}, ""},
		{"neighbours runs/ and runs2/", GroupConfig{Lease: &fakeLocker{}}, []*Sweep{sweep("runs/", nil), sweep("runs2/", nil)}, ""},
		{"no sweeps", GroupConfig{}, nil, "a Group needs at least one Sweep"},
		{"nil sweep", GroupConfig{}, []*Sweep{sweep("runs/", nil), nil}, "sweep 1 is nil"},
		{"zero Sweep", GroupConfig{}, []*Sweep{sweep("runs/", nil), {}}, "sweep 1 was not made by retention.New"},
		{"same prefix", GroupConfig{}, []*Sweep{sweep("runs/", nil), sweep("runs/", nil)}, `prefixes "runs/" and "runs/" overlap`},
		{"one extends the other with a letter", GroupConfig{}, []*Sweep{sweep("runs/", nil), sweep("runs/old/", nil)}, ""},
		{"one extends the other with a digit", GroupConfig{}, []*Sweep{sweep("runs/", nil), sweep("runs/2024/", nil)}, `prefixes "runs/" and "runs/2024/" overlap`},
		{"shorter second", GroupConfig{}, []*Sweep{sweep("runs/", nil), sweep("run:", nil)}, ""},
		{"shorter second, a prefix of the first", GroupConfig{}, []*Sweep{sweep("runs/0x/", nil), sweep("runs/", nil)}, `prefixes "runs/0x/" and "runs/" overlap`},
		{"member with its own lease", GroupConfig{}, []*Sweep{sweep("runs/", &fakeLocker{})}, "has its own Config.Lease"},
		{"jitter above 1", GroupConfig{Jitter: 1.5}, []*Sweep{sweep("runs/", nil)}, "GroupConfig.Jitter must be between 0 and 1, got 1.5"},
		{"negative start jitter", GroupConfig{StartJitter: -time.Second}, []*Sweep{sweep("runs/", nil)}, "GroupConfig.StartJitter must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, err := NewGroup(tt.cfg, tt.sweeps...)
			if tt.wantMsg == "" {
				require.NoError(t, err)
				require.NotNil(t, g)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.Nil(t, g)
		})
	}
}

func TestGroupPass(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	runs, batches := newClears(), newClears()
	clock := NewManualClock(t0)
	r, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, Clear: runs.clear})
	require.NoError(t, err)
	b, err := New(kv, Config{Prefix: "batches/", Retention: 2 * time.Hour, Clock: clock, Clear: batches.clear})
	require.NoError(t, err)
	g, err := NewGroup(GroupConfig{}, r, b)
	require.NoError(t, err)
	mark(t, kv, "runs/", "r1", t0.Add(-90*time.Minute))
	mark(t, kv, "batches/", "b1", t0.Add(-90*time.Minute))
	mark(t, kv, "batches/", "b2", t0.Add(-3*time.Hour))

	stats, err := g.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, stats, 2)
	assert.Equal(t, 1, stats[0].Cleared)
	assert.Equal(t, 1, stats[1].Cleared)
	assert.Equal(t, 1, runs.count("r1"))
	assert.Equal(t, 1, batches.count("b2"))
	assert.Zero(t, batches.count("b1"), "batches keep two hours")
	assert.Equal(t, t0.Add(30*time.Minute), stats[1].NextDue)
}

func TestGroupPassJoinsErrors(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	failing := &fakeKV{canPut: true, MemKV: mem, onScan: failWith(errBoom)}
	c := newClears()
	a, err := New(failing.store(), Config{Prefix: "a/", Retention: time.Hour, Clear: c.clear})
	require.NoError(t, err)
	b, err := New(mem, Config{Prefix: "b/", Retention: time.Hour, Clock: NewManualClock(t0), Clear: c.clear})
	require.NoError(t, err)
	mark(t, mem, "b/", "x", t0.Add(-2*time.Hour))
	g, err := NewGroup(GroupConfig{}, a, b)
	require.NoError(t, err)
	stats, err := g.Pass(context.Background())
	require.ErrorIs(t, err, errBoom)
	assert.Contains(t, err.Error(), `prefix "a/"`)
	assert.Equal(t, 1, stats[1].Cleared, "a failing sweep does not stop the others")
}

func TestGroupRunSharesLeaseAndWakesForEither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		runs, batches := newClears(), newClears()
		start := time.Now()
		mark(t, kv, "runs/", "r1", start.Add(-50*time.Minute))    // due in 10 minutes
		mark(t, kv, "batches/", "b1", start.Add(-55*time.Minute)) // due in 5 minutes
		var log passLog
		r, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Hour, Clear: runs.clear, OnPass: log.onPass})
		require.NoError(t, err)
		b, err := New(kv, Config{Prefix: "batches/", Retention: time.Hour, Interval: time.Hour, Clear: batches.clear, OnPass: log.onPass})
		require.NoError(t, err)
		locker := &fakeLocker{}
		g, err := NewGroup(GroupConfig{Lease: locker}, r, b)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()

		synctest.Wait()
		assert.Equal(t, 2, log.len(), "one round: a pass per sweep")
		assert.True(t, locker.held())
		time.Sleep(5*time.Minute + dueSlack)
		synctest.Wait()
		assert.Equal(t, 1, batches.count("b1"))
		assert.Zero(t, runs.count("r1"))
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		assert.Equal(t, 1, runs.count("r1"))
		assert.Equal(t, 6, log.len())
		assert.Equal(t, 1, locker.attempts(), "the lease is kept between rounds")
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.False(t, locker.held())
	})
}

func TestGroupRunStopsRoundWhenLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		locker := &fakeLocker{}
		mark(t, kv, "runs/", "r1", time.Now().Add(-2*time.Hour))
		mark(t, kv, "batches/", "b1", time.Now().Add(-2*time.Hour))
		var runsLog, batchesLog passLog
		r, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, OnPass: runsLog.onPass,
			Clear: func(ctx context.Context, _ string) error {
				locker.steal()
				<-ctx.Done()
				return ctx.Err()
			}})
		require.NoError(t, err)
		batches := newClears()
		b, err := New(kv, Config{Prefix: "batches/", Retention: time.Hour, Clear: batches.clear, OnPass: batchesLog.onPass})
		require.NoError(t, err)
		g, err := NewGroup(GroupConfig{Lease: locker}, r, b)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		synctest.Wait()
		require.Equal(t, 1, runsLog.len())
		assert.ErrorIs(t, runsLog.err(0), ErrLeaseLost)
		assert.Zero(t, batchesLog.len(), "the round stops at the loss: the next sweep does not pass")
		assert.Zero(t, batches.total())
		assert.Equal(t, 2, kv.Len())
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

// fencingLocker is a fakeLocker whose leases fence writes: the store
// refuses them unless the writer still holds the lease.
type fencingLocker struct{ fakeLocker }

type fencingLease struct{ *fakeLease }

func (f *fencingLocker) TryAcquire(ctx context.Context) (Lease, error) {
	l, err := f.fakeLocker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return fencingLease{l.(*fakeLease)}, nil
}

// stealSilently gives the lease to an outsider without telling the holder,
// as a holder frozen or partitioned past its TTL would experience it.
func (f *fencingLocker) stealSilently() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holder = &fakeLease{l: &f.fakeLocker, name: "outsider", lost: make(chan struct{})}
}

func (l fencingLease) Fence(kv KV) (KV, bool) {
	return fencedKV{KV: kv, lease: l.fakeLease}, true
}

type fencedKV struct {
	KV
	lease *fakeLease
}

func (f fencedKV) Delete(ctx context.Context, keys ...[]byte) error {
	f.lease.l.mu.Lock() // held across the delete, as a store's check is
	defer f.lease.l.mu.Unlock()
	if f.lease.l.holder != f.lease {
		f.lease.once.Do(func() { close(f.lease.lost) })
		return fmt.Errorf("fake fence: %w", ErrLeaseLost)
	}
	return f.KV.Delete(ctx, keys...)
}

func TestFencedDeleteRefusedAfterSilentLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		kv := &fakeKV{canPut: true, MemKV: mem}
		locker := &fencingLocker{}
		for i := range 20 {
			mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), time.Now().Add(-2*time.Hour))
		}
		var log passLog
		s, err := New(kv.store(), Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Minute, PageSize: 4, Lease: locker,
			Clear: func(ctx context.Context, id string) error {
				if id == "m09" {
					locker.stealSilently() // the holder is never told
				}
				return nil
			},
			OnPass: log.onPass,
		})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		synctest.Wait()

		assert.Equal(t, 12, mem.Len(), "the fence refused the page in flight; the rest was never reached")
		assert.Equal(t, int64(8), kv.deleted.Load(), "only the two pages before the loss reached the store")
		require.Equal(t, 1, log.len())
		assert.ErrorIs(t, log.err(0), ErrLeaseLost)
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

// fenceableKV is an adapter whose writes apply a fence carried on ctx
// (retention.Fenced), as pgkv, rediskv and etcdkv do; it counts fenced and
// unfenced deletes.
type fenceableKV struct {
	*MemKV
	mu            sync.Mutex
	fenced, plain int
}

func (f *fenceableKV) Delete(ctx context.Context, keys ...[]byte) error {
	view, err := Fenced(ctx, f)
	if err != nil {
		return err
	}
	if view != nil {
		return view.Delete(ctx, keys...)
	}
	f.mu.Lock()
	f.plain++
	f.mu.Unlock()
	return f.MemKV.Delete(ctx, keys...)
}

type fenceMemView struct{ f *fenceableKV }

func (v fenceMemView) Scan(ctx context.Context, s, e []byte, n int) ([][]byte, error) {
	return v.f.MemKV.Scan(ctx, s, e, n)
}

func (v fenceMemView) Delete(ctx context.Context, keys ...[]byte) error {
	v.f.mu.Lock()
	v.f.fenced++
	v.f.mu.Unlock()
	return v.f.MemKV.Delete(ctx, keys...)
}

type fenceLease struct{ lost chan struct{} }

func (l *fenceLease) Lost() <-chan struct{} { return l.lost }

func (l *fenceLease) Release(context.Context) error { return nil }

func (l *fenceLease) Fence(kv KV) (KV, bool) {
	if f, ok := kv.(*fenceableKV); ok {
		return fenceMemView{f}, true
	}
	return nil, false
}

type fenceLocker struct{}

func (fenceLocker) TryAcquire(context.Context) (Lease, error) {
	return &fenceLease{lost: make(chan struct{})}, nil
}

// nilViewLease is a Fencer whose Fence says ok and gives no view.
type nilViewLease struct{ fenceLease }

func (*nilViewLease) Fence(KV) (KV, bool) { return nil, true }

type nilViewLocker struct{}

func (nilViewLocker) TryAcquire(context.Context) (Lease, error) {
	return &nilViewLease{fenceLease{lost: make(chan struct{})}}, nil
}

// TestFencerWithoutViewCannotFence: a Fencer whose Fence answers ok with
// a nil view is taken as one that cannot fence: the pass fails with
// ErrUnfenced rather than writing through no KV, and touches nothing.
func TestFencerWithoutViewCannotFence(t *testing.T) {
	t.Parallel()
	for _, wrap := range []bool{false, true} {
		inner := &fenceableKV{MemKV: NewMemKV()}
		mark(t, inner.MemKV, "runs/", "a", t0.Add(-2*time.Hour))
		var kv KV = inner
		if wrap {
			kv = nested{inner}
		}
		var cleared atomic.Int32
		s, _ := newSweep(t, kv, Config{Lease: nilViewLocker{}, Clear: func(context.Context, string) error {
			cleared.Add(1)
			return nil
		}})
		_, err := s.LeasedPass(context.Background())
		require.ErrorIs(t, err, ErrUnfenced, "%T", kv)
		assert.Zero(t, cleared.Load(), "%T: nothing cleared", kv)
		assert.Equal(t, 1, inner.Len(), "%T: the marker stays", kv)
	}
	_, err := Fenced(withFenceOf(&nilViewLease{}), NewMemKV())
	require.ErrorIs(t, err, ErrUnfenced, "Fenced with a nil view")
}

// withFenceOf is a context carrying f's fence, as a pass's writes do.
func withFenceOf(f Fencer) context.Context {
	ctx, _ := withFence(context.Background(), f)
	return ctx
}

// dropCtxKV is a logging wrapper with Unwrap whose Delete does not pass
// the call's context on (it uses its own, as code that adds a timeout from
// context.Background() does).
type dropCtxKV struct{ inner *fenceableKV }

func (d dropCtxKV) Scan(ctx context.Context, s, e []byte, n int) ([][]byte, error) {
	return d.inner.Scan(ctx, s, e, n)
}

func (d dropCtxKV) Delete(_ context.Context, keys ...[]byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return d.inner.Delete(ctx, keys...)
}

func (d dropCtxKV) Unwrap() KV { return d.inner }

// TestWrapperDroppingCtxNeverDeletesUnfenced: under a lease that fences,
// LeasedPass refuses a KV it cannot fence. A wrapper with Unwrap whose
// Delete does not pass ctx on must either be refused (ErrUnfenced) or make
// no unfenced delete.
func TestWrapperDroppingCtxNeverDeletesUnfenced(t *testing.T) {
	t.Parallel()
	inner := &fenceableKV{MemKV: NewMemKV()}
	mark(t, inner.MemKV, "runs/", "a", t0.Add(-2*time.Hour))
	s, _ := newSweep(t, dropCtxKV{inner}, Config{Lease: fenceLocker{}, Clear: func(context.Context, string) error { return nil }})
	st, err := s.LeasedPass(context.Background())
	t.Logf("LeasedPass: %+v, %v; fenced deletes %d, unfenced %d", st, err, inner.fenced, inner.plain)
	if err == nil {
		assert.Zero(t, inner.plain, "a delete went out unfenced under a fencing lease, and LeasedPass returned nil")
	} else {
		assert.ErrorIs(t, err, ErrUnfenced)
	}
}

type selfUnwrap struct{ *MemKV }

func (s selfUnwrap) Unwrap() KV { return s }

type nilUnwrap struct{ *MemKV }

func (nilUnwrap) Unwrap() KV { return nil }

type nested struct{ KV }

func (n nested) Unwrap() KV { return n.KV }

// TestUnwrapChains: Unwrap returning itself or nil is refused with
// ErrUnfenced, not a hang; nested wrappers over a fenceable KV are fenced
// through the context.
func TestUnwrapChains(t *testing.T) {
	t.Parallel()
	for _, kv := range []KV{selfUnwrap{NewMemKV()}, nilUnwrap{NewMemKV()}} {
		s, _ := newSweep(t, kv, Config{Lease: fenceLocker{}, Clear: func(context.Context, string) error { return nil }})
		_, err := s.LeasedPass(context.Background())
		assert.ErrorIs(t, err, ErrUnfenced, "%T", kv)
	}
	inner := &fenceableKV{MemKV: NewMemKV()}
	mark(t, inner.MemKV, "runs/", "a", t0.Add(-2*time.Hour))
	s, _ := newSweep(t, nested{nested{inner}}, Config{Lease: fenceLocker{}, Clear: func(context.Context, string) error { return nil }})
	_, err := s.LeasedPass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, inner.fenced, "the probe of the fence and the pass's delete")
	assert.Zero(t, inner.plain)
}

// typedFencer fences *fenceableKV only, through the fake lease.
type typedFencer struct{ fencingLease }

func (l typedFencer) Fence(kv KV) (KV, bool) {
	k, ok := kv.(*fenceableKV)
	if !ok {
		return nil, false
	}
	return fencedKV{KV: k.MemKV, lease: l.fakeLease}, true
}

type typedFencingLocker struct{ fencingLocker }

func (f *typedFencingLocker) TryAcquire(ctx context.Context) (Lease, error) {
	l, err := f.fencingLocker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return typedFencer{l.(fencingLease)}, nil
}

// loggingKV wraps a KV as users do to log or trace its calls; with unwrap
// set it has an Unwrap method.
type loggingKV struct {
	inner   KV
	deletes atomic.Int64
}

func (w *loggingKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return w.inner.Scan(ctx, start, end, limit)
}

func (w *loggingKV) Delete(ctx context.Context, keys ...[]byte) error {
	err := w.inner.Delete(ctx, keys...)
	if err == nil {
		w.deletes.Add(1)
	}
	return err
}

type unwrappingKV struct{ *loggingKV }

func (w unwrappingKV) Unwrap() KV { return w.inner }

// TestFenceThroughWrapper: a wrapper with Unwrap keeps the lease's fence
// (dropping it would let the old holder delete after losing the lease);
// one without is refused unless
// Config.AllowUnfenced says otherwise.
func TestFenceThroughWrapper(t *testing.T) {
	t.Run("Unwrap", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := NewMemKV()
			store := &fenceableKV{MemKV: mem}
			wrapper := unwrappingKV{&loggingKV{inner: store}}
			locker := &typedFencingLocker{}
			for i := range 20 {
				mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), time.Now().Add(-2*time.Hour))
			}
			var log passLog
			var stolen atomic.Bool
			s, err := New(wrapper, Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Minute, PageSize: 4, Lease: locker,
				Clear: func(ctx context.Context, id string) error {
					if id == "m09" {
						locker.stealSilently()
						stolen.Store(true)
					}
					return nil
				},
				OnPass: log.onPass,
			})
			require.NoError(t, err)
			stop := runInBackground(t.Context(), s)
			synctest.Wait()
			assert.Equal(t, 12, mem.Len(), "the fence refused the page in flight")
			assert.Equal(t, int64(3), wrapper.deletes.Load(), "the probe of the fence (a write of nothing) and the two pages before the loss; none after")
			require.GreaterOrEqual(t, log.len(), 1)
			assert.ErrorIs(t, log.err(0), ErrLeaseLost)
			require.ErrorIs(t, stop(), context.Canceled)
		})
	})
	t.Run("no Unwrap", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := NewMemKV()
			wrapper := &loggingKV{inner: &fenceableKV{MemKV: mem}}
			mark(t, mem, "runs/", "a", time.Now().Add(-2*time.Hour))
			locker := &typedFencingLocker{}
			s, err := New(wrapper, Config{Prefix: "runs/", Retention: time.Hour, Lease: locker,
				Clear: func(context.Context, string) error { return nil }})
			require.NoError(t, err)
			err = s.Run(t.Context())
			require.ErrorIs(t, err, ErrUnfenced)
			assert.Contains(t, err.Error(), "AllowUnfenced")
			assert.Equal(t, 1, mem.Len(), "nothing deleted unfenced")
			assert.Nil(t, locker.holder, "the lease was released")

			_, err = s.LeasedPass(t.Context())
			require.ErrorIs(t, err, ErrUnfenced)
			assert.Equal(t, 1, mem.Len())
		})
	})
	t.Run("AllowUnfenced", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := NewMemKV()
			wrapper := &loggingKV{inner: &fenceableKV{MemKV: mem}}
			mark(t, mem, "runs/", "a", time.Now().Add(-2*time.Hour))
			s, err := New(wrapper, Config{Prefix: "runs/", Retention: time.Hour, Lease: &typedFencingLocker{}, AllowUnfenced: true,
				Clear: func(context.Context, string) error { return nil }})
			require.NoError(t, err)
			st, err := s.LeasedPass(t.Context())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Cleared)
			assert.Zero(t, mem.Len())
		})
	})
}

// TestFencedRefusesAForeignFence: a store write under a fence that cannot
// fence the store fails rather than goes out unfenced.
func TestFencedRefusesAForeignFence(t *testing.T) {
	t.Parallel()
	ctx, _ := withFence(context.Background(), typedFencer{fencingLease{&fakeLease{}}})
	view, err := Fenced(ctx, NewMemKV())
	require.ErrorIs(t, err, ErrUnfenced)
	assert.Nil(t, view)
	view, err = Fenced(context.Background(), NewMemKV())
	require.NoError(t, err)
	assert.Nil(t, view, "no fence on the context: write as usual")
}

// probeAtomic is an atomicKV that records whether its ClearAndDelete ran
// under a fence carried on its context.
type probeAtomic struct {
	*atomicKV
	fenced, unfenced atomic.Int64
}

func (p *probeAtomic) Delete(ctx context.Context, keys ...[]byte) error {
	if f, err := Fenced(ctx, p); f != nil || err != nil {
		if err != nil {
			return err
		}
		return p.MemKV.Delete(ctx, keys...) // the fake fence lets every write through
	}
	return p.MemKV.Delete(ctx, keys...)
}

func (p *probeAtomic) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if f, err := Fenced(ctx, p); f != nil && err == nil {
		p.fenced.Add(1)
	} else {
		p.unfenced.Add(1)
	}
	return p.atomicKV.ClearAndDelete(ctx, ids, keys)
}

// probeFencer fences *probeAtomic only.
type probeFencer struct{ fencingLease }

func (l probeFencer) Fence(kv KV) (KV, bool) {
	if _, ok := kv.(*probeAtomic); !ok {
		return nil, false
	}
	return kv, true
}

type probeLocker struct{ fencingLocker }

func (f *probeLocker) TryAcquire(ctx context.Context) (Lease, error) {
	l, err := f.fencingLocker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return probeFencer{l.(fencingLease)}, nil
}

// atomicWrapper wraps a ClearDeleter, with Unwrap.
type atomicWrapper struct{ inner ClearDeleter }

func (w atomicWrapper) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return w.inner.Scan(ctx, start, end, limit)
}

func (w atomicWrapper) Delete(ctx context.Context, keys ...[]byte) error {
	return w.inner.Delete(ctx, keys...)
}

func (w atomicWrapper) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return w.inner.ClearAndDelete(ctx, ids, keys)
}

func (w atomicWrapper) Unwrap() KV { return w.inner }

// TestFenceThroughAtomicWrapper: the atomic clear through a wrapper carries
// the fence on its context too.
func TestFenceThroughAtomicWrapper(t *testing.T) {
	t.Parallel()
	base, _ := newAtomicKV(t, 10)
	probe := &probeAtomic{atomicKV: base}
	s, err := New(atomicWrapper{probe}, Config{Prefix: "runs/", Retention: time.Hour, Lease: &probeLocker{},
		Clock: NewManualClock(t0.Add(2 * time.Hour)), BatchSize: 4})
	require.NoError(t, err)
	st, err := s.LeasedPass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 10, st.Cleared)
	assert.Equal(t, int64(3), probe.fenced.Load())
	assert.Zero(t, probe.unfenced.Load())
}

// dropFenceAtomic is an atomicWrapper whose ClearAndDelete drops its
// context, and with it the lease's fence.
type dropFenceAtomic struct{ atomicWrapper }

func (w dropFenceAtomic) ClearAndDelete(_ context.Context, ids []string, keys [][]byte) error {
	return w.inner.ClearAndDelete(context.Background(), ids, keys)
}

// TestUnfencedAtomicCallCountsWhatItDeleted: an atomic call that reached
// no fence fails the pass with ErrUnfenced, but what it committed stands
// and is counted: its ids as cleared, the duplicates it deleted with them
// as duplicates.
func TestUnfencedAtomicCallCountsWhatItDeleted(t *testing.T) {
	t.Parallel()
	base, ids := newAtomicKV(t, 10)
	mark(t, base.MemKV, "runs/", ids[0], t0.Add(time.Minute)) // a second marker of one id
	probe := &probeAtomic{atomicKV: base}
	s, err := New(dropFenceAtomic{atomicWrapper{probe}}, Config{Prefix: "runs/", Retention: time.Hour, Lease: &probeLocker{},
		Clock: NewManualClock(t0.Add(2 * time.Hour)), BatchSize: 4})
	require.NoError(t, err)
	st, err := s.LeasedPass(context.Background())
	require.ErrorIs(t, err, ErrUnfenced)
	assert.Positive(t, probe.unfenced.Load())
	assert.Empty(t, markerIDs(t, base.MemKV, "runs/"), "every call committed")
	assert.Equal(t, 10, st.Cleared)
	assert.Equal(t, 1, st.Duplicates, "the second marker of %s went with the first", ids[0])
}
