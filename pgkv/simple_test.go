package pgkv

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/kvtest"
)

func TestRenumber(t *testing.T) {
	t.Parallel()
	tests := []struct {
		sql    string
		offset int
		nargs  int
		want   string
	}{
		{"SELECT $1, $2", 3, 2, "SELECT $4, $5"},
		{"SELECT $1 -- $2\n, $2", 1, 2, "SELECT $2 -- $2\n, $3"},
		{"SELECT '$1', $1", 5, 1, "SELECT '$1', $6"},
		{"SELECT 'it''s $1', $1", 5, 1, "SELECT 'it''s $1', $6"},
		{`SELECT E'\'$1', $1`, 2, 1, `SELECT E'\'$1', $3`},
		{`SELECT "a""$1", $1`, 2, 1, `SELECT "a""$1", $3`},
		{"SELECT /* $1 /* $1 */ $1 */ $1", 2, 1, "SELECT /* $1 /* $1 */ $1 */ $3"},
		{"SELECT $$ $1 $$, $tag$ $1 $tag$, $1", 1, 1, "SELECT $$ $1 $$, $tag$ $1 $tag$, $2"},
		{"SELECT $10", 1, 10, "SELECT $11"},
		{"SELECT 'unterminated $1", 1, 0, "SELECT 'unterminated $1"},
	}
	for _, tt := range tests {
		var b strings.Builder
		require.NoError(t, renumber(&b, tt.sql, tt.offset, tt.nargs), tt.sql)
		assert.Equal(t, tt.want, b.String(), "renumber(%q, %d)", tt.sql, tt.offset)
	}
	for _, bad := range []string{"SELECT $0", "SELECT $2", "SELECT $99999999999999999999", "SELECT '\xff'"} {
		var b strings.Builder
		assert.Error(t, renumber(&b, bad, 0, 1), "renumber(%q)", bad)
	}
}

func TestJoinBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &pgx.Batch{}
	b.Queue("DELETE FROM jobs WHERE id = ANY($1) -- trailing", []string{"a"})
	b.Queue("INSERT INTO log VALUES (@who, @at)", pgx.NamedArgs{"who": "me", "at": 7})
	b.Queue("SELECT 1")
	sql, args, err := joinBatch(ctx, b)
	require.NoError(t, err)
	assert.Equal(t, "DELETE FROM jobs WHERE id = ANY($1) -- trailing\n;\nINSERT INTO log VALUES ($2, $3)\n;\nSELECT 1", sql)
	assert.Equal(t, []any{`{"a"}`, "me", 7}, args, "an array of ids goes as its literal (see arrayLiteral), the rest as it is")

	b = &pgx.Batch{}
	b.Queue("SELECT $1", pgx.QueryExecModeExec, 1)
	_, _, err = joinBatch(ctx, b)
	assert.ErrorContains(t, err, "option")

	b = &pgx.Batch{}
	b.Queue("SELECT 1").Exec(func(pgconn.CommandTag) error { return nil })
	_, _, err = joinBatch(ctx, b)
	assert.ErrorContains(t, err, "callback")
}

// FuzzRenumber: renumbering never panics, leaves a statement unchanged at
// offset 0 (once its placeholders are spelt without leading zeros), and
// renumbering back by the same offset restores it: quoted
// strings and comments are found alike whatever the placeholders' digits.
func FuzzRenumber(f *testing.F) {
	for _, seed := range []string{
		"SELECT $1, $2", "SELECT $1 -- $2\n, $2", "SELECT 'it''s $1', $1", `SELECT E'\'$1', $1`,
		`SELECT "a""$1", $1`, "SELECT /* $1 /* $1 */ $1 */ $1", "SELECT $$ $1 $$, $tag$ $1 $tag$, $1",
		"SELECT $10", "SELECT 'unterminated $1", "DELETE FROM t WHERE id = ANY($1) AND $2::int > 0",
	} {
		f.Add(seed, 3)
	}
	f.Fuzz(func(t *testing.T, sql string, offset int) {
		if offset < 0 || offset > 1000 {
			return
		}
		const nargs = 1 << 20
		var canon, same strings.Builder
		if err := renumber(&canon, sql, 0, nargs); err != nil {
			return // refused: not valid UTF-8, or a placeholder out of range
		}
		// Offset 0 changes nothing but the spelling of a placeholder ($01
		// is $1), and then nothing at all.
		sql = canon.String()
		require.NoError(t, renumber(&same, sql, 0, nargs))
		require.Equal(t, sql, same.String(), "renumber at offset 0")
		var up, down strings.Builder
		require.NoError(t, renumber(&up, sql, offset, nargs))
		require.NoError(t, renumber(&down, up.String(), -offset, nargs+offset), "renumber back %q", up.String())
		require.Equal(t, sql, down.String(), "renumbered by %d and back, via %q", offset, up.String())
	})
}

// TestArrayLiteralIsWhatTheServerReads: the array literals joinBatch
// writes for a ClearFunc's []int64 and []string arguments read back on the
// server, through the simple protocol, as the very elements: quotes,
// backslashes, braces, commas, spaces, the word NULL, an empty string and
// non-ASCII text included. A nil slice is still NULL, and a NUL byte,
// which text cannot hold, is refused.
func TestArrayLiteralIsWhatTheServerReads(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	strs := [][]string{
		{"job-1", "job-2"},
		{`a"b`, `c\d`, `\"`, "{x}", "a,b", " lead", "trail ", "NULL", "null", "", "é€😀", "it's", "$1", "--", "/*"},
		{},
	}
	for _, want := range strs {
		lit, err := arrayLiteral(want)
		require.NoError(t, err)
		var got []string
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::text[]", pgx.QueryExecModeSimpleProtocol, lit).Scan(&got))
		assert.Equal(t, want, got, "arrayLiteral(%q) = %q, read back as %q", want, lit, got)
	}
	for _, want := range [][]int64{{1, 2, 3}, {-9223372036854775808, 0, 9223372036854775807}, {}} {
		lit, err := arrayLiteral(want)
		require.NoError(t, err)
		var got []int64
		var matched int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM unnest($1::bigint[]) AS id WHERE id = ANY($1)", pgx.QueryExecModeSimpleProtocol, lit).Scan(&matched))
		assert.Equal(t, len(want), matched, "id = ANY(%s), with no cast, matched %d ids", lit, matched)
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::bigint[]", pgx.QueryExecModeSimpleProtocol, lit).Scan(&got))
		assert.Equal(t, want, got, "arrayLiteral(%v) = %q", want, lit)
	}

	for _, null := range []any{[]int64(nil), []string(nil)} {
		lit, err := arrayLiteral(null)
		require.NoError(t, err)
		var isNull bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::text[] IS NULL", pgx.QueryExecModeSimpleProtocol, lit).Scan(&isNull))
		assert.True(t, isNull, "arrayLiteral(%#v) = %#v, not NULL", null, lit)
	}
	_, err = arrayLiteral([]string{"ok", "n\x00ul"})
	assert.ErrorContains(t, err, "NUL byte")
	other := []byte("as is")
	lit, err := arrayLiteral(other)
	require.NoError(t, err)
	assert.Equal(t, other, lit, "arrayLiteral of a []byte")
}
