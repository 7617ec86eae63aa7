package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// levelCounter counts log records at Warn and above.
type levelCounter struct {
	mu   sync.Mutex
	msgs []string
}

func (l *levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *levelCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		l.mu.Lock()
		l.msgs = append(l.msgs, r.Message)
		l.mu.Unlock()
	}
	return nil
}
func (l *levelCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levelCounter) WithGroup(string) slog.Handler      { return l }

// TestHold: a held id is not cleared before the hold's end, then cleared
// once; the hold is no failure (Stats, logs, attempts), on every kind of
// store, through each clear mode.
func TestHold(t *testing.T) {
	t.Parallel()
	until := t0.Add(5 * time.Hour)
	modes := []struct {
		name string
		cfg  func(c *clears) Config
	}{
		{"Clear", func(c *clears) Config { return Config{Clear: c.clear} }},
		{"ClearBatch BatchError", func(c *clears) Config {
			return Config{ClearBatch: func(ctx context.Context, ids []string) error {
				perID := BatchError{}
				for _, id := range ids {
					if err := c.clear(ctx, id); err != nil {
						perID[id] = err
					}
				}
				if len(perID) == 0 {
					return nil
				}
				return perID
			}}
		}},
	}
	for _, kind := range storeKinds {
		for _, mode := range modes {
			t.Run(kind.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				mem := NewMemKV()
				c := newClears()
				logs := &levelCounter{}
				cfg := mode.cfg(c)
				cfg.Logger = slog.New(logs)
				cfg.RetryDelay = time.Minute
				s, clock := newSweep(t, kind.wrap(mem), cfg)
				mark(t, mem, "runs/", "a", t0)
				mark(t, mem, "runs/", "held", t0)
				c.set("held", Hold(until))

				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, 1, st.Cleared)
				assert.Equal(t, 1, st.Held)
				assert.Zero(t, st.Failed, "a hold is no failure")
				assert.Zero(t, st.Retried)
				assert.Zero(t, st.FailedCalls)
				assert.Equal(t, until, st.NextDue, "Run wakes at the hold's end")
				assert.Empty(t, logs.msgs, "no Warn or Error line for a hold")
				assert.Equal(t, map[string]int{"held": 1}, markerIDs(t, mem, "runs/"))
				if kind.writes {
					keys, err := mem.Scan(context.Background(), []byte("runs/r"), []byte("runs/s"), 10)
					require.NoError(t, err)
					require.Len(t, keys, 1)
					k, _, err := parseRetryKey("runs/", retryInfix, keys[0])
					require.NoError(t, err)
					assert.Equal(t, byte(keyHeld), k.kind, "%q", keys[0])
					assert.Equal(t, until.UnixMilli(), k.at)
				}
				c.set("held", nil)

				// Passes before the hold's end leave it alone.
				for _, at := range []time.Duration{3 * time.Hour, 5*time.Hour - time.Millisecond} {
					clock.Set(t0.Add(at))
					st, err = s.Pass(context.Background())
					require.NoError(t, err)
					assert.Zero(t, st.Cleared, "at %v", at)
				}
				assert.Equal(t, 1, c.count("held"))

				clock.Set(until.Add(time.Millisecond))
				st, err = s.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, 1, st.Cleared)
				assert.Equal(t, 2, c.count("held"), "cleared once after the hold")
				assert.Empty(t, markerIDs(t, mem, "runs/"))
				assert.Empty(t, logs.msgs)
			})
		}
	}
}

// TestHoldWholeCall: a ClearBatch or a ClearDeleter that returns Hold for
// the whole call holds every id of it; a ClearDeleter's BatchError entry
// holds its id and the others are sent again.
func TestHoldWholeCall(t *testing.T) {
	t.Parallel()
	until := t0.Add(3 * time.Hour)
	t.Run("ClearBatch", func(t *testing.T) {
		mem := NewMemKV()
		s, clock := newSweep(t, mem, Config{ClearBatch: func(context.Context, []string) error { return Hold(until) }})
		markN(t, mem, 10, t0)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 10, st.Held)
		assert.Zero(t, st.Failed+st.Cleared)
		b, err := s.Backlog(context.Background(), 100)
		require.NoError(t, err)
		assert.Equal(t, 10, b.Held)
		assert.Zero(t, b.Age, "held markers are not late")
	})
	t.Run("ClearDeleter", func(t *testing.T) {
		mem := NewMemKV()
		kv := atomicOver(mem)
		kv.before = refuse(map[string]error{"b0003": Hold(until)})
		s, clock := newSweep(t, kv, Config{BatchSize: 10})
		for _, id := range markN(t, mem, 10, t0) {
			kv.entities[id] = true
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 9, st.Cleared)
		assert.Equal(t, 1, st.Held)
		assert.Zero(t, st.Failed)
		assert.Equal(t, map[string]bool{"b0003": true}, kv.entities)
		assert.Equal(t, map[string]int{"b0003": 1}, markerIDs(t, mem, "runs/"))

		kv.before = nil // the hold ends
		clock.Set(until.Add(time.Millisecond))
		st, err = s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 1, st.Cleared)
		assert.Empty(t, kv.entities)
		for id, n := range kv.cleared {
			assert.Equal(t, 1, n, "%s cleared once", id)
		}
	})
}

// TestHoldZeroOrPast: a hold without a time, or with one already past,
// is tried again after RetryDelay, with no backoff growing.
func TestHoldZeroOrPast(t *testing.T) {
	t.Parallel()
	for _, until := range []time.Time{{}, t0} {
		mem := NewMemKV()
		c := newClears()
		s, clock := newSweep(t, mem, Config{Clear: c.clear, RetryDelay: time.Minute, MaxRetryDelay: time.Hour})
		mark(t, mem, "runs/", "a", t0)
		c.set("a", Hold(until))
		clock.Set(t0.Add(2 * time.Hour))
		for i := range 4 {
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Held, "pass %d", i)
			assert.Equal(t, clock.Now().Add(time.Minute), st.NextDue, "pass %d: RetryDelay, not a growing backoff", i)
			clock.Advance(time.Minute + time.Millisecond)
		}
		assert.Equal(t, 4, c.count("a"))
	}
}

// TestHoldSurvivesRestart: a sweep made anew over the same store keeps the
// hold, and counts no failed attempt for it.
func TestHoldSurvivesRestart(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	until := t0.Add(10 * time.Hour)
	s, clock := newSweep(t, mem, Config{Clear: c.clear, MaxAttempts: 1})
	mark(t, mem, "runs/", "a", t0)
	c.set("a", Hold(until))
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)

	s2, clock2 := newSweep(t, mem, Config{Clear: c.clear, MaxAttempts: 1})
	clock2.Set(t0.Add(9 * time.Hour))
	st, err := s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.Cleared+st.Held+st.Failed, "still held after a restart")
	c.set("a", nil)
	clock2.Set(until.Add(time.Millisecond))
	st, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "a hold is no failed attempt: MaxAttempts 1 parks nothing")
	assert.Zero(t, st.Parked)
	assert.Equal(t, 2, c.count("a"))
}

