// Command interval runs the MinInterval measure on PostgreSQL:
// a job service finishing jobs at a steady rate (100, 1,000 and 10,000 a
// second by default), swept under Run through a pgkv.AtomicKV, once per
// Config.MinInterval. It prints one Markdown table: passes and clear
// transactions per second against the database's own lag past due. Run it
// through the test script, which starts PostgreSQL:
//
//	./scripts/test --exec ./scripts/bench interval
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
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention/bench"
)

func main() {
	rates := flag.String("rates", "100,1000,10000", "comma-separated jobs finished per second")
	intervals := flag.String("min-interval", "-1ns,10ms,50ms,200ms", "comma-separated Config.MinInterval values (negative: none)")
	dur := flag.Duration("duration", 10*time.Second, "how long jobs are written per cell")
	retention := flag.Duration("retention", 2*time.Second, "Config.Retention")
	batch := flag.Int("batch", 500, "Config.BatchSize")
	page := flag.Int("page", 1000, "Config.PageSize")
	writers := flag.Int("writers", 0, "goroutines writing jobs; 0: 4 below 5,000 jobs/s, else 32")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*rates, *intervals, *dur, *retention, *batch, *page, *writers); err != nil {
		log.Fatal(err)
	}
}

func run(rates, intervals string, dur, retention time.Duration, batch, page, nw int) error {
	ctx := context.Background()
	dsn := os.Getenv("RETENTION_POSTGRES_DSN")
	if dsn == "" {
		return fmt.Errorf("RETENTION_POSTGRES_DSN is not set: run through ./scripts/test --exec ./scripts/bench interval")
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 48 // writers, the sweep, the drain check
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var version string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version') || ', fsync ' || current_setting('fsync')`).Scan(&version); err != nil {
		return err
	}
	fmt.Printf("PostgreSQL %s; %d CPUs, %s. Each cell: jobs written for %v (row + MarkTx in one transaction), Retention %v, "+
		"BatchSize %d, PageSize %d, one replica under Run, pgkv.AtomicKV. Passes and clear transactions counted from the first job's due time to the last's; "+
		"lag = deleted_at - due_at, both recorded by the database in the clearing transaction.\n\n",
		version, runtime.NumCPU(), runtime.Version(), dur, retention, batch, page)
	fmt.Println("| rate (jobs/s) | writers | reached | MinInterval | passes/s | working passes/s | clear tx/s | jobs per tx | lag p50 | lag p99 | lag max | left |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for rs := range strings.SplitSeq(rates, ",") {
		var rate float64
		if _, err := fmt.Sscan(rs, &rate); err != nil {
			return fmt.Errorf("-rates: %q: %v", rs, err)
		}
		writers := 4
		if rate >= 5000 {
			writers = 32
		}
		if nw > 0 {
			writers = nw
		}
		for is := range strings.SplitSeq(intervals, ",") {
			mi, err := time.ParseDuration(is)
			if err != nil {
				return fmt.Errorf("-min-interval: %v", err)
			}
			cfg := bench.Interval{
				Name: fmt.Sprintf("%.0f/s, MinInterval %v", rate, mi), Rate: rate, Duration: dur, Writers: writers,
				Retention: retention, BatchSize: batch, PageSize: page, MinInterval: mi, Drain: 20 * time.Second,
			}
			log.Printf("%s: start", cfg.Name)
			r, err := bench.RunInterval(ctx, pool, cfg, func(s string) { log.Print(s) })
			if err != nil {
				return fmt.Errorf("%s: %w", cfg.Name, err)
			}
			w := r.Window.Seconds()
			mis := mi.String()
			if mi < 0 {
				mis = "none (-1)"
			}
			perTx := 0.0
			if r.ClearCalls > 0 {
				perTx = float64(r.Lags.Cleared) / float64(r.ClearCalls)
			}
			fmt.Printf("| %.0f | %d | %.0f | %s | %.1f | %.1f | %.1f | %.1f | %v | %v | %v | %d |\n",
				rate, writers, r.WriteRate, mis, float64(r.Passes)/w, float64(r.Working)/w, float64(r.ClearCalls)/w, perTx,
				r.Lags.P50.Round(100*time.Microsecond), r.Lags.P99.Round(100*time.Microsecond), r.Lags.Max.Round(100*time.Microsecond), r.Left)
		}
	}
	return nil
}
