package pgkv

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/marksweep/retention"
)

// ClearFunc queues on b the statements that clear the entities of ids, for
// example a DELETE of their rows with ids as the parameter (see the example
// of KV.WithClear).
//
// They run with the deletion of the ids' markers in one transaction. It
// returns an error to clear nothing.
//
// A DELETE by id = ANY looks every id up in the table's primary key, and
// that lookup is most of a batch's cost: key the table by bigint, or by
// text with COLLATE "C", where you can. A text key under a libc collation
// (any other than "C" or "POSIX", C.UTF-8 included, before PostgreSQL 17)
// compares through strcoll; deleting 100,000 rows by id = ANY in pages of
// 1,000 took 206 ms with such a key, 132 ms with COLLATE "C" and 86 ms with
// bigint (PostgreSQL 15, one run).
type ClearFunc func(b *pgx.Batch, ids []string) error

// AtomicKV is a KV that clears entities itself, in the transaction that
// deletes their markers: a retention.ClearDeleter. Create one with
// KV.WithClear, and give it to retention.New with neither Config.Clear nor
// Config.ClearBatch set.
//
// It applies when the entities' state lives in the same PostgreSQL database
// as the markers: then a crash can no longer leave an entity cleared with
// its marker still there, and each entity is cleared exactly once, with no
// lease. State elsewhere (another database, object storage, a cache) cannot
// join the transaction: use Config.ClearBatch there, which clears at least
// once. Under a pgkv Locker the lease's fence joins the transaction too, so
// a replica that lost its lease clears nothing.
type AtomicKV struct {
	*KV
	clear ClearFunc
	send  batchSender
}

// batchSender is what an AtomicKV needs of its DB: *pgxpool.Pool and
// *pgx.Conn have it.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var _ retention.ClearDeleter = (*AtomicKV)(nil)

// WithClear returns an AtomicKV over k's table whose clear is clear. k's DB
// must be able to send a batch (a *pgxpool.Pool or a *pgx.Conn).
func (k *KV) WithClear(clear ClearFunc) (*AtomicKV, error) {
	if clear == nil {
		return nil, errors.New("pgkv: WithClear: clear must not be nil")
	}
	send, ok := k.db.(batchSender)
	if !ok {
		return nil, fmt.Errorf("pgkv: WithClear: the KV's DB (%T) cannot send a batch: use a *pgxpool.Pool or a *pgx.Conn", k.db)
	}
	return &AtomicKV{KV: k, clear: clear, send: send}, nil
}

// ClearAndDelete implements retention.ClearDeleter: the statements of the
// ClearFunc and the deletion of keys go to the server as one batch, in one
// round trip, and run in one implicit transaction.
func (a *AtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if len(keys) == 0 {
		return a.clearAndDelete(ctx, ids, func(*pgx.Batch) {}, nil)
	}
	return a.clearAndDelete(ctx, ids, func(b *pgx.Batch) { b.Queue(a.deleteSQL, a.deleteArgs(keys)...) }, nil)
}

// clearAndDelete queues the ClearFunc's statements, then last (which adds
// the statement that deletes the markers), and sends the batch. lastErr
// may translate an error of that last statement.
func (a *AtomicKV) clearAndDelete(ctx context.Context, ids []string, last func(*pgx.Batch), lastErr func(error) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := &pgx.Batch{}
	if err := a.clear(b, ids); err != nil {
		return err
	}
	if b.Len() == 0 {
		return errors.New("pgkv: the ClearFunc queued no statement")
	}
	n := b.Len()
	last(b)
	br := a.send.SendBatch(ctx, b)
	var err error
	for i := range b.Len() {
		_, e := br.Exec()
		if e == nil || err != nil {
			continue
		}
		if i >= n && lastErr != nil {
			e = lastErr(e)
		}
		err = e
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && !errors.Is(err, retention.ErrLeaseLost) {
		return wrap(ctx, "clear and delete from "+a.table, err)
	}
	return err
}

// fencedAtomicKV is the view of an AtomicKV under a pgLease: the marker
// deletion checks the lease in the same statement and fails the whole
// transaction when it is no longer held, so the entities stay too.
type fencedAtomicKV struct {
	*fencedKV
	atomic   *AtomicKV
	checkSQL string
}

var _ retention.ClearDeleter = (*fencedAtomicKV)(nil)

// fenceAtomic returns the fenced view of a.
func (p *pgLease) fenceAtomic(a *AtomicKV) *fencedAtomicKV {
	f := p.fenceKV(a.KV)
	// A count of zero, the lease gone, divides by zero: the error aborts
	// the implicit transaction, entities' statements included. The lease
	// row is locked (FOR SHARE) to the end of the transaction, so a
	// takeover waits for it to commit.
	return &fencedAtomicKV{fencedKV: f, atomic: a, checkSQL: `WITH l AS MATERIALIZED (` + p.l.fenceSQL + `),
` + fencedDeleteCTEs(a.table) + `
SELECT 1 / (SELECT count(*) FROM l)::int`}
}

func (f *fencedAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	p := f.lease
	if p.isLost() {
		return p.refused("clear and delete from " + f.atomic.table)
	}
	return f.atomic.clearAndDelete(ctx, ids,
		func(b *pgx.Batch) {
			if len(keys) == 0 {
				b.Queue(f.checkSQL, p.l.name, p.holder, p.fence, keys, nil, nil)
				return
			}
			b.Queue(f.checkSQL, p.l.name, p.holder, p.fence, keys, keys[0], keys[len(keys)-1])
		},
		func(err error) error {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "22012" { // division_by_zero: the lease is gone
				p.markLost()
				return p.refused("clear and delete from " + f.atomic.table)
			}
			return err
		})
}
