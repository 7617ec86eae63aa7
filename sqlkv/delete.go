package sqlkv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"fmt"
)

// delete deletes keys where g holds and returns how many rows went. Keys
// in ascending order that are every row from the first to the last (a
// page's markers, the common case) go with one range delete, checked to
// delete those keys and no other: on PostgreSQL in one statement, on
// SQLite and (inside a transaction, as an AtomicKV's) MySQL after a read of
// the range in the same transaction, which on SQLite a transaction that
// recalled the page of a Scan (page, else nil) can skip. Any other list goes as DELETE ...
// WHERE marker IN (...), 5,000 keys a statement.
func (k *KV) delete(ctx context.Context, db execer, keys, page [][]byte, g *guard) (int64, error) {
	if len(keys) > 1 && ascending(keys) {
		var (
			n     int64
			exact bool
			err   error
		)
		tx, inTx := db.(*sql.Tx)
		switch {
		case k.dialect == PostgreSQL:
			n, exact, err = k.deleteRangePostgres(ctx, db, keys, g)
		case inTx:
			n, exact, err = k.deleteRangeTx(ctx, tx, keys, page, g)
		case k.dialect == SQLite:
			n, exact, err = k.deleteRangeOwnTx(ctx, db.(dbConn), keys, g)
		}
		if err != nil || exact {
			return n, err
		}
	}
	return k.deleteIn(ctx, db, keys, g)
}

// deleteIn deletes keys where g holds with DELETE ... WHERE marker IN
// (...), 5,000 keys a statement, and returns how many rows went.
func (k *KV) deleteIn(ctx context.Context, db execer, keys [][]byte, g *guard) (int64, error) {
	var deleted int64
	for part := range chunks(keys, k.dialect.maxKeys()) {
		c, gargs := g.cond(len(part))
		q := "DELETE FROM " + k.table + " WHERE marker IN (" + k.dialect.phs(1, len(part)) + ")" + and(c)
		n, err := exec(ctx, k.dialect, db, q, append(anys(part), gargs...))
		if err != nil {
			return deleted, wrap(ctx, "delete from "+k.table, err)
		}
		deleted += n
	}
	return deleted, nil
}

