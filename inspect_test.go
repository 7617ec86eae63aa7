package retention

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
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
			kv := &fakeKV{canPut: true, MemKV: mem}
			s, clock := newSweep(t, kv.store(), Config{Clear: func(context.Context, string) error { return nil }})
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
	kv := &fakeKV{canPut: true, MemKV: mem}
	s, clock := newSweep(t, kv.store(), Config{Clear: func(context.Context, string) error { return nil }})
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
	kv := &fakeKV{canPut: true, MemKV: NewMemKV(), onScan: failWith(errBoom)}
	s, _ := newSweep(t, kv.store(), Config{Clear: func(context.Context, string) error { return nil }})
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

// TestBacklogFindsStuckIDWithinLimit: the retry range is in order of
// retry time, and a stuck id (the longest backoff) sorts last. With more
// retrying markers than the limit, More says the figures may miss some;
// with a limit above their number, RetryingAge and OldestID are the stuck
// id's.
func TestBacklogFindsStuckIDWithinLimit(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	s, clock := newSweep(t, mem, Config{Clear: newClears().clear})
	now := t0.Add(3 * time.Hour)
	clock.Set(now)
	put := func(at, finished time.Time, attempts int, id string) {
		key := appendRetryKey(nil, "runs/", 0, at.UnixMilli(), finished.UnixMilli(), attempts, id)
		require.NoError(t, mem.Put(context.Background(), key, nil))
	}
	put(now.Add(10*time.Minute), t0, 12, "stuck") // due at t0+1h: 2h past due
	for i := range 5 {
		put(now.Add(time.Second), t0.Add(110*time.Minute), 1, fmt.Sprintf("fresh%d", i)) // 10 min past due
	}
	// With more retrying markers than the limit, the oldest may be among
	// those not read (Backlog.RetryingAge says so), and More warns of it.
	// With a limit above their number it is found.
	b, err := s.Backlog(context.Background(), 2)
	require.NoError(t, err)
	assert.True(t, b.More, "the limit was reached: More warns the figures may miss some")
	b, err = s.Backlog(context.Background(), 10)
	require.NoError(t, err)
	assert.Equal(t, "stuck", b.OldestID)
	assert.Equal(t, 2*time.Hour, b.RetryingAge, "RetryingAge is the oldest retrying entity's")
}

// TestRequeueRacingPassesClearsEveryID: Requeue racing passes: every id
// is cleared once more and nothing is left (run with -race).
func TestRequeueRacingPassesClearsEveryID(t *testing.T) {
	t.Parallel()
	for _, kind := range writingKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			kv := kind.wrap(mem)
			c := newClears()
			var ids []string
			for i := range 50 {
				id := fmt.Sprintf("p%02d", i)
				ids = append(ids, id)
				c.set(id, errBoom)
				mark(t, mem, "runs/", id, t0)
			}
			s, clock := newSweep(t, kv, Config{Clear: c.clear, MaxAttempts: 1, PageSize: 7})
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			require.Equal(t, 50, st.Parked)
			for _, id := range ids {
				c.set(id, nil)
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				for range 20 {
					clock.Advance(time.Millisecond)
					_, err := s.Pass(context.Background())
					assert.NoError(t, err)
				}
			})
			for _, id := range ids {
				_, err := s.Requeue(context.Background(), id)
				require.NoError(t, err)
			}
			wg.Wait()
			clock.Advance(time.Millisecond)
			_, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Zero(t, mem.Len(), "%v", keysUnder(t, mem, "runs/"))
			for _, id := range ids {
				assert.Equal(t, 2, c.count(id), id)
			}
		})
	}
}

