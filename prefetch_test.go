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

// aheadKV closes scanned at its second Scan: the read of the next page.
type aheadKV struct {
	*MemKV
	scans   atomic.Int32
	scanned chan struct{}
}

func (k *aheadKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if k.scans.Add(1) == 2 {
		close(k.scanned)
	}
	return k.MemKV.Scan(ctx, start, end, limit)
}

// TestNextPageReadWhileClearing: the next page is read while the current
// one is cleared, and pages are still cleared in order.
func TestNextPageReadWhileClearing(t *testing.T) {
	t.Parallel()
	kv := &aheadKV{MemKV: NewMemKV(), scanned: make(chan struct{})}
	var order []string
	readAhead := false
	s, clock := newSweep(t, kv, Config{PageSize: 10, Clear: func(_ context.Context, id string) error {
		if id == "m00" { // the first Clear waits for the read of page 2
			select {
			case <-kv.scanned:
				readAhead = true
			case <-time.After(10 * time.Second):
			}
		}
		order = append(order, id)
		return nil
	}})
	for i := range 55 {
		mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.True(t, readAhead, "the next page was read during a Clear of the first")
	assert.Equal(t, 55, st.Cleared)
	assert.Equal(t, 6+1+1, st.ScanCalls, "6 pages, the peek and the retry range")
	for i := range order {
		require.Equal(t, fmt.Sprintf("m%02d", i), order[i], "oldest first, page after page")
	}
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