// TestHoldKeptWhenPassCutShort: a hold returned in a page that the pass
// leaves unsettled (its context cancelled by a later clear of the page) is
// kept: the next pass does not ask for it again before its end, and moves
// the marker there; the other markers are cleared.
func TestHoldKeptWhenPassCutShort(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			until := t0.Add(30 * time.Hour)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			asked := map[string]int{}
			clear := func(ctx context.Context, id string) error {
				mu.Lock()
				defer mu.Unlock()
				asked[id]++
				switch {
				case id == "a":
					return Hold(until)
				case id == "b" && asked[id] == 1:
					cancel()
					return ctx.Err()
				}
				return nil
			}
			cfg := Config{Clear: clear}
			if batch {
				cfg = Config{BatchSize: 1, ClearBatch: func(ctx context.Context, ids []string) error { return clear(ctx, ids[0]) }}
			}
			s, clock := newSweep(t, mem, cfg)
			for _, id := range []string{"a", "b", "c"} {
				mark(t, mem, "runs/", id, t0)
			}
			clock.Set(t0.Add(2 * time.Hour))
			_, err := s.Pass(ctx)
			require.ErrorIs(t, err, context.Canceled)
			require.Equal(t, 3, mem.Len(), "nothing settled")

			clock.Advance(time.Hour)
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, asked["a"], "Clear asked again for a hold before its end")
			assert.Equal(t, 2, st.Cleared, "b and c")
			assert.Equal(t, []string{string(appendRetryKey(nil, "runs/", keyHeld, until.UnixMilli(), t0.UnixMilli(), 0, "a"))},
				keysUnder(t, mem, "runs/"), "the held marker moved to the hold's end")
		})
	}
}

// TestHoldKeptWhenMoveFails: a hold whose marker the store refused to move
// is kept in memory: the next pass does not ask for it again and moves the
// marker to the hold's end.
func TestHoldKeptWhenMoveFails(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := newFaultKV(mem, newFaultRand(t, 2), 0)
	kv.enabled.Store(true)
	kv.set(opMove, storeErr, 1)
	c := newClears()
	until := t0.Add(30 * time.Hour)
	c.set("a", Hold(until))
	s, clock := newSweep(t, kv, Config{Clear: c.clear})
	mark(t, mem, "runs/", "a", t0)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Held)
	require.Len(t, keysUnder(t, mem, "runs/0"), 1, "the marker stays where it was")

	kv.set(opMove, storeErr, 0)
	clock.Advance(time.Hour)
	_, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, c.count("a"), "Clear asked again for a hold before its end")
	assert.Equal(t, []string{string(appendRetryKey(nil, "runs/", keyHeld, until.UnixMilli(), t0.UnixMilli(), 0, "a"))},
		keysUnder(t, mem, "runs/"), "moved to the hold's end once the store takes it")
}

// TestDeadlineKey: a marker with a deadline of its own falls due at it,
// earlier or later than the sweep's Retention would say, and a later
// change of Retention leaves it alone.
func TestDeadlineKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		retention time.Duration
		deadline  time.Duration // after t0
	}{
		{"earlier than Retention", 24 * time.Hour, time.Hour},
		{"later than Retention", time.Hour, 24 * time.Hour},
		{"Retention raised past it", 48 * time.Hour, 2 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, mem, Config{Clear: c.clear, Retention: tc.retention})
			key, err := s.DeadlineKey(t0.Add(tc.deadline), "d")
			require.NoError(t, err)
			require.NoError(t, CheckMarkerKey(key), "the adapters' MarkKeyTx take it")
			require.NoError(t, mem.Put(context.Background(), key, nil))
			mark(t, mem, "runs/", "plain", t0)

			clock.Set(t0.Add(tc.deadline - time.Millisecond))
			_, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Zero(t, c.count("d"), "not before its deadline")
			due, err := s.Pending(context.Background(), 10)
			require.NoError(t, err)
			assert.NotContains(t, ids(due), "d", "not listed before its deadline")

			clock.Set(t0.Add(tc.deadline + time.Millisecond))
			due, err = s.Pending(context.Background(), 10)
			require.NoError(t, err)
			assert.Contains(t, ids(due), "d")
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, c.count("d"), "cleared at its deadline")
			assert.Equal(t, tc.retention < tc.deadline, c.count("plain") == 1, "the plain marker follows Retention")
			assert.Positive(t, st.Cleared)
			assert.LessOrEqual(t, st.MaxLag, 2*time.Millisecond+max(0, tc.deadline-tc.retention), "lag counts from the deadline")
		})
	}
	_, err := DeadlineKey("runs/", t0, "bad id")
	assert.ErrorIs(t, err, ErrInvalidID)
	_, err = DeadlineKey("runs", t0, "a")
	assert.ErrorIs(t, err, ErrMalformedMarker)
	_, err = DeadlineKey("runs/", time.Unix(-1, 0), "a")
	assert.ErrorIs(t, err, ErrInvalidTime)
}

func ids(ms []PendingMarker) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

// TestDryRun: a dry pass calls no clear, deletes and moves nothing, and
// counts the very ids the real pass then clears, on every kind of store
// and through each clear mode.
func TestDryRun(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", kind.name, batch), func(t *testing.T) {
				t.Parallel()
				mem := NewMemKV()
				c := newClears()
				cfg := Config{PageSize: 7, DryRun: true}
				if batch {
					cfg.ClearBatch = func(ctx context.Context, ids []string) error {
						for _, id := range ids {
							_ = c.clear(ctx, id)
						}
						return nil
					}
				} else {
					cfg.Clear = c.clear
				}
				var dryLog []string
				cfg.Logger = slog.New(slog.NewTextHandler(&lineWriter{lines: &dryLog}, nil))
				dry, clock := newSweep(t, kind.wrap(mem), cfg)
				want := markN(t, mem, 30, t0)
				mark(t, mem, "runs/", want[3], t0.Add(4*time.Millisecond))                                       // a duplicate on the same page
				require.NoError(t, mem.Put(context.Background(), []byte("runs/00000000000000000001/bad!"), nil)) // malformed
				mark(t, mem, "runs/", "late", t0.Add(3*time.Hour))                                               // not expired
				before := allKeys(t, mem)

				clock.Set(t0.Add(2 * time.Hour))
				for range 2 {
					st, err := dry.Pass(context.Background())
					require.NoError(t, err)
					assert.Equal(t, 30, st.WouldClear)
					assert.Equal(t, 1, st.Duplicates)
					assert.Equal(t, 1, st.Malformed)
					assert.Zero(t, st.Cleared+st.ClearCalls+st.DeleteCalls+st.PutCalls)
					assert.Zero(t, c.total(), "no clear called")
					assert.Equal(t, before, allKeys(t, mem), "nothing deleted or moved")
				}
				require.NotEmpty(t, dryLog)
				assert.Contains(t, dryLog[len(dryLog)-1], "would_clear=30")

				cfg.DryRun = false
				real, clock2 := newSweep(t, kind.wrap(mem), cfg)
				clock2.Set(clock.Now())
				st, err := real.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, 30, st.Cleared)
				got := slices.Sorted(func(yield func(string) bool) {
					for id := range c.calls {
						if !yield(id) {
							return
						}
					}
				})
				assert.Equal(t, slices.Sorted(slices.Values(want)), got, "the ids the dry run counted")
			})
		}
	}
}

// lineWriter collects what a slog handler writes, a record a line.
type lineWriter struct{ lines *[]string }

func (w *lineWriter) Write(b []byte) (int, error) {
	*w.lines = append(*w.lines, string(bytes.TrimSpace(b)))
	return len(b), nil
}

