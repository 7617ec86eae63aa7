package sqlkv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/marksweep/retention"
)

// Table describes an existing table whose rows are the markers of a
// sweep: each row with a finish time that passes Filter is the marker
// "<Prefix><finish time in ms:020>/<id:020>". Finishing an entity is
// setting its Time column; no marker row is written. See NewTable.
type Table struct {
	// Name is the table, "table" or "schema.table". Required.
	Name string

	// ID is the column of the rows' ids: an integer, unique, not
	// negative. A marker's id is its value zero-padded to 20 digits, so
	// that key order is id order; strconv.ParseInt reads it back.
	// Required.
	ID string

	// Time is the column of the rows' finish times, NULL while an entity
	// runs. Its type is the one TimeUnit names. A marker's time is the
	// finish time rounded up to a whole millisecond, as
	// retention.MarkerKey rounds it. Required.
	Time string

	// TimeUnit says how Time holds a time. The zero value, Timestamp,
	// is a timestamptz column on PostgreSQL; UnixMilli an integer of
	// Unix milliseconds, on every dialect.
	TimeUnit TimeUnit

	// Filter, when set, is an SQL condition on the row that a marker must
	// also meet, such as "state IN ('completed', 'discarded')". It must
	// hold no placeholder. Several sweeps may share a table, each with a
	// filter of its own (a retention per kind), and each an index whose
	// WHERE is its filter. Empty means every row whose Time is set.
	Filter string

	// Prefix is the Config.Prefix of the sweep that reads the table.
	// Required, and valid for retention.New.
	Prefix string
}

// TimeUnit is how a Table's Time column holds a time.
type TimeUnit int

const (
	// Timestamp is a timestamptz column, on PostgreSQL.
	Timestamp TimeUnit = iota
	// UnixMilli is an integer column of Unix milliseconds.
	UnixMilli
)

// TableKV is a retention.KV whose markers are the rows of a Table, under
// the Table's prefix, and whose other keys live in a marker table of its
// own (a KV, the side table): the retry, held and parked markers a sweep
// moves a row's marker to, and anything else a Put writes. While an
// entity has a key in the side table under the prefix, its row is no
// marker (it is shadowed), so that each entity has one marker at a time.
// A Delete of a row's marker deletes the row; so does a Delete of an
// entity's retry or parked marker, unless the row finished again since.
// It is a retention.Mover and a retention.Putter. Create one with
// NewTable; TableKV.WithClear makes one that clears atomically.
type TableKV struct {
	side   *KV
	d      Dialect
	table  string // quoted
	id, tm string // quoted columns
	unit   TimeUnit
	filter string
	prefix string
	shadow string // prefix + "~": the side table's keys that shadow a row
	name   string // as given, for messages
	// returning says that a DELETE can return the rows it deleted in the
	// same statement: PostgreSQL, and MariaDB where MySQL cannot.
	returning bool
}

var (
	_ retention.KV     = (*TableKV)(nil)
	_ retention.Putter = (*TableKV)(nil)
	_ retention.Mover  = (*TableKV)(nil)
)

// ErrNoIndex is returned by NewTable when the table has no index whose
// first columns are the Table's Time and ID: every read of the sweep would
// scan the table. The error names the CREATE INDEX that makes one.
var ErrNoIndex = errors.New("sqlkv: no index on (time, id)")

