package pgkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/marksweep/retention"
)

// ClearFunc queues on b the statements that clear the entities of ids, for
// example a DELETE of their rows with ids as the parameter (see the example
// of KV.WithClear).
//
// ctx is the call's: the sweep's, under Config.ClearTimeout, and cancelled
// when the sweep stops. A ClearFunc that does I/O of its own before the
// statements go (deleting files, a call to object storage) passes ctx to
// it, and returns its error. Such work is done before the transaction
// starts and is not undone when it fails: it must be idempotent, and
// nothing it decides (a hold read here) binds the transaction; decide
// holds in the transaction instead, with QueueHolds. See
// docs/clearing.md, "Rows plus files".
//
// The statements run after the deletion of the ids' markers, in its
// transaction, and only when that deleted every marker of the call (see
// AtomicKV.ClearAndDelete). The statements go to the server as one
// simple-protocol query (see AtomicKV): their arguments are interpolated
// as literals on the client (a []int64 or []string by pgkv, anything else
// by pgx), so give an array parameter a cast
// where PostgreSQL cannot infer its type (unnest($1::text[])); an argument
// list may start with pgx.NamedArgs, and no statement may have a result
// callback. Their results are not read: a statement should not return many
// rows.
//
// A ClearFunc that returns an error refuses the whole call: nothing is
// sent, and ClearAndDelete returns that error. A retention.BatchError
// names the ids at fault (ErrLiveAgain for an entity that must stay); the
// sweep retries the ids it does not name in a call of their own.
//
// A DELETE by id = ANY looks every id up in the table's primary key, and
// that lookup is most of a batch's cost: key the table by bigint, or by
// text with COLLATE "C", where you can (a libc collation compares through
// strcoll).
type ClearFunc func(ctx context.Context, b *pgx.Batch, ids []string) error

// AtomicKV is a KV that clears entities itself, in the transaction that
// deletes their markers: a retention.ClearDeleter. Create one with
// KV.WithClearSQL, whose clear is one SQL statement, or with KV.WithClear,
// whose clear is Go (a ClearFunc), and give it to retention.New with
// neither Config.Clear nor Config.ClearBatch set. One of WithClearSQL is
// also a retention.RunClearer (see ClearRun), which spares the sweep the
// Scan of each batch: prefer it wherever the clear fits in a statement.
//
// It applies when the entities' state lives in the same PostgreSQL database
// as the markers: then a crash can no longer leave an entity cleared with
// its marker still there, and each entity is cleared exactly once, with no
// lease. State elsewhere (another database, object storage, a cache) cannot
// join the transaction: use Config.ClearBatch there, which clears at least
// once. Under a pgkv Locker the lease's fence joins the transaction too, so
// a replica that lost its lease clears nothing.
//
// A call goes to the server as one simple-protocol Query message holding
// every statement, which PostgreSQL runs as one implicit transaction once
// the whole message has arrived: a message cut off midway runs nothing and
// holds no lock. (In the extended protocol a client cut off between an
// Execute and its Sync would leave its rows, and under a lease the lease
// row, locked until TCP gives up.) The arguments are therefore written into
// the statements' text (see ClearFunc); the markers of a batch that is a
// run of the table take two keys and a digest, whatever its size, and a
// run of ClearRun takes a few keys and numbers.
//
// Over a *pgxpool.Pool, the statement that deletes the markers (or picks
// and deletes a run) is prepared with SQL PREPARE, in the same protocol,
// on a connection the first time it runs there, and EXECUTEd from then
// on: the server no longer parses and plans it every call (BENCHMARKS.md).
// The first call on a connection is then two round trips. Each prepared
// statement holds up to a few hundred KB of the connection's backend
// memory until it closes: some per AtomicKV, and per table of a KV.
type AtomicKV struct {
	*KV
	clear ClearFunc
	// setSQL starts every call's query (SET LOCAL lock_timeout), or is
	// empty; lockTimeout is its value, in milliseconds, or "".
	setSQL, lockTimeout string
	// runClear is the statement of WithClearSQL bound to a run's ids, and
	// runSQL the whole message of a run: the statement that picks and
	// deletes it, with runClear as one of its CTEs when runInline, else
	// after it (see ClearRun). Both are empty for an AtomicKV made by
	// WithClear.
	runClear  string
	runSQL    runMessage
	runInline bool
}

