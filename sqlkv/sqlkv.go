package sqlkv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/marksweep/retention"
)

// KV is a retention.KV over one marker table. It is safe for concurrent
// use. Create one with New.
type KV struct {
	db          *sql.DB
	dialect     Dialect
	table       string // quoted, possibly schema-qualified
	lockTimeout time.Duration
	last        lastScan // SQLite's
}

var (
	_ retention.KV     = (*KV)(nil)
	_ retention.Putter = (*KV)(nil)
	_ retention.Mover  = (*KV)(nil)
)

// New returns a KV over the marker table (created by Migrate) of db, whose
// dialect is d, named "table" or "schema.table". It is NewWithOptions
// with the default options.
func New(db *sql.DB, d Dialect, table string) (*KV, error) {
	return NewWithOptions(db, d, table, nil)
}

// NewWithOptions returns a KV like New, tuned by opts (Options.LockTimeout).
func NewWithOptions(db *sql.DB, d Dialect, table string, opts *Options) (*KV, error) {
	if db == nil {
		return nil, errors.New("sqlkv: db must not be nil")
	}
	quoted, err := d.quoteTable(table)
	if err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	return &KV{db: db, dialect: d, table: quoted, lockTimeout: o.LockTimeout}, nil
}

// Migrate creates the marker table if it does not exist. It is idempotent
// and safe to run from several replicas at once. On PostgreSQL the table
// gets the autovacuum settings of pgkv.MarkerTableOptions, for the reasons
// the pgkv package gives; a table that exists is left as it is.
func Migrate(ctx context.Context, db *sql.DB, d Dialect, table string) error {
	quoted, err := d.quoteTable(table)
	if err != nil {
		return err
	}
	return migrate(ctx, db, d, quoted, d.createMarkers(quoted))
}

// migrate runs create; on PostgreSQL under an advisory lock, since two
// concurrent CREATE TABLE IF NOT EXISTS of one name may fail there.
func migrate(ctx context.Context, db *sql.DB, d Dialect, quoted, create string) error {
	op := "migrate " + quoted
	if d != PostgreSQL {
		if _, err := db.ExecContext(ctx, create); err != nil {
			return wrap(ctx, op, err)
		}
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer func() { _ = tx.Rollback() }()
	h := fnv.New64a()
	h.Write([]byte("retention/sqlkv migrate " + quoted))
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", int64(h.Sum64()))); err != nil {
		return wrap(ctx, op, err)
	}
	if _, err := tx.ExecContext(ctx, create); err != nil {
		return wrap(ctx, op, err)
	}
	return wrap(ctx, op, tx.Commit())
}

// Dialect returns the dialect k was made with.
func (k *KV) Dialect() Dialect { return k.dialect }

// Scan implements retention.KV as one index range scan.
func (k *KV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("sqlkv: Scan limit must be at least 1, got %d", limit)
	}
	d := k.dialect
	q := fmt.Sprintf("SELECT marker FROM %s WHERE marker >= %s AND marker < %s ORDER BY marker LIMIT %d",
		k.table, d.phs(1, 1), d.phs(2, 1), limit)
	// A nil start is the empty key, the least of all, not SQL's NULL,
	// which no key is >= (and a nil end, as empty, ends before any).
	args := []any{nonNil(start), nonNil(end)}
	var keys [][]byte
	var err error
	if d == SQLite {
		keys, err = k.scanSQLite(ctx, q, args, limit)
	} else {
		keys, err = readKeys(ctx, d, k.db, q, args, limit)
	}
	if err != nil {
		return nil, wrap(ctx, "scan "+k.table, err)
	}
	return keys, nil
}

// scanSQLite runs the Scan's query q on a connection of its own, and
// remembers the page read there (lastScan) with the state of the database
// just before: another commit in between moves the state the clear reads
// after, so an earlier read can only make the clear read the range again.
func (k *KV) scanSQLite(ctx context.Context, q string, args []any, limit int) ([][]byte, error) {
	conn, err := k.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	s, err := readState(ctx, conn, "")
	if err != nil {
		return nil, err
	}
	keys, err := readKeys(ctx, SQLite, conn, q, args, limit)
	if err != nil {
		return nil, err
	}
	k.last.remember(driverConn(conn), s, keys)
	return keys, nil
}

