package rediskv_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/rediskv"
)

// TestExampleCode runs the example functions that the docs show
// (finishRun, newAtomicKV) against Redis: a run finished with its marker in
// one MULTI is cleared with its marker in one script.
func TestExampleCode(t *testing.T) {
	rdb := connect(t)
	ctx := context.Background()
	kv, err := rediskv.New(rdb, freshKey(t, rdb))
	require.NoError(t, err)
	const state = "{runs}:state:run-1" // finishRun's key, used by no other test
	t.Cleanup(func() { assert.NoError(t, rdb.Del(context.Background(), state).Err()) })

	require.NoError(t, finishRun(ctx, rdb, kv, "run-1", time.Now().Add(-30*24*time.Hour)))
	require.Equal(t, "succeeded", rdb.Get(ctx, state).Val(), "finishRun's state")
	keys, err := kv.Scan(ctx, []byte("runs/done/"), []byte("runs/done0"), 10)
	require.NoError(t, err)
	require.Len(t, keys, 1, "finishRun's marker")

	akv, err := newAtomicKV(kv)
	require.NoError(t, err)
	sweep, err := retention.New(akv, retention.Config{Prefix: "runs/done/", Retention: 7 * 24 * time.Hour})
	require.NoError(t, err)
	st, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
	assert.Zero(t, rdb.Exists(ctx, state).Val(), "the run's state after the Pass")
	keys, err = kv.Scan(ctx, []byte("runs/done/"), []byte("runs/done0"), 10)
	require.NoError(t, err)
	assert.Empty(t, keys, "the marker after the Pass")
}
