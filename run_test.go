package retention

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// passLog records, under synctest, when each of Run's passes happened.
type passLog struct {
	mu     sync.Mutex
	starts []time.Time
	stats  []Stats
	errs   []error
}

func (p *passLog) onPass(st Stats, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starts = append(p.starts, time.Now())
	p.stats = append(p.stats, st)
	p.errs = append(p.errs, err)
}

func (p *passLog) start(i int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts[i]
}

func (p *passLog) stat(i int) Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats[i]
}

func (p *passLog) err(i int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errs[i]
}

func (p *passLog) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.starts)
}

// runInBackground starts s.Run and returns a function that stops it and
// returns Run's error.
func runInBackground(ctx context.Context, s *Sweep) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

func TestRunFirstPassImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		c := newClears()
		var log passLog
		// A marker left by an earlier process, long expired.
		mark(t, kv, "runs/", "left-over", time.Now().Add(-48*time.Hour))
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Clear: c.clear, OnPass: log.onPass})
		require.NoError(t, err)
		start := time.Now()
		stop := runInBackground(t.Context(), s)
		synctest.Wait()
		require.Equal(t, 1, log.len(), "Run should pass at once")
		assert.Equal(t, start, log.start(0), "first pass at %v, want at start %v", log.start(0), start)
		assert.Equal(t, 1, c.count("left-over"))
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

func TestRunWakesWhenNextMarkerFallsDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		c := newClears()
		var log passLog
		start := time.Now()
		mark(t, kv, "runs/", "a", start.Add(-50*time.Minute)) // due in 10 minutes
		mark(t, kv, "runs/", "b", start.Add(-45*time.Minute)) // due in 15 minutes
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Hour, Clear: c.clear, OnPass: log.onPass})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)

		time.Sleep(10 * time.Minute)
		synctest.Wait()
		assert.Equal(t, 1, log.len(), "no pass before the marker falls due")
		assert.Zero(t, c.total())

		time.Sleep(dueSlack)
		synctest.Wait()
		require.Equal(t, 2, log.len(), "a pass right after the marker falls due")
		assert.Equal(t, 1, c.count("a"))
		assert.Equal(t, start.Add(10*time.Minute+dueSlack), log.start(1))
		assert.Equal(t, dueSlack, log.stat(1).MaxLag, "cleared 1ms after falling due")

		time.Sleep(5 * time.Minute)
		synctest.Wait()
		require.Equal(t, 3, log.len())
		assert.Equal(t, 1, c.count("b"))
		assert.Equal(t, start.Add(15*time.Minute+dueSlack), log.start(2))
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

func TestRunIntervalCapsTheSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		c := newClears()
		var log passLog
		start := time.Now()
		s, err := New(kv, Config{Prefix: "runs/", Retention: 24 * time.Hour, Interval: time.Minute, Clear: c.clear, OnPass: log.onPass})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		synctest.Wait()

		// A marker written out of order (backdated past its retention) after
		// the first pass waits at most one Interval.
		mark(t, kv, "runs/", "late", start.Add(-48*time.Hour))
		mark(t, kv, "runs/", "fresh", start)
		time.Sleep(time.Minute)
		synctest.Wait()
		require.Equal(t, 2, log.len())
		assert.Equal(t, start.Add(time.Minute), log.start(1))
		assert.Equal(t, 1, c.count("late"))

		time.Sleep(3 * time.Minute)
		synctest.Wait()
		assert.Equal(t, 5, log.len(), "one pass per Interval while nothing falls due")
		assert.Zero(t, c.count("fresh"))
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

func TestRunDefaultIntervalIsRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log passLog
		s, err := New(NewMemKV(), Config{Prefix: "runs/", Retention: 10 * time.Second, Clear: newClears().clear, OnPass: log.onPass})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		time.Sleep(35 * time.Second)
		synctest.Wait()
		assert.Equal(t, 4, log.len(), "passes at 0s, 10s, 20s, 30s")
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

func TestRunBacksOffAfterFailedPasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := &fakeKV{canPut: true, MemKV: NewMemKV(), onScan: func(_ context.Context, call int64) error {
			if call <= 8 {
				return errBoom
			}
			return nil
		}}
		var log passLog
		start := time.Now()
		s, err := New(kv.store(), Config{Prefix: "runs/", Retention: time.Hour, Interval: 10 * time.Second, Clear: newClears().clear, OnPass: log.onPass})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		require.ErrorIs(t, stop(), context.Canceled)

		// Backoff 1s, 2s, 4s, 8s, then capped at the 10s Interval.
		want := []time.Duration{0, 1, 3, 7, 15, 25, 35, 45}
		require.GreaterOrEqual(t, log.len(), len(want)+2)
		for i, w := range want {
			assert.Equal(t, start.Add(w*time.Second), log.start(i), "pass %d", i)
			assert.ErrorIs(t, log.err(i), errBoom, "pass %d", i)
		}
		assert.NoError(t, log.err(len(want)), "the store recovered")
		assert.Equal(t, start.Add(55*time.Second), log.start(len(want)))
		assert.Equal(t, start.Add(65*time.Second), log.start(len(want)+1), "back to the Interval after a success")
	})
}

func TestRunStopsPromptly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		for i := range 10 {
			mark(t, kv, "runs/", "s"+string(rune('a'+i)), time.Now().Add(-2*time.Hour))
		}
		ctx, cancel := context.WithCancel(t.Context())
		release := make(chan struct{})
		var log passLog
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, Clear: func(ctx context.Context, id string) error {
			if id == "sc" {
				cancel()
				<-release
			}
			return ctx.Err()
		}, OnPass: log.onPass})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		close(release)
		require.ErrorIs(t, <-done, context.Canceled)
		require.Equal(t, 1, log.len())
		assert.ErrorIs(t, log.err(0), context.Canceled)
		assert.Equal(t, 10, kv.Len(), "the cancelled page deletes nothing")
	})
}

func TestRunAlreadyCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		s, err := New(NewMemKV(), Config{Prefix: "runs/", Retention: time.Hour, Clear: newClears().clear})
		require.NoError(t, err)
		require.ErrorIs(t, s.Run(ctx), context.Canceled)
	})
}
