package sqlkv

import (
	"context"
	"fmt"
	"strings"
)

// move moves the pairs, fenced by lease when it is not nil, and returns
// how many from keys went.
func (k *KV) move(ctx context.Context, from, to [][]byte, lease *sqlLease) (int64, error) {
	for _, key := range to {
		if err := k.checkLen(key); err != nil {
			return 0, err
		}
	}
	op := "move in " + k.table
	if k.dialect == PostgreSQL && len(from) <= k.dialect.maxKeys()/2 {
		c, done, err := k.session(ctx, 0, false)
		if err != nil {
			return 0, wrap(ctx, op, err)
		}
		defer done()
		return k.movePostgres(ctx, c, from, to, lease)
	}
	var idle int64
	if lease != nil && k.dialect == MySQL {
		idle = lease.l.idleSeconds()
	}
	c, done, err := k.session(ctx, idle, false)
	if err != nil {
		return 0, wrap(ctx, op, err)
	}
	defer done()
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return 0, wrap(ctx, op, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if lease != nil {
		if err := lease.enterTx(ctx, tx, op); err != nil {
			return 0, err
		}
	}
	var moved int64
	if k.dialect == PostgreSQL {
		// More pairs than one statement carries: the statements commit
		// together, so that a lease lost between two of them moves none.
		moved, err = k.movePostgres(ctx, tx, from, to, lease)
	} else {
		moved, err = k.moveParts(ctx, tx, from, to)
	}
	if err != nil {
		return 0, err
	}
	if lease != nil {
		// Last before COMMIT on MySQL and PostgreSQL: the lease row stays
		// locked until then, so no takeover lands between the check and
		// the commit.
		if err := lease.checkTx(ctx, tx, op); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, wrap(ctx, op, err)
	}
	return moved, nil
}

// moveParts moves the pairs on MySQL or SQLite in tx, 2,500 a part.
func (k *KV) moveParts(ctx context.Context, tx execer, from, to [][]byte) (int64, error) {
	var moved int64
	per := k.dialect.maxKeys() / 2
	for i := 0; i < len(from); i += per {
		end := min(i+per, len(from))
		n, err := k.movePart(ctx, tx, from[i:end], to[i:end])
		if err != nil {
			return 0, err
		}
		moved += n
	}
	return moved, nil
}

// movePart moves the pairs of one statement's worth on MySQL or SQLite,
// in tx: an UPDATE of the primary key skips a pair whose to key exists
// (IGNORE), leaving its from key, and a DELETE then drops it, which is the
// whole of that pair's move.
func (k *KV) movePart(ctx context.Context, tx execer, from, to [][]byte) (int64, error) {
	var q string
	args := make([]any, 0, 3*len(from))
	if k.dialect == SQLite {
		// A join on the primary key: a CASE of n branches, evaluated for
		// each of n rows, costs n² comparisons (seconds for 2,500 pairs).
		var values strings.Builder
		for j := range from {
			if j > 0 {
				values.WriteString(", ")
			}
			values.WriteString("(?, ?)")
			args = append(args, from[j], to[j])
		}
		q = "WITH m (f, t) AS (VALUES " + values.String() + ") UPDATE OR IGNORE " + k.table + " SET marker = m.t FROM m WHERE " + k.table + ".marker = m.f"
	} else {
		var cases strings.Builder
		for j := range from {
			cases.WriteString(" WHEN ? THEN ?")
			args = append(args, from[j], to[j])
		}
		args = append(args, anys(from)...)
		q = "UPDATE IGNORE " + k.table + " SET marker = CASE marker" + cases.String() + " END WHERE marker IN (" + k.dialect.phs(1, len(from)) + ")"
	}
	n, err := exec(ctx, k.dialect, tx, q, args)
	if err != nil {
		return 0, wrap(ctx, "move in "+k.table, err)
	}
	if n == int64(len(from)) {
		return n, nil
	}
	m, err := k.delete(ctx, tx, from, nil, nil)
	return n + m, err
}

// movePostgres moves the pairs on PostgreSQL, 2,500 a statement, each
// statement fenced by lease when it is not nil. move runs more than one
// statement's worth in a transaction.
func (k *KV) movePostgres(ctx context.Context, c execer, from, to [][]byte, lease *sqlLease) (int64, error) {
	var g *guard
	if lease != nil {
		g = lease.guard()
	}
	d := k.dialect
	per := d.maxKeys() / 2
	var moved int64
	for i := 0; i < len(from); i += per {
		f, t := from[i:min(i+per, len(from))], to[i:min(i+per, len(to))]
		var values strings.Builder
		args := make([]any, 0, 2*len(f))
		for j := range f {
			if j > 0 {
				values.WriteString(", ")
			}
			fmt.Fprintf(&values, "(%s, %s)", d.phs(2*j+1, 1), d.phs(2*j+2, 1))
			args = append(args, f[j], t[j])
		}
		cond, gargs := g.cond(len(args))
		q := "WITH m (f, t) AS (VALUES " + values.String() + "),\n" +
			"d AS (DELETE FROM " + k.table + " WHERE marker IN (SELECT f FROM m)" + and(cond) + " RETURNING marker),\n" +
			"i AS (INSERT INTO " + k.table + " (marker) SELECT m.t FROM m JOIN d ON d.marker = m.f ON CONFLICT DO NOTHING)\n" +
			"SELECT count(*) FROM d"
		var n int64
		if err := queryRow(ctx, d, c, q, append(args, gargs...), &n); err != nil {
			return moved, wrap(ctx, "move in "+k.table, err)
		}
		moved += n
	}
	return moved, nil
}