// readKeys runs q, a SELECT of the column marker that returns at most
// limit rows, and returns its keys. They share a few buffers instead of
// one allocation each, every key capped at its end, so that an append to
// one copies it: the caller owns them.
func readKeys(ctx context.Context, d Dialect, db execer, q string, args []any, limit int) ([][]byte, error) {
	rows, err := query(ctx, d, db, q, args)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var (
		keys  [][]byte
		arena []byte
		raw   sql.RawBytes // the driver's buffer, valid until Next
	)
	for rows.Next() {
		if err := rows.Scan(&raw); err != nil {
			return nil, err
		}
		if keys == nil {
			keys = make([][]byte, 0, min(limit, 1024))
		}
		if arena == nil || cap(arena)-len(arena) < len(raw) {
			// Room for the rows left if they are as long as this one, up
			// to 64 KiB: a page of markers takes one or two.
			left := max(limit-len(keys), 1)
			arena = make([]byte, 0, max(len(raw), min(len(raw)*left, 64<<10)))
		}
		start := len(arena)
		arena = append(arena, raw...)
		keys = append(keys, arena[start:len(arena):len(arena)])
	}
	return keys, rows.Err()
}

// guard is the condition a fenced write adds to its statement: the lease
// row still names this holder and has not expired. Empty for an unfenced
// write.
type guard struct {
	sql  func(first int) string // the condition, its placeholders from first
	args []any
}

// cond returns the guard's condition and arguments for a statement whose
// own arguments number n, or "" and nil for no guard.
func (g *guard) cond(n int) (string, []any) {
	if g == nil {
		return "", nil
	}
	return g.sql(n + 1), g.args
}

// and joins the condition c to a WHERE clause.
func and(c string) string {
	if c == "" {
		return ""
	}
	return " AND " + c
}

// execer is a *sql.DB, *sql.Tx or *sql.Conn.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Delete implements retention.KV with one DELETE ... WHERE marker IN (...)
// per 5,000 keys. When ctx carries a lease's fence (retention.Fenced), the
// delete is fenced by it; so are Put and Move.
func (k *KV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if view, err := retention.Fenced(ctx, k); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.Delete(ctx, keys...)
	}
	c, done, err := k.session(ctx, 0, false)
	if err != nil {
		return wrap(ctx, "delete from "+k.table, err)
	}
	defer done()
	_, err = k.delete(ctx, c, keys, nil, nil)
	return err
}

// Put writes a marker key in its own statement. The table stores keys only,
// so value must be empty. It makes KV a retention.Putter. On MySQL it
// refuses, like MarkKeyTx, a marker key longer than MaxMarkerKeyLen with
// an error matching ErrKeyTooLong.
func (k *KV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(value) != 0 {
		return fmt.Errorf("sqlkv: Put of %q with a %d-byte value: the marker table stores keys only", key, len(value))
	}
	if view, err := retention.Fenced(ctx, k); err != nil || view != nil {
		if err != nil {
			return err
		}
		p, ok := view.(retention.Putter)
		if !ok {
			return fmt.Errorf("sqlkv: the fenced view of a KV is a %T, not a Putter", view)
		}
		return p.Put(ctx, key, value)
	}
	c, done, err := k.session(ctx, 0, false)
	if err != nil {
		return wrap(ctx, "insert into "+k.table, err)
	}
	defer done()
	_, err = k.put(ctx, c, key, nil)
	return err
}

// put inserts key where g holds, and returns 1 when it wrote it.
func (k *KV) put(ctx context.Context, db execer, key []byte, g *guard) (int64, error) {
	if err := k.checkLen(key); err != nil {
		return 0, err
	}
	if len(key) > MaxMarkerKeyLen && retention.CheckMarkerKey(key) == nil {
		if err := k.checkMarkerLen(key); err != nil {
			return 0, err
		}
	}
	c, gargs := g.cond(1)
	n, err := exec(ctx, k.dialect, db, k.dialect.insertIgnore(k.table, c), append([]any{key}, gargs...))
	if err != nil {
		return 0, wrap(ctx, "insert into "+k.table, err)
	}
	return n, nil
}

// checkMarkerLen refuses, on MySQL, a marker key whose retry and parked
// keys would not fit the column: the sweep could never move it, and would
// try again at every pass. Refused when written, it is reported once.
func (k *KV) checkMarkerLen(key []byte) error {
	if k.dialect == MySQL && len(key) > MaxMarkerKeyLen {
		return fmt.Errorf("%w: a %d-byte marker key: at most %d bytes (MaxMarkerKeyLen) on MySQL, so that its retry and parked keys fit the %d-byte column (key starting %.40q)",
			ErrKeyTooLong, len(key), MaxMarkerKeyLen, MaxKeyLen, key)
	}
	return nil
}