// AtomicOption tunes an AtomicKV made by KV.WithClear or KV.WithClearSQL.
type AtomicOption func(*atomicOptions) error

type atomicOptions struct {
	lockTimeout time.Duration
}

// LockTimeout bounds how long one call of the AtomicKV waits for a row
// lock: a SET LOCAL lock_timeout starts its transaction, so it applies to
// the marker deletion and to every statement of the ClearFunc (or the
// statement of WithClearSQL), and to nothing outside the call; a run of
// ClearRun sets it in its first statement, before any lock, to the same
// effect. Without it (or with 0) a call waits as the
// session's lock_timeout says, by default until its context ends, which
// for a sweep is Config.ClearTimeout (1 min by default).
//
// Use it when the application locks entity rows (SELECT ... FOR UPDATE, a
// long transaction that updated them): a batch that meets one such row
// then fails within d, SQLSTATE 55P03 (lock_not_available), having changed
// nothing, instead of holding up every id of the batch until the lock goes
// or ClearTimeout cuts it off. The failure is the call's alone: the sweep
// bisects the batch, clears the other ids in the same pass, and retries the
// locked one after its retry delay, alone. Keep d short, tens of
// milliseconds: each locked row costs the sweep about
// log2(Config.BatchSize)+1 waits of d on the way down its bisection, and
// one more per retry while the lock lasts, and with Config.Concurrency 1
// the sweep clears nothing else meanwhile. A lock that outlasts several
// retries also counts towards Config.MaxAttempts.
//
// d is rounded up to a whole millisecond; it must not be negative nor
// above PostgreSQL's limit (about 24 days).
func LockTimeout(d time.Duration) AtomicOption {
	return func(o *atomicOptions) error {
		if d < 0 || d > math.MaxInt32*time.Millisecond {
			return fmt.Errorf("pgkv: LockTimeout must be between 0 and %v, got %v", math.MaxInt32*time.Millisecond, d)
		}
		o.lockTimeout = d
		return nil
	}
}

var (
	_ retention.ClearDeleter = (*AtomicKV)(nil)
	_ retention.Mover        = (*AtomicKV)(nil)
)

// WithClear returns an AtomicKV over k's table whose clear is clear,
// tuned by opts (LockTimeout). Where the clear is one SQL statement,
// WithClearSQL makes a faster AtomicKV.
func (k *KV) WithClear(clear ClearFunc, opts ...AtomicOption) (*AtomicKV, error) {
	if clear == nil {
		return nil, errors.New("pgkv: WithClear: clear must not be nil")
	}
	return k.atomicKV("WithClear", clear, opts)
}

// atomicKV returns an AtomicKV whose clear is clear, tuned by opts; fn
// names the function that makes it.
func (k *KV) atomicKV(fn string, clear ClearFunc, opts []AtomicOption) (*AtomicKV, error) {
	var o atomicOptions
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("pgkv: %s: nil AtomicOption", fn)
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	a := &AtomicKV{KV: k, clear: clear}
	if o.lockTimeout > 0 {
		ms := (o.lockTimeout + time.Millisecond - 1) / time.Millisecond
		a.lockTimeout = strconv.FormatInt(int64(ms), 10)
		// In an implicit transaction (one Query message) SET LOCAL lasts
		// to its end, as in BEGIN ... COMMIT; a plain SET would outlive
		// the call on the pooled connection.
		a.setSQL = "SET LOCAL lock_timeout = " + a.lockTimeout
	}
	return a, nil
}

// ClearAndDelete implements retention.ClearDeleter. One statement deletes
// keys, and fails the transaction, changing nothing, unless it deleted
// every one of them: it returns an error matching retention.ErrMarkerGone
// then. Only after it come the statements of the ClearFunc, all in one
// simple-protocol query (see AtomicKV), so a call sent twice clears
// nothing twice. When ctx carries a lease's fence (retention.Fenced), the
// call is fenced by it.
func (a *AtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	view, err := retention.Fenced(ctx, a)
	switch {
	case err != nil:
		return err
	case view != nil:
		f, ok := view.(*fencedAtomicKV)
		if !ok {
			return fmt.Errorf("pgkv: the fenced view of an AtomicKV is a %T, not a ClearDeleter", view)
		}
		return f.ClearAndDelete(ctx, ids, keys)
	}
	return a.clearAndDelete(ctx, ids, keys, markerStatements{rangeSQL: a.rangeMarkersSQL, keysSQL: a.keysMarkersSQL}, nil)
}

