package bench_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/bench"
	"github.com/marksweep/retention/kvtest"
)

// TestPoisonScenario runs a small poison scenario and checks the harness's
// own bookkeeping, not the sweep's figures, which are what it measures:
// every job is cleared once and never early, the database logged each one,
// and the tables print.
func TestPoisonScenario(t *testing.T) {
	dsn := kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	const jobs = 400
	r, err := bench.RunPoison(ctx, pool, bench.Poison{
		Name: "small", Jobs: jobs, Rate: 400, Retention: 500 * time.Millisecond,
		BatchSize: 50, PageSize: 100, Replicas: 2,
		Poison: 0.01, PoisonFor: 300 * time.Millisecond, Locked: 0.005, LockFor: 300 * time.Millisecond,
		Drain: 20 * time.Second, Seed: 1,
	}, func(s string) { t.Log(s) })
	require.NoError(t, err)
	assert.Equal(t, 4, r.PoisonJobs)
	assert.Equal(t, 2, r.LockedJobs)
	assert.Equal(t, jobs, r.All.Cleared, "jobs the database logged as deleted")
	assert.Equal(t, jobs-6, r.Healthy.Cleared)
	assert.Zero(t, r.JobsLeft)
	assert.Zero(t, r.MarkersLeft)
	assert.Zero(t, r.ClearedTwice)
	assert.Zero(t, r.Early)
	assert.Equal(t, jobs, r.Sweep.Cleared)
	assert.Len(t, r.Lags, jobs)
	assert.Positive(t, r.Samples)

	var buf bytes.Buffer
	require.NoError(t, bench.PoisonTables(&buf, []bench.PoisonResult{r}))
	assert.Contains(t, buf.String(), "| small | 394 |")
}
