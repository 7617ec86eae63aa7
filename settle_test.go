package retention

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cancelAfterCommitKV is an atomicKV whose first call commits and then
// cancels the pass, as a SIGTERM landing just after a commit.
type cancelAfterCommitKV struct {
	*atomicKV
	cancel context.CancelFunc
	once   sync.Once
}

func (c *cancelAfterCommitKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	err := c.atomicKV.ClearAndDelete(ctx, ids, keys)
	c.once.Do(c.cancel)
	return err
}

// TestCancelledPassMaxLagIsOldestCleared: what a cancelled page's
// ClearDeleter committed is counted with the lag of the oldest entity
// cleared, though retry-range items are in retry-time order, not finish
// order.
func TestCancelledPassMaxLagIsOldestCleared(t *testing.T) {
	t.Parallel()
	base := &atomicKV{MemKV: NewMemKV(), entities: map[string]bool{}, cleared: map[string]int{}, poison: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv := &cancelAfterCommitKV{atomicKV: base, cancel: cancel}
	s, clock := newSweep(t, kv, Config{})
	now := t0.Add(3 * time.Hour)
	clock.Set(now)
	// Two requeued markers (attempts 0: one batch), the newer entity first.
	for _, m := range []struct {
		at, finished time.Time
		id           string
	}{{now.Add(-2 * time.Second), t0.Add(90 * time.Minute), "newer"}, {now.Add(-time.Second), t0, "older"}} {
		key := appendRetryKey(nil, "runs/", 0, m.at.UnixMilli(), m.finished.UnixMilli(), 0, m.id)
		require.NoError(t, base.MemKV.Put(context.Background(), key, nil))
		base.entities[m.id] = true
	}
	st, err := s.Pass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, st.Cleared)
	assert.Equal(t, 2*time.Hour, st.MaxLag, "MaxLag is the lag of the oldest entity cleared (older: due t0+1h)")
}
