package pgkv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// The idle-pass scenario of TestVacuumAfterSweep and BenchmarkIdleAfterSweep:
// sweepN markers finish a millisecond apart from vacBase, waiting markers
// an hour later; with a one-hour retention, vacBefore expires none of them
// and vacAfter expires exactly the sweepN.
const (
	vacPrefix = "vac/"
	sweepN    = 100_000
)

var (
	vacBase   = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	vacBefore = vacBase.Add(time.Hour)
	vacAfter  = vacBase.Add(90 * time.Minute)
)

// lowerNaptime makes autovacuum visit every database each second instead of
// each minute, for the whole test cluster, until tb ends. It needs a
// superuser (the test script's role is one) and skips tb otherwise.
func lowerNaptime(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "ALTER SYSTEM SET autovacuum_naptime = '1s'"); err != nil {
		tb.Skipf("lowering autovacuum_naptime needs a superuser: %v", err)
	}
	_, err := pool.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(tb, err)
	tb.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "ALTER SYSTEM RESET autovacuum_naptime")
		assert.NoError(tb, err)
		_, err = pool.Exec(context.Background(), "SELECT pg_reload_conf()")
		assert.NoError(tb, err)
	})
}

// fillVacuumTable writes sweepN markers from vacBase and waiting markers an
// hour later, then vacuums and analyzes the table, as autovacuum would have
// done long before a real sweep.
func fillVacuumTable(tb testing.TB, pool *pgxpool.Pool, table string, waiting int) {
	tb.Helper()
	ctx := context.Background()
	insert := `INSERT INTO ` + table + ` SELECT convert_to($1 || lpad(($2::bigint + i)::text, 20, '0') || '/' || $3 || i, 'UTF8')
		FROM generate_series(0, $4::int - 1) AS i`
	_, err := pool.Exec(ctx, insert, vacPrefix, vacBase.UnixMilli(), "old-", sweepN)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, insert, vacPrefix, vacBefore.UnixMilli(), "new-", waiting)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, "VACUUM ANALYZE "+table)
	require.NoError(tb, err)
}

// idleScanBuffers returns the buffers (shared hits and reads) that the
// first Scan of an idle pass at now touches, from EXPLAIN (ANALYZE,
// BUFFERS): it counts the index pages walked, dead entries included, and
// does not depend on the machine's speed.
func idleScanBuffers(tb testing.TB, pool *pgxpool.Pool, table string, now time.Time) int {
	tb.Helper()
	cutoff := fmt.Sprintf("%s%020d", vacPrefix, now.Add(-time.Hour).UnixMilli())
	var out string
	err := pool.QueryRow(context.Background(), `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
		SELECT key FROM `+table+` WHERE key >= $1 AND key < $2 ORDER BY key LIMIT $3`,
		[]byte(vacPrefix+"0"), []byte(cutoff), 256).Scan(&out)
	require.NoError(tb, err)
	var plans []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		}
	}
	require.NoError(tb, json.Unmarshal([]byte(out), &plans))
	require.Len(tb, plans, 1)
	return plans[0].Plan.Hit + plans[0].Plan.Read
}

// vacuumStats reads what pg_stat_user_tables says of table: its dead rows
// and when autovacuum last finished with it.
func vacuumStats(tb testing.TB, pool *pgxpool.Pool, table string) (dead int64, last time.Time) {
	tb.Helper()
	var lastp *time.Time
	err := pool.QueryRow(context.Background(), `SELECT n_dead_tup, last_autovacuum FROM pg_stat_user_tables
		WHERE relid = $1::text::regclass`, table).Scan(&dead, &lastp)
	require.NoError(tb, err)
	if lastp != nil {
		last = *lastp
	}
	return dead, last
}

