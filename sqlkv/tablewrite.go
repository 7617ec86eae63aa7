package sqlkv

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"

	"github.com/marksweep/retention"
)

// inTx runs work in a transaction of its own, checked by lease when not
// nil as an AtomicKV's clear is: on SQLite as it begins, on MySQL and
// PostgreSQL with the lease row locked until the commit.
func (t *TableKV) inTx(ctx context.Context, op string, lease *sqlLease, work func(tx *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op += " " + t.table
	var idle int64
	if lease != nil {
		if lease.isLost() {
			return lease.refused(op)
		}
		if t.d == MySQL {
			idle = lease.l.idleSeconds()
		}
	}
	c, done, err := t.side.session(ctx, idle, false)
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer done()
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if lease != nil {
		if err := lease.enterTx(ctx, tx, op); err != nil {
			return err
		}
	}
	if err := work(tx); err != nil {
		return err
	}
	if lease != nil {
		if err := lease.checkTx(ctx, tx, op); err != nil {
			return err
		}
	}
	return wrap(ctx, op, tx.Commit())
}

// forUpdate locks what a SELECT reads on MySQL and PostgreSQL; SQLite's
// transactions hold the write lock from their start (see SQLite).
func (t *TableKV) forUpdate() string {
	if t.d == SQLite {
		return ""
	}
	return " FOR UPDATE"
}

// entity is a side key under the prefix that stands for a row: a marker,
// retry or parked key of a row's id, and the millisecond it finished.
type entity struct {
	id, ms int64
}

// entityOf returns what a side key stands for, when it is a key of the
// prefix whose id is a row's.
func (t *TableKV) entityOf(key []byte) (entity, bool) {
	at, id, err := retention.ParseMarkerKey(t.prefix, key)
	if err != nil || len(id) != retention.TimestampWidth {
		return entity{}, false
	}
	v, ok := digits(id)
	if !ok || v > 1<<63-1 {
		return entity{}, false
	}
	return entity{id: int64(v), ms: at.UnixMilli()}, true
}

// split parts keys into the rows' keys and the side table's. A key shaped
// like a row's whose id has a shadow is the side table's: the row is no
// marker while its entity has a side key (a Put's, or one requeued to
// another time).
func (t *TableKV) split(ctx context.Context, tx *sql.Tx, keys [][]byte) (rows []row, side [][]byte, err error) {
	var shadows map[string]bool
	for _, k := range keys {
		ms, id, ok := t.parseRowKey(k)
		if ok && shadows == nil {
			if shadows, err = t.shadows(ctx, tx, false); err != nil {
				return nil, nil, err
			}
		}
		if ok && !shadows[strconv.FormatInt(id, 10)] {
			rows = append(rows, row{ms: ms, id: id})
		} else {
			side = append(side, k)
		}
	}
	return rows, side, nil
}

// rowsCond adds the condition of the rows of keys: each id with its
// millisecond, and a marker.
func (t *TableKV) rowsCond(w *where, rows []row) {
	tm, id := t.col(t.tm), t.col(t.id)
	var b bytes.Buffer
	b.WriteByte('(')
	for i, r := range rows {
		if i > 0 {
			b.WriteString(" OR ")
		}
		fmt.Fprintf(&b, "(%s = %s AND %s > %s AND %s <= %s)", id, w.arg(r.id), tm, w.arg(t.bound(r.ms-1)), tm, w.arg(t.bound(r.ms)))
	}
	b.WriteByte(')')
	w.and(b.String())
	t.markerConds(w)
}

// rowsPerStatement is how many keys of rows one statement names: three
// arguments each.
const rowsPerStatement = 500

// deleteRows deletes the rows of keys that are markers and returns how
// many went.
func (t *TableKV) deleteRows(ctx context.Context, tx *sql.Tx, rows []row) (int64, error) {
	var n int64
	for i := 0; i < len(rows); i += rowsPerStatement {
		w := &where{d: t.d}
		t.rowsCond(w, rows[i:min(i+rowsPerStatement, len(rows))])
		m, err := exec(ctx, t.d, tx, "DELETE FROM "+t.table+" WHERE "+w.String(), w.args)
		if err != nil {
			return n, wrap(ctx, "delete from "+t.table, err)
		}
		n += m
	}
	return n, nil
}

// existingSide returns which of keys the side table holds, locked.
func (t *TableKV) existingSide(ctx context.Context, tx *sql.Tx, keys [][]byte) ([][]byte, error) {
	var out [][]byte
	for part := range chunks(keys, t.d.maxKeys()) {
		q := "SELECT marker FROM " + t.side.table + " WHERE marker IN (" + t.d.phs(1, len(part)) + ")" + t.forUpdate()
		got, err := readKeys(ctx, t.d, tx, q, anys(part), len(part))
		if err != nil {
			return nil, wrap(ctx, "read "+t.side.table, err)
		}
		out = append(out, got...)
	}
	return out, nil
}

// deleteSide deletes the side keys of keys and returns how many were
// there; for those that stand for a row, it deletes their shadows and the
// rows, unless a row finished again since. Only those are read first,
// locked: a locking read of the others let two Deletes of neighbouring
// keys deadlock on MySQL's gap locks.
func (t *TableKV) deleteSide(ctx context.Context, tx *sql.Tx, keys [][]byte) (int64, error) {
	var plain, owned [][]byte
	for _, k := range keys {
		if _, ok := t.entityOf(k); ok {
			owned = append(owned, k)
		} else {
			plain = append(plain, k)
		}
	}
	var n int64
	if len(plain) > 0 {
		var err error
		if n, err = t.side.deleteIn(ctx, tx, plain, nil); err != nil {
			return 0, err
		}
	}
	if len(owned) == 0 {
		return n, nil
	}
	present, err := t.existingSide(ctx, tx, owned)
	if err != nil || len(present) == 0 {
		return n, err
	}
	shadows := make([][]byte, 0, len(present))
	var ents []entity
	for _, k := range present {
		e, _ := t.entityOf(k)
		ents = append(ents, e)
		shadows = append(shadows, t.shadowKey(e.id))
	}
	if _, err := t.side.deleteIn(ctx, tx, append(present, shadows...), nil); err != nil {
		return 0, err
	}
	for _, e := range ents {
		w := &where{d: t.d}
		w.and(t.col(t.id) + " = " + w.arg(e.id))
		w.and(t.col(t.tm) + " <= " + w.arg(t.bound(e.ms)))
		t.filterCond(w)
		if _, err := exec(ctx, t.d, tx, "DELETE FROM "+t.table+" WHERE "+w.String(), w.args); err != nil {
			return 0, wrap(ctx, "delete from "+t.table, err)
		}
	}
	return n + int64(len(present)), nil
}

// Delete implements retention.KV: a row's key deletes the row, if it is
// still that marker (its finish time in the key's millisecond, its filter
// met, not shadowed); a side key goes, and with an entity's marker, retry
// or parked key its row too, unless it finished again since. When ctx
// carries a lease's fence (retention.Fenced), the delete is fenced by it;
// so are Put and Move.
func (t *TableKV) Delete(ctx context.Context, keys ...[]byte) error {
	if view, err := retention.Fenced(ctx, t); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.Delete(ctx, keys...)
	}
	return t.delete(ctx, keys, nil)
}

