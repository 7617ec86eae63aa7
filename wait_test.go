package retention

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunNeverSpins: markers and settings at the ends of time's range make
// Run wait as long as its Interval allows, not zero: the number of passes
// in ten minutes stays bounded.
func TestRunNeverSpins(t *testing.T) {
	far := MaxMarkerTime // what the year-9999 case writes
	tests := []struct {
		name      string
		cfg       Config
		markAt    time.Time // zero: no marker
		rawKey    string    // written as is, when set
		group     bool
		maxPasses int
	}{
		{"marker in the year 9999", Config{Retention: time.Hour}, far, "", false, 11},
		{"marker from seconds taken for milliseconds", Config{Retention: time.Hour}, time.Time{}, "runs/01795000000000000000/a", false, 11},
		{"retention near the largest Duration", Config{Retention: maxDuration - time.Millisecond}, time.Unix(1, 0), "", false, 11},
		{"retention near the largest Duration, no Interval cap", Config{Retention: maxDuration - time.Millisecond, Interval: maxDuration}, time.Unix(1, 0), "", false, 1},
		{"huge Interval and full Jitter", Config{Retention: time.Hour, Interval: maxDuration, Jitter: 1}, far, "", false, 1},
		{"huge Interval, full Jitter, empty store", Config{Retention: time.Hour, Interval: maxDuration - 1, Jitter: 1}, time.Time{}, "", false, 1},
		{"group with a marker in the year 9999", Config{Retention: time.Hour}, far, "", true, 11},
		{"group with huge Interval and full Jitter", Config{Retention: time.Hour, Interval: maxDuration, Jitter: 1}, far, "", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				kv := NewMemKV()
				if !tt.markAt.IsZero() {
					mark(t, kv, "runs/", "far", tt.markAt)
				}
				if tt.rawKey != "" {
					require.NoError(t, kv.Put(t.Context(), []byte(tt.rawKey), nil))
				}
				var passes atomic.Int64
				cfg := tt.cfg
				cfg.Prefix = "runs/"
				cfg.Clear = func(context.Context, string) error { return nil }
				cfg.OnPass = func(Stats, error) { passes.Add(1) }
				jitter := cfg.Jitter
				if tt.group {
					cfg.Jitter = 0
				}
				s, err := New(kv, cfg)
				require.NoError(t, err)
				run := s.Run
				if tt.group {
					g, err := NewGroup(GroupConfig{Jitter: jitter}, s)
					require.NoError(t, err)
					run = g.Run
				}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- run(ctx) }()
				time.Sleep(10 * time.Minute)
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
				assert.LessOrEqual(t, passes.Load(), int64(tt.maxPasses))
				assert.GreaterOrEqual(t, passes.Load(), int64(1))
			})
		})
	}
}

// TestWaitArithmeticSaturates checks the computed waits at the edges.
func TestWaitArithmeticSaturates(t *testing.T) {
	t.Parallel()
	l := &loop{jitter: 1}
	for _, d := range []time.Duration{maxDuration, maxDuration - 1, maxDuration / 2, maxDuration/2 + 1} {
		for range 100 {
			got := l.jittered(d)
			require.GreaterOrEqual(t, got, d, "jittered(%v)", d)
		}
	}
	assert.Equal(t, maxDuration, addSat(maxDuration-1, time.Millisecond))
	assert.Equal(t, 3*time.Second, addSat(time.Second, 2*time.Second))

	s, clock := newSweep(t, NewMemKV(), Config{Interval: maxDuration, Clear: func(context.Context, string) error { return nil }})
	for _, due := range []time.Time{MaxMarkerTime, time.Unix(1<<62, 0), clock.Now().Add(maxDuration)} {
		assert.Equal(t, maxDuration, s.untilDue(Stats{NextDue: due}), "untilDue(%v)", due)
	}
	assert.Zero(t, s.untilDue(Stats{NextDue: clock.Now().Add(-time.Hour)}))
}

// TestRunIdleFloor: a store that keeps showing a due marker that no pass
// can clear (a KV that breaks Scan's end bound, say) does not make Run spin.
func TestRunIdleFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		var passes atomic.Int64
		s, err := New(stuckDueKV{kv}, Config{Prefix: "runs/", Retention: time.Hour,
			Clear:  func(context.Context, string) error { return nil },
			OnPass: func(Stats, error) { passes.Add(1) }})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		time.Sleep(time.Second)
		require.ErrorIs(t, stop(), context.Canceled)
		assert.LessOrEqual(t, passes.Load(), int64(time.Second/minWait)+1)
		assert.Greater(t, passes.Load(), int64(10), "and it does keep looking")
	})
}

