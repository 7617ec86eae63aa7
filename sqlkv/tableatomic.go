package sqlkv

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/marksweep/retention"
)

// AtomicTableKV is a TableKV that deletes the rows of the markers it is
// given, with the ClearFunc's statements for what depends on them, in one
// transaction: a retention.ClearDeleter and a retention.RunClearer. The
// rows are the entities' state and their markers at once, so each is
// cleared exactly once, with no lease. A run (ClearRun) picks its rows
// by the index's range and deletes them in one statement, with no keys
// sent to the database. Create one with TableKV.WithClear, and give it to
// retention.New with neither Config.Clear nor Config.ClearBatch set.
type AtomicTableKV struct {
	*TableKV
	clear ClearFunc
}

var (
	_ retention.RunCounter = (*AtomicTableKV)(nil)
	_ retention.Mover      = (*AtomicTableKV)(nil)
)

// WithClear returns an AtomicTableKV over t's table. clear runs after the
// rows' deletion in its transaction, with the ids of the rows deleted
// (their values zero-padded to 20 digits); nil means the rows are the
// whole state. A retention.ErrLiveAgain of clear, for an id or the whole
// call, fails the id instead: its marker is its row, still finished,
// which the sweep would delete with nothing cleared. A row is live again
// when its Time column is NULL again or it fails the Filter; the store
// then says so itself.
func (t *TableKV) WithClear(clear ClearFunc) *AtomicTableKV {
	return &AtomicTableKV{TableKV: t, clear: clear}
}

// clearIDs runs the ClearFunc, if any, and refuses its ErrLiveAgain (see
// notLiveAgain).
func (a *AtomicTableKV) clearIDs(ctx context.Context, tx *sql.Tx, ids []string) error {
	if a.clear == nil || len(ids) == 0 {
		return nil
	}
	return a.notLiveAgain(a.clear(ctx, tx, ids))
}

// notLiveAgain turns a ClearFunc's retention.ErrLiveAgain, for the whole
// call or for an id of a BatchError, into a failure of the id (see
// WithClear).
func (a *AtomicTableKV) notLiveAgain(err error) error {
	refused := func(what string, e error) error {
		return fmt.Errorf("sqlkv: the ClearFunc says %s is live again, but its row in %s is still a finished row, its marker, which the sweep would delete with nothing cleared: set its %s to NULL, or make it fail the filter, to keep it (%v)",
			what, a.name, a.tm, e)
	}
	var be retention.BatchError
	switch {
	case errors.As(err, &be):
		var out retention.BatchError
		for id, e := range be {
			if errors.Is(e, retention.ErrLiveAgain) {
				if out == nil {
					out = maps.Clone(be)
				}
				out[id] = refused("id "+id, e)
			}
		}
		if out != nil {
			return out
		}
	case errors.Is(err, retention.ErrLiveAgain):
		return refused("every id of the call", err)
	}
	return err
}

// fencedAtomic returns the view of a fenced by the lease whose fence ctx
// carries, nil when it carries none.
func (a *AtomicTableKV) fencedAtomic(ctx context.Context) (*fencedAtomicTable, error) {
	view, err := retention.Fenced(ctx, a)
	if err != nil || view == nil {
		return nil, err
	}
	f, ok := view.(*fencedAtomicTable)
	if !ok {
		return nil, fmt.Errorf("sqlkv: the fenced view of an AtomicTableKV is a %T, not a *fencedAtomicTable", view)
	}
	return f, nil
}

// ClearAndDelete implements retention.ClearDeleter. In one transaction it
// deletes the rows of keys that are rows' markers and the side keys of
// the others (with their rows, unless they finished again since), runs
// the ClearFunc and commits; when a key is no longer there it rolls back
// and returns an error matching retention.ErrMarkerGone.
func (a *AtomicTableKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	f, err := a.fencedAtomic(ctx)
	switch {
	case err != nil:
		return err
	case f != nil:
		return a.clearAndDelete(ctx, ids, keys, f.lease)
	}
	return a.clearAndDelete(ctx, ids, keys, nil)
}

