package retention

// Adversarial review of issue 19 (holds, deadlines of their own, dry runs,
// Sweep.Due): 09e66ad..365ffef. Each test says what it checks; a test that
// fails on the code it was written against is a finding (see the comment
// above it), one that passes confirms a behaviour worth keeping.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// writingKinds are the store kinds on which a hold is written to the store
// and promised to survive a restart.
var review19WritingKinds = []struct {
	name string
	wrap func(*MemKV) KV
}{
	{"Mover", func(m *MemKV) KV { return m }},
}

// retryKeys returns the keys of mem's retry range under "runs/".
func review19RetryKeys(t *testing.T, mem *MemKV) []string {
	t.Helper()
	keys, err := mem.Scan(context.Background(), []byte("runs/r"), []byte("runs/s"), 1000)
	require.NoError(t, err)
	var out []string
	for _, k := range keys {
		out = append(out, string(k))
	}
	return out
}

// FINDING (never early). TestReview19HoldRespectsRaisedRetention: a hold
// only ever keeps an entity longer. When Retention is raised after an
// entity was held (1h -> 48h), the held marker must wait for the new
// retention as a plain or rescheduled marker does ("Changing Retention
// applies to every marker already written ... waits if a raised Retention
// says it is not due yet"). parsePage skips the notExpired check for every
// key with h/, so the held marker is cleared at the hold's end, 43h before
// its retention runs out. Fix: tell a hold from a deadline of its own (a
// distinct tag, e.g. d/ for DeadlineKey), and for a hold apply the Retention
// check: due at max(until, finished+Retention); Due and Backlog alike.
func TestReview19HoldRespectsRaisedRetention(t *testing.T) {
	t.Parallel()
	for _, kind := range review19WritingKinds {
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
			due, err := s2.Due(context.Background(), 10)
			require.NoError(t, err)
			assert.NotContains(t, ids(due), "a", "not due under a 48h Retention")

			clock2.Set(t0.Add(48*time.Hour + time.Minute))
			_, err = s2.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 2, c.count("a"), "cleared once the raised Retention ran out")
		})
	}
}

