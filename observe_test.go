package retention

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an Observer that keeps everything it is told.
type recorder struct {
	mu     sync.Mutex
	passes []Stats
	pages  []Stats
	errs   []error
	lags   []time.Duration
	calls  int // ObserveLags calls
	events []string
}

func (r *recorder) ObservePass(prefix string, st Stats, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.passes = append(r.passes, st)
	r.errs = append(r.errs, err)
}

func (r *recorder) ObserveLags(prefix string, lags []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.lags = append(r.lags, lags...)
}

func (r *recorder) ObservePage(prefix string, page Stats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pages = append(r.pages, page)
}

func (r *recorder) ObserveLease(prefix string, e LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, prefix+" "+e.String())
}

func (r *recorder) eventList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func TestObserverSeesPassesAndLags(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	const n = 50
	for i := range n {
		mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Second))
	}
	mark(t, mem, "runs/", "later", t0.Add(2*time.Hour))
	require.NoError(t, mem.Put(t.Context(), []byte("runs/0-foreign"), nil))
	rec := &recorder{}
	c := newClears()
	c.set("m03", errBoom)
	c.set("m04", fmt.Errorf("resumed: %w", ErrLiveAgain))
	s, clock := newSweep(t, mem, Config{Clear: c.clear, Observer: rec, PageSize: 8})
	now := clock.Advance(time.Hour + 5*time.Minute)

	st, err := s.Pass(t.Context())
	require.NoError(t, err)

	require.Len(t, rec.passes, 1)
	assert.Equal(t, st, rec.passes[0], "ObservePass gets the Stats Pass returns")
	assert.NoError(t, rec.errs[0])
	assert.Equal(t, n-2, st.Cleared)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.Retried)
	assert.Equal(t, 1, st.LiveAgain)
	assert.Equal(t, 1, st.Foreign)
	require.Len(t, rec.lags, st.Cleared, "one lag per cleared entity")
	for i := 1; i < len(rec.lags); i++ {
		// Oldest first; with the clock standing still, across pages too.
		assert.LessOrEqual(t, rec.lags[i], rec.lags[i-1], "lag %d", i)
	}
	assert.Equal(t, 7, rec.calls, "one call per page with something cleared")

	// The clock stands still, so every marker was deleted at now; each
	// fell due an hour after it was written.
	var want, got time.Duration
	for i := range n {
		if i == 3 || i == 4 {
			continue
		}
		want += now.Sub(t0.Add(time.Duration(i)*time.Second + time.Hour))
	}
	for _, l := range rec.lags {
		got += l
	}
	assert.Equal(t, want, got, "sum of lags")
	assert.Equal(t, 5*time.Minute, rec.lags[0], "the oldest marker's lag")
}

func TestObserverSeesFailedPassWithoutLags(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	mark(t, mem, "runs/", "a", t0)
	kv := &fakeKV{canPut: true, MemKV: mem, onDelete: failWith(errBoom)}
	rec := &recorder{}
	s, clock := newSweep(t, kv.store(), Config{Clear: func(context.Context, string) error { return nil }, Observer: rec})
	clock.Advance(2 * time.Hour)
	_, err := s.Pass(t.Context())
	require.ErrorIs(t, err, errBoom)
	require.Len(t, rec.errs, 1)
	assert.ErrorIs(t, rec.errs[0], errBoom)
	assert.Empty(t, rec.lags, "no lag for a marker that was not deleted")
}

func TestLeaseEventString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		e    LeaseEvent
		want string
	}{
		{LeaseAcquired, "acquired"},
		{LeaseHeld, "held"},
		{LeaseLost, "lost"},
		{LeaseReleased, "released"},
		{0, "unknown"},
		{99, "unknown"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.e.String(), "LeaseEvent(%d).String()", tt.e)
	}
}

func TestRunTellsObserverOfLeaseEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		locker := &fakeLocker{}
		rec := &recorder{}
		s, err := New(mem, Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Minute, Lease: locker,
			Clear: func(context.Context, string) error { return nil }, Observer: rec})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		synctest.Wait()
		assert.Equal(t, []string{"runs/ acquired"}, rec.eventList())

		locker.steal()
		time.Sleep(30 * time.Second) // the next pass learns of the loss
		synctest.Wait()
		time.Sleep(2 * time.Minute) // the outsider keeps it
		synctest.Wait()
		locker.expire()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		require.ErrorIs(t, stop(), context.Canceled)
		// Lost at the pass of 1m, held at the try of 2m, acquired at 3m.
		assert.Equal(t, []string{"runs/ acquired", "runs/ lost", "runs/ held", "runs/ acquired", "runs/ released"},
			rec.eventList())
	})
}

func TestLeasedPass(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		held       bool
		wantErr    error
		wantPass   bool
		wantEvents []string
	}{
		{"free", false, nil, true, []string{"runs/ acquired", "runs/ released"}},
		{"held by another", true, ErrLeaseHeld, false, []string{"runs/ held"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			mark(t, mem, "runs/", "a", t0)
			locker := &fencingLocker{}
			if tt.held {
				locker.stealSilently()
			}
			rec := &recorder{}
			var log passLog
			s, clock := newSweep(t, mem, Config{Clear: func(context.Context, string) error { return nil },
				Lease: locker, Observer: rec, OnPass: log.onPass})
			clock.Advance(2 * time.Hour)
			st, err := s.LeasedPass(t.Context())
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.wantEvents, rec.eventList())
			if !tt.wantPass {
				assert.Zero(t, log.len(), "no pass without the lease")
				assert.Empty(t, rec.passes)
				assert.Equal(t, 1, mem.Len())
				return
			}
			assert.Equal(t, 1, st.Cleared)
			assert.Zero(t, mem.Len())
			require.Equal(t, 1, log.len(), "OnPass sees the pass")
			assert.Equal(t, st, log.stat(0))
			assert.Len(t, rec.passes, 1)
			assert.False(t, locker.held(), "the lease is released")
		})
	}
}

func TestLeasedPassFencedAndCancelledOnLoss(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	for i := range 20 {
		mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0)
	}
	locker := &fencingLocker{}
	rec := &recorder{}
	s, clock := newSweep(t, mem, Config{PageSize: 4, Lease: locker, Observer: rec,
		Clear: func(ctx context.Context, id string) error {
			if id == "m09" {
				locker.stealSilently() // only the fence can tell
			}
			return nil
		}})
	clock.Advance(2 * time.Hour)
	_, err := s.LeasedPass(t.Context())
	require.ErrorIs(t, err, ErrLeaseLost)
	assert.Equal(t, 12, mem.Len(), "the fence refused the page in flight")
	assert.Equal(t, []string{"runs/ acquired", "runs/ lost"}, rec.eventList())
	require.Len(t, rec.errs, 1)
	assert.ErrorIs(t, rec.errs[0], ErrLeaseLost)
	assert.Len(t, rec.lags, 8, "lags of the two pages deleted")
}

func TestObserverSeesLeaseLostMidPass(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	for i := range 20 {
		mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0)
	}
	locker := &fakeLocker{}
	rec := &recorder{}
	var log passLog
	s, clock := newSweep(t, mem, Config{PageSize: 4, Lease: locker, Observer: rec, OnPass: log.onPass,
		Clear: func(ctx context.Context, id string) error {
			if id == "m09" {
				locker.steal() // the holder is told: Lost closes
			}
			return nil
		}})
	clock.Advance(2 * time.Hour)
	_, err := s.LeasedPass(t.Context())
	require.ErrorIs(t, err, ErrLeaseLost)
	require.Len(t, rec.errs, 1)
	assert.ErrorIs(t, rec.errs[0], ErrLeaseLost, "the observer sees the loss")
	assert.ErrorIs(t, rec.errs[0], context.Canceled)
	assert.ErrorIs(t, log.err(0), ErrLeaseLost, "as OnPass does")
	assert.Equal(t, []string{"runs/ acquired", "runs/ lost"}, rec.eventList())
}

