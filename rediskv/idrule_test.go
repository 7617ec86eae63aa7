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
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/rediskv"
)

// TestCustomIDRule runs kvtest.CustomIDRule with the example's
// finishOrder, which queues the marker in its MULTI with MarkKeyTx.
func TestCustomIDRule(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	kv, err := rediskv.New(rdb, freshKey(t, rdb))
	require.NoError(t, err)
	// finishOrder writes {orders}:state:<id>, which only this test uses.
	states := []string{"{orders}:state:order.42", "{orders}:state:order.7"}
	require.NoError(t, rdb.Del(ctx, states...).Err())
	t.Cleanup(func() { assert.NoError(t, rdb.Del(context.Background(), states...).Err()) })
	errAbandon := errors.New("abandon")
	kvtest.CustomIDRule(t, kvtest.IDRuleHarness{
		KV: kv,
		MarkDefault: func(ctx context.Context, prefix, id string, at time.Time) error {
			_, err := rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error { return kv.MarkTx(ctx, pipe, prefix, id, at) })
			return err
		},
		Finish: func(ctx context.Context, sweep *retention.Sweep, id string, at time.Time) error {
			return finishOrder(ctx, rdb, kv, sweep, id, at)
		},
		Abandon: func(ctx context.Context, id string, key []byte) error {
			_, err := rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, "{orders}:state:"+id, "shipped", 0)
				if err := kv.MarkKeyTx(ctx, pipe, key); err != nil {
					return err
				}
				return errAbandon // the MULTI is never sent
			})
			if errors.Is(err, errAbandon) {
				return nil
			}
			return err
		},
		Shipped: func(ctx context.Context, id string) (bool, error) {
			state, err := rdb.Get(ctx, "{orders}:state:"+id).Result()
			if errors.Is(err, redis.Nil) {
				return false, nil
			}
			return state == "shipped", err
		},
		Clear: func(ctx context.Context, id string) error { return rdb.Del(ctx, "{orders}:state:"+id).Err() },
	})
}
