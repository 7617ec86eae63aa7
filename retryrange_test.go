package retention

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of issue 16's retry and parked ranges: a failed marker keeps its
// due time and attempt count in the store.

// keysUnder returns the store's keys under prefix.
func keysUnder(t testing.TB, kv KV, prefix string) []string {
	t.Helper()
	keys, err := kv.Scan(context.Background(), []byte(prefix), []byte(prefix+"\xff"), 1<<20)
	require.NoError(t, err)
	var out []string
	for _, k := range keys {
		out = append(out, string(k))
	}
	return out
}

// TestRescheduledKeepsDueTime: an id rescheduled three times shows its
// real lag past due in the Backlog (which grows while it keeps failing)
// and, once cleared, in ObserveLags and Stats.MaxLag; on v0.1.0 each
// reschedule reset both to the retry time.
func TestRescheduledKeepsDueTime(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	rec := &recorder{}
	s, clock := newSweep(t, mem, Config{Clear: c.clear, Observer: rec, RetryDelay: time.Second, MaxRetryDelay: time.Minute})
	mark(t, mem, "runs/", "x", t0)
	due := t0.Add(time.Hour)
	clock.Set(due.Add(time.Second))
	var ages []time.Duration
	for range 3 {
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed)
		b, err := s.Backlog(context.Background(), 10)
		require.NoError(t, err)
		assert.Equal(t, Backlog{OldestID: "x", OldestDue: b.OldestDue, Age: clock.Now().Sub(due), Retrying: 1, RetryingAge: clock.Now().Sub(due)}, b)
		assert.True(t, b.OldestDue.Equal(due), "OldestDue = %v, want the entity's due time %v", b.OldestDue, due)
		ages = append(ages, b.Age)
		clock.Set(st.NextDue.Add(time.Millisecond)) // the first pass after the retry falls due, as Run makes it
	}
	assert.Less(t, ages[0], ages[1])
	assert.Less(t, ages[1], ages[2], "a stuck id makes the backlog older")
	keys := keysUnder(t, mem, "runs/")
	require.Len(t, keys, 1)
	assert.True(t, strings.HasPrefix(keys[0], "runs/r"), "in the retry range: %q", keys[0])
	assert.Contains(t, keys[0], fmt.Sprintf("/%020d/3/x", t0.UnixMilli()), "finish time and three attempts kept")

	c.set("x", nil)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Cleared)
	lag := clock.Now().Sub(due)
	assert.Equal(t, lag, st.MaxLag, "MaxLag from the real due time")
	require.NotEmpty(t, rec.lags)
	assert.Equal(t, lag, rec.lags[len(rec.lags)-1], "ObserveLags from the real due time")
	assert.Greater(t, lag, 7*time.Second, "1s + 2s + 4s of retry delays, at least")
	assert.Zero(t, mem.Len())
}

// TestAttemptsSurviveRestart: the count of failed attempts lives in the
// marker, so a new Sweep over the same store (a restart, a lease
// hand-over) backs off from it and parks at MaxAttempts.
func TestAttemptsSurviveRestart(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	mark(t, mem, "runs/", "x", t0)
	clock := NewManualClock(t0.Add(2 * time.Hour))
	cfg := Config{Clear: c.clear, Clock: clock, RetryDelay: time.Second, MaxRetryDelay: time.Hour, MaxAttempts: 4}
	for attempt := 1; attempt <= 3; attempt++ {
		s, _ := newSweep(t, mem, cfg) // a new process every time
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed, "attempt %d", attempt)
		// The n-th failure waits 2^(n-1) seconds, up to a fifth more.
		wait := st.NextDue.Sub(clock.Now())
		base := time.Second << (attempt - 1)
		assert.GreaterOrEqual(t, wait, base, "attempt %d", attempt)
		assert.LessOrEqual(t, wait, base*6/5+time.Millisecond, "attempt %d", attempt)
		clock.Set(st.NextDue.Add(time.Millisecond))
	}
	s, _ := newSweep(t, mem, cfg)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.Parked, "the fourth failure parks it, though this Sweep saw only one")
	assert.Zero(t, st.Retried)
	assert.Equal(t, 4, c.count("x"))
}

// TestParkAndRequeue: a marker that failed MaxAttempts times is parked:
// counted, logged, never cleared again, listed by Parked and in Backlog,
// until Requeue puts it back and a pass clears it.
func TestParkAndRequeue(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	c.set("x", errBoom)
	var logs syncBuffer
	s, clock := newSweep(t, mem, Config{Clear: c.clear, MaxAttempts: 2, RetryDelay: time.Second, MaxRetryDelay: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	mark(t, mem, "runs/", "x", t0)
	mark(t, mem, "runs/", "y", t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Retried)
	clock.Set(st.NextDue.Add(time.Millisecond))
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Parked)
	assert.Zero(t, st.Retried)
	assert.True(t, st.NextDue.IsZero(), "nothing left to wait for: %v", st.NextDue)
	assert.Contains(t, logs.String(), "markers parked after Config.MaxAttempts")
	assert.Contains(t, logs.String(), `\"x\": boom`)

	// Never cleared again.
	clock.Advance(24 * time.Hour)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.ClearCalls)
	assert.Equal(t, 2, c.count("x"))

	parked, err := s.Parked(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, "x", parked[0].ID)
	assert.True(t, parked[0].Finished.Equal(t0), "Finished = %v", parked[0].Finished)
	assert.Equal(t, 2, parked[0].Attempts)
	b, err := s.Backlog(context.Background(), 10)
	require.NoError(t, err)
	assert.Equal(t, Backlog{Parked: 1}, b, "parked markers count apart, not in Age")

	n, err := s.Requeue(context.Background(), "x", "nobody")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	_, err = s.Requeue(context.Background())
	require.Error(t, err, "Requeue with no id")
	c.set("x", nil)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Zero(t, mem.Len())
	parked, err = s.Parked(context.Background(), 10)
	require.NoError(t, err)
	assert.Empty(t, parked)
}

// TestMaxAttemptsValidation: MaxAttempts needs a store that can write.
func TestMaxAttemptsValidation(t *testing.T) {
	t.Parallel()
	clear := func(context.Context, string) error { return nil }
	for _, tt := range []struct {
		kv   KV
		n    int
		want string
	}{
		{NewMemKV(), -1, "Config.MaxAttempts must be 0"},
		{NewMemKV(), maxAttempts + 1, "Config.MaxAttempts must be 0"},
		{readOnlyKV{NewMemKV()}, 3, "is no Mover"},
		{putOnlyKV{NewMemKV(), NewMemKV()}, 3, "is no Mover"},
	} {
		_, err := New(tt.kv, Config{Prefix: "runs/", Retention: time.Hour, Clear: clear, MaxAttempts: tt.n})
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), tt.want)
	}
}

// TestOldMarkersStillParse: markers of v0.1.0 (<prefix><ts>/<id>) are
// cleared as before, and a retry key is foreign to a sweep of v0.1.0's
// key rules: it lies outside the range a pass of that version reads.
func TestOldMarkersStillParse(t *testing.T) {
	t.Parallel()
	key := appendRetryKey(nil, "runs/", 0, t0.UnixMilli(), t0.UnixMilli(), 1, "x")
	assert.False(t, string(key) >= "runs/0" && string(key) < "runs/:", "%q is outside the marker range", key)
	_, _, foreign, err := parseKey("runs/", key)
	assert.True(t, foreign)
	require.Error(t, err)
}