// checkLen refuses a key the dialect's column cannot hold.
func (k *KV) checkLen(key []byte) error {
	if k.dialect == MySQL && len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, the MySQL marker column holds at most %d (key starting %.40q)", ErrKeyTooLong, len(key), MaxKeyLen, key)
	}
	return nil
}

// Move implements retention.Mover: each from key that exists is replaced
// by its to key; a pair whose from key is missing writes nothing, and a to
// key that exists already stays as it is. The pairs move whole, in one
// transaction: every pair of a batch of 2,500 in one statement on
// PostgreSQL; on MySQL and SQLite an UPDATE that moves the pairs whose to
// key is free, then a DELETE of the from keys of the others, with a fenced
// Move's check of the lease in the same transaction. On PostgreSQL a Move
// of more than 2,500 pairs is one transaction of several statements.
func (k *KV) Move(ctx context.Context, from, to [][]byte) error {
	if err := checkMove(ctx, from, to); err != nil || len(from) == 0 {
		return err
	}
	if view, err := retention.Fenced(ctx, k); err != nil || view != nil {
		if err != nil {
			return err
		}
		m, ok := view.(retention.Mover)
		if !ok {
			return fmt.Errorf("sqlkv: the fenced view of a KV is a %T, not a Mover", view)
		}
		return m.Move(ctx, from, to)
	}
	_, err := k.move(ctx, from, to, nil)
	return err
}

// checkMove checks the context and the arguments of a Move.
func checkMove(ctx context.Context, from, to [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(from) != len(to) {
		return fmt.Errorf("sqlkv: Move of %d keys to %d keys", len(from), len(to))
	}
	return nil
}

// MarkTx writes the marker of id, finished at t, under prefix, through tx:
// pass the *sql.Tx that records the entity's terminal state, and the marker
// commits or rolls back with it. Writing a marker twice is not an error. It
// refuses what retention.MarkerKey refuses, and writes nothing then. For a
// sweep with its own Config.ValidateID, use MarkKeyTx with the key of
// Sweep.MarkerKey.
func (k *KV) MarkTx(ctx context.Context, tx *sql.Tx, prefix, id string, t time.Time) error {
	key, err := retention.MarkerKey(prefix, t, id)
	if err != nil {
		return err
	}
	return k.MarkKeyTx(ctx, tx, key)
}

// MarkKeyTx writes the marker key through tx, like MarkTx. Take key from
// Sweep.MarkerKey, which checks the id by the sweep's own rule
// (Config.ValidateID), or from retention.MarkerKey. A key that is not shaped
// like a marker (retention.CheckMarkerKey: the sweep would never delete it)
// is refused with an error matching retention.ErrMalformedMarker; on MySQL,
// a key longer than MaxMarkerKeyLen with one matching ErrKeyTooLong.
func (k *KV) MarkKeyTx(ctx context.Context, tx *sql.Tx, key []byte) error {
	if tx == nil {
		return errors.New("sqlkv: MarkKeyTx: tx must not be nil")
	}
	if err := retention.CheckMarkerKey(key); err != nil {
		return fmt.Errorf("sqlkv: MarkKeyTx: %w", err)
	}
	if err := k.checkMarkerLen(key); err != nil {
		return err
	}
	_, err := k.put(ctx, tx, key, nil)
	return err
}

// chunks yields keys in parts of at most n.
func chunks(keys [][]byte, n int) func(func([][]byte) bool) {
	return func(yield func([][]byte) bool) {
		for i := 0; i < len(keys); i += n {
			if !yield(keys[i:min(i+n, len(keys))]) {
				return
			}
		}
	}
}

// anys returns keys as arguments.
func anys(keys [][]byte) []any {
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}

// wrap names the operation, turns a missing table into ErrNoTable and
// returns the context's error when the context ended the call. It returns
// nil for a nil err.
func wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("sqlkv: %s: %w", op, ctxErr)
	}
	if noTable(err) {
		return fmt.Errorf("%w: %s: %w", ErrNoTable, op, err)
	}
	return fmt.Errorf("sqlkv: %s: %w", op, err)
}

// noTable reports whether err says a table does not exist. The package
// imports no driver, so it reads what the drivers have in common: an
// SQLSTATE method (pgx, lib/pq), or the message of MySQL's error 1146 and
// of SQLite.
func noTable(err error) bool {
	var state interface{ SQLState() string }
	if errors.As(err, &state) && state.SQLState() == "42P01" { // undefined_table
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "Error 1146") || strings.Contains(msg, "no such table")
}

// nonNil returns b, or an empty key for nil: drivers send a nil []byte as
// NULL.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