// NewTable returns a TableKV over t, whose other keys live in side, a KV
// over a marker table (Migrate) of the same database. It checks that the
// table's ID column is an integer and that an index's first columns are
// (Time, ID), in that order, with an error matching ErrNoIndex that names
// the CREATE INDEX to run otherwise.
func NewTable(ctx context.Context, side *KV, t Table) (*TableKV, error) {
	if side == nil {
		return nil, errors.New("sqlkv: NewTable: side must not be nil")
	}
	d := side.dialect
	switch {
	case t.ID == "" || t.Time == "":
		return nil, fmt.Errorf("sqlkv: NewTable: Table.ID and Table.Time must be set, got %q and %q", t.ID, t.Time)
	case t.TimeUnit != Timestamp && t.TimeUnit != UnixMilli:
		return nil, fmt.Errorf("sqlkv: NewTable: Table.TimeUnit %d is neither Timestamp nor UnixMilli", t.TimeUnit)
	case t.TimeUnit == Timestamp && d != PostgreSQL:
		return nil, fmt.Errorf("sqlkv: NewTable: Table.TimeUnit Timestamp is PostgreSQL's timestamptz; on %s keep the finish time as Unix milliseconds (UnixMilli)", d)
	case strings.ContainsAny(t.Filter, "?$;"):
		return nil, fmt.Errorf("sqlkv: NewTable: Table.Filter %q must hold no placeholder ('?' or '$') and no ';'", t.Filter)
	}
	if err := checkFilter(t.Filter); err != nil {
		return nil, fmt.Errorf("sqlkv: NewTable: Table.Filter %q %w", t.Filter, err)
	}
	if _, err := retention.New(retention.NewMemKV(), retention.Config{Prefix: t.Prefix, Retention: time.Hour,
		Clear: func(context.Context, string) error { return nil }}); err != nil {
		return nil, fmt.Errorf("sqlkv: NewTable: Table.Prefix: %w", err)
	}
	table, err := d.quoteTable(t.Name)
	if err != nil {
		return nil, err
	}
	tk := &TableKV{side: side, d: d, table: table, id: d.quoteIdent(t.ID), tm: d.quoteIdent(t.Time), unit: t.TimeUnit,
		filter: t.Filter, prefix: t.Prefix, shadow: t.Prefix + "~", name: t.Name}
	if err := tk.checkColumns(ctx, t); err != nil {
		return nil, err
	}
	tk.returning = d == PostgreSQL
	if d == MySQL {
		var version string
		if err := side.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
			return nil, wrap(ctx, "check table "+table, err)
		}
		tk.returning = strings.Contains(version, "MariaDB")
	}
	return tk, nil
}

// checkFilter refuses a filter that would not stay one condition inside
// the parentheses every statement puts around it: parentheses that close
// more than they open (outside quotes), an unclosed quote, or a comment,
// which would swallow what follows. "state = 'a') OR (state = 'b'" would
// make the statements' other conditions one side of an OR, and delete
// unexpired rows.
func checkFilter(f string) error {
	if strings.IndexByte(f, '\\') >= 0 {
		return errors.New("holds a backslash, which MySQL reads as an escape in a quoted string")
	}
	depth := 0
	for i := 0; i < len(f); i++ {
		switch c := f[i]; c {
		case '\'', '"', '`':
			end := strings.IndexByte(f[i+1:], c)
			if end < 0 {
				return fmt.Errorf("leaves %c unclosed", c)
			}
			i += end + 1 // a doubled quote is two quoted parts, one after the other
		case '(':
			depth++
		case ')':
			if depth--; depth < 0 {
				return errors.New("closes a parenthesis it did not open")
			}
		case '#':
			return errors.New("holds a comment")
		case '-', '/':
			if i+1 < len(f) && (c == '-' && f[i+1] == '-' || c == '/' && f[i+1] == '*') {
				return errors.New("holds a comment")
			}
		}
	}
	if depth != 0 {
		return errors.New("leaves a parenthesis open")
	}
	return nil
}

// integer reports whether a column of the type typ (lower case, as the
// catalog names it) holds integers: SQLite's INTEGER affinity, or one of
// the integer types of MySQL and PostgreSQL.
func (d Dialect) integer(typ string) bool {
	switch d {
	case SQLite:
		return strings.Contains(typ, "int")
	case MySQL:
		return slices.Contains([]string{"tinyint", "smallint", "mediumint", "int", "integer", "bigint"}, typ)
	}
	return slices.Contains([]string{"smallint", "integer", "bigint"}, typ)
}

