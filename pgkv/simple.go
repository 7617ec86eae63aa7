package pgkv

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// joinBatch joins the statements of b into one SQL text for a single
// simple-protocol Query message, numbering their placeholders across the
// statements ($1 of the second statement becomes $n+1 when the first takes
// n arguments), and returns the arguments in that order. pgx interpolates
// them on the client when the text is run with QueryExecModeSimpleProtocol.
//
// PostgreSQL runs the statements of one Query message in one implicit
// transaction, and starts it only once the whole message has arrived: a
// client cut off mid-message leaves no transaction open and no row locked
// (see Locker). pgx sends a Batch as one Query message only on a
// connection whose DefaultQueryExecMode is the simple protocol, which the
// caller's pool need not be; hence this.
//
// A statement's arguments may start with pgx.NamedArgs or
// pgx.StrictNamedArgs; other query options, and result callbacks
// (QueuedQuery.Exec, Query, QueryRow), are refused: the statements' results
// are not read one by one.
func joinBatch(ctx context.Context, b *pgx.Batch) (string, []any, error) {
	var sql strings.Builder
	var args []any
	for i, q := range b.QueuedQueries {
		if q.Fn != nil {
			return "", nil, fmt.Errorf("pgkv: statement %d of the ClearFunc has a result callback, which an AtomicKV does not call: queue it without one", i+1)
		}
		text, qargs := q.SQL, q.Arguments
		if len(qargs) > 0 {
			switch opt := qargs[0].(type) {
			case pgx.NamedArgs, pgx.StrictNamedArgs:
				// Neither looks at the connection.
				var err error
				if text, qargs, err = opt.(pgx.QueryRewriter).RewriteQuery(ctx, nil, text, qargs[1:]); err != nil {
					return "", nil, fmt.Errorf("pgkv: statement %d of the ClearFunc: %w", i+1, err)
				}
			case pgx.QueryExecMode, pgx.QueryRewriter:
				return "", nil, fmt.Errorf("pgkv: statement %d of the ClearFunc has a %T option: an AtomicKV sends its batch in the simple protocol, with plain arguments or pgx.NamedArgs", i+1, opt)
			}
		}
		if i > 0 {
			// The newline ends a line comment the statement may end with.
			sql.WriteString("\n;\n")
		}
		if err := renumber(&sql, text, len(args), len(qargs)); err != nil {
			return "", nil, fmt.Errorf("pgkv: statement %d of the ClearFunc: %w", i+1, err)
		}
		for _, a := range qargs {
			lit, err := arrayLiteral(a)
			if err != nil {
				return "", nil, fmt.Errorf("pgkv: statement %d of the ClearFunc: %w", i+1, err)
			}
			args = append(args, lit)
		}
	}
	return sql.String(), args, nil
}

// renumber writes sql to w with each placeholder $n shifted by offset, and
// refuses one beyond the statement's nargs arguments. It finds placeholders
// by the rules pgx's own interpolation follows (see pgxScan), so that both
// agree on which $n are placeholders.
func renumber(w *strings.Builder, sql string, offset, nargs int) error {
	if !utf8.ValidString(sql) {
		return fmt.Errorf("SQL is not valid UTF-8")
	}
	last := 0
	err := pgxScan(sql, func(start, end int) error {
		n, err := strconv.Atoi(sql[start+1 : end])
		if err != nil || n < 1 || n > nargs {
			return fmt.Errorf("placeholder %s with %d arguments", sql[start:end], nargs)
		}
		w.WriteString(sql[last:start])
		w.WriteString("$" + strconv.Itoa(n+offset))
		last = end
		return nil
	})
	w.WriteString(sql[last:])
	return err
}

// pgxPlaceholders returns the byte offsets of the placeholders pgx finds
// in sql (see pgxScan).
func pgxPlaceholders(sql string) []int {
	var at []int
	_ = pgxScan(sql, func(start, _ int) error {
		at = append(at, start)
		return nil
	})
	return at
}

