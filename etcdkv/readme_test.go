package etcdkv_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
)

// TestExampleCode runs the example function that docs/fleet.md shows
// (finishRun) against etcd: the run's state and marker commit in one Txn,
// and a Pass clears them.
func TestExampleCode(t *testing.T) {
	cli := connect(t)
	ctx := context.Background()
	kv, err := etcdkv.New(cli, freshNamespace(t, cli), nil)
	require.NoError(t, err)
	const state = "myservice/runs/run-1" // finishRun's key, used by no other test
	t.Cleanup(func() {
		_, err := cli.Delete(context.Background(), state)
		assert.NoError(t, err)
	})
	exists := func() bool {
		resp, err := cli.Get(ctx, state)
		require.NoError(t, err)
		return len(resp.Kvs) > 0
	}

	require.NoError(t, finishRun(ctx, cli, kv, "run-1", time.Now().Add(-30*24*time.Hour)))
	require.True(t, exists(), "finishRun's state")
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Clear: func(ctx context.Context, id string) error {
			_, err := cli.Delete(ctx, "myservice/runs/"+id)
			return err
		},
	})
	require.NoError(t, err)
	st, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
	assert.False(t, exists(), "the run's state after the Pass")
	keys, err := kv.Scan(ctx, []byte("runs/done/"), []byte("runs/done0"), 10)
	require.NoError(t, err)
	assert.Empty(t, keys, "the marker after the Pass")
}
