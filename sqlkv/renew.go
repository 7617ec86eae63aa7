package sqlkv

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strconv"
	"strings"
	"time"
)

// renewer renews a lease's row on a connection of its own, taken from
// the pool when the lease is acquired and kept until it ends, so that a
// renewal never queues for a connection behind the sweep's or the
// application's statements. On SQLite the connection's busy timeout is
// zero and the renewer itself retries a busy database every
// sqliteRenewPoll: SQLite's own busy handler sleeps up to 100ms between
// tries while other connections take the write lock in turn, and under
// load a renewal left to it can miss every chance for seconds.
type renewer struct {
	p       *sqlLease
	conn    *sql.Conn
	restore string // the statement that puts back the connection's busy timeout (SQLite)
	q       string
	args    []any
}

// sqliteRenewPoll is how often a renewal tries SQLite's write lock again
// while the database is busy.
const sqliteRenewPoll = 2 * time.Millisecond

func (p *sqlLease) newRenewer() *renewer {
	l := p.l
	d := l.kv.dialect
	c, args := p.held(2)
	return &renewer{
		p:    p,
		q:    "UPDATE " + l.table + " SET expires_at = " + d.later(d.ph(1)) + " WHERE " + c,
		args: append([]any{l.ttl.Microseconds()}, args...),
	}
}

// connect takes the renewer's connection when it has none.
func (r *renewer) connect(ctx context.Context) error {
	if r.conn != nil {
		return nil
	}
	conn, err := r.p.l.kv.db.Conn(ctx)
	if err != nil {
		return err
	}
	if r.p.l.kv.dialect == SQLite {
		var ms int64
		err := queryRow(ctx, SQLite, conn, "PRAGMA busy_timeout", nil, &ms)
		if err == nil {
			_, err = conn.ExecContext(ctx, "PRAGMA busy_timeout = 0")
			r.restore = "PRAGMA busy_timeout = " + strconv.FormatInt(ms, 10)
		}
		if err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			_ = conn.Close()
			return err
		}
	}
	r.conn = conn
	return nil
}

// renew extends the row by a TTL and returns whether it still named this
// holder, and when the statement that extended it was sent. A failed
// connection is dropped, and the next renewal takes another.
func (r *renewer) renew(ctx context.Context) (ok bool, sent time.Time, err error) {
	if err := r.connect(ctx); err != nil {
		return false, time.Time{}, err
	}
	d := r.p.l.kv.dialect
	for {
		sent = time.Now()
		var n int64
		n, err = exec(ctx, d, r.conn, r.q, r.args)
		if err == nil {
			return n == 1, sent, nil
		}
		if d != SQLite || !busy(err) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-r.p.stop:
		case <-time.After(sqliteRenewPoll):
			continue
		}
		break
	}
	if d != SQLite || !busy(err) {
		// Perhaps broken (a driver closes a connection whose context
		// ended mid-statement): the next renewal takes another. A busy
		// SQLite connection is sound, and the pool may have no other.
		r.drop()
	}
	return false, sent, err
}

// closed reports whether db was closed. The renewer's connection outlives
// DB.Close, which closes only idle connections, and a lease must not. A
// ping with a context already done reads the closed flag and returns
// without taking a connection: the flag's error, or the context's.
func closed(db *sql.DB) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := db.PingContext(ctx)
	return err != nil && !errors.Is(err, context.Canceled)
}

// busy reports whether err is SQLite's "database is locked" (SQLITE_BUSY),
// read from its message: the package imports no driver.
func busy(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked")
}

// drop closes the connection without giving it back to the pool.
func (r *renewer) drop() {
	if r.conn == nil {
		return
	}
	_ = r.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = r.conn.Close()
	r.conn = nil
}

// close gives the connection back to the pool as it was.
func (r *renewer) close() {
	if r.conn == nil {
		return
	}
	if r.restore != "" {
		if _, err := r.conn.ExecContext(context.Background(), r.restore); err != nil {
			r.drop()
			return
		}
	}
	_ = r.conn.Close()
	r.conn = nil
}

// renewRetry is how soon a renewal that failed (not one refused) is tried
// again: soon, since the lease is lost a tenth of the TTL before the row
// expires, and a third of the TTL is all the time between two renewals.
func (l *Locker) renewRetry() time.Duration { return max(l.ttl/30, 10*time.Millisecond) }

// keepAlive renews the row every third of the TTL, and soon again after a
// renewal that failed. validUntil is when the holder stops trusting its
// lease if no renewal gets through; the row expires a safety margin later
// on the server.
func (p *sqlLease) keepAlive(r *renewer, validUntil time.Time) {
	defer p.markLost()
	defer r.close()
	l := p.l
	next := time.NewTimer(l.ttl / 3)
	defer next.Stop()
	expiry := time.NewTimer(time.Until(validUntil))
	defer expiry.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-expiry.C:
			return
		case <-next.C:
		}
		if closed(l.kv.db) {
			return // the process is shutting down, as if it had died
		}
		// A renewal may not outlast the lease it renews.
		ctx, cancel := context.WithDeadline(context.Background(), validUntil)
		ok, sent, err := r.renew(ctx)
		cancel()
		switch {
		case err == nil && ok:
			validUntil = sent.Add(l.ttl - l.safetyMargin())
			expiry.Reset(time.Until(validUntil))
			next.Reset(l.ttl / 3)
		case err == nil:
			return // expired, or taken over
		default:
			next.Reset(l.renewRetry())
		}
	}
}