// deleteRangeOwnTx runs deleteRangeTx in a transaction of its own, and
// deletes keys one by one in it when they are not exactly the range.
func (k *KV) deleteRangeOwnTx(ctx context.Context, db dbConn, keys [][]byte, g *guard) (deleted int64, exact bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, wrap(ctx, "delete from "+k.table, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	deleted, exact, err = k.deleteRangeTx(ctx, tx, keys, nil, g)
	if err != nil {
		return 0, false, err
	}
	if !exact {
		// In the same transaction: the write lock is taken once.
		if deleted, err = k.deleteIn(ctx, tx, keys, g); err != nil {
			return 0, false, err
		}
	}
	return deleted, true, wrap(ctx, "delete from "+k.table, tx.Commit())
}

// deleteRangeTx deletes the keys from the first of keys to the last with
// one range delete when they are exactly keys (rangeIs, page as there).
// exact reports whether they were. deleted is then how many rows went:
// all of them, or none when g did not hold; any other count (a key
// slipped into the range between the read and the delete, which MySQL's
// READ COMMITTED and PostgreSQL allow) is an error, and tx must be rolled
// back.
func (k *KV) deleteRangeTx(ctx context.Context, tx *sql.Tx, keys, page [][]byte, g *guard) (deleted int64, exact bool, err error) {
	op := "delete from " + k.table
	first, last := keys[0], keys[len(keys)-1]
	if exact, err := k.rangeIs(ctx, tx, keys, page); err != nil || !exact {
		return 0, false, wrap(ctx, op, err)
	}
	c, gargs := g.cond(2)
	d := k.dialect
	n, err := exec(ctx, d, tx, "DELETE FROM "+k.table+" WHERE marker >= "+d.phs(1, 1)+" AND marker <= "+d.phs(2, 1)+and(c), append([]any{first, last}, gargs...))
	switch {
	case err != nil:
		return 0, false, wrap(ctx, op, err)
	case n != 0 && n != int64(len(keys)):
		return 0, false, fmt.Errorf("sqlkv: %s: the range of %d keys held %d rows when deleted: a key was written into it meanwhile", op, len(keys), n)
	}
	return n, true, nil
}

// rangeIs reports whether the keys from the first of keys to the last are
// exactly keys, in tx: known without a read when they are a run of page,
// the keys of a Scan that tx sees the database as it was then (recall) or
// of a read in tx (an AtomicKV's run), or else read, and on MySQL and
// PostgreSQL locked (FOR UPDATE; SQLite's transaction holds the write lock
// once it writes).
func (k *KV) rangeIs(ctx context.Context, tx *sql.Tx, keys, page [][]byte) (bool, error) {
	if page != nil && isRun(page, keys) {
		return true, nil
	}
	d := k.dialect
	q := "SELECT marker FROM " + k.table + " WHERE marker >= " + d.phs(1, 1) + " AND marker <= " + d.phs(2, 1) + " ORDER BY marker"
	args := []any{keys[0], keys[len(keys)-1]}
	if d != SQLite {
		q += " FOR UPDATE"
	}
	rows, err := query(ctx, k.dialect, tx, q, args)
	if err != nil {
		return false, err
	}
	i := 0
	var key []byte
	for rows.Next() {
		if err := rows.Scan(&key); err != nil {
			_ = rows.Close()
			return false, err
		}
		if i >= len(keys) || !bytes.Equal(key, keys[i]) {
			_ = rows.Close()
			return false, nil
		}
		i++
	}
	if err := rows.Close(); err != nil {
		return false, err
	}
	return i == len(keys), nil
}

// ascending reports whether keys are in strictly ascending byte order.
func ascending(keys [][]byte) bool {
	for i := 1; i < len(keys); i++ {
		if bytes.Compare(keys[i-1], keys[i]) >= 0 {
			return false
		}
	}
	return true
}

// deleteRangePostgres deletes the rows from the first key to the last, in
// one statement that deletes nothing unless those rows are exactly keys:
// their count and a SHA-256 of them (each key after its 4-byte length),
// computed by the database in the statement's snapshot, must match the
// ones computed here. exact reports whether they did; deleted is then how
// many rows went, fewer than len(keys) when some went meanwhile or g did
// not hold.
func (k *KV) deleteRangePostgres(ctx context.Context, db execer, keys [][]byte, g *guard) (deleted int64, exact bool, err error) {
	h := sha256.New()
	var n [4]byte
	for _, key := range keys {
		binary.BigEndian.PutUint32(n[:], uint32(len(key)))
		h.Write(n[:])
		h.Write(key)
	}
	args := []any{keys[0], keys[len(keys)-1], int64(len(keys)), h.Sum(nil)}
	c, gargs := g.cond(len(args))
	q := "WITH s AS (SELECT count(*) = $3::bigint AND sha256(coalesce(string_agg(int4send(length(marker)) || marker, ''::bytea ORDER BY marker), ''::bytea)) = $4::bytea AS exact" +
		" FROM " + k.table + " WHERE marker BETWEEN $1::bytea AND $2::bytea),\n" +
		"r AS (DELETE FROM " + k.table + " WHERE marker BETWEEN $1::bytea AND $2::bytea AND (SELECT exact FROM s)" + and(c) + " RETURNING 1)\n" +
		"SELECT (SELECT exact FROM s), (SELECT count(*) FROM r)"
	if err := queryRow(ctx, k.dialect, db, q, append(args, gargs...), &exact, &deleted); err != nil {
		return 0, false, wrap(ctx, "delete from "+k.table, err)
	}
	return deleted, exact, nil
}
