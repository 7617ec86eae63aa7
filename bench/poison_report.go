package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/marksweep/retention"
)

// DBLags are the lags past due of one kind of job as the database logged
// them: deletion time (clock_timestamp() in the clearing transaction)
// minus due time (finish plus retention).
type DBLags struct {
	Cleared       int // jobs deleted
	Over1s        int // of which more than 1 s past due
	P50, P99, Max time.Duration
}

// PoisonResult is what one run of a Poison configuration measured.
type PoisonResult struct {
	Config Poison
	Wall   time.Duration // from the first job written to the end of the run

	// The faults.
	PoisonJobs, LockedJobs  int
	LocksTaken, LocksMissed int // row locks held, and those whose row was already gone

	// The database's figures.
	Healthy, Poisoned, LockedLags DBLags
	All                           DBLags // every job, whatever its fault
	HealthyLeft, JobsLeft         int    // jobs not deleted at the end
	MarkersLeft                   int
	ClearedTwice, Early           int // correctness: both must be 0

	// The sweep's figures: Stats summed over every pass of every replica,
	// and the lag samples its Observer received, sorted.
	Sweep              retention.Stats
	Passes, PassErrors int
	MaxLag             time.Duration // the largest Stats.MaxLag
	Lags               []time.Duration

	// The backlog, polled every 250 ms: the largest Sweep.Backlog Age,
	// the largest age of the oldest due job still in the database (healthy
	// ones, and any), and the largest gap, in one sample, between the
	// database's healthy figure and Backlog.Age.
	Samples                  int
	BacklogMax, BacklogBlind time.Duration
	DBHealthyMax, DBAnyMax   time.Duration
	ErrorLines, WarnLines    int
	ErrorSamples             []string
}

// PoisonTables writes the results as two Markdown tables, the database's
// figures and the sweep's, fit to paste into BENCHMARKS.md, followed by
// the first Error lines of each run.
func PoisonTables(w io.Writer, rs []PoisonResult) error {
	var b strings.Builder
	b.WriteString("What the database logged (deletion time − due time, both in the clearing transaction):\n\n")
	b.WriteString("| configuration | healthy jobs cleared | p50 | p99 | max | > 1 s | healthy left | poisoned cleared / total (max lag) | locked cleared / total (max lag) | cleared twice / early |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d | %d | %d / %d (%s) | %d / %d (%s) | %d / %d |\n",
			r.Config.Name, r.Healthy.Cleared, dur(r.Healthy.P50), dur(r.Healthy.P99), dur(r.Healthy.Max), r.Healthy.Over1s, r.HealthyLeft,
			r.Poisoned.Cleared, r.PoisonJobs, dur(r.Poisoned.Max), r.LockedLags.Cleared, r.LockedJobs, dur(r.LockedLags.Max),
			r.ClearedTwice, r.Early)
	}
	b.WriteString("\nWhat the sweep reported (Stats summed over passes; lag samples from an Observer; Backlog polled every 250 ms beside the database's oldest due job):\n\n")
	b.WriteString("| configuration | passes | Cleared | Failed (poison ids) | Retried | ClearCalls | FailedCalls (timed out) | Error lines | lag samples | > 1 s (DB, all jobs) | lag p99 (DB) | lag max (DB) | Backlog.Age max | DB oldest healthy max | DB oldest any max | largest gap DB − Backlog | markers left |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %d | %d (%d) | %d | %d | %d (%d) | %d | %d | %d (%d) | %s (%s) | %s (%s) | %s | %s | %s | %s | %d |\n",
			r.Config.Name, r.Passes, r.Sweep.Cleared, r.Sweep.Failed, r.PoisonJobs, r.Sweep.Retried, r.Sweep.ClearCalls,
			r.Sweep.FailedCalls, r.Sweep.TimedOutCalls, r.ErrorLines,
			len(r.Lags), over(r.Lags, time.Second), r.All.Over1s, dur(quantile(r.Lags, 0.99)), dur(r.All.P99), dur(quantile(r.Lags, 1)), dur(r.All.Max),
			dur(r.BacklogMax), dur(r.DBHealthyMax), dur(r.DBAnyMax), dur(r.BacklogBlind), r.MarkersLeft)
	}
	b.WriteString("\n")
	for _, r := range rs {
		if r.PassErrors != 0 || r.LocksMissed != 0 || r.JobsLeft != r.HealthyLeft || len(r.ErrorSamples) > 0 {
			fmt.Fprintf(&b, "%s: %d passes ended in an error; row locks held %d, missed %d (row already deleted); jobs left %d; first Error lines:\n",
				r.Config.Name, r.PassErrors, r.LocksTaken, r.LocksMissed, r.JobsLeft)
			for _, s := range r.ErrorSamples {
				fmt.Fprintf(&b, "    %.400s\n", s)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// dur prints d rounded to what the figure needs: ms below 10 s.
func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// over counts the samples of sorted above d.
func over(sorted []time.Duration, d time.Duration) int {
	i, _ := slices.BinarySearch(sorted, d+1)
	return len(sorted) - i
}
