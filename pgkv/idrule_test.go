package pgkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/pgkv"
)

// TestCustomIDRule runs kvtest.CustomIDRule with the example's
// finishOrder, which writes the marker with MarkKeyTx.
func TestCustomIDRule(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	kv, err := pgkv.New(pool, freshTable(t, pool))
	require.NoError(t, err)
	// finishOrder updates the table orders, which only this test uses.
	_, err = pool.Exec(ctx, `DROP TABLE IF EXISTS orders; CREATE TABLE orders (id text PRIMARY KEY, state text NOT NULL);
INSERT INTO orders VALUES ('order.42', 'open'), ('order.7', 'open')`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS orders")
		assert.NoError(t, err)
	})
	kvtest.CustomIDRule(t, kvtest.IDRuleHarness{
		KV: kv,
		MarkDefault: func(ctx context.Context, prefix, id string, at time.Time) error {
			return kv.MarkTx(ctx, pool, prefix, id, at)
		},
		Finish: func(ctx context.Context, sweep *retention.Sweep, id string, at time.Time) error {
			return finishOrder(ctx, pool, kv, sweep, id, at)
		},
		Abandon: func(ctx context.Context, id string, key []byte) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }() // when a write failed
			if _, err := tx.Exec(ctx, "UPDATE orders SET state = 'shipped' WHERE id = $1", id); err != nil {
				return err
			}
			if err := kv.MarkKeyTx(ctx, tx, key); err != nil {
				return err
			}
			return tx.Rollback(ctx)
		},
		Shipped: func(ctx context.Context, id string) (bool, error) {
			var shipped bool
			err := pool.QueryRow(ctx, "SELECT state = 'shipped' FROM orders WHERE id = $1", id).Scan(&shipped)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return shipped, err
		},
		Clear: func(ctx context.Context, id string) error {
			_, err := pool.Exec(ctx, "DELETE FROM orders WHERE id = $1", id)
			return err
		},
	})
}