// FINDING. TestReview19ReholdKeepsFinishTime: a held marker held again at
// its hold's end must keep the entity's finish time ("A hold keeps the
// finish time" in due.go; the key is <prefix>r<until>/<finished>/h/<id>).
// parsePage replaces the finish time of a held key by until-Retention
// (for the lag), and holdKey writes that into the new key: after a second
// hold Due() reports the marker due at the first hold's end, not at
// finished+Retention, and ParseMarkerKey returns a finish time 4h late.
// Fix: keep the key's finished in the item and compute the lag's base
// apart (e.g. an item field dueMs), so that a rewrite copies the real one.
func TestReview19ReholdKeepsFinishTime(t *testing.T) {
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

	keys := review19RetryKeys(t, mem)
	require.Len(t, keys, 1)
	finished, id, err := ParseMarkerKey("runs/", []byte(keys[0]))
	require.NoError(t, err)
	assert.Equal(t, "a", string(id))
	assert.Equal(t, t0, finished, "the held key keeps the entity's finish time: %q", keys[0])

	due, err := s.Due(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	assert.Equal(t, StateHeld, due[0].State)
	assert.Equal(t, t0.Add(time.Hour), due[0].Due, "due at finished+Retention, as after the first hold")
}

// FINDING (a hold that does not survive a restart). TestReview19HeldDuplicateOnLaterPage:
// a second marker of a held id on a later page of the pass is only
// deferred (the hold is in memory), not moved to the held key nor deleted
// with the first. On a store that can write the hold should survive a
// restart ("so the hold survives restarts and lease hand-overs"), but the
// next process finds the duplicate due in the marker range and calls Clear
// for the id hours before until: here Clear answers nil and the entity is
// cleared early. Same for a marker of the id in the retry range. Fix: on a
// store that can write, a marker of an id held in memory (deferred, and the
// in-memory entry is a hold) is moved onto the held key (Mover) or deleted
// once the held key is known written (Putter: the pass wrote and read it
// back), as a duplicate of the same page is.
func TestReview19HeldDuplicateOnLaterPage(t *testing.T) {
	t.Parallel()
	for _, kind := range review19WritingKinds {
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

// TestReview19HeldDuplicateSamePage (passes): duplicates of a held id on
// the same page go with the first marker, on every kind of store; only one
// marker of the id is left, and it is not tried before until, then
// cleared once.
func TestReview19HeldDuplicateSamePage(t *testing.T) {
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

// FINDING (a dry run writes). TestReview19DryRunValidatePanicWritesNothing:
// a Config.ValidateID that panics on an id makes parsePage record the
// marker as failed; settle then calls retry, whose place Puts a retry key
// on a Put-only store before settle's dry-run return; with MaxAttempts 1 it
// Puts a parked key (runs/p.../1/boom), so the dry run parks the id, and
// the real sweep later leaves that parked key behind for ever. A dry run must
// "delete, reschedule or park nothing". Fix: in a dry run, settle must
// count failed/held items (Failed/Retried/Parked as "would") without
// calling retry/hold (or place must not write when s.dryRun), and keep
// retries.failed out of it.
func TestReview19DryRunValidatePanicWritesNothing(t *testing.T) {
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

// FINDING (dry run spins in a Group). TestReview19DryRunInGroupWaitsInterval:
// loop.run leaves a dry member out of the wait, but passes every member
// every round: in a Group with a real sweep that has steady work (a marker
// falling due every 100ms), the dry member passes every round, about a
// hundred times in 10s with Interval 10s, logging an Info line each time.
// "Run in dry-run mode must not spin over the same expired markers: it
// waits Interval between passes." Fix: the loop keeps, per member, when it
// last passed, and skips a dry member whose Interval has not elapsed since.
func TestReview19DryRunInGroupWaitsInterval(t *testing.T) {
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

// FINDING (metrics). TestReview19ObserverPagesCountHeldAndWouldClear: the
// Observer's ObservePage calls "add up to the counts of ObservePass's
// Stats", and the metrics modules count outcomes from them; but
// Stats.minus (observe.go) leaves out Held and WouldClear, so pages never
// carry them (and a page whose only outcome is a hold is not reported at
// all). Neither retentionprom nor retentionotel exports outcome="held" or
// "would_clear", which the README promises. Fix: add Held and WouldClear
// to minus (a reflect-based test over Stats' int fields would catch the
// next one), and to the modules' outcome counters.
func TestReview19ObserverPagesCountHeldAndWouldClear(t *testing.T) {
	t.Parallel()
	sum := func(pages []Stats) (held, would int) {
		for _, p := range pages {
			held += p.Held
			would += p.WouldClear
		}
		return
	}
	t.Run("held", func(t *testing.T) {
		mem := NewMemKV()
		rec := &recorder{}
		s, clock := newSweep(t, mem, Config{Observer: rec, Clear: func(context.Context, string) error { return Hold(t0.Add(9 * time.Hour)) }})
		markN(t, mem, 3, t0)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 3, st.Held)
		held, _ := sum(rec.pages)
		assert.Equal(t, st.Held, held, "ObservePage adds up to ObservePass")
	})
	t.Run("would clear", func(t *testing.T) {
		mem := NewMemKV()
		rec := &recorder{}
		s, clock := newSweep(t, mem, Config{Observer: rec, DryRun: true, Clear: func(context.Context, string) error { return nil }})
		markN(t, mem, 3, t0)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 3, st.WouldClear)
		_, would := sum(rec.pages)
		assert.Equal(t, st.WouldClear, would, "ObservePage adds up to ObservePass")
	})
}

// FINDING. TestReview19FailedDeadlineKeepsItsDeadline: a marker written
// with DeadlineKey "falls due at deleteAt whatever Retention says, then and
// later". When its clear fails, retry rewrites it as a plain retry key
// whose finished is deadline-Retention, and from then on it follows
// Retention: raise Retention to 48h and the marker, past its deadline and
// its retry delay, waits another ~46h (and Due() stops listing it). Fix:
// let a retry key keep the deadline tag (e.g. <prefix>r<at>/<deadline>/d<attempts>/<id>),
// so that a retried deadline marker stays exempt from Retention.
func TestReview19FailedDeadlineKeepsItsDeadline(t *testing.T) {
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
	due, err := s2.Due(context.Background(), 10)
	require.NoError(t, err)
	assert.Contains(t, ids(due), "d", "past its deadline: due whatever the Retention")
	_, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, c.count("d"), "a deadline marker whose clear failed once is retried at its retry time, not at finished+Retention")
}

// FINDING (low). TestReview19AttemptsAcrossHold: fail, hold, fail. The
// held key records no attempts (h/), while the in-memory count keeps the
// failure from before the hold: with MaxAttempts 2 the same history parks
// the id in a process that lived through it and not in one restarted
// during the hold. The README says a hold "adds no failed attempt"; it
// should not depend on a restart whether one before it counts. Fix: either
// a hold resets the in-memory failures (retries.hold sets failures = 0),
// or the held key records the attempts (h<n>/) and the pass reads them.
func TestReview19AttemptsAcrossHold(t *testing.T) {
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

// TestReview19HoldTimeBounds (passes): a hold beyond MaxMarkerTime waits
// at MaxMarkerTime, one before the epoch means "after RetryDelay", and a
// Hold wrapped in another error is still a hold with its time.
func TestReview19HoldTimeBounds(t *testing.T) {
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
			keys := review19RetryKeys(t, mem)
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

// TestReview19HoldsAreNoOutage (passes): batches that fail as a whole
// (poison ids, bisected) followed by batches whose ids are all held: the
// holds answer for the dependency, so the held ids are held, not put off
// as in an outage, and nothing held is counted as failed.
func TestReview19HoldsAreNoOutage(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	all := markN(t, mem, 40, t0)
	poison := map[string]bool{}
	for _, id := range all[:16] {
		poison[id] = true
	}
	until := t0.Add(9 * time.Hour)
	s, clock := newSweep(t, mem, Config{BatchSize: 4, ClearBatch: func(_ context.Context, ids []string) error {
		perID := BatchError{}
		for _, id := range ids {
			if poison[id] {
				return errBoom
			}
			perID[id] = Hold(until)
		}
		return perID
	}})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 24, st.Held, "every healthy id held, none put off")
	assert.Equal(t, 16, st.Failed)
	assert.Equal(t, 16, st.Retried)
	b, err := s.Backlog(context.Background(), 100)
	require.NoError(t, err)
	assert.Equal(t, 24, b.Held)
	assert.Equal(t, 16, b.Retrying)
}

// review19MixedCD refuses a batch with a BatchError naming a held, a
// failed and a live-again id (committing nothing), and commits the rest.
type review19MixedCD struct {
	atomicKV
	answer map[string]error
}

func (m *review19MixedCD) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	perID := BatchError{}
	for _, id := range ids {
		if e, ok := m.answer[id]; ok {
			perID[id] = e
		}
	}
	if len(perID) > 0 {
		return perID
	}
	return m.atomicKV.ClearAndDelete(ctx, ids, keys)
}

// TestReview19ClearDeleterMixedBatchError (passes): a ClearDeleter's
// BatchError with a hold, a failure and a live-again entry: the held id is
// held (its marker and a duplicate moved to one held key), the failed one
// retried, the live-again one's marker dropped with its entity kept, and
// the others sent again and cleared once.
func TestReview19ClearDeleterMixedBatchError(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := &review19MixedCD{
		atomicKV: atomicKV{MemKV: mem, entities: map[string]bool{}, cleared: map[string]int{}},
		answer: map[string]error{
			"b0001": Hold(t0.Add(9 * time.Hour)),
			"b0002": errBoom,
			"b0003": fmt.Errorf("resumed: %w", ErrLiveAgain),
		},
	}
	for _, id := range markN(t, mem, 10, t0) {
		kv.entities[id] = true
	}
	mark(t, mem, "runs/", "b0001", t0.Add(20*time.Millisecond)) // a duplicate of the held id
	s, clock := newSweep(t, kv, Config{BatchSize: 20})
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Held)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 1, st.LiveAgain)
	assert.Equal(t, 7, st.Cleared)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, map[string]bool{"b0001": true, "b0002": true, "b0003": true}, kv.entities)
	assert.Equal(t, map[string]int{"b0001": 1, "b0002": 1}, markerIDs(t, mem, "runs/"))
	for id, n := range kv.cleared {
		assert.Equal(t, 1, n, id)
	}
}

