// Package bench measures how fast retention clears a backlog of expired
// entities against the cleaners of River (PostgreSQL) and asynq (Redis),
// on the same servers, in one run.
//
// Every way of deleting the backlog is a Contender: it writes its own fresh
// data (not timed), deletes it (timed) and checks that nothing is left (not
// timed). Run alternates the contenders, rotating their order every round,
// so that a machine that slows down mid-run slows every contender alike,
// and Table prints medians and ratios taken within each round. The
// command bench/cmd/peers runs the whole comparison; the tests of this
// package only check, on a small backlog, that every contender clears what
// it should.
//
// Poison is another kind of measure: the poison-id scenario, a job
// service on PostgreSQL whose sweep runs under Run while jobs finish at a
// steady rate and a few of them cannot be deleted; RunPoison compares the
// database's own record of every deletion with what the sweep reports
// (Stats, an Observer's lag samples, Sweep.Backlog). The command
// bench/cmd/poison runs it.
//
// SQL holds the same kind of comparison for the sqlkv module, on any of its
// dialects through database/sql, with a floor that deletes the same jobs
// and markers by hand in batches of the sweep's size; the command
// bench/cmd/sql runs it on MariaDB, SQLite and PostgreSQL.
//
// The module is a module of its own so that no adapter depends on River or
// asynq.
package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"
)

// A Contender is one way of deleting a backlog of expired entities.
// Adding a contender is writing one function that returns one.
type Contender struct {
	// Name labels the contender in results and tables.
	Name string

	// Setup writes n expired entities (state and, where the contender
	// uses them, markers) and leaves the server quiet. It is not timed.
	Setup func(ctx context.Context, n int) error

	// Clear deletes every expired entity Setup wrote and returns how
	// many it deleted. It is timed.
	Clear func(ctx context.Context) (int, error)

	// Check returns an error when anything Setup wrote is left. It is
	// not timed.
	Check func(ctx context.Context) error
}

// Result holds one contender's throughput, in entities per second, for
// every round, in round order; and when Run was given a CPUMeter, the CPU
// time per entity of the server and of this process (the client) in each
// round.
type Result struct {
	Name  string
	Rates []float64

	ServerCPU, ClientCPU []time.Duration
}

// Median returns the median of r.Rates, 0 for none.
func (r Result) Median() float64 { return median(r.Rates) }

// Once runs c on a fresh backlog of n entities: Setup, a timed Clear, and
// Check. It returns the throughput in entities per second, and an error
// when any step fails or Clear deleted another number than n.
func Once(ctx context.Context, c Contender, n int) (float64, error) {
	r, err := once(ctx, c, n, nil)
	return r.rate, err
}

// run is what once measured of one run of a contender.
type run struct {
	rate           float64
	server, client time.Duration // CPU time per entity, when metered
}

// once is Once, which also reads the CPU time the server (through meter,
// when not nil) and this process spent during the timed Clear.
func once(ctx context.Context, c Contender, n int, meter CPUMeter) (run, error) {
	if err := c.Setup(ctx, n); err != nil {
		return run{}, fmt.Errorf("%s: setup: %w", c.Name, err)
	}
	var server0 time.Duration
	if meter != nil {
		var err error
		if server0, err = meter(); err != nil {
			return run{}, fmt.Errorf("%s: reading the server's CPU time: %w", c.Name, err)
		}
	}
	// The garbage of Setup is collected now, not during the timed Clear,
	// which would count it against the contender.
	runtime.GC()
	client0 := clientCPU()
	start := time.Now()
	got, err := c.Clear(ctx)
	elapsed := time.Since(start)
	r := run{rate: float64(n) / elapsed.Seconds(), client: (clientCPU() - client0) / time.Duration(max(n, 1))}
	if meter != nil {
		server1, merr := meter()
		if merr != nil {
			return run{}, fmt.Errorf("%s: reading the server's CPU time: %w", c.Name, merr)
		}
		r.server = (server1 - server0) / time.Duration(max(n, 1))
	}
	if err != nil {
		return run{}, fmt.Errorf("%s: clear: %w", c.Name, err)
	}
	if got != n {
		return run{}, fmt.Errorf("%s: cleared %d entities, want %d", c.Name, got, n)
	}
	if err := c.Check(ctx); err != nil {
		return run{}, fmt.Errorf("%s: check: %w", c.Name, err)
	}
	return r, nil
}

// Run runs every contender once per round on a fresh backlog of n
// entities. Round r starts with contender r mod len(cs) and goes on in
// order, so every contender runs early and late alike. progress, when not
// nil, is called after every run. Run stops at the first error.
func Run(ctx context.Context, cs []Contender, n, rounds int, progress func(round int, name string, rate float64)) ([]Result, error) {
	return RunMetered(ctx, cs, n, rounds, nil, progress)
}

