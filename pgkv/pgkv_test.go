package pgkv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/pgkv"
)

func TestMain(m *testing.M) {
	leasetest.ReplicaMain(connectReplica) // returns unless this process is a replica of TestProcesses
	goleak.VerifyTestMain(m)
}

func connect(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

var tableSeq atomic.Int64

// freshTable returns the name of a new, migrated marker table that is
// dropped when t ends.
func freshTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := fmt.Sprintf("markers_%d_%d", os.Getpid(), tableSeq.Add(1))
	ctx := context.Background()
	_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+name)
	require.NoError(t, err)
	require.NoError(t, pgkv.Migrate(ctx, pool, name))
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+name)
		assert.NoError(t, err)
	})
	return name
}

func newStore(t testing.TB) kvtest.Store {
	pool := connect(t)
	table := freshTable(t, pool)
	kv, err := pgkv.New(pool, table)
	require.NoError(t, err)
	return kvtest.Store{
		KV:  kv,
		Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) },
		PutMany: func(ctx context.Context, keys [][]byte) error {
			_, err := pool.Exec(ctx, "INSERT INTO "+table+" SELECT unnest($1::bytea[]) ON CONFLICT DO NOTHING", keys)
			return err
		},
	}
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, newStore)
}

// TestConformanceAtomicKV runs the suite over an AtomicKV of WithClearSQL,
// a retention.RunClearer, in both forms a run takes (see runForms): it
// checks ClearRun's keys; the tests of atomic_test.go check its jobs. Over
// one of WithClear, which cannot clear runs, it checks that ClearRun says
// so (errors.ErrUnsupported) having changed nothing.
func TestConformanceAtomicKV(t *testing.T) {
	for _, form := range runForms {
		t.Run(form.name, func(t *testing.T) {
			kvtest.Run(t, atomicStore(form.stmt))
		})
	}
	t.Run("WithClear", func(t *testing.T) {
		kvtest.Run(t, func(t testing.TB) kvtest.Store {
			kv, akv, _, _ := newJobsKV(t, connect(t))
			return kvtest.Store{KV: akv, Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) }}
		})
	})
}

// atomicStore returns a kvtest.Factory of AtomicKVs of WithClearSQL(stmt).
func atomicStore(stmt func(jobs string) string) kvtest.Factory {
	return func(t testing.TB) kvtest.Store {
		kv, akv, _, _, _ := newRunKVOf(t, connect(t), stmt)
		return kvtest.Store{KV: akv, Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) }}
	}
}

func BenchmarkSweep(b *testing.B) {
	kvtest.Benchmark(b, newStore)
}

// BenchmarkSweepAtomic is BenchmarkSweep over an AtomicKV of WithClearSQL
// in each form of run: runs at concurrency 1, ClearAndDelete at 16.
func BenchmarkSweepAtomic(b *testing.B) {
	for _, form := range runForms {
		b.Run(form.name, func(b *testing.B) { kvtest.Benchmark(b, atomicStore(form.stmt)) })
	}
}

func TestTableNames(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	tests := []struct {
		name, table string
		wantErr     bool
	}{
		{"plain", fmt.Sprintf("plain_%d", os.Getpid()), false},
		{"schema-qualified", fmt.Sprintf("public.qualified_%d", os.Getpid()), false},
		{"needs quoting", fmt.Sprintf(`odd "name"; DROP TABLE x; -- %d`, os.Getpid()), false},
		{"mixed case", fmt.Sprintf("Markers_%d", os.Getpid()), false},
		{"empty", "", true},
		{"empty schema", ".markers", true},
		{"empty table after schema", "public.", true},
		{"too long", strings.Repeat("m", 64), true},
		{"NUL byte", "mark\x00ers", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := pgkv.New(pool, tt.table)
			migErr := pgkv.Migrate(ctx, pool, tt.table)
			if tt.wantErr {
				require.ErrorIs(t, err, pgkv.ErrInvalidTable)
				require.ErrorIs(t, migErr, pgkv.ErrInvalidTable)
				return
			}
			require.NoError(t, err)
			require.NoError(t, migErr)
			parts := strings.SplitN(tt.table, ".", 2)
			t.Cleanup(func() {
				_, err := pool.Exec(ctx, "DROP TABLE "+pgx.Identifier(parts).Sanitize())
				assert.NoError(t, err)
			})
			require.NoError(t, pgkv.Migrate(ctx, pool, tt.table), "Migrate twice")
			require.NoError(t, kv.Put(ctx, []byte("k"), nil))
			keys, err := kv.Scan(ctx, []byte("a"), []byte("z"), 10)
			require.NoError(t, err)
			assert.Equal(t, [][]byte{[]byte("k")}, keys)
		})
	}
}

func TestMigrateConcurrently(t *testing.T) {
	pool := connect(t)
	table := fmt.Sprintf("concurrent_%d", os.Getpid())
	ctx := context.Background()
	_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { assert.NoError(t, pgkv.Migrate(ctx, pool, table)) })
	}
	wg.Wait()
}