// inShadows refuses a key where the side table keeps its shadows: only
// the store writes and deletes them.
func (t *TableKV) inShadows(op string, keys ...[]byte) error {
	lo, hi := t.shadowRange()
	for _, k := range keys {
		if bytes.Compare(k, lo) >= 0 && bytes.Compare(k, hi) < 0 {
			return fmt.Errorf("sqlkv: %s %q: keys from %q on are the shadows of table %s's rows", op, k, lo, t.name)
		}
	}
	return nil
}

func (t *TableKV) delete(ctx context.Context, keys [][]byte, lease *sqlLease) error {
	if len(keys) == 0 {
		return ctx.Err()
	}
	if err := t.inShadows("Delete of", keys...); err != nil {
		return err
	}
	return t.inTx(ctx, "delete from", lease, func(tx *sql.Tx) error {
		rows, side, err := t.split(ctx, tx, keys)
		if err != nil {
			return err
		}
		if _, err := t.deleteRows(ctx, tx, rows); err != nil {
			return err
		}
		_, err = t.deleteSide(ctx, tx, side)
		return err
	})
}

// Put implements retention.Putter: it writes key to the side table, and a
// marker, retry or parked key of a row's id (a deadline, say) shadows the
// row, so that the key is the entity's one marker. It refuses a key where
// the side table keeps its shadows (the prefix and '~'); write a row's
// marker by setting its Time column.
func (t *TableKV) Put(ctx context.Context, key, value []byte) error {
	if view, err := retention.Fenced(ctx, t); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.(*fencedTable).Put(ctx, key, value)
	}
	return t.put(ctx, key, value, nil)
}

