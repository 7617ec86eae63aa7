package sqlkv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

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
	// MigrateLeases in the database of the KV. Empty means
	// DefaultLeaseTable.
	Table string
}

// Locker is a retention.Locker built on a row of a lease table: the row
// names the holder, a fencing counter that grows with every acquisition,
// and an expiry set from the server's clock (on SQLite, the clock of the
// host whose processes share the file). Create one with NewLocker and the
// table with MigrateLeases.
//
// TryAcquire takes the row when it is missing or expired, in one upsert;
// the holder renews it every third of the TTL, on a connection of its
// own, with an UPDATE that only extends an unexpired row that still names
// it, tries again soon after a renewal that failed, and closes Lost a
// tenth of the TTL before the server could expire the row.
//
// Its leases are retention.Fencers for the KV it was made with and for
// its AtomicKVs (and for any KV or AtomicKV over the same *sql.DB): a
// fenced Delete, Put or Move is one statement whose WHERE also requires
// the lease row to name this holder, unexpired, and on MySQL and
// PostgreSQL locks that row (LOCK IN SHARE MODE, FOR SHARE) until the
// statement commits, so a takeover, which updates the row, waits for it;
// SQLite runs one writer at a time. A fenced ClearAndDelete or ClearRun
// checks the row the same way in its transaction: last before COMMIT on MySQL and
// PostgreSQL, first on SQLite (an UPDATE, which takes the write lock). A
// fenced transaction bounds how long its session may sit idle by the TTL
// (wait_timeout on MySQL, SET LOCAL idle_in_transaction_session_timeout on
// PostgreSQL), so that a holder whose host vanished mid-transaction keeps
// the row locked for about a TTL, not until TCP gives up.
type Locker struct {
	kv    *KV
	name  string
	table string // quoted
	ttl   time.Duration
}

var _ retention.Locker = (*Locker)(nil)

// NewLocker returns a Locker for the lease called name, whose lease table
// lives in the database of kv, and whose leases fence kv; replicas that
// use the same name and table share one lease. A lease keeps one
// connection of kv's *sql.DB for its renewals from TryAcquire until it
// ends, so that they never wait for the pool: leave the pool room for it
// (SetMaxOpenConns above Config.Concurrency plus one).
func NewLocker(kv *KV, name string, opts *LockerOptions) (*Locker, error) {
	if kv == nil {
		return nil, errors.New("sqlkv: kv must not be nil")
	}
	if name == "" {
		return nil, errors.New("sqlkv: lease name must not be empty")
	}
	var o LockerOptions
	if opts != nil {
		o = *opts
	}
	if o.TTL == 0 {
		o.TTL = DefaultLeaseTTL
	}
	if o.TTL < MinLeaseTTL {
		return nil, fmt.Errorf("sqlkv: LockerOptions.TTL must be at least %v, got %v", MinLeaseTTL, o.TTL)
	}
	if o.Table == "" {
		o.Table = DefaultLeaseTable
	}
	table, err := kv.dialect.quoteTable(o.Table)
	if err != nil {
		return nil, fmt.Errorf("sqlkv: LockerOptions.Table: %w", err)
	}
	return &Locker{kv: kv, name: name, table: table, ttl: o.TTL}, nil
}

// MigrateLeases creates the lease table of Lockers if it does not exist. It
// is idempotent and safe to run from several replicas at once.
func MigrateLeases(ctx context.Context, db *sql.DB, d Dialect, table string) error {
	quoted, err := d.quoteTable(table)
	if err != nil {
		return err
	}
	return migrate(ctx, db, d, quoted, d.createLeases(quoted))
}

// safetyMargin is how much earlier than the server the holder gives its
// lease up: room for the latency of the statement that set the expiry and
// for clock rate drift between holder and server.
func (l *Locker) safetyMargin() time.Duration { return l.ttl / 10 }

// idleSeconds is how long a fenced transaction's session may sit idle on
// MySQL before the server closes it: the TTL, in whole seconds.
func (l *Locker) idleSeconds() int64 {
	return int64((l.ttl + time.Second - 1) / time.Second)
}

// TryAcquire implements retention.Locker. It returns an error matching
// ErrNoLeaseTable when MigrateLeases has not run.
func (l *Locker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	holder := newHolder()
	sent := time.Now()
	fence, err := l.acquire(ctx, holder)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("sqlkv: lease %q: %w", l.name, retention.ErrLeaseHeld)
	case err != nil:
		if ctx.Err() == nil && noTable(err) {
			return nil, fmt.Errorf("%w: %s: %w", ErrNoLeaseTable, l.table, err)
		}
		return nil, wrap(ctx, "acquire lease "+l.name, err)
	}
	lease := &sqlLease{l: l, holder: holder, fence: fence, lost: make(chan struct{}), stop: make(chan struct{})}
	r := lease.newRenewer()
	r.connect(ctx) // a failure here is tried again at the first renewal
	lease.wg.Go(func() { lease.keepAlive(r, sent.Add(l.ttl-l.safetyMargin())) })
	return lease, nil
}