// waitAutovacuum waits up to timeout for autovacuum to finish with table
// after since, and reports whether it did. Callers keep autovacuum off for
// the table until since, so that run saw every row their sweep deleted.
func waitAutovacuum(tb testing.TB, pool *pgxpool.Pool, table string, since time.Time, timeout time.Duration) bool {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, last := vacuumStats(tb, pool, table); last.After(since) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func serverNow(tb testing.TB, pool *pgxpool.Pool) time.Time {
	tb.Helper()
	var now time.Time
	require.NoError(tb, pool.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&now))
	return now
}

func vacuumSweep(tb testing.TB, kv retention.KV, clock *retention.ManualClock) *retention.Sweep {
	tb.Helper()
	sw, err := retention.New(kv, retention.Config{
		Prefix: vacPrefix, Retention: time.Hour, PageSize: 1024, Clock: clock,
		Clear: func(context.Context, string) error { return nil },
	})
	require.NoError(tb, err)
	return sw
}

// TestMigrateSetsOptions checks the storage parameters Migrate gives a new
// table, an old one and one whose owner tuned it.
func TestMigrateSetsOptions(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	reloptions := func(table string) []string {
		var opts []string
		require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::text::regclass",
			table).Scan(&opts))
		return opts
	}
	catalogRow := func(table string) string {
		var xmin string
		require.NoError(t, pool.QueryRow(ctx, "SELECT xmin::text FROM pg_class WHERE oid = $1::text::regclass",
			table).Scan(&xmin))
		return xmin
	}
	want := strings.Split(strings.ReplaceAll(pgkv.MarkerTableOptions, " = ", "="), ", ")

	t.Run("new table", func(t *testing.T) {
		table := freshTable(t, pool)
		assert.ElementsMatch(t, want, reloptions(table))
		row := catalogRow(table)
		require.NoError(t, pgkv.Migrate(ctx, pool, table))
		assert.Equal(t, row, catalogRow(table), "a Migrate with nothing to set rewrote the catalog row")
	})
	t.Run("table of an older Migrate", func(t *testing.T) {
		table := freshTable(t, pool)
		_, err := pool.Exec(ctx, "ALTER TABLE "+table+" RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay)")
		require.NoError(t, err)
		require.Empty(t, reloptions(table))
		require.NoError(t, pgkv.Migrate(ctx, pool, table))
		assert.ElementsMatch(t, want, reloptions(table))
	})
	t.Run("tuned by its owner", func(t *testing.T) {
		table := freshTable(t, pool)
		_, err := pool.Exec(ctx, "ALTER TABLE "+table+" RESET (autovacuum_vacuum_cost_delay)")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_vacuum_threshold = 123, fillfactor = 90)")
		require.NoError(t, err)
		require.NoError(t, pgkv.Migrate(ctx, pool, table))
		assert.ElementsMatch(t, []string{"autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=123",
			"fillfactor=90", "autovacuum_vacuum_cost_delay=0"}, reloptions(table))
	})
	t.Run("not the owner", func(t *testing.T) {
		table := freshTable(t, pool)
		_, err := pool.Exec(ctx, "ALTER TABLE "+table+" RESET (autovacuum_vacuum_threshold)")
		require.NoError(t, err)
		role := table + "_app"
		_, err = pool.Exec(ctx, "CREATE ROLE "+role)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE "+role) })
		_, err = pool.Exec(ctx, "GRANT CREATE, USAGE ON SCHEMA public TO "+role)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "REVOKE CREATE, USAGE ON SCHEMA public FROM "+role) })
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "SET ROLE "+role)
		require.NoError(t, err)
		defer func() { _, _ = conn.Exec(ctx, "RESET ROLE") }()
		// In a transaction, to show that Migrate does not abort it with a
		// refused ALTER TABLE.
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := pgkv.Migrate(ctx, tx, table); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		})
		require.NoError(t, err)
		assert.NotContains(t, reloptions(table), "autovacuum_vacuum_threshold=2000")
	})
}

