package pgkv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention"
)

// DefaultLeaseTTL is the TTL of a Locker's lease when LockerOptions.TTL is
// zero: a holder that dies, freezes or is cut off blocks sweeping for at
// most this long.
const DefaultLeaseTTL = 10 * time.Second

// MinLeaseTTL is the shortest TTL a Locker accepts: renewals go out every
// third of it and must have time to make the round trip.
const MinLeaseTTL = 100 * time.Millisecond

// DefaultLeaseTable is the lease table of a Locker when LockerOptions.Table
// is empty.
const DefaultLeaseTable = "retention_leases"

// LockerOptions tune a Locker. A nil *LockerOptions means the defaults.
type LockerOptions struct {
	// TTL is how long the lease outlives a holder that stops renewing it.
	// The holder renews it every third of the TTL and considers it lost
	// once a tenth of the TTL short of it has passed since the last renewal
	// that got through was sent. Zero means DefaultLeaseTTL; otherwise at
	// least MinLeaseTTL.
	TTL time.Duration

	// Table is the lease table, "table" or "schema.table", created by
	// MigrateLeases. It must live in the database of the marker tables the
	// lease fences. Empty means DefaultLeaseTable.
	Table string
}

// Locker is a retention.Locker built on a row of a lease table: the row
// names the holder, a fencing counter that grows with every acquisition, and
// an expiry set from the server's clock. Create one with NewLocker and the
// table with MigrateLeases.
//
// TryAcquire takes the row when it is missing or expired, in one INSERT
// ... ON CONFLICT DO UPDATE ... WHERE expired; the holder renews it every
// third of the TTL with an UPDATE that only extends an unexpired row that
// still names it. Every expiry is computed by PostgreSQL (clock_timestamp()),
// so replicas' clocks do not matter; the holder's own monotonic clock only
// makes it give up early: it closes Lost a tenth of the TTL before the
// server could expire the row.
//
// Its leases are retention.Fencers for a *KV or an *AtomicKV in the same
// database: a fenced Delete, Put or Move is one statement that locks the
// lease row FOR SHARE, checks that it still names this holder and is
// unexpired, and writes only then; a fenced ClearAndDelete or ClearRun does
// the same in the statement that deletes the markers, the first of its
// transaction. A
// takeover updates that row, so it waits for the fenced transaction to
// commit: no marker write of an old holder can commit after a new holder's
// TryAcquire returned, whatever the old holder's clock or scheduling did.
// The same fence applies to the writes of a KV that wraps a *KV or an
// *AtomicKV, when the sweep puts the lease on their context (see
// retention.Fenced).
//
// Unlike a session advisory lock, a lease row is not freed by a crash: the
// fleet waits out the TTL. In exchange a holder that is frozen,
// partitioned, or whose host vanished without closing its connection
// blocks the fleet for one TTL at most. A clean Release expires the row at
// once.
//
// Every transaction that locks the lease row goes out in the simple query
// protocol, as one Query message that the server runs only once it has
// arrived whole, so a holder cut off mid-message leaves no lock behind and
// a takeover comes within the TTL (see AtomicKV).
type Locker struct {
	pool  *pgxpool.Pool
	name  string
	table string // quoted
	ttl   time.Duration

	acquireSQL, renewSQL, releaseSQL, fenceSQL string
}

var _ retention.Locker = (*Locker)(nil)

// NewLocker returns a Locker for the lease called name; replicas that use
// the same name and table share one lease. The holder renews its lease on a
// connection of pool every third of the TTL: leave the pool room for it
// (MaxConns above Config.Concurrency when Clear uses the same pool), or
// a renewal that waits for a connection may cost the lease.
func NewLocker(pool *pgxpool.Pool, name string, opts *LockerOptions) (*Locker, error) {
	if pool == nil {
		return nil, errors.New("pgkv: pool must not be nil")
	}
	if name == "" {
		return nil, errors.New("pgkv: lease name must not be empty")
	}
	var o LockerOptions
	if opts != nil {
		o = *opts
	}
	if o.TTL == 0 {
		o.TTL = DefaultLeaseTTL
	}
	if err := checkLeaseTTL(o.TTL); err != nil {
		return nil, err
	}
	if o.Table == "" {
		o.Table = DefaultLeaseTable
	}
	table, err := quoteTable(o.Table)
	if err != nil {
		return nil, fmt.Errorf("pgkv: LockerOptions.Table: %w", err)
	}
	const expiry = `clock_timestamp() + $3::bigint * interval '1 microsecond'`
	return &Locker{
		pool: pool, name: name, table: table, ttl: o.TTL,
		// The expiry is computed in SET, not VALUES: the statement may have
		// waited for a fenced write of the old holder to commit.
		acquireSQL: `INSERT INTO ` + table + ` AS l (name, holder, fence, expires_at) VALUES ($1, $2, 1, ` + expiry + `)
ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, fence = l.fence + 1, expires_at = ` + expiry + `
WHERE l.expires_at <= clock_timestamp()
RETURNING fence`,
		renewSQL: `UPDATE ` + table + ` SET expires_at = ` + expiry + `
WHERE name = $1 AND holder = $2 AND fence = $4 AND expires_at > clock_timestamp()`,
		releaseSQL: `UPDATE ` + table + ` SET expires_at = clock_timestamp() WHERE name = $1 AND holder = $2 AND fence = $3`,
		fenceSQL:   fenceQuery(table, ""),
	}, nil
}