// acquire takes the row for holder when it is missing or expired and
// returns its fence, or sql.ErrNoRows when another holder has it.
func (l *Locker) acquire(ctx context.Context, holder string) (int64, error) {
	d, db, ttl := l.kv.dialect, l.kv.db, l.ttl.Microseconds()
	var fence int64
	switch d {
	case MySQL:
		// No RETURNING: the upsert changes the row only when it expired
		// (each IF reads expires_at before the last assignment changes it),
		// and a read by the holder's unique name then tells.
		expired := "expires_at <= UTC_TIMESTAMP(6)"
		_, err := db.ExecContext(ctx, "INSERT INTO "+l.table+" (name, holder, fence, expires_at) VALUES (?, ?, 1, "+d.later("?")+")"+
			" ON DUPLICATE KEY UPDATE holder = IF("+expired+", VALUES(holder), holder), fence = IF("+expired+", fence + 1, fence),"+
			" expires_at = IF("+expired+", VALUES(expires_at), expires_at)", l.name, holder, ttl)
		if err != nil {
			return 0, err
		}
		return fence, queryRow(ctx, d, db, "SELECT fence FROM "+l.table+" WHERE name = ? AND holder = ?", []any{l.name, holder}, &fence)
	case SQLite:
		return fence, queryRow(ctx, d, db, "INSERT INTO "+l.table+" (name, holder, fence, expires_at) VALUES (?, ?, 1, "+d.later("?")+")"+
			" ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, fence = fence + 1, expires_at = excluded.expires_at"+
			" WHERE expires_at <= "+d.now()+" RETURNING fence", []any{l.name, holder, ttl}, &fence)
	}
	// The expiry is computed in SET too, not only in VALUES: the statement
	// may have waited for a fenced write of the old holder to commit.
	return fence, queryRow(ctx, d, db, "INSERT INTO "+l.table+" AS l (name, holder, fence, expires_at) VALUES ($1, $2, 1, "+d.later("$3")+")"+
		" ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, fence = l.fence + 1, expires_at = "+d.later("$3")+
		" WHERE l.expires_at <= clock_timestamp() RETURNING fence", []any{l.name, holder, ttl}, &fence)
}

// newHolder names one acquisition: where it runs, for operators reading the
// table, and a random part that makes it unique.
func newHolder() string {
	host, _ := os.Hostname()
	var raw [12]byte
	_, _ = rand.Read(raw[:]) // never fails
	h := fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(raw[:]))
	if len(h) > 255 { // the holder column
		h = h[len(h)-255:]
	}
	return h
}

type sqlLease struct {
	l      *Locker
	holder string
	fence  int64

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

var _ retention.Fencer = (*sqlLease)(nil)

func (p *sqlLease) Lost() <-chan struct{} { return p.lost }

func (p *sqlLease) markLost() { p.lostOnce.Do(func() { close(p.lost) }) }

func (p *sqlLease) isLost() bool {
	select {
	case <-p.lost:
		return true
	default:
		return false
	}
}

// held is the condition, placeholders from first, that the lease row
// still names this holder and has not expired, and its arguments.
func (p *sqlLease) held(first int) (string, []any) {
	d := p.l.kv.dialect
	return "name = " + d.ph(first) + " AND holder = " + d.ph(first+1) + " AND fence = " + d.ph(first+2) +
		" AND expires_at > " + d.now(), []any{p.l.name, p.holder, p.fence}
}

// guard is the condition a fenced statement adds to its WHERE.
func (p *sqlLease) guard() *guard {
	_, args := p.held(1)
	return &guard{
		sql: func(first int) string {
			c, _ := p.held(first)
			return "EXISTS (SELECT 1 FROM " + p.l.table + " WHERE " + c + p.l.kv.dialect.lockShare() + ")"
		},
		args: args,
	}
}

// stillHeld reads whether the lease row names this holder, unexpired.
func (p *sqlLease) stillHeld(ctx context.Context, db execer) (bool, error) {
	c, args := p.held(1)
	var n int64
	err := queryRow(ctx, p.l.kv.dialect, db, "SELECT count(*) FROM "+p.l.table+" WHERE "+c, args, &n)
	return n > 0, err
}

// enterTx starts a fenced transaction: on SQLite it checks the lease with
// an UPDATE of its row, which takes the database's write lock first; on
// PostgreSQL it bounds how long the session may sit idle in it.
func (p *sqlLease) enterTx(ctx context.Context, tx *sql.Tx, op string) error {
	switch p.l.kv.dialect {
	case SQLite:
		c, args := p.held(1)
		n, err := exec(ctx, SQLite, tx, "UPDATE "+p.l.table+" SET fence = fence WHERE "+c, args)
		if err != nil {
			return wrap(ctx, op, err)
		}
		if n == 0 {
			p.markLost()
			return p.refused(op)
		}
	case PostgreSQL:
		ms := p.l.ttl.Milliseconds()
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", ms)); err != nil {
			return wrap(ctx, op, err)
		}
	}
	return nil
}

