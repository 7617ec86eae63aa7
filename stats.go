package retention

import "time"

// Stats describes one pass.
type Stats struct {
	Scanned    int // keys read by Scan, including the one read past the expired range
	Cleared    int // markers whose Clear returned nil
	Failed     int // markers whose Clear failed (error, panic, timeout, Goexit); they stay
	Retried    int // failed markers put off until their retry delay is over
	Parked     int // failed markers moved to the parked range, having failed Config.MaxAttempts times
	Deferred   int // markers skipped because their retry delay is not over (KVs that are no Mover)
	Malformed  int // marker-shaped keys with a refused id or time, deleted without Clear
	Foreign    int // keys under the prefix that are not marker-shaped, left alone
	LiveAgain  int // markers whose Clear returned ErrLiveAgain, deleted without clearing
	Duplicates int // further markers of an id met earlier in the pass, deleted without a clear of their own
	Held       int // markers whose Clear returned Hold: kept until the hold's end, no failure
	// Gone counts markers found deleted after a ClearDeleter's call whose
	// outcome was lost: this replica's call or another's cleared them. Not
	// in Cleared, so that a fleet's Cleared add up to the entities cleared.
	Gone        int
	WouldClear  int // in a dry run (Config.DryRun), markers whose entity the pass would have cleared
	ScanCalls   int // calls to KV.Scan
	DeleteCalls int // calls to KV.Delete
	PutCalls    int // calls to Mover.Move, rescheduling failed and held markers
	ClearCalls  int // calls of Config.Clear or Config.ClearBatch, or of a ClearDeleter

	// FailedCalls counts the calls of ClearCalls that failed as a whole,
	// also those whose ids a bisection then cleared apart; TimedOutCalls
	// and PanickedCalls (runtime.Goexit included) are those of them that
	// ran past ClearTimeout or panicked.
	FailedCalls, TimedOutCalls, PanickedCalls int

	// BudgetWait is how long the pass's clears waited for Config.Limiter,
	// added over the calls.
	BudgetWait time.Duration

	// BatchSize is the batch size the pass ended with: Config.BatchSize,
	// or less after slow calls (see Config.BatchTarget). Zero with Clear.
	BatchSize int

	// Duration is how long the pass took by the sweep's Clock.
	Duration time.Duration

	// MaxLag is how long past its due time the most overdue cleared marker
	// was when the pass started. Zero when nothing was cleared.
	MaxLag time.Duration

	// NextDue is when a pass will next find work: the oldest marker left
	// unexpired falls due, or the first retry, hold or deadline comes.
	// Zero when there is none.
	NextDue time.Time
}

func (st *Stats) counts() Stats {
	c := *st
	c.Duration, c.MaxLag, c.NextDue, c.BatchSize = 0, 0, time.Time{}, 0
	return c
}

func (a Stats) minus(b Stats) Stats {
	return Stats{
		Scanned: a.Scanned - b.Scanned, Cleared: a.Cleared - b.Cleared, Failed: a.Failed - b.Failed,
		Retried: a.Retried - b.Retried, Parked: a.Parked - b.Parked, Deferred: a.Deferred - b.Deferred,
		Malformed: a.Malformed - b.Malformed, Foreign: a.Foreign - b.Foreign, LiveAgain: a.LiveAgain - b.LiveAgain,
		Duplicates: a.Duplicates - b.Duplicates, ScanCalls: a.ScanCalls - b.ScanCalls, DeleteCalls: a.DeleteCalls - b.DeleteCalls,
		PutCalls: a.PutCalls - b.PutCalls, ClearCalls: a.ClearCalls - b.ClearCalls, FailedCalls: a.FailedCalls - b.FailedCalls,
		TimedOutCalls: a.TimedOutCalls - b.TimedOutCalls, PanickedCalls: a.PanickedCalls - b.PanickedCalls,
		Held: a.Held - b.Held, WouldClear: a.WouldClear - b.WouldClear, Gone: a.Gone - b.Gone,
		BudgetWait: a.BudgetWait - b.BudgetWait,
	}
}
