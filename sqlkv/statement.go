package sqlkv

import (
	"context"
	"database/sql"
	"encoding/hex"
	"strconv"
	"strings"
)

// exec runs q, whose placeholders are of dialect d, and returns the rows it
// affected.
func exec(ctx context.Context, d Dialect, db execer, q string, args []any) (int64, error) {
	q, args = inline(d, q, args)
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// query runs q, whose placeholders are of dialect d, for its rows.
func query(ctx context.Context, d Dialect, db execer, q string, args []any) (*sql.Rows, error) {
	q, args = inline(d, q, args)
	return db.QueryContext(ctx, q, args...)
}

// queryRow runs q, which returns one row, into dest.
func queryRow(ctx context.Context, d Dialect, db execer, q string, args []any, dest ...any) error {
	rows, err := query(ctx, d, db, q, args)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Close()
}

// inline writes the arguments of a MySQL statement into its text, so that
// the statement is one round trip: with arguments, and without the DSN's
// interpolateParams=true, github.com/go-sql-driver/mysql sends every
// statement as a prepare, an execute and a close. A []byte becomes a hex
// literal, X'...', which holds any bytes and needs no escaping; an integer,
// its digits; a string of letters, digits and " -_./:@", a quoted literal,
// which means the same under every sql_mode and character set. A statement
// with any other argument goes out as it came. Other dialects are left
// alone: PostgreSQL drivers cache prepared statements per connection, and
// SQLite runs in the process.
func inline(d Dialect, q string, args []any) (string, []any) {
	if d != MySQL || len(args) == 0 {
		return q, args
	}
	lits := make([]string, len(args))
	size := len(q)
	for i, a := range args {
		lit, ok := literal(a)
		if !ok {
			return q, args
		}
		lits[i] = lit
		size += len(lit)
	}
	var b strings.Builder
	b.Grow(size)
	next := 0
	var quote byte // the quote the scan is inside, or 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '`' || c == '\'' || c == '"':
			quote = c
		case c == '?':
			if next == len(lits) {
				return q, args // more placeholders than arguments: let the driver say so
			}
			b.WriteString(lits[next])
			next++
			continue
		}
		b.WriteByte(c)
	}
	if next != len(lits) {
		return q, args
	}
	return b.String(), nil
}

// literal returns the MySQL literal of a, when it has a safe one.
func literal(a any) (string, bool) {
	switch v := a.(type) {
	case []byte:
		return "X'" + hex.EncodeToString(v) + "'", true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.Itoa(v), true
	case string:
		for i := 0; i < len(v); i++ {
			c := v[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(" -_./:@", c) >= 0) {
				return "", false
			}
		}
		return "'" + v + "'", true
	}
	return "", false
}
