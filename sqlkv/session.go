package sqlkv

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Options tune a KV. A nil *Options means the defaults.
type Options struct {
	// LockTimeout bounds how long each statement of the KV's writes
	// (Delete, Put, Move, and an AtomicKV's ClearAndDelete and ClearRun,
	// its ClearFunc included) waits for a lock that another transaction holds: a row
	// lock on MySQL and PostgreSQL, the write lock on SQLite. A call that
	// waits longer fails having changed nothing, and the sweep retries it
	// (a failed batch is bisected, the locked id put off). It is set for
	// the call's session only, on a connection of its own:
	// innodb_lock_wait_timeout on MySQL (whole seconds, at least 1s),
	// lock_timeout on PostgreSQL, the busy timeout on SQLite. Zero means
	// the session's own settings; 0 to 24 hours.
	LockTimeout time.Duration
}

// maxLockTimeout is the longest Options.LockTimeout: far above any useful
// value, and within every dialect's limit.
const maxLockTimeout = 24 * time.Hour

// check returns an error naming the field that is out of range.
func (o *Options) check() error {
	if o.LockTimeout < 0 || o.LockTimeout > maxLockTimeout {
		return fmt.Errorf("sqlkv: Options.LockTimeout must be between 0 and %v, got %v", maxLockTimeout, o.LockTimeout)
	}
	return nil
}

// dbConn is what a call's statements go through: the pool, or one
// connection of it.
type dbConn interface {
	execer
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// session returns what one call's statements go through: k.db itself
// when nothing needs setting and own is false, or else a connection of its own whose lock
// wait is bounded by Options.LockTimeout and, when idle is above zero (a
// fenced transaction on MySQL), whose wait_timeout is idle seconds, so
// that a holder whose host vanished mid-transaction keeps its locks for
// about that long, not until TCP gives up. done puts the connection's
// settings back and returns it to the pool, or drops it when that fails.
func (k *KV) session(ctx context.Context, idle int64, own bool) (c dbConn, done func(), err error) {
	set, restore := k.sessionSQL(idle)
	if len(set) == 0 && !own {
		return k.db, func() {}, nil
	}
	conn, err := k.db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	if len(set) == 0 {
		return conn, func() { _ = conn.Close() }, nil
	}
	drop := func() {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}
	if k.dialect == SQLite {
		// The busy timeout to put back is the connection's own, from its
		// DSN: read it first.
		var ms int64
		if err := queryRow(ctx, SQLite, conn, "PRAGMA busy_timeout", nil, &ms); err != nil {
			drop()
			return nil, nil, err
		}
		restore = []string{"PRAGMA busy_timeout = " + strconv.FormatInt(ms, 10)}
	}
	for _, q := range set {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			drop()
			return nil, nil, err
		}
	}
	return conn, func() {
		for _, q := range restore {
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), q); err != nil {
				drop()
				return
			}
		}
		_ = conn.Close()
	}, nil
}

// sessionSQL returns the statements that set up a call's session, and
// those that put it back (for SQLite, session reads the value to put
// back).
func (k *KV) sessionSQL(idle int64) (set, restore []string) {
	lt := k.lockTimeout
	switch k.dialect {
	case MySQL:
		var sets, restores []string
		if lt > 0 {
			s := int64((lt + time.Second - 1) / time.Second)
			sets = append(sets, "@sqlkv_lock_wait = @@SESSION.innodb_lock_wait_timeout", "SESSION innodb_lock_wait_timeout = "+strconv.FormatInt(s, 10))
			restores = append(restores, "SESSION innodb_lock_wait_timeout = @sqlkv_lock_wait")
		}
		if idle > 0 {
			sets = append(sets, "@sqlkv_wait = @@SESSION.wait_timeout", "SESSION wait_timeout = "+strconv.FormatInt(idle, 10))
			restores = append(restores, "SESSION wait_timeout = @sqlkv_wait")
		}
		if len(sets) == 0 {
			return nil, nil
		}
		return []string{"SET " + strings.Join(sets, ", ")}, []string{"SET " + strings.Join(restores, ", ")}
	case PostgreSQL:
		if lt > 0 {
			ms := int64((lt + time.Millisecond - 1) / time.Millisecond)
			return []string{"SET lock_timeout = " + strconv.FormatInt(ms, 10)}, []string{"RESET lock_timeout"}
		}
	case SQLite:
		if lt > 0 {
			ms := int64((lt + time.Millisecond - 1) / time.Millisecond)
			return []string{"PRAGMA busy_timeout = " + strconv.FormatInt(ms, 10)}, nil
		}
	}
	return nil, nil
}
