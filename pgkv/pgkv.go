// Package pgkv keeps retention markers in a PostgreSQL table through pgx v5,
// so that replicas of a service can sweep one shared store.
//
// The table has one column, key bytea PRIMARY KEY: bytea compares bytewise,
// so the primary key index serves every Scan as an index range scan. Create
// it with Migrate. Write a marker with MarkTx inside the transaction that
// records the entity's terminal state (MarkKeyTx with the key of
// Sweep.MarkerKey for a sweep with its own id rule).
//
// A KV is a retention.Putter and a retention.Mover: the sweep reschedules
// the marker of a failed clear with Move, one statement that replaces the
// old key by the new one, so no crash leaves two markers of one id.
//
// When the entities live in the same database, KV.WithClear makes an
// AtomicKV, which clears them in the transaction that deletes their
// markers, and only while every one of those markers still exists: a
// batch sent twice (after a timeout whose commit went unheard) changes
// nothing the second time and reports retention.ErrMarkerGone. Where one
// SQL statement clears them, KV.WithClearSQL makes one that is also a
// retention.RunClearer: the database then picks each batch of the expired
// range itself, checks that it holds only markers, and clears it, in one
// round trip (AtomicKV.ClearRun).
//
// Replicas that share the table take turns with a Locker: a lease row with
// a TTL in a table created by MigrateLeases. Its leases fence the KV and
// the AtomicKV: a holder's marker writes and atomic clears take effect only
// while it holds the lease, checked in the same statement (see Locker),
// also through a KV that wraps them (see retention.Fenced). A transaction
// that locks the lease row is always sent as one simple-protocol message,
// so a holder cut off mid-send cannot keep the row locked.
//
// # Your table as the marker
//
// When the entities are the rows of one table with a finish-time column,
// the rows can be the markers, and no marker row is written: Tables gives
// the table store of package sqlkv (sqlkv.Table, sqlkv.TableKV) over the
// pool, with a Locker whose leases fence it, and TableClear clears what
// depends on the rows with a ClearFunc's statements, in the transaction
// that deletes them.
//
// # Vacuum after a big sweep
//
// A sweep deletes markers oldest first, so the dead index entries it leaves
// sit where every later pass starts its Scan, until VACUUM removes them.
// Migrate therefore sets the table's autovacuum to vacuum it once 2,000
// rows are dead, whatever its size, without throttling
// (MarkerTableOptions). Run VACUUM on the marker table by hand after
// sweeping a large backlog when a minute of slower passes matters, when
// autovacuum is off, or when the table predates a Migrate that could set
// its parameters. The guide "Protecting the database" in the repository's
// docs gives the figures.
//
// The caller owns the pool (or connection) and closes it; a KV never does.
package pgkv

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/marksweep/retention"
)

// DB is what the package needs of a connection: *pgxpool.Pool, *pgx.Conn
// and pgx.Tx all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ErrNoTable is returned when the marker table does not exist: run Migrate.
var ErrNoTable = errors.New("pgkv: marker table does not exist (run Migrate)")

// ErrNoLeaseTable is returned by Locker.TryAcquire when the lease table
// does not exist: run MigrateLeases.
var ErrNoLeaseTable = errors.New("pgkv: lease table does not exist (run MigrateLeases)")

// ErrInvalidTable is returned by New and Migrate for a table name that is
// empty, too long or holds a NUL byte.
var ErrInvalidTable = errors.New("pgkv: invalid table name")

// KV is a retention.KV over one marker table. It is safe for concurrent use
// when its DB is (a pool is). Create one with New. Over a *pgxpool.Pool
// its Delete and Move, fenced or not, are prepared per connection as an
// AtomicKV's statements are (see AtomicKV).
type KV struct {
	db    DB
	table string // quoted, possibly schema-qualified

	scanSQL, insertSQL string
	moveSQL            prepared
	// A batch's markers go by range when they are a run of the table
	// (see keyRange), else one by one.
	rangeDeleteSQL, keysDeleteSQL   prepared
	rangeMarkersSQL, keysMarkersSQL prepared // AtomicKV's
	// unprepared is set once the pool's connections were seen to lose
	// what they prepared (see onPrepared).
	unprepared atomic.Bool
}

var (
	_ retention.KV     = (*KV)(nil)
	_ retention.Putter = (*KV)(nil)
	_ retention.Mover  = (*KV)(nil)
)