// quoteIdent quotes a column name.
func (d Dialect) quoteIdent(name string) string {
	if d == MySQL {
		return "`" + strings.ReplaceAll(name, "`", "``") + "`"
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// checkColumns checks that the id column is an integer and that an index
// leads with (time, id).
func (t *TableKV) checkColumns(ctx context.Context, cfg Table) error {
	op := "check table " + t.table
	var typeQ, indexQ string
	var typeArgs, indexArgs []any
	schema, name := "", cfg.Name
	if i := strings.IndexByte(cfg.Name, '.'); i >= 0 {
		schema, name = cfg.Name[:i], cfg.Name[i+1:]
	}
	switch t.d {
	case PostgreSQL:
		typeQ = "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped"
		typeArgs = []any{t.table, cfg.ID}
		indexQ = `SELECT count(*) FROM pg_index i
			JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
			JOIN pg_attribute b ON b.attrelid = i.indrelid AND b.attnum = i.indkey[1]
			WHERE i.indrelid = $1::regclass AND a.attname = $2 AND b.attname = $3`
		indexArgs = []any{t.table, cfg.Time, cfg.ID}
	case SQLite:
		typeQ = "SELECT type FROM pragma_table_info(?) WHERE name = ?"
		typeArgs = []any{name, cfg.ID}
		indexQ = `SELECT count(*) FROM pragma_index_list(?) l
			WHERE (SELECT name FROM pragma_index_info(l.name) WHERE seqno = 0) = ?
			AND (SELECT name FROM pragma_index_info(l.name) WHERE seqno = 1) = ?`
		indexArgs = []any{name, cfg.Time, cfg.ID}
	case MySQL:
		db := "DATABASE()"
		if schema != "" {
			db = "?"
			typeArgs, indexArgs = []any{schema}, []any{schema}
		}
		typeQ = "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = " + db + " AND TABLE_NAME = ? AND COLUMN_NAME = ?"
		typeArgs = append(typeArgs, name, cfg.ID)
		indexQ = `SELECT count(*) FROM information_schema.STATISTICS a JOIN information_schema.STATISTICS b
			ON b.TABLE_SCHEMA = a.TABLE_SCHEMA AND b.TABLE_NAME = a.TABLE_NAME AND b.INDEX_NAME = a.INDEX_NAME
			WHERE a.TABLE_SCHEMA = ` + db + ` AND a.TABLE_NAME = ? AND a.SEQ_IN_INDEX = 1 AND a.COLUMN_NAME = ?
			AND b.SEQ_IN_INDEX = 2 AND b.COLUMN_NAME = ?`
		indexArgs = append(indexArgs, name, cfg.Time, cfg.ID)
	}
	typeOf := func(col string) (string, error) {
		args := append(slices.Clone(typeArgs[:len(typeArgs)-1]), col)
		var typ string
		if err := t.side.db.QueryRowContext(ctx, typeQ, args...).Scan(&typ); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return "", fmt.Errorf("%w: %s has no column %q", ErrNoTable, cfg.Name, col)
			}
			return "", wrap(ctx, op, err)
		}
		return strings.ToLower(typ), nil
	}
	typ, err := typeOf(cfg.ID)
	if err != nil {
		return err
	}
	if !t.d.integer(typ) {
		return fmt.Errorf("sqlkv: NewTable: column %s.%s is %s: Table.ID must be an integer column", cfg.Name, cfg.ID, typ)
	}
	if typ, err = typeOf(cfg.Time); err != nil {
		return err
	}
	switch {
	case cfg.TimeUnit == UnixMilli && !t.d.integer(typ):
		return fmt.Errorf("sqlkv: NewTable: column %s.%s is %s: with TimeUnit UnixMilli, Table.Time must be an integer column of Unix milliseconds", cfg.Name, cfg.Time, typ)
	case cfg.TimeUnit == Timestamp && typ != "timestamp with time zone":
		// A timestamp without a zone holds the writer's local time: read
		// as UTC, it made keys hours early west of Greenwich.
		return fmt.Errorf("sqlkv: NewTable: column %s.%s is %s: with TimeUnit Timestamp, Table.Time must be a timestamptz (timestamp with time zone)", cfg.Name, cfg.Time, typ)
	}
	var n int64
	if err := t.side.db.QueryRowContext(ctx, indexQ, indexArgs...).Scan(&n); err != nil {
		return wrap(ctx, op, err)
	}
	used := true
	if n > 0 {
		var err error
		if used, err = t.indexUsed(ctx); err != nil {
			return wrap(ctx, op, err)
		}
	}
	if n == 0 || !used {
		where, why := "", "no index on (time, id)"
		if cfg.Filter != "" {
			where = " WHERE " + cfg.Filter
		}
		if n > 0 {
			why = "its index on (time, id) does not serve the filter's rows (a partial index whose WHERE the filter does not imply?)"
		}
		return fmt.Errorf("%w of %s: %s; create one with CREATE INDEX %s ON %s (%s, %s)%s", ErrNoIndex, cfg.Name, why,
			t.d.quoteIdent(name+"_"+cfg.Time+"_"+cfg.ID), t.table, t.tm, t.id, where)
	}
	return nil
}