// pgxScan calls placeholder with the start and end of each placeholder of
// sql, and stops at the first error it returns. It finds them by
// the rules of pgx's interpolation: outside quoted strings ('...',
// E'...', "...", $tag$...$tag$) and comments (--, nested /* */), a $
// followed by a digit. Unlike PostgreSQL, pgx takes an e or E before a
// quote for E'...' wherever it is, and a $ in an identifier (a$1) for a
// placeholder.
func pgxScan(sql string, placeholder func(start, end int) error) error {
	i := 0
	for i < len(sql) {
		c := sql[i]
		switch {
		case (c == 'e' || c == 'E') && i+1 < len(sql) && sql[i+1] == '\'':
			i, _ = quotedClose(sql, i+2, '\'', true)
		case c == '\'' || c == '"':
			i, _ = quotedClose(sql, i+1, c, false)
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			end := len(sql)
			if j := strings.IndexAny(sql[i:], "\r\n"); j >= 0 {
				end = i + j + 1
			}
			i = end
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			i, _ = commentClose(sql, i+2)
		case c == '$' && i+1 < len(sql) && isDigit(sql[i+1]):
			j := i + 1
			for j < len(sql) && isDigit(sql[j]) {
				j++
			}
			if err := placeholder(i, j); err != nil {
				return err
			}
			i = j
		case c == '$':
			tag, ok := dollarTag(sql[i+1:])
			if !ok {
				i++
				break
			}
			closer := "$" + tag + "$"
			end := len(sql)
			if j := strings.Index(sql[i+len(closer):], closer); j >= 0 {
				end = i + len(closer) + j + len(closer)
			}
			i = end
		default:
			i++
		}
	}
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// dollarTag reports whether s (the text after a $) starts with the rest of
// a dollar-quote opener, tag$, and returns tag, which may be empty. A tag
// is a letter, _ or non-ASCII character, then those or digits.
func dollarTag(s string) (string, bool) {
	for i, r := range s {
		switch {
		case r == '$':
			return s[:i], true
		case r == '_', 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', r >= utf8.RuneSelf:
		case i > 0 && '0' <= r && r <= '9':
		default:
			return "", false
		}
	}
	return "", false
}

// arrayLiteral returns the text of an array of ids, the usual argument of
// a ClearFunc's statement, as the literal pgx would write into the SQL
// text ('{1,2}' for a []int64, every element quoted for a []string), for
// pgx to quote; any other argument as it is. pgx writes the same literal,
// but through its general encoder, which costs the client more than the
// rest of a call. A nil slice stays nil: pgx sends it
// as NULL. A string holding a NUL byte is refused, as PostgreSQL's text
// cannot hold one.
func arrayLiteral(arg any) (any, error) {
	var b []byte
	switch v := arg.(type) {
	case []int64:
		if v == nil {
			return arg, nil
		}
		b = make([]byte, 0, 2+len(v)*8)
		b = append(b, '{')
		for i, n := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, n, 10)
		}
	case []string:
		if v == nil {
			return arg, nil
		}
		size := 2
		for _, e := range v {
			size += len(e) + 3
		}
		b = make([]byte, 0, size)
		b = append(b, '{')
		for i, e := range v {
			if strings.IndexByte(e, 0) >= 0 {
				return nil, fmt.Errorf("array element %d holds a NUL byte, which PostgreSQL's text cannot hold", i)
			}
			if i > 0 {
				b = append(b, ',')
			}
			// Quoted, an element is taken as it is, whatever it holds
			// (NULL, spaces, commas, braces); only " and \ need a \.
			b = append(b, '"')
			for j := 0; j < len(e); j++ {
				if e[j] == '"' || e[j] == '\\' {
					b = append(b, '\\')
				}
				b = append(b, e[j])
			}
			b = append(b, '"')
		}
	default:
		return arg, nil
	}
	return string(append(b, '}')), nil
}