// rangeMarkersSQL is the statement that deletes the range of keys from $1
// to $2, and fails unless they were exactly the $3 keys of the digest $4
// (see keyRange), with a message that holds notRangeToken.
func rangeMarkersSQL(table string) string {
	return `WITH ` + rangeCTEs(table, "$1", "$2", "$3", "$4", "") + `
SELECT ` + outcome("", "exact", notRange) + ` FROM n`
}

// keysMarkersSQL is the statement that deletes the keys $1, one lookup
// each, and fails, with a message that holds markerGoneToken, unless it
// deleted $2 rows.
func keysMarkersSQL(table string) string {
	return `WITH ` + keysCTE(table, "$1", "") + `
SELECT ` + outcome("", "deleted = $2::bigint", markerGone("$2")) + `
FROM (SELECT (SELECT count(*) FROM a) AS deleted) AS n`
}

// outcome is the CASE that ends a marker statement of an AtomicKV: 0 when
// ok (an SQL condition) holds, else failure. leaseHeld, when not "", is a
// condition checked first, that fails with leaseLostToken. A failure is an
// integer cast of a text that is not constant, so that the planner cannot
// raise it while folding constants.
func outcome(leaseHeld, ok, failure string) string {
	return outcomeOf(leaseHeld, ok, "0", failure, "")
}

// outcomeOf is outcome with result in place of 0, and each failure
// followed by as, a cast to result's type (such as "::text").
func outcomeOf(leaseHeld, ok, result, failure, as string) string {
	lease := ""
	if leaseHeld != "" {
		lease = `
	WHEN NOT ` + leaseHeld + ` THEN ('` + leaseLostToken + ` ' || ` + leaseHeld + `)::int` + as
	}
	return `CASE` + lease + `
	WHEN ` + ok + ` THEN ` + result + `
	ELSE ` + failure + as + ` END`
}

// markerGone is the failure of a statement that deleted fewer markers
// than the count placeholder says.
func markerGone(count string) string {
	return `('` + markerGoneToken + ` ' || deleted || ' of ' || ` + count + `::bigint || ' markers deleted')::int`
}

// markerGoneToken and leaseLostToken start the texts whose failed cast
// aborts a clear's transaction; the error's message quotes them.
const (
	markerGoneToken = "pgkv: marker gone:"
	leaseLostToken  = "pgkv: lease lost:"
)