// TestReview19WholeCallHoldFromClearDeleter (passes): a ClearDeleter that
// refuses a whole call with Hold commits nothing: no id cleared, no
// failure, no failed call, every marker (and a duplicate) on a held key.
func TestReview19WholeCallHoldFromClearDeleter(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	until := t0.Add(9 * time.Hour)
	kv := &review19MixedCD{atomicKV: atomicKV{MemKV: mem, entities: map[string]bool{}, cleared: map[string]int{}}}
	s, clock := newSweep(t, holdAllCD{kv, until}, Config{BatchSize: 5})
	markN(t, mem, 10, t0)
	mark(t, mem, "runs/", "b0004", t0.Add(30*time.Millisecond))
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 10, st.Held)
	assert.Equal(t, 1, st.Duplicates)
	assert.Zero(t, st.Cleared+st.Failed+st.FailedCalls+st.Retried)
	assert.Len(t, review19RetryKeys(t, mem), 10)
	assert.Empty(t, kv.cleared)
}

// holdAllCD is a ClearDeleter that refuses every call with a Hold.
type holdAllCD struct {
	*review19MixedCD
	until time.Time
}

func (h holdAllCD) ClearAndDelete(context.Context, []string, [][]byte) error {
	return fmt.Errorf("legal: %w", Hold(h.until))
}