func (a *AtomicTableKV) clearAndDelete(ctx context.Context, ids []string, keys [][]byte, lease *sqlLease) error {
	op := "clear and delete from"
	return a.inTx(ctx, op, lease, func(tx *sql.Tx) error {
		rows, side, err := a.split(ctx, tx, keys)
		if err != nil {
			return err
		}
		if err := a.refuseLiveAgain(ctx, tx, side); err != nil {
			return err
		}
		n, err := a.deleteRows(ctx, tx, rows)
		if err != nil {
			return err
		}
		gone, err := a.deleteSide(ctx, tx, side)
		if err != nil {
			return err
		}
		if want := len(rows) + len(side); int(n+gone) != want {
			return fmt.Errorf("sqlkv: %s %s: %w (%d of %d markers deleted)", op, a.table, retention.ErrMarkerGone, n+gone, want)
		}
		if err := a.refuseShadowed(ctx, tx, rows); err != nil {
			return fmt.Errorf("sqlkv: %s %s: %w (%w)", op, a.table, retention.ErrMarkerGone, err)
		}
		return a.clearIDs(ctx, tx, ids)
	})
}

// refuseLiveAgain returns a retention.BatchError that says
// retention.ErrLiveAgain for each side key of keys whose row is no longer
// the marker it stood for: the row runs again, or finished again since.
// Its dependents are the new run's: the sweep drops the key, and the row
// is a marker again at its new finish time.
func (a *AtomicTableKV) refuseLiveAgain(ctx context.Context, tx *sql.Tx, keys [][]byte) error {
	live := retention.BatchError{}
	for _, k := range keys {
		e, ok := a.entityOf(k)
		if !ok {
			continue
		}
		cond := "1 = 1" // PostgreSQL takes no integer for a condition
		if a.filter != "" {
			cond = "(" + a.filter + ")"
		}
		w := &where{d: a.d}
		q := "SELECT " + a.col(a.tm) + ", CASE WHEN " + cond + " THEN 1 ELSE 0 END FROM " + a.table +
			" WHERE " + a.col(a.id) + " = " + w.arg(e.id) + a.forUpdate()
		var tm sql.Null[any]
		var marker int
		err := queryRow(ctx, a.d, tx, q, w.args, &tm, &marker)
		if errors.Is(err, sql.ErrNoRows) {
			continue // gone: its dependents go too
		}
		if err != nil {
			return wrap(ctx, "read "+a.table, err)
		}
		ms := int64(-1)
		if tm.Valid {
			if ms, err = a.msOf(tm.V); err != nil {
				return err
			}
		}
		if !tm.Valid || marker == 0 || ms > e.ms {
			live[fmt.Sprintf("%020d", e.id)] = retention.ErrLiveAgain
		}
	}
	if len(live) > 0 {
		return live
	}
	return nil
}

// msOf returns the millisecond of a Time column's value as a driver gives
// it, rounded up.
func (t *TableKV) msOf(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case int:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case []byte:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return n, nil
		}
	case time.Time:
		return ceilMs(x), nil
	}
	return 0, fmt.Errorf("sqlkv: table %s: the %s column reads as a %T, want a time or an integer", t.name, t.tm, v)
}

// ClearRun implements retention.RunClearer. In one transaction it finds
// where the first limit markers of [from, end) end in the index, deletes
// the rows up to there in one statement (the ids and times come back with
// the deletion), runs the ClearFunc with their ids, and commits; it
// returns their keys, ascending. The side table's markers in the range (a
// Put's key, one requeued to another time: rare) are taken too, the run
// being the first limit keys of both. A run that would hold a key that is
// no marker of prefix (a retry or parked key, a foreign key, the rows
// when prefix is not the table's), or a side key whose row ran or
// finished again since, is refused with an error matching
// retention.ErrMalformedMarker, having changed nothing: the sweep reads
// that page itself. When ctx carries a lease's fence (retention.Fenced),
// the run is fenced by it.
func (a *AtomicTableKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	f, err := a.fencedAtomic(ctx)
	switch {
	case err != nil:
		return nil, err
	case f != nil:
		return a.clearRun(ctx, prefix, from, end, limit, f.lease, nil, false)
	}
	return a.clearRun(ctx, prefix, from, end, limit, nil, nil, false)
}

// shadows returns the ids of the rows the side table shadows, as
// decimal text; locked, it reads them as committed now, past the
// snapshot of a MySQL transaction.
func (t *TableKV) shadows(ctx context.Context, tx *sql.Tx, locked bool) (map[string]bool, error) {
	lo, hi := t.shadowRange()
	q := "SELECT marker FROM " + t.side.table + " WHERE marker >= " + t.d.phs(1, 1) + " AND marker < " + t.d.phs(2, 1)
	if locked {
		q += t.d.lockShare()
	}
	keys, err := readKeys(ctx, t.d, tx, q, []any{lo, hi}, 16)
	if err != nil {
		return nil, wrap(ctx, "read "+t.side.table, err)
	}
	ids := make(map[string]bool, len(keys))
	for _, k := range keys {
		ids[string(k[len(lo):])] = true
	}
	return ids, nil
}