// allKeys returns every key of mem.
func allKeys(t testing.TB, mem *MemKV) []string {
	t.Helper()
	keys, err := mem.Scan(context.Background(), nil, []byte{0xff}, 1<<30)
	require.NoError(t, err)
	var out []string
	for _, k := range keys {
		out = append(out, string(k))
	}
	return out
}

// TestDryRunRunWaitsInterval: Run in a dry run does not spin over the
// markers that stay due: one pass per Interval.
func TestDryRunRunWaitsInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		passes := 0
		s, err := New(mem, Config{
			Prefix: "runs/", Retention: time.Hour, Interval: 10 * time.Second, DryRun: true,
			Clear: func(context.Context, string) error { return errors.New("called in a dry run") },
			OnPass: func(st Stats, err error) {
				require.NoError(t, err)
				require.Equal(t, 5, st.WouldClear)
				passes++
			},
		})
		require.NoError(t, err)
		markN(t, mem, 5, time.Now().Add(-2*time.Hour))
		ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
		defer cancel()
		require.ErrorIs(t, s.Run(ctx), context.DeadlineExceeded)
		assert.Equal(t, 6, passes, "at 0, 10, ..., 50 s")
		assert.Equal(t, 5, mem.Len())
	})
}

// TestDue lists due, retrying, held and parked markers, the longest
// overdue first, and leaves out what is not due.
func TestDue(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, mem, Config{Clear: c.clear, MaxAttempts: 2, RetryDelay: time.Minute})
	mark(t, mem, "runs/", "failing", t0)
	mark(t, mem, "runs/", "parked", t0.Add(time.Second))
	mark(t, mem, "runs/", "held", t0.Add(2*time.Second))
	c.set("failing", errBoom)
	c.set("parked", errBoom)
	c.set("held", Hold(t0.Add(10*time.Hour)))
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	clock.Advance(2 * time.Minute)
	mark(t, mem, "runs/", "retrying", t0.Add(4*time.Second))
	c.set("retrying", errBoom)
	_, err = s.Pass(context.Background()) // failing and parked fail again: both parked
	require.NoError(t, err)
	mark(t, mem, "runs/", "due", t0.Add(3*time.Second))
	mark(t, mem, "runs/", "notyet", t0.Add(5*time.Hour))

	due, err := s.Pending(context.Background(), 10)
	require.NoError(t, err)
	got := map[string]MarkerState{}
	for _, m := range due {
		got[m.ID] = m.State
	}
	assert.Equal(t, map[string]MarkerState{"failing": StateParked, "parked": StateParked, "retrying": StateRetrying, "held": StateHeld, "due": StateDue}, got)
	assert.True(t, slices.IsSortedFunc(due, func(a, b PendingMarker) int { return a.Due.Compare(b.Due) }))
	assert.Equal(t, "failing", due[0].ID)
	assert.Equal(t, 2, due[0].Attempts)
	for _, m := range due {
		switch m.State {
		case StateHeld:
			assert.Equal(t, t0.Add(10*time.Hour), m.Next)
			assert.Equal(t, t0.Add(2*time.Second+time.Hour), m.Due)
		case StateRetrying:
			assert.Equal(t, 1, m.Attempts)
			assert.True(t, m.Next.After(clock.Now()), "its retry is ahead")
		case StateDue:
			assert.Zero(t, m.Next)
		}
	}
	short, err := s.Pending(context.Background(), 2)
	require.NoError(t, err)
	assert.Equal(t, ids(due[:2]), ids(short))
	_, err = s.Pending(context.Background(), 0)
	assert.Error(t, err)
	assert.Equal(t, "held", StateHeld.String())
}

// TestHeldMarkerIsNotRetrying: a held marker reads as held in Backlog and
// Due whatever its key's kind (a deadline key held after a failure too),
// and a marker rescheduled after a failure or put off in an outage reads
// as retrying, a deadline key too; a deadline not reached is waited for.
func TestHeldMarkerIsNotRetrying(t *testing.T) {
	t.Parallel()
	now := t0.Add(48 * time.Hour)
	deadline := t0.Add(24 * time.Hour)
	for _, tc := range []struct {
		name     string
		kind     byte
		at       time.Time
		finished time.Time
		attempts int
		want     Backlog
		state    MarkerState // in Pending; 0: not listed
	}{
		{"held", keyHeld, now.Add(time.Hour), t0, 1, Backlog{Held: 1}, StateHeld},
		{"held deadline after a failure", keyDeadline | keyHeld, now.Add(30 * 24 * time.Hour), deadline, 1, Backlog{Held: 1}, StateHeld},
		{"held deadline", keyDeadline | keyHeld, now.Add(time.Hour), deadline, 0, Backlog{Held: 1}, StateHeld},
		{"deadline put off in an outage", keyDeadline, now.Add(time.Minute), deadline, 0,
			Backlog{OldestID: "x", OldestDue: deadline, Age: 24 * time.Hour, Retrying: 1, RetryingAge: 24 * time.Hour}, StateRetrying},
		{"deadline retrying", keyDeadline, now.Add(time.Minute), deadline, 2,
			Backlog{OldestID: "x", OldestDue: deadline, Age: 24 * time.Hour, Retrying: 1, RetryingAge: 24 * time.Hour}, StateRetrying},
		{"retrying", 0, now.Add(time.Minute), t0, 1,
			Backlog{OldestID: "x", OldestDue: t0.Add(time.Hour), Age: 47 * time.Hour, Retrying: 1, RetryingAge: 47 * time.Hour}, StateRetrying},
		{"deadline ahead: not due yet, in no count", keyDeadline, now.Add(time.Hour), now.Add(time.Hour), 0, Backlog{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			s, clock := newSweep(t, mem, Config{Clear: newClears().clear})
			clock.Set(now)
			key := appendRetryKey(nil, "runs/", tc.kind, tc.at.UnixMilli(), tc.finished.UnixMilli(), tc.attempts, "x")
			require.NoError(t, mem.Put(context.Background(), key, nil))
			b, err := s.Backlog(context.Background(), 10)
			require.NoError(t, err)
			assert.Equal(t, tc.want, b, "Backlog() of %q", key)
			due, err := s.Pending(context.Background(), 10)
			require.NoError(t, err)
			if tc.state == 0 {
				assert.Empty(t, due)
				return
			}
			require.Len(t, due, 1)
			assert.Equal(t, tc.state, due[0].State, "Pending() state of %q = %v, want %v", key, due[0].State, tc.state)
			assert.True(t, due[0].Next.Equal(time.UnixMilli(tc.at.UnixMilli())), "Next = %v", due[0].Next)
		})
	}

	// The same end to end: a deadline marker that failed once, then held.
	mem := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, mem, Config{Clear: c.clear, RetryDelay: time.Minute})
	key, err := s.DeadlineKey(deadline, "x")
	require.NoError(t, err)
	require.NoError(t, mem.Put(context.Background(), key, nil))
	c.set("x", errBoom)
	clock.Set(deadline.Add(time.Second))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Failed)
	c.set("x", Hold(clock.Now().Add(30*24*time.Hour)))
	clock.Set(st.NextDue.Add(time.Millisecond))
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Held)
	clock.Advance(24 * time.Hour)
	b, err := s.Backlog(context.Background(), 10)
	require.NoError(t, err)
	assert.Equal(t, Backlog{Held: 1}, b, "a day into the hold")
	due, err := s.Pending(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	assert.Equal(t, StateHeld, due[0].State)
}

