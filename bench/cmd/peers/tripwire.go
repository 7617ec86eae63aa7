package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/marksweep/retention/bench"
)

// tripwire runs, in each suite of suites (pg, redis), the peer's cleaner
// and the adapter's atomic clear (batches of 1,000, concurrency 1), and
// returns an error naming every suite whose median ratio of the two
// (paired within rounds, see bench.Ratio) falls below its minimum:
// minRiver for pgkv.AtomicKV against River's JobDeleteBefore, minAsynq for
// rediskv.AtomicKV against the asynq-style script. The minimums are far
// below what the adapters measure, so that a busy machine does not trip
// it, and far above what a halving of their throughput leaves (see
// BENCHMARKS.md).
func tripwire(ctx context.Context, n, rounds int, suites []string, minRiver, minAsynq float64) error {
	fmt.Printf("tripwire: %d expired entities per run, %d rounds, contenders alternated; load %s\n\n", n, rounds, loadavg())
	var errs []error
	check := func(what, peer string, res []bench.Result, least float64) {
		got := bench.Ratio(res[1], res[0])
		verdict := "ok"
		if got < least {
			verdict = "FAILED"
			errs = append(errs, fmt.Errorf("tripwire: %s at %.2f× %s, below %.2f×", what, got, peer, least))
		}
		fmt.Printf("tripwire: %s at %.2f× %s (at least %.2f×): %s\n\n", what, got, peer, least, verdict)
	}
	for _, s := range suites {
		switch s {
		case "pg":
			res, err := runPG(ctx, os.Getenv("RETENTION_POSTGRES_DSN"), false, n, rounds, func(p *bench.PG) []bench.Contender {
				return []bench.Contender{p.River(), p.AtomicBatches(1000, 1)}
			}, []string{"River"}, "")
			if err != nil {
				return fmt.Errorf("pg: %w", err)
			}
			check("pgkv.AtomicKV", "River", res, minRiver)
		case "redis":
			res, err := runRedis(ctx, n, rounds, func(r *bench.Redis) []bench.Contender {
				return []bench.Contender{r.Janitor(), r.AtomicBatches(1000, 1)}
			}, []string{"asynq-style"}, "")
			if err != nil {
				return fmt.Errorf("redis: %w", err)
			}
			check("rediskv.AtomicKV", "the asynq-style script", res, minAsynq)
		case "pg-fsync":
			// The tripwire needs no second server.
		default:
			return fmt.Errorf("unknown suite %q", s)
		}
	}
	return errors.Join(errs...)
}
