package retention

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNextPageRead: whatever the Concurrency, pages are cleared in order,
// each deleted before the next one is read, and the next is read only
// once the current one is settled.
func TestNextPageRead(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			t.Parallel()
			kv := newFakeKV(nil)
			var mu sync.Mutex
			var order []string
			var leftAtPage2 int
			var scansAtPage2 int64
			s, _ := newSweep(t, kv.store(), Config{PageSize: 10, Concurrency: concurrency, Clear: func(_ context.Context, id string) error {
				mu.Lock()
				defer mu.Unlock()
				if id == "m10" {
					leftAtPage2, scansAtPage2 = kv.Len(), kv.scans.Load()
				}
				order = append(order, id)
				return nil
			}})
			for i := range 55 {
				mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			s.clock.(*ManualClock).Set(t0.Add(2 * time.Hour))
			kv.reset()
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 45, leftAtPage2, "page 1 deleted before page 2's clears")
			assert.Equal(t, int64(2), scansAtPage2, "page 3 not read during page 2's clears")
			assert.Equal(t, 55, st.Cleared)
			assert.Equal(t, 6+1+1, st.ScanCalls, "6 pages, the peek and the retry range")
			if concurrency == 1 {
				for i := range order {
					require.Equal(t, fmt.Sprintf("m%02d", i), order[i], "oldest first, page after page")
				}
			}
			assert.Zero(t, kv.Len())
		})
	}
}

// TestNextPageReadFailure: a failing read of the next page fails the pass,
// once the current page is cleared and deleted.
func TestNextPageReadFailure(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := &fakeKV{canPut: true, MemKV: mem, onScan: func(_ context.Context, call int64) error {
		if call == 2 {
			return errBoom
		}
		return nil
	}}
	c := newClears()
	s, clock := newSweep(t, kv.store(), Config{PageSize: 10, Clear: c.clear})
	for i := range 25 {
		mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.ErrorIs(t, err, errBoom)
	assert.Equal(t, 10, st.Cleared)
	assert.Equal(t, 15, mem.Len())
	assert.Equal(t, 2, st.ScanCalls)
}

// TestPanicOfNextPageReadReachesCaller: a store that panics while the next
// page is read makes Pass panic on its caller's goroutine, not the process,
// and leaves no worker behind.
func TestPanicOfNextPageReadReachesCaller(t *testing.T) {
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			var panicAt atomic.Int64
			panicAt.Store(3)
			kv := newFakeKV(nil)
			kv.onScan = func(_ context.Context, call int64) error {
				if call == panicAt.Load() {
					panic("store panicked")
				}
				return nil
			}
			s, clock := newSweep(t, kv.store(), Config{PageSize: 10, Concurrency: concurrency, Clear: func(context.Context, string) error { return nil }})
			for i := range 35 {
				mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			assert.PanicsWithValue(t, "store panicked", func() { _, _ = s.Pass(context.Background()) })
			assert.Equal(t, 15, kv.Len(), "the two pages read before the panic settled")
			panicAt.Store(0)
			st, err := s.Pass(context.Background())
			require.NoError(t, err, "the sweep is usable after the panic")
			assert.Zero(t, kv.Len(), "Pass() left %d markers (cleared %d)", kv.Len(), st.Cleared)
		})
	}
}

// TestNextDueStepsOverForeignRetryKeys: the retry range's last read (the
// first key at or after its due end) steps over a foreign key, so NextDue
// is the retry behind it and Run does not sleep a whole Interval.
func TestNextDueStepsOverForeignRetryKeys(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	s, clock := newSweep(t, mem, Config{Clear: c.clear, RetryDelay: time.Second, MaxRetryDelay: time.Minute})
	mark(t, mem, "runs/", "x", t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Retried)
	retryAt := st.NextDue
	keys := keysUnder(t, mem, "runs/r")
	require.Len(t, keys, 1)
	// A foreign key just before the retry marker: 20 digits, then no '/'.
	foreign := fmt.Sprintf("runs/r%020dx", retryAt.UnixMilli()-1)
	require.NoError(t, mem.Put(context.Background(), []byte(foreign), nil))
	require.Less(t, foreign, keys[0])

	clock.Advance(100 * time.Millisecond) // a pass in between
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.ClearCalls)
	assert.Equal(t, retryAt, st.NextDue, "NextDue = %v, want the retry at %v", st.NextDue, retryAt)
}

