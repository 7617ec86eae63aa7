package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/marksweep/retention/bench"
)

func runCurveMain(b bench.Budget, rounds int, percents string, batchTime time.Duration, svg string) error {
	cfg := curveConfig{
		fg:     b,
		Rounds: rounds, Window: b.Window, BatchTime: batchTime, FlatBatch: b.BatchSize, SVG: svg,
	}
	for _, p := range strings.Split(percents, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v <= 0 || v >= 100 {
			return fmt.Errorf("-percents: %q is not a percentage between 0 and 100", p)
		}
		cfg.Percents = append(cfg.Percents, v)
	}
	ctx := context.Background()
	pool, version, err := connect(ctx, cfg.fg.FGWorkers+8)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Printf("PostgreSQL %s; %d CPUs, %s. Foreground: %.0f ops/s (%.0f%% updates, the rest point selects) from %d goroutines on a %d-row table. "+
		"Sweeps: pgkv.AtomicKV on a jobs table, flat out with BatchSize and PageSize %d; budgets with burst = BatchSize = what the budget grants in %v (rounded). "+
		"River: its cleaner's loop (JobDeleteBefore of %d, pause 50 ms to 1 s) on river_job. %d rounds of %v windows; tables vacuumed after each contender's window.\n\n",
		version, runtime.NumCPU(), runtime.Version(), cfg.fg.FGRate, 100*cfg.fg.FGUpdates, cfg.fg.FGWorkers, cfg.fg.FGRows,
		cfg.FlatBatch, cfg.BatchTime, riverBatch, cfg.Rounds, cfg.Window)
	start := time.Now()
	run, cs, checkErr := runCurve(ctx, pool, cfg, func(s string) { log.Printf("%s %s", time.Since(start).Round(time.Second), s) })
	if run == nil {
		return checkErr
	}
	rows := run.rows(cs)
	curveTable(os.Stdout, rows)
	curveSummary(os.Stdout, run, rows)
	fmt.Printf("Run time %v.\n", time.Since(start).Round(time.Second))
	if svg == "" {
		return checkErr
	}
	f, err := os.Create(svg)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("Foreground latency while deleting (%d CPUs, PostgreSQL, %d rounds)", runtime.NumCPU(), cfg.Rounds)
	if err := curveSVG(f, rows, title); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return checkErr
}
