package sqlkv

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// where builds the conditions of a statement over a Table's rows and
// numbers their placeholders.
type where struct {
	d    Dialect
	b    strings.Builder
	args []any
	// bare leaves out the shadows' condition: a run that found no shadow
	// under the prefix checks after its deletion that none came since.
	bare bool
}

// arg adds v and returns its placeholder. On PostgreSQL an integer goes
// as a bigint and a time as a timestamptz: a bound past an integer
// column's range (the id after the largest an int4 holds) then compares,
// where pgx refused to send it as the column's type.
func (w *where) arg(v any) string {
	w.args = append(w.args, v)
	ph := w.d.ph(len(w.args))
	if w.d == PostgreSQL {
		switch v.(type) {
		case int64:
			ph += "::bigint"
		case time.Time:
			ph += "::timestamptz"
		}
	}
	return ph
}

// and adds a condition.
func (w *where) and(cond string) {
	if w.b.Len() > 0 {
		w.b.WriteString(" AND ")
	}
	w.b.WriteString(cond)
}

func (w *where) String() string { return w.b.String() }

// col returns a column of the table, qualified: the statements' subqueries
// read the side table too.
func (t *TableKV) col(c string) string { return t.table + "." + c }

// bound returns the value of the Time column at the end of millisecond ms.
func (t *TableKV) bound(ms int64) any {
	if t.unit == UnixMilli {
		return ms
	}
	return time.UnixMilli(ms).UTC()
}

// rangeConds adds the conditions of the rows whose keys lie in [lo, hi)
// and that are markers: the filter holds and no side key shadows them.
// A key's millisecond ms holds the times in (ms-1, ms].
func (t *TableKV) rangeConds(w *where, lo, hi viewPos) {
	tm, id := t.col(t.tm), t.col(t.id)
	w.and(tm + " > " + w.arg(t.bound(lo.ms-1)))
	if lo.id > 0 {
		w.and("NOT (" + tm + " <= " + w.arg(t.bound(lo.ms)) + " AND " + id + " < " + w.arg(lo.id) + ")")
	}
	if hi.inf {
		w.and(tm + " <= " + w.arg(t.bound(maxViewMs)))
	} else {
		w.and(tm + " <= " + w.arg(t.bound(hi.ms)))
		w.and("NOT (" + tm + " > " + w.arg(t.bound(hi.ms-1)) + " AND " + id + " >= " + w.arg(hi.id) + ")")
	}
	// No key carries a negative id. Written so that no planner takes it
	// for a range of the primary key: SQLite scanned a whole table by
	// rowid for every run (id INTEGER PRIMARY KEY) and MariaDB planned
	// the run's DELETE on the primary key, where the (time, id) index
	// reads only the run.
	switch t.d {
	case SQLite:
		w.and("+" + id + " >= 0")
	case MySQL:
		w.and(id + " + 0 >= 0")
	default:
		w.and(id + " >= 0")
	}
	t.markerConds(w)
}

// markerConds adds the conditions that make a row a marker: the filter,
// and no shadow in the side table.
func (t *TableKV) markerConds(w *where) {
	t.filterCond(w)
	if w.bare {
		return
	}
	w.and("NOT EXISTS (SELECT 1 FROM " + t.side.table + " WHERE " + t.side.table + ".marker = " + t.shadowExpr(w) + ")")
}

func (t *TableKV) filterCond(w *where) {
	if t.filter != "" {
		w.and("(" + t.filter + ")")
	}
}

// shadowExpr is the key of the shadow of the row: the prefix, '~' and the
// id in decimal.
func (t *TableKV) shadowExpr(w *where) string {
	ph := w.arg([]byte(t.shadow))
	id := t.col(t.id)
	switch t.d {
	case PostgreSQL:
		return ph + "::bytea || CAST(CAST(" + id + " AS text) AS bytea)"
	case SQLite:
		return "CAST(" + ph + " || " + id + " AS BLOB)"
	}
	return "CONCAT(" + ph + ", " + id + ")"
}

// shadowKey returns the side table's key that shadows the row of id.
func (t *TableKV) shadowKey(id int64) []byte {
	return fmt.Appendf([]byte(t.shadow), "%d", id)
}

// row is a row of the table read as a marker.
type row struct {
	ms, id int64
	at     time.Time // the Time column's value, Timestamp
	unix   int64     // the Time column's value, UnixMilli
}

// timeArg returns the Time column's value of r, as an argument.
func (t *TableKV) timeArg(r row) any {
	if t.unit == UnixMilli {
		return r.unix
	}
	return r.at
}

// ceilMs returns the millisecond of a time, rounded up.
func ceilMs(at time.Time) int64 {
	ms := at.UnixMilli()
	if time.UnixMilli(ms).Before(at) {
		ms++
	}
	return ms
}

