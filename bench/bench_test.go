package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/marksweep/retention/bench"
	"github.com/marksweep/retention/kvtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// smallBacklog keeps the smoke tests fast under -race.
const smallBacklog = 300

func TestPGContendersClearEverything(t *testing.T) {
	dsn := kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 72
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	p, err := bench.NewPG(ctx, pool, fmt.Sprintf("bench_test_%d", rand.Uint32()))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close(context.Background())) })
	p.Timing = &bench.Timing{}

	for _, c := range p.Contenders() {
		rate, err := bench.Once(ctx, c, smallBacklog)
		require.NoError(t, err, c.Name)
		assert.Positive(t, rate, c.Name)
	}
	assert.Contains(t, p.Timing.String(), "scan")
}

func TestRedisContendersClearEverything(t *testing.T) {
	addr := kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR")
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 72})
	t.Cleanup(func() { assert.NoError(t, rdb.Close()) })
	r, err := bench.NewRedis(rdb, fmt.Sprintf("bench:test:%d:", rand.Uint32()))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, r.Close(context.Background())) })

	for _, c := range r.Contenders(smallBacklog) {
		rate, err := bench.Once(ctx, c, smallBacklog)
		require.NoError(t, err, c.Name)
		assert.Positive(t, rate, c.Name)
	}
}

// TestOnceRefusesAShortClear checks that a contender deleting fewer
// entities than it was given fails rather than reporting a rate.
func TestOnceRefusesAShortClear(t *testing.T) {
	t.Parallel()
	c := bench.Contender{
		Name:  "short",
		Setup: func(context.Context, int) error { return nil },
		Clear: func(context.Context) (int, error) { return 9, nil },
		Check: func(context.Context) error { return nil },
	}
	_, err := bench.Once(context.Background(), c, 10)
	require.ErrorContains(t, err, "cleared 9 entities, want 10")
}

func TestRunRotatesAndTableRatios(t *testing.T) {
	t.Parallel()
	var order []string
	contender := func(name string) bench.Contender {
		return bench.Contender{
			Name:  name,
			Setup: func(context.Context, int) error { return nil },
			Clear: func(_ context.Context) (int, error) { order = append(order, name); return 1, nil },
			Check: func(context.Context) error { return nil },
		}
	}
	res, err := bench.Run(context.Background(), []bench.Contender{contender("a"), contender("b"), contender("c")}, 1, 3, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c", "b", "c", "a", "c", "a", "b"}, order)
	for _, r := range res {
		assert.Len(t, r.Rates, 3, r.Name)
	}

	a := bench.Result{Name: "a", Rates: []float64{100, 300, 200}}
	b := bench.Result{Name: "b", Rates: []float64{50, 100, 400}}
	if got := bench.Ratio(a, b); got != 2 {
		t.Errorf("Ratio() = %v, want 2 (the median of 2, 3, 0.5)", got)
	}
	var buf bytes.Buffer
	require.NoError(t, bench.Table(&buf, []bench.Result{a, b}, bench.Baseline{Label: "b", Name: "b"}, bench.Baseline{Label: "none", Name: "missing"}))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 4)
	assert.Equal(t, "| contender | entities/s (median) | rounds: min – max | vs b |", lines[0])
	assert.Equal(t, "| a | 200 | 100 – 300 | 2.00× |", lines[2])

	buf.Reset()
	slow := bench.Result{Name: "slow", Rates: []float64{1, 1, 1}}
	require.NoError(t, bench.Table(&buf, []bench.Result{slow, b}, bench.Baseline{Label: "b", Name: "b"}))
	assert.Contains(t, buf.String(), "| slow | 1 | 1 – 1 | 0.01× |", "small ratios keep two significant digits")
}

func TestRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   float64
		want string
	}{{3.9e6, "3.90 M"}, {830e3, "830 k"}, {950, "950"}} {
		if got := bench.Rate(tc.in); got != tc.want {
			t.Errorf("Rate(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRunMeteredRecordsCPUPerEntity: with a CPUMeter, each round records
// the server's CPU time over the timed Clear divided by the entities, and
// the table gives it beside the client's, with the baseline's CPU time
// over the contender's.
func TestRunMeteredRecordsCPUPerEntity(t *testing.T) {
	t.Parallel()
	var server time.Duration // what the fake server has used so far
	contender := func(name string, cost time.Duration) bench.Contender {
		return bench.Contender{
			Name:  name,
			Setup: func(context.Context, int) error { server += time.Hour; return nil }, // not timed
			Clear: func(context.Context) (int, error) { server += cost; return 10, nil },
			Check: func(context.Context) error { return nil },
		}
	}
	meter := func() (time.Duration, error) { return server, nil }
	res, err := bench.RunMetered(context.Background(), []bench.Contender{contender("base", 40*time.Microsecond), contender("cheap", 10*time.Microsecond)}, 10, 3, meter, nil)
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{4 * time.Microsecond, 4 * time.Microsecond, 4 * time.Microsecond}, res[0].ServerCPU)
	assert.Equal(t, []time.Duration{time.Microsecond, time.Microsecond, time.Microsecond}, res[1].ServerCPU)
	assert.Len(t, res[1].ClientCPU, 3)

	for i := range res {
		res[i].Rates = []float64{1, 1, 1}
		res[i].ClientCPU = []time.Duration{0, 0, 0}
	}
	var buf bytes.Buffer
	require.NoError(t, bench.Table(&buf, res, bench.Baseline{Label: "base", Name: "base"}))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 4)
	assert.Equal(t, "| contender | entities/s (median) | rounds: min – max | vs base | server CPU/entity | client CPU/entity | CPU vs base |", lines[0])
	assert.Equal(t, "| cheap | 1 | 1 – 1 | 1.00× | 1.00 µs | ? | 4.00× |", lines[3])
}
