package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"
)

// curveRow is a contender's medians over its windows: the rate, the
// foreground's latency, and that latency over the mean of the alone
// windows either side (x).
type curveRow struct {
	c              *contender // nil: the alone windows
	windows        int
	rate           float64
	p50, p99, max  float64 // ns
	x50, x99, xmax float64
}

func (r *curveRun) rows(cs []*contender) []curveRow {
	var alone curveRow
	var a50, a99, amax []float64
	for _, w := range r.windows {
		if w.c == nil {
			a50, a99, amax = append(a50, float64(w.p50)), append(a99, float64(w.p99)), append(amax, float64(w.max))
		}
	}
	alone = curveRow{windows: len(a50), p50: median(a50), p99: median(a99), max: median(amax), x50: 1, x99: 1, xmax: 1}
	out := []curveRow{alone}
	for _, c := range cs {
		var rates, p50, p99, pmax, x50, x99, xmax []float64
		for i, w := range r.windows {
			if w.c != c {
				continue
			}
			rates = append(rates, w.rate())
			p50, p99, pmax = append(p50, float64(w.p50)), append(p99, float64(w.p99)), append(pmax, float64(w.max))
			x50 = append(x50, r.either(i, func(w window) time.Duration { return w.p50 }))
			x99 = append(x99, r.either(i, func(w window) time.Duration { return w.p99 }))
			xmax = append(xmax, r.either(i, func(w window) time.Duration { return w.max }))
		}
		out = append(out, curveRow{c: c, windows: len(rates), rate: median(rates),
			p50: median(p50), p99: median(p99), max: median(pmax),
			x50: median(x50), x99: median(x99), xmax: median(xmax)})
	}
	return out
}

// either is a figure of window i over its mean in the alone windows
// either side.
func (r *curveRun) either(i int, f func(window) time.Duration) float64 {
	return float64(f(r.windows[i])) / ((float64(f(r.windows[i-1])) + float64(f(r.windows[i+1]))) / 2)
}

// paired99 compares the p99 ratios of a's and b's windows round by
// round: in how many of the rounds both ran a's was lower.
func (r *curveRun) paired99(a, b *contender) (lower, rounds int) {
	x := map[*contender]map[int]float64{a: {}, b: {}}
	for i, w := range r.windows {
		if w.c == a || w.c == b {
			x[w.c][w.round] = r.either(i, func(w window) time.Duration { return w.p99 })
		}
	}
	for round, xa := range x[a] {
		if xb, ok := x[b][round]; ok {
			rounds++
			if xa < xb {
				lower++
			}
		}
	}
	return lower, rounds
}

// curveTable writes the rows as a Markdown table.
func curveTable(w io.Writer, rows []curveRow) {
	fmt.Fprintln(w, "| deleter | BatchSize | deleted/s | fg p50 | fg p99 | fg max |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rows {
		name, batch, rate := fmt.Sprintf("none (%d alone windows)", r.windows), "", ""
		if r.c != nil {
			name, batch, rate = r.c.name, count(float64(r.c.batch)), count(r.rate)
			if r.c.limit > 0 {
				name = fmt.Sprintf("%s = %s/s", r.c.name, count(r.c.limit))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", name, batch, rate,
			cell(r.p50, r.x50), cell(r.p99, r.x99), cell(r.max, r.xmax))
	}
}

func cell(ns, x float64) string {
	return fmt.Sprintf("%.2f ms (%.2f×)", ns/1e6, x)
}

// curvePoints returns the rows on the marker sweep's curve (BatchSize by
// budgetBatch, and flat out), by rate, its budgets off it, River's row,
// and the table sweep's rows, by rate.
func curvePoints(rows []curveRow) (budgets, off []curveRow, river curveRow, tables []curveRow) {
	for _, r := range rows {
		switch {
		case r.c == nil:
		case r.c.river:
			river = r
		case r.c.table:
			tables = append(tables, r)
		case r.c.offRule:
			off = append(off, r)
		default:
			budgets = append(budgets, r)
		}
	}
	byRate := func(a, b curveRow) int { return cmp.Compare(a.rate, b.rate) }
	slices.SortFunc(budgets, byRate)
	slices.SortFunc(tables, byRate)
	return budgets, off, river, tables
}

// interpolate returns the budgets' p99 ratio at rate, linearly between
// the two points around it, and false when rate is outside the curve.
func interpolate(budgets []curveRow, rate float64) (float64, bool) {
	for i := 1; i < len(budgets); i++ {
		a, b := budgets[i-1], budgets[i]
		if a.rate <= rate && rate <= b.rate {
			return a.x99 + (b.x99-a.x99)*(rate-a.rate)/(b.rate-a.rate), true
		}
	}
	return 0, false
}

// curveSummary writes the calibration and whether the budgeted sweeps
// disturb the foreground's p99 less than River's cleaner at its rate:
// the marker sweep's curve there, and the table sweep of river_job
// budgeted to it, window by window against River's in the same rounds.
func curveSummary(w io.Writer, r *curveRun, rows []curveRow) {
	fmt.Fprintf(w, "\nBefore the rounds, in two windows each: the marker sweep flat out %s/s (the budgets' 100%%), River's cleaner %s/s.\n",
		count(r.flatRate), count(r.riverRate))
	budgets, off, river, tables := curvePoints(rows)
	x, ok := interpolate(budgets, river.rate)
	verdict := "met"
	if !ok || x >= river.x99 {
		verdict = "not met"
	}
	fmt.Fprintf(w, "At River's rate (%s/s in its windows) River's cleaner costs the foreground's p99 %.2f×; the marker sweep's budgets' curve, interpolated there, %.2f× (ok %v): target %s.",
		count(river.rate), river.x99, x, ok, verdict)
	for _, b := range append(append(budgets, off...), tables...) {
		if b.c.atRiver {
			fmt.Fprintf(w, " %s (BatchSize %s): %.2f× at %s/s", b.c.name, count(float64(b.c.batch)), b.x99, count(b.rate))
			if b.c.table {
				lower, n := r.paired99(b.c, river.c)
				fmt.Fprintf(w, ", below River's in %d of %d rounds (its window's ratio against River's window's in the same round)", lower, n)
			}
			fmt.Fprint(w, ".")
		}
	}
	fmt.Fprintln(w)
	short := 0
	for _, w := range append(slices.Clone(r.calib), r.windows...) {
		short += w.cleared - w.reported
	}
	fmt.Fprintf(w, "The sweeps' Stats.Cleared fell %d short of the rows they deleted over the run: batches that committed as a window's context ended, reported as failed; the rates count the rows.\n", short)
	fmt.Fprintln(w, "Each figure is the median over the contender's windows; × is a window's figure over the mean of the alone windows either side, median over windows.")
	if len(r.loads) > 0 {
		fmt.Fprintf(w, "Load (1 minute) as the rounds began: %.2f to %.2f.\n", slices.Min(r.loads), slices.Max(r.loads))
	}
}

// count formats a rate or a count with thousands separators: 12,345.
func count(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