// stuckDueKV answers every peek with a marker that fell due an hour ago but
// never shows it in the expired range.
type stuckDueKV struct{ *MemKV }

func (k stuckDueKV) Scan(_ context.Context, start, _ []byte, limit int) ([][]byte, error) {
	if limit == 1 { // the peek
		key, err := MarkerKey("runs/", time.Now().Add(-2*time.Hour), "ghost")
		return [][]byte{key}, err
	}
	return nil, nil
}

// TestForeignKeysStepped: keys under the prefix that are not markers cost a
// page per PageSize keys, not a round trip each, in the expired range and
// past it, and survive every pass.
func TestForeignKeysStepped(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := &fakeKV{canPut: true, MemKV: mem}
	c := newClears()
	s, _ := newSweep(t, kv.store(), Config{Clear: c.clear, PageSize: 100})
	ctx := context.Background()
	var foreign []string
	for i := range 1000 {
		foreign = append(foreign,
			fmt.Sprintf("runs/0000000000x%04d", i),           // sorts in the expired range
			fmt.Sprintf("runs/%020d/", i),                    // marker-like, no id
			fmt.Sprintf("runs/00000001794999999999x%04d", i), // past the expired range, before the next marker
			fmt.Sprintf("runs/00000001795000000000%04d", i))  // 24 digits, just as far
	}
	for _, k := range foreign {
		require.NoError(t, kv.Put(ctx, []byte(k), nil))
	}
	due := mark(t, mem, "runs/", "due", t0.Add(-2*time.Hour))
	later := mark(t, mem, "runs/", "later", t0.Add(30*time.Minute))
	for pass := range 5 {
		kv.reset()
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 4000, st.Foreign, "pass %d", pass)
		if pass == 0 {
			assert.Equal(t, 1, st.Cleared)
		}
		assert.Equal(t, t0.Add(30*time.Minute+time.Hour), st.NextDue, "the marker past the foreign keys is found")
		assert.LessOrEqual(t, kv.scans.Load(), int64(4000/100+4), "Scan calls, pass %d", pass)
		if pass == 0 {
			assert.Equal(t, int64(1), kv.deletes.Load(), "only the cleared marker is deleted")
		} else {
			assert.Zero(t, kv.deletes.Load())
		}
	}
	assert.False(t, has(t, mem, due))
	assert.True(t, has(t, mem, later))
	assert.Equal(t, 4001, mem.Len(), "every foreign key survives")
}

