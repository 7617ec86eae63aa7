package retentionprom_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
)

// A sweep under a delete budget reports the time its clears waited for it,
// and a batch sweep the batch size it ended its pass with.
func TestBudgetWaitAndBatchSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := retentionprom.New(retentionprom.Options{})
		require.NoError(t, err)
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		mem := retention.NewMemKV()
		for i := range 300 {
			key, err := retention.MarkerKey("jobs/", time.Now().Add(-2*time.Hour), fmt.Sprintf("j%03d", i))
			require.NoError(t, err)
			require.NoError(t, mem.Put(context.Background(), key, nil))
		}
		s, err := retention.New(mem, retention.Config{Prefix: "jobs/", Retention: time.Hour, Observer: c, BatchSize: 50,
			Limiter:    rate.NewLimiter(100, 50),
			ClearBatch: func(context.Context, []string) error { return nil }})
		require.NoError(t, err)
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 300, st.Cleared)
		wait := gather(t, reg, "retention_budget_wait_seconds_total", map[string]string{"prefix": "jobs/"})
		assert.InDelta(t, st.BudgetWait.Seconds(), wait, 1e-9)
		assert.GreaterOrEqual(t, wait, 2.4, "250 entities past the burst at 100 a second")
		assert.Equal(t, float64(50), gather(t, reg, "retention_batch_size", map[string]string{"prefix": "jobs/"}))
	})
}
