package pgkv

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBindIDsReadsTheStatementAsPostgreSQLDoes: every $1 outside strings,
// quoted identifiers and comments, and only those, stands for the ids; a
// trailing semicolon goes.
func TestBindIDsReadsTheStatementAsPostgreSQLDoes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ stmt, want string }{
		{"DELETE FROM jobs WHERE id = ANY($1)", "DELETE FROM jobs WHERE id = ANY(X)"},
		{"DELETE FROM jobs WHERE id = ANY($1::bigint[]) OR id = $1[1]", "DELETE FROM jobs WHERE id = ANY(X::bigint[]) OR id = X[1]"},
		{"SELECT '$1', $1", "SELECT '$1', X"},
		{"SELECT 'it''s $1', $1", "SELECT 'it''s $1', X"},
		{`SELECT E'\'$1', $1`, `SELECT E'\'$1', X`},
		{`SELECT e'\\', $1`, `SELECT e'\\', X`},
		{`SELECT date'2024\', $1`, `SELECT date'2024\', X`}, // a plain string: the backslash escapes nothing
		{`SELECT U&'\0041 $1', $1`, `SELECT U&'\0041 $1', X`},
		{`SELECT "a""$1", $1`, `SELECT "a""$1", X`},
		{"SELECT a$1, $1 FROM t", "SELECT a$1, X FROM t"}, // an identifier
		{"SELECT /* $1 /* $1 */ $1 */ $1", "SELECT /* $1 /* $1 */ $1 */ X"},
		{"SELECT 1 -- $1\n, $1", "SELECT 1 -- $1\n, X"},
		{"SELECT 1 -- $1\r, $1", "SELECT 1 -- $1\r, X"},
		{"SELECT $$ $1 $$, $tag$ $1 $tag$, $1", "SELECT $$ $1 $$, $tag$ $1 $tag$, X"},
		{"SELECT $a$ $b$ $1 $a$, $1", "SELECT $a$ $b$ $1 $a$, X"},
		{"SELECT $01", "SELECT X"},
		{"SELECT $1 ;", "SELECT X "},
		{"SELECT $1; -- done\n/* really */ ;", "SELECT X"},
		{"SELECT $1 -- to the end", "SELECT X -- to the end"},
		{"SELECT 'é', \"ü\", $1", "SELECT 'é', \"ü\", X"},
	} {
		got, at, err := bindIDs(tc.stmt, "X")
		require.NoError(t, err, "bindIDs(%q)", tc.stmt)
		assert.Equal(t, tc.want, got, "bindIDs(%q)", tc.stmt)
		for _, a := range at {
			assert.Equal(t, "X", got[a:a+1], "bindIDs(%q): offset %d", tc.stmt, a)
		}
	}
}

// TestBindIDsRefuses: what is not one statement using $1 alone is
// refused, with an error naming the fault.
func TestBindIDsRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ stmt, want string }{
		{"", "empty"},
		{" -- $1\n /* $1 */ ", "empty"},
		{";", "empty"},
		{"DELETE FROM jobs", "does not refer to $1"},
		{"SELECT '$1'", "does not refer to $1"},
		{"SELECT $2", "refers to $2"},
		{"SELECT $1, $10", "refers to $10"},
		{"SELECT $0", "refers to $0"},
		{"SELECT $99999999999999999999", "refers to $99999999999999999999"},
		{"SELECT $1a", "runs into"},
		{"SELECT $1$", "runs into"},
		{"SELECT $1; SELECT 2", "a second statement starts at byte 11"},
		{"SELECT $1;; DELETE FROM jobs", "a second statement"},
		{"SELECT 'open, $1", "string at byte 7 is not closed"},
		{"SELECT 'open'', $1", "string at byte 7 is not closed"},
		{`SELECT E'\', $1`, "string at byte 7 is not closed"},
		{`SELECT "open, $1`, "quoted identifier at byte 7 is not closed"},
		{"SELECT $1 /* open", "comment at byte 10 is not closed"},
		{"SELECT $1 /* /* */", "comment at byte 10 is not closed"},
		{"SELECT $1 /*/", "comment at byte 10 is not closed"},
		{"SELECT $1, $t$ open", "dollar-quoted string $t$ at byte 11 is not closed"},
		{"SELECT $1, '\xff'", "not valid UTF-8"},
		{"SELECT $1, '\x00'", "NUL byte at byte 12"},
	} {
		_, _, err := bindIDs(tc.stmt, "X")
		if assert.Error(t, err, "bindIDs(%q)", tc.stmt) {
			assert.Contains(t, err.Error(), tc.want, "bindIDs(%q)", tc.stmt)
		}
	}
}

