package retentionui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// stallingKV is a MemKV whose Scans stall, while stall is set, until
// their context is done: a store that stopped answering.
type stallingKV struct {
	*retention.MemKV
	stall atomic.Bool
}

func (k *stallingKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if k.stall.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return k.MemKV.Scan(ctx, start, end, limit)
}

func TestSlowStoreSlowsThePageNotTheSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		kv := &stallingKV{MemKV: retention.NewMemKV()}
		rec := &retentionui.Recorder{}
		s, err := retention.New(kv, retention.Config{
			Prefix: "p/", Retention: time.Hour, Observer: rec, Logger: discard, StoreTimeout: -1,
			Clear: func(context.Context, string) error { return nil },
		})
		require.NoError(t, err)
		for _, id := range []string{"a", "b", "c"} {
			require.NoError(t, s.Mark(ctx, kv, id, time.Now().Add(-2*time.Hour)))
		}
		h := newHandler(t, retentionui.Options{Sweeps: []*retention.Sweep{s}, Recorder: rec, Timeout: 10 * time.Second})

		kv.stall.Store(true)
		start := time.Now()
		page := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("Accept", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			page <- w
		}()
		synctest.Wait() // the page waits on the store
		kv.stall.Store(false)

		st, err := s.Pass(ctx)
		require.NoError(t, err, "a pass while the page waits")
		assert.Equal(t, 3, st.Cleared)
		assert.Empty(t, page, "the page still waits")

		w := <-page
		assert.Equal(t, 10*time.Second, time.Since(start), "the page waited Options.Timeout")
		require.Equal(t, http.StatusOK, w.Code)
		var o retentionui.Overview
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &o))
		assert.Equal(t, retentionui.StateError, o.Sweeps[0].State)
		assert.Contains(t, o.Sweeps[0].Error, "deadline exceeded")
		require.NotNil(t, o.Sweeps[0].LastPass, "the Recorder saw the pass")
		assert.Equal(t, 3, o.Sweeps[0].LastPass.Cleared)
	})
}
