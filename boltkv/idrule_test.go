package boltkv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
	"github.com/marksweep/retention/kvtest"
)

// TestCustomIDRule runs kvtest.CustomIDRule with the example's
// finishOrder, which writes the marker with MarkKeyTx.
func TestCustomIDRule(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket([]byte("orders")) // finishOrder's
		return err
	}))
	orders := func(tx *bbolt.Tx) *bbolt.Bucket { return tx.Bucket([]byte("orders")) }
	errAbandon := errors.New("abandon")
	kvtest.CustomIDRule(t, kvtest.IDRuleHarness{
		KV: kv,
		MarkDefault: func(_ context.Context, prefix, id string, at time.Time) error {
			return db.Update(func(tx *bbolt.Tx) error { return kv.MarkTx(tx, prefix, id, at) })
		},
		Finish: func(_ context.Context, sweep *retention.Sweep, id string, at time.Time) error {
			return finishOrder(db, kv, sweep, id, at)
		},
		Abandon: func(_ context.Context, id string, key []byte) error {
			err := db.Update(func(tx *bbolt.Tx) error {
				if err := orders(tx).Put([]byte(id), []byte("shipped")); err != nil {
					return err
				}
				if err := kv.MarkKeyTx(tx, key); err != nil {
					return err
				}
				return errAbandon
			})
			if errors.Is(err, errAbandon) {
				return nil
			}
			return err
		},
		Shipped: func(_ context.Context, id string) (shipped bool, err error) {
			err = db.View(func(tx *bbolt.Tx) error {
				shipped = string(orders(tx).Get([]byte(id))) == "shipped"
				return nil
			})
			return shipped, err
		},
		Clear: func(_ context.Context, id string) error {
			return db.Update(func(tx *bbolt.Tx) error { return orders(tx).Delete([]byte(id)) })
		},
	})
}