// readRows runs q, a SELECT of the id and Time columns, and returns its
// rows, with room for want of them.
func (t *TableKV) readRows(ctx context.Context, db execer, q string, args []any, want int) ([]row, error) {
	rs, err := query(ctx, t.d, db, q, args)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	out := make([]row, 0, want)
	var r row
	dst := []any{&r.id, &r.unix}
	if t.unit == Timestamp {
		dst[1] = &r.at
	}
	for rs.Next() {
		if err := rs.Scan(dst...); err != nil {
			return nil, fmt.Errorf("sqlkv: table %s: %w", t.name, err)
		}
		r.ms = r.unix
		if t.unit == Timestamp {
			r.ms = ceilMs(r.at)
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

// selectRows is the start of a SELECT of rows as markers.
func (t *TableKV) selectRows() string {
	return "SELECT " + t.col(t.id) + ", " + t.col(t.tm) + " FROM " + t.table + " WHERE "
}

// order is the index's order.
func (t *TableKV) order() string { return " ORDER BY " + t.col(t.tm) + ", " + t.col(t.id) }

// viewScan reads the first limit rows whose keys lie in [lo, hi), in key
// order. The index orders rows by time, and keys by millisecond, then id:
// the rows of the last page's last millisecond that the index puts after
// its last row are read too, so that none is skipped.
func (t *TableKV) viewScan(ctx context.Context, db execer, lo, hi viewPos, limit int) ([]row, error) {
	w := &where{d: t.d}
	t.rangeConds(w, lo, hi)
	rows, err := t.readRows(ctx, db, t.selectRows()+w.String()+t.order()+fmt.Sprintf(" LIMIT %d", limit), w.args, limit)
	if err != nil || len(rows) < limit {
		return rows, err
	}
	// Rows of the last row's millisecond that the index puts after it
	// belong in the page when their ids are below the largest of that
	// millisecond in the page. Those of the last row's very time come in
	// id order, so only those below it can: one range of the index; then
	// those of the millisecond's later times (a few: River finalizes a
	// batch at one time), not the millisecond's every row on every page.
	last := rows[len(rows)-1]
	var top int64
	for _, r := range rows {
		if r.ms == last.ms {
			top = max(top, r.id)
		}
	}
	var more []row
	read := func(extra func(w *where)) error {
		w = t.rebuild(w, lo, hi, extra)
		// At most limit of them can be in the page: those of the smallest ids.
		q := t.selectRows() + w.String() + " ORDER BY " + t.col(t.id) + fmt.Sprintf(" LIMIT %d", limit)
		got, err := t.readRows(ctx, db, q, w.args, 16)
		more = append(more, got...)
		return err
	}
	if top > last.id {
		err = read(func(w *where) {
			w.and(t.col(t.tm) + " = " + w.arg(t.timeArg(last)))
			w.and(t.col(t.id) + " > " + w.arg(last.id))
			w.and(t.col(t.id) + " < " + w.arg(top))
		})
	}
	if err == nil {
		err = read(func(w *where) {
			w.and(t.col(t.tm) + " > " + w.arg(t.timeArg(last)))
			w.and(t.col(t.tm) + " <= " + w.arg(t.bound(last.ms)))
			w.and(t.col(t.id) + " < " + w.arg(top))
		})
	}
	if err != nil {
		return nil, err
	}
	rows = append(rows, more...)
	sortRows(rows)
	return rows[:limit], nil
}

// rebuild returns the conditions of rangeConds over [lo, hi) and those
// extra adds, in a where like w.
func (t *TableKV) rebuild(w0 *where, lo, hi viewPos, extra func(*where)) *where {
	w := &where{d: t.d, bare: w0.bare}
	t.rangeConds(w, lo, hi)
	extra(w)
	return w
}

// sortRows sorts rows in key order.
func sortRows(rows []row) {
	slices.SortFunc(rows, func(a, b row) int {
		if a.ms != b.ms {
			return cmpInt(a.ms, b.ms)
		}
		return cmpInt(a.id, b.id)
	})
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Scan implements retention.KV: the side table's keys of [start, end)
// and the rows' keys there, merged in order. The side table's shadows are
// never returned.
func (t *TableKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("sqlkv: Scan limit must be at least 1, got %d", limit)
	}
	keys, err := t.scanSide(ctx, start, end, limit)
	if err != nil {
		return nil, err
	}
	lo, hi := t.posOf(start), t.posOf(end)
	if !lo.less(hi) {
		return keys, nil
	}
	rows, err := t.viewScan(ctx, t.side.db, lo, hi, limit)
	if err != nil {
		return nil, wrap(ctx, "scan "+t.table, err)
	}
	if len(rows) == 0 {
		return keys, nil
	}
	for _, r := range rows {
		keys = append(keys, t.rowKey(nil, r.ms, r.id))
	}
	slices.SortFunc(keys, bytes.Compare)
	keys = slices.CompactFunc(keys, bytes.Equal)
	return keys[:min(len(keys), limit)], nil
}

// shadowRange returns the bounds of the side table's shadow keys.
func (t *TableKV) shadowRange() (lo, hi []byte) {
	return []byte(t.shadow), []byte(t.prefix + "\x7f")
}

// scanSide reads up to limit keys of [start, end) from the side table,
// around its shadows.
func (t *TableKV) scanSide(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	slo, shi := t.shadowRange()
	keys, err := t.side.Scan(ctx, start, minKey(end, slo), limit)
	if err != nil || len(keys) == limit {
		return keys, err
	}
	more, err := t.side.Scan(ctx, maxKey(start, shi), end, limit-len(keys))
	return append(keys, more...), err
}

func minKey(a, b []byte) []byte {
	if bytes.Compare(a, b) < 0 {
		return a
	}
	return b
}

func maxKey(a, b []byte) []byte {
	if bytes.Compare(a, b) > 0 {
		return a
	}
	return b
}