// indexUsed reports whether the database reads the markers of a range in
// key order through an index, with no scan of the table and no sort: a
// partial index whose WHERE the filter does not imply has the columns,
// and serves none of the sweep's reads. MySQL has no partial indexes.
func (t *TableKV) indexUsed(ctx context.Context) (bool, error) {
	if t.d == MySQL {
		return true, nil
	}
	w := &where{d: t.d, bare: true}
	t.rangeConds(w, viewPos{ms: 1}, viewPos{ms: 2})
	q := t.selectRows() + w.String() + t.order() + " LIMIT 1"
	tx, err := t.side.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	if t.d == PostgreSQL {
		// Costs aside: a plan without an index scan or with a sort then
		// has no index to use.
		for _, off := range []string{"enable_seqscan", "enable_sort", "enable_bitmapscan"} {
			if _, err := tx.ExecContext(ctx, "SET LOCAL "+off+" = off"); err != nil {
				return false, err
			}
		}
		q = "EXPLAIN " + q
	} else {
		q = "EXPLAIN QUERY PLAN " + q
	}
	rows, err := tx.QueryContext(ctx, q, w.args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return false, err
	}
	var plan strings.Builder
	for rows.Next() {
		vals := make([]any, len(cols))
		for i := range vals {
			vals[i] = new(any)
		}
		if err := rows.Scan(vals...); err != nil {
			return false, err
		}
		fmt.Fprintln(&plan, *vals[len(vals)-1].(*any)) // PostgreSQL's line, SQLite's detail
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	p := plan.String()
	if t.d == PostgreSQL {
		return strings.Contains(p, "Index") && !strings.Contains(p, "Seq Scan") && !strings.Contains(p, "Sort"), nil
	}
	return strings.Contains(p, "USING") && strings.Contains(p, "INDEX") && !strings.Contains(p, "TEMP B-TREE"), nil
}

// viewLen is the length of a row's key after the prefix: the time's 20
// digits, '/', the id's 20 digits.
const viewLen = 2*retention.TimestampWidth + 1

// maxViewMs is the last millisecond a key can carry.
var maxViewMs = retention.MaxMarkerTime.UnixMilli()

// rowKey appends the key of the row (ms, id) to dst.
func (t *TableKV) rowKey(dst []byte, ms, id int64) []byte {
	dst = append(dst, t.prefix...)
	dst = appendDigits(dst, uint64(ms))
	dst = append(dst, '/')
	return appendDigits(dst, uint64(id))
}

// appendDigits appends v in decimal, zero-padded to 20 digits.
func appendDigits(dst []byte, v uint64) []byte {
	var buf [retention.TimestampWidth]byte
	n := len(strconv.AppendUint(buf[:0], v, 10))
	for range retention.TimestampWidth - n {
		dst = append(dst, '0')
	}
	return append(dst, buf[:n]...)
}

// parseRowKey returns the (ms, id) of key when it is the key of a row.
func (t *TableKV) parseRowKey(key []byte) (ms, id int64, ok bool) {
	if len(key) != len(t.prefix)+viewLen || string(key[:len(t.prefix)]) != t.prefix {
		return 0, 0, false
	}
	rest := key[len(t.prefix):]
	if rest[retention.TimestampWidth] != '/' {
		return 0, 0, false
	}
	m, ok1 := digits(rest[:retention.TimestampWidth])
	i, ok2 := digits(rest[retention.TimestampWidth+1:])
	if !ok1 || !ok2 || m > uint64(maxViewMs) || i > 1<<63-1 {
		return 0, 0, false
	}
	return int64(m), int64(i), true
}

// digits reads 20 decimal digits, reporting false for any other byte or a
// value past the uint64 range.
func digits(b []byte) (uint64, bool) {
	v, err := strconv.ParseUint(string(b), 10, 64)
	return v, err == nil && len(b) == retention.TimestampWidth && b[0] != '+' && b[0] != '-'
}

// viewPos is a position among the rows' keys: the least key (ms, id) is at
// or after, or past every key (inf).
type viewPos struct {
	ms, id int64
	inf    bool
}

// less reports whether p comes before q.
func (p viewPos) less(q viewPos) bool {
	switch {
	case p.inf:
		return false
	case q.inf:
		return true
	case p.ms != q.ms:
		return p.ms < q.ms
	}
	return p.id < q.id
}

// posOf returns the position of the least row key at or after key.
func (t *TableKV) posOf(key []byte) viewPos {
	p := t.prefix
	if len(key) < len(p) || string(key[:len(p)]) != p {
		if string(key) < p {
			return viewPos{}
		}
		return viewPos{inf: true}
	}
	s := key[len(p):]
	var buf [viewLen]byte
	i := 0
	for ; i < viewLen; i++ {
		lo, hi := byte('0'), byte('9')
		if i == retention.TimestampWidth {
			lo, hi = '/', '/'
		}
		if i == len(s) || s[i] < lo {
			return t.fill(buf, i)
		}
		if s[i] > hi {
			return t.carry(buf, i)
		}
		buf[i] = s[i]
	}
	if len(s) > viewLen {
		return t.carry(buf, viewLen)
	}
	return t.posFrom(buf)
}

// fill completes buf from i with the least bytes a key may hold there.
func (t *TableKV) fill(buf [viewLen]byte, i int) viewPos {
	for ; i < viewLen; i++ {
		buf[i] = '0'
		if i == retention.TimestampWidth {
			buf[i] = '/'
		}
	}
	return t.posFrom(buf)
}

// carry returns the least key past every key that starts with buf[:i]:
// the last digit before i below '9' goes up by one, and fill does the
// rest; with none, the position past every key.
func (t *TableKV) carry(buf [viewLen]byte, i int) viewPos {
	for j := i - 1; j >= 0; j-- {
		if j != retention.TimestampWidth && buf[j] < '9' {
			buf[j]++
			return t.fill(buf, j+1)
		}
	}
	return viewPos{inf: true}
}

// posFrom reads a key's 41 bytes as a position, moving one whose id no
// row can have to the next millisecond, and one whose time no key can
// carry past every key.
func (t *TableKV) posFrom(buf [viewLen]byte) viewPos {
	m, okm := digits(buf[:retention.TimestampWidth])
	i, ok := digits(buf[retention.TimestampWidth+1:])
	if !ok || i > 1<<63-1 {
		m, i = m+1, 0
	}
	if !okm || m > uint64(maxViewMs) {
		return viewPos{inf: true}
	}
	return viewPos{ms: int64(m), id: int64(i)}
}
