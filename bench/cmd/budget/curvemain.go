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

func runCurveMain(b bench.Budget, rounds int, percents, tablePercents string, batchTime time.Duration, svg string) error {
	cfg := curveConfig{
		fg:     b,
		Rounds: rounds, Window: b.Window, BatchTime: batchTime, FlatBatch: b.BatchSize, SVG: svg,
	}
	var err error
	if cfg.Percents, err = parsePercents("-percents", percents); err != nil {
		return err
	}
	if tablePercents != "" {
		if cfg.TablePercents, err = parsePercents("-table-percents", tablePercents); err != nil {
			return err
		}
	}
	ctx := context.Background()
	pool, version, err := connect(ctx, cfg.fg.FGWorkers+8)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Printf("PostgreSQL %s; %d CPUs, %s; load %s. Foreground: %.0f ops/s (%.0f%% updates, the rest point selects) from %d goroutines on a %d-row table. "+
		"Marker sweeps: pgkv.AtomicKV on a jobs table and its marker table. River: its cleaner's loop (JobDeleteBefore of %d, pause 50 ms to 1 s) on river_job. "+
		"Table sweeps: sqlkv.AtomicTableKV on that river_job itself, by finalized_at (filter %s, partial index on (finalized_at, id)). "+
		"Sweeps flat out with BatchSize and PageSize %d; budgets with burst = BatchSize = what the budget grants in %v (rounded). "+
		"%d rounds of %v windows; tables vacuumed after each contender's window.\n\n",
		version, runtime.NumCPU(), runtime.Version(), loadavg(), cfg.fg.FGRate, 100*cfg.fg.FGUpdates, cfg.fg.FGWorkers, cfg.fg.FGRows,
		riverBatch, bench.RiverStates, cfg.FlatBatch, cfg.BatchTime, cfg.Rounds, cfg.Window)
	start := time.Now()
	run, cs, checkErr := runCurve(ctx, pool, cfg, func(s string) { log.Printf("%s %s", time.Since(start).Round(time.Second), s) })
	if run == nil {
		return checkErr
	}
	rows := run.rows(cs)
	curveTable(os.Stdout, rows)
	curveSummary(os.Stdout, run, rows)
	fmt.Printf("Run time %v; load %s.\n", time.Since(start).Round(time.Second), loadavg())
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

// parsePercents reads the comma-separated percentages of the flag name.
func parsePercents(name, list string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v <= 0 || v >= 100 {
			return nil, fmt.Errorf("%s: %q is not a percentage between 0 and 100", name, p)
		}
		out = append(out, v)
	}
	return out, nil
}

// loadavg is the machine's load average over 1, 5 and 15 minutes, or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// load1 is the machine's load average over 1 minute, or -1.
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 1 {
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			return v
		}
	}
	return -1
}
