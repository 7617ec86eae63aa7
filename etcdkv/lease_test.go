package etcdkv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
)

const leaseTTL = 2 * time.Second

func newHarness(t testing.TB) leasetest.Harness {
	admin := connect(t)
	ns := freshNamespace(t, admin)
	lockName := ns + "lease"
	state := func(id string) string { return ns + "state/" + id }
	writer, err := etcdkv.New(admin, ns, nil)
	require.NoError(t, err)
	return leasetest.Harness{
		TTL: leaseTTL,
		NewReplica: func(t testing.TB) leasetest.Replica {
			addr := kvtest.ServerAddr(t, "RETENTION_ETCD_ENDPOINTS")
			cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(addr, ","), DialTimeout: 5 * time.Second})
			require.NoError(t, err)
			closed := false
			t.Cleanup(func() {
				if !closed {
					assert.NoError(t, cli.Close())
				}
			})
			kv, err := etcdkv.New(cli, ns, nil)
			require.NoError(t, err)
			locker, err := etcdkv.NewLocker(cli, lockName, &etcdkv.LockerOptions{TTL: leaseTTL})
			require.NoError(t, err)
			return leasetest.Replica{
				KV:     kv,
				Locker: locker,
				Clear: func(ctx context.Context, id string) error {
					_, err := cli.Delete(ctx, state(id))
					return err
				},
				// The process dies: keep-alives stop, nothing is revoked.
				Kill: func() {
					closed = true
					_ = cli.Close()
				},
			}
		},
		Finish: func(ctx context.Context, prefix string, ids []string, at time.Time) error {
			// Two operations per entity, within etcd's 128 per transaction.
			for len(ids) > 0 {
				n := min(len(ids), etcdkv.DefaultMaxTxnOps/2)
				ops := make([]clientv3.Op, 0, 2*n)
				for _, id := range ids[:n] {
					mark, err := writer.MarkOp(prefix, id, at)
					if err != nil {
						return err
					}
					ops = append(ops, clientv3.OpPut(state(id), "succeeded"), mark)
				}
				if _, err := admin.Txn(ctx).Then(ops...).Commit(); err != nil {
					return err
				}
				ids = ids[n:]
			}
			return nil
		},
		Present: func(ctx context.Context, ids []string) (map[string]bool, error) {
			resp, err := admin.Get(ctx, ns+"state/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				return nil, err
			}
			present := map[string]bool{}
			for _, kv := range resp.Kvs {
				present[strings.TrimPrefix(string(kv.Key), ns+"state/")] = true
			}
			return present, nil
		},
		// Revoke the holder's etcd lease from outside, as its expiry would.
		Expire: func(t testing.TB) { revokeHolder(t, admin, lockName) },
	}
}

// revokeHolder revokes the etcd lease of the holder of the lock lockName
// from outside, as its expiry would, without telling the holder.
func revokeHolder(t testing.TB, admin *clientv3.Client, lockName string) {
	t.Helper()
	ctx := context.Background()
	resp, err := admin.Get(ctx, lockName+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "nobody holds the lease")
	_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
}

func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet proofs take a while")
	}
	leasetest.Run(t, newHarness)
}

func TestNewLocker(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	require.NoError(t, err)
	defer cli.Close()
	tests := []struct {
		name    string
		cli     *clientv3.Client
		lease   string
		opts    *etcdkv.LockerOptions
		wantErr string
	}{
		{"defaults", cli, "svc/lease", nil, ""},
		{"ttl", cli, "svc/lease", &etcdkv.LockerOptions{TTL: 2 * time.Second}, ""},
		{"rounded up", cli, "svc/lease", &etcdkv.LockerOptions{TTL: 1500 * time.Millisecond}, ""},
		{"nil client", nil, "svc/lease", nil, "etcdkv: client must not be nil"},
		{"empty name", cli, "", nil, "etcdkv: lease name must not be empty"},
		{"short ttl", cli, "svc/lease", &etcdkv.LockerOptions{TTL: 500 * time.Millisecond}, "etcdkv: LockerOptions.TTL must be at least 1s, got 500ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := etcdkv.NewLocker(tt.cli, tt.lease, tt.opts)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, l)
				return
			}
			require.NoError(t, err)
		})
	}
}

// TestFencedDeleteBatches deletes more markers in one fenced call than one
// transaction may hold: the compare does not count against the deletes.
func TestFencedDeleteBatches(t *testing.T) {
	cli := connect(t)
	ns := freshNamespace(t, cli)
	ctx := context.Background()
	kv, err := etcdkv.New(cli, ns, nil)
	require.NoError(t, err)
	l, err := etcdkv.NewLocker(cli, ns+"lease", &etcdkv.LockerOptions{TTL: leaseTTL})
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	const n = 2*etcdkv.DefaultMaxTxnOps + 1
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "m/%04d", i)
		require.NoError(t, kv.Put(ctx, keys[i], nil))
	}
	fenced, ok := lease.(retention.Fencer).Fence(kv)
	require.True(t, ok)
	require.NoError(t, fenced.Delete(ctx, keys...))
	left, err := kv.Scan(ctx, []byte("m/"), []byte("m0"), n)
	require.NoError(t, err)
	assert.Empty(t, left)
}