// RunMetered is Run, which also records in each Result the CPU time per
// entity of the server, read through meter (unless nil), and of this
// process, over each timed Clear.
func RunMetered(ctx context.Context, cs []Contender, n, rounds int, meter CPUMeter, progress func(round int, name string, rate float64)) ([]Result, error) {
	res := make([]Result, len(cs))
	for i, c := range cs {
		res[i].Name = c.Name
	}
	for r := range rounds {
		for k := range cs {
			i := (r + k) % len(cs)
			got, err := once(ctx, cs[i], n, meter)
			if err != nil {
				return res, fmt.Errorf("round %d: %w", r+1, err)
			}
			res[i].Rates = append(res[i].Rates, got.rate)
			if meter != nil {
				res[i].ServerCPU = append(res[i].ServerCPU, got.server)
				res[i].ClientCPU = append(res[i].ClientCPU, got.client)
			}
			if progress != nil {
				progress(r+1, cs[i].Name, got.rate)
			}
		}
	}
	return res, nil
}

// Ratio returns the median, over rounds, of a's throughput divided by b's
// in the same round: pairing runs of one round cancels much of the drift
// of a noisy machine. It returns 0 when the two have no round in common.
func Ratio(a, b Result) float64 {
	var rs []float64
	for i := range min(len(a.Rates), len(b.Rates)) {
		if b.Rates[i] > 0 {
			rs = append(rs, a.Rates[i]/b.Rates[i])
		}
	}
	return median(rs)
}

// A Baseline names a contender whose throughput Table divides every
// other's by, and the label of that column.
type Baseline struct {
	Label, Name string
}

// Table writes results as a Markdown table: the median throughput, the
// slowest and fastest round, and the ratio to each baseline (the median
// of Ratio). A baseline not among results gets no column. When the
// results hold CPU times (RunMetered), more columns give the median CPU
// time per entity of the server and of the client, and for each baseline
// the baseline's CPU time (server and client) divided by the contender's
// (see cpuRatio): like the throughput ratio, above 1 is better.
func Table(w io.Writer, results []Result, baselines ...Baseline) error {
	var base []Result
	var labels []string
	head, rule := "| contender | entities/s (median) | rounds: min – max |", "| --- | ---: | ---: |"
	for _, b := range baselines {
		if i := slices.IndexFunc(results, func(r Result) bool { return r.Name == b.Name }); i >= 0 {
			base = append(base, results[i])
			labels = append(labels, b.Label)
			head += " vs " + b.Label + " |"
			rule += " ---: |"
		}
	}
	metered := slices.ContainsFunc(results, func(r Result) bool { return len(r.ServerCPU) > 0 })
	if metered {
		head += " server CPU/entity | client CPU/entity |"
		rule += " ---: | ---: |"
		for _, l := range labels {
			head += " CPU vs " + l + " |"
			rule += " ---: |"
		}
	}
	if _, err := fmt.Fprintf(w, "%s\n%s\n", head, rule); err != nil {
		return err
	}
	for _, r := range results {
		line := fmt.Sprintf("| %s | %s | %s – %s |", r.Name, Rate(r.Median()), Rate(slices.Min(r.Rates)), Rate(slices.Max(r.Rates)))
		for _, b := range base {
			line += " " + ratio(Ratio(r, b)) + " |"
		}
		if metered {
			line += " " + cpuTime(medianDuration(r.ServerCPU)) + " | " + cpuTime(medianDuration(r.ClientCPU)) + " |"
			for _, b := range base {
				line += " " + ratio(cpuRatio(b, r)) + " |"
			}
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// Rate formats entities per second as 3.9 M, 830 k or 950.
func Rate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2f M", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0f k", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// ratio formats a ratio with two decimals, or two significant digits
// below 0.1 so that small ones do not all read 0.00×.
func ratio(v float64) string {
	if v < 0.095 { // what %.2f would print as 0.09 or less
		return fmt.Sprintf("%.2g×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuRatio returns the median, over rounds, of base's CPU time per
// entity (server and client) divided by r's in the same round: above 1,
// r costs the machine less than base. It returns 0 when the two have no
// round in common.
func cpuRatio(base, r Result) float64 {
	var rs []float64
	for i := range min(len(base.ServerCPU), len(r.ServerCPU), len(base.ClientCPU), len(r.ClientCPU)) {
		if t := r.ServerCPU[i] + r.ClientCPU[i]; t > 0 {
			rs = append(rs, float64(base.ServerCPU[i]+base.ClientCPU[i])/float64(t))
		}
	}
	return median(rs)
}

// cpuTime formats a CPU time per entity in microseconds, or "?" for none.
func cpuTime(d time.Duration) string {
	if d <= 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f µs", float64(d)/float64(time.Microsecond))
}

func medianDuration(v []time.Duration) time.Duration {
	f := make([]float64, len(v))
	for i, d := range v {
		f[i] = float64(d)
	}
	return time.Duration(median(f))
}
