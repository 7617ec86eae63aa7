package boltkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
)

// TestCustomIDRule: under a sweep whose ValidateID accepts "order.42", the
// marker is written in the caller's transaction with MarkKeyTx, and a Pass
// clears the order and deletes the marker.
func TestCustomIDRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	var cleared []string
	sweep, err := retention.New(kv, retention.Config{
		Prefix: "orders/done/", Retention: time.Hour, Clock: clock, ValidateID: orderNumber,
		Clear: func(ctx context.Context, id string) error {
			cleared = append(cleared, id)
			return db.Update(func(tx *bbolt.Tx) error { return tx.Bucket([]byte("orders")).Delete([]byte(id)) })
		},
	})
	require.NoError(t, err)

	// The default rule's MarkTx refuses the id and writes nothing.
	err = db.Update(func(tx *bbolt.Tx) error { return kv.MarkTx(tx, "orders/done/", "order.42", clock.Now()) })
	require.ErrorIs(t, err, retention.ErrInvalidID)
	// The sweep's rule refuses what it does not accept.
	require.ErrorIs(t, finishOrder(db, kv, sweep, "order-42", clock.Now()), retention.ErrInvalidID)
	// An empty key is refused, and so is a key that is not a marker, which
	// the sweep would leave as a foreign key for ever.
	for _, bad := range []string{"", "orders/done/order.42", "orders/done/00000001764000000000/"} {
		err = db.Update(func(tx *bbolt.Tx) error { return kv.MarkKeyTx(tx, []byte(bad)) })
		require.ErrorIs(t, err, retention.ErrMalformedMarker, "MarkKeyTx(%q)", bad)
	}
	// A transaction that fails after MarkKeyTx leaves no marker.
	key, err := sweep.MarkerKey(clock.Now(), "order.7")
	require.NoError(t, err)
	errAbort := errors.New("abort")
	err = db.Update(func(tx *bbolt.Tx) error {
		require.NoError(t, kv.MarkKeyTx(tx, key))
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	keys, err := kv.Scan(ctx, []byte("orders/done/"), []byte("orders/done0"), 10)
	require.NoError(t, err)
	require.Empty(t, keys, "markers after refused and aborted writes")

	require.NoError(t, finishOrder(db, kv, sweep, "order.42", clock.Now()))
	keys, err = kv.Scan(ctx, []byte("orders/done/"), []byte("orders/done0"), 10)
	require.NoError(t, err)
	want, err := sweep.MarkerKey(clock.Now(), "order.42")
	require.NoError(t, err)
	require.Equal(t, [][]byte{want}, keys)
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		assert.Equal(t, []byte("shipped"), tx.Bucket([]byte("orders")).Get([]byte("order.42")), "the order's state, committed with its marker")
		return nil
	}))

	st, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Cleared, "Pass() before the retention ran out cleared %d", st.Cleared)

	clock.Advance(time.Hour + time.Millisecond)
	st, err = sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
	assert.Zero(t, st.Malformed, "the sweep took its own marker for malformed")
	assert.Equal(t, []string{"order.42"}, cleared)
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		assert.Nil(t, tx.Bucket([]byte("orders")).Get([]byte("order.42")), "the order's state after the Pass")
		return nil
	}))
	keys, err = kv.Scan(ctx, []byte("orders/done/"), []byte("orders/done0"), 10)
	require.NoError(t, err)
	assert.Empty(t, keys, "the marker is still there after the Pass")
}
