package pgkv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// Tables is where a pgx pool's sweeps of existing tables keep what a row
// cannot hold: a table whose rows are the markers (a sqlkv.TableKV: each
// finished row of the table is a marker, and finishing an entity is setting
// its finish-time column) needs a side table for its retry, held and
// parked markers, and a lease that fences its clears must live in the same
// database and be taken through the same handle. A Tables holds that
// handle: every TableKV of Table, and every Locker of NewLocker, shares it,
// so the Locker's leases fence those TableKVs' clears. See sqlkv.Table for
// what a table must have, and the package example of Tables.
//
// It is sqlkv's table store, over the pool through database/sql (pgx's
// stdlib): unlike pgkv's KV and AtomicKV, whose writes each go out as one
// message, its transactions go statement by statement, as sqlkv's do on
// PostgreSQL. Under a lease of NewLocker a fenced transaction whose client
// vanished ends within the lease's TTL (idle_in_transaction_session_timeout);
// without a lease, its row locks wait for TCP to give up. Clear the rows
// with TableClear, which takes a pgkv ClearFunc, or with a
// sqlkv.ClearFunc. Create one with NewTables; the zero Tables is not
// usable.
type Tables struct {
	db   *sql.DB
	side *sqlkv.KV
	name string
}

// NewTables returns the Tables of pool whose side table is side, "table"
// or "schema.table" (create it with Tables.Migrate). opts are sqlkv's
// (Options.LockTimeout bounds how long the sweep's statements wait for an
// application's row lock); nil means the defaults. It opens a
// database/sql handle over the pool (pgx's stdlib); Close closes that
// handle, not the pool.
//
// A transaction of a clear holds one of the pool's connections while its
// ClearFunc runs, and a lease of NewLocker holds one for as long as it is
// held: give the pool MaxConns of at least Config.Concurrency + 1, and one
// more for a ClearFunc that reads the pool itself.
func NewTables(pool *pgxpool.Pool, side string, opts *sqlkv.Options) (*Tables, error) {
	if pool == nil {
		return nil, errors.New("pgkv: NewTables: pool must not be nil")
	}
	db := stdlib.OpenDBFromPool(pool)
	kv, err := sqlkv.NewWithOptions(db, sqlkv.PostgreSQL, side, opts)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pgkv: NewTables: side table: %w", err)
	}
	return &Tables{db: db, side: kv, name: side}, nil
}

// Migrate creates the side table if it does not exist. It is idempotent
// and safe to run from several replicas at once. The lease table of
// NewLocker is MigrateLeases's.
func (t *Tables) Migrate(ctx context.Context) error {
	return sqlkv.Migrate(ctx, t.db, sqlkv.PostgreSQL, t.name)
}

// Table returns a TableKV over tbl, as sqlkv.NewTable does: it checks the
// columns and that an index's first columns are (Time, ID), with an error
// matching sqlkv.ErrNoIndex that names the CREATE INDEX to run otherwise.
// Several sweeps may read one table, each through a Table of its own
// filter and prefix.
func (t *Tables) Table(ctx context.Context, tbl sqlkv.Table) (*sqlkv.TableKV, error) {
	return sqlkv.NewTable(ctx, t.side, tbl)
}

// NewLocker returns a Locker of the lease name in the lease table of opts
// (MigrateLeases creates it), whose leases fence the writes of t's
// TableKVs: a replica that lost its lease clears nothing. opts may be nil
// for the defaults of LockerOptions. It is sqlkv's Locker, whose lease
// row is the one pgkv's Locker of the same name takes, and whose errors
// are sqlkv's: TryAcquire's error matches sqlkv.ErrNoLeaseTable when
// MigrateLeases has not run. Its lease holds a connection of the pool
// while it is held (see NewTables). A lease fences only the stores of its
// own kind: a pgkv KV and a TableKV cannot share one.
func (t *Tables) NewLocker(name string, opts *LockerOptions) (*sqlkv.Locker, error) {
	var o sqlkv.LockerOptions
	if opts != nil {
		o = sqlkv.LockerOptions{TTL: opts.TTL, Table: opts.Table}
	}
	if o.TTL != 0 {
		if err := checkLeaseTTL(o.TTL); err != nil {
			return nil, err
		}
	}
	return sqlkv.NewLocker(t.side, name, &o)
}

// Close closes t's database/sql handle; the pool stays open. Close it once
// the sweeps of its TableKVs have stopped.
func (t *Tables) Close() error { return t.db.Close() }

// TableClear returns a sqlkv.ClearFunc, for TableKV.WithClear, that runs
// the statements clear queues: the clear of what depends on the rows (an
// artifacts table, a ledger) in the transaction that deletes the rows, so
// that a row and what depends on it go together or not at all. A nil
// clear returns nil: the rows are the whole state.
//
// The ids are the rows' ID values zero-padded to 20 digits, as the table
// store writes its markers' ids ("00000000000000000042"): cast them
// ($1::bigint[]) or parse them (strconv.ParseInt) before matching them
// against dependents keyed by the number, and name them exactly so in a
// retention.BatchError.
//
// It is a ClearFunc as AtomicKV's, with these differences:
//   - clear is called inside the transaction, after the rows' deletion, so
//     I/O of its own (files, object storage) holds the rows' locks while it
//     lasts;
//   - the statements run after the rows' deletion and see the table
//     without them: a query of QueueHolds reads the holds from a table of
//     their own, not from the swept rows, whose holds it cannot see (keep
//     such a row out of the sweep instead: its Time column NULL, or failing
//     the Filter);
//   - the statements go one by one, a round trip each, their arguments
//     bound as parameters, typed as the server infers them: cast an array
//     where it cannot ($1::bigint[], unnest($1::text[]));
//   - retention.ErrLiveAgain is refused: the marker of an entity is its
//     row, still finished, and dropping it would delete the row with
//     nothing cleared. The id fails instead; make the row no marker to
//     keep it.
//
// A statement with a result callback (QueuedQuery.Exec, Query, QueryRow)
// is refused: its results are not read. An error of clear, or of a
// statement, rolls the transaction back; holds of QueueHolds come back as
// the retention.BatchError of ClearFunc's doc.
func TableClear(clear ClearFunc) sqlkv.ClearFunc {
	if clear == nil {
		return nil
	}
	return func(ctx context.Context, tx *sql.Tx, ids []string) error {
		var b pgx.Batch
		if err := clear(ctx, &b, ids); err != nil {
			return err
		}
		for i, qq := range b.QueuedQueries {
			if qq.Fn != nil {
				return fmt.Errorf("pgkv: TableClear: statement %d (%.40q) has a result callback, which the table store never calls: queue it without one", i+1, qq.SQL)
			}
		}
		for i, qq := range b.QueuedQueries {
			if _, err := tx.ExecContext(ctx, qq.SQL, qq.Arguments...); err != nil {
				var held retention.BatchError
				if h := holdsOf(err); errors.As(h, &held) {
					return h
				}
				return fmt.Errorf("pgkv: TableClear: statement %d (%.40q): %w", i+1, qq.SQL, err)
			}
		}
		return nil
	}
}