// TestVacuumAfterSweep sweeps 100,000 markers from a table where 500,000
// more wait: too few dead rows for PostgreSQL's default autovacuum (a fifth
// of the table), enough for Migrate's settings. It checks that the idle
// scan walks the dead index entries after the sweep, that autovacuum comes
// and removes them, and that the idle scan is back to a few pages. It
// lowers autovacuum_naptime to 1s for the test cluster while it runs.
func TestVacuumAfterSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 600,000 markers, sweeps 100,000 and waits for autovacuum")
	}
	pool := connect(t)
	lowerNaptime(t, pool)
	table := freshTable(t, pool)
	ctx := context.Background()
	// Off until the sweep is measured: with a naptime of 1s, autovacuum
	// could come in the middle of the sweep.
	_, err := pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = off)")
	require.NoError(t, err)
	fillVacuumTable(t, pool, table, 500_000)
	kv, err := pgkv.New(pool, table)
	require.NoError(t, err)

	before := idleScanBuffers(t, pool, table, vacBefore)
	clock := retention.NewManualClock(vacAfter)
	st, err := vacuumSweep(t, kv, clock).Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, sweepN, st.Cleared, "Pass() cleared")

	// The first idle scan finds the rows dead and marks their index entries
	// so; every later one still reads the pages that hold them.
	idleScanBuffers(t, pool, table, vacAfter)
	after := idleScanBuffers(t, pool, table, vacAfter)
	assert.Greater(t, after, 100, "idle scan buffers right after the sweep (before it: %d)", before)

	_, err = pool.Exec(ctx, "ALTER TABLE "+table+" RESET (autovacuum_enabled)")
	require.NoError(t, err)
	since := serverNow(t, pool)
	require.True(t, waitAutovacuum(t, pool, table, since, 45*time.Second), "autovacuum did not visit the table within 45s")
	vacuumed := idleScanBuffers(t, pool, table, vacAfter)
	assert.LessOrEqual(t, vacuumed, before+2, "idle scan buffers after autovacuum (before the sweep: %d, right after: %d)", before, after)
	t.Logf("idle scan buffers: %d before the sweep, %d right after, %d after autovacuum", before, after, vacuumed)
}

// BenchmarkIdleAfterSweep measures an idle pass before a sweep of 100,000
// markers, right after it, after waiting up to 15s for autovacuum, and
// after a manual VACUUM; on tables with Migrate's storage parameters and
// with PostgreSQL's defaults, while 10,000 or 1,000,000 other markers wait.
// Autovacuum is off for the table until the sweep is measured, then on,
// with autovacuum_naptime lowered to 1s for the cluster. Each sub-benchmark
// reports the buffers its idle scan touches (buffers/scan); after-sweep
// also reports the first idle pass (first-pass-ms), which visits the dead
// rows and marks their index entries dead.
func BenchmarkIdleAfterSweep(b *testing.B) {
	pool := connect(b)
	lowerNaptime(b, pool)
	ctx := context.Background()
	for _, waiting := range []int{10_000, 1_000_000} {
		for _, options := range []string{"defaults", "pgkv"} {
			b.Run(fmt.Sprintf("waiting=%d/options=%s", waiting, options), func(b *testing.B) {
				table := freshTable(b, pool)
				alter := func(set string) {
					_, err := pool.Exec(ctx, "ALTER TABLE "+table+" "+set)
					require.NoError(b, err)
				}
				if options == "defaults" {
					alter("RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay)")
				}
				alter("SET (autovacuum_enabled = off)")
				fillVacuumTable(b, pool, table, waiting)
				// Written out now, not by a checkpoint while "before" is timed.
				_, err := pool.Exec(ctx, "CHECKPOINT")
				require.NoError(b, err)
				kv, err := pgkv.New(pool, table)
				require.NoError(b, err)
				clock := retention.NewManualClock(vacBefore)
				sw := vacuumSweep(b, kv, clock)
				idle := func(name string, metrics map[string]float64) {
					b.Run(name, func(b *testing.B) {
						buffers := idleScanBuffers(b, pool, table, clock.Now())
						for b.Loop() {
							if st, err := sw.Pass(ctx); err != nil || st.Cleared != 0 {
								b.Fatalf("Pass() = %+v, %v; want nothing cleared", st, err)
							}
						}
						b.ReportMetric(float64(buffers), "buffers/scan")
						for unit, v := range metrics {
							b.ReportMetric(v, unit)
						}
					})
				}
				idle("before", nil)

				clock.Set(vacAfter)
				st, err := sw.Pass(ctx)
				require.NoError(b, err)
				require.Equal(b, sweepN, st.Cleared)
				start := time.Now()
				if st, err := sw.Pass(ctx); err != nil || st.Cleared != 0 {
					b.Fatalf("Pass() = %+v, %v; want nothing cleared", st, err)
				}
				first := time.Since(start)
				idle("after-sweep", map[string]float64{"first-pass-ms": float64(first.Microseconds()) / 1000})

				alter("RESET (autovacuum_enabled)")
				since := serverNow(b, pool)
				start = time.Now()
				ran := waitAutovacuum(b, pool, table, since, 15*time.Second)
				waited := time.Since(start)
				dead, _ := vacuumStats(b, pool, table)
				b.Logf("autovacuum ran: %v (waited %v); dead rows: %d", ran, waited.Round(time.Millisecond), dead)
				idle("after-wait", map[string]float64{"autovacuum-ran": map[bool]float64{false: 0, true: 1}[ran]})

				_, err = pool.Exec(ctx, "VACUUM "+table)
				require.NoError(b, err)
				idle("after-VACUUM", nil)
			})
		}
	}
}

