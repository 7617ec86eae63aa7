package etcdkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
	"github.com/marksweep/retention/kvtest"
)

// TestCustomIDRule runs kvtest.CustomIDRule with the example's
// finishOrder, which puts the marker in its Txn with MarkKeyOp.
func TestCustomIDRule(t *testing.T) {
	cli := connect(t)
	ctx := context.Background()
	kv, err := etcdkv.New(cli, freshNamespace(t, cli), nil)
	require.NoError(t, err)
	// finishOrder writes myservice/orders/<id>, which only this test uses.
	const orders = "myservice/orders/"
	_, err = cli.Delete(ctx, orders, clientv3.WithPrefix())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := cli.Delete(context.Background(), orders, clientv3.WithPrefix())
		assert.NoError(t, err)
	})
	kvtest.CustomIDRule(t, kvtest.IDRuleHarness{
		KV: kv,
		MarkDefault: func(ctx context.Context, prefix, id string, at time.Time) error {
			op, err := kv.MarkOp(prefix, id, at)
			if err != nil {
				return err
			}
			_, err = cli.Txn(ctx).Then(op).Commit()
			return err
		},
		Finish: func(ctx context.Context, sweep *retention.Sweep, id string, at time.Time) error {
			return finishOrder(ctx, cli, kv, sweep, id, at)
		},
		Abandon: func(ctx context.Context, id string, key []byte) error {
			op, err := kv.MarkKeyOp(key)
			if err != nil {
				return err
			}
			never := clientv3.Compare(clientv3.Version(orders+id), "<", 0)
			resp, err := cli.Txn(ctx).If(never).Then(clientv3.OpPut(orders+id, "shipped"), op).Commit()
			if err == nil && resp.Succeeded {
				err = errors.New("a Txn whose condition never holds succeeded")
			}
			return err
		},
		Shipped: func(ctx context.Context, id string) (bool, error) {
			resp, err := cli.Get(ctx, orders+id)
			if err != nil {
				return false, err
			}
			return len(resp.Kvs) > 0 && string(resp.Kvs[0].Value) == "shipped", nil
		},
		Clear: func(ctx context.Context, id string) error {
			_, err := cli.Delete(ctx, orders+id)
			return err
		},
	})
}