// TestHoldWaitsForRaisedRetention: a hold only ever keeps an entity
// longer. When Retention is raised after an entity was held (1h -> 48h),
// the held marker waits for the new Retention, in Pass and in Pending alike.
func TestHoldWaitsForRaisedRetention(t *testing.T) {
	t.Parallel()
	for _, kind := range writingKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, kind.wrap(mem), Config{Clear: c.clear})
			mark(t, mem, "runs/", "a", t0)
			c.set("a", Hold(t0.Add(5*time.Hour)))
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, st.Held)
			c.set("a", nil)

			// The operator raises Retention to 48h; the process restarts.
			s2, clock2 := newSweep(t, kind.wrap(mem), Config{Clear: c.clear, Retention: 48 * time.Hour})
			clock2.Set(t0.Add(5*time.Hour + time.Minute))
			_, err = s2.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, c.count("a"), "cleared at the hold's end, before the raised Retention ran out (finished t0, Retention 48h)")
			due, err := s2.Pending(context.Background(), 10)
			require.NoError(t, err)
			assert.NotContains(t, ids(due), "a", "not due under a 48h Retention")

			clock2.Set(t0.Add(48*time.Hour + time.Minute))
			_, err = s2.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 2, c.count("a"), "cleared once the raised Retention ran out")
		})
	}
}

// TestHoldAgainKeepsFinishTime: a held marker held again at its hold's end
// keeps the entity's finish time in its key: ParseMarkerKey reads it back
// and Due reports it due at finished+Retention.
func TestHoldAgainKeepsFinishTime(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, mem, Config{Clear: c.clear})
	mark(t, mem, "runs/", "a", t0)
	c.set("a", Hold(t0.Add(5*time.Hour)))
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)

	c.set("a", Hold(t0.Add(10*time.Hour)))
	clock.Set(t0.Add(5*time.Hour + time.Millisecond))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Held)

	keys := keysUnder(t, mem, "runs/r")
	require.Len(t, keys, 1)
	finished, id, err := ParseMarkerKey("runs/", []byte(keys[0]))
	require.NoError(t, err)
	assert.Equal(t, "a", string(id))
	assert.Equal(t, t0, finished, "the held key keeps the entity's finish time: %q", keys[0])

	due, err := s.Pending(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	assert.Equal(t, StateHeld, due[0].State)
	assert.Equal(t, t0.Add(time.Hour), due[0].Due, "due at finished+Retention, as after the first hold")
}

// TestHeldDuplicateOnLaterPageSurvivesRestart: a second marker of a held
// id on a later page of the pass goes with the held key, so a restarted
// sweep does not find it due and ask Clear before the hold's end.
func TestHeldDuplicateOnLaterPageSurvivesRestart(t *testing.T) {
	t.Parallel()
	for _, kind := range writingKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			until := t0.Add(10 * time.Hour)
			s, clock := newSweep(t, kind.wrap(mem), Config{Clear: c.clear, PageSize: 2})
			mark(t, mem, "runs/", "a", t0)
			mark(t, mem, "runs/", "b", t0.Add(time.Millisecond))
			mark(t, mem, "runs/", "a", t0.Add(2*time.Millisecond)) // page 2
			c.set("a", Hold(until))
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, st.Held)
			require.Equal(t, 1, c.count("a"))
			c.set("a", nil) // were Clear asked again, it would clear

			// The same process leaves it alone ...
			clock.Set(t0.Add(3 * time.Hour))
			_, err = s.Pass(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, c.count("a"))

			// ... a restarted one should too.
			s2, clock2 := newSweep(t, kind.wrap(mem), Config{Clear: c.clear, PageSize: 2})
			clock2.Set(t0.Add(3 * time.Hour))
			_, err = s2.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, c.count("a"), "a restarted sweep tried the held id 7h before its hold ends")
		})
	}
}

// TestHeldDuplicatesOnOnePageGoWithTheFirst: duplicates of a held id on
// the same page go with the first marker, on every kind of store; only one
// marker of the id is left, and it is not tried before until, then
// cleared once.
func TestHeldDuplicatesOnOnePageGoWithTheFirst(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			until := t0.Add(10 * time.Hour)
			s, clock := newSweep(t, kind.wrap(mem), Config{Clear: c.clear})
			mark(t, mem, "runs/", "a", t0)
			mark(t, mem, "runs/", "a", t0.Add(time.Millisecond))
			mark(t, mem, "runs/", "a", t0.Add(2*time.Millisecond))
			c.set("a", Hold(until))
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Held)
			assert.Zero(t, st.Failed+st.Cleared)
			if kind.writes {
				assert.Equal(t, map[string]int{"a": 1}, markerIDs(t, mem, "runs/"))
			} else {
				assert.Positive(t, markerIDs(t, mem, "runs/")["a"], "the first marker stays")
			}
			c.set("a", nil)
			clock.Set(until.Add(-time.Second))
			_, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, c.count("a"))
			clock.Set(until.Add(time.Millisecond))
			_, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 2, c.count("a"), "cleared once after the hold")
			assert.Empty(t, markerIDs(t, mem, "runs/"))
		})
	}
}

// TestDryRunWritesNothingWhenValidateIDPanics: a Config.ValidateID that
// panics makes its marker fail; in a dry run that failure is counted, and
// nothing is rescheduled, parked or deleted, even with MaxAttempts 1.
func TestDryRunWritesNothingWhenValidateIDPanics(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			cfg := Config{
				Clear: c.clear, DryRun: true,
				ValidateID: func(id string) error {
					if id == "boom" {
						panic("validate")
					}
					return nil
				},
			}
			if kind.writes {
				cfg.MaxAttempts = 1 // on a Putter the dry run even parks it
			}
			s, clock := newSweep(t, kind.wrap(mem), cfg)
			mark(t, mem, "runs/", "a", t0)
			mark(t, mem, "runs/", "boom", t0.Add(time.Millisecond))
			before := allKeys(t, mem)
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.WouldClear)
			assert.Zero(t, st.PutCalls+st.DeleteCalls+st.ClearCalls, "a dry run writes nothing")
			assert.Equal(t, before, allKeys(t, mem), "a dry run touches no key")
			assert.Zero(t, c.total())
		})
	}
}

// TestDryRunInGroupWaitsInterval: a dry member of a Group passes once per
// Interval, whatever work the group's other members have.
func TestDryRunInGroupWaitsInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemKV()
		dryPasses := 0
		dry, err := New(mem, Config{
			Prefix: "dry/", Retention: time.Hour, Interval: 10 * time.Second, DryRun: true,
			Clear:  func(context.Context, string) error { return errors.New("called in a dry run") },
			OnPass: func(Stats, error) { dryPasses++ },
		})
		require.NoError(t, err)
		real, err := New(mem, Config{
			Prefix: "real/", Retention: time.Hour, Interval: 10 * time.Second,
			Clear: func(context.Context, string) error { return nil },
		})
		require.NoError(t, err)
		now := time.Now()
		for i := range 5 {
			mark(t, mem, "dry/", fmt.Sprintf("d%d", i), now.Add(-2*time.Hour))
		}
		for i := 1; i <= 100; i++ {
			mark(t, mem, "real/", fmt.Sprintf("r%03d", i), now.Add(-time.Hour+time.Duration(i)*100*time.Millisecond))
		}
		g, err := NewGroup(GroupConfig{}, dry, real)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 9500*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, g.Run(ctx), context.DeadlineExceeded)
		assert.LessOrEqual(t, dryPasses, 2, "one dry pass per Interval (10s), whatever the real member does")
	})
}

