package rediskv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/rediskv"
)

// TestCustomIDRule: under a sweep whose ValidateID accepts "order.42", the
// marker is queued in the caller's MULTI with MarkKeyTx (by the example's
// finishOrder), and a Pass clears the order and deletes the marker.
func TestCustomIDRule(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	kv, err := rediskv.New(rdb, freshKey(t, rdb))
	require.NoError(t, err)
	// finishOrder writes {orders}:state:<id>, which only this test uses.
	states := []string{"{orders}:state:order.42", "{orders}:state:order.7"}
	require.NoError(t, rdb.Del(ctx, states...).Err())
	t.Cleanup(func() { assert.NoError(t, rdb.Del(context.Background(), states...).Err()) })
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
			return rdb.Del(ctx, "{orders}:state:"+id).Err()
		},
	})
	require.NoError(t, err)

	// The default rule's MarkTx refuses the id; so does the sweep's rule
	// an id it does not accept; an empty key, or one
	// that is not a marker at all (foreign for ever), is refused.
	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		return kv.MarkTx(ctx, pipe, "orders/done/", "order.42", clock.Now())
	})
	require.ErrorIs(t, err, retention.ErrInvalidID)
	require.ErrorIs(t, finishOrder(ctx, rdb, kv, sweep, "order-42", clock.Now()), retention.ErrInvalidID)
	for _, bad := range []string{"", "orders/done/order.42", "orders/done/00000001764000000000/"} {
		_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error { return kv.MarkKeyTx(ctx, pipe, []byte(bad)) })
		require.ErrorIs(t, err, retention.ErrMalformedMarker, "MarkKeyTx(%q)", bad)
	}
	// An abandoned MULTI writes neither state nor marker.
	key, err := sweep.MarkerKey(clock.Now(), "order.7")
	require.NoError(t, err)
	errAbort := errors.New("abort")
	_, err = rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, states[1], "shipped", 0)
		require.NoError(t, kv.MarkKeyTx(ctx, pipe, key))
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	require.Empty(t, markers(), "markers after refused and abandoned writes")
	require.Zero(t, rdb.Exists(ctx, states[1]).Val())

	require.NoError(t, finishOrder(ctx, rdb, kv, sweep, "order.42", clock.Now()))
	want, err := sweep.MarkerKey(clock.Now(), "order.42")
	require.NoError(t, err)
	require.Equal(t, [][]byte{want}, markers())
	require.Equal(t, "shipped", rdb.Get(ctx, states[0]).Val(), "the order's state, written with its marker")

	st, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Cleared, "Pass() before the retention ran out cleared %d", st.Cleared)

	clock.Advance(time.Hour + time.Millisecond)
	st, err = sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
	assert.Zero(t, st.Malformed, "the sweep took its own marker for malformed")
	assert.Equal(t, []string{"order.42"}, cleared)
	assert.Zero(t, rdb.Exists(ctx, states[0]).Val(), "the order's state after the Pass")
	assert.Empty(t, markers(), "the marker is still there after the Pass")
}