// quoteTable validates and quotes a table name: "name" or "schema.name".
// Each part is quoted as an identifier, so any character but NUL is safe.
func quoteTable(table string) (string, error) {
	parts := strings.SplitN(table, ".", 2)
	for _, p := range parts {
		switch {
		case p == "":
			return "", fmt.Errorf("%w %q: empty name or schema", ErrInvalidTable, table)
		case len(p) > 63:
			return "", fmt.Errorf("%w %q: %q is longer than PostgreSQL's 63-byte identifiers", ErrInvalidTable, table, p)
		case strings.IndexByte(p, 0) >= 0:
			return "", fmt.Errorf("%w %q: holds a NUL byte", ErrInvalidTable, table)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// Migrate creates the marker table if it does not exist and gives it the
// storage parameters of MarkerTableOptions, the autovacuum settings of a
// queue-like table. It is idempotent and safe to run from several replicas
// at once: a transaction-scoped advisory lock serialises concurrent runs.
//
// On a table that exists already (created by an older Migrate, or by hand)
// it sets only the parameters the table does not set yet, so a value you
// chose with ALTER TABLE ... SET is kept, and a Migrate that finds them all
// set changes nothing: it takes no lock on the table and writes no catalog
// row. When the role running Migrate does not own the table, Migrate leaves
// its parameters alone rather than fail: run it once as the owner.
func Migrate(ctx context.Context, db DB, table string) error {
	quoted, err := quoteTable(table)
	if err != nil {
		return err
	}
	h := fnv.New64a()
	h.Write([]byte("retention/pgkv migrate " + quoted))
	lock := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", int64(h.Sum64()))
	// Without arguments pgx sends this as one simple-protocol query, which
	// PostgreSQL runs in one implicit transaction: the lock lasts until the
	// table exists.
	sql := lock + "; CREATE TABLE IF NOT EXISTS " + quoted + " (key bytea PRIMARY KEY) WITH (" + MarkerTableOptions + ")"
	if _, err := db.Exec(ctx, sql); err != nil {
		return wrap(ctx, "migrate "+quoted, err)
	}
	missing, err := missingOptions(ctx, db, quoted)
	if err != nil || missing == "" {
		return err
	}
	// ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock, which waits
	// for a running VACUUM: that is why it runs only when a parameter is
	// missing, not at every start of every replica.
	if _, err := db.Exec(ctx, lock+"; ALTER TABLE "+quoted+" SET ("+missing+")"); err != nil {
		return wrap(ctx, "migrate "+quoted, err)
	}
	return nil
}

// MarkerTableOptions are the storage parameters Migrate gives the marker
// table, as a list for CREATE TABLE ... WITH (...) or ALTER TABLE ... SET
// (...): use it when you create the table with your own migrations.
// Autovacuum vacuums the table once 2,000 rows are dead, whatever its
// size, and without sleeping to throttle its I/O, so that a sweep's dead
// index entries, which sit where every later pass scans, go soon (on a
// table of tens of millions of markers, set a cost delay back if that I/O
// hurts).
const MarkerTableOptions = "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000, autovacuum_vacuum_cost_delay = 0"

// missingOptions returns the parameters of MarkerTableOptions that the
// table does not set, as a list for ALTER TABLE ... SET, or "" when it sets
// them all or the current role does not own it.
func missingOptions(ctx context.Context, db DB, quoted string) (string, error) {
	rows, err := db.Query(ctx, `SELECT coalesce(reloptions, '{}'), pg_has_role(relowner, 'USAGE')
		FROM pg_class WHERE oid = $1::text::regclass`, quoted)
	if err != nil {
		return "", wrap(ctx, "migrate "+quoted, err)
	}
	type relation struct {
		Options []string
		Owner   bool
	}
	rel, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[relation])
	if err != nil {
		return "", wrap(ctx, "migrate "+quoted, err)
	}
	if !rel.Owner {
		return "", nil
	}
	set := make(map[string]bool, len(rel.Options))
	for _, o := range rel.Options {
		name, _, _ := strings.Cut(o, "=")
		set[name] = true
	}
	var missing []string
	for _, o := range strings.Split(MarkerTableOptions, ", ") {
		if name, _, _ := strings.Cut(o, " = "); !set[name] {
			missing = append(missing, o)
		}
	}
	return strings.Join(missing, ", "), nil
}

// New returns a KV over the marker table (created by Migrate), named as
// "table" or "schema.table".
func New(db DB, table string) (*KV, error) {
	if db == nil {
		return nil, errors.New("pgkv: db must not be nil")
	}
	quoted, err := quoteTable(table)
	if err != nil {
		return nil, err
	}
	return &KV{
		db:    db,
		table: quoted,
		// The bounds are subqueries, so that the planner does not see them:
		// one past the largest key it sampled would make it look up the
		// index's actual end, walking every entry a sweep left dead there
		// (3 ms a Scan after 100,000 markers went, until VACUUM).
		scanSQL:   `SELECT key FROM ` + quoted + ` WHERE key >= (SELECT $1::bytea) AND key < (SELECT $2::bytea) ORDER BY key LIMIT $3`,
		insertSQL: `INSERT INTO ` + quoted + ` (key) VALUES ($1) ON CONFLICT DO NOTHING`,
		moveSQL:   newPrepared(`WITH `+moveCTEs(quoted, "$1", "$2", "")+` SELECT 1`, 2),
		rangeDeleteSQL: newPrepared(`WITH `+rangeCTEs(quoted, "$1", "$2", "$3", "$4", "")+`
SELECT CASE WHEN exact THEN 0 ELSE `+notRange+` END FROM n`, 4),
		keysDeleteSQL:   newPrepared(`DELETE FROM `+quoted+` WHERE key = ANY($1::bytea[])`, 1),
		rangeMarkersSQL: newPrepared(rangeMarkersSQL(quoted), 4),
		keysMarkersSQL:  newPrepared(keysMarkersSQL(quoted), 2),
	}, nil
}

// Scan implements retention.KV as one index range scan.
func (k *KV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("pgkv: Scan limit must be at least 1, got %d", limit)
	}
	// pgx sends a nil []byte as NULL, which no key is >=: a nil start is
	// the empty key, the least of all.
	if start == nil {
		start = []byte{}
	}
	if end == nil {
		end = []byte{}
	}
	rows, err := k.db.Query(ctx, k.scanSQL, start, end, limit)
	if err != nil {
		return nil, wrap(ctx, "scan "+k.table, err)
	}
	keys, err := collectKeys(rows, limit)
	if err != nil {
		return nil, wrap(ctx, "scan "+k.table, err)
	}
	return keys, nil
}

// collectKeys reads the one bytea column of rows, at most limit of them,
// into slices of one buffer that the caller owns: each ends at its
// capacity, so appending to one cannot overwrite the next. The raw
// values are bytea's binary format, which is the bytes themselves, or its
// text format (\x and hex digits) on a connection that asks for text.
func collectKeys(rows pgx.Rows, limit int) ([][]byte, error) {
	defer rows.Close()
	keys := make([][]byte, 0, min(limit, 1<<14))
	var buf []byte
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) != 1 || vals[0] == nil {
			return nil, fmt.Errorf("scan returned %d columns or a NULL key", len(vals))
		}
		v := vals[0]
		if rows.FieldDescriptions()[0].Format == pgx.TextFormatCode {
			var k []byte
			if err := rows.Scan(&k); err != nil {
				return nil, err
			}
			v = k
		}
		if len(buf)+len(v) > cap(buf) {
			// A new buffer, not a grown one: the keys taken so far keep
			// pointing into the old one. Sized for the rows still to come
			// if they are as long as this one, so that a Scan of one key
			// takes no more than that key.
			buf = make([]byte, 0, max(len(v), min(64<<10, len(v)*(limit-len(keys)))))
		}
		at := len(buf)
		buf = append(buf, v...)
		keys = append(keys, buf[at:len(buf):len(buf)])
	}
	return keys, rows.Err()
}

