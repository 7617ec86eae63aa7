package pgkv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// WithClearSQL returns an AtomicKV over k's table whose clear is stmt, one
// SQL statement that clears the entities whose ids are its parameter $1, a
// text[]: for example
//
//	DELETE FROM jobs WHERE id = ANY($1::bigint[])
//
// or a chain of CTEs that deletes a job's rows in child tables first. It
// runs in the transaction that deletes the ids' markers, after that
// deletion, as a ClearFunc's statements do; opts tune it as for WithClear
// (LockTimeout).
//
// Prefer it to WithClear when the clear fits in one statement: the
// AtomicKV is then a retention.RunClearer, and a sweep that needs no id
// in memory first (Config.Concurrency 1, no ValidateID, Limiter nor
// DryRun) lets the database pick each batch of the expired range and clear
// it in one round trip, with no Scan of the range and no id sent back to
// the server (see AtomicKV.ClearRun). Keep WithClear for clears that need
// Go (ids to parse, statements that depend on the batch, files to delete)
// and for holds (QueueHolds): a statement of WithClearSQL cannot report
// held ids, and the entities it leaves lose their markers (see below).
//
// $1 is bound on the server, as a text[] evaluated once, to the batch's
// ids; cast it where PostgreSQL needs another type ($1::bigint[]). In a
// batch from a page (ClearAndDelete) the ids are distinct; in a run
// (ClearRun), an id the run holds two markers of (the sweep's
// Stats.Duplicates) is in $1 twice, which a DELETE or an UPDATE by
// id = ANY($1) does not mind: write a statement that inserts a row per id
// with SELECT DISTINCT.
//
// The markers go whatever stmt does, unless it fails: a statement that
// clears nothing for a reason of its own (a condition that holds for none
// of the rows) must fail instead, or the entities it left keep no marker.
//
// In a run, a statement that starts with DELETE, UPDATE or INSERT is a
// data-modifying CTE of the statement that deletes the run's markers, and
// runs once that statement has checked them; any other (a chain of CTEs, a
// SELECT of a function) runs after it, as a statement of its own that
// reads the ids from a setting of the transaction, which costs the server
// more (BENCHMARKS.md). Either way it sees the database as of the start
// of the statement it runs in.
//
// stmt must be one statement (a trailing semicolon is dropped) that refers
// to $1 and to no other placeholder; its text is checked as PostgreSQL
// reads it, with standard_conforming_strings on: strings ('...', E'...',
// $tag$...$tag$), quoted identifiers and comments (--, nested /* */) may
// hold anything, $1 included. A statement pgx would read otherwise than
// PostgreSQL (an identifier such as a$1, which pgx takes for a
// placeholder) is refused too.
func (k *KV) WithClearSQL(stmt string, opts ...AtomicOption) (*AtomicKV, error) {
	c, err := parseClearSQL(stmt)
	if err != nil {
		return nil, fmt.Errorf("pgkv: WithClearSQL: %w", err)
	}
	a, err := k.atomicKV("WithClearSQL", func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue(c.page, ids)
		return nil
	}, opts)
	if err != nil {
		return nil, err
	}
	a.runClear, a.runInline = c.run, c.inline
	a.runSQL = a.runStatement("", 0)
	return a, nil
}

// runIDsSetting is the transaction-local setting through which a run
// statement hands its ids, joined by commas, to a clear statement that
// follows it in the same message (see AtomicKV.ClearRun).
const runIDsSetting = "pgkv.run_ids"

// The expressions that stand for $1 in a clear statement: in a run, the
// ids of the markers the run statement deleted (inlineIDsExpr, in a
// data-modifying CTE of that statement; see runStatement), or that it set
// (settingIDsExpr, in a statement after it); in a page's batch, the
// batch's array literal, itself a placeholder that joinBatch numbers and
// pgx fills. A subquery is evaluated once, and planned as an unknown
// array: a constant of 10,000 ids costs the planner more than the clear
// (it estimates each element, and then may scan the whole table). The
// cast after it keeps ANY(...) from reading the subquery as a set of
// rows, and the outer parentheses keep a subscript or a cast that follows
// $1 on the array. convert_from's text takes the collation "C" of its
// argument 'UTF8' (a name), which would win over a column's default
// collation in id = ANY($1) and keep the column's index out of use: the
// ids take the default collation instead, which yields to a column's.
const (
	inlineIDsExpr  = `((SELECT ARRAY(SELECT convert_from(substr(key, (SELECT id_at FROM pgkv_c)), 'UTF8') COLLATE "default" FROM pgkv_m) FROM pgkv_o WHERE ok)::text[])`
	settingIDsExpr = `((SELECT string_to_array(current_setting('` + runIDsSetting + `'), ','))::text[])`
	pageIDsExpr    = `((SELECT $1::text[])::text[])`
)