func TestNew(t *testing.T) {
	_, err := pgkv.New(nil, "markers")
	require.EqualError(t, err, "pgkv: db must not be nil")
}

func TestNoTable(t *testing.T) {
	pool := connect(t)
	kv, err := pgkv.New(pool, "no_such_table_at_all")
	require.NoError(t, err)
	ctx := context.Background()
	_, err = kv.Scan(ctx, []byte("a"), []byte("b"), 1)
	require.ErrorIs(t, err, pgkv.ErrNoTable)
	require.ErrorIs(t, kv.Delete(ctx, []byte("a")), pgkv.ErrNoTable)
}

func TestPutRefusesValue(t *testing.T) {
	pool := connect(t)
	kv, err := pgkv.New(pool, freshTable(t, pool))
	require.NoError(t, err)
	require.ErrorContains(t, kv.Put(context.Background(), []byte("k"), []byte("v")), "stores keys only")
}

// TestScanUsesIndex checks the plan of the scan: a range scan of the
// primary key, never a sequential scan plus sort; and that planning it
// reads no index, even where a sweep left every entry dead and the bounds
// lie past the keys the statistics sampled (the planner would walk the
// dead entries to find the index's actual end).
func TestScanUsesIndex(t *testing.T) {
	pool := connect(t)
	table := freshTable(t, pool)
	ctx := context.Background()
	kv, err := pgkv.New(pool, table)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = off);
INSERT INTO `+table+` SELECT convert_to('runs/' || lpad(i::text, 20, '0') || '/r' || i, 'UTF8')
		FROM generate_series(1, 20000) AS i;
