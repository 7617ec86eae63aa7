package retentionui_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// slowMoveKV is a MemKV whose Moves take 100 ms: a store's round trip.
type slowMoveKV struct{ *retention.MemKV }

func (k slowMoveKV) Move(ctx context.Context, from, to [][]byte) error {
	time.Sleep(100 * time.Millisecond)
	return k.MemKV.Move(ctx, from, to)
}

// TestConcurrentRequeuesOfOneIDAnswerOneRequeued: of 12 requeues of one
// parked id racing over a slow Move, one answers "requeued 1" and the
// others that it is not parked (any more): the count is the markers moved.
func TestConcurrentRequeuesOfOneIDAnswerOneRequeued(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		kv := slowMoveKV{retention.NewMemKV()}
		s, err := retention.New(kv, retention.Config{
			Prefix: jobs, Retention: time.Hour, MaxAttempts: 1, Logger: discard,
			Clear: func(context.Context, string) error { return errors.New("refused") },
		})
		require.NoError(t, err)
		require.NoError(t, s.Mark(ctx, kv, poison, time.Now().Add(-2*time.Hour)))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, st.Parked)
		h := newHandler(t, retentionui.Options{Sweeps: []*retention.Sweep{s}})

		codes := make([]int, 12)
		requeued := 0
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range codes {
			wg.Go(func() {
				code, body := do(t, h, "POST", "/requeue", url.Values{"prefix": {jobs}, "id": {poison}}, asJSON)
				codes[i] = code
				if code == http.StatusOK {
					var res retentionui.Requeued
					assert.NoError(t, json.Unmarshal([]byte(body), &res), body)
					mu.Lock()
					requeued += res.Requeued
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		count := map[int]int{}
		for _, c := range codes {
			count[c]++
		}
		assert.Equal(t, map[int]int{http.StatusOK: 1, http.StatusConflict: 11}, count, "statuses of 12 racing requeues")
		assert.Equal(t, 1, requeued, "markers requeued, summed over the answers")
		assert.Empty(t, parkedIDs(t, s))
	})
}
