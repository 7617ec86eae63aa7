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

// orderKV counts the Scans that ran while a Clear was running.
type orderKV struct {
	*MemKV
	mu         sync.Mutex
	overlapped int
	clearing   atomic.Bool
}

func (o *orderKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if o.clearing.Load() {
		o.mu.Lock()
		o.overlapped++
		o.mu.Unlock()
	}
	return o.MemKV.Scan(ctx, start, end, limit)
}

// TestNextPageReadWhileClearing: the next page is read while the current
// one is cleared, pages are still cleared in order, and a store failure of
// the read ahead fails the pass only after the current page is settled.
func TestNextPageReadWhileClearing(t *testing.T) {
	t.Parallel()
	kv := &orderKV{MemKV: NewMemKV()}
	var order []string
	s, clock := newSweep(t, kv, Config{PageSize: 10, Clear: func(_ context.Context, id string) error {
		kv.clearing.Store(true)
		time.Sleep(200 * time.Microsecond) // a Clear with I/O of its own
		kv.clearing.Store(false)
		order = append(order, id)
		return nil
	}})
	for i := range 55 {
		mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 55, st.Cleared)
	assert.Equal(t, 6+1, st.ScanCalls, "6 pages and the peek")
	assert.Equal(t, 55+0, st.Scanned)
	for i := range order {
		require.Equal(t, fmt.Sprintf("m%02d", i), order[i], "oldest first, page after page")
	}
	assert.Positive(t, kv.overlapped, "the next page was read during a Clear")
	assert.Zero(t, kv.Len())
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