// TestFailedDeadlineMarkerKeepsItsDeadline: a DeadlineKey marker falls due
// at its deadline whatever Retention says, also after its clear failed
// once: raised to 48h, Retention does not delay its retry, and Due lists
// it.
func TestFailedDeadlineMarkerKeepsItsDeadline(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	deadline := t0.Add(2 * time.Hour)
	s, clock := newSweep(t, mem, Config{Clear: c.clear, RetryDelay: time.Minute})
	key, err := s.DeadlineKey(deadline, "d")
	require.NoError(t, err)
	require.NoError(t, mem.Put(context.Background(), key, nil))
	c.set("d", errBoom)
	clock.Set(deadline.Add(time.Millisecond))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Failed)
	c.set("d", nil)

	s2, clock2 := newSweep(t, mem, Config{Clear: c.clear, Retention: 48 * time.Hour})
	clock2.Set(deadline.Add(10 * time.Minute))
	due, err := s2.Pending(context.Background(), 10)
	require.NoError(t, err)
	assert.Contains(t, ids(due), "d", "past its deadline: due whatever the Retention")
	_, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, c.count("d"), "a deadline marker whose clear failed once is retried at its retry time, not at finished+Retention")
}

// TestAttemptsAcrossHoldSameWithRestart: fail, hold, fail parks an id or
// not the same way whether the process restarted during the hold or not.
func TestAttemptsAcrossHoldSameWithRestart(t *testing.T) {
	t.Parallel()
	run := func(restart bool) int {
		mem := NewMemKV()
		c := newClears()
		cfg := Config{Clear: c.clear, MaxAttempts: 2, RetryDelay: time.Minute}
		s, clock := newSweep(t, mem, cfg)
		mark(t, mem, "runs/", "a", t0)
		c.set("a", errBoom)
		clock.Set(t0.Add(2 * time.Hour))
		_, err := s.Pass(context.Background()) // failure 1
		require.NoError(t, err)
		c.set("a", Hold(t0.Add(5*time.Hour)))
		clock.Set(t0.Add(3 * time.Hour))
		st, err := s.Pass(context.Background()) // held
		require.NoError(t, err)
		require.Equal(t, 1, st.Held)
		if restart {
			s, clock = newSweep(t, mem, cfg)
		}
		c.set("a", errBoom)
		clock.Set(t0.Add(6 * time.Hour))
		st, err = s.Pass(context.Background()) // failure 2 (or 1)
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed)
		return st.Parked
	}
	assert.Equal(t, run(true), run(false), "parked after fail-hold-fail with a restart during the hold vs without")
}

// TestHoldTimeBounds: a hold beyond MaxMarkerTime waits at MaxMarkerTime,
// one before the epoch means "after RetryDelay", and a Hold wrapped in
// another error is still a hold with its time.
func TestHoldTimeBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		at   func(now time.Time) time.Time // where the held key falls due
	}{
		{"beyond MaxMarkerTime", Hold(MaxMarkerTime.Add(365 * 24 * time.Hour)), func(time.Time) time.Time { return MaxMarkerTime }},
		{"before the epoch", Hold(time.Unix(-100, 0)), func(now time.Time) time.Time { return now.Add(time.Minute) }},
		{"wrapped", fmt.Errorf("tenant t1: %w", Hold(t0.Add(7*time.Hour))), func(time.Time) time.Time { return t0.Add(7 * time.Hour) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			c := newClears()
			logs := &levelCounter{}
			s, clock := newSweep(t, mem, Config{Clear: c.clear, RetryDelay: time.Minute, Logger: slog.New(logs)})
			mark(t, mem, "runs/", "a", t0)
			c.set("a", tc.err)
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Held)
			assert.Zero(t, st.Failed+st.Retried+st.FailedCalls)
			assert.Empty(t, logs.msgs)
			keys := keysUnder(t, mem, "runs/r")
			require.Len(t, keys, 1)
			k, _, err := parseRetryKey("runs/", retryInfix, []byte(keys[0]))
			require.NoError(t, err)
			assert.Equal(t, byte(keyHeld), k.kind)
			assert.Equal(t, tc.at(clock.Now()).UnixMilli(), k.at)
			assert.Equal(t, t0.UnixMilli(), k.finished)
			require.NoError(t, CheckMarkerKey([]byte(keys[0])))
			_, id, err := ParseMarkerKey("runs/", []byte(keys[0]))
			require.NoError(t, err)
			assert.Equal(t, "a", string(id))
		})
	}
}

// TestDryRunCountsWhatRealPassClears: with markers of the retry range (a
// failed one due again), a deadline key due, one not due, a held key not
// due and duplicates across pages, the dry run counts exactly the ids the
// real pass then clears, calls no Limiter and makes no clear call.
func TestDryRunCountsWhatRealPassClears(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	kv := mem
	prep, clock := newSweep(t, kv, Config{Clear: c.clear, RetryDelay: time.Minute})
	mark(t, mem, "runs/", "failing", t0)
	mark(t, mem, "runs/", "held", t0)
	c.set("failing", errBoom)
	c.set("held", Hold(t0.Add(20*time.Hour)))
	clock.Set(t0.Add(2 * time.Hour))
	_, err := prep.Pass(context.Background())
	require.NoError(t, err)
	c = newClears()

	dk, err := DeadlineKey("runs/", t0.Add(90*time.Minute), "deadline")
	require.NoError(t, err)
	require.NoError(t, mem.Put(context.Background(), dk, nil))
	nk, err := DeadlineKey("runs/", t0.Add(30*time.Hour), "notyet")
	require.NoError(t, err)
	require.NoError(t, mem.Put(context.Background(), nk, nil))
	want := markN(t, mem, 12, t0)
	mark(t, mem, "runs/", "b0001", t0.Add(50*time.Millisecond)) // a duplicate on a later page
	mark(t, mem, "runs/", "failing", t0.Add(60*time.Millisecond))
	want = append(want, "deadline", "failing")

	lim := rate.NewLimiter(rate.Every(time.Hour), 3)
	cfg := Config{Clear: c.clear, PageSize: 5, DryRun: true, Limiter: lim}
	dry, dclock := newSweep(t, kv, cfg)
	dclock.Set(t0.Add(2*time.Hour + 5*time.Minute))
	before := allKeys(t, mem)
	st, err := dry.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, len(want)+2, st.WouldClear, "b0001 and failing counted twice, as the real pass clears them")
	assert.Zero(t, st.ClearCalls+st.DeleteCalls+st.PutCalls+st.Cleared)
	assert.Zero(t, st.BudgetWait)
	assert.InDelta(t, 3, lim.Tokens(), 0.01, "the Limiter is not asked")
	assert.Equal(t, before, allKeys(t, mem))

	cfg.DryRun, cfg.Limiter = false, nil
	real, rclock := newSweep(t, kv, cfg)
	rclock.Set(dclock.Now())
	st2, err := real.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, st.WouldClear, st2.Cleared)
	assert.Equal(t, st.Duplicates, st2.Duplicates)
	var got []string
	for id := range c.calls {
		got = append(got, id)
	}
	assert.ElementsMatch(t, want, got)
	for _, id := range want {
		// A second marker of an id on a later page, or in the other
		// range, is cleared again, in the dry run's count too.
		n := 1
		if id == "b0001" || id == "failing" {
			n = 2
		}
		assert.Equal(t, n, c.count(id), id)
	}
	assert.Zero(t, c.count("held"))
	assert.Zero(t, c.count("notyet"))
}