// castFailure reports whether err is the failed cast of a text starting
// with token.
func castFailure(err error, token string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && // invalid_text_representation
		strings.Contains(pgErr.Message, `"`+token)
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

// markerStatements are the two forms of the statement that deletes a
// call's markers: by range and key by key. Each takes lead (the lease's
// arguments, or none) before its own.
type markerStatements struct {
	rangeSQL, keysSQL prepared
	lead              []any
}

// clearAndDelete sends the statement that deletes the markers followed by
// the ClearFunc's statements, in one simple-protocol query: the range form
// when keys are ascending, and the key-by-key form when they are not or
// when the range form found the range's rows were not exactly keys (a
// second round trip, which changes nothing the first did not). lease, when
// not nil, is the lease the statements check.
func (a *AtomicKV) clearAndDelete(ctx context.Context, ids []string, keys [][]byte, st markerStatements, lease *pgLease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := &pgx.Batch{}
	r, isRange := rangeOf(keys)
	// The markers go first: when one is gone, the ClearFunc's statements
	// never run. send fills in the statement's form.
	first := st.keysSQL
	if isRange {
		first = st.rangeSQL
		b.Queue("", append(slices.Clip(st.lead), r.args()...)...)
	} else {
		b.Queue("", append(slices.Clip(st.lead), keys, distinct(keys))...)
	}
	if err := a.clear(ctx, b, ids); err != nil {
		return err
	}
	if b.Len() == 1 {
		return errors.New("pgkv: the ClearFunc queued no statement")
	}
	err := a.send(ctx, b, first, lease)
	if isRange && castFailure(err, notRangeToken) {
		b.QueuedQueries[0].Arguments = append(slices.Clip(st.lead), keys, distinct(keys))
		err = a.send(ctx, b, st.keysSQL, lease)
	}
	return err
}

// send runs first, the marker statement, then the rest of the statements
// of b in one simple-protocol query (prepared where it can be, see
// onPrepared), and turns the failures of the marker statement into their
// errors.
func (a *AtomicKV) send(ctx context.Context, b *pgx.Batch, first prepared, lease *pgLease) error {
	var joinErr error
	err := a.onPrepared(ctx, first, func(db DB, stmt string) error {
		b.QueuedQueries[0].SQL = stmt
		text, args, err := joinBatch(ctx, b)
		if err != nil {
			joinErr = err
			return err
		}
		if a.setSQL != "" {
			// First, so that it covers the lease row and the markers too.
			text = a.setSQL + ";\n" + text
		}
		_, err = db.Exec(ctx, text, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
		return err
	})
	op := "clear and delete from " + a.table
	switch {
	case err == nil:
		return nil
	case joinErr != nil:
		return joinErr
	case lease != nil && castFailure(err, leaseLostToken):
		lease.markLost()
		return lease.refused(op)
	case castFailure(err, notRangeToken):
		return err // the caller tries again key by key
	case castFailure(err, heldToken):
		return fmt.Errorf("pgkv: %s: %w", op, holdsOf(err))
	case castFailure(err, markerGoneToken):
		var pgErr *pgconn.PgError
		errors.As(err, &pgErr)
		return fmt.Errorf("pgkv: %s: %w (%s)", op, retention.ErrMarkerGone, pgErr.Message)
	}
	return wrap(ctx, op, err)
}

// fencedAtomicKV is the view of an AtomicKV under a pgLease: the marker
// deletion checks the lease in the same statement and fails the whole
// transaction when it is no longer held, so the entities stay too.
type fencedAtomicKV struct {
	*fencedKV
	atomic     *AtomicKV
	statements markerStatements
	runSQL     runMessage // the run's message (see ClearRun), or none
}

var (
	_ retention.ClearDeleter = (*fencedAtomicKV)(nil)
	_ retention.Mover        = (*fencedAtomicKV)(nil)
)

// fenceAtomic returns the fenced view of a.
func (p *pgLease) fenceAtomic(a *AtomicKV) *fencedAtomicKV {
	f := p.fenceKV(a.KV)
	// The lease row is locked (FOR SHARE) to the end of the transaction, so
	// a takeover waits for it to commit; the whole transaction is one
	// Query message (see AtomicKV), so it never waits for a client.
	with := `WITH l AS MATERIALIZED (` + p.l.fenceSQL + `),
`
	held := `EXISTS (SELECT 1 FROM l)`
	v := &fencedAtomicKV{fencedKV: f, atomic: a, statements: markerStatements{
		rangeSQL: newPrepared(with+rangeCTEs(a.table, "$4", "$5", "$6", "$7", held)+`
SELECT `+outcome("held", "exact", notRange)+`
FROM (SELECT `+held+` AS held, exact, deleted FROM n) AS o`, 7),
		keysSQL: newPrepared(with+keysCTE(a.table, "$4", held)+`
SELECT `+outcome("held", "deleted = $5::bigint", markerGone("$5"))+`
FROM (SELECT `+held+` AS held, (SELECT count(*) FROM a) AS deleted) AS n`, 5),
		lead: []any{p.l.name, p.holder, p.fence},
	}}
	if a.runClear != "" {
		v.runSQL = a.runStatement(p.l.table, len(v.statements.lead))
	}
	return v
}

func (f *fencedAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	p := f.lease
	if p.isLost() {
		return p.refused("clear and delete from " + f.atomic.table)
	}
	return f.atomic.clearAndDelete(ctx, ids, keys, f.statements, p)
}
