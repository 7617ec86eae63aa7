package etcdkv_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
)

// connectReplica connects a replica process of TestProcesses: store is the
// namespace; the lock lives under its "lease" key prefix.
func connectReplica(_ context.Context, addr, store string, ttl time.Duration) (retention.KV, retention.Locker, func(), error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, nil, nil, err
	}
	kv, err := etcdkv.New(cli, store, nil)
	if err != nil {
		cli.Close()
		return nil, nil, nil, err
	}
	locker, err := etcdkv.NewLocker(cli, store+"lease", &etcdkv.LockerOptions{TTL: ttl})
	if err != nil {
		cli.Close()
		return nil, nil, nil, err
	}
	return kv, locker, func() { _ = cli.Close() }, nil
}

func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	admin := connect(t)
	leasetest.RunProcesses(t, leasetest.Engine{
		Addr:    kvtest.ServerAddr(t, "RETENTION_ETCD_ENDPOINTS"),
		TTL:     2 * time.Second,
		Connect: connectReplica,
		Setup: func(t testing.TB, keys [][]byte) string {
			ns := freshNamespace(t, admin)
			for len(keys) > 0 {
				n := min(len(keys), etcdkv.DefaultMaxTxnOps)
				ops := make([]clientv3.Op, n)
				for i, k := range keys[:n] {
					ops[i] = clientv3.OpPut(ns+string(k), "")
				}
				_, err := admin.Txn(context.Background()).Then(ops...).Commit()
				require.NoError(t, err)
				keys = keys[n:]
			}
			return ns
		},
		TakeAway: func(t testing.TB, store string) { revokeHolder(t, admin, store+"lease") },
		Remaining: func(ctx context.Context, store string) (int, error) {
			resp, err := admin.Get(ctx, store+"proof/", clientv3.WithRange(store+"proof0"), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return int(resp.Count), nil
		},
	})
}