// refuseShadowed returns an error when a row of rows, deleted in tx as a
// marker, has a shadow now: a Move that committed while the deletion
// waited for the row's lock (or, for a run that found no shadow, before
// the deletion) made it no marker, and the statement did not see that.
func (a *AtomicTableKV) refuseShadowed(ctx context.Context, tx *sql.Tx, rows []row) error {
	if len(rows) == 0 {
		return nil
	}
	ids, err := a.shadows(ctx, tx, true)
	if err != nil || len(ids) == 0 {
		return err
	}
	for _, r := range rows {
		if ids[strconv.FormatInt(r.id, 10)] {
			return fmt.Errorf("%w: row %d was made no marker meanwhile", errRowsMoved, r.id)
		}
	}
	return nil
}

// CountRun implements retention.RunCounter: it clears a run as ClearRun
// does, and returns the run's count, first time and last key, and its
// markers' times when times is set, instead of its keys, which a run of
// the table's own rows never builds; on PostgreSQL, a run asked for no
// times sends back no row. An AtomicTableKV with a ClearFunc, which needs
// the ids, returns an error matching errors.ErrUnsupported.
func (a *AtomicTableKV) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (retention.RunCount, error) {
	var c retention.RunCount
	if a.clear != nil {
		return c, fmt.Errorf("sqlkv: count a run of %s: its ClearFunc needs the ids: %w", a.table, errors.ErrUnsupported)
	}
	f, err := a.fencedAtomic(ctx)
	var lease *sqlLease
	switch {
	case err != nil:
		return c, err
	case f != nil:
		lease = f.lease
	}
	if _, err := a.clearRun(ctx, prefix, from, end, limit, lease, &c, times); err != nil {
		return retention.RunCount{}, err
	}
	return c, nil
}

// countRows sets c to the count of rows, in key order, with their times
// when times is set.
func (a *AtomicTableKV) countRows(c *retention.RunCount, rows []row, times bool) {
	if len(rows) == 0 {
		return
	}
	if times {
		c.Times = make([]int64, len(rows))
		for i, r := range rows {
			c.Times[i] = r.ms
		}
	}
	last := rows[len(rows)-1]
	c.N, c.First, c.Last = len(rows), rows[0].ms, a.rowKey(nil, last.ms, last.id)
}

// countKeys sets c to the count of keys, markers of prefix in key order,
// with their times when times is set.
func countKeys(c *retention.RunCount, prefix string, keys [][]byte, times bool) {
	if len(keys) == 0 {
		return
	}
	if times {
		c.Times = make([]int64, len(keys))
	}
	for i, k := range keys {
		t, _, _ := retention.ParseMarkerKey(prefix, k)
		if times {
			c.Times[i] = t.UnixMilli()
		}
		if i == 0 {
			c.First = t.UnixMilli()
		}
	}
	c.N, c.Last = len(keys), keys[len(keys)-1]
}

// RunStore implements retention.RunClearer.
func (a *AtomicTableKV) RunStore() retention.RunClearer { return a }

// errRowsMoved refuses a run whose rows changed between its reads and its
// deletion.
var errRowsMoved = errors.New("rows changed while the run was picked")

