package retention

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// aheadKV closes scanned at its Scan number at, and makes every Scan
// after the first take delay.
type aheadKV struct {
	*MemKV
	at      int32
	delay   time.Duration
	scans   atomic.Int32
	scanned chan struct{}
	panicAt int32 // the Scan that panics, or 0
}

func (k *aheadKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	n := k.scans.Add(1)
	if n > 1 {
		time.Sleep(k.delay)
	}
	if n == k.at {
		close(k.scanned)
	}
	if n == k.panicAt {
		panic("store panicked")
	}
	return k.MemKV.Scan(ctx, start, end, limit)
}

// TestNextPageRead: with Concurrency 1 and a quick store, the walk's
// goroutine reads the next page once the current one is settled, its
// markers deleted; with a store whose reads are slow, it reads the next
// page on a goroutine of its own while it clears the current one. Either
// way pages are cleared in order.
func TestNextPageRead(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		delay time.Duration
		// The Clear of waitID waits until Scan number at started; the
		// quick store's never starts during a Clear.
		waitID string
		at     int32
		during bool
	}{
		{name: "quick store, after the page", waitID: "m10", at: 3, during: false},
		// Scan 2 (page 2) is slow: page 3 is read during page 2's clears.
		{name: "slow store, during the clears", delay: 2 * slowScan, waitID: "m10", at: 3, during: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kv := &aheadKV{MemKV: NewMemKV(), at: tt.at, delay: tt.delay, scanned: make(chan struct{})}
			var order []string
			var during bool
			var leftAtPage2 int
			// The sweep times its reads by its clock: a real one.
			s, _ := newSweep(t, kv, Config{PageSize: 10, Clock: SystemClock, Clear: func(_ context.Context, id string) error {
				if id == tt.waitID {
					leftAtPage2 = kv.Len()
					select {
					case <-kv.scanned:
						during = true
					case <-time.After(50 * time.Millisecond):
					}
				}
				order = append(order, id)
				return nil
			}})
			old := time.Now().Add(-2 * time.Hour)
			for i := range 55 {
				mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), old.Add(time.Duration(i)*time.Millisecond))
			}
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.during, during, "the next page was read during a Clear")
			assert.Equal(t, 45, leftAtPage2, "page 1 deleted before page 2's clears")
			assert.Equal(t, 55, st.Cleared)
			assert.Equal(t, 6+1+1, st.ScanCalls, "6 pages, the peek and the retry range")
			for i := range order {
				require.Equal(t, fmt.Sprintf("m%02d", i), order[i], "oldest first, page after page")
			}
			assert.Zero(t, kv.Len())
		})
	}
}

// TestReadAheadFailure: a failing read of the next page fails the pass, but
// the current page is cleared and deleted first.
func TestReadAheadFailure(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := &countingKV{KV: mem, scanErr: func(call int64) error {
		if call == 2 {
			return errBoom
		}
		return nil
	}}
	c := newClears()
	s, clock := newSweep(t, kv, Config{PageSize: 10, Clear: c.clear})
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
// page is read on a goroutine of its own (a slow store) makes Pass panic
// on its caller's goroutine, not the process, once the current page is
// settled.
func TestPanicOfNextPageReadReachesCaller(t *testing.T) {
	kv := &aheadKV{MemKV: NewMemKV(), delay: 2 * slowScan, scanned: make(chan struct{}), panicAt: 3}
	s, _ := newSweep(t, kv, Config{PageSize: 10, Clock: SystemClock, Clear: func(context.Context, string) error { return nil }})
	old := time.Now().Add(-2 * time.Hour)
	for i := range 35 {
		mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), old.Add(time.Duration(i)*time.Millisecond))
	}
	assert.PanicsWithValue(t, "store panicked", func() { _, _ = s.Pass(context.Background()) })
	assert.LessOrEqual(t, kv.Len(), 25, "the pages before the panic settled")
	kv.panicAt = 0
	st, err := s.Pass(context.Background())
	require.NoError(t, err, "the sweep is usable after the panic")
	assert.Zero(t, kv.Len(), "Pass() left %d markers (cleared %d)", kv.Len(), st.Cleared)
}
