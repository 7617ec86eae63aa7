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
// call (see AtomicKV.ClearAndDelete and AtomicKV.ClearRun). Use ctx for
// its statements.
//
// A ClearFunc that returns an error refuses the whole call: the
// transaction rolls back and ClearAndDelete returns that error. A
// retention.BatchError names the ids at fault (ErrLiveAgain for an entity
// that must stay); the sweep retries the ids it does not name in a call of
// their own. It must not commit or roll back tx.
type ClearFunc func(ctx context.Context, tx *sql.Tx, ids []string) error

// AtomicKV is a KV that clears entities itself, in the transaction that
// deletes their markers: a retention.ClearDeleter, and a
// retention.RunClearer, so that a sweep with Concurrency 1 has it read
// each batch of the expired range in that transaction too (ClearRun)
// rather than Scan it first. Create one with KV.WithClear, and give it to
// retention.New with neither Config.Clear nor Config.ClearBatch set.
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
// idle_in_transaction_session_timeout, off by default). The pgkv module's
// KV and AtomicKV send a whole clear as one message and have no such
// window (its Tables, this package's table store over a pgx pool, has it).
type AtomicKV struct {
	*KV
	clear ClearFunc
}

var (
	_ retention.RunClearer = (*AtomicKV)(nil)
	_ retention.Mover      = (*AtomicKV)(nil)
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
	f, err := a.fenced(ctx)
	switch {
	case err != nil:
		return err
	case f != nil:
		return f.ClearAndDelete(ctx, ids, keys)
	}
	return a.clearAndDelete(ctx, ids, keys, nil)
}

// fenced returns the view of a fenced by the lease whose fence ctx
// carries, nil when it carries none (retention.Fenced).
func (a *AtomicKV) fenced(ctx context.Context) (*fencedAtomicKV, error) {
	view, err := retention.Fenced(ctx, a)
	if err != nil || view == nil {
		return nil, err
	}
	f, ok := view.(*fencedAtomicKV)
	if !ok {
		return nil, fmt.Errorf("sqlkv: the fenced view of an AtomicKV is a %T, not a *fencedAtomicKV", view)
	}
	return f, nil
}

// clearAndDelete runs one call, checking lease when not nil.
func (a *AtomicKV) clearAndDelete(ctx context.Context, ids []string, keys [][]byte, lease *sqlLease) error {
	op := "clear and delete from " + a.table
	return a.clearTx(ctx, op, lease, a.dialect == SQLite, func(tx *sql.Tx, page [][]byte) ([]string, error) {
		// The markers go first: when one is gone, the ClearFunc never runs.
		deleted, err := a.delete(ctx, tx, keys, page, nil)
		if err != nil {
			return nil, err
		}
		if want := distinct(keys); deleted != int64(want) {
			return nil, fmt.Errorf("sqlkv: %s: %w (%d of %d markers deleted)", op, retention.ErrMarkerGone, deleted, want)
		}
		return ids, nil
	})
}