// moveCTEs are the CTEs of one statement that moves the keys of the bytea
// array parameter from to the keys of to, pair by pair, in table, where
// guard (an SQL condition, or "") also holds. Only the pairs whose from
// key the DELETE found get their to key: a pair whose from is gone writes
// nothing. A to key that exists already stays as it is.
func moveCTEs(table, from, to, guard string) string {
	if guard != "" {
		guard = " AND " + guard
	}
	return `m AS (SELECT f, t FROM unnest(` + from + `::bytea[], ` + to + `::bytea[]) AS m (f, t)),
d AS (DELETE FROM ` + table + ` WHERE key = ANY(` + from + `::bytea[])` + guard + ` RETURNING key),
i AS (INSERT INTO ` + table + ` (key) SELECT m.t FROM m JOIN d ON d.key = m.f ON CONFLICT DO NOTHING)`
}

// Delete implements retention.KV. Keys in ascending order (a page's
// markers, or a run of them) go in one statement that deletes their range
// when its rows are exactly those keys (see keyRange); other keys, or a
// range that holds other rows or misses a key, in a statement that looks
// each key up.
//
// When ctx carries a lease's fence (retention.Fenced), the delete is fenced
// by it; so are Put and Move.
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
	if len(keys) == 0 {
		return nil
	}
	if r, ok := rangeOf(keys); ok {
		switch err := k.write(ctx, k.rangeDeleteSQL, r.args()...); {
		case err == nil:
			return nil
		case !castFailure(err, notRangeToken):
			return wrap(ctx, "delete from "+k.table, err)
		}
	}
	if err := k.write(ctx, k.keysDeleteSQL, keys); err != nil {
		return wrap(ctx, "delete from "+k.table, err)
	}
	return nil
}

