package retention

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBacklog(t *testing.T) {
	t.Parallel()
	// Markers written at t0 + i minutes; the retention is an hour.
	tests := []struct {
		name    string
		markers int
		foreign int // foreign keys sorting before the markers
		at      time.Duration
		limit   int
		want    Backlog
		scans   int64
	}{
		{"empty", 0, 0, 2 * time.Hour, 10, Backlog{}, 1},
		{"nothing due", 5, 0, time.Hour, 10, Backlog{}, 1},
		{"exactly Retention old is not due", 5, 0, time.Hour + time.Millisecond, 10,
			Backlog{OldestID: "m0", OldestDue: t0.Add(time.Hour), Age: time.Millisecond, Due: 1}, 1},
		{"some due", 10, 0, time.Hour + 3*time.Minute + time.Second, 10,
			Backlog{OldestID: "m0", OldestDue: t0.Add(time.Hour), Age: 3*time.Minute + time.Second, Due: 4}, 1},
		{"all due, under the limit", 10, 0, 3 * time.Hour, 10,
			Backlog{OldestID: "m0", OldestDue: t0.Add(time.Hour), Age: 2 * time.Hour, Due: 10}, 1},
		{"limit reached", 100, 0, 3 * time.Hour, 10,
			Backlog{OldestID: "m0", OldestDue: t0.Add(time.Hour), Age: 2 * time.Hour, Due: 10, More: true}, 1},
		{"exactly the limit", 10, 0, 3 * time.Hour, 10,
			Backlog{OldestID: "m0", OldestDue: t0.Add(time.Hour), Age: 2 * time.Hour, Due: 10}, 1},
		{"foreign keys in front", 3, 15, 3 * time.Hour, 10,
			Backlog{OldestID: "m0", OldestDue: t0.Add(time.Hour), Age: 2 * time.Hour, Due: 3}, 2},
		{"foreign keys fill the reads", 3, 100, 3 * time.Hour, 10, Backlog{More: true}, backlogScans},
		{"limit 1", 5, 0, 3 * time.Hour, 1,
			Backlog{OldestID: "m0", OldestDue: t0.Add(time.Hour), Age: 2 * time.Hour, Due: 1, More: true}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			for i := range tt.foreign {
				// Marker-shaped up to a short timestamp: foreign.
				require.NoError(t, mem.Put(t.Context(), fmt.Appendf(nil, "runs/0000000000/f%03d", i), nil))
			}
			for i := range tt.markers {
				mark(t, mem, "runs/", fmt.Sprintf("m%d", i), t0.Add(time.Duration(i)*time.Minute))
			}
			kv := &countingKV{KV: mem}
			s, clock := newSweep(t, kv, Config{Clear: func(context.Context, string) error { return nil }})
			clock.Advance(tt.at)
			got, err := s.Backlog(t.Context(), tt.limit)
			require.NoError(t, err)
			assert.Equal(t, tt.want.OldestID, got.OldestID)
			assert.True(t, tt.want.OldestDue.Equal(got.OldestDue), "OldestDue = %v, want %v", got.OldestDue, tt.want.OldestDue)
			got.OldestDue, tt.want.OldestDue = time.Time{}, time.Time{}
			assert.Equal(t, tt.want, got, "Backlog(%d)", tt.limit)
			assert.Equal(t, tt.scans+2, kv.scans.Load(), "Scan calls: the due range's, and one each of the empty retry and parked ranges")
		})
	}
}

