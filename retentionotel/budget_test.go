package retentionotel_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"golang.org/x/time/rate"

	"github.com/marksweep/retention"
)

// A sweep under a delete budget records the time its clears waited for it,
// and a batch sweep the batch size it ended its pass with.
func TestBudgetWaitAndBatchSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o, reader := newObserver(t)
		mem := retention.NewMemKV()
		for i := range 300 {
			key, err := retention.MarkerKey("jobs/", time.Now().Add(-2*time.Hour), fmt.Sprintf("j%03d", i))
			require.NoError(t, err)
			require.NoError(t, mem.Put(context.Background(), key, nil))
		}
		s, err := retention.New(mem, retention.Config{Prefix: "jobs/", Retention: time.Hour, Observer: o, BatchSize: 50,
			Limiter: rate.NewLimiter(100, 50), Logger: quiet,
			ClearBatch: func(context.Context, []string) error { return nil }})
		require.NoError(t, err)
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 300, st.Cleared)
		ms := collect(t, reader)
		wait, ok := ms["retention.budget.wait"].Data.(metricdata.Sum[float64])
		require.True(t, ok)
		require.Len(t, wait.DataPoints, 1)
		assert.InDelta(t, st.BudgetWait.Seconds(), wait.DataPoints[0].Value, 1e-9)
		assert.GreaterOrEqual(t, wait.DataPoints[0].Value, 2.4, "250 entities past the burst at 100 a second")
		size, ok := ms["retention.batch.size"].Data.(metricdata.Gauge[int64])
		require.True(t, ok)
		require.Len(t, size.DataPoints, 1)
		assert.Equal(t, int64(50), size.DataPoints[0].Value)
	})
}