func TestLeasedPassWithoutLease(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	mark(t, mem, "runs/", "a", t0)
	var log passLog
	s, clock := newSweep(t, mem, Config{Clear: func(context.Context, string) error { return nil }, OnPass: log.onPass})
	clock.Advance(2 * time.Hour)
	st, err := s.LeasedPass(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, log.len())
}

func TestGroupLeasedPass(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	mark(t, mem, "runs/", "r", t0)
	mark(t, mem, "jobs/", "j", t0)
	clock := NewManualClock(t0.Add(2 * time.Hour))
	rec := &recorder{}
	var sweeps []*Sweep
	for _, prefix := range []string{"runs/", "jobs/"} {
		s, err := New(mem, Config{Prefix: prefix, Retention: time.Hour, Clock: clock, Observer: rec,
			Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		sweeps = append(sweeps, s)
	}
	locker := &fakeLocker{}
	g, err := NewGroup(GroupConfig{Lease: locker}, sweeps...)
	require.NoError(t, err)
	stats, err := g.LeasedPass(t.Context())
	require.NoError(t, err)
	require.Len(t, stats, 2)
	assert.Equal(t, 1, stats[0].Cleared)
	assert.Equal(t, 1, stats[1].Cleared)
	assert.Equal(t, []string{"runs/ acquired", "jobs/ acquired", "runs/ released", "jobs/ released"}, rec.eventList())
	assert.False(t, locker.held())

	locker.steal()
	stats, err = g.LeasedPass(t.Context())
	require.ErrorIs(t, err, ErrLeaseHeld)
	assert.Empty(t, stats)
}

func TestLeasedPassCancelled(t *testing.T) {
	t.Parallel()
	s, _ := newSweep(t, NewMemKV(), Config{Clear: func(context.Context, string) error { return nil }, Lease: &fakeLocker{}})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := s.LeasedPass(ctx)
	require.ErrorIs(t, err, context.Canceled)
}

func TestLeasedPassAcquireError(t *testing.T) {
	t.Parallel()
	s, _ := newSweep(t, NewMemKV(), Config{Clear: func(context.Context, string) error { return nil }, Lease: &fakeLocker{fail: errBoom}})
	_, err := s.LeasedPass(t.Context())
	require.ErrorIs(t, err, errBoom)
	assert.False(t, errors.Is(err, ErrLeaseHeld))
}

// histObserver is an Observer of the kind retentionprom makes: lags go into
// fixed buckets under a lock taken once per page.
type histObserver struct {
	mu      sync.Mutex
	bounds  []float64
	buckets []uint64
	sum     float64
	count   uint64
	passes  int
}

func newHistObserver() *histObserver {
	b := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400}
	return &histObserver{bounds: b, buckets: make([]uint64, len(b)+1)}
}

func (h *histObserver) ObservePass(string, Stats, error) {
	h.mu.Lock()
	h.passes++
	h.mu.Unlock()
}

func (h *histObserver) ObserveLags(_ string, lags []time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The lags never increase along the slice: those within a bucket's
	// bound are a suffix of it, found by a binary search per bucket.
	var sum float64 // ns: a Duration overflows on a page of markers years past due
	for _, l := range lags {
		sum += float64(l)
	}
	h.sum += sum / float64(time.Second)
	done := len(lags)
	for i, bound := range h.bounds {
		limit := time.Duration(bound * float64(time.Second))
		n := sort.Search(done, func(j int) bool { return lags[j] <= limit })
		h.buckets[i] += uint64(done - n)
		done = n
	}
	h.buckets[len(h.bounds)] += uint64(done)
	h.count += uint64(len(lags))
}

func (h *histObserver) ObserveLease(string, LeaseEvent) {}

func (h *histObserver) ObservePage(string, Stats) {}

// BenchmarkPassObserved measures a pass clearing 100,000 markers on MemKV
// without an observer and with one that buckets every lag, alternating the
// two in one run; observed/plain is the ratio of their costs.
func BenchmarkPassObserved(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	var plain, observed time.Duration
	run := func(obs Observer) time.Duration {
		kv := fill(b, n)
		s, clock := newSweep(b, kv, Config{Clear: func(context.Context, string) error { return nil }, Observer: obs})
		clock.Set(t0.Add(24 * time.Hour))
		runtime.GC()
		start := time.Now()
		st, err := s.Pass(ctx)
		d := time.Since(start)
		if err != nil || st.Cleared != n {
			b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, n)
		}
		return d
	}
	h := newHistObserver()
	var ratios []float64
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		var p, o time.Duration
		if i%2 == 0 {
			p = run(nil)
			o = run(h)
		} else {
			o = run(h)
			p = run(nil)
		}
		plain, observed = plain+p, observed+o
		ratios = append(ratios, float64(o)/float64(p))
	}
	slices.Sort(ratios)
	if h.count != uint64(n*b.N) {
		b.Fatalf("observer saw %d lags, want %d", h.count, n*b.N)
	}
	markers := float64(n) * float64(b.N)
	b.ReportMetric(float64(plain)/markers, "plain-ns/marker")
	b.ReportMetric(float64(observed)/markers, "observed-ns/marker")
	b.ReportMetric(float64(observed)/float64(plain), "observed/plain")
	// The median of the pairs' ratios: a neighbour's burst on a shared
	// machine skews a sum more than it skews a median.
	b.ReportMetric(ratios[len(ratios)/2], "median-observed/plain")
}