// TestParseClearSQLRefusesWhatPgxReadsOtherwise: a statement pgx would
// fill in other places than PostgreSQL reads placeholders is refused.
func TestParseClearSQLRefusesWhatPgxReadsOtherwise(t *testing.T) {
	t.Parallel()
	for _, stmt := range []string{
		"SELECT a$1 FROM t WHERE x = ANY($1)",                              // pgx: two placeholders
		`SELECT date'2024\', $1`,                                           // pgx: an E'' string that swallows $1
		`SELECT x FROM t WHERE y = ANY($1) AND z = date'\' OR w = ANY($1)`, // pgx: the second $1 in an E'' string
	} {
		_, err := parseClearSQL(stmt)
		assert.Error(t, err, "parseClearSQL(%q)", stmt)
	}
}

// TestParseClearSQLRunsADataModifyingStatementInline: in a run, a
// statement that starts with DELETE, UPDATE or INSERT, after blanks and
// comments, takes the ids of the run statement's deletion, as its CTE;
// any other reads them from the setting, after it.
func TestParseClearSQLRunsADataModifyingStatementInline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		stmt   string
		inline bool
	}{
		{"DELETE FROM jobs WHERE id = ANY($1::bigint[]) -- $2", true},
		{" /* a /* nested */ comment */ -- and a line\n\tupdate jobs SET state = 'gone' WHERE id = ANY($1)", true},
		{"Insert INTO gone SELECT unnest($1)", true},
		{"WITH k AS (DELETE FROM kids WHERE job = ANY($1)) DELETE FROM jobs WHERE id = ANY($1)", false},
		{"SELECT clear_jobs($1)", false},
		{"MERGE INTO jobs USING unnest($1) AS g(id) ON jobs.id = g.id WHEN MATCHED THEN DELETE", false},
		{"deleted($1)", false},
	} {
		c, err := parseClearSQL(tc.stmt)
		require.NoError(t, err, tc.stmt)
		assert.Equal(t, tc.inline, c.inline, "parseClearSQL(%q).inline", tc.stmt)
		expr := settingIDsExpr
		if tc.inline {
			expr = inlineIDsExpr
		}
		run, _, err := bindIDs(tc.stmt, expr)
		require.NoError(t, err)
		assert.Equal(t, run, c.run, tc.stmt)
		page, _, err := bindIDs(tc.stmt, pageIDsExpr)
		require.NoError(t, err)
		assert.Equal(t, page, c.page, tc.stmt)
	}
}

// FuzzBindIDs: binding never panics; what it accepts it binds again to
// itself when the expression is $1, and once bound to an expression
// without a placeholder, it refers to $1 no more; each offset it returns
// holds the expression.
func FuzzBindIDs(f *testing.F) {
	for _, seed := range []string{
		"DELETE FROM jobs WHERE id = ANY($1)", "SELECT 'it''s $1', $1", `SELECT E'\'$1', $1`,
		`SELECT "a""$1", a$1, $1`, "SELECT /* $1 /* $1 */ $1 */ $1", "SELECT $$ $1 $$, $tag$ $1 $tag$, $1",
		"SELECT $1 -- c\n;", "SELECT $10", "SELECT 'open $1", "SELECT $01, $1; /* x */",
		`SELECT date'2024\', $1`, "WITH c AS (DELETE FROM kids WHERE job = ANY($1)) DELETE FROM jobs WHERE id = ANY($1)",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, stmt string) {
		const expr = "((SELECT 'ids'::text[]))"
		once, at, err := bindIDs(stmt, "$1")
		if err != nil {
			return
		}
		require.NotEmpty(t, at)
		again, at2, err := bindIDs(once, "$1")
		require.NoError(t, err, "bound %q to %q", stmt, once)
		require.Equal(t, once, again, "bound %q to %q, then to", stmt, once)
		require.Equal(t, at, at2)
		bound, at3, err := bindIDs(stmt, expr)
		require.NoError(t, err)
		require.Len(t, at3, len(at))
		require.Equal(t, len(once)+len(at)*(len(expr)-2), len(bound))
		for _, a := range at3 {
			require.True(t, strings.HasPrefix(bound[a:], expr), "offset %d of %q", a, bound)
		}
		_, _, err = bindIDs(bound, "$1")
		require.ErrorContains(t, err, "does not refer to $1", "%q bound to %q", stmt, bound)
	})
}
