package retention

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCancelledPassMaxLagIsOldestCleared: what a cancelled page's
// ClearDeleter committed is counted with the lag of the oldest entity
// cleared, though retry-range items are in retry-time order, not finish
// order.
func TestCancelledPassMaxLagIsOldestCleared(t *testing.T) {
	t.Parallel()
	base := atomicOver(NewMemKV())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv := cancelAfterFirstCommit(base, cancel)
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