// panicObserver panics in ObservePass, as a buggy metrics exporter might.
type panicObserver struct{ recorder }

func (p *panicObserver) ObservePass(prefix string, st Stats, err error) {
	p.recorder.ObservePass(prefix, st, err)
	panic("observer bug")
}

// An Observer's panic is not recovered (as OnPass's is not), but it must not
// leave the lease held: a caller that recovers it, as net/http does for an
// admin endpoint, would otherwise keep a lease that is renewed forever.
func TestLeasedPassReleasesLeaseWhenObserverPanics(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	mark(t, mem, "runs/", "a", t0)
	locker := &fakeLocker{}
	obs := &panicObserver{}
	s, clock := newSweep(t, mem, Config{Clear: func(context.Context, string) error { return nil }, Lease: locker, Observer: obs})
	clock.Advance(2 * time.Hour)
	func() {
		defer func() {
			assert.Equal(t, "observer bug", recover(), "the Observer's panic reaches the caller")
		}()
		_, _ = s.LeasedPass(t.Context())
	}()
	assert.False(t, locker.held(), "LeasedPass released the lease")
	assert.Equal(t, []string{"runs/ acquired", "runs/ released"}, obs.eventList())
	// The sweep is usable again.
	mark(t, mem, "runs/", "b", t0)
	obs2 := &recorder{}
	s.obs = obs2
	st, err := s.LeasedPass(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
}

// acquiredPanicObserver panics when told the lease was acquired.
type acquiredPanicObserver struct{ recorder }

func (p *acquiredPanicObserver) ObserveLease(prefix string, e LeaseEvent) {
	p.recorder.ObserveLease(prefix, e)
	if e == LeaseAcquired {
		panic("observer bug")
	}
}

// An Observer that panics on the very event of taking the lease must not
// leave it held either, under LeasedPass or Run.
func TestLeaseReleasedWhenObserverPanicsOnAcquired(t *testing.T) {
	t.Parallel()
	for name, call := range map[string]func(*Sweep, context.Context){
		"LeasedPass": func(s *Sweep, ctx context.Context) { _, _ = s.LeasedPass(ctx) },
		"Run":        func(s *Sweep, ctx context.Context) { _ = s.Run(ctx) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			locker := &fakeLocker{}
			obs := &acquiredPanicObserver{}
			s, _ := newSweep(t, NewMemKV(), Config{Clear: func(context.Context, string) error { return nil }, Lease: locker, Observer: obs})
			func() {
				defer func() {
					assert.Equal(t, "observer bug", recover(), "the Observer's panic reaches the caller")
				}()
				call(s, t.Context())
			}()
			assert.False(t, locker.held(), "%s released the lease", name)
			assert.Equal(t, []string{"runs/ acquired", "runs/ released"}, obs.eventList())
		})
	}
}

