// Command budget runs the delete-budget measure on PostgreSQL:
// a foreground workload (point selects and updates at a fixed rate on a
// table of its own) whose latency is measured while a backlog of expired
// jobs is swept through a pgkv.AtomicKV with Config.Limiter, in windows
// alternating with windows of the foreground alone, then while the backlog
// is swept without a budget, atomically and by a non-atomic ClearBatch
// (for its WAL). It prints one Markdown table and a summary. Run
// it through the test script, which starts PostgreSQL:
//
//	./scripts/test --exec ./scripts/bench budget
//
// With -curve it measures instead protection as a curve: the flat-out
// rate of the sweep first, then, in one run of alternating windows
// (alone, a contender, alone, ...; the contenders' order rotated each
// round), budgets of -percents of that rate, one at River's rate, flat
// out, all of a jobs table and its marker table; River's cleaner at its
// own pace on a river_job backlog; and the table sweep of that river_job
// itself (sqlkv.AtomicTableKV by finalized_at) budgeted to River's rate,
// at -table-percents, and flat out. It prints the foreground's p50, p99
// and max against the alone windows either side, and each contender's
// deletion rate, as a Markdown table, and with -svg writes the plot (the
// path is relative to bench/):
//
//	./scripts/test --exec ./scripts/bench budget -curve -svg ../docs/budget-curve.svg
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
	"slices"
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
	flag.DurationVar(&cfg.Window, "window", 10*time.Second, "length of each window, alone and budgeted")
	curve := flag.Bool("curve", false, "measure the curve: budgets of -percents of the marker sweep's flat-out rate (-batch flat out), River's cleaner, and the table sweep of river_job, in alternating windows")
	rounds := flag.Int("rounds", 7, "with -curve: rounds of every contender")
	percents := flag.String("percents", "2,5,10,25,50", "with -curve: comma-separated budgets of the marker sweep in percent of its flat-out rate")
	tablePercents := flag.String("table-percents", "", "with -curve: comma-separated budgets of the table sweep of river_job in percent of the marker sweep's flat-out rate, beside its budget at River's rate and flat out")
	batchTime := flag.Duration("batch-time", 20*time.Millisecond, "with -curve: a budget's BatchSize is what it grants in this long, rounded to 10, 20, 25, 50, ... 1,000")
	svg := flag.String("svg", "", "with -curve: write the plot to this file")
	flag.Parse()
	log.SetFlags(0)
	var err error
	if *curve {
		err = runCurveMain(cfg, *rounds, *percents, *tablePercents, *batchTime, *svg)
	} else {
		err = run(cfg)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func connect(ctx context.Context, conns int) (*pgxpool.Pool, string, error) {
	dsn := os.Getenv("RETENTION_POSTGRES_DSN")
	if dsn == "" {
		return nil, "", fmt.Errorf("RETENTION_POSTGRES_DSN is not set: run through ./scripts/test --exec ./scripts/bench budget")
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, "", err
	}
	pcfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, "", err
	}
	var version string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version') || ', fsync ' || current_setting('fsync') || ', full_page_writes ' || current_setting('full_page_writes')`).Scan(&version); err != nil {
		pool.Close()
		return nil, "", err
	}
	return pool, version, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func run(cfg bench.Budget) error {
	ctx := context.Background()
	pool, version, err := connect(ctx, cfg.FGWorkers+8)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Printf("PostgreSQL %s; %d CPUs, %s. Foreground: %.0f ops/s (%.0f%% updates, the rest point selects) from %d goroutines on a %d-row table. "+
		"Each sweep: a backlog of %d expired jobs (row + marker), BatchSize %d, PageSize %d, after a CHECKPOINT; budget %.0f/s, burst %d, in windows of %v. "+
		"Latency from the call; \"due p99\" from the time the operation was due (queueing included).\n\n",
		version, runtime.NumCPU(), runtime.Version(), cfg.FGRate, 100*cfg.FGUpdates, cfg.FGWorkers, cfg.FGRows,
		cfg.Backlog, cfg.BatchSize, cfg.PageSize, cfg.Limit, cfg.Burst, cfg.Window)
	phases, err := bench.RunBudget(ctx, pool, cfg, func(s string) { log.Print(s) })
	if err != nil {
		return err
	}
	var aloneP99, budgetP99, ratios []float64
	var aloneWAL, aloneTime, budgetWAL, budgetTime float64
	var budgetCleared int
	var budgetWait time.Duration
	for i, p := range phases {
		switch {
		case p.Budgeted:
			budgetP99 = append(budgetP99, float64(p.P99))
			// Against the mean of the alone windows either side.
			ratios = append(ratios, float64(p.P99)/((float64(phases[i-1].P99)+float64(phases[i+1].P99))/2))
			budgetWAL += p.WAL
			budgetTime += p.Elapsed.Seconds()
			budgetCleared += p.Cleared
			budgetWait += p.BudgetWait
		case p.Cleared == 0:
			aloneP99 = append(aloneP99, float64(p.P99))
			aloneWAL += p.WAL
			aloneTime += p.Elapsed.Seconds()
		}
	}
	aloneWALps := aloneWAL / aloneTime
	fmt.Println("| phase | fg ops | fg p50 | fg p99 | p99 vs alone either side | fg due p99 | fg max | sweep time | cleared | entities/s | clear calls | BudgetWait | WAL bytes/entity |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	r := 0
	for _, p := range phases {
		sweep, cleared, rateS, walS, vs := "", "", "", "", ""
		if p.Cleared > 0 {
			sweep = p.Elapsed.Round(time.Millisecond).String()
			cleared = fmt.Sprint(p.Cleared)
			rateS = fmt.Sprintf("%.0f", float64(p.Cleared)/p.Elapsed.Seconds())
			walS = fmt.Sprintf("%.0f", (p.WAL-aloneWALps*p.Elapsed.Seconds())/float64(p.Cleared))
		}
		if p.Budgeted {
			vs = fmt.Sprintf("%.2f×", ratios[r])
			r++
		}
		fmt.Printf("| %s | %d | %v | %v | %s | %v | %v | %s | %s | %s | %d | %v | %s |\n",
			p.Name, p.Ops, p.P50.Round(10*time.Microsecond), p.P99.Round(10*time.Microsecond), vs,
			p.LateP99.Round(10*time.Microsecond), p.Max.Round(10*time.Microsecond),
			sweep, cleared, rateS, p.ClearCalls, p.BudgetWait.Round(time.Millisecond), walS)
	}
	ms := func(f float64) string { return time.Duration(f).Round(10 * time.Microsecond).String() }
	fmt.Printf("\nBudgeted sweep: %d entities in %.1f s of budgeted windows = %.0f/s against a budget of %.0f/s (%+.1f%%); BudgetWait %v; WAL %.0f bytes/entity.\n",
		budgetCleared, budgetTime, float64(budgetCleared)/budgetTime, cfg.Limit, 100*(float64(budgetCleared)/budgetTime/cfg.Limit-1),
		budgetWait.Round(time.Millisecond), (budgetWAL-aloneWALps*budgetTime)/float64(budgetCleared))
	fmt.Printf("Foreground p99: median of %d alone windows %s, of %d budgeted windows %s (%.2f×); median of the budgeted windows' ratios to the alone windows either side %.2f×.\n",
		len(aloneP99), ms(median(aloneP99)), len(budgetP99), ms(median(budgetP99)), median(budgetP99)/median(aloneP99), median(ratios))
	fmt.Printf("WAL per entity: bytes between pg_current_wal_lsn() before and after, less the foreground's own rate alone (%.0f bytes/s), over the entities cleared.\n", aloneWALps)
	return nil
}