// fenceQuery is the query that finds the lease row of the holder $2 with
// the fence $3 in table, when it is unexpired and when (if not "") the
// condition first holds, and locks it. FOR SHARE, not FOR KEY SHARE: a
// takeover changes no key column, so it would not wait for a KEY SHARE
// lock.
func fenceQuery(table, first string) string {
	if first != "" {
		first += " AND "
	}
	return `SELECT 1 FROM ` + table + ` WHERE ` + first + `name = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp() FOR SHARE`
}

// checkLeaseTTL refuses a LockerOptions.TTL, already defaulted, shorter
// than MinLeaseTTL.
func checkLeaseTTL(ttl time.Duration) error {
	if ttl < MinLeaseTTL {
		return fmt.Errorf("pgkv: LockerOptions.TTL must be at least %v, got %v", MinLeaseTTL, ttl)
	}
	return nil
}

// MigrateLeases creates the lease table of Lockers if it does not exist. It
// is idempotent and safe to run from several replicas at once.
func MigrateLeases(ctx context.Context, db DB, table string) error {
	quoted, err := quoteTable(table)
	if err != nil {
		return err
	}
	h := fnv.New64a()
	h.Write([]byte("retention/pgkv migrate " + quoted))
	sql := fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d); CREATE TABLE IF NOT EXISTS %s (
	name text PRIMARY KEY,
	holder text NOT NULL,
	fence bigint NOT NULL,
	expires_at timestamptz NOT NULL
)`, int64(h.Sum64()), quoted)
	if _, err := db.Exec(ctx, sql); err != nil {
		return wrap(ctx, "migrate "+quoted, err)
	}
	return nil
}

// safetyMargin is how much earlier than the server the holder gives its
// lease up: room for the latency of the statement that set the expiry and
// for clock rate drift between holder and server.
func (l *Locker) safetyMargin() time.Duration { return l.ttl / 10 }

// TryAcquire implements retention.Locker. It returns an error matching
// ErrNoLeaseTable when MigrateLeases has not run.
func (l *Locker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	holder := newHolder()
	sent := time.Now()
	var fence int64
	err := l.pool.QueryRow(ctx, l.acquireSQL, pgx.QueryExecModeSimpleProtocol, l.name, holder, l.ttl.Microseconds()).Scan(&fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("pgkv: lease %q: %w", l.name, retention.ErrLeaseHeld)
	case err != nil:
		if ctx.Err() == nil && hasCode(err, "42P01") { // undefined_table
			return nil, fmt.Errorf("%w: %s: %w", ErrNoLeaseTable, l.table, err)
		}
		return nil, wrap(ctx, "acquire lease "+l.name, err)
	}
	lease := &pgLease{l: l, holder: holder, fence: fence, lost: make(chan struct{}), stop: make(chan struct{})}
	lease.wg.Go(func() { lease.keepAlive(sent.Add(l.ttl - l.safetyMargin())) })
	return lease, nil
}

// newHolder names one acquisition: where it runs, for operators reading the
// table, and a random part that makes it unique.
func newHolder() string {
	host, _ := os.Hostname()
	var raw [12]byte
	_, _ = rand.Read(raw[:]) // never fails
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(raw[:]))
}

type pgLease struct {
	l      *Locker
	holder string
	fence  int64

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

var _ retention.Fencer = (*pgLease)(nil)

func (p *pgLease) Lost() <-chan struct{} { return p.lost }

func (p *pgLease) markLost() { p.lostOnce.Do(func() { close(p.lost) }) }

func (p *pgLease) isLost() bool {
	select {
	case <-p.lost:
		return true
	default:
		return false
	}
}

// keepAlive renews the row every third of the TTL. validUntil is when the
// holder stops trusting its lease if no renewal gets through; the row
// expires a safety margin later on the server.
func (p *pgLease) keepAlive(validUntil time.Time) {
	defer p.markLost()
	tick := time.NewTicker(p.l.ttl / 3)
	defer tick.Stop()
	expiry := time.NewTimer(time.Until(validUntil))
	defer expiry.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-expiry.C:
			return
		case <-tick.C:
		}
		// A renewal may not outlast the lease it renews.
		ctx, cancel := context.WithDeadline(context.Background(), validUntil)
		sent := time.Now()
		tag, err := p.l.pool.Exec(ctx, p.l.renewSQL, pgx.QueryExecModeSimpleProtocol, p.l.name, p.holder, p.l.ttl.Microseconds(), p.fence)
		cancel()
		switch {
		case err == nil && tag.RowsAffected() == 1:
			validUntil = sent.Add(p.l.ttl - p.l.safetyMargin())
			expiry.Reset(time.Until(validUntil))
		case err == nil:
			return // expired, or taken over
		}
		// On an error, try again at the next tick until validUntil.
	}
}

// Release stops renewing and expires the row if it still names this
// holder, so that another replica can take it at once.
func (p *pgLease) Release(ctx context.Context) error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait() // keepAlive has marked the lease lost on its way out
	if _, err := p.l.pool.Exec(ctx, p.l.releaseSQL, pgx.QueryExecModeSimpleProtocol, p.l.name, p.holder, p.fence); err != nil {
		return wrap(ctx, "release lease "+p.l.name, err)
	}
	return nil
}

// Fence implements retention.Fencer for a *KV whose table is in the
// database of the lease table. Its writes run on the KV's own DB.
func (p *pgLease) Fence(kv retention.KV) (retention.KV, bool) {
	switch k := kv.(type) {
	case *KV:
		return p.fenceKV(k), true
	case *AtomicKV:
		return p.fenceAtomic(k), true
	}
	return nil, false
}

// fenceKV returns the fenced view of k.
func (p *pgLease) fenceKV(k *KV) *fencedKV {
	// The lease check is a materialized CTE evaluated once: the write runs
	// only when it found the row, and the query reports whether it did, so
	// that a refusal is told apart from keys that were already gone.
	with := `WITH l AS MATERIALIZED (` + p.l.fenceSQL + `), `
	held := `EXISTS (SELECT 1 FROM l)`
	return &fencedKV{
		kv: k, lease: p,
		// A range that held other rows fails only when the lease held:
		// without it, nothing was deleted.
		rangeDeleteSQL: newPrepared(with+rangeCTEs(k.table, "$4", "$5", "$6", "$7", held)+`