// secondLagPanicObserver panics in its second ObserveLags.
type secondLagPanicObserver struct {
	recorder
	calls atomic.Int32
}

func (p *secondLagPanicObserver) ObserveLags(string, []time.Duration) {
	if p.calls.Add(1) == 2 {
		panic("observer bug")
	}
}

func TestPassCutShortByObserverPanicLeavesNoScan(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	old := time.Now().Add(-2 * time.Hour)
	for i := range 12 {
		mark(t, mem, "runs/", fmt.Sprintf("m%d", i), old)
	}
	kv := newFakeKV(mem)
	s, _ := newSweep(t, kv.store(), Config{Clear: func(context.Context, string) error { return nil }, Observer: &secondLagPanicObserver{}, PageSize: 4, Clock: SystemClock})
	func() {
		defer func() { assert.Equal(t, "observer bug", recover()) }()
		_, _ = s.Pass(t.Context())
	}()
	assert.Equal(t, int64(2), kv.scans.Load(), "Scan calls: pages 1 and 2; page 3 is not read once the Observer panicked")
	assert.Zero(t, kv.inScan.Load(), "no read outlives the pass")
	assert.Equal(t, 4, mem.Len(), "pages 1 and 2 were deleted before the Observer saw them")
}

// TestObserverLagsEveryWayOfClearing: whatever clears the markers (Clear
// with every kind of failure around it, ClearBatch with a BatchError, a
// ClearDeleter), the observer gets one lag per cleared entity, each the
// time since it fell due, and ObservePass the Stats the pass returns.
func TestObserverLagsEveryWayOfClearing(t *testing.T) {
	t.Parallel()
	failing := map[string]bool{"e03": true, "e07": true, "e11": true, "e15": true, "e19": true}
	clearOne := func(ctx context.Context, id string) error {
		switch id {
		case "e03":
			return errBoom
		case "e07":
			panic("boom")
		case "e11":
			runtime.Goexit()
		case "e15":
			<-ctx.Done() // ClearTimeout
			return ctx.Err()
		case "e19":
			return fmt.Errorf("resumed: %w", ErrLiveAgain)
		}
		return nil
	}
	tests := []struct {
		name string
		cfg  func(*MemKV) (KV, Config)
	}{
		{"Clear", func(m *MemKV) (KV, Config) {
			return m, Config{Clear: clearOne, ClearTimeout: 10 * time.Millisecond, Concurrency: 3, PageSize: 8}
		}},
		{"ClearBatch", func(m *MemKV) (KV, Config) {
			return m, Config{PageSize: 8, BatchSize: 3, ClearBatch: func(ctx context.Context, ids []string) error {
				be := BatchError{}
				for _, id := range ids {
					if id == "e19" {
						be[id] = ErrLiveAgain
					} else if failing[id] {
						be[id] = errBoom
					}
				}
				if len(be) == 0 {
					return nil
				}
				return be
			}}
		}},
		{"ClearDeleter", func(m *MemKV) (KV, Config) {
			a := atomicOver(m)
			for _, id := range []string{"e03", "e07", "e11", "e15", "e19"} {
				a.poison[id] = true
			}
			return a, Config{PageSize: 8, BatchSize: 4}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			const n = 30
			for i := range n {
				mark(t, mem, "runs/", fmt.Sprintf("e%02d", i), t0.Add(time.Duration(i)*time.Second))
			}
			bad := appendTimestamp([]byte("runs/"), uint64(t0.UnixMilli()))
			require.NoError(t, mem.Put(t.Context(), append(bad, "/bad id"...), nil))
			kv, cfg := tt.cfg(mem)
			rec := &recorder{}
			cfg.Observer = rec
			s, clock := newSweep(t, kv, cfg)
			now := clock.Advance(3 * time.Hour)
			st, err := s.Pass(t.Context())
			require.NoError(t, err)
			require.Len(t, rec.passes, 1)
			assert.Equal(t, st, rec.passes[0])
			assert.Equal(t, 1, st.Malformed)
			require.Len(t, rec.lags, st.Cleared)
			var want, got time.Duration
			for i := range n {
				id := fmt.Sprintf("e%02d", i)
				if !failing[id] {
					want += now.Sub(t0.Add(time.Duration(i)*time.Second + time.Hour))
				}
			}
			assert.Equal(t, n-5, st.Cleared)
			if tt.name != "ClearDeleter" { // its poisoned ids all fail
				assert.Equal(t, 1, st.LiveAgain)
				assert.Equal(t, 4, st.Failed)
			}
			for _, l := range rec.lags {
				got += l
			}
			assert.Equal(t, want, got, "sum of lags")
		})
	}
}

