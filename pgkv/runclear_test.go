package pgkv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/kvtest"
)

// TestSplitRun: the keys of a run are the prefix, the bytes they share and
// their own, each ending at its capacity, ascending whatever order they
// came in.
func TestSplitRun(t *testing.T) {
	t.Parallel()
	assert.Nil(t, splitRun("p/", nil), "an empty run")
	assert.Nil(t, splitRun("p/", []byte("")), "an empty run")
	keys := splitRun("p/", []byte("0001,2/b,1/a,3/c"))
	assert.Equal(t, [][]byte{[]byte("p/00011/a"), []byte("p/00012/b"), []byte("p/00013/c")}, keys)
	for _, k := range keys {
		assert.Equal(t, len(k), cap(k), "key %q", k)
	}
	assert.Equal(t, [][]byte{[]byte("p/x/y")}, splitRun("p/", []byte(",x/y")), "nothing shared")
}

// TestRunClearUsesTheEntitiesKey: the clear of a run (a CTE of its
// statement) finds the run's entities by the primary key of their table,
// whatever the type and collation of its ids: the ids the statement cuts
// from the keys take the collation of the column they are compared with.
func TestRunClearUsesTheEntitiesKey(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for i, tc := range []struct {
		id, clear string
	}{
		{"text", "DELETE FROM %s WHERE id = ANY($1)"},
		{`text COLLATE "C"`, "DELETE FROM %s WHERE id = ANY($1)"},
		{"bigint", "DELETE FROM %s WHERE id = ANY($1::bigint[])"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			markers := fmt.Sprintf("runkey_%d_%d", os.Getpid(), i)
			jobs := markers + "_jobs"
			require.NoError(t, Migrate(ctx, pool, markers))
			_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id %s PRIMARY KEY);
INSERT INTO %[1]s SELECT i FROM generate_series(1, 20000) AS i;
ANALYZE %[1]s`, jobs, tc.id))
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+markers+", "+jobs) })
			kv, err := New(pool, markers)
			require.NoError(t, err)
			a, err := kv.WithClearSQL(fmt.Sprintf(tc.clear, jobs))
			require.NoError(t, err)
			require.True(t, a.runInline)

			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, a.runSQL.stmt.prepare, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
			defer conn.Exec(ctx, "DEALLOCATE "+a.runSQL.stmt.name, pgx.QueryExecModeSimpleProtocol)
			lo, hi := markerRange("p/")
			rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) "+a.runSQL.stmt.execute, pgx.QueryExecModeSimpleProtocol, lo, hi, 100, 3, lo, hi)
			require.NoError(t, err)
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			text := strings.Join(plan, "\n")
			assert.NotContains(t, text, "Seq Scan on "+jobs, "the clear reads the whole table:\n%s", text)
			assert.Contains(t, text, jobs+"_pkey", "the clear does not use the key:\n%s", text)
		})
	}
}
