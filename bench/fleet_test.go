package bench_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/bench"
	"github.com/marksweep/retention/kvtest"
)

// smallFleet is a cell that takes about a second: 2 replicas of 4 shards.
func smallFleet() bench.Fleet {
	return bench.Fleet{
		Replicas: 2, Shards: 4, Concurrency: 2, Slots: 2, ClearTime: time.Millisecond,
		Backlog: 5000, Window: 300 * time.Millisecond, Heartbeat: 50 * time.Millisecond, TTL: 3 * time.Second,
	}
}

// checkFleet runs smallFleet on store, then a cell whose backlog runs dry,
// and checks that each left nothing behind: leftovers lists what a cell
// may have left.
func checkFleet(t *testing.T, store bench.FleetStore, leftovers func() []string) {
	ctx := context.Background()
	before := leftovers()
	res, err := bench.RunFleet(ctx, store, smallFleet(), func(s string) { t.Log(s) })
	require.NoError(t, err)
	assert.Positive(t, res.Cleared, "cleared in the window")
	assert.InDelta(t, float64(res.Cleared)/res.Window.Seconds(), res.Rate, 1, "Rate")
	assert.Equal(t, []int{2, 2}, res.Held, "shards held in the window")
	assert.Positive(t, res.MinLeft, "fewest markers left in a shard")
	assert.GreaterOrEqual(t, res.Sleep, time.Millisecond, "Clear's wait")
	assert.Equal(t, before, leftovers(), "left behind")

	dry := smallFleet()
	dry.Backlog = 40
	_, err = bench.RunFleet(ctx, store, dry, func(s string) { t.Log(s) })
	require.ErrorContains(t, err, "ran out of markers")
	assert.Equal(t, before, leftovers(), "left behind by the cell that ran dry")
}

func TestPGFleet(t *testing.T) {
	dsn := kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	checkFleet(t, bench.NewPGFleet(pool, dsn, time.Second), func() []string {
		rows, err := pool.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench\_fleet\_%' ORDER BY 1`)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	})
}

func TestClusterFleet(t *testing.T) {
	addrs := strings.Split(kvtest.ServerAddr(t, "RETENTION_REDIS_CLUSTER"), ",")
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { assert.NoError(t, rdb.Close()) })
	store := bench.NewClusterFleet(rdb, addrs, time.Second)
	checkFleet(t, store, func() []string {
		var (
			mu   sync.Mutex // ForEachMaster calls at once
			keys []string
		)
		require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			ks, err := m.Keys(ctx, "*bench-fleet-*").Result()
			mu.Lock()
			keys = append(keys, ks...)
			mu.Unlock()
			return err
		}))
		slices.Sort(keys)
		return keys
	})

	// Three masters, 6 shards: 2 each, 600 markers each, in sets alike.
	ms, err := bench.ClusterMarkerMemory(ctx, store, 6, 1800)
	require.NoError(t, err)
	require.Len(t, ms, 3, "masters")
	total := 0
	for _, m := range ms {
		assert.Equal(t, 2, m.Shards, "%s's shards", m.Addr)
		assert.InDelta(t, 600, m.Markers, 90, "%s's markers", m.Addr)
		assert.Positive(t, m.Bytes, "%s's MEMORY USAGE", m.Addr)
		total += m.Markers
	}
	assert.Equal(t, 1800, total, "markers")
}