// A clock that steps back during a pass gives lags of zero, never negative
// ones, and a Duration of zero.
func TestObserverLagsClockStepsBack(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	for i := range 6 {
		mark(t, mem, "runs/", fmt.Sprintf("m%d", i), t0.Add(time.Duration(i)*time.Minute))
	}
	rec := &recorder{}
	var clock *ManualClock
	s, clock := newSweep(t, mem, Config{PageSize: 3, Observer: rec, Clear: func(_ context.Context, id string) error {
		if id == "m0" {
			clock.Set(t0) // back by two hours, before any marker fell due
		}
		return nil
	}})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 6, st.Cleared, "the cutoff is taken when the pass starts")
	require.Len(t, rec.lags, st.Cleared)
	for i, l := range rec.lags {
		assert.Zero(t, l, "lag %d", i)
	}
	assert.Zero(t, rec.passes[0].Duration)
}

// A LeasedPass whose ctx is cancelled mid-pass returns ctx.Err(), and still
// releases the lease, which the observer sees.
func TestLeasedPassCancelledMidPass(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	for i := range 20 {
		mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	locker := &fakeLocker{}
	rec := &recorder{}
	s, clock := newSweep(t, mem, Config{PageSize: 4, Lease: locker, Observer: rec, Clear: func(_ context.Context, id string) error {
		if id == "m09" {
			cancel()
		}
		return nil
	}})
	clock.Advance(2 * time.Hour)
	_, err := s.LeasedPass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, errors.Is(err, ErrLeaseLost))
	assert.False(t, locker.held())
	assert.Equal(t, []string{"runs/ acquired", "runs/ released"}, rec.eventList())
	require.Len(t, rec.errs, 1)
	assert.Equal(t, context.Canceled, rec.errs[0], "the observer sees ctx.Err() itself")
	assert.Equal(t, 12, mem.Len(), "the page in flight was not deleted")
}

// A ClearDeleter clears and deletes a batch in one transaction: a pass
// cancelled mid-page still counts, and hands the observer the lags of, the
// batches it committed.
func TestClearDeleterCancelledMidPageCountsCommittedBatches(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	kv := atomicOver(mem)
	kv.after = func(call int, err error) error {
		if call == 2 {
			cancel() // once its second call committed
		}
		return err
	}
	for i := range 8 {
		mark(t, mem, "runs/", fmt.Sprintf("m%d", i), t0)
	}
	rec := &recorder{}
	s, clock := newSweep(t, kv, Config{PageSize: 8, BatchSize: 2, Observer: rec})
	clock.Advance(2 * time.Hour)
	st, err := s.Pass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, kv.cleared, 4, "two batches committed")
	assert.Equal(t, 4, mem.Len())
	assert.Equal(t, 4, st.Cleared, "Stats.Cleared counts the committed batches")
	assert.Len(t, rec.lags, 4, "one lag per entity cleared")
}