// TestReview19DryRunMatchesRealPass (passes): with markers of the retry
// range (a failed one due again), a deadline key due, one not due, a held
// key not due and duplicates across pages, the dry run
// counts exactly the ids the real pass then clears, calls no Limiter and
// makes no clear call.
func TestReview19DryRunMatchesRealPass(t *testing.T) {
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

// TestReview19DueAndBacklog (passes): Due lists only what is due, in order
// of due time, limit is exact; a hold that ended is listed as due with no
// Next; a deadline not reached is neither listed nor late in Backlog,
// which counts it as Held, apart from Age.
func TestReview19DueAndBacklog(t *testing.T) {
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
	assert.Equal(t, 2, b.Held, "the hold and the deadline ahead")
	assert.Equal(t, 2, b.Due, "plain, and dl0 whose deadline passed")
	assert.Equal(t, "plain", b.OldestID)
	assert.Equal(t, t0.Add(70*time.Minute), b.OldestDue)

	due, err := s.Due(context.Background(), 10)
	require.NoError(t, err)
	assert.Equal(t, []string{"held", "plain", "dl0"}, ids(due))
	assert.Equal(t, StateHeld, due[0].State)
	assert.Equal(t, StateDue, due[2].State)
	clock.Set(t0.Add(3*time.Hour + time.Second))
	due, err = s.Due(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, "held", due[0].ID)
	assert.Equal(t, StateDue, due[0].State, "its hold ended")
	assert.Zero(t, due[0].Next)
	_, err = s.Due(context.Background(), MaxPageSize+1)
	assert.Error(t, err)
}

// FINDING (low; documented in part). TestReview19DueLimitIsAPrefix: Due
// promises "the longest overdue first", but each range is read only up to
// limit keys in key order, and the retry range's key order is retry/hold
// time, not due time: Due(1) here returns "plain" (due t0+70m) while
// Due(10) starts with "held" (due t0+1h), whose held key sorts after a
// deadline key that fell due later. An admin page that shows the top n
// shows a different top than one that shows more. Fix: read the retry
// range within Backlog's budget of scans (not limit keys) and sort before
// cutting, or report More and document that only the first limit by key
// of each range compete.
func TestReview19DueLimitIsAPrefix(t *testing.T) {
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

	all, err := s.Due(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, []string{"held", "plain", "dl0"}, ids(all))
	// Due reads at most limit keys of each range: Due(n) is the first n of
	// Due(10) once n covers each range (here the retry range holds two),
	// as its doc says.
	for n := 2; n < len(all); n++ {
		top, err := s.Due(context.Background(), n)
		require.NoError(t, err)
		assert.Equal(t, ids(all[:n]), ids(top), "Due(%d) is the first %d of Due(10)", n, n)
	}
}

// TestReview19DeadlineKeyShapes (passes): deadline keys at the bounds of
// time are accepted by CheckMarkerKey (so the adapters' MarkKeyTx take
// them) and read back by ParseMarkerKey, and a sweep of a neighbouring
// prefix leaves them alone.
func TestReview19DeadlineKeyShapes(t *testing.T) {
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

// FINDING (low). TestReview19FastHeldCallsGrowBatchesBack: adapt doubles
// the batch size back only after a call that returned nil; a call that
// answered quickly for every id with a Hold (whole call, or a BatchError of
// holds) leaves it halved, so one slow call early in a stretch of held
// entities keeps every later batch small for the rest of the pass and the
// next ones. A hold is an answer, as a nil is: the dependency is up and
// fast. Fix: in adapt, grow after any call that answered for its ids (nil,
// a BatchError, a whole-call Hold or ErrLiveAgain), not only err == nil.
func TestReview19FastHeldCallsGrowBatchesBack(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("held=%v", held), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			markN(t, mem, 64, t0)
			var clock *ManualClock
			first := true
			s, clock := newSweep(t, mem, Config{BatchSize: 8, BatchTarget: 100 * time.Millisecond, ClearBatch: func(context.Context, []string) error {
				if first {
					first = false
					clock.Advance(time.Second) // one slow call: the batches halve
				}
				if held {
					return Hold(t0.Add(9 * time.Hour))
				}
				return nil
			}})
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 8, st.BatchSize, "fast calls after the slow one grow the batches back")
		})
	}
}