// TestConcurrentRequeuesCountEachMarkerOnce: Requeue answers how many
// markers its own Move moved, not the parked keys it read: of requeues
// racing over a slow Move, only one counts each marker, and each marker is
// moved once.
func TestConcurrentRequeuesCountEachMarkerOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		parked []string
		asks   [][]string // the ids of each caller, round robin over 12 callers
		want   int
	}{
		{"one id", []string{"x"}, [][]string{{"x"}}, 1},
		{"overlapping ids", []string{"a", "b", "c"}, [][]string{{"a", "b"}, {"b", "c"}, {"c", "a"}}, 3},
		{"ids not parked", []string{"x"}, [][]string{{"y"}, {"x", "z"}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				f := newFakeKV(nil)
				for _, id := range tt.parked {
					require.NoError(t, f.Put(ctx, appendParkedKey(nil, "runs/", 0, t0.UnixMilli(), 1, id), nil))
				}
				f.setHooks(nil, nil, func(context.Context, int64) error {
					time.Sleep(100 * time.Millisecond) // a store's round trip, in the bubble's time
					return nil
				})
				s, clock := newSweep(t, f.store(), Config{Clear: newClears().clear, MaxAttempts: 1})
				clock.Set(t0.Add(2 * time.Hour))
				counts := make([]int, 12)
				var wg sync.WaitGroup
				for i := range counts {
					wg.Go(func() {
						n, err := s.Requeue(ctx, tt.asks[i%len(tt.asks)]...)
						assert.NoError(t, err)
						counts[i] = n
					})
				}
				wg.Wait()
				total := 0
				for _, n := range counts {
					total += n
				}
				assert.Equal(t, tt.want, total, "Requeue() = %v from 12 callers, want %d in all", counts, tt.want)
				parked, err := s.Parked(ctx, 10)
				require.NoError(t, err)
				assert.Empty(t, parked)
				want := map[string]int{}
				for _, id := range tt.parked {
					want[id] = 1
				}
				assert.Equal(t, want, markerIDs(t, f, "runs/"), "markers per id after the requeues")
			})
		})
	}
}

// TestRequeueWaitingForAnotherEndsWithItsContext: a Requeue queued behind
// another's slow Move returns its context's error when that ends first.
func TestRequeueWaitingForAnotherEndsWithItsContext(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFakeKV(nil)
		require.NoError(t, f.Put(ctx, appendParkedKey(nil, "runs/", 0, t0.UnixMilli(), 1, "x"), nil))
		f.setHooks(nil, nil, func(context.Context, int64) error {
			time.Sleep(time.Second)
			return nil
		})
		s, _ := newSweep(t, f.store(), Config{Clear: newClears().clear, MaxAttempts: 1})
		var wg sync.WaitGroup
		wg.Go(func() {
			n, err := s.Requeue(ctx, "x")
			assert.NoError(t, err)
			assert.Equal(t, 1, n)
		})
		synctest.Wait() // the first is in its Move
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		n, err := s.Requeue(short, "x")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Zero(t, n)
		wg.Wait()
	})
}

// TestBacklogOldestIsDue: a retry-range marker not expired under today's
// Retention (raised since it failed) is not Backlog.OldestID: OldestID and
// OldestDue are empty and zero when none is due.
func TestBacklogOldestIsDue(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	s, clock := newSweep(t, mem, Config{Clear: newClears().clear, Retention: 2 * time.Hour})
	now := t0.Add(90 * time.Minute) // x fell due under 1h, not under 2h
	clock.Set(now)
	key := appendRetryKey(nil, "runs/", 0, now.UnixMilli()-1, t0.UnixMilli(), 1, "x")
	require.NoError(t, mem.Put(context.Background(), key, nil))
	b, err := s.Backlog(context.Background(), 10)
	require.NoError(t, err)
	assert.Empty(t, b.OldestID, "nothing is due: x expires at %v", t0.Add(2*time.Hour))
	assert.True(t, b.OldestDue.IsZero(), "OldestDue = %v", b.OldestDue)
}