// A ClearDeleter's markers are gone with their entities even when the
// sweep's own delete of the page (a malformed marker) fails: their lags
// are observed.
func TestClearDeleterLagsWhenPageDeleteFails(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := atomicOver(mem)
	for i := range 4 {
		mark(t, mem, "runs/", fmt.Sprintf("m%d", i), t0)
	}
	bad := appendTimestamp([]byte("runs/"), uint64(t0.UnixMilli()))
	require.NoError(t, mem.Put(t.Context(), append(bad, "/bad id"...), nil))
	rec := &recorder{}
	kv.onDelete = failWith(errBoom) // the sweep's Delete; the commit still deletes
	s, clock := newSweep(t, kv, Config{Observer: rec})
	clock.Advance(2 * time.Hour)
	st, err := s.Pass(t.Context())
	require.ErrorIs(t, err, errBoom)
	assert.Equal(t, 4, st.Cleared)
	assert.Len(t, rec.lags, 4)
}

// TestObservePageAddsUpToThePass: ObservePage comes after each page's
// ObserveLags with that page's counts, so that counters advance with the
// lag histogram, and the calls of a pass add up to its Stats.
func TestObservePageAddsUpToThePass(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	rec := &recorder{}
	c := newClears()
	c.set("m03", errBoom)
	s, clock := newSweep(t, mem, Config{Clear: c.clear, Observer: rec, PageSize: 4})
	for i := range 10 {
		mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	require.NoError(t, mem.Put(context.Background(), []byte("runs/9-not-a-marker"), nil))
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, rec.passes, 1)
	require.GreaterOrEqual(t, len(rec.pages), 3, "one call per page of 4, and the rest")
	var sum Stats
	cleared := 0
	for _, pg := range rec.pages {
		assert.Zero(t, pg.Duration)
		assert.True(t, pg.NextDue.IsZero())
		cleared += pg.Cleared
		sum = sum.plus(pg)
	}
	assert.Equal(t, st.counts(), sum, "the pages add up to the pass")
	assert.Equal(t, len(rec.lags), cleared, "a lag per cleared marker, page by page")
	assert.Equal(t, 1, sum.Failed)
	assert.Equal(t, 1, sum.Foreign, "the peek's foreign key comes in the last call")
}

// plus returns the counts of a and b added.
func (a Stats) plus(b Stats) Stats {
	var zero Stats
	return a.minus(zero.minus(b))
}

// TestAtomicLagsAtCommit: a ClearDeleter's entities are gone when its call
// commits, so their lag is measured then, not when the slowest batch of
// their page is done.
func TestAtomicLagsAtCommit(t *testing.T) {
	t.Parallel()
	base, _ := newAtomicKV(t, 4)
	rec := &recorder{}
	clock := NewManualClock(t0.Add(2 * time.Hour))
	kv := base
	kv.before = func(_ context.Context, call int, _ []string, _ [][]byte) error {
		if call == 2 {
			clock.Advance(10 * time.Second) // the second call is slow
		}
		return nil
	}
	s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, BatchSize: 2, Observer: rec})
	require.NoError(t, err)
	_, err = s.Pass(context.Background())
	require.NoError(t, err)
	require.Len(t, rec.lags, 4)
	// Markers at t0, +1ms, +2ms, +3ms, due an hour later; the pass starts
	// at t0+2h, the second batch commits 10s later.
	assert.Equal(t, []time.Duration{time.Hour + 10*time.Second - 2*time.Millisecond, time.Hour + 10*time.Second - 3*time.Millisecond},
		rec.lags[:2], "the second batch, at its commit")
	assert.Equal(t, []time.Duration{time.Hour, time.Hour - time.Millisecond}, rec.lags[2:], "the first batch, at its commit, not 10s later")
}

