package kvtest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// testSweepDryRun checks a dry run (Config.DryRun) over the KV: a pass
// reads the expired range and the retry range, where markers with a
// deadline of their own wait (retention.DeadlineKey), calls no clear and
// leaves every key as it was; it counts in Stats.WouldClear the very
// markers that a real pass then clears. A store whose reads hide some
// markers, or that does not hold a deadline's key as written, makes the
// count or the ids differ from those the suite wrote.
func testSweepDryRun(t *testing.T, s Store) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const prefix = "dry/"
	var due []string
	dueKeys := map[string]bool{}
	for i := range 30 {
		id := fmt.Sprintf("d%02d", i)
		at := now.Add(-time.Hour - time.Duration(i+1)*time.Second) // past retention
		if i%5 == 0 {
			at = now.Add(-time.Hour + time.Duration(i+1)*time.Second) // within it
		}
		key := markerKey(t, prefix, at, id)
		put(t, s, key)
		if i%5 != 0 {
			due, dueKeys[key] = append(due, id), true
		}
	}
	// Deadlines of their own, whatever the Retention: one passed a minute
	// ago, one a day away.
	for _, d := range []struct {
		id string
		at time.Time
	}{{"deadline-passed", now.Add(-time.Minute)}, {"deadline-ahead", now.Add(24 * time.Hour)}} {
		key, err := retention.DeadlineKey(prefix, d.at, d.id)
		if err != nil {
			t.Fatal(err)
		}
		put(t, s, string(key))
		if !d.at.After(now) {
			due, dueKeys[string(key)] = append(due, d.id), true
		}
	}
	sort.Strings(due)
	put(t, s, prefix+"0000000000/foreign", "dry0/00000000000000000001/other")
	before := scanAll(t, s, "dry", "drz", 100)

	dry, err := retention.New(sweepKV(s.KV), retention.Config{
		Prefix: prefix, Retention: time.Hour, PageSize: 8, Clock: retention.NewManualClock(now), DryRun: true,
		Logger: slog.New(slog.DiscardHandler), // the foreign key is meant
		Clear: func(_ context.Context, id string) error {
			t.Errorf("Clear(%q) called in a dry run", id)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := dry.Pass(ctxFor(t))
	if err != nil {
		t.Fatalf("dry Pass() error = %v", err)
	}
	if st.WouldClear != len(due) || st.Cleared != 0 || st.ClearCalls != 0 || st.DeleteCalls != 0 || st.PutCalls != 0 {
		t.Errorf("dry Pass() = %+v, want WouldClear %d and no clear, delete or move", st, len(due))
	}
	want(t, "keys after a dry run", scanAll(t, s, "dry", "drz", 100), before)

	var mu sync.Mutex
	var cleared []string
	real, err := retention.New(sweepKV(s.KV), retention.Config{
		Prefix: prefix, Retention: time.Hour, PageSize: 8, Clock: retention.NewManualClock(now),
		Logger: slog.New(slog.DiscardHandler),
		Clear: func(_ context.Context, id string) error {
			mu.Lock()
			defer mu.Unlock()
			cleared = append(cleared, id)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err = real.Pass(ctxFor(t)); err != nil {
		t.Fatalf("Pass() after the dry run error = %v", err)
	}
	sort.Strings(cleared)
	want(t, "ids cleared by the pass after the dry run", cleared, due)
	if st.Cleared != len(due) {
		t.Errorf("Pass().Cleared after the dry run = %d, want %d as the dry run's WouldClear", st.Cleared, len(due))
	}
	left := slices.DeleteFunc(slices.Clone(before), func(key string) bool { return dueKeys[key] })
	want(t, "keys left after the pass", scanAll(t, s, "dry", "drz", 100), left)
}