// clearSQL is a clear statement bound for a run and for a page's batch;
// inline tells whether the run's form is a data-modifying CTE of the run
// statement, or a statement of its own.
type clearSQL struct {
	run, page string
	inline    bool
}

// parseClearSQL checks stmt (see WithClearSQL) and binds its $1 for a run
// and for a page's batch. Both forms are also read by pgx's rules, which
// differ from PostgreSQL's in places: pgx must find in the run form no
// placeholder, and in the page form exactly the ones put there.
func parseClearSQL(stmt string) (clearSQL, error) {
	var c clearSQL
	switch strings.ToLower(leadingWord(stmt)) {
	case "delete", "update", "insert":
		c.inline = true
	}
	expr := settingIDsExpr
	if c.inline {
		expr = inlineIDsExpr
	}
	run, runAt, err := bindIDs(stmt, expr)
	if err != nil {
		return c, err
	}
	page, pageAt, err := bindIDs(stmt, pageIDsExpr)
	if err != nil {
		return c, err
	}
	if at := pgxPlaceholders(run); len(at) > 0 {
		return c, fmt.Errorf("pgx would read %q at byte %d of the statement as a placeholder (PostgreSQL does not): rewrite it", pgxPlaceholderAt(run, at[0]), origin(at[0], runAt, len(expr)))
	}
	want := make([]int, len(pageAt))
	for i, at := range pageAt {
		want[i] = at + strings.Index(pageIDsExpr, "$")
	}
	if got := pgxPlaceholders(page); !slices.Equal(got, want) {
		return c, errors.New("pgx would read the statement's quotes or comments otherwise than PostgreSQL and fill another placeholder than $1: rewrite it")
	}
	c.run, c.page = run, page
	return c, nil
}

// leadingWord returns the first word of sql, after blanks and comments,
// or "" when it starts otherwise.
func leadingWord(sql string) string {
	for i := 0; i < len(sql); {
		switch {
		case strings.IndexByte(" \t\n\r\f\v", sql[i]) >= 0:
			i++
		case strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexAny(sql[i:], "\r\n")
			if j < 0 {
				return ""
			}
			i += j + 1
		case strings.HasPrefix(sql[i:], "/*"):
			i, _ = commentClose(sql, i+2)
		case identStart(sql[i]):
			j := i + 1
			for j < len(sql) && (identStart(sql[j]) || isDigit(sql[j]) || sql[j] == '$') {
				j++
			}
			return sql[i:j]
		default:
			return ""
		}
	}
	return ""
}

// origin maps a byte offset of a bound statement back to stmt's, where
// each of the offsets at held an expression of length n in place of "$1".
func origin(offset int, at []int, n int) int {
	shift := 0
	for _, a := range at {
		if a >= offset {
			break
		}
		shift += n - len("$1")
	}
	return offset - shift
}

// pgxPlaceholderAt returns the placeholder at offset of sql.
func pgxPlaceholderAt(sql string, offset int) string {
	end := offset + 1
	for end < len(sql) && isDigit(sql[end]) {
		end++
	}
	return sql[offset:end]
}