// TestObservePageAddsUpWhenPassCutShort: ObservePage calls add up to
// ObservePass's counts in a pass cancelled mid-page and in one whose
// delete fails.
func TestObservePageAddsUpWhenPassCutShort(t *testing.T) {
	t.Parallel()
	sum := func(pages []Stats) Stats {
		var s Stats
		for _, p := range pages {
			s.Scanned += p.Scanned
			s.Cleared += p.Cleared
			s.Failed += p.Failed
			s.Retried += p.Retried
			s.ClearCalls += p.ClearCalls
			s.FailedCalls += p.FailedCalls
			s.DeleteCalls += p.DeleteCalls
			s.ScanCalls += p.ScanCalls
			s.PutCalls += p.PutCalls
			s.Duplicates += p.Duplicates
		}
		return s
	}
	pick := func(st Stats) Stats {
		return Stats{Scanned: st.Scanned, Cleared: st.Cleared, Failed: st.Failed, Retried: st.Retried, ClearCalls: st.ClearCalls,
			FailedCalls: st.FailedCalls, DeleteCalls: st.DeleteCalls, ScanCalls: st.ScanCalls, PutCalls: st.PutCalls, Duplicates: st.Duplicates}
	}
	t.Run("cancelled", func(t *testing.T) {
		t.Parallel()
		base := atomicOver(NewMemKV())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		kv := cancelAfterFirstCommit(base, cancel)
		rec := &recorder{}
		s, clock := newSweep(t, kv, Config{Observer: rec, BatchSize: 3, PageSize: 8})
		for _, id := range markN(t, base.MemKV, 20, t0) {
			base.entities[id] = true
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, pick(st), sum(rec.pages))
		assert.Equal(t, 3, st.Cleared)
		assert.Len(t, rec.lags, 3)
	})
	t.Run("failed delete", func(t *testing.T) {
		t.Parallel()
		mem := NewMemKV()
		kv := &fakeKV{canPut: true, MemKV: mem}
		c := newClears()
		c.set("b0003", errBoom)
		rec := &recorder{}
		s, clock := newSweep(t, kv.store(), Config{Clear: c.clear, Observer: rec, PageSize: 4})
		markN(t, mem, 10, t0)
		kv.setHooks(nil, failCall(2, errBoom), nil)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.ErrorIs(t, err, errBoom)
		assert.Equal(t, pick(st), sum(rec.pages))
	})
}

// TestObservePageCountsHeldAndWouldClear: ObservePage calls add up to
// ObservePass's Held and WouldClear too.
func TestObservePageCountsHeldAndWouldClear(t *testing.T) {
	t.Parallel()
	sum := func(pages []Stats) (held, would int) {
		for _, p := range pages {
			held += p.Held
			would += p.WouldClear
		}
		return
	}
	t.Run("held", func(t *testing.T) {
		mem := NewMemKV()
		rec := &recorder{}
		s, clock := newSweep(t, mem, Config{Observer: rec, Clear: func(context.Context, string) error { return Hold(t0.Add(9 * time.Hour)) }})
		markN(t, mem, 3, t0)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 3, st.Held)
		held, _ := sum(rec.pages)
		assert.Equal(t, st.Held, held, "ObservePage adds up to ObservePass")
	})
	t.Run("would clear", func(t *testing.T) {
		mem := NewMemKV()
		rec := &recorder{}
		s, clock := newSweep(t, mem, Config{Observer: rec, DryRun: true, Clear: func(context.Context, string) error { return nil }})
		markN(t, mem, 3, t0)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 3, st.WouldClear)
		_, would := sum(rec.pages)
		assert.Equal(t, st.WouldClear, would, "ObservePage adds up to ObservePass")
	})
}
