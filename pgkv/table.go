package pgkv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

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
// It is sqlkv's table store, over the pool; clear the rows with
// TableClear, which takes a pgkv ClearFunc, or with a sqlkv.ClearFunc.
type Tables struct {
	db   *sql.DB
	side *sqlkv.KV
	name string
}

// NewTables returns the Tables of pool whose side table is side, "table"
// or "schema.table" (create it with Tables.Migrate). It opens a
// database/sql handle over the pool (pgx's stdlib); Close closes that
// handle, not the pool.
func NewTables(pool *pgxpool.Pool, side string) (*Tables, error) {
	if pool == nil {
		return nil, errors.New("pgkv: NewTables: pool must not be nil")
	}
	db := stdlib.OpenDBFromPool(pool)
	kv, err := sqlkv.New(db, sqlkv.PostgreSQL, side)
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
// for the defaults of LockerOptions.
func (t *Tables) NewLocker(name string, opts *LockerOptions) (*sqlkv.Locker, error) {
	var o sqlkv.LockerOptions
	if opts != nil {
		o = sqlkv.LockerOptions{TTL: opts.TTL, Table: opts.Table}
	}
	return sqlkv.NewLocker(t.side, name, &o)
}

// Close closes t's database/sql handle; the pool stays open. Close it once
// the sweeps of its TableKVs have stopped.
func (t *Tables) Close() error { return t.db.Close() }

// TableClear returns a sqlkv.ClearFunc, for TableKV.WithClear, that runs
// the statements clear queues: the clear of what depends on the rows (an
// artifacts table, a ledger) in the transaction that deletes the rows, so
// that a row and what depends on it go together or not at all.
//
// It is a ClearFunc as AtomicKV's, with these differences: clear is called
// inside the transaction, after the rows' deletion, so I/O of its own
// (files, object storage) holds the rows' locks while it lasts; the
// statements go one by one, in the extended protocol, their arguments
// bound as parameters (a []int64 of the ids binds as bigint[], a []string
// as text[]); there is no QueueHolds: to hold entities, return a
// retention.BatchError naming them with retention.Hold. A statement with a result callback (QueuedQuery.Exec,
// Query, QueryRow) is refused: its results are not read. An error of
// clear, or of a statement, rolls the transaction back.
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
				return fmt.Errorf("pgkv: TableClear: statement %d (%.40q): %w", i+1, qq.SQL, err)
			}
		}
		return nil
	}
}