// TestDeadlineKeyAtTimeBounds: deadline keys at the bounds of time are
// accepted by CheckMarkerKey (so the adapters' MarkKeyTx take them) and
// read back by ParseMarkerKey, and a sweep of a neighbouring prefix leaves
// them alone.
func TestDeadlineKeyAtTimeBounds(t *testing.T) {
	t.Parallel()
	for _, at := range []time.Time{epoch, t0, MaxMarkerTime} {
		key, err := DeadlineKey("runs/", at, "a")
		require.NoError(t, err)
		assert.NoError(t, CheckMarkerKey(key), "%q", key)
		got, id, err := ParseMarkerKey("runs/", key)
		require.NoError(t, err)
		assert.Equal(t, "a", string(id))
		assert.Equal(t, at.UnixMilli(), got.UnixMilli())
	}
	_, err := DeadlineKey("runs/", MaxMarkerTime.Add(time.Millisecond), "a")
	assert.ErrorIs(t, err, ErrInvalidTime)

	mem := NewMemKV()
	other := newClears()
	key, err := DeadlineKey("runs/", t0, "a")
	require.NoError(t, err)
	require.NoError(t, mem.Put(context.Background(), key, nil))
	o, clock := newSweep(t, mem, Config{Prefix: "runs/r/", Clear: other.clear})
	clock.Set(t0.Add(time.Hour * 3))
	st, err := o.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.Malformed+st.Foreign+other.total())
	assert.Equal(t, 1, mem.Len())
}

// TestReleaseHoldsMovesOnlyHeldKeysOfTheIDs: ReleaseHolds moves the held
// keys of the ids asked for, and only those, to keys due at once that keep
// the finish time (a deadline, and its kind), the failed attempts and the
// held letter; it counts the markers it moved.
func TestReleaseHoldsMovesOnlyHeldKeysOfTheIDs(t *testing.T) {
	t.Parallel()
	now := t0.Add(5 * time.Hour)
	until := now.Add(24 * time.Hour)
	finished := t0.UnixMilli()
	deadline := t0.Add(2 * time.Hour).UnixMilli()
	// The store: a marker of each state, each of its own id.
	keys := map[string][]byte{
		"held":          appendRetryKey(nil, "runs/", keyHeld, until.UnixMilli(), finished, 2, "held"),
		"held-deadline": appendRetryKey(nil, "runs/", keyDeadline|keyHeld, until.UnixMilli(), deadline, 0, "held-deadline"),
		"hold-ended":    appendRetryKey(nil, "runs/", keyHeld, now.Add(-time.Minute).UnixMilli(), finished, 0, "hold-ended"),
		"retrying":      appendRetryKey(nil, "runs/", 0, now.Add(time.Minute).UnixMilli(), finished, 1, "retrying"),
		"deadline":      appendRetryKey(nil, "runs/", keyDeadline, until.UnixMilli(), until.UnixMilli(), 0, "deadline"),
		"parked":        appendParkedKey(nil, "runs/", 0, finished, 3, "parked"),
	}
	nowMs := now.UnixMilli() - 1
	released := map[string][]byte{
		"held":          appendRetryKey(nil, "runs/", keyHeld, nowMs, finished, 2, "held"),
		"held-deadline": appendRetryKey(nil, "runs/", keyDeadline|keyHeld, nowMs, deadline, 0, "held-deadline"),
	}
	tests := []struct {
		name string
		ids  []string
		want []string // the ids whose markers it moves
	}{
		{"one held id", []string{"held"}, []string{"held"}},
		{"a held deadline keeps its deadline", []string{"held-deadline"}, []string{"held-deadline"}},
		{"every state asked for", []string{"held", "held-deadline", "hold-ended", "retrying", "deadline", "parked", "due", "nope"}, []string{"held", "held-deadline"}},
		{"an id twice", []string{"held", "held"}, []string{"held"}},
		{"nothing held of the ids", []string{"retrying", "parked", "due"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			mem := NewMemKV()
			for _, k := range keys {
				require.NoError(t, mem.Put(ctx, k, nil))
			}
			due := mark(t, mem, "runs/", "due", t0)
			s, clock := newSweep(t, mem, Config{Clear: newClears().clear})
			clock.Set(now)
			want := []string{string(due)}
			for id, k := range keys {
				if slices.Contains(tt.want, id) {
					k = released[id]
				}
				want = append(want, string(k))
			}
			n, err := s.ReleaseHolds(ctx, tt.ids...)
			require.NoError(t, err)
			assert.Equal(t, len(tt.want), n, "ReleaseHolds(%q) = %d, want %d", tt.ids, n, len(tt.want))
			assert.ElementsMatch(t, want, keysUnder(t, mem, "runs/"))

			pending, err := s.Pending(ctx, 100)
			require.NoError(t, err)
			for _, m := range pending {
				if slices.Contains(tt.want, m.ID) {
					assert.Equal(t, StateDue, m.State, "Pending() state of released %s", m.ID)
					assert.True(t, m.Next.IsZero(), "Pending() next try of released %s = %v", m.ID, m.Next)
				}
			}
		})
	}
}

// TestReleaseHoldsClearsOnTheNextPass: a released marker is cleared by the
// next pass of the Sweep that held it, which its memory said to keep until
// the hold's end; a Clear that still answers Hold holds it again, until the
// end it returns, with its finish time and attempts. A held deadline marker
// is cleared too, and no lag is counted for the time it was held.
func TestReleaseHoldsClearsOnTheNextPass(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		after error // Clear's answer once released
	}{
		{"hold lifted", nil},
		{"held again", Hold(t0.Add(48 * time.Hour))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			mem := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, mem, Config{Clear: c.clear})
			mark(t, mem, "runs/", "a", t0)
			dl, err := s.DeadlineKey(t0.Add(30*time.Minute), "d")
			require.NoError(t, err)
			require.NoError(t, mem.Put(ctx, dl, nil))
			for _, id := range []string{"a", "d"} {
				c.set(id, Hold(t0.Add(24*time.Hour)))
			}
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, st.Held)

			clock.Advance(time.Hour)
			n, err := s.ReleaseHolds(ctx, "a", "d")
			require.NoError(t, err)
			require.Equal(t, 2, n)
			for _, id := range []string{"a", "d"} {
				c.set(id, tt.after)
			}
			clock.Advance(time.Millisecond)
			st, err = s.Pass(ctx)
			require.NoError(t, err)
			for _, id := range []string{"a", "d"} {
				assert.Equal(t, 2, c.count(id), "Clear of %s asked again, a day before the hold's end", id)
			}
			if tt.after == nil {
				assert.Equal(t, 2, st.Cleared)
				assert.Less(t, st.MaxLag, time.Second, "the lag of a released hold counts from its release")
				assert.Empty(t, keysUnder(t, mem, "runs/"))
				return
			}
			assert.Equal(t, 2, st.Held)
			assert.ElementsMatch(t, []string{
				string(appendRetryKey(nil, "runs/", keyHeld, t0.Add(48*time.Hour).UnixMilli(), t0.UnixMilli(), 0, "a")),
				string(appendRetryKey(nil, "runs/", keyDeadline|keyHeld, t0.Add(48*time.Hour).UnixMilli(), t0.Add(30*time.Minute).UnixMilli(), 0, "d")),
			}, keysUnder(t, mem, "runs/"), "held again until the new end")
		})
	}
}