// TestIdleGuessWithPanickingValidator: a first marker whose
// Config.ValidateID panics does not defeat the idle guess: an idle pass
// after an idle pass costs at most 3 Scan calls and one validator call.
func TestIdleGuessWithPanickingValidator(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	calls := 0
	s, _ := newSweep(t, kv, Config{
		Clear: func(context.Context, string) error { return nil },
		ValidateID: func(id string) error {
			calls++
			if id == "crashes" {
				panic("validator bug")
			}
			return nil
		}})
	mark(t, kv, "runs/", "crashes", t0.Add(time.Minute)) // not expired
	mark(t, kv, "runs/", "later", t0.Add(2*time.Minute))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	for range 3 {
		calls = 0
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, t0.Add(time.Minute+time.Hour), st.NextDue)
		assert.LessOrEqual(t, st.ScanCalls, 3, "an idle pass after an idle pass")
		assert.LessOrEqual(t, calls, 1, "validator calls in an idle pass")
	}
}

// TestIdleGuessSeesEverything: after idle passes, whatever lands before
// the first marker (an out-of-order marker, a requeued or foreign or
// malformed key, an expiry at the exact millisecond, a clock stepped back
// and forward, a due retry) is handled as the usual path would.
func TestIdleGuessSeesEverything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, kv, Config{Clear: c.clear, RetryDelay: time.Second})
	idle := func() Stats {
		t.Helper()
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		return st
	}
	mark(t, kv, "runs/", "b", t0.Add(10*time.Minute))
	idle()
	st := idle()
	require.Equal(t, 2, st.ScanCalls, "the idle guess is in use")
	require.Equal(t, t0.Add(10*time.Minute+time.Hour), st.NextDue)

	// Exactly Retention old: kept; one ms later: cleared.
	clock.Set(t0.Add(10*time.Minute + time.Hour))
	st = idle()
	assert.Zero(t, st.Cleared)
	assert.Equal(t, 2, st.ScanCalls)
	clock.Advance(time.Millisecond)
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, c.count("b"))

	// Idle again; a marker written out of order, expired at once.
	mark(t, kv, "runs/", "z", t0.Add(20*time.Hour))
	idle()
	require.Equal(t, 2, idle().ScanCalls)
	mark(t, kv, "runs/", "old", t0)
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, c.count("old"))

	// A foreign key before the markers: counted, never idle over it.
	idle()
	require.Equal(t, 2, idle().ScanCalls)
	require.NoError(t, kv.Put(ctx, []byte("runs/0-foreign"), nil))
	st = idle()
	assert.Equal(t, 1, st.Foreign)
	st = idle()
	assert.Equal(t, 1, st.Foreign)
	require.NoError(t, kv.Delete(ctx, []byte("runs/0-foreign")))
	idle()
	require.Equal(t, 2, idle().ScanCalls)

	// A malformed key (time past 9999) after the markers is never met; one
	// that is the first key (a bad id, not expired) is deleted.
	bad := []byte("runs/00000000000000000001/bad id")
	require.NoError(t, kv.Put(ctx, bad, nil))
	st = idle()
	assert.Equal(t, 1, st.Malformed)
	assert.False(t, has(t, kv, bad))

	// Clock stepped back a day, then forward: nothing early, nothing missed.
	idle()
	clock.Set(clock.Now().Add(-24 * time.Hour))
	st = idle()
	assert.Zero(t, st.Cleared)
	clock.Set(t0.Add(21*time.Hour + time.Millisecond))
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, c.count("z"))

	// A failed clear moves to the retry range; idle passes still try it.
	mark(t, kv, "runs/", "later", clock.Now().Add(time.Hour))
	mark(t, kv, "runs/", "flaky", t0)
	c.set("flaky", errBoom)
	st = idle()
	assert.Equal(t, 1, st.Failed)
	c.set("flaky", nil)
	idle()
	st = idle()
	require.Equal(t, 2, st.ScanCalls, "idle, with a retry pending")
	clock.Advance(2 * time.Second)
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 2, c.count("flaky"))
	assert.Equal(t, map[string]int{"later": 1}, markerIDs(t, kv, "runs/"))
}