// bindIDs returns stmt with every placeholder $1 replaced by expr, and
// the byte offsets in the result where each replacement starts. It reads
// stmt as PostgreSQL's lexer does (standard_conforming_strings on) and
// refuses, naming what is wrong and where, a statement that is empty,
// holds a second statement, refers to no $1 or to another placeholder, has
// a string, quoted identifier or comment left open, or is not valid
// UTF-8. A trailing semicolon, and the blanks and comments after it, are
// dropped.
func bindIDs(stmt, expr string) (string, []int, error) {
	if !utf8.ValidString(stmt) {
		return "", nil, errors.New("the statement is not valid UTF-8")
	}
	if i := strings.IndexByte(stmt, 0); i >= 0 {
		return "", nil, fmt.Errorf("the statement holds a NUL byte at byte %d", i)
	}
	var w strings.Builder
	w.Grow(len(stmt) + 4*len(expr))
	var at []int
	empty := true // no token but blanks and comments yet
	semi := -1    // where a semicolon ended the statement
	for i := 0; i < len(stmt); {
		start, c := i, stmt[i]
		blank, ok, what := false, true, ""
		switch {
		case strings.IndexByte(" \t\n\r\f\v", c) >= 0:
			blank = true
			i++
		case strings.HasPrefix(stmt[i:], "--"):
			blank = true
			i = len(stmt)
			if j := strings.IndexAny(stmt[start:], "\r\n"); j >= 0 {
				i = start + j + 1
			}
		case strings.HasPrefix(stmt[i:], "/*"):
			blank, what = true, "comment"
			i, ok = commentClose(stmt, i+2)
		case semi >= 0 && c == ';':
			i++
		case semi >= 0:
			return "", nil, fmt.Errorf("a second statement starts at byte %d, after the semicolon at byte %d: give one statement", start, semi)
		case c == ';':
			semi = i
			i++
		case c == '\'' || c == '"':
			what = "string"
			if c == '"' {
				what = "quoted identifier"
			}
			i, ok = quotedClose(stmt, i+1, c, false)
		case identStart(c):
			i++
			for i < len(stmt) && (identStart(stmt[i]) || isDigit(stmt[i]) || stmt[i] == '$') {
				i++
			}
			// Only a lone E before a quote opens E'...': in date'...'
			// the quote opens a plain string.
			if i == start+1 && (c == 'e' || c == 'E') && i < len(stmt) && stmt[i] == '\'' {
				what = "string"
				i, ok = quotedClose(stmt, i+1, '\'', true)
			}
		case c == '$' && i+1 < len(stmt) && isDigit(stmt[i+1]):
			i++
			for i < len(stmt) && isDigit(stmt[i]) {
				i++
			}
			if i < len(stmt) && (identStart(stmt[i]) || stmt[i] == '$') {
				return "", nil, fmt.Errorf("the placeholder %s at byte %d runs into %q", stmt[start:i], start, stmt[i])
			}
			if n, err := strconv.Atoi(stmt[start+1 : i]); err != nil || n != 1 {
				return "", nil, fmt.Errorf("the statement refers to %s at byte %d: its one parameter is $1, the ids", stmt[start:i], start)
			}
			empty = false
			at = append(at, w.Len())
			w.WriteString(expr)
			continue
		case c == '$':
			tag, isTag := dollarTag(stmt[i+1:])
			if !isTag {
				i++
				break
			}
			closer := "$" + tag + "$"
			what = "dollar-quoted string " + closer
			i = len(stmt)
			ok = false
			if j := strings.Index(stmt[start+len(closer):], closer); j >= 0 {
				i, ok = start+len(closer)+j+len(closer), true
			}
		default:
			i++
		}
		if !ok {
			return "", nil, fmt.Errorf("the %s at byte %d is not closed", what, start)
		}
		if semi < 0 {
			w.WriteString(stmt[start:i])
			empty = empty && blank
		}
	}
	switch {
	case empty:
		return "", nil, errors.New("the statement is empty")
	case len(at) == 0:
		return "", nil, errors.New("the statement does not refer to $1, the ids")
	}
	return w.String(), at, nil
}

// identStart reports whether c starts an identifier or a keyword: a
// letter, an underscore or a byte of a multibyte character.
func identStart(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c >= utf8.RuneSelf
}

// quotedClose returns the index just past the quote that closes a string
// (or quoted identifier) opened by quote, whose body starts at i, and
// whether there is one. A doubled quote is part of the body, and so is
// the byte after a backslash when escapes is set (E'...').
func quotedClose(sql string, i int, quote byte, escapes bool) (int, bool) {
	for i < len(sql) {
		switch sql[i] {
		case '\\':
			if escapes {
				i++
			}
		case quote:
			if i+1 < len(sql) && sql[i+1] == quote {
				i++
				break
			}
			return i + 1, true
		}
		i++
	}
	return len(sql), false
}

// commentClose returns the index just past the */ that closes a block
// comment whose body starts at i, and whether there is one; block
// comments nest.
func commentClose(sql string, i int) (int, bool) {
	depth := 0
	for i+1 < len(sql) {
		switch sql[i : i+2] {
		case "/*":
			depth++
			i += 2
			continue
		case "*/":
			if depth == 0 {
				return i + 2, true
			}
			depth--
			i += 2
			continue
		}
		i++
	}
	return len(sql), false
}