// TestReleasedHoldIsClearedByTheReplicaThatHeldIt: a hold released through
// another Sweep over the same store (a replica without the lease) is
// cleared by the next pass of the Sweep whose memory holds it: the store
// wins.
func TestReleasedHoldIsClearedByTheReplicaThatHeldIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemKV()
	c := newClears()
	until := t0.Add(365 * 24 * time.Hour)
	holder, clock := newSweep(t, mem, Config{Clear: c.clear})
	other, err := New(mem, Config{Prefix: "runs/", Retention: time.Hour, Clock: clock, Clear: c.clear})
	require.NoError(t, err)
	mark(t, mem, "runs/", "a", t0)
	c.set("a", Hold(until))
	clock.Set(t0.Add(2 * time.Hour))
	st, err := holder.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Held)
	require.True(t, holder.retries.byID["a"].stored, "the holder's memory has the hold, in the store")

	n, err := other.ReleaseHolds(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	c.set("a", nil)
	clock.Advance(time.Millisecond)
	st, err = holder.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "the holder's memory said held until %v", until)
	assert.Equal(t, 2, c.count("a"))
	assert.Empty(t, keysUnder(t, mem, "runs/"))
	assert.Empty(t, holder.retries.byID, "the hold forgotten")
}

// TestConcurrentReleasesCountEachMarkerOnce: ReleaseHolds answers how many
// markers its own Move moved: of releases (and requeues) racing over a
// slow Move, only one counts each marker, and each is moved once.
func TestConcurrentReleasesCountEachMarkerOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFakeKV(nil)
		until := t0.Add(48 * time.Hour).UnixMilli()
		for _, id := range []string{"a", "b"} {
			require.NoError(t, f.Put(ctx, appendRetryKey(nil, "runs/", keyHeld, until, t0.UnixMilli(), 0, id), nil))
		}
		require.NoError(t, f.Put(ctx, appendParkedKey(nil, "runs/", 0, t0.UnixMilli(), 1, "p"), nil))
		f.setHooks(nil, nil, func(context.Context, int64) error {
			time.Sleep(100 * time.Millisecond) // a store's round trip, in the bubble's time
			return nil
		})
		s, clock := newSweep(t, f.store(), Config{Clear: newClears().clear, MaxAttempts: 1})
		clock.Set(t0.Add(2 * time.Hour))
		released, requeued := make([]int, 12), make([]int, 12)
		var wg sync.WaitGroup
		for i := range released {
			wg.Go(func() {
				n, err := s.ReleaseHolds(ctx, "a", "b", "p")
				assert.NoError(t, err)
				released[i] = n
			})
			wg.Go(func() {
				n, err := s.Requeue(ctx, "a", "p")
				assert.NoError(t, err)
				requeued[i] = n
			})
		}
		wg.Wait()
		sum := func(ns []int) (total int) {
			for _, n := range ns {
				total += n
			}
			return total
		}
		assert.Equal(t, 2, sum(released), "ReleaseHolds() = %v from 12 callers, want 2 in all", released)
		assert.Equal(t, 1, sum(requeued), "Requeue() = %v from 12 callers, want 1 in all", requeued)
		assert.Equal(t, map[string]int{"a": 1, "b": 1, "p": 1}, markerIDs(t, f, "runs/"), "markers per id")
		pending, err := s.Pending(ctx, 10)
		require.NoError(t, err)
		for _, m := range pending {
			assert.NotEqual(t, StateHeld, m.State, "%s still held", m.ID)
			assert.NotEqual(t, StateParked, m.State, "%s still parked", m.ID)
		}
	})
}

// TestReleaseHoldsRefusesBadInput: no ids, an id the sweep's rule refuses,
// a KV that is no Mover, a Sweep not made by New and a context done each
// give an error that says so, and move nothing.
func TestReleaseHoldsRefusesBadInput(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	held := appendRetryKey(nil, "runs/", keyHeld, t0.Add(48*time.Hour).UnixMilli(), t0.UnixMilli(), 0, "a")
	require.NoError(t, mem.Put(context.Background(), held, nil))
	mover, _ := newSweep(t, mem, Config{Clear: newClears().clear})
	ruled, _ := newSweep(t, mem, Config{Clear: newClears().clear, ValidateID: func(id string) error {
		if !strings.HasPrefix(id, "run-") {
			return errors.New("want run-N")
		}
		return nil
	}})
	putOnly, _ := newSweep(t, putOnlyKV{mem, mem}, Config{Clear: newClears().clear})
	readOnly, _ := newSweep(t, readOnlyKV{mem}, Config{Clear: newClears().clear})
	done, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		s    *Sweep
		ctx  context.Context
		ids  []string
		is   error
		msg  string
	}{
		{"no ids", mover, context.Background(), nil, nil, "needs the ids"},
		{"empty id", mover, context.Background(), []string{"a", ""}, ErrInvalidID, `id ""`},
		{"id the default rule refuses", mover, context.Background(), []string{"a b"}, ErrInvalidID, `id "a b"`},
		{"id the sweep's rule refuses", ruled, context.Background(), []string{"a"}, ErrInvalidID, "want run-N"},
		{"a Putter that is no Mover", putOnly, context.Background(), []string{"a"}, nil, "is no Mover"},
		{"a read-only KV", readOnly, context.Background(), []string{"a"}, nil, "is no Mover"},
		{"not made by New", &Sweep{}, context.Background(), []string{"a"}, ErrNotConfigured, "ReleaseHolds"},
		{"context done", mover, done, []string{"a"}, context.Canceled, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := tt.s.ReleaseHolds(tt.ctx, tt.ids...)
			require.Error(t, err)
			assert.Zero(t, n)
			if tt.is != nil {
				assert.ErrorIs(t, err, tt.is)
			}
			assert.Contains(t, err.Error(), tt.msg)
			assert.Equal(t, []string{string(held)}, keysUnder(t, mem, "runs/"), "nothing moved")
		})
	}
}

// heldRunKV returns a runKV holding n markers finished at t0 (markN), whose
// clear answers Hold(until) for the first of them while held is set, and
// counts the calls that asked for it.
func heldRunKV(t *testing.T, n int, until time.Time) (kv *runKV, ids []string, held *atomic.Bool, asked *atomic.Int32) {
	kv, ids = newRunKV(t, n)
	held, asked = new(atomic.Bool), new(atomic.Int32)
	held.Store(true)
	kv.before = func(_ context.Context, _ int, batch []string, _ [][]byte) error {
		if !slices.Contains(batch, ids[0]) {
			return nil
		}
		asked.Add(1)
		if held.Load() {
			return BatchError{ids[0]: Hold(until)}
		}
		return nil
	}
	return kv, ids, held, asked
}