ANALYZE `+table)
	require.NoError(t, err)
	explain := func(start, end string) string {
		t.Helper()
		rows, err := pool.Query(ctx, `EXPLAIN (BUFFERS) `+pgkv.ScanSQL(kv), []byte(start), []byte(end), 256)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	plan := explain("runs/0", "runs/00000000000000001000")
	assert.Regexp(t, `Index (Only )?Scan using `+table+`_pkey`, plan)
	assert.NotContains(t, plan, "Seq Scan")
	assert.NotContains(t, plan, "Sort")

	_, err = pool.Exec(ctx, "DELETE FROM "+table)
	require.NoError(t, err)
	plan = explain("runs/1", "runs/2")
	if m := regexp.MustCompile(`Planning:\s+Buffers: shared hit=(\d+)`).FindStringSubmatch(plan); m != nil {
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		assert.LessOrEqual(t, n, 20, "buffers read to plan the scan:\n%s", plan)
	}
}

func TestMarkTxCommitsWithState(t *testing.T) {
	pool := connect(t)
	kv, err := pgkv.New(pool, freshTable(t, pool))
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

	// Rolled back: neither state nor marker.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, kv.MarkTx(ctx, tx, "runs/", "r1", now))
	require.NoError(t, tx.Rollback(ctx))
	keys, err := kv.Scan(ctx, []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	assert.Empty(t, keys)

	// Refused before anything is written.
	require.ErrorIs(t, kv.MarkTx(ctx, pool, "runs/", "bad id", now), retention.ErrInvalidID)
	require.ErrorIs(t, kv.MarkTx(ctx, pool, "runs/", "r1", time.Unix(now.UnixMilli(), 0)), retention.ErrInvalidTime)

	// Committed, and marking twice is harmless.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := kv.MarkTx(ctx, tx, "runs/", "r1", now); err != nil {
			return err
		}
		return kv.MarkTx(ctx, tx, "runs/", "r1", now)
	})
	require.NoError(t, err)
	keys, err = kv.Scan(ctx, []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	want, err := retention.MarkerKey("runs/", now, "r1")
	require.NoError(t, err)
	assert.Equal(t, [][]byte{want}, keys)
}

func TestCancelledMidQuery(t *testing.T) {
	pool := connect(t)
	kv, err := pgkv.New(pool, freshTable(t, pool))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	_, err = kv.Scan(ctx, []byte("a"), []byte("b"), 1)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "Scan() error = %v, want DeadlineExceeded", err)
}

// TestEndToEnd keeps runs and markers in one database: 10,000 runs finish at
// spread-out times, each marked in the transaction that records its outcome,
// and a sweep clears exactly those past retention.
func TestEndToEnd(t *testing.T) {
	pool := connect(t)
	table := freshTable(t, pool)
	kv, err := pgkv.New(pool, table)
	require.NoError(t, err)
	ctx := context.Background()
	runs := table + "_runs"
	_, err = pool.Exec(ctx, "CREATE TABLE "+runs+" (id text PRIMARY KEY, outcome text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+runs) })

	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const n, window = 10_000, 24 * time.Hour
	finished := func(i int) time.Time { return now.Add(-time.Duration(i) * 17 * time.Second) }
	// Runs finish in groups of 100 per transaction: state and marker commit together.
	for first := 0; first < n; first += 100 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := first; i < first+100; i++ {
				id := fmt.Sprintf("run-%05d", i)
				if _, err := tx.Exec(ctx, "INSERT INTO "+runs+" VALUES ($1, 'succeeded')", id); err != nil {
					return err
				}
				if err := kv.MarkTx(ctx, tx, "runs/done/", id, finished(i)); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
	}

	sweep, err := retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: window, Clock: retention.NewManualClock(now), Concurrency: 8,
		Clear: func(ctx context.Context, id string) error {
			_, err := pool.Exec(ctx, "DELETE FROM "+runs+" WHERE id = $1", id)
			return err
		},
	})
	require.NoError(t, err)
	st, err := sweep.Pass(ctx)
	require.NoError(t, err)

	rows, err := pool.Query(ctx, "SELECT id FROM "+runs)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	present := map[string]bool{}
	for _, id := range ids {
		present[id] = true
	}
	wantCleared := 0
	for i := range n {
		expired := now.Sub(finished(i)) > window
		if expired {
			wantCleared++
		}
		id := fmt.Sprintf("run-%05d", i)
		assert.Equal(t, !expired, present[id], "%s finished %v ago: state present = %v", id, now.Sub(finished(i)), present[id])
	}
	assert.Equal(t, wantCleared, st.Cleared)
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&left))
	assert.Equal(t, n-wantCleared, left)
}

// TestDeleteOnlyTheKeys: the range form of Delete never takes a key that is
// not in the list, sorted or not, with duplicates or missing keys.
func TestDeleteOnlyTheKeys(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	plain, err := pgkv.New(pool, freshTable(t, pool))
	require.NoError(t, err)
	locker, err := pgkv.NewLocker(pool, "only-the-keys", &pgkv.LockerOptions{TTL: 10 * time.Second, Table: freshLeaseTable(t, pool)})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	fenced, ok := lease.(retention.Fencer).Fence(plain)
	require.True(t, ok)
	for name, kv := range map[string]retention.KV{"plain": plain, "fenced": fenced} {
		t.Run(name, func(t *testing.T) { testDeleteOnlyTheKeys(t, plain, kv) })
	}
}

func testDeleteOnlyTheKeys(t *testing.T, store *pgkv.KV, kv retention.KV) {
	ctx := context.Background()
	all := []string{"k1", "k2", "k3", "k4", "k5"}
	tests := []struct {
		name string
		del  []string
		left []string
	}{
		{"all, ascending: the range form", all, nil},
		{"a key in the range stays", []string{"k1", "k2", "k4", "k5"}, []string{"k3"}},
		{"unsorted", []string{"k5", "k1", "k3"}, []string{"k2", "k4"}},
		{"duplicates", []string{"k1", "k1", "k2"}, []string{"k3", "k4", "k5"}},
		{"missing keys", []string{"k0", "k2", "k9"}, []string{"k1", "k3", "k4", "k5"}},
		{"one key", []string{"k3"}, []string{"k1", "k2", "k4", "k5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range all {
				require.NoError(t, store.Put(ctx, []byte(k), nil))
			}
			keys := make([][]byte, len(tt.del))
			for i, k := range tt.del {
				keys[i] = []byte(k)
			}
			require.NoError(t, kv.Delete(ctx, keys...))
			got, err := kv.Scan(ctx, []byte("k"), []byte("l"), 10)
			require.NoError(t, err)
			var left []string
			for _, k := range got {
				left = append(left, string(k))
			}
			assert.Equal(t, tt.left, left)
			require.NoError(t, kv.Delete(ctx, got...))
		})
	}
}

// TestScanKeysOnEitherProtocol: Scan returns the same keys, every byte
// value intact, whether the pool reads results in binary (the extended
// protocol, pgx's default) or in text (a pool whose default is the simple
// protocol), and each key is the caller's: appending to one leaves the
// next one as it was.
func TestScanKeysOnEitherProtocol(t *testing.T) {
	admin := connect(t)
	table := freshTable(t, admin)
	ctx := context.Background()
	var want [][]byte
	for i := range 256 {
		want = append(want, []byte(fmt.Sprintf("k/%03d/%c\\x%s", i, byte(i), strings.Repeat("z", i%7))))
	}
	_, err := admin.Exec(ctx, "INSERT INTO "+table+" SELECT unnest($1::bytea[])", want)
	require.NoError(t, err)
	want = slices.SortedFunc(slices.Values(want), bytes.Compare)

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			kv, err := pgkv.New(pool, table)
			require.NoError(t, err)

			got, err := kv.Scan(ctx, nil, []byte("l"), 1000)
			require.NoError(t, err)
			require.Equal(t, want, got, "Scan() on a pool of mode %v", mode)
			second := bytes.Clone(got[1])
			got[0] = append(got[0], "appended"...)
			assert.Equal(t, second, got[1], "appending to the first key changed the second")

			one, err := kv.Scan(ctx, want[10], []byte("l"), 1)
			require.NoError(t, err)
			require.Equal(t, [][]byte{want[10]}, one, "Scan(limit 1)")
			assert.Equal(t, len(want[10]), cap(one[0]), "a Scan of one key holds a buffer of that key's size")
		})
	}
}