// TestVacuumIndexCleanup sweeps 5,000 or 20,000 of 1,100,000 markers and
// runs VACUUM with vacuum_index_cleanup at its default (auto) and on. Since
// PostgreSQL 14, auto skips the index when the dead rows sit on fewer than
// 2% of the table's pages, which leaves their entries in the range the idle
// pass scans; on removes them. It logs how long each VACUUM took.
func TestVacuumIndexCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("fills three tables of 1,100,000 markers")
	}
	pool := connect(t)
	ctx := context.Background()
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	tests := []struct {
		cleanup string
		swept   int
	}{{"auto", 5_000}, {"auto", 20_000}, {"on", 5_000}}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("index_cleanup=%s/swept=%d", tt.cleanup, tt.swept), func(t *testing.T) {
			table := freshTable(t, pool)
			_, err := pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = off, vacuum_index_cleanup = "+tt.cleanup+")")
			require.NoError(t, err)
			fillVacuumTable(t, pool, table, 1_000_000)
			kv, err := pgkv.New(pool, table)
			require.NoError(t, err)
			// vacBefore expires nothing; each millisecond later, one more.
			now := vacBefore.Add(time.Duration(tt.swept) * time.Millisecond)
			st, err := vacuumSweep(t, kv, retention.NewManualClock(now)).Pass(ctx)
			require.NoError(t, err)
			require.Equal(t, tt.swept, st.Cleared, "Pass() cleared")
			idleScanBuffers(t, pool, table, now) // marks the dead entries, as the first idle pass would
			before := idleScanBuffers(t, pool, table, now)
			require.Greater(t, before, tt.swept/200, "idle scan buffers after the sweep")
			start := time.Now()
			_, err = pool.Exec(ctx, "VACUUM "+table)
			require.NoError(t, err)
			took := time.Since(start)
			after := idleScanBuffers(t, pool, table, now)
			t.Logf("idle scan buffers: %d after the sweep, %d after a VACUUM of %v", before, after, took)
			if tt.cleanup == "auto" && version >= 140000 {
				assert.Equal(t, before, after, "idle scan buffers after a VACUUM that skipped the index")
			} else {
				assert.LessOrEqual(t, after, 5, "idle scan buffers after VACUUM")
			}
		})
	}
}