func (t *TableKV) put(ctx context.Context, key, value []byte, lease *sqlLease) error {
	if len(value) != 0 {
		return fmt.Errorf("sqlkv: Put of %q with a %d-byte value: the side table stores keys only", key, len(value))
	}
	if err := t.inShadows("Put of", key); err != nil {
		return err
	}
	return t.inTx(ctx, "insert into", lease, func(tx *sql.Tx) error {
		if e, ok := t.entityOf(key); ok {
			// The entity's marker is this key now: its row is none.
			if _, err := t.side.put(ctx, tx, t.shadowKey(e.id), nil); err != nil {
				return err
			}
		}
		_, err := t.side.put(ctx, tx, key, nil)
		return err
	})
}

// Move implements retention.Mover in one transaction. A row's key that is
// still its marker moves by shadowing the row and writing the new key to
// the side table; a side key moves by its deletion and the new key's
// write, and one moved back to its row's own key lifts the row's shadow
// instead.
func (t *TableKV) Move(ctx context.Context, from, to [][]byte) error {
	if err := checkMove(ctx, from, to); err != nil || len(from) == 0 {
		return err
	}
	if view, err := retention.Fenced(ctx, t); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.(*fencedTable).Move(ctx, from, to)
	}
	return t.move(ctx, from, to, nil)
}

func (t *TableKV) move(ctx context.Context, from, to [][]byte, lease *sqlLease) error {
	if err := t.inShadows("Move of", append(slices.Clone(from), to...)...); err != nil {
		return err
	}
	return t.inTx(ctx, "move in", lease, func(tx *sql.Tx) error {
		for i := range from {
			if err := t.movePair(ctx, tx, from[i], to[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

func (t *TableKV) movePair(ctx context.Context, tx *sql.Tx, from, to []byte) error {
	if bytes.Equal(from, to) {
		return nil
	}
	rows, _, err := t.split(ctx, tx, [][]byte{from})
	if err != nil {
		return err
	}
	if len(rows) == 1 {
		ms, id := rows[0].ms, rows[0].id
		w := &where{d: t.d}
		t.rowsCond(w, []row{{ms: ms, id: id}})
		var ids []int64
		rs, err := t.readRows(ctx, tx, t.selectRows()+w.String()+t.forUpdate(), w.args, 1)
		for _, r := range rs {
			ids = append(ids, r.id)
		}
		if err != nil {
			return wrap(ctx, "read "+t.table, err)
		}
		if len(ids) == 0 {
			return nil // not a marker (any more): a pair whose from is missing
		}
		if _, err := t.side.put(ctx, tx, t.shadowKey(id), nil); err != nil {
			return err
		}
		_, err = t.side.put(ctx, tx, to, nil)
		return err
	}
	// Back to a row's own key, when the row is that marker but for its
	// shadow: the shadow is lifted. The row is locked before the side
	// key, as a clear locks them: the other order deadlocked with it.
	var backToRow []row
	if ms, id, ok := t.parseRowKey(to); ok {
		w := &where{d: t.d}
		w.and(t.col(t.id) + " = " + w.arg(id))
		w.and(t.col(t.tm) + " > " + w.arg(t.bound(ms-1)))
		w.and(t.col(t.tm) + " <= " + w.arg(t.bound(ms)))
		t.filterCond(w)
		if backToRow, err = t.readRows(ctx, tx, t.selectRows()+w.String()+t.forUpdate(), w.args, 1); err != nil {
			return wrap(ctx, "read "+t.table, err)
		}
	}
	present, err := t.existingSide(ctx, tx, [][]byte{from})
	if err != nil || len(present) == 0 {
		return err
	}
	if _, err := t.side.deleteIn(ctx, tx, [][]byte{from}, nil); err != nil {
		return err
	}
	if len(backToRow) > 0 {
		_, err := t.side.deleteIn(ctx, tx, [][]byte{t.shadowKey(backToRow[0].id)}, nil)
		return err
	}
	_, err = t.side.put(ctx, tx, to, nil)
	return err
}

// fencedTable is a TableKV whose writes take effect only while its lease
// holds.
type fencedTable struct {
	t     *TableKV
	lease *sqlLease
}

var (
	_ retention.Putter = (*fencedTable)(nil)
	_ retention.Mover  = (*fencedTable)(nil)
)

func (f *fencedTable) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return f.t.Scan(ctx, start, end, limit)
}

func (f *fencedTable) Delete(ctx context.Context, keys ...[]byte) error {
	return f.t.delete(ctx, keys, f.lease)
}

func (f *fencedTable) Put(ctx context.Context, key, value []byte) error {
	return f.t.put(ctx, key, value, f.lease)
}

func (f *fencedTable) Move(ctx context.Context, from, to [][]byte) error {
	if err := checkMove(ctx, from, to); err != nil || len(from) == 0 {
		return err
	}
	return f.t.move(ctx, from, to, f.lease)
}