// TestPendingAndBacklogOfHoldsAndDeadlines: Pending lists what is not
// cleared in order of due time, and limit is exact; a hold that ended is
// listed as due with no Next; a deadline not reached is not due yet:
// neither listed nor counted, as no marker not due yet is.
func TestPendingAndBacklogOfHoldsAndDeadlines(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, mem, Config{Clear: c.clear})
	mark(t, mem, "runs/", "held", t0)
	c.set("held", Hold(t0.Add(3*time.Hour)))
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	for i, d := range []time.Duration{-30 * time.Minute, 10 * time.Hour} {
		key, err := s.DeadlineKey(clock.Now().Add(d), fmt.Sprintf("dl%d", i))
		require.NoError(t, err)
		require.NoError(t, mem.Put(context.Background(), key, nil))
	}
	mark(t, mem, "runs/", "plain", t0.Add(10*time.Minute))

	b, err := s.Backlog(context.Background(), 10)
	require.NoError(t, err)
	assert.Equal(t, 1, b.Held, "the hold; the deadline ahead is not due yet")
	assert.Equal(t, 2, b.Due, "plain, and dl0 whose deadline passed")
	assert.Equal(t, "plain", b.OldestID)
	assert.Equal(t, t0.Add(70*time.Minute), b.OldestDue)

	pending, err := s.Pending(context.Background(), 10)
	require.NoError(t, err)
	assert.Equal(t, []string{"held", "plain", "dl0"}, ids(pending))
	assert.Equal(t, StateHeld, pending[0].State)
	assert.Equal(t, StateDue, pending[2].State)
	clock.Set(t0.Add(3*time.Hour + time.Second))
	pending, err = s.Pending(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, "held", pending[0].ID)
	assert.Equal(t, StateDue, pending[0].State, "its hold ended")
	assert.Zero(t, pending[0].Next)
	_, err = s.Pending(context.Background(), MaxPageSize+1)
	assert.Error(t, err)
}

// TestEachMarkerCountsInOneState: a marker of each kind is in exactly one
// state, the same in Backlog's counts and in Pending's list: due only when
// the next pass may clear it, and held and parked markers never late (no
// Age, no OldestID).
func TestEachMarkerCountsInOneState(t *testing.T) {
	t.Parallel()
	now := t0.Add(48 * time.Hour) // the retention is an hour: t0's entity fell due at t0+1h
	due := t0.Add(time.Hour)
	markerKey := func(at time.Time) []byte {
		key, err := MarkerKey("runs/", at, "x")
		require.NoError(t, err)
		return key
	}
	retryKey := func(kind byte, at, finished time.Time, attempts int) []byte {
		return appendRetryKey(nil, "runs/", kind, at.UnixMilli(), finished.UnixMilli(), attempts, "x")
	}
	tests := []struct {
		name  string
		key   []byte
		state MarkerState // in Pending; 0: not listed
		want  Backlog
	}{
		{"past its retention: due", markerKey(t0), StateDue,
			Backlog{OldestID: "x", OldestDue: due, Age: 47 * time.Hour, Due: 1}},
		{"within its retention: not due yet", markerKey(now), 0, Backlog{}},
		{"its clear failed, retry ahead: retrying", retryKey(0, now.Add(time.Minute), t0, 2), StateRetrying,
			Backlog{OldestID: "x", OldestDue: due, Age: 47 * time.Hour, Retrying: 1, RetryingAge: 47 * time.Hour}},
		{"its retry time came: still retrying", retryKey(0, now.Add(-time.Minute), t0, 2), StateRetrying,
			Backlog{OldestID: "x", OldestDue: due, Age: 47 * time.Hour, Retrying: 1, RetryingAge: 47 * time.Hour}},
		{"held: not late", retryKey(keyHeld, now.Add(time.Hour), t0, 0), StateHeld, Backlog{Held: 1}},
		{"its hold ended: due", retryKey(keyHeld, now.Add(-time.Minute), t0, 0), StateDue,
			Backlog{OldestID: "x", OldestDue: due, Age: 47 * time.Hour, Due: 1}},
		{"a deadline ahead: not due yet", retryKey(keyDeadline, now.Add(time.Hour), now.Add(time.Hour), 0), 0, Backlog{}},
		{"a deadline that came: due", retryKey(keyDeadline, now.Add(-time.Hour), now.Add(-time.Hour), 0), StateDue,
			Backlog{OldestID: "x", OldestDue: now.Add(-time.Hour), Age: time.Hour, Due: 1}},
		{"parked: waits for a requeue, not late", appendParkedKey(nil, "runs/", 0, t0.UnixMilli(), 3, "x"), StateParked, Backlog{Parked: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			s, clock := newSweep(t, mem, Config{Clear: newClears().clear, MaxAttempts: 3})
			clock.Set(now)
			require.NoError(t, mem.Put(context.Background(), tt.key, nil))
			b, err := s.Backlog(context.Background(), 10)
			require.NoError(t, err)
			assert.True(t, tt.want.OldestDue.Equal(b.OldestDue), "Backlog().OldestDue = %v, want %v", b.OldestDue, tt.want.OldestDue)
			b.OldestDue, tt.want.OldestDue = time.Time{}, time.Time{}
			assert.Equal(t, tt.want, b, "Backlog() of %q", tt.key)
			pending, err := s.Pending(context.Background(), 10)
			require.NoError(t, err)
			if tt.state == 0 {
				assert.Empty(t, pending, "Pending() of %q", tt.key)
				return
			}
			require.Len(t, pending, 1, "Pending() of %q", tt.key)
			assert.Equal(t, tt.state, pending[0].State, "Pending() state of %q = %v, want %v", tt.key, pending[0].State, tt.state)
		})
	}
}

