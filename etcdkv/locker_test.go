package etcdkv_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
)

// TestLostBeforeExpiry cuts the holder off from etcd (its client goes
// through a proxy that turns into a black hole) and requires that its
// Lost closes while etcd still holds the lease, as read at that moment by
// another client: the holder gives up before the lease can pass on.
//
// etcd reports a lease's remaining TTL in whole seconds, rounded down, so
// the TTL is long enough that the margin (a tenth) is more than a second
// and a lease that is still held reads as at least 1.
func TestLostBeforeExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("waits most of a 15s lease TTL")
	}
	const ttl = 15 * time.Second
	admin := connect(t)
	ns := freshNamespace(t, admin)
	proxy := leasetest.NewProxy(t, kvtest.ServerAddr(t, "RETENTION_ETCD_ENDPOINTS"))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.Addr()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer func() { assert.NoError(t, cli.Close()) }()
	locker, err := etcdkv.NewLocker(cli, ns+"lease", &etcdkv.LockerOptions{TTL: ttl})
	require.NoError(t, err)
	ctx := context.Background()
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()

	holder, err := admin.Get(ctx, ns+"lease/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, holder.Kvs, 1)
	id := clientv3.LeaseID(holder.Kvs[0].Lease)

	proxy.Blackhole()
	cut := time.Now()
	select {
	case <-lease.Lost():
	case <-time.After(2 * ttl):
		t.Fatalf("Lost still open %v after the holder was cut off", 2*ttl)
	}
	lostAfter := time.Since(cut)
	left, err := admin.TimeToLive(ctx, id)
	require.NoError(t, err)
	t.Logf("Lost closed %v after the holder was cut off; etcd then gave the lease %ds more", lostAfter.Round(time.Millisecond), left.TTL)
	require.GreaterOrEqual(t, left.TTL, int64(1), "etcd no longer held the lease when Lost closed")
	resp, err := admin.Get(ctx, ns+"lease/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.Count, "the holder's lock key is gone already")
}

// TestExcludesConcurrencyMutex: a Locker and a concurrency.Mutex on the
// same name exclude each other, either way round, as holders of an older
// version of this package (which took a concurrency.Mutex) and of this one
// must during a rolling upgrade.
func TestExcludesConcurrencyMutex(t *testing.T) {
	cli := connect(t)
	ns := freshNamespace(t, cli)
	ctx := context.Background()
	name := ns + "lease"
	locker, err := etcdkv.NewLocker(cli, name, &etcdkv.LockerOptions{TTL: leaseTTL})
	require.NoError(t, err)

	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(leaseTTL/time.Second)))
	require.NoError(t, err)
	defer func() { assert.NoError(t, sess.Close()) }()
	mu := concurrency.NewMutex(sess, name)
	require.NoError(t, mu.TryLock(ctx))
	_, err = locker.TryAcquire(ctx)
	require.ErrorIs(t, err, retention.ErrLeaseHeld, "TryAcquire while a concurrency.Mutex holds the name")
	require.NoError(t, mu.Unlock(ctx))

	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, concurrency.NewMutex(sess, name).TryLock(ctx), concurrency.ErrLocked,
		"concurrency.Mutex.TryLock while a Locker holds the name")
	require.NoError(t, lease.Release(ctx))
	require.NoError(t, concurrency.NewMutex(sess, name).TryLock(ctx), "TryLock after Release")
}