// write runs the statement sql with args. It goes in the simple protocol,
// as every write of the sweep: one message, run only once it has arrived
// whole. In the extended protocol, a holder cut off between Execute and
// Sync would leave the rows locked in an open transaction until TCP gives
// up (hours), stalling every replica.
func (k *KV) write(ctx context.Context, sql prepared, args ...any) error {
	return k.onPrepared(ctx, sql, func(db DB, stmt string) error {
		_, err := db.Exec(ctx, stmt, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
		return err
	})
}

// Put writes a marker key in its own statement. The table stores keys only,
// so value must be empty. It makes KV a retention.Putter.
func (k *KV) Put(ctx context.Context, key, value []byte) error {
	if len(value) != 0 {
		return fmt.Errorf("pgkv: Put of %q with a %d-byte value: the marker table stores keys only", key, len(value))
	}
	if view, err := retention.Fenced(ctx, k); err != nil || view != nil {
		if err != nil {
			return err
		}
		p, ok := view.(retention.Putter)
		if !ok {
			return fmt.Errorf("pgkv: the fenced view of a KV is a %T, not a Putter", view)
		}
		return p.Put(ctx, key, value)
	}
	return k.put(ctx, k.db, key, pgx.QueryExecModeSimpleProtocol) // see Delete
}

// Move implements retention.Mover in one statement: it deletes the from
// keys that exist and inserts the to key of each pair whose from it
// deleted, so that all the pairs move in one transaction, and a pair
// whose from is missing writes nothing.
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
			return fmt.Errorf("pgkv: the fenced view of a KV is a %T, not a Mover", view)
		}
		return m.Move(ctx, from, to)
	}
	if err := k.write(ctx, k.moveSQL, from, to); err != nil {
		return wrap(ctx, "move in "+k.table, err)
	}
	return nil
}

// checkMove checks the context and the arguments of a Move.
func checkMove(ctx context.Context, from, to [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(from) != len(to) {
		return fmt.Errorf("pgkv: Move of %d keys to %d keys", len(from), len(to))
	}
	return nil
}

// MarkTx writes the marker of id, finished at t, under prefix, through tx:
// pass the pgx.Tx that records the entity's terminal state, and the marker
// commits or rolls back with it. Writing a marker twice is not an error. It
// refuses what retention.MarkerKey refuses, and writes nothing then. For a
// sweep with its own Config.ValidateID, use MarkKeyTx with the key of
// Sweep.MarkerKey.
func (k *KV) MarkTx(ctx context.Context, tx DB, prefix, id string, t time.Time) error {
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
// is refused with an error matching retention.ErrMalformedMarker.
func (k *KV) MarkKeyTx(ctx context.Context, tx DB, key []byte) error {
	if err := retention.CheckMarkerKey(key); err != nil {
		return fmt.Errorf("pgkv: MarkKeyTx: %w", err)
	}
	return k.put(ctx, tx, key)
}

func (k *KV) put(ctx context.Context, db DB, key []byte, mode ...any) error {
	if _, err := db.Exec(ctx, k.insertSQL, append(mode, key)...); err != nil {
		return wrap(ctx, "insert into "+k.table, err)
	}
	return nil
}

// wrap names the operation, turns a missing table into ErrNoTable and
// returns the context's error when the context ended the call.
func wrap(ctx context.Context, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("pgkv: %s: %w", op, ctxErr)
	}
	if hasCode(err, "42P01") { // undefined_table
		return fmt.Errorf("%w: %s: %w", ErrNoTable, op, err)
	}
	return fmt.Errorf("pgkv: %s: %w", op, err)
}

// hasCode reports whether err is PostgreSQL's error of SQLSTATE code.
func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
