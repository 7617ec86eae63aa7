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

// DefaultLeaseTTL is the TTL of a Locker's lease when LockerOptions.TTL is
// zero: a holder that dies, freezes or is cut off blocks sweeping for at
// most this long.
const DefaultLeaseTTL = 10 * time.Second

// MinLeaseTTL is the shortest TTL a Locker accepts: etcd leases have a
// granularity of one second.
const MinLeaseTTL = time.Second

// LockerOptions tune a Locker. A nil *LockerOptions means the defaults.
type LockerOptions struct {
	// TTL is the TTL of the etcd lease behind the lock: how long it
	// outlives a holder whose keep-alives stop. It is rounded up to whole
	// seconds, etcd's granularity, and must be at least MinLeaseTTL; etcd
	// may raise very short TTLs to its own minimum (1.5 times its election
	// timeout). Zero means DefaultLeaseTTL.
	TTL time.Duration
}

// Locker is a retention.Locker built on etcd's concurrency package: each
// attempt grants an etcd lease, keeps it alive in a session, and takes a
// concurrency.Mutex on it. When the holder dies its keep-alives stop and
// etcd drops the lease, and with it the mutex, after the TTL. Create one
// with NewLocker.
//
// Its leases are retention.Fencers for a *KV on the same cluster: a fenced
// Delete or Put is a Txn whose If is the mutex's ownership check (its key
// still exists with the revision that created it), so that etcd applies it
// only while the lock is held, in the same revision that checks it.
type Locker struct {
	cli  *clientv3.Client
	name string
	ttl  int // seconds
}

var _ retention.Locker = (*Locker)(nil)

// NewLocker returns a Locker for the mutex under the key prefix name (for
// example "myservice/retention/lease").
func NewLocker(cli *clientv3.Client, name string, opts *LockerOptions) (*Locker, error) {
	ttl := DefaultLeaseTTL
	if opts != nil && opts.TTL != 0 {
		ttl = opts.TTL
	}
	switch {
	case cli == nil:
		return nil, errors.New("etcdkv: client must not be nil")
	case name == "":
		return nil, errors.New("etcdkv: lease name must not be empty")
	case ttl < MinLeaseTTL:
		return nil, fmt.Errorf("etcdkv: LockerOptions.TTL must be at least %v, got %v", MinLeaseTTL, ttl)
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
	e := &etcdLease{sess: sess, name: l.name, owner: m.IsOwner(), lost: make(chan struct{}), stop: make(chan struct{})}
	e.wg.Go(e.watch)
	return e, nil
}

type etcdLease struct {
	sess *concurrency.Session
	name string
	// owner is true while the mutex key exists with the revision that
	// created it: TryLock deletes a key that did not get the lock, and keys
	// created later have higher revisions, so the key's existence means
	// the lock is held.
	owner clientv3.Cmp

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	err      error
}

var _ retention.Fencer = (*etcdLease)(nil)

// Lost closes when the session ends (keep-alives stopped getting through
// for the TTL, or the lease was revoked or expired), when a fenced write
// is refused, and on Release.
func (e *etcdLease) Lost() <-chan struct{} { return e.lost }

func (e *etcdLease) markLost() { e.lostOnce.Do(func() { close(e.lost) }) }

func (e *etcdLease) isLost() bool {
	select {
	case <-e.lost:
		return true
	default:
		return false
	}
}

func (e *etcdLease) watch() {
	select {
	case <-e.sess.Done():
		e.markLost()
	case <-e.stop:
	}
}

// Release revokes the etcd lease, which deletes the mutex key at once.
func (e *etcdLease) Release(context.Context) error {
	e.once.Do(func() {
		close(e.stop)
		e.wg.Wait()
		select {
		case <-e.sess.Done():
			e.sess.Orphan() // already gone: nothing to revoke
		default:
			if err := e.sess.Close(); err != nil {
				e.err = fmt.Errorf("etcdkv: release lease: %w", err)
			}
		}
		e.markLost()
	})
	return e.err
}

// Fence implements retention.Fencer for a *KV: its writes are transactions
// conditioned on the lock, sent through the KV's own client with its
// namespace. The lock key is compared as the Locker's client names it, so
// the KV's client must not add a namespace of its own (clientv3/namespace):
// the check would then never find the key and refuse every write.
func (e *etcdLease) Fence(kv retention.KV) (retention.KV, bool) {
	k, ok := kv.(*KV)
	if !ok {
		return nil, false
	}
	return &fencedKV{kv: k, lease: e}, true
}

// fencedKV is a KV whose writes take effect only while its lease holds.
type fencedKV struct {
	kv    *KV
	lease *etcdLease
}

var (
	_ retention.KV     = (*fencedKV)(nil)
	_ retention.Putter = (*fencedKV)(nil)
	_ retention.Mover  = (*fencedKV)(nil)
)

func (f *fencedKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return f.kv.Scan(ctx, start, end, limit)
}

// Delete sends the keys in transactions of at most MaxTxnOps deletes, each
// conditioned on the lock (etcd counts compares apart from the operations
// of a branch). A refusal can leave earlier transactions applied; they were
// applied while the lock was held.
func (f *fencedKV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.kv.deleteIf(ctx, f, keys)
}

func (f *fencedKV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.commit(ctx, "put", []clientv3.Op{clientv3.OpPut(f.kv.ns+string(key), string(value))})
}

// Move is KV.Move with every transaction conditioned on the lock: the If
// of the transaction holds the lock's check and the Then its pairs, each a
// nested transaction whose If checks that its from key exists, so that
// both are checked in the revision that moves the key.
func (f *fencedKV) Move(ctx context.Context, from, to [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(from) != len(to) {
		return fmt.Errorf("etcdkv: Move of %d keys to %d keys", len(from), len(to))
	}
	return f.kv.moveIf(ctx, f, from, to)
}

func (f *fencedKV) commit(ctx context.Context, op string, ops []clientv3.Op) error {
	if f.lease.isLost() {
		return f.refused(op)
	}
	resp, err := f.kv.kv.Txn(ctx).If(f.lease.owner).Then(ops...).Commit()
	if err != nil {
		return wrap(ctx, "fenced "+op, err)
	}
	if !resp.Succeeded {
		f.lease.markLost()
		return f.refused(op)
	}
	return nil
}

func (f *fencedKV) refused(op string) error {
	return fmt.Errorf("etcdkv: %s refused: lock %q is no longer held: %w", op, f.lease.name, retention.ErrLeaseLost)
}
