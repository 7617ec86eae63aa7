// Command budget runs the delete-budget measure of issue 17 on PostgreSQL:
// a foreground workload (point selects and updates at a fixed rate on a
// table of its own) whose latency is measured alone, while a backlog of
// expired jobs is swept by one Pass through a pgkv.AtomicKV without a
// budget, the same with Config.Limiter, and while the backlog is swept by
// a non-atomic ClearBatch (for its WAL). It prints one Markdown table. Run
// it through the test script, which starts PostgreSQL:
//
//	./scripts/test --exec ./scripts/bench budget
//
// It reads RETENTION_POSTGRES_DSN.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention/bench"
)

func main() {
	var cfg bench.Budget
	flag.IntVar(&cfg.Backlog, "backlog", 200_000, "expired jobs per sweep")
	flag.IntVar(&cfg.BatchSize, "batch", 1000, "Config.BatchSize")
	flag.IntVar(&cfg.PageSize, "page", 1000, "Config.PageSize")
	flag.Float64Var(&cfg.Limit, "limit", 20_000, "the budget, entities per second")
	flag.IntVar(&cfg.Burst, "burst", 1000, "the budget's burst")
	flag.Float64Var(&cfg.FGRate, "fg-rate", 500, "foreground operations per second")
	flag.IntVar(&cfg.FGWorkers, "fg-workers", 4, "goroutines sending them")
	flag.IntVar(&cfg.FGRows, "fg-rows", 100_000, "rows of the foreground table")
	flag.Float64Var(&cfg.FGUpdates, "fg-updates", 0.2, "fraction of foreground operations that are updates")
	flag.DurationVar(&cfg.Alone, "alone", 10*time.Second, "how long the foreground runs alone")
	flag.Parse()
	log.SetFlags(0)
	if err := run(cfg); err != nil {
		log.Fatal(err)
	}
}

func run(cfg bench.Budget) error {
	ctx := context.Background()
	dsn := os.Getenv("RETENTION_POSTGRES_DSN")
	if dsn == "" {
		return fmt.Errorf("RETENTION_POSTGRES_DSN is not set: run through ./scripts/test --exec ./scripts/bench budget")
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(cfg.FGWorkers) + 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var version string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version') || ', fsync ' || current_setting('fsync') || ', full_page_writes ' || current_setting('full_page_writes')`).Scan(&version); err != nil {
		return err
	}
	fmt.Printf("PostgreSQL %s; %d CPUs, %s. Foreground: %.0f ops/s (%.0f%% updates, the rest point selects) from %d goroutines on a %d-row table. "+
		"Each sweep: one Pass over a backlog of %d expired jobs (row + marker), BatchSize %d, PageSize %d, after a CHECKPOINT. "+
		"Latency from the call; \"due p99\" from the time the operation was due (queueing included).\n\n",
		version, runtime.NumCPU(), runtime.Version(), cfg.FGRate, 100*cfg.FGUpdates, cfg.FGWorkers, cfg.FGRows,
		cfg.Backlog, cfg.BatchSize, cfg.PageSize)
	phases, err := bench.RunBudget(ctx, pool, cfg, func(s string) { log.Print(s) })
	if err != nil {
		return err
	}
	var alone bench.BudgetPhase
	for _, p := range phases {
		if p.Cleared == 0 {
			alone = p
			break
		}
	}
	aloneWALps := alone.WAL / alone.Elapsed.Seconds()
	fmt.Println("| phase | fg ops | fg p50 | fg p99 | p99 vs alone | fg due p99 | fg max | sweep time | sweep entities/s | clear calls | BudgetWait | WAL bytes/entity |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, p := range phases {
		sweep, rateS, walS := "", "", ""
		if p.Cleared > 0 {
			sweep = p.Elapsed.Round(time.Millisecond).String()
			rateS = fmt.Sprintf("%.0f", float64(p.Cleared)/p.Elapsed.Seconds())
			walS = fmt.Sprintf("%.0f", (p.WAL-aloneWALps*p.Elapsed.Seconds())/float64(p.Cleared))
		}
		fmt.Printf("| %s | %d | %v | %v | %+.0f%% | %v | %v | %s | %s | %d | %v | %s |\n",
			p.Name, p.Ops, p.P50.Round(10*time.Microsecond), p.P99.Round(10*time.Microsecond),
			100*(float64(p.P99)/float64(alone.P99)-1), p.LateP99.Round(10*time.Microsecond), p.Max.Round(10*time.Microsecond),
			sweep, rateS, p.ClearCalls, p.BudgetWait.Round(time.Millisecond), walS)
	}
	fmt.Printf("\nWAL per entity: bytes between pg_current_wal_lsn() before and after the sweep, less the foreground's own rate alone (%.0f bytes/s), over the entities cleared.\n", aloneWALps)
	return nil
}
