// Package sqlkv keeps retention markers in a table of a relational
// database reached through database/sql: MySQL 8 and MariaDB 10.6+, SQLite
// 3.35+ and PostgreSQL, each a Dialect chosen explicitly. It imports no
// driver: open the *sql.DB with the driver the service already uses.
//
// The marker table has one column, marker, the primary key, of a type that
// compares bytewise: VARBINARY(1024) on MySQL (at most MaxKeyLen bytes a
// key), BLOB in a WITHOUT ROWID table on SQLite, bytea on PostgreSQL. Every
// Scan is an index range scan with LIMIT. Create the table with Migrate.
// Write a marker with MarkTx inside the *sql.Tx that records the entity's
// terminal state (MarkKeyTx with the key of Sweep.MarkerKey for a sweep
// with its own id rule).
//
// A KV is a retention.Putter and a retention.Mover. A batch of keys that
// are every row from its first to its last (a page's markers, the common
// case) is deleted as one range, checked to hold exactly those keys; any
// other batch goes as DELETE ... WHERE marker IN (...), at most 5,000 keys
// a statement. A Move is one transaction: one statement per 2,500 pairs
// on PostgreSQL; on MySQL and SQLite an UPDATE of the primary key that
// skips the pairs whose new key exists, then a DELETE of the old keys of
// those pairs, so that each pair moves whole. On MySQL every statement goes out with its
// arguments written into its text (hex literals for keys), one round trip
// however the DSN sets interpolateParams.
//
// Each batch is a call and a transaction of its own: give a sweep over a
// KV a Config.PageSize that Config.BatchSize divides (the defaults do).
// Each call takes a connection of the *sql.DB, which keeps two idle ones
// unless told otherwise: with Config.Concurrency above 2, call
// SetMaxIdleConns with Concurrency plus one (plus one more for a Locker),
// or every call beyond the second opens a connection of its own. On
// PostgreSQL that made a pass over 10,000 markers with pages of 1,024 and
// Concurrency 8 take 1.7 s instead of 0.2 s.
//
// When the entities live in the same database, KV.WithClear makes an
// AtomicKV, which clears them in the *sql.Tx that deletes their markers,
// and only while every one of those markers still exists. Under a sweep
// with Concurrency 1 it also reads each batch's markers in that
// transaction (AtomicKV.ClearRun), and the sweep scans none of them.
//
// When the entities are the rows of one table with a finish-time column,
// the rows can be the markers: NewTable presents the rows whose finish
// time is set and that pass a filter as markers, read through an index on
// (finish time, id), and writes to a side marker table only what a row
// cannot hold (the markers of entities whose clear failed, held or
// parked). TableKV.WithClear deletes the rows, with what depends on them,
// in one transaction, a run of them by the index's range. See the guide
// "Clearing" in the repository's docs, "Your table is the marker".
//
// Replicas that share the table take turns with a Locker: a lease row with
// a TTL, in a table created by MigrateLeases in the same database, whose
// expiry the server's clock decides. Its leases fence the KV and the
// AtomicKV: a holder's writes take effect only while it holds the lease,
// checked in the same statement, or in the same transaction for a clear.
// On SQLite the lease row lives in the database file, so it serves the
// processes of one host that share that file.
//
// The caller owns the *sql.DB and closes it; a KV never does.
//
// # Locks and the sweep
//
// An AtomicKV's ClearFunc runs in the transaction that deleted the
// batch's markers, at the driver's isolation level, and every lock it
// takes lasts until that transaction ends; a clear that waits for a lock
// the application holds holds the sweep with it. Lock only the rows you
// delete, by their primary key, keep the application's transactions
// short, and set Options.LockTimeout (NewWithOptions). The guide "Running
// a fleet" in the repository's docs says which locks each database takes.
//
// # A lease under load
//
// A Locker's lease renews on a pooled connection of its own, kept while
// the lease is held (leave the pool room for it), every third of the TTL,
// and soon again after a renewal that failed. On SQLite it does not wait
// in SQLite's busy handler but tries again every few milliseconds, so that
// it takes the write lock between two writers'; a database whose write
// lock is never free still starves it.
package sqlkv