func TestBacklogReadsLittleOfALargeBacklog(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	for i := range 10_000 {
		mark(t, mem, "runs/", fmt.Sprintf("m%d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	kv := &countingKV{KV: mem}
	s, clock := newSweep(t, kv, Config{Clear: func(context.Context, string) error { return nil }})
	clock.Advance(2 * time.Hour)
	b, err := s.Backlog(t.Context(), 100)
	require.NoError(t, err)
	assert.Equal(t, Backlog{OldestID: "m0", OldestDue: b.OldestDue, Age: time.Hour, Due: 100, More: true}, b)
	assert.Equal(t, int64(1+2), kv.scans.Load(), "one page of the due markers; the retry and parked ranges are empty")
	assert.Equal(t, int64(101), kv.keys.Load(), "keys read")
}

func TestBacklogAfterPassIsEmpty(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	for i := range 30 {
		mark(t, mem, "runs/", fmt.Sprintf("m%d", i), t0.Add(time.Duration(i)*time.Minute))
	}
	bad := appendTimestamp([]byte("runs/"), uint64(t0.UnixMilli()))
	require.NoError(t, mem.Put(t.Context(), append(bad, "/bad id!"...), nil)) // malformed: not counted
	s, clock := newSweep(t, mem, Config{Clear: func(context.Context, string) error { return nil }})
	clock.Advance(time.Hour + 10*time.Minute + time.Second)
	b, err := s.Backlog(t.Context(), 100)
	require.NoError(t, err)
	assert.Equal(t, 11, b.Due)
	assert.Equal(t, 10*time.Minute+time.Second, b.Age)
	_, err = s.Pass(t.Context())
	require.NoError(t, err)
	b, err = s.Backlog(t.Context(), 100)
	require.NoError(t, err)
	assert.Equal(t, Backlog{}, b)
}

func TestBacklogErrors(t *testing.T) {
	t.Parallel()
	kv := &countingKV{KV: NewMemKV(), scanErr: func(int64) error { return errBoom }}
	s, _ := newSweep(t, kv, Config{Clear: func(context.Context, string) error { return nil }})
	_, err := s.Backlog(t.Context(), 10)
	require.ErrorIs(t, err, errBoom)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = s.Backlog(ctx, 10)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, "runs/", s.Prefix())
	for _, limit := range []int{0, -1, MaxPageSize + 1} {
		_, err = s.Backlog(t.Context(), limit)
		assert.ErrorContains(t, err, "Backlog's limit must be 1 to", "Backlog(%d)", limit)
	}
}

// TestBacklogMatchesPass checks, over random stores of markers due and not
// due, malformed markers and foreign keys, that Backlog counts exactly what
// the next Pass clears, and finds its oldest marker.
func TestBacklogMatchesPass(t *testing.T) {
	t.Parallel()
	for seed := range 50 {
		rng := rand.New(rand.NewPCG(uint64(seed), 1))
		mem := NewMemKV()
		n := rng.IntN(300)
		for i := range n {
			at := t0.Add(time.Duration(rng.IntN(3*3600_000)) * time.Millisecond)
			switch rng.IntN(10) {
			case 0: // malformed: an id ValidateID refuses
				key := appendTimestamp([]byte("runs/"), uint64(at.UnixMilli()))
				require.NoError(t, mem.Put(t.Context(), append(key, fmt.Sprintf("/bad id %d", i)...), nil))
			case 1: // foreign
				require.NoError(t, mem.Put(t.Context(), fmt.Appendf(nil, "runs/%d-foreign", rng.IntN(10)), nil))
			default:
				mark(t, mem, "runs/", fmt.Sprintf("e%d", i), at)
			}
		}
		var cleared []string
		s, clock := newSweep(t, mem, Config{PageSize: 1 + rng.IntN(64), Clear: func(_ context.Context, id string) error {
			cleared = append(cleared, id)
			return nil
		}})
		clock.Advance(time.Hour + time.Duration(rng.IntN(2*3600_000))*time.Millisecond)
		b, err := s.Backlog(t.Context(), MaxPageSize)
		require.NoError(t, err)
		st, err := s.Pass(t.Context())
		require.NoError(t, err)
		assert.Equal(t, st.Cleared, b.Due, "seed %d: Backlog().Due, want the Pass's Cleared", seed)
		assert.False(t, b.More, "seed %d", seed)
		if st.Cleared > 0 {
			assert.Equal(t, cleared[0], b.OldestID, "seed %d", seed)
			assert.Equal(t, st.MaxLag, b.Age, "seed %d: Age, want the Pass's MaxLag", seed)
		}
	}
}