// TestDefaultLoggerBoundedPerPass: a nil Logger logs to slog.Default(), and
// a flood of failures makes a bounded number of lines per pass.
func TestDefaultLoggerBoundedPerPass(t *testing.T) {
	var buf syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	defer slog.SetDefault(prev)

	kv := NewMemKV()
	s, err := New(kv, Config{Prefix: "flood/", Retention: time.Hour, Clock: NewManualClock(t0),
		Clear: func(_ context.Context, id string) error {
			if strings.HasPrefix(id, "p") {
				panic("kaboom " + id)
			}
			return fmt.Errorf("downstream down for %s", id)
		}})
	require.NoError(t, err)
	for i := range 5000 {
		id := fmt.Sprintf("f%04d", i)
		if i%2 == 0 {
			id = fmt.Sprintf("p%04d", i)
		}
		mark(t, kv, "flood/", id, t0.Add(-2*time.Hour))
		require.NoError(t, kv.Put(t.Context(), []byte(fmt.Sprintf("flood/0000/%04d/data", i)), nil)) // foreign
		require.NoError(t, kv.Put(t.Context(), []byte(fmt.Sprintf("flood/%020d/bad id", i)), nil))
	}
	st, err := s.Pass(t.Context())
	require.NoError(t, err)
	require.Equal(t, 5000, st.Failed)
	require.Equal(t, 5000, st.Foreign, "%+v", st)
	require.Equal(t, 5000, st.Malformed)
	out := buf.String()
	lines := strings.Count(out, "\n")
	assert.LessOrEqual(t, lines, 4, "one line per kind of trouble:\n%s", out)
	assert.Contains(t, out, "level=ERROR msg=\"retention: clears failed")
	assert.Contains(t, out, "failed=2500")
	assert.Contains(t, out, "panicked=2500")
	assert.Contains(t, out, "kaboom", "examples carry the errors")
	assert.Contains(t, out, "level=WARN msg=\"retention: deleted malformed markers")
	assert.Contains(t, out, "malformed=5000")
	assert.Contains(t, out, "foreign=5000")
	assert.Contains(t, out, "prefix=flood/")
	assert.Less(t, len(out), 64<<10, "bounded volume")
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func (b *syncBuffer) lock() {
	if b.mu == nil {
		b.mu = make(chan struct{}, 1)
	}
	b.mu <- struct{}{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.lock()
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.lock()
	defer func() { <-b.mu }()
	return b.buf.String()
}

// TestForeignWarnedOnChange: a foreign key that stays is not warned about
// at every pass, only when the count changes and once an hour.
func TestForeignWarnedOnChange(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	kv := NewMemKV()
	s, clock := newSweep(t, kv, Config{Clear: func(context.Context, string) error { return nil },
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	require.NoError(t, kv.Put(t.Context(), []byte("runs/0042/state"), nil))
	warns := func() int { return strings.Count(buf.String(), "level=WARN") }
	steps := []struct {
		advance time.Duration
		add     string
		want    int
	}{
		{0, "", 1},                          // first sight
		{time.Minute, "", 1},                // same count: quiet
		{time.Minute, "runs/0043/state", 2}, // count changed
		{time.Minute, "", 2},                // quiet again
		{time.Hour, "", 3},                  // an hour on: reminded
	}
	for i, step := range steps {
		clock.Advance(step.advance)
		if step.add != "" {
			require.NoError(t, kv.Put(t.Context(), []byte(step.add), nil))
		}
		_, err := s.Pass(t.Context())
		require.NoError(t, err)
		assert.Equal(t, step.want, warns(), "step %d", i)
	}
}

type instantLostLease struct{ lost chan struct{} }

func (l instantLostLease) Lost() <-chan struct{}         { return l.lost }
func (l instantLostLease) Release(context.Context) error { return nil }

// instantLostLocker hands out leases that are lost at once, as a TTL
// shorter than the round trip that takes them would.
type instantLostLocker struct{ n atomic.Int64 }

func (f *instantLostLocker) TryAcquire(context.Context) (Lease, error) {
	f.n.Add(1)
	c := make(chan struct{})
	close(c)
	return instantLostLease{c}, nil
}

type heldLocker struct{ n atomic.Int64 }

func (h *heldLocker) TryAcquire(context.Context) (Lease, error) {
	h.n.Add(1)
	return nil, ErrLeaseHeld
}

// TestRunNeverSpinsOnFailures: failed passes, a lease held elsewhere and a
// lease lost as soon as it is taken make Run wait at least minWait, even
// with an Interval of a nanosecond.
func TestRunNeverSpinsOnFailures(t *testing.T) {
	const most = int64(time.Second/minWait) + 1
	tests := []struct {
		name  string
		kv    func() KV
		lease func() (Locker, *atomic.Int64)
	}{
		{"failing store", func() KV { return (&fakeKV{canPut: true, MemKV: NewMemKV(), onScan: failWith(errBoom)}).store() }, nil},
		{"lease held elsewhere", func() KV { return NewMemKV() }, func() (Locker, *atomic.Int64) { l := &heldLocker{}; return l, &l.n }},
		{"lease lost at once", func() KV { return NewMemKV() }, func() (Locker, *atomic.Int64) { l := &instantLostLocker{}; return l, &l.n }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var passes atomic.Int64
				cfg := Config{Prefix: "runs/", Retention: time.Hour, Interval: time.Nanosecond,
					Clear:  func(context.Context, string) error { return nil },
					OnPass: func(Stats, error) { passes.Add(1) }}
				var acquires *atomic.Int64
				if tt.lease != nil {
					cfg.Lease, acquires = tt.lease()
				}
				s, err := New(tt.kv(), cfg)
				require.NoError(t, err)
				stop := runInBackground(t.Context(), s)
				time.Sleep(time.Second)
				require.ErrorIs(t, stop(), context.Canceled)
				assert.LessOrEqual(t, passes.Load(), most)
				if acquires != nil {
					assert.LessOrEqual(t, acquires.Load(), most)
					assert.Greater(t, acquires.Load(), int64(1))
				}
			})
		})
	}
}
