package sqlkv

import (
	"bytes"
	"context"
	"database/sql"
	"slices"
	"sync"
)

// lastScan is what a KV's last Scan on SQLite read, and on which
// connection: the keys, and the state of the database just before
// (readState).
// A transaction on that connection that finds the database in the same
// state knows the keys of any range the page covers without reading them
// again (recall): an AtomicKV's clear then skips its read of the range.
type lastScan struct {
	mu    sync.Mutex
	conn  any // the driver's connection, compared, never used
	state dbState
	page  [][]byte // a copy: the caller of Scan owns what it returned
}

// dbState is what readState reads.
type dbState struct {
	version, changes, schema, others int64
}

// readState reads, through db (a connection, or a transaction on one),
// the main database's data_version, which moves when another connection
// (of any process) commits to it, the connection's own total_changes(),
// which moves with each row it writes to any table, the schema_version,
// which moves with each change of the schema (a table renamed or dropped
// changes no row), and how many databases besides main and temp it has
// attached. With none attached the marker table is in main or temp (which
// only the connection writes), so two reads on one connection that agree
// on the first three saw the same rows in it.
//
// With table set it reads from it too, which in a transaction takes, in
// SQLite's shared-cache mode, its read lock until the transaction ends:
// connections sharing a cache see each other's commits at once, and the
// lock keeps them from writing the table between the check and the delete.
func readState(ctx context.Context, db execer, table string) (dbState, error) {
	var s dbState
	var exists int64
	q := "SELECT (SELECT data_version FROM pragma_data_version), total_changes()," +
		" (SELECT schema_version FROM pragma_schema_version)," +
		" (SELECT count(*) FROM pragma_database_list WHERE name NOT IN ('main', 'temp'))"
	dest := []any{&s.version, &s.changes, &s.schema, &s.others}
	if table != "" {
		q += ", EXISTS (SELECT 1 FROM " + table + ")"
		dest = append(dest, &exists)
	}
	err := queryRow(ctx, SQLite, db, q, nil, dest...)
	return s, err
}

// remember records the page a Scan read on conn in state s.
func (l *lastScan) remember(conn any, s dbState, page [][]byte) {
	if conn == nil || s.others != 0 {
		return
	}
	size := 0
	for _, key := range page {
		size += len(key)
	}
	arena := make([]byte, 0, size)
	kept := make([][]byte, len(page))
	for i, key := range page {
		arena = append(arena, key...)
		kept[i] = arena[len(arena)-len(key) : len(arena) : len(arena)]
	}
	l.mu.Lock()
	l.conn, l.state, l.page = conn, s, kept
	l.mu.Unlock()
}

// recall returns the page of the last Scan when it ran on conn (a
// driverConn) and tx, on conn, whose first statement this must be, sees the
// database as that Scan did; nil otherwise. table is the marker table.
func (l *lastScan) recall(ctx context.Context, conn any, tx *sql.Tx, table string) ([][]byte, error) {
	l.mu.Lock()
	same, s, page := conn != nil && conn == l.conn, l.state, l.page
	l.mu.Unlock()
	if !same || page == nil {
		return nil, nil
	}
	now, err := readState(ctx, tx, table)
	if err != nil {
		return nil, err
	}
	if now != s {
		return nil, nil
	}
	return page, nil
}

// driverConn returns the driver's connection under c, or nil when c is
// closed.
func driverConn(c *sql.Conn) any {
	var dc any
	_ = c.Raw(func(d any) error {
		dc = d
		return nil
	})
	return dc
}

// isRun reports whether keys, ascending, are consecutive keys of page,
// ascending.
func isRun(page, keys [][]byte) bool {
	i, found := slices.BinarySearchFunc(page, keys[0], bytes.Compare)
	if !found || len(page)-i < len(keys) {
		return false
	}
	for j, key := range keys {
		if !bytes.Equal(page[i+j], key) {
			return false
		}
	}
	return true
}