func (a *AtomicTableKV) clearRun(ctx context.Context, prefix string, from, end []byte, limit int, lease *sqlLease, count *retention.RunCount, times bool) ([][]byte, error) {
	if limit < 1 {
		return nil, fmt.Errorf("sqlkv: ClearRun limit must be at least 1, got %d", limit)
	}
	op := "clear a run of " + a.table
	lo, hi := a.posOf(from), a.posOf(end)
	var keys [][]byte
	err := a.inTx(ctx, "clear a run of", lease, func(tx *sql.Tx) error {
		keys = nil
		if count != nil {
			*count = retention.RunCount{}
		}
		shadows, err := a.shadows(ctx, tx, false)
		if err != nil {
			return err
		}
		bare := len(shadows) == 0
		if a.ordered() && prefix == a.prefix && lo.less(hi) && (count == nil || times) {
			// The common case: no side key in the range, and a run that
			// is the index's first rows, sent back (a count asked for no
			// times sends none: see countRun).
			side, err := a.sideRun(ctx, tx, prefix, from, end, limit)
			if err != nil {
				return fmt.Errorf("sqlkv: %s: %w", op, err)
			}
			if len(side) == 0 {
				rows, err := a.orderedRun(ctx, tx, lo, hi, limit, bare)
				if err != nil {
					return err
				}
				if err := a.refuseShadowed(ctx, tx, rows); err != nil {
					return fmt.Errorf("sqlkv: %s: %w: %w", op, retention.ErrMalformedMarker, err)
				}
				if count != nil {
					a.countRows(count, rows, times)
					return nil // no ClearFunc (see CountRun)
				}
				var ids []string
				keys, ids = a.runKeys(rows, a.clear != nil)
				if len(keys) == 0 {
					return nil
				}
				return a.clearIDs(ctx, tx, ids)
			}
		}
		var cut *runCut
		var last []byte
		if lo.less(hi) {
			if cut, last, err = a.runEnd(ctx, tx, lo, hi, limit, bare); err != nil {
				return err
			}
		}
		// The side table's keys up to the rows' run belong in it.
		sideEnd := end
		if last != nil {
			sideEnd = append(last, 0)
		}
		side, err := a.sideRun(ctx, tx, prefix, from, sideEnd, limit)
		if err != nil {
			return fmt.Errorf("sqlkv: %s: %w", op, err)
		}
		if prefix != a.prefix && (cut != nil || lo.less(hi) && a.anyRow(ctx, tx, lo, hi)) {
			return fmt.Errorf("sqlkv: %s: %w: its rows are markers of %q, not %q", op, retention.ErrMalformedMarker, a.prefix, prefix)
		}
		if len(side) > 0 {
			// Rare: a key Put or requeued to another time. The run is the
			// first limit keys of both, up to the limit-th.
			if cut, hi, side, err = a.mergeRun(ctx, tx, lo, hi, side, limit); err != nil {
				return err
			}
		}
		if err := a.refuseLiveAgain(ctx, tx, side); err != nil {
			// The page path asks ClearAndDelete, whose answer says so.
			return fmt.Errorf("sqlkv: %s: %w: %w", op, retention.ErrMalformedMarker, err)
		}
		if count != nil && bare && cut != nil && len(side) == 0 && (a.returning || !times) && prefix == a.prefix {
			// The run's end is known: only the times come back, or no row.
			return a.countRun(ctx, tx, count, lo, hi, cut, limit, times)
		}
		var rows []row
		if prefix == a.prefix && lo.less(hi) {
			if rows, err = a.deleteRun(ctx, tx, lo, hi, cut, limit, bare); err != nil {
				return err
			}
		}
		if len(rows)+len(side) > limit {
			return fmt.Errorf("sqlkv: %s: %w: %w", op, retention.ErrMalformedMarker, errRowsMoved)
		}
		if err := a.refuseShadowed(ctx, tx, rows); err != nil {
			return fmt.Errorf("sqlkv: %s: %w: %w", op, retention.ErrMalformedMarker, err)
		}
		if n, err := a.deleteSide(ctx, tx, side); err != nil || n != int64(len(side)) {
			if err == nil {
				err = fmt.Errorf("sqlkv: %s: %w: %w", op, retention.ErrMalformedMarker, errRowsMoved)
			}
			return err
		}
		if len(rows)+len(side) == 0 {
			return nil
		}
		sortRows(rows)
		if count != nil && len(side) == 0 {
			a.countRows(count, rows, times)
			return nil // no ClearFunc (see CountRun)
		}
		var ids []string
		keys, ids = a.runKeys(rows, a.clear != nil)
		if len(side) > 0 {
			keys, ids = mergeKeys(prefix, keys, side)
		}
		if count != nil {
			countKeys(count, prefix, keys, times)
			keys = nil
		}
		return a.clearIDs(ctx, tx, ids)
	})
	var be retention.BatchError
	if err != nil && keys != nil && errors.As(err, &be) {
		// The ClearFunc's answers, per id of the keys the run took: a
		// hold is no failure of the call.
		return keys, err
	}
	if err != nil {
		return nil, err
	}
	return keys, nil
}