// TestMovedHoldKeepsNoRunsOff: over a RunClearer, an id held for a year
// keeps runs off only while its marker may be in the markers' range. Once
// the marker is moved to its held key, the rest of the pass and the next
// passes clear in runs; while its Move fails, the sweep reads pages, and
// the pass that moves it goes back to runs; a marker that never moves
// keeps them off until the hold's end. The held id is never asked again
// before then.
func TestMovedHoldKeepsNoRunsOff(t *testing.T) {
	t.Parallel()
	until := t0.Add(365 * 24 * time.Hour)
	for _, tc := range []struct {
		name       string
		moveFails  int64 // Moves that fail, from the first; -1: all
		noMover    bool  // the store cannot Move: holds kept in memory
		firstRuns  int64 // ClearRun calls of the pass that meets the hold
		secondRuns int64 // of the next pass, with 20 more markers
	}{
		// The refused run; then runs of 10, 10, and one that finds the
		// range empty.
		{"moved", 0, false, 4, 3},
		// Pages after the refused run; the next pass moves the marker on
		// its first page, then clears the other 11 markers in runs of 10
		// and 1.
		{"move failed once", 1, false, 1, 2},
		{"move always fails", -1, false, 1, 0},
		{"store cannot move", 0, true, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			kv, ids, held, asked := heldRunKV(t, 30, until)
			kv.onMove = func(_ context.Context, call int64) error {
				if tc.moveFails < 0 || call <= tc.moveFails {
					return errBoom
				}
				return nil
			}
			var store KV = kv
			if tc.noMover {
				store = unmovingRunKV{kv}
			}
			s, clock := newSweep(t, store, Config{BatchSize: 10, PageSize: 10})
			clock.Set(t0.Add(2 * time.Hour))

			st, err := s.Pass(ctx)
			require.NoError(t, err)
			assert.Equal(t, 1, st.Held)
			assert.Equal(t, 29, st.Cleared)
			assert.Equal(t, tc.firstRuns, kv.runs.Load(), "ClearRun calls of the pass that met the hold")

			for i := range 20 {
				id := fmt.Sprintf("n%02d", i)
				mark(t, kv.MemKV, "runs/", id, t0.Add(time.Minute+time.Duration(i)*time.Millisecond))
				kv.entities[id] = true
			}
			clock.Advance(time.Hour)
			before := kv.runs.Load()
			st, err = s.Pass(ctx)
			require.NoError(t, err)
			assert.Equal(t, 20, st.Cleared)
			assert.Equal(t, tc.secondRuns, kv.runs.Load()-before, "ClearRun calls of the next pass")
			assert.Equal(t, int32(1), asked.Load(), "%s asked again before the hold's end", ids[0])
			heldKey := string(appendRetryKey(nil, "runs/", keyHeld, until.UnixMilli(), t0.UnixMilli(), 0, ids[0]))
			if stays := tc.moveFails < 0 || tc.noMover; stays {
				assert.Len(t, keysUnder(t, kv, "runs/0"), 1, "the held marker stays where it was")
			} else {
				assert.Equal(t, []string{heldKey}, keysUnder(t, kv, "runs/"), "only the held marker is left, at its held key")
			}

			// At the hold's end the held id is asked again, and cleared.
			held.Store(false)
			clock.Set(until.Add(time.Millisecond))
			before = kv.runs.Load()
			st, err = s.Pass(ctx)
			require.NoError(t, err)
			assert.Equal(t, 1, st.Cleared)
			assert.Equal(t, int32(2), asked.Load())
			assert.Equal(t, 1, kv.cleared[ids[0]], "%s cleared once", ids[0])
			if tc.moveFails < 0 || tc.noMover {
				assert.Positive(t, kv.runs.Load()-before, "a run takes the marker once the hold is over")
			}
			assert.Empty(t, keysUnder(t, kv, "runs/"))
		})
	}
}

// unmovingRunKV is a runKV that cannot Move.
type unmovingRunKV struct{ r *runKV }

func (u unmovingRunKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return u.r.Scan(ctx, start, end, limit)
}
func (u unmovingRunKV) Delete(ctx context.Context, keys ...[]byte) error {
	return u.r.Delete(ctx, keys...)
}
func (u unmovingRunKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return u.r.ClearAndDelete(ctx, ids, keys)
}
func (u unmovingRunKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return u.r.ClearRun(ctx, prefix, from, end, limit)
}
func (u unmovingRunKV) RunStore() RunClearer { return u }

// TestHoldOfAPassCutShortKeepsRunsOff: a hold met in a page the pass
// leaves unsettled is kept in memory with its marker where it was, so the
// next pass takes no run over it: it reads the page, moves the marker to
// its held key without asking again, and then clears in runs.
func TestHoldOfAPassCutShortKeepsRunsOff(t *testing.T) {
	t.Parallel()
	until := t0.Add(365 * 24 * time.Hour)
	kv, ids, _, asked := heldRunKV(t, 30, until)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := kv.before
	kv.before = func(ctx context.Context, call int, batch []string, keys [][]byte) error {
		if call == 2 { // the refused run's other ids, sent again
			cancel()
			return ctx.Err()
		}
		return held(ctx, call, batch, keys)
	}
	s, clock := newSweep(t, kv, Config{BatchSize: 10, PageSize: 10})
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(1), kv.runs.Load())
	require.Len(t, keysUnder(t, kv, "runs/"), 30, "nothing settled")

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int32(1), asked.Load(), "%s asked again before the hold's end", ids[0])
	assert.Equal(t, 29, st.Cleared)
	assert.Equal(t, int64(1+3), kv.runs.Load(), "a page, then runs of 10, 10 and an empty one")
	assert.Equal(t, []string{string(appendRetryKey(nil, "runs/", keyHeld, until.UnixMilli(), t0.UnixMilli(), 0, ids[0]))},
		keysUnder(t, kv, "runs/"))
}

// TestRetryOfAHeldIDIsNoRelease: an id whose first marker failed (moved to
// the retry range) and whose second is held then: the retry key falling
// due before the hold's end is no release of the hold (only ReleaseHolds
// makes a held key due early), so Clear is not asked again before the
// end, and both markers wait for it.
func TestRetryOfAHeldIDIsNoRelease(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	c := newClears()
	until := t0.Add(24 * time.Hour)
	s, clock := newSweep(t, mem, Config{Clear: c.clear, PageSize: 2, RetryDelay: time.Minute, MaxRetryDelay: time.Minute})
	mark(t, mem, "runs/", "a", t0)
	mark(t, mem, "runs/", "b", t0.Add(time.Millisecond))
	mark(t, mem, "runs/", "a", t0.Add(2*time.Millisecond)) // page 2
	c.set("a", errBoom)
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Failed)
	require.Equal(t, 1, st.Deferred, "the second marker waits for the first's delay")

	c.set("a", Hold(until))
	clock.Advance(2 * time.Minute)
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Held, "the second marker")
	assert.Equal(t, 2, c.count("a"), "Clear asked again for a hold before its end")
	for _, key := range keysUnder(t, mem, "runs/") {
		k, _, err := parseRetryKey("runs/", retryInfix, []byte(key))
		require.NoError(t, err)
		assert.NotZero(t, k.kind&keyHeld, "%q waits for the hold", key)
		assert.Equal(t, until.UnixMilli(), k.at, "%q waits for the hold", key)
	}
}
