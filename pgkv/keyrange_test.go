package pgkv

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/kvtest"
)

func TestRangeOf(t *testing.T) {
	t.Parallel()
	keys := func(ks ...string) [][]byte {
		out := make([][]byte, len(ks))
		for i, k := range ks {
			out[i] = []byte(k)
		}
		return out
	}
	tests := []struct {
		name   string
		keys   [][]byte
		ok     bool
		n      int
		sameAs [][]byte // keys with the same digest
	}{
		{"none", nil, false, 0, nil},
		{"one", keys("a"), true, 1, nil},
		{"ascending", keys("a", "b", "c"), true, 3, nil},
		{"duplicates next to each other count once", keys("a", "a", "b"), true, 2, keys("a", "b")},
		{"descending", keys("b", "a"), false, 0, nil},
		{"a prefix first", keys("a", "ab"), true, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := rangeOf(tt.keys)
			require.Equal(t, tt.ok, ok, "rangeOf(%q) ok", tt.keys)
			if !ok {
				return
			}
			assert.Equal(t, tt.n, r.n, "rangeOf(%q).n", tt.keys)
			assert.Equal(t, tt.keys[0], r.first)
			assert.Equal(t, tt.keys[len(tt.keys)-1], r.last)
			if tt.sameAs != nil {
				same, _ := rangeOf(tt.sameAs)
				assert.Equal(t, same.digest, r.digest, "digest of %q, want that of %q", tt.keys, tt.sameAs)
			}
		})
	}
	// The length prefix tells apart lists whose keys join to the same bytes.
	ab, _ := rangeOf(keys("a", "bc"))
	abc, _ := rangeOf(keys("ab", "c"))
	assert.NotEqual(t, ab.digest, abc.digest)
}

// TestRangeStatementChecksTheRows: the range form computes on the server
// the digest rangeOf computes, so a batch that is exactly the rows of its
// range is deleted in one statement (not through the key-by-key form
// behind it, which would hide a digest the server never matches), and any
// other batch fails that statement, which changes nothing.
func TestRangeStatementChecksTheRows(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := fmt.Sprintf("keyrange_%d", os.Getpid())
	require.NoError(t, Migrate(ctx, pool, table))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	kv, err := New(pool, table)
	require.NoError(t, err)

	odd := []string{"k\x00", "k\n1", "k\xff", "k\xff\xff"}
	tests := []struct {
		name       string
		rows, keys []string
		exact      bool
	}{
		{"the whole range", []string{"k1", "k2", "k3"}, []string{"k1", "k2", "k3"}, true},
		{"one key", []string{"k1"}, []string{"k1"}, true},
		{"bytes of every kind", odd, odd, true},
		{"keys of several lengths", []string{"k", "k1", "k10", "k2"}, []string{"k", "k1", "k10", "k2"}, true},
		{"a row of the range not in the batch", []string{"k1", "k2", "k3"}, []string{"k1", "k3"}, false},
		{"a key not in the table", []string{"k1", "k3"}, []string{"k1", "k2", "k3"}, false},
		{"the same count, another key", []string{"k1", "k2", "k3"}, []string{"k1", "k2x", "k3"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, "TRUNCATE "+kv.table)
			require.NoError(t, err)
			for _, k := range tt.rows {
				require.NoError(t, kv.Put(ctx, []byte(k), nil))
			}
			keys := make([][]byte, len(tt.keys))
			for i, k := range tt.keys {
				keys[i] = []byte(k)
			}
			r, ok := rangeOf(keys)
			require.True(t, ok)
			for name, sql := range map[string]string{"Delete": kv.rangeDeleteSQL.text, "ClearAndDelete": kv.rangeMarkersSQL.text} {
				_, err := pool.Exec(ctx, sql, append([]any{pgx.QueryExecModeSimpleProtocol}, r.args()...)...)
				var left int
				require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+kv.table).Scan(&left))
				if tt.exact {
					require.NoError(t, err, "%s's range statement", name)
					assert.Zero(t, left, "%s's range statement left rows", name)
					for _, k := range tt.rows { // again for the next statement
						require.NoError(t, kv.Put(ctx, []byte(k), nil))
					}
					continue
				}
				assert.True(t, castFailure(err, notRangeToken), "%s's range statement = %v, want a failure naming %q", name, err, notRangeToken)
				assert.Equal(t, len(tt.rows), left, "%s's failed range statement deleted rows", name)
			}
		})
	}
}
