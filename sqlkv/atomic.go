package sqlkv

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/marksweep/retention"
)

// ClearFunc clears the entities of ids through tx, for example with a
// DELETE of their rows. It runs after the deletion of the ids' markers, in
// the same transaction, and only when that deleted every marker of the
// call (see AtomicKV.ClearAndDelete). Use ctx for its statements.
//
// A ClearFunc that returns an error refuses the whole call: the
// transaction rolls back and ClearAndDelete returns that error. A
// retention.BatchError names the ids at fault (ErrLiveAgain for an entity
// that must stay); the sweep retries the ids it does not name in a call of
// their own. It must not commit or roll back tx.
type ClearFunc func(ctx context.Context, tx *sql.Tx, ids []string) error

// AtomicKV is a KV that clears entities itself, in the transaction that
// deletes their markers: a retention.ClearDeleter. Create one with
// KV.WithClear, and give it to retention.New with neither Config.Clear nor
// Config.ClearBatch set.
//
// It applies when the entities' state lives in the same database as the
// markers: a crash can then no longer leave an entity cleared with its
// marker still there, and each entity is cleared exactly once, with no
// lease. Under a Locker of this package the lease's check joins the
// transaction too, so a replica that lost its lease clears nothing.
//
// A call is a database/sql transaction of several statements, each a round
// trip. On MySQL and PostgreSQL a client that vanishes between two of them
// leaves the rows it touched locked until the server ends its session; a
// fenced call therefore bounds that wait by the lease's TTL (see Locker),
// while an unfenced one waits for the server's own timeouts (MySQL's
// wait_timeout, 8 hours by default; PostgreSQL's
// idle_in_transaction_session_timeout, off by default). The pgkv module
// sends a whole clear as one message and has no such window.
type AtomicKV struct {
	*KV
	clear ClearFunc
}

var (
	_ retention.ClearDeleter = (*AtomicKV)(nil)
	_ retention.Mover        = (*AtomicKV)(nil)
)

// WithClear returns an AtomicKV over k's table whose clear is clear.
func (k *KV) WithClear(clear ClearFunc) (*AtomicKV, error) {
	if clear == nil {
		return nil, errors.New("sqlkv: WithClear: clear must not be nil")
	}
	return &AtomicKV{KV: k, clear: clear}, nil
}

// ClearAndDelete implements retention.ClearDeleter. In one transaction it
// deletes keys and, unless that deleted every one of them, rolls back and
// returns an error matching retention.ErrMarkerGone; only then it runs the
// ClearFunc, and commits. A call sent twice clears nothing twice. When ctx
// carries a lease's fence (retention.Fenced), the call is fenced by it.
func (a *AtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	view, err := retention.Fenced(ctx, a)
	switch {
	case err != nil:
		return err
	case view != nil:
		f, ok := view.(*fencedAtomicKV)
		if !ok {
			return fmt.Errorf("sqlkv: the fenced view of an AtomicKV is a %T, not a ClearDeleter", view)
		}
		return f.ClearAndDelete(ctx, ids, keys)
	}
	return a.clearAndDelete(ctx, ids, keys, nil)
}

// clearAndDelete runs one call, checking lease when not nil.
func (a *AtomicKV) clearAndDelete(ctx context.Context, ids []string, keys [][]byte, lease *sqlLease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := "clear and delete from " + a.table
	var idle int64
	if lease != nil && a.dialect == MySQL {
		idle = lease.l.idleSeconds()
	}
	// On SQLite a connection of its own even with nothing to set: the one
	// a Scan may have read the call's keys on (lastScan).
	c, done, err := a.session(ctx, idle, a.dialect == SQLite)
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer done()
	var dc any
	if conn, ok := c.(*sql.Conn); ok && a.dialect == SQLite {
		dc = driverConn(conn)
	}
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var page [][]byte
	if dc != nil {
		if page, err = a.last.recall(ctx, dc, tx, a.table); err != nil {
			return wrap(ctx, op, err)
		}
	}
	if lease != nil {
		if err := lease.enterTx(ctx, tx, op); err != nil {
			return err
		}
	}
	// The markers go first: when one is gone, the ClearFunc never runs.
	deleted, err := a.delete(ctx, tx, keys, page, nil)
	if err != nil {
		return err
	}
	if want := distinct(keys); deleted != int64(want) {
		return fmt.Errorf("sqlkv: %s: %w (%d of %d markers deleted)", op, retention.ErrMarkerGone, deleted, want)
	}
	if err := a.clear(ctx, tx, ids); err != nil {
		return err
	}
	if lease != nil {
		if err := lease.checkTx(ctx, tx, op); err != nil {
			return err
		}
	}
	return wrap(ctx, op, tx.Commit())
}

// distinct counts the distinct keys of an ascending list.
func distinct(keys [][]byte) int {
	n := 0
	for i := range keys {
		if i == 0 || !bytes.Equal(keys[i], keys[i-1]) {
			n++
		}
	}
	return n
}

// fencedAtomicKV is the view of an AtomicKV under a sqlLease: its
// transaction checks the lease, and rolls back when it is no longer held.
type fencedAtomicKV struct {
	*fencedKV
	atomic *AtomicKV
}

var (
	_ retention.ClearDeleter = (*fencedAtomicKV)(nil)
	_ retention.Mover        = (*fencedAtomicKV)(nil)
)

func (f *fencedAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	p := f.lease
	if p.isLost() {
		return p.refused("clear and delete from " + f.atomic.table)
	}
	return f.atomic.clearAndDelete(ctx, ids, keys, p)
}