// TestPendingListsWhatBacklogCounts: over random stores of markers in
// every state, Pending lists as many markers of each state as Backlog
// counts: a page and a count never disagree on what is due.
func TestPendingListsWhatBacklogCounts(t *testing.T) {
	t.Parallel()
	for seed := range 50 {
		rng := rand.New(rand.NewPCG(uint64(seed), 2))
		mem := NewMemKV()
		s, clock := newSweep(t, mem, Config{Clear: newClears().clear, MaxAttempts: 5})
		now := t0.Add(3 * time.Hour)
		clock.Set(now)
		for i := range rng.IntN(60) {
			id := fmt.Sprintf("e%d", i)
			at := t0.Add(time.Duration(rng.IntN(4*3600_000)) * time.Millisecond)
			var key []byte
			switch rng.IntN(5) {
			case 0:
				key, _ = MarkerKey("runs/", at, id)
			case 1:
				key = appendRetryKey(nil, "runs/", 0, at.UnixMilli(), t0.UnixMilli(), 1+rng.IntN(3), id)
			case 2:
				key = appendRetryKey(nil, "runs/", keyHeld, at.UnixMilli(), t0.UnixMilli(), 0, id)
			case 3:
				key = appendRetryKey(nil, "runs/", keyDeadline, at.UnixMilli(), at.UnixMilli(), 0, id)
			default:
				key = appendParkedKey(nil, "runs/", 0, at.UnixMilli(), 5, id)
			}
			require.NoError(t, mem.Put(context.Background(), key, nil))
		}
		b, err := s.Backlog(context.Background(), MaxPageSize)
		require.NoError(t, err)
		pending, err := s.Pending(context.Background(), MaxPageSize)
		require.NoError(t, err)
		got := map[MarkerState]int{}
		for _, m := range pending {
			got[m.State]++
		}
		want := map[MarkerState]int{StateDue: b.Due, StateRetrying: b.Retrying, StateHeld: b.Held, StateParked: b.Parked}
		for st, n := range want {
			if n == 0 {
				delete(want, st)
			}
		}
		assert.Equal(t, want, got, "seed %d: Pending() by state, want Backlog()'s counts", seed)
	}
}

// TestPendingOfFewerIsAPrefix: Pending reads at most limit keys of each
// range, and the retry range is in retry/hold-time order, not due-time
// order; once n covers each range, Pending(n) is the first n of a longer
// Pending.
func TestPendingOfFewerIsAPrefix(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, mem, Config{Clear: c.clear})
	mark(t, mem, "runs/", "held", t0)
	c.set("held", Hold(t0.Add(3*time.Hour)))
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	key, err := s.DeadlineKey(clock.Now().Add(-30*time.Minute), "dl0")
	require.NoError(t, err)
	require.NoError(t, mem.Put(context.Background(), key, nil))
	mark(t, mem, "runs/", "plain", t0.Add(10*time.Minute))

	all, err := s.Pending(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, []string{"held", "plain", "dl0"}, ids(all))
	// Pending reads at most limit keys of each range: Pending(n) is the
	// first n of Pending(10) once n covers each range (here the retry range holds two),
	// as its doc says.
	for n := 2; n < len(all); n++ {
		top, err := s.Pending(context.Background(), n)
		require.NoError(t, err)
		assert.Equal(t, ids(all[:n]), ids(top), "Pending(%d) is the first %d of Pending(10)", n, n)
	}
}
