package pgkv_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// TestCustomIDRule: under a sweep whose ValidateID accepts "order.42", the
// marker is written in the caller's transaction with MarkKeyTx (by the
// example's finishOrder), and a Pass clears the order and deletes the
// marker.
func TestCustomIDRule(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	kv, err := pgkv.New(pool, freshTable(t, pool))
	require.NoError(t, err)
	// finishOrder writes to the table orders, which only this test uses.
	_, err = pool.Exec(ctx, "DROP TABLE IF EXISTS orders; CREATE TABLE orders (id text PRIMARY KEY, state text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS orders")
		assert.NoError(t, err)
	})
	_, err = pool.Exec(ctx, "INSERT INTO orders VALUES ('order.42', 'open'), ('order.7', 'open')")
	require.NoError(t, err)
	state := func(id string) string {
		var s string
		if err := pool.QueryRow(ctx, "SELECT state FROM orders WHERE id = $1", id).Scan(&s); err != nil {
			return "gone"
		}
		return s
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
			_, err := pool.Exec(ctx, "DELETE FROM orders WHERE id = $1", id)
			return err
		},
	})
	require.NoError(t, err)

	// The default rule's MarkTx refuses the id; so does the sweep's rule
	// an id it does not accept; an empty key, or one
	// that is not a marker at all (foreign for ever), is refused.
	require.ErrorIs(t, kv.MarkTx(ctx, pool, "orders/done/", "order.42", clock.Now()), retention.ErrInvalidID)
	require.ErrorIs(t, finishOrder(ctx, pool, kv, sweep, "order-42", clock.Now()), retention.ErrInvalidID)
	for _, bad := range []string{"", "orders/done/order.42", "orders/done/00000001764000000000/"} {
		require.ErrorIs(t, kv.MarkKeyTx(ctx, pool, []byte(bad)), retention.ErrMalformedMarker, "MarkKeyTx(%q)", bad)
	}
	// A rolled-back transaction leaves neither state nor marker.
	key, err := sweep.MarkerKey(clock.Now(), "order.7")
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "UPDATE orders SET state = 'shipped' WHERE id = 'order.7'")
	require.NoError(t, err)
	require.NoError(t, kv.MarkKeyTx(ctx, tx, key))
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, markers(), "markers after refused and rolled-back writes")
	require.Equal(t, "open", state("order.7"))

	require.NoError(t, finishOrder(ctx, pool, kv, sweep, "order.42", clock.Now()))
	want, err := sweep.MarkerKey(clock.Now(), "order.42")
	require.NoError(t, err)
	require.Equal(t, [][]byte{want}, markers())
	require.Equal(t, "shipped", state("order.42"), "the order's state, committed with its marker")

	st, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Cleared, "Pass() before the retention ran out cleared %d", st.Cleared)

	clock.Advance(time.Hour + time.Millisecond)
	st, err = sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
	assert.Zero(t, st.Malformed, "the sweep took its own marker for malformed")
	assert.Equal(t, []string{"order.42"}, cleared)
	assert.Equal(t, "gone", state("order.42"))
	assert.Equal(t, "open", state("order.7"))
	assert.Empty(t, markers(), "the marker is still there after the Pass")
}
