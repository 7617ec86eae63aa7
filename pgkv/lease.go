package pgkv

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention"
)

// DefaultCheckInterval is how often a held lease checks its connection.
const DefaultCheckInterval = time.Second

// LockerOptions tune a Locker. A nil *LockerOptions means the defaults.
type LockerOptions struct {
	// CheckInterval is how often the holder pings the connection that holds
	// the lock; a ping that fails, or takes longer than twice the interval
	// (at least a second), marks the lease lost. Zero means
	// DefaultCheckInterval.
	CheckInterval time.Duration
}

// Locker is a retention.Locker built on a session-level advisory lock. The
// holder keeps the lock on a connection of its own, taken out of the pool,
// so the lock dies with that connection: when the holder's process dies or
// its connection breaks, PostgreSQL frees the lock as soon as it notices the
// session is gone. Create one with NewLocker.
type Locker struct {
	pool  *pgxpool.Pool
	name  string
	key   int64
	check time.Duration
}

var _ retention.Locker = (*Locker)(nil)

// NewLocker returns a Locker for the lease called name; replicas that use
// the same name share one lease. The advisory lock key is derived from name.
func NewLocker(pool *pgxpool.Pool, name string, opts *LockerOptions) (*Locker, error) {
	if pool == nil {
		return nil, errors.New("pgkv: pool must not be nil")
	}
	if name == "" {
		return nil, errors.New("pgkv: lease name must not be empty")
	}
	l := &Locker{pool: pool, name: name, key: LockKey(name), check: DefaultCheckInterval}
	if opts != nil && opts.CheckInterval != 0 {
		if opts.CheckInterval < 0 {
			return nil, fmt.Errorf("pgkv: LockerOptions.CheckInterval must not be negative, got %v", opts.CheckInterval)
		}
		l.check = opts.CheckInterval
	}
	return l, nil
}

// LockKey returns the advisory lock key of the lease called name, for
// looking it up in pg_locks (objid holds its low 32 bits, classid its high).
func LockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("retention/pgkv lease " + name))
	return int64(h.Sum64())
}

// TryAcquire implements retention.Locker with pg_try_advisory_lock.
func (l *Locker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return nil, wrap(ctx, "acquire lease "+l.name, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", l.key).Scan(&ok); err != nil {
		conn.Release()
		return nil, wrap(ctx, "acquire lease "+l.name, err)
	}
	if !ok {
		conn.Release()
		return nil, fmt.Errorf("pgkv: lease %q: %w", l.name, retention.ErrLeaseHeld)
	}
	// The connection now carries the lock: it leaves the pool for good, so
	// that no other query can ever run on it and it is closed, not reused,
	// when the lease ends.
	lease := &pgLease{conn: conn.Hijack(), key: l.key, lost: make(chan struct{}), stop: make(chan struct{})}
	lease.wg.Go(func() { lease.watch(l.check) })
	return lease, nil
}

type pgLease struct {
	mu   sync.Mutex // serialises use of conn
	conn *pgx.Conn
	key  int64

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func (p *pgLease) Lost() <-chan struct{} { return p.lost }

func (p *pgLease) markLost() { p.lostOnce.Do(func() { close(p.lost) }) }

// watch pings the lock's connection until the lease ends; the lock lives
// exactly as long as the session, so a failed ping means it may be gone.
func (p *pgLease) watch(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), pingTimeout(every))
		p.mu.Lock()
		err := p.conn.Ping(ctx)
		p.mu.Unlock()
		cancel()
		if err != nil {
			p.markLost()
			return
		}
	}
}

// pingTimeout is how long a check may take before the lease counts as lost:
// long enough that a busy server does not cost the lease, short enough that
// a holder cut off from the server stops soon. pgx closes a connection whose
// query is cancelled, which frees the lock on the server as well.
func pingTimeout(every time.Duration) time.Duration {
	return max(2*every, time.Second)
}

// Release unlocks and closes the lock's connection. Closing alone would free
// the lock too; the explicit unlock frees it at once even where the close
// is slow to reach the server.
func (p *pgLease) Release(ctx context.Context) error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.markLost()
	if p.conn.IsClosed() {
		return nil
	}
	var err error
	select {
	case <-p.lost:
		// The session is suspect; closing it is the release.
	default:
		if _, uerr := p.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", p.key); uerr != nil {
			err = wrap(ctx, "release lease", uerr)
		}
	}
	if cerr := p.conn.Close(ctx); cerr != nil && err == nil {
		err = wrap(ctx, "release lease", cerr)
	}
	return err
}
