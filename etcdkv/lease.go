package etcdkv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

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
	// timeout), and the Locker then goes by the TTL etcd granted. Zero
	// means DefaultLeaseTTL.
	//
	// The holder renews the lease every third of the TTL, and considers it
	// lost (closes Lost) a tenth of the TTL before etcd could expire it:
	// the TTL after it sent the last renewal etcd answered (or the Grant),
	// less the margin. etcd restarts a lease's TTL when it receives a
	// renewal, after it was sent, so the holder gives up first. With the
	// default 10s, a holder cut off from etcd considers the lease lost 9s
	// after its last renewal went out; etcd keeps it for at least 10s
	// after, and only then can another replica take it.
	TTL time.Duration
}

// Locker is a retention.Locker on etcd: each attempt grants an etcd lease
// and takes a mutex under the key prefix name with it, with the keys and
// order of concurrency.Mutex (the key name/<lease ID in hex>, written with
// the lease; the holder is the key created first), so that it excludes
// holders of concurrency.Mutex on the same name too. The Locker keeps the
// lease alive itself rather than through a concurrency.Session, whose
// keep-alives report a loss only once etcd has expired the lease, so that
// its leases count down from the send time of each renewal and give up a
// margin before etcd can expire them (see LockerOptions.TTL). When the
// holder dies its renewals stop and etcd drops the lease, and with it the
// mutex key, after the TTL. Create one with NewLocker.
//
// Its leases are retention.Fencers for a *KV on the same cluster: a fenced
// Delete, Put or Move is a Txn whose If is the mutex's ownership check
// (its key still exists with the revision that created it), so that etcd
// applies it only while the lock is held, in the same revision that checks
// it. A *KV also applies a lease's fence that its context carries
// (retention.Fenced), so a KV wrapped by the caller is fenced too.
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
	sent := time.Now()
	grant, err := l.cli.Grant(ctx, int64(l.ttl))
	if err != nil {
		return nil, wrap(ctx, "grant lease", err)
	}
	e := &etcdLease{
		cli:  l.cli,
		id:   grant.ID,
		name: l.name,
		ttl:  time.Duration(grant.TTL) * time.Second,
		lost: make(chan struct{}),
	}
	if err := e.lock(ctx); err != nil {
		_, _ = l.cli.Revoke(context.WithoutCancel(ctx), grant.ID)
		return nil, err
	}
	// The renewals run under a context of their own, not ctx: the lease
	// must outlive this call.
	kctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.wg.Go(func() { e.keepAlive(kctx, sent) })
	return e, nil
}

// leaseMargin is how long before etcd could expire a lease its holder
// considers it lost.
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 10 }

type etcdLease struct {
	cli  *clientv3.Client
	id   clientv3.LeaseID
	name string
	ttl  time.Duration // as etcd granted it
	// owner is true while the mutex key exists with the revision that
	// created it: a key that did not get the lock is deleted at once, and
	// keys created later have higher revisions, so the key's existence
	// means the lock is held.
	owner clientv3.Cmp

	lost     chan struct{}
	lostOnce sync.Once
	cancel   context.CancelFunc
	// Written by keepAlive, read by Release once it has returned.
	expired   bool      // etcd said the lease is gone: nothing to revoke
	expiresAt time.Time // etcd keeps the lease until then at least
	wg        sync.WaitGroup
	once      sync.Once
	err       error
}

var _ retention.Fencer = (*etcdLease)(nil)

// lock takes the mutex with the lease, as concurrency.Mutex.TryLock does:
// write the key name/<lease> unless it exists, and hold the lock when the
// oldest key under name/ is this one. It returns an error matching
// retention.ErrLeaseHeld when another key is older.
func (e *etcdLease) lock(ctx context.Context) error {
	prefix := e.name + "/"
	key := fmt.Sprintf("%s%x", prefix, int64(e.id))
	oldest := clientv3.OpGet(prefix, clientv3.WithFirstCreate()...)
	resp, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "", clientv3.WithLease(e.id)), oldest).
		Else(clientv3.OpGet(key), oldest).
		Commit()
	if err != nil {
		return wrap(ctx, "lock "+e.name, err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded { // a fresh lease's key cannot exist; but if it does, it is ours
		rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	if first := resp.Responses[1].GetResponseRange().Kvs; len(first) > 0 && first[0].CreateRevision != rev {
		return fmt.Errorf("etcdkv: lease %q: %w", e.name, retention.ErrLeaseHeld)
	}
	e.owner = clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	return nil
}

// Lost closes a tenth of the TTL before etcd could expire the lease
// (renewals stopped getting through), when etcd says the lease is gone
// (revoked or expired), when the client is closed, when a fenced write is
// refused, and on Release.
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

// keepAlive renews the lease every third of its TTL until ctx is done or
// the lease is lost. The lease counts as held until lostAt: the send time
// of the last renewal etcd answered (at first, of the Grant) plus the TTL,
// less the margin. It is measured from the send time because etcd renews
// the lease when the request arrives, which is later; the client's own
// keep-alive deadline counts from the answer, which may be after etcd
// expired the lease.
func (e *etcdLease) keepAlive(ctx context.Context, sent time.Time) {
	defer e.markLost()
	e.expiresAt = sent.Add(e.ttl)
	lostAt := e.expiresAt.Add(-leaseMargin(e.ttl))
	deadline := time.NewTimer(time.Until(lostAt))
	defer deadline.Stop()
	next := time.NewTimer(e.ttl / 3)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-next.C:
		}
		sent := time.Now()
		// KeepAliveOnce retries until its context ends: past lostAt, a
		// renewal would come too late anyway.
		rctx, cancel := context.WithDeadline(ctx, lostAt)
		resp, err := e.cli.KeepAliveOnce(rctx, e.id)
		cancel()
		switch {
		case err == nil:
			ttl := time.Duration(resp.TTL) * time.Second
			e.expiresAt = sent.Add(ttl)
			lostAt = e.expiresAt.Add(-leaseMargin(ttl))
			deadline.Reset(time.Until(lostAt))
			next.Reset(ttl / 3)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			e.expired = true
			return
		case e.cli.Ctx().Err() != nil:
			return // the client was closed
		default:
			next.Reset(e.ttl / 20) // try again while lostAt lasts
		}
	}
}

// Release revokes the etcd lease, which deletes the mutex key at once. It
// revokes a lease its holder considers lost too: etcd may keep it until
// the margin has passed. The revoke goes out even when ctx is done, since
// it frees the lease for the other replicas sooner, and gives up when
// etcd must have dropped the lease anyway, a TTL at most after the last
// renewal: a holder cut off from etcd does not wait for it longer.
func (e *etcdLease) Release(ctx context.Context) error {
	e.once.Do(func() {
		e.cancel()
		e.wg.Wait()
		e.markLost()
		if e.expired || e.cli.Ctx().Err() != nil || !time.Now().Before(e.expiresAt) {
			return // nothing to revoke, or no client to revoke it with
		}
		rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), e.expiresAt)
		defer cancel()
		if _, err := e.cli.Revoke(rctx, e.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			e.err = fmt.Errorf("etcdkv: release lease: %w", err)
		}
	})
	return e.err
}

// Fence implements retention.Fencer for a *KV: its writes (Delete, Put and
// Move) are transactions conditioned on the lock, sent through the KV's own
// client with its namespace. The *KV's own write methods apply the same
// view when their context carries this lease's fence (retention.Fenced). The lock key is compared as the Locker's client names it, so
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
