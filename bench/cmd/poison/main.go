// Command poison runs the poison-id scenario on PostgreSQL: a job service
// finishing jobs at a steady rate, swept through a pgkv.AtomicKV under
// Run, while a few jobs cannot be deleted (a trigger refuses them for a
// while) or have their row locked when they fall due. It compares the
// database's own record of each deletion (due time and deletion time,
// logged in the clearing transaction) with what the sweep reports: Stats,
// the lag samples of an Observer, and Sweep.Backlog. It prints Markdown
// tables. Run it through the test script, which starts PostgreSQL:
//
//	./scripts/test --exec ./scripts/bench poison
//
// It reads RETENTION_POSTGRES_DSN. Three configurations run by default:
// no faults, faults with BatchSize 500, faults with BatchSize 50; with
// -lock-timeout each fault configuration runs again with a
// pgkv.LockTimeout; with -rounds above 1 each runs once per round, their
// order rotated.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention/bench"
)

func main() {
	base := bench.Poison{}
	flag.IntVar(&base.Jobs, "jobs", 10_000, "jobs finished per run")
	flag.Float64Var(&base.Rate, "rate", 700, "jobs finished per second")
	flag.IntVar(&base.Writers, "writers", 4, "goroutines writing jobs")
	flag.DurationVar(&base.Retention, "retention", 3*time.Second, "Config.Retention")
	flag.IntVar(&base.PageSize, "page", 1000, "Config.PageSize")
	flag.DurationVar(&base.ClearTimeout, "clear-timeout", 0, "Config.ClearTimeout (0: the library's default)")
	flag.DurationVar(&base.RetryDelay, "retry-delay", 0, "Config.RetryDelay (0: the library's default)")
	flag.IntVar(&base.Replicas, "replicas", 2, "replicas sweeping under Run; above 1 they share a pgkv.Locker")
	poison := flag.Float64("poison", 0.005, "fraction of jobs whose delete fails, in the fault configurations")
	flag.DurationVar(&base.PoisonFor, "poison-for", 10*time.Second, "how long past its due time a poisoned job's delete keeps failing; 0: for the whole run")
	locked := flag.Float64("locked", 0.001, "fraction of jobs whose row is locked when they fall due, in the fault configurations")
	flag.DurationVar(&base.LockFor, "lock-for", 3*time.Second, "how long such a row stays locked")
	flag.DurationVar(&base.Drain, "drain", 30*time.Second, "how long a run goes on after the last job fell due, for the sweep to catch up")
	flag.Uint64Var(&base.Seed, "seed", 16, "picks the faulty jobs (the same in every configuration)")
	batches := flag.String("batch", "500,50", "comma-separated BatchSizes of the fault configurations")
	lockTimeouts := flag.String("lock-timeout", "", "comma-separated pgkv.LockTimeouts: each fault configuration runs again with each (e.g. 250ms)")
	baseline := flag.Int("baseline", 500, "BatchSize of the configuration without faults; 0: none")
	rounds := flag.Int("rounds", 1, "rounds; every configuration runs once per round, the order rotated")
	flag.Parse()
	log.SetFlags(0)

	var cfgs []bench.Poison
	if *baseline > 0 {
		c := base
		c.Name = fmt.Sprintf("no faults, BatchSize %d", *baseline)
		c.BatchSize = *baseline
		cfgs = append(cfgs, c)
	}
	for s := range strings.SplitSeq(*batches, ",") {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil {
			log.Fatalf("-batch: %q: %v", s, err)
		}
		c := base
		c.Name = fmt.Sprintf("faults, BatchSize %d", n)
		c.BatchSize, c.Poison, c.Locked = n, *poison, *locked
		cfgs = append(cfgs, c)
		if *lockTimeouts == "" {
			continue
		}
		for s := range strings.SplitSeq(*lockTimeouts, ",") {
			d, err := time.ParseDuration(s)
			if err != nil {
				log.Fatalf("-lock-timeout: %v", err)
			}
			lc := c
			lc.Name = fmt.Sprintf("faults, BatchSize %d, LockTimeout %v", n, d)
			lc.LockTimeout = d
			cfgs = append(cfgs, lc)
		}
	}
	if err := run(context.Background(), cfgs, *rounds); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, cfgs []bench.Poison, rounds int) error {
	dsn := os.Getenv("RETENTION_POSTGRES_DSN")
	if dsn == "" {
		return fmt.Errorf("RETENTION_POSTGRES_DSN is not set: run through ./scripts/test --exec ./scripts/bench poison")
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	// Writers, row-lock holders, the sweeps, their lease and the monitor.
	pcfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var version string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version') || ', fsync ' || current_setting('fsync')`).Scan(&version); err != nil {
		return err
	}
	c := cfgs[0]
	poisonFor := "for the whole run"
	if c.PoisonFor > 0 {
		poisonFor = fmt.Sprintf("until %v past due", c.PoisonFor)
	}
	fmt.Printf("PostgreSQL %s; %d CPUs, %s. Each run: %d jobs at %.0f/s, Retention %v, PageSize %d, %d replica(s) under Run, pgkv.AtomicKV; "+
		"faults: %.1f%% poisoned (delete fails %s), %.1f%% row-locked %v at due time. One run per configuration and round, order rotated.\n\n",
		version, runtime.NumCPU(), runtime.Version(), c.Jobs, c.Rate, c.Retention, c.PageSize, c.Replicas,
		100*cfgs[len(cfgs)-1].Poison, poisonFor, 100*cfgs[len(cfgs)-1].Locked, c.LockFor)
	var results []bench.PoisonResult
	for round := range rounds {
		for k := range cfgs {
			cfg := cfgs[(k+round)%len(cfgs)]
			if rounds > 1 {
				cfg.Name = fmt.Sprintf("%s (round %d)", cfg.Name, round+1)
			}
			log.Printf("%s: start", cfg.Name)
			r, err := bench.RunPoison(ctx, pool, cfg, func(s string) { log.Print(s) })
			if err != nil {
				return fmt.Errorf("%s: %w", cfg.Name, err)
			}
			log.Printf("%s: done in %v", cfg.Name, r.Wall.Round(time.Second))
			results = append(results, r)
		}
	}
	return bench.PoisonTables(os.Stdout, results)
}
