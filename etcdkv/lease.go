package etcdkv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/marksweep/retention"
)

// Locker is a retention.Locker built on etcd's concurrency package: each
// attempt grants an etcd lease, keeps it alive in a session, and takes a
// concurrency.Mutex on it. When the holder dies its keep-alives stop and
// etcd drops the lease, and with it the mutex, after the TTL. Create one
// with NewLocker.
type Locker struct {
	cli  *clientv3.Client
	name string
	ttl  int // seconds
}

var _ retention.Locker = (*Locker)(nil)

// NewLocker returns a Locker for the mutex under the key prefix name (for
// example "myservice/retention/lease"). ttl is rounded up to whole seconds,
// etcd's lease granularity, and must be at least a second; etcd may raise
// very short TTLs to its own minimum.
func NewLocker(cli *clientv3.Client, name string, ttl time.Duration) (*Locker, error) {
	switch {
	case cli == nil:
		return nil, errors.New("etcdkv: client must not be nil")
	case name == "":
		return nil, errors.New("etcdkv: lease name must not be empty")
	case ttl < time.Second:
		return nil, fmt.Errorf("etcdkv: lease TTL must be at least 1s, got %v", ttl)
	}
	return &Locker{cli: cli, name: name, ttl: int((ttl + time.Second - 1) / time.Second)}, nil
}

// TryAcquire implements retention.Locker.
func (l *Locker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	grant, err := l.cli.Grant(ctx, int64(l.ttl))
	if err != nil {
		return nil, wrap(ctx, "grant lease", err)
	}
	// The session keeps the lease alive under the client's own context, not
	// ctx: the lease must outlive this call.
	sess, err := concurrency.NewSession(l.cli, concurrency.WithLease(grant.ID), concurrency.WithTTL(l.ttl))
	if err != nil {
		_, _ = l.cli.Revoke(context.WithoutCancel(ctx), grant.ID)
		return nil, wrap(ctx, "start lease session", err)
	}
	m := concurrency.NewMutex(sess, l.name)
	if err := m.TryLock(ctx); err != nil {
		_ = sess.Close()
		if errors.Is(err, concurrency.ErrLocked) {
			return nil, fmt.Errorf("etcdkv: lease %q: %w", l.name, retention.ErrLeaseHeld)
		}
		return nil, wrap(ctx, "lock "+l.name, err)
	}
	return &etcdLease{sess: sess}, nil
}

type etcdLease struct {
	sess *concurrency.Session
	once sync.Once
	err  error
}

// Lost is the session's Done channel: it closes when keep-alives stop
// getting through for the TTL, when the lease is revoked or expires, and on
// Release.
func (e *etcdLease) Lost() <-chan struct{} { return e.sess.Done() }

// Release revokes the etcd lease, which deletes the mutex key at once.
func (e *etcdLease) Release(context.Context) error {
	e.once.Do(func() {
		select {
		case <-e.sess.Done():
			e.sess.Orphan() // already gone: nothing to revoke
		default:
			if err := e.sess.Close(); err != nil {
				e.err = fmt.Errorf("etcdkv: release lease: %w", err)
			}
		}
	})
	return e.err
}
