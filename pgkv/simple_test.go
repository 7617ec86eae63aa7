package pgkv

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	assert.Equal(t, []any{[]string{"a"}, "me", 7}, args)

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