// clearTx runs one clear in a transaction of its own, checking lease
// when not nil: work deletes the markers in tx and returns the ids whose
// entities the ClearFunc then clears in tx (none: no call), before the
// lease's last check and the commit. With recall, the transaction runs,
// on SQLite, on a connection of its own even with nothing to set (the one
// a Scan may have read the call's keys on), and work gets the page of
// that Scan when tx sees the database as it did (lastScan), else nil.
func (a *AtomicKV) clearTx(ctx context.Context, op string, lease *sqlLease, recall bool, work func(tx *sql.Tx, page [][]byte) ([]string, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var idle int64
	if lease != nil && a.dialect == MySQL {
		idle = lease.l.idleSeconds()
	}
	recall = recall && a.dialect == SQLite
	c, done, err := a.session(ctx, idle, recall)
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer done()
	var dc any
	if conn, ok := c.(*sql.Conn); ok && recall {
		dc = driverConn(conn)
	}
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return wrap(ctx, op, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var page [][]byte
	if dc != nil {
		// First in tx, before the lease's statement: it compares the
		// connection's count of changes with the Scan's.
		if page, err = a.last.recall(ctx, dc, tx, a.table); err != nil {
			return wrap(ctx, op, err)
		}
	}
	if lease != nil {
		if err := lease.enterTx(ctx, tx, op); err != nil {
			return err
		}
	}
	ids, err := work(tx, page)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		if err := a.clear(ctx, tx, ids); err != nil {
			return err
		}
	}
	if lease != nil {
		if err := lease.checkTx(ctx, tx, op); err != nil {
			return err
		}
	}
	return wrap(ctx, op, tx.Commit())
}

// ClearRun implements retention.RunClearer. In one transaction it reads
// the first limit keys of [from, end), locked on MySQL and PostgreSQL
// (FOR UPDATE; on SQLite the transaction holds the write lock, see
// SQLite), refuses the run with an error matching
// retention.ErrMalformedMarker when a key is not a marker of prefix whose
// id retention.ValidateID accepts, deletes the keys with one range delete
// that must delete exactly them, runs the ClearFunc with their distinct
// ids in key order, and commits; it returns the keys, ascending. A refused
// run changes nothing, and a ClearFunc error refuses it as it refuses a
// ClearAndDelete. When ctx carries a lease's fence (retention.Fenced), the
// run is fenced by it.
func (a *AtomicKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	f, err := a.fenced(ctx)
	switch {
	case err != nil:
		return nil, err
	case f != nil:
		return f.ClearRun(ctx, prefix, from, end, limit)
	}
	return a.clearRun(ctx, prefix, from, end, limit, nil)
}

// RunStore implements retention.RunClearer.
func (a *AtomicKV) RunStore() retention.RunClearer { return a }

// clearRun runs one ClearRun, checking lease when not nil.
func (a *AtomicKV) clearRun(ctx context.Context, prefix string, from, end []byte, limit int, lease *sqlLease) ([][]byte, error) {
	if limit < 1 {
		return nil, fmt.Errorf("sqlkv: ClearRun limit must be at least 1, got %d", limit)
	}
	op := "clear a run of " + a.table
	var keys, checked [][]byte
	err := a.clearTx(ctx, op, lease, false, func(tx *sql.Tx, _ [][]byte) ([]string, error) {
		var err error
		if keys, err = a.readRun(ctx, tx, from, end, limit); err != nil || len(keys) == 0 {
			return nil, wrap(ctx, op, err)
		}
		ids, err := runIDs(prefix, keys)
		if err != nil {
			return nil, fmt.Errorf("sqlkv: %s: %w", op, err)
		}
		checked = keys
		// Read in tx, locked: they are every row from the first to the
		// last, and the range delete checks that none slipped in since.
		deleted, _, err := a.deleteRangeTx(ctx, tx, keys, keys, nil)
		if err != nil {
			return nil, err
		}
		if deleted != int64(len(keys)) {
			return nil, fmt.Errorf("sqlkv: %s: %w (%d of %d markers deleted)", op, retention.ErrMarkerGone, deleted, len(keys))
		}
		return ids, nil
	})
	if err != nil {
		// The keys of a run read and checked go with the error, so that
		// the sweep acts on a BatchError's answers (retention.RunClearer).
		return checked, err
	}
	return keys, nil
}

// readRun reads in tx the first limit keys of [from, end), and on MySQL
// and PostgreSQL locks them until tx ends, so that another run waits for
// this one and then passes over the rows it deleted.
func (a *AtomicKV) readRun(ctx context.Context, tx *sql.Tx, from, end []byte, limit int) ([][]byte, error) {
	d := a.dialect
	q := "SELECT marker FROM " + a.table + " WHERE marker >= " + d.phs(1, 1) + " AND marker < " + d.phs(2, 1) +
		" ORDER BY marker LIMIT " + d.ph(3)
	if d != SQLite {
		q += " FOR UPDATE"
	}
	return readKeys(ctx, d, tx, q, []any{nonNil(from), nonNil(end), int64(limit)}, limit)
}

// runIDs returns the distinct ids of a run's keys, in key order, or an
// error matching retention.ErrMalformedMarker for a key that is not a
// marker of prefix (a retry or parked key neither) whose id
// retention.ValidateID accepts. The ids are cut out of one string.
func runIDs(prefix string, keys [][]byte) ([]string, error) {
	var buf []byte // the ids, one after another
	ends := make([]int, len(keys))
	for i, key := range keys {
		_, id, err := retention.ParseMarkerKey(prefix, key)
		if err != nil {
			return nil, err
		}
		if c := key[len(prefix)]; c < '0' || c > '9' {
			return nil, fmt.Errorf("%w: %q is no marker key: no timestamp after the prefix %q", retention.ErrMalformedMarker, key, prefix)
		}
		if buf == nil {
			buf = make([]byte, 0, len(id)*len(keys)+len(id))
		}
		buf = append(buf, id...)
		ends[i] = len(buf)
	}
	all := string(buf)
	ids := make([]string, 0, len(keys))
	seen := make(map[string]struct{}, len(keys))
	start := 0
	for _, end := range ends {
		id := all[start:end]
		start = end
		if _, dup := seen[id]; !dup {
			seen[id] = struct{}{}
			ids = append(ids, id)
		}
	}
	return ids, nil
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
	_ retention.RunClearer = (*fencedAtomicKV)(nil)
	_ retention.Mover      = (*fencedAtomicKV)(nil)
)

func (f *fencedAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	p := f.lease
	if p.isLost() {
		return p.refused("clear and delete from " + f.atomic.table)
	}
	return f.atomic.clearAndDelete(ctx, ids, keys, p)
}

// ClearRun is AtomicKV.ClearRun, its transaction fenced by the lease.
func (f *fencedAtomicKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	p := f.lease
	if p.isLost() {
		return nil, p.refused("clear a run of " + f.atomic.table)
	}
	return f.atomic.clearRun(ctx, prefix, from, end, limit, p)
}

// RunStore implements retention.RunClearer.
func (f *fencedAtomicKV) RunStore() retention.RunClearer { return f }