// checkTx ends a fenced transaction's work on MySQL and PostgreSQL: it
// locks the lease row until COMMIT, or refuses when it no longer names
// this holder.
func (p *sqlLease) checkTx(ctx context.Context, tx *sql.Tx, op string) error {
	if p.l.kv.dialect == SQLite {
		return nil
	}
	c, args := p.held(1)
	var one int
	err := queryRow(ctx, p.l.kv.dialect, tx, "SELECT 1 FROM "+p.l.table+" WHERE "+c+p.l.kv.dialect.lockShare(), args, &one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		p.markLost()
		return p.refused(op)
	case err != nil:
		return wrap(ctx, op, err)
	}
	return nil
}

// Release stops renewing and expires the row if it still names this
// holder, so that another replica can take it at once.
func (p *sqlLease) Release(ctx context.Context) error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait() // keepAlive has marked the lease lost on its way out
	d := p.l.kv.dialect
	q := "UPDATE " + p.l.table + " SET expires_at = " + d.now() + " WHERE name = " + d.ph(1) + " AND holder = " + d.ph(2) + " AND fence = " + d.ph(3)
	if _, err := p.l.kv.db.ExecContext(ctx, q, p.l.name, p.holder, p.fence); err != nil {
		return wrap(ctx, "release lease "+p.l.name, err)
	}
	return nil
}

// Fence implements retention.Fencer for a *KV, *AtomicKV, *TableKV or
// *AtomicTableKV over the *sql.DB of the Locker's KV.
func (p *sqlLease) Fence(kv retention.KV) (retention.KV, bool) {
	switch k := kv.(type) {
	case *KV:
		if k.db == p.l.kv.db && k.dialect == p.l.kv.dialect {
			return &fencedKV{kv: k, lease: p}, true
		}
	case *AtomicKV:
		if k.db == p.l.kv.db && k.dialect == p.l.kv.dialect {
			return &fencedAtomicKV{fencedKV: &fencedKV{kv: k.KV, lease: p}, atomic: k}, true
		}
	case *TableKV:
		if k.side.db == p.l.kv.db && k.d == p.l.kv.dialect {
			return &fencedTable{t: k, lease: p}, true
		}
	case *AtomicTableKV:
		if k.side.db == p.l.kv.db && k.d == p.l.kv.dialect {
			return &fencedAtomicTable{fencedTable: &fencedTable{t: k.TableKV, lease: p}, a: k}, true
		}
	}
	return nil, false
}

// fencedKV is a KV whose writes take effect only while its lease holds.
type fencedKV struct {
	kv    *KV
	lease *sqlLease
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
	return f.write(ctx, "delete from", int64(distinctAny(keys)), func(g *guard) (int64, error) {
		c, done, err := f.kv.session(ctx, 0, false)
		if err != nil {
			return 0, wrap(ctx, "delete from "+f.kv.table, err)
		}
		defer done()
		return f.kv.delete(ctx, c, keys, nil, g)
	})
}

func (f *fencedKV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(value) != 0 {
		return fmt.Errorf("sqlkv: Put of %q with a %d-byte value: the marker table stores keys only", key, len(value))
	}
	return f.write(ctx, "insert into", 1, func(g *guard) (int64, error) {
		c, done, err := f.kv.session(ctx, 0, false)
		if err != nil {
			return 0, wrap(ctx, "insert into "+f.kv.table, err)
		}
		defer done()
		return f.kv.put(ctx, c, key, g)
	})
}

func (f *fencedKV) Move(ctx context.Context, from, to [][]byte) error {
	if err := checkMove(ctx, from, to); err != nil || len(from) == 0 {
		return err
	}
	return f.write(ctx, "move in", int64(len(from)), func(*guard) (int64, error) {
		return f.kv.move(ctx, from, to, f.lease)
	})
}

// write runs a fenced write that may change up to want rows. The
// statement's guard makes it write nothing once the lease is gone; when it
// changed fewer rows than it could, a read of the lease row tells a
// refusal from keys that were missing (or present already).
func (f *fencedKV) write(ctx context.Context, op string, want int64, run func(*guard) (int64, error)) error {
	p := f.lease
	op += " " + f.kv.table
	if p.isLost() {
		return p.refused(op)
	}
	n, err := run(p.guard())
	if err != nil || n >= want {
		return err
	}
	held, err := p.stillHeld(ctx, f.kv.db)
	if err != nil {
		return wrap(ctx, op, err)
	}
	if held {
		return nil
	}
	p.markLost()
	if n > 0 {
		// It wrote, so the lease was held then; it is gone now.
		return nil
	}
	return p.refused(op)
}

func (p *sqlLease) refused(op string) error {
	return fmt.Errorf("sqlkv: %s refused: lease %q is no longer held by %s: %w", op, p.l.name, p.holder, retention.ErrLeaseLost)
}

// distinctAny counts the distinct keys of a list in any order.
func distinctAny(keys [][]byte) int {
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		seen[string(k)] = struct{}{}
	}
	return len(seen)
}