SELECT CASE WHEN held AND NOT exact THEN `+notRange+` > 0 ELSE held END FROM (SELECT `+held+` AS held, exact, deleted FROM n) AS o`, 7),
		keysDeleteSQL: newPrepared(with+keysCTE(k.table, "$4", held)+`
SELECT `+held, 4),
		insertSQL: newPrepared(with+`w AS (INSERT INTO `+k.table+` (key) SELECT $4::bytea WHERE `+held+` ON CONFLICT DO NOTHING)
SELECT `+held, 4),
		moveSQL: newPrepared(with+moveCTEs(k.table, "$4", "$5", held)+`
SELECT `+held, 5),
	}
}

// fencedKV is a KV whose writes take effect only while its lease holds.
type fencedKV struct {
	kv    *KV
	lease *pgLease
	// Each returns whether the lease held.
	rangeDeleteSQL, keysDeleteSQL, insertSQL, moveSQL prepared
}

var (
	_ retention.KV     = (*fencedKV)(nil)
	_ retention.Putter = (*fencedKV)(nil)
	_ retention.Mover  = (*fencedKV)(nil)
)

func (f *fencedKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return f.kv.Scan(ctx, start, end, limit)
}

func (f *fencedKV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	if r, ok := rangeOf(keys); ok { // see KV.Delete
		if err := f.write(ctx, "delete from", f.rangeDeleteSQL, r.args()...); !castFailure(err, notRangeToken) {
			return err
		}
	}
	return f.write(ctx, "delete from", f.keysDeleteSQL, keys)
}

func (f *fencedKV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(value) != 0 {
		return fmt.Errorf("pgkv: Put of %q with a %d-byte value: the marker table stores keys only", key, len(value))
	}
	return f.write(ctx, "insert into", f.insertSQL, key)
}

func (f *fencedKV) Move(ctx context.Context, from, to [][]byte) error {
	if err := checkMove(ctx, from, to); err != nil || len(from) == 0 {
		return err
	}
	return f.write(ctx, "move in", f.moveSQL, from, to)
}

// write runs one fenced statement (see KV.write); args are its $4 on.
func (f *fencedKV) write(ctx context.Context, op string, sql prepared, args ...any) error {
	p := f.lease
	op += " " + f.kv.table
	if p.isLost() {
		return p.refused(op)
	}
	var held bool
	err := f.kv.onPrepared(ctx, sql, func(db DB, stmt string) error {
		rows, err := db.Query(ctx, stmt, append([]any{pgx.QueryExecModeSimpleProtocol, p.l.name, p.holder, p.fence}, args...)...)
		if err == nil {
			held, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
		}
		return err
	})
	if err != nil {
		return wrap(ctx, op, err)
	}
	if !held {
		p.markLost()
		return p.refused(op)
	}
	return nil
}

func (p *pgLease) refused(op string) error {
	return fmt.Errorf("pgkv: %s refused: lease %q is no longer held by %s: %w", op, p.l.name, p.holder, retention.ErrLeaseLost)
}
