package etcdkv_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
)

// TestCustomIDRule: under a sweep whose ValidateID accepts "order.42", the
// marker is written in the caller's Txn with MarkKeyOp (by the example's
// finishOrder), and a Pass clears the order and deletes the marker.
func TestCustomIDRule(t *testing.T) {
	cli := connect(t)
	ctx := context.Background()
	kv, err := etcdkv.New(cli, freshNamespace(t, cli), nil)
	require.NoError(t, err)
	// finishOrder writes myservice/orders/<id>, which only this test uses.
	const state = "myservice/orders/order.42"
	_, err = cli.Delete(ctx, "myservice/orders/", clientv3.WithPrefix())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := cli.Delete(context.Background(), "myservice/orders/", clientv3.WithPrefix())
		assert.NoError(t, err)
	})
	exists := func(key string) bool {
		resp, err := cli.Get(ctx, key)
		require.NoError(t, err)
		return len(resp.Kvs) > 0
	}
	markers := func() [][]byte {
		keys, err := kv.Scan(ctx, []byte("orders/done/"), []byte("orders/done0"), 10)
		require.NoError(t, err)
		return keys
	}

	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	var cleared []string
	sweep, err := retention.New(kv, retention.Config{
		Prefix: "orders/done/", Retention: time.Hour, Clock: clock, ValidateID: orderNumber,
		Clear: func(ctx context.Context, id string) error {
			cleared = append(cleared, id)
			_, err := cli.Delete(ctx, "myservice/orders/"+id)
			return err
		},
	})
	require.NoError(t, err)

	// The default rule's MarkOp refuses the id; so does the sweep's rule
	// an id it does not accept; an empty key, or one
	// that is not a marker at all (foreign for ever), is refused.
	_, err = kv.MarkOp("orders/done/", "order.42", clock.Now())
	require.ErrorIs(t, err, retention.ErrInvalidID)
	require.ErrorIs(t, finishOrder(ctx, cli, kv, sweep, "order-42", clock.Now()), retention.ErrInvalidID)
	for _, bad := range []string{"", "orders/done/order.42", "orders/done/00000001764000000000/"} {
		_, err = kv.MarkKeyOp([]byte(bad))
		require.ErrorIs(t, err, retention.ErrMalformedMarker, "MarkKeyOp(%q)", bad)
	}
	// A Txn whose condition fails writes neither state nor marker.
	key, err := sweep.MarkerKey(clock.Now(), "order.7")
	require.NoError(t, err)
	op, err := kv.MarkKeyOp(key)
	require.NoError(t, err)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(state), ">", 0)).
		Then(clientv3.OpPut("myservice/orders/order.7", "shipped"), op).Commit()
	require.NoError(t, err)
	require.False(t, resp.Succeeded)
	require.Empty(t, markers(), "markers after refused and failed writes")

	require.NoError(t, finishOrder(ctx, cli, kv, sweep, "order.42", clock.Now()))
	want, err := sweep.MarkerKey(clock.Now(), "order.42")
	require.NoError(t, err)
	require.Equal(t, [][]byte{want}, markers())
	require.True(t, exists(state), "the order's state, committed with its marker")

	st, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Cleared, "Pass() before the retention ran out cleared %d", st.Cleared)

	clock.Advance(time.Hour + time.Millisecond)
	st, err = sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
	assert.Zero(t, st.Malformed, "the sweep took its own marker for malformed")
	assert.Equal(t, []string{"order.42"}, cleared)
	assert.False(t, exists(state), "the order's state after the Pass")
	assert.Empty(t, markers(), "the marker is still there after the Pass")
}