// sideRun returns up to limit keys of the side table in [from, end), past
// its shadows, or an error matching retention.ErrMalformedMarker when one
// is no marker of prefix whose id retention.ValidateID accepts.
func (t *TableKV) sideRun(ctx context.Context, tx *sql.Tx, prefix string, from, end []byte, limit int) ([][]byte, error) {
	slo, shi := t.shadowRange()
	var out [][]byte
	for _, r := range [][2][]byte{{from, minKey(end, slo)}, {maxKey(from, shi), end}} {
		if bytes.Compare(r[0], r[1]) >= 0 || len(out) == limit {
			continue
		}
		q := "SELECT marker FROM " + t.side.table + " WHERE marker >= " + t.d.phs(1, 1) + " AND marker < " + t.d.phs(2, 1) +
			fmt.Sprintf(" ORDER BY marker LIMIT %d", limit-len(out)) + t.forUpdate()
		keys, err := readKeys(ctx, t.d, tx, q, []any{nonNil(r[0]), nonNil(r[1])}, 1)
		if err != nil {
			return nil, wrap(ctx, "read "+t.side.table, err)
		}
		out = append(out, keys...)
	}
	for _, k := range out {
		_, _, err := retention.ParseMarkerKey(prefix, k)
		if err == nil && (len(k) == len(prefix) || k[len(prefix)] < '0' || k[len(prefix)] > '9') {
			err = fmt.Errorf("%w %q: a key of the retry or parked range", retention.ErrMalformedMarker, k)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// mergeRun returns the run of the rows of [lo, hi) and of side, keys of
// the side table in that range: their first limit keys. It reads the
// rows' keys, and returns the run's end among the rows and the side keys
// it holds.
func (a *AtomicTableKV) mergeRun(ctx context.Context, tx *sql.Tx, lo, hi viewPos, side [][]byte, limit int) (*runCut, viewPos, [][]byte, error) {
	var rowKeys [][]byte
	if lo.less(hi) {
		rows, err := a.viewScan(ctx, tx, lo, hi, limit)
		if err != nil {
			return nil, hi, nil, wrap(ctx, "read "+a.table, err)
		}
		for _, r := range rows {
			rowKeys = append(rowKeys, a.rowKey(nil, r.ms, r.id))
		}
	}
	all := append(slices.Clone(rowKeys), side...)
	slices.SortFunc(all, bytes.Compare)
	if len(all) < limit {
		return nil, hi, side, nil // every key of the range
	}
	b := all[limit-1]
	hi = a.posOf(append(slices.Clone(b), 0))
	return nil, hi, slices.DeleteFunc(side, func(k []byte) bool { return bytes.Compare(k, b) > 0 }), nil
}

// mergeKeys returns the run's keys, rows' and side table's, ascending,
// and their ids under prefix.
func mergeKeys(prefix string, rows, side [][]byte) ([][]byte, []string) {
	keys := append(rows, side...)
	slices.SortFunc(keys, bytes.Compare)
	ids := make([]string, len(keys))
	for i, k := range keys {
		_, id, _ := retention.ParseMarkerKey(prefix, k)
		ids[i] = string(id)
	}
	return keys, ids
}

// runKeys returns the keys of rows and their ids, the keys in one
// buffer (each capped at its end, so that an append copies it) and the
// ids (when the ClearFunc needs them) substrings of one string: a run's
// ten thousand allocations each were a third of the client's time.
func (a *AtomicTableKV) runKeys(rows []row, withIDs bool) (keys [][]byte, ids []string) {
	n := len(a.prefix) + viewLen
	buf := make([]byte, 0, n*len(rows))
	for _, r := range rows {
		buf = a.rowKey(buf, r.ms, r.id)
	}
	keys = make([][]byte, len(rows))
	for i := range rows {
		keys[i] = buf[i*n : (i+1)*n : (i+1)*n]
	}
	if !withIDs {
		return keys, nil
	}
	all := string(buf)
	ids = make([]string, len(rows))
	for i := range rows {
		ids[i] = all[(i+1)*n-retention.TimestampWidth : (i+1)*n]
	}
	return keys, ids
}

// runCut is where a run ends in the index: every row of millisecond
// before ms, and those of ms up to id.
type runCut struct {
	ms, id int64
}

// runEnd returns where the first limit markers of [lo, hi) end, with the
// last one's key, or a nil cut when fewer are there. The index orders a
// millisecond's rows by time, the keys by id: the run takes the
// millisecond's rows of the smallest ids.
func (a *AtomicTableKV) runEnd(ctx context.Context, tx *sql.Tx, lo, hi viewPos, limit int, bare bool) (*runCut, []byte, error) {
	w := &where{d: a.d, bare: bare}
	a.rangeConds(w, lo, hi)
	q := a.selectRows() + w.String() + a.order() + fmt.Sprintf(" LIMIT 1 OFFSET %d", limit-1)
	nth, err := a.readRows(ctx, tx, q, w.args, 1)
	if err != nil || len(nth) == 0 {
		return nil, nil, wrap(ctx, "read "+a.table, err)
	}
	n := nth[0]
	if a.unit == UnixMilli {
		// A millisecond is one value of the column: the index orders its
		// rows by id, as their keys.
		return &runCut{ms: n.ms, id: n.id}, a.rowKey(nil, n.ms, n.id), nil
	}
	// The run holds the rows before n in the index, and as many of n's
	// millisecond as the index put before n, plus one: those of the
	// smallest ids. Counted and picked in the database, which sorts only
	// the millisecond's rows (River finalizes a batch at one time).
	inBucket := func(w *where) { a.inMs(w, n.ms) }
	w = a.rebuild(w, lo, hi, func(w *where) {
		inBucket(w)
		w.and("(" + a.col(a.tm) + ", " + a.col(a.id) + ") < (" + w.arg(a.timeArg(n)) + ", " + w.arg(n.id) + ")")
	})
	var k int64
	if err := queryRow(ctx, a.d, tx, "SELECT count(*) FROM "+a.table+" WHERE "+w.String(), w.args, &k); err != nil {
		return nil, nil, wrap(ctx, "read "+a.table, err)
	}
	w = a.rebuild(w, lo, hi, inBucket)
	var id int64
	q = "SELECT " + a.col(a.id) + " FROM " + a.table + " WHERE " + w.String() + " ORDER BY " + a.col(a.id) + fmt.Sprintf(" LIMIT 1 OFFSET %d", k)
	if err := queryRow(ctx, a.d, tx, q, w.args, &id); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil, fmt.Errorf("sqlkv: clear a run of %s: %w: %w", a.table, retention.ErrMalformedMarker, errRowsMoved)
		}
		return nil, nil, wrap(ctx, "read "+a.table, err)
	}
	cut := &runCut{ms: n.ms, id: id}
	return cut, a.rowKey(nil, cut.ms, cut.id), nil
}

// anyRow reports whether a marker lies in [lo, hi).
func (a *AtomicTableKV) anyRow(ctx context.Context, tx *sql.Tx, lo, hi viewPos) bool {
	w := &where{d: a.d}
	a.rangeConds(w, lo, hi)
	rows, err := a.readRows(ctx, tx, a.selectRows()+w.String()+" LIMIT 1", w.args, 1)
	return err != nil || len(rows) > 0
}

// deleteRun deletes the markers of [lo, hi) up to cut (all of them when
// nil) and returns their rows.
func (a *AtomicTableKV) deleteRun(ctx context.Context, tx *sql.Tx, lo, hi viewPos, cut *runCut, limit int, bare bool) ([]row, error) {
	w := &where{d: a.d, bare: bare}
	a.rangeConds(w, lo, hi)
	a.cutConds(w, cut)
	if a.returning {
		q := "DELETE FROM " + a.table + " WHERE " + w.String() + " RETURNING " + a.col(a.id) + ", " + a.col(a.tm)
		rows, err := a.readRows(ctx, tx, q, w.args, limit)
		return rows, wrap(ctx, "delete from "+a.table, err)
	}
	// MySQL has no RETURNING (MariaDB has, and takes the path above), and
	// SQLite's cost more than a read of the index and a DELETE that
	// returns nothing (2.55 against 1.64 us an entity): the rows are read
	// (locked on MySQL; SQLite's transaction holds the write lock) and the
	// delete must take exactly them.
	rows, err := a.readRows(ctx, tx, a.selectRows()+w.String()+a.forUpdate(), w.args, limit)
	if err != nil || len(rows) == 0 {
		return nil, wrap(ctx, "read "+a.table, err)
	}
	n, err := exec(ctx, a.d, tx, "DELETE FROM "+a.table+" WHERE "+w.String(), w.args)
	if err != nil {
		return nil, wrap(ctx, "delete from "+a.table, err)
	}
	if n != int64(len(rows)) {
		return nil, fmt.Errorf("sqlkv: clear a run of %s: %w: %w", a.table, retention.ErrMalformedMarker, errRowsMoved)
	}
	return rows, nil
}

// countRun deletes the limit markers of [lo, hi) up to cut, found with no
// shadow, and sets c to their count: with times, only their times come
// back; without, no row does, and the first time is read before.
//
// The cut's row, and without times the first row, are locked before the
// DELETE: neither can leave the run meanwhile, so Last and First are rows
// the DELETE takes, and a row that comes into the run meanwhile makes the
// count exceed the limit, which refuses the run. (A row that comes in
// before the first while another of the run leaves would make First a
// little late: a MaxLag a little short, no more.) SQLite's transaction
// holds the write lock from its start (see SQLite): nothing else writes
// between its reads and its DELETE, so neither the cut's lock nor the
// shadows' second read is needed there, and a run is two statements
// fewer.
func (a *AtomicTableKV) countRun(ctx context.Context, tx *sql.Tx, c *retention.RunCount, lo, hi viewPos, cut *runCut, limit int, times bool) error {
	op := "clear a run of " + a.table
	moved := fmt.Errorf("sqlkv: %s: %w: %w", op, retention.ErrMalformedMarker, errRowsMoved)
	inRange := func() *where {
		w := &where{d: a.d, bare: true}
		a.rangeConds(w, lo, hi)
		return w
	}
	var first int64
	if !times {
		w := inRange()
		rows, err := a.readRows(ctx, tx, a.selectRows()+w.String()+a.order()+" LIMIT 1"+a.forUpdate(), w.args, 1)
		if err != nil {
			return wrap(ctx, "read "+a.table, err)
		}
		if len(rows) != 1 {
			return moved
		}
		first = rows[0].ms
	}
	if a.d != SQLite {
		w := inRange()
		a.inMs(w, cut.ms)
		w.and(a.col(a.id) + " = " + w.arg(cut.id))
		if rows, err := a.readRows(ctx, tx, a.selectRows()+w.String()+a.forUpdate(), w.args, 1); err != nil || len(rows) != 1 {
			if err != nil {
				return wrap(ctx, "read "+a.table, err)
			}
			return moved // the cut left the run
		}
	}
	w := inRange()
	a.cutConds(w, cut)
	var got []int64
	n := 0 // rows deleted
	if times {
		var err error
		if got, err = a.deleteTimes(ctx, tx, w, limit); err != nil {
			return err
		}
		if n = len(got); n > 0 {
			slices.Sort(got)
			first = got[0]
		}
	} else {
		q := "DELETE FROM " + a.table + " WHERE " + w.String()
		if a.d == MySQL {
			// Else planned on the primary key, or as a scan of the table.
			// One row more than the run: a row that came into its range
			// since its end was found is then counted, and refused.
			q += a.order() + fmt.Sprintf(" LIMIT %d", limit+1)
		}
		m, err := exec(ctx, a.d, tx, q, w.args)
		if err != nil {
			return wrap(ctx, "delete from "+a.table, err)
		}
		n = int(m)
	}
	if n != limit {
		return moved // rows came or went since the run's end was found
	}
	// A Move that committed while the deletion waited for a row's lock
	// made it no marker (see refuseShadowed): which row, the count does
	// not say.
	if a.d != SQLite {
		if shadows, err := a.shadows(ctx, tx, true); err != nil || len(shadows) > 0 {
			if err == nil {
				err = moved
			}
			return err
		}
	}
	c.N, c.First, c.Last, c.Times = n, first, a.rowKey(nil, cut.ms, cut.id), got
	return nil
}

// deleteTimes deletes the rows of w and returns their times, or nil with
// an error.
func (a *AtomicTableKV) deleteTimes(ctx context.Context, tx *sql.Tx, w *where, limit int) ([]int64, error) {
	rs, err := query(ctx, a.d, tx, "DELETE FROM "+a.table+" WHERE "+w.String()+" RETURNING "+a.col(a.tm), w.args)
	if err != nil {
		return nil, wrap(ctx, "delete from "+a.table, err)
	}
	defer rs.Close()
	times := make([]int64, 0, limit)
	var at time.Time
	var ms int64
	dst := any(&ms)
	if a.unit == Timestamp {
		dst = &at
	}
	for rs.Next() {
		if err := rs.Scan(dst); err != nil {
			return nil, fmt.Errorf("sqlkv: table %s: %w", a.table, err)
		}
		if a.unit == Timestamp {
			ms = ceilMs(at)
		}
		times = append(times, ms)
	}
	if err := rs.Err(); err != nil {
		return nil, wrap(ctx, "delete from "+a.table, err)
	}
	return times, nil
}

// inMs adds the condition of the rows whose key's millisecond is ms: their
// time rounded up to it.
func (a *AtomicTableKV) inMs(w *where, ms int64) {
	w.and(a.col(a.tm) + " > " + w.arg(a.bound(ms-1)))
	w.and(a.col(a.tm) + " <= " + w.arg(a.bound(ms)))
}

// cutConds adds the condition of the rows up to cut, when not nil.
func (a *AtomicTableKV) cutConds(w *where, cut *runCut) {
	if cut == nil {
		return
	}
	tm := a.col(a.tm)
	w.and(tm + " <= " + w.arg(a.bound(cut.ms)))
	w.and("(" + tm + " <= " + w.arg(a.bound(cut.ms-1)) + " OR " + a.col(a.id) + " <= " + w.arg(cut.id) + ")")
}

// ordered reports whether a run is the index's first rows, taken without
// finding its end first: the Time column holds whole milliseconds, so the
// index's order (time, id) is the keys' order, on MySQL and SQLite, whose
// runs read their rows anyway or delete in the index's order. (A
// PostgreSQL DELETE takes no ORDER BY or LIMIT.)
func (a *AtomicTableKV) ordered() bool {
	return a.unit == UnixMilli && a.d != PostgreSQL
}

// orderedRun deletes the first limit markers of [lo, hi) and returns
// their rows, when ordered: on MariaDB in one DELETE ... ORDER BY ... LIMIT
// ... RETURNING, elsewhere by reading them (locked on MySQL; SQLite's
// transaction holds the write lock) and deleting the range up to the last.
// It saves the read of the run's end that runEnd makes: on MariaDB that
// read locked and sent back the run's rows a second time.
func (a *AtomicTableKV) orderedRun(ctx context.Context, tx *sql.Tx, lo, hi viewPos, limit int, bare bool) ([]row, error) {
	w := &where{d: a.d, bare: bare}
	a.rangeConds(w, lo, hi)
	first := a.order() + fmt.Sprintf(" LIMIT %d", limit)
	if a.returning {
		q := "DELETE FROM " + a.table + " WHERE " + w.String() + first + " RETURNING " + a.col(a.id) + ", " + a.col(a.tm)
		rows, err := a.readRows(ctx, tx, q, w.args, limit)
		if err != nil {
			return nil, wrap(ctx, "delete from "+a.table, err)
		}
		sortRows(rows)
		return rows, nil
	}
	rows, err := a.readRows(ctx, tx, a.selectRows()+w.String()+first+a.forUpdate(), w.args, limit)
	if err != nil || len(rows) == 0 {
		return nil, wrap(ctx, "read "+a.table, err)
	}
	var cut *runCut
	if len(rows) == limit {
		last := rows[len(rows)-1]
		cut = &runCut{ms: last.ms, id: last.id}
	}
	w = &where{d: a.d, bare: bare}
	a.rangeConds(w, lo, hi)
	a.cutConds(w, cut)
	n, err := exec(ctx, a.d, tx, "DELETE FROM "+a.table+" WHERE "+w.String(), w.args)
	if err != nil {
		return nil, wrap(ctx, "delete from "+a.table, err)
	}
	if n != int64(len(rows)) {
		return nil, fmt.Errorf("sqlkv: clear a run of %s: %w: %w", a.table, retention.ErrMalformedMarker, errRowsMoved)
	}
	return rows, nil
}

// fencedAtomicTable is an AtomicTableKV whose writes take effect only
// while its lease holds.
type fencedAtomicTable struct {
	*fencedTable
	a *AtomicTableKV
}

var _ retention.RunCounter = (*fencedAtomicTable)(nil)

func (f *fencedAtomicTable) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return f.a.clearAndDelete(ctx, ids, keys, f.lease)
}

func (f *fencedAtomicTable) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return f.a.clearRun(ctx, prefix, from, end, limit, f.lease, nil, false)
}

func (f *fencedAtomicTable) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (retention.RunCount, error) {
	if f.a.clear != nil {
		return f.a.CountRun(ctx, prefix, from, end, limit, times)
	}
	var c retention.RunCount
	if _, err := f.a.clearRun(ctx, prefix, from, end, limit, f.lease, &c, times); err != nil {
		return retention.RunCount{}, err
	}
	return c, nil
}

func (f *fencedAtomicTable) RunStore() retention.RunClearer { return f }
