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

// TestNextPageRead: whatever the Concurrency, the next page is read while
// the current one's clears run, and pages are cleared in order, each
// deleted before the next one's clears.
func TestNextPageRead(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			t.Parallel()
			// Scan 3 reads page 3, while page 2's clears run.
			kv := &aheadKV{MemKV: NewMemKV(), at: 3, scanned: make(chan struct{})}
			var mu sync.Mutex
			var order []string
			var during bool
			var leftAtPage2 int
			s, _ := newSweep(t, kv, Config{PageSize: 10, Concurrency: concurrency, Clear: func(_ context.Context, id string) error {
				if id == "m10" {
					leftAtPage2 = kv.Len()
					select {
					case <-kv.scanned:
						during = true
					case <-time.After(10 * time.Second):
					}
				}
				mu.Lock()
				order = append(order, id)
				mu.Unlock()
				return nil
			}})
			for i := range 55 {
				mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			s.clock.(*ManualClock).Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.True(t, during, "the next page was read during a Clear")
			assert.Equal(t, 45, leftAtPage2, "page 1 deleted before page 2's clears")
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
// page is read (during the current page's clears) makes Pass panic on its
// caller's goroutine, not the process, and leaves no worker behind.
func TestPanicOfNextPageReadReachesCaller(t *testing.T) {
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			kv := &aheadKV{MemKV: NewMemKV(), scanned: make(chan struct{}), panicAt: 3}
			s, clock := newSweep(t, kv, Config{PageSize: 10, Concurrency: concurrency, Clear: func(context.Context, string) error { return nil }})
			for i := range 35 {
				mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			assert.PanicsWithValue(t, "store panicked", func() { _, _ = s.Pass(context.Background()) })
			assert.Equal(t, 25, kv.Len(), "the page before the panic settled")
			kv.panicAt = 0
			st, err := s.Pass(context.Background())
			require.NoError(t, err, "the sweep is usable after the panic")
			assert.Zero(t, kv.Len(), "Pass() left %d markers (cleared %d)", kv.Len(), st.Cleared)
		})
	}
}
