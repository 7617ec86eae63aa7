package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/marksweep/retention/bench"
)

// tripwire runs, in each suite of suites (pg, redis), the peer's cleaner
// and the adapter's atomic clear (concurrency 1; on PostgreSQL runs of
// 10,000 that the database picks, through an AtomicKV of WithClearSQL,
// the fastest atomic path; batches of 1,000 on Redis), and
// returns an error naming every suite whose median ratio of the two
// (paired within rounds, see bench.Ratio) falls below its minimum:
// minRiver for pgkv.AtomicKV against River's JobDeleteBefore, minAsynq for
// rediskv.AtomicKV against the asynq-style script. A suite below its
// minimum runs again, up to attempts times in all, and fails only when
// every attempt does: another process that takes the machine for a few
// seconds can cost one attempt, while a halving of the adapter's
// throughput fails them all. The minimums sit well below what the
// adapters measure and well above what a halving leaves (BENCHMARKS.md).
//
// The river suite races the table sweep of River's own river_job
// (sqlkv.AtomicTableKV, runs of 10,000) against River's JobDeleteBefore on
// the same rows, with minTable as its minimum.
func tripwire(ctx context.Context, n, rounds, attempts int, suites []string, minRiver, minAsynq, minTable float64) error {
	fmt.Printf("tripwire: %d expired entities per run, %d rounds, contenders alternated, up to %d attempts; load %s\n\n", n, rounds, attempts, loadavg())
	type suite struct {
		what, peer string
		least      float64
		run        func() ([]bench.Result, error)
	}
	var errs []error
	for _, s := range suites {
		var st suite
		switch s {
		case "pg":
			st = suite{"pgkv.AtomicKV (WithClearSQL, runs)", "River", minRiver, func() ([]bench.Result, error) {
				return runPG(ctx, os.Getenv("RETENTION_POSTGRES_DSN"), false, n, rounds, func(p *bench.PG) []bench.Contender {
					return []bench.Contender{p.River(), p.AtomicRuns(10_000)}
				}, []string{"River"}, "")
			}}
		case "redis":
			st = suite{"rediskv.AtomicKV", "the asynq-style script", minAsynq, func() ([]bench.Result, error) {
				return runRedis(ctx, n, rounds, func(r *bench.Redis) []bench.Contender {
					return []bench.Contender{r.Janitor(), r.AtomicBatches(1000, 1)}
				}, []string{"asynq-style"}, "")
			}}
		case "river":
			st = suite{"sqlkv.AtomicTableKV over river_job (runs)", "River", minTable, func() ([]bench.Result, error) {
				return runPG(ctx, os.Getenv("RETENTION_POSTGRES_DSN"), false, n, rounds, func(p *bench.PG) []bench.Contender {
					return []bench.Contender{p.River(), p.Table(bench.RiverBatch)}
				}, []string{"River"}, "")
			}}
		case "pg-fsync", "river-fsync":
			continue // the tripwire needs no second server
		default:
			return fmt.Errorf("unknown suite %q", s)
		}
		for attempt := 1; ; attempt++ {
			res, err := st.run()
			if err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
			got := bench.Ratio(res[1], res[0])
			if got >= st.least {
				fmt.Printf("tripwire: %s at %.2f× %s (at least %.2f×), attempt %d: ok\n\n", st.what, got, st.peer, st.least, attempt)
				break
			}
			fmt.Printf("tripwire: %s at %.2f× %s (at least %.2f×), attempt %d of %d: below\n\n", st.what, got, st.peer, st.least, attempt, attempts)
			if attempt >= attempts {
				errs = append(errs, fmt.Errorf("tripwire: %s below %.2f× %s in %d attempts (last %.2f×)", st.what, st.least, st.peer, attempts, got))
				break
			}
		}
	}
	return errors.Join(errs...)
}
