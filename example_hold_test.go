package retention_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/marksweep/retention"
)

// legalHolds stands for where a service records holds: entity id to the
// hold's end.
var legalHolds = map[string]time.Time{}

// deleteRun stands for the service's delete of a run's state.
func deleteRun(context.Context, string) error { return nil }

// clearUnlessHeld is a Config.Clear that keeps runs on hold: the sweep
// comes back at the hold's end, and a hold lifted early is seen then.
func clearUnlessHeld(ctx context.Context, id string) error {
	if until, ok := legalHolds[id]; ok {
		return retention.Hold(until)
	}
	return deleteRun(ctx, id)
}

// liftHold ends the legal hold of id now, before its end: the service
// forgets the hold first, so that the pass asks clearUnlessHeld again, then
// the sweep's held marker falls due at once, on whichever replica sweeps.
func liftHold(ctx context.Context, s *retention.Sweep, id string) error {
	delete(legalHolds, id)
	_, err := s.ReleaseHolds(ctx, id)
	return err
}

// failedRunKey is the marker of a failed run, kept 30 days where
// successful runs go after the sweep's Retention; write it with the
// adapter's MarkKeyTx in the transaction that records the failure.
func failedRunKey(s *retention.Sweep, id string, finished time.Time) ([]byte, error) {
	return s.DeadlineKey(finished.Add(30*24*time.Hour), id)
}

// previewSweep reports what a sweep with cfg would delete now, deleting
// nothing: a dry pass, and the markers not cleared, each with its state.
func previewSweep(ctx context.Context, kv retention.KV, cfg retention.Config) error {
	cfg.DryRun = true
	s, err := retention.New(kv, cfg)
	if err != nil {
		return err
	}
	st, err := s.Pass(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("would clear %d\n", st.WouldClear)
	pending, err := s.Pending(ctx, 10)
	if err != nil {
		return err
	}
	for _, m := range pending {
		fmt.Printf("%s %s due %s\n", m.ID, m.State, m.Due.UTC().Format(time.DateTime))
	}
	return nil
}

func ExampleHold() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	finished := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := retention.NewManualClock(finished.Add(25 * time.Hour))
	s, err := retention.New(kv, retention.Config{
		Prefix: "runs/", Retention: 24 * time.Hour, Clock: clock, Clear: clearUnlessHeld,
	})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"run-1", "run-2"} {
		key, _ := s.MarkerKey(finished, id)
		_ = kv.Put(ctx, key, nil)
	}
	legalHolds["run-2"] = finished.Add(90 * 24 * time.Hour)
	st, _ := s.Pass(ctx)
	fmt.Println("cleared", st.Cleared, "held", st.Held, "failed", st.Failed)
	b, _ := s.Backlog(ctx, 100)
	fmt.Println("backlog: due", b.Due, "held", b.Held)
	// Output:
	// cleared 1 held 1 failed 0
	// backlog: due 0 held 1
}

func ExampleSweep_ReleaseHolds() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	finished := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := retention.NewManualClock(finished.Add(25 * time.Hour))
	s, err := retention.New(kv, retention.Config{
		Prefix: "cases/", Retention: 24 * time.Hour, Clock: clock,
		Clear: func(ctx context.Context, id string) error {
			err := clearUnlessHeld(ctx, id)
			if err == nil {
				fmt.Println("cleared", id)
			}
			return err
		},
	})
	if err != nil {
		panic(err)
	}
	key, _ := s.MarkerKey(finished, "case-7")
	_ = kv.Put(ctx, key, nil)
	legalHolds["case-7"] = finished.Add(365 * 24 * time.Hour)
	st, _ := s.Pass(ctx)
	fmt.Println("held", st.Held)
	if err := liftHold(ctx, s, "case-7"); err != nil {
		panic(err)
	}
	_, _ = s.Pass(ctx) // Run's pass, woken by ReleaseHolds
	// Output:
	// held 1
	// cleared case-7
}

func ExampleDeadlineKey() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	finished := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := retention.NewManualClock(finished)
	s, err := retention.New(kv, retention.Config{
		Prefix: "runs/", Retention: 24 * time.Hour, Clock: clock,
		Clear: func(_ context.Context, id string) error { fmt.Println("clear", id); return nil },
	})
	if err != nil {
		panic(err)
	}
	ok, _ := s.MarkerKey(finished, "ok-run")
	failed, _ := failedRunKey(s, "failed-run", finished)
	_ = kv.Put(ctx, ok, nil)
	_ = kv.Put(ctx, failed, nil)
	for _, days := range []int{2, 31} {
		clock.Set(finished.Add(time.Duration(days) * 24 * time.Hour))
		fmt.Println("day", days)
		_, _ = s.Pass(ctx)
	}
	// Output:
	// day 2
	// clear ok-run
	// day 31
	// clear failed-run
}

func ExampleConfig_dryRun() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	finished := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"run-1", "run-2", "run-3"} {
		key, _ := retention.MarkerKey("runs/", finished.Add(time.Duration(i)*time.Hour), id)
		_ = kv.Put(ctx, key, nil)
	}
	err := previewSweep(ctx, kv, retention.Config{
		Prefix: "runs/", Retention: 24 * time.Hour, Clear: deleteRun,
		Clock:  retention.NewManualClock(finished.Add(25*time.Hour + time.Minute)),
		Logger: slog.New(slog.DiscardHandler),
	})
	fmt.Println(err, kv.Len())
	// Output:
	// would clear 2
	// run-1 due due 2026-01-02 00:00:00
	// run-2 due due 2026-01-02 01:00:00
	// <nil> 3
}
