package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention/bench"
)

// window is the figures of one window: the foreground alone (c nil) or
// beside a contender.
type window struct {
	c             *contender
	round         int // 1 to Rounds; 0 before the rounds
	ops           int
	p50, p99, max time.Duration
	cleared       int // rows deleted
	reported      int // what the contender said it deleted
	elapsed       time.Duration
}

func (w window) rate() float64 { return float64(w.cleared) / w.elapsed.Seconds() }

// curveRun is one -curve run: its database, what it measured, and the
// rates the backlogs are refilled for.
type curveRun struct {
	cfg       curveConfig
	db        *curveDB
	progress  func(string)
	flatRate  float64 // entities/s, measured flat out before the rounds
	riverRate float64 // River's jobs/s, measured before the rounds
	calib     []window
	warmFloor bool      // the table sweep's first window flat out is next
	loads     []float64 // the 1-minute load average as each round began
	windows   []window  // alone, contender, alone, ... in the order run
}

// runCurve measures the flat-out and River rates in two windows each
// (after one to warm up), derives the budgets from the flat-out rate,
// then runs cfg.Rounds rounds of every contender, each window between
// two windows of the foreground alone. The table sweep flat out gets one
// window to warm up too, whose count sizes river_job's backlog. It
// returns no figures when a window failed, and the figures with an error
// when the rows left at the end are not what was written less what was
// counted deleted.
func runCurve(ctx context.Context, pool *pgxpool.Pool, cfg curveConfig, progress func(string)) (*curveRun, []*contender, error) {
	db, err := newCurveDB(ctx, pool, cfg.fg.FGRows)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err := db.drop(); err != nil {
			progress("dropping " + db.schema + ": " + err.Error())
		}
	}()
	r := &curveRun{cfg: cfg, db: db, progress: progress}
	flat, err := db.sweepContender("flat out", 0, 0, cfg.FlatBatch, cfg.FlatBatch)
	if err != nil {
		return nil, nil, err
	}
	river := db.riverContender()
	tableFlat, err := db.tableContender("flat out", 0, 0, cfg.FlatBatch, cfg.FlatBatch)
	if err != nil {
		return nil, nil, err
	}
	// The first window of each runs on a cold cache, right after the fill
	// and its checkpoint: it warms up and counts for nothing. No budget
	// needs the table sweep's flat-out rate: its one window sizes
	// river_job's backlog for the rounds.
	for i, c := range []*contender{flat, flat, flat, river, river, river, tableFlat} {
		if c == tableFlat {
			r.warmFloor = true
		}
		if err := r.topUp(ctx); err != nil {
			return nil, nil, err
		}
		w, err := r.measure(ctx, c)
		if err != nil {
			return nil, nil, err
		}
		r.warmFloor = false
		if err := r.tidy(ctx, &w); err != nil {
			return nil, nil, err
		}
		if i%3 != 0 || c == tableFlat {
			r.calib = append(r.calib, w)
		}
	}
	r.flatRate, r.riverRate = rateOf(r.calib, flat), rateOf(r.calib, river)
	progress(fmt.Sprintf("flat out %.0f/s, River %.0f/s", r.flatRate, r.riverRate))

	cs, err := r.budgets()
	if err != nil {
		return nil, nil, err
	}
	tables, err := r.tables()
	if err != nil {
		return nil, nil, err
	}
	cs = append(append(cs, flat, river), append(tables, tableFlat)...)
	if err := r.rounds(ctx, cs); err != nil {
		return nil, nil, err
	}
	// Checked after the rounds, the figures printed either way.
	return r, cs, db.checkLeft(ctx)
}

// budgets returns the budgeted contenders: cfg.Percents of the flat-out
// rate and one at River's, each with budgetBatch's BatchSize, and the
// one at River's rate in River's batches.
func (r *curveRun) budgets() ([]*contender, error) {
	var cs []*contender
	atRiver := 100 * r.riverRate / r.flatRate
	pcts := append(slices.Clone(r.cfg.Percents), atRiver)
	slices.Sort(pcts)
	for _, p := range pcts {
		limit := p / 100 * r.flatRate
		name := fmt.Sprintf("budget %.0f%%", p)
		if p == atRiver {
			name = fmt.Sprintf("budget at River's rate (%.0f%%)", p)
		}
		c, err := r.db.sweepContender(name, p, limit, budgetBatch(limit, r.cfg.BatchTime), r.cfg.FlatBatch)
		if err != nil {
			return nil, err
		}
		c.atRiver = p == atRiver
		cs = append(cs, c)
	}
	// The same budget in River's batches tells the batch's share of the
	// difference from River's cleaner from the pacing's.
	big, err := r.db.sweepContender("budget at River's rate, River's batch", atRiver, atRiver/100*r.flatRate, riverBatch, riverBatch)
	if err != nil {
		return nil, err
	}
	big.atRiver, big.offRule = true, true
	cs = append(cs, big)
	return cs, nil
}

// tables returns the budgeted table sweeps of river_job: one at River's
// rate as measured, in the BatchSize budgetBatch gives it (the marker
// sweep's at River's rate has the same), and cfg.TablePercents of the
// marker sweep's flat-out rate, so that each lines up with the marker
// sweep's budget of the same percent; and one at River's rate in River's
// batches.
func (r *curveRun) tables() ([]*contender, error) {
	atRiver := 100 * r.riverRate / r.flatRate
	pcts := append(slices.Clone(r.cfg.TablePercents), atRiver)
	slices.Sort(pcts)
	var cs []*contender
	for _, p := range pcts {
		limit := p / 100 * r.flatRate
		name := fmt.Sprintf("budget %.0f%%", p)
		if p == atRiver {
			name = fmt.Sprintf("budget at River's rate (%.0f%%)", p)
		}
		c, err := r.db.tableContender(name, p, limit, budgetBatch(limit, r.cfg.BatchTime), r.cfg.FlatBatch)
		if err != nil {
			return nil, err
		}
		c.atRiver = p == atRiver
		cs = append(cs, c)
	}
	// At River's rate in River's batches too: a run of the table then
	// deletes what one JobDeleteBefore of River's cleaner does.
	big, err := r.db.tableContender("budget at River's rate, River's batch", atRiver, atRiver/100*r.flatRate, riverBatch, riverBatch)
	if err != nil {
		return nil, err
	}
	big.atRiver, big.offRule = true, true
	cs = append(cs, big)
	return cs, nil
}

// rounds runs the alternating windows, starting and ending alone.
func (r *curveRun) rounds(ctx context.Context, cs []*contender) error {
	w, err := r.measure(ctx, nil)
	if err != nil {
		return err
	}
	r.windows = append(r.windows, w)
	for round := range r.cfg.Rounds {
		r.progress(fmt.Sprintf("round %d of %d; load %s", round+1, r.cfg.Rounds, loadavg()))
		r.loads = append(r.loads, load1())
		for _, c := range rotated(cs, round) {
			for _, c := range []*contender{c, nil} {
				w, err := r.measure(ctx, c)
				if err != nil {
					return fmt.Errorf("round %d: %w", round+1, err)
				}
				w.round = round + 1
				r.windows = append(r.windows, w)
				if c != nil {
					if err := r.tidy(ctx, &r.windows[len(r.windows)-1]); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// tidy vacuums what w's contender deleted, counts it in the database
// (what the contender said it deleted goes to w.reported), and refills
// the backlogs, between its window and the alone window after it.
func (r *curveRun) tidy(ctx context.Context, w *window) error {
	tables := []string{r.db.jobs, r.db.markers}
	if w.c.onRiverJob() {
		tables = []string{r.db.riverJ, r.db.side}
	}
	for _, t := range tables {
		if _, err := r.db.pool.Exec(ctx, `VACUUM `+t); err != nil {
			return err
		}
	}
	w.reported = w.cleared
	count := r.db.swept
	if w.c.onRiverJob() {
		count = r.db.sweptRiver
	}
	n, err := count(ctx)
	if err != nil {
		return err
	}
	// JobDeleteBefore's count is exact and its batch is never cut short:
	// a difference says that river_job's jobs were not deleted in id order
	// and that the counts of the table sweep's windows are wrong too.
	if w.c.river && n != w.reported {
		return fmt.Errorf("%s said it deleted %d jobs, and the smallest id left says %d", w.c.name, w.reported, n)
	}
	w.cleared = n
	return r.topUp(ctx)
}

// topUp refills a backlog that holds less than two windows of its fastest
// contender (the most a window of it has deleted so far, and at least
// 100,000/s on the jobs table and 40,000/s on river_job, 250,000/s
// before the table sweep's first window flat out), with four: no window
// may run out.
func (r *curveRun) topUp(ctx context.Context) error {
	pgMost, rvMost := 100_000*r.cfg.Window.Seconds(), 40_000*r.cfg.Window.Seconds()
	if r.warmFloor {
		rvMost = 250_000 * r.cfg.Window.Seconds()
	}
	for _, w := range append(slices.Clone(r.calib), r.windows...) {
		switch {
		case w.c == nil:
		case w.c.onRiverJob():
			rvMost = max(rvMost, float64(w.cleared))
		default:
			pgMost = max(pgMost, float64(w.cleared))
		}
	}
	if need := int(2 * pgMost); r.db.pgLeft < need {
		r.progress(fmt.Sprintf("refilling jobs and markers: %d left", r.db.pgLeft))
		if err := r.db.fillJobs(ctx, 2*need); err != nil {
			return err
		}
	}
	if need := max(int(2*rvMost), 3*riverBatch); r.db.rvLeft < need {
		r.progress(fmt.Sprintf("refilling river_job: %d left", r.db.rvLeft))
		if err := r.db.fillRiver(ctx, 2*need); err != nil {
			return err
		}
	}
	return nil
}

// measure runs the foreground for one window, alone (c nil) or while c
// deletes, until c's window ends.
func (r *curveRun) measure(ctx context.Context, c *contender) (window, error) {
	fctx, stopFG := context.WithCancel(ctx)
	type fgResult struct {
		lat []time.Duration
		err error
	}
	fgDone := make(chan fgResult, 1)
	go func() {
		lat, _, err := bench.Foreground(fctx, r.db.pool, r.db.fg, r.cfg.fg)
		fgDone <- fgResult{lat, err}
	}()
	res := window{c: c}
	start := time.Now()
	var err error
	if c == nil {
		select {
		case <-time.After(r.cfg.Window):
		case <-ctx.Done():
		}
	} else {
		res.cleared, err = c.run(ctx, r.cfg.Window)
	}
	res.elapsed = time.Since(start)
	stopFG()
	fg := <-fgDone
	name := "alone"
	if c != nil {
		name = c.name
	}
	if err != nil {
		return res, fmt.Errorf("%s: %w", name, err)
	}
	if fg.err != nil {
		return res, fmt.Errorf("%s: foreground: %w", name, fg.err)
	}
	slices.Sort(fg.lat)
	res.ops = len(fg.lat)
	res.p50, res.p99, res.max = quantile(fg.lat, 0.5), quantile(fg.lat, 0.99), quantile(fg.lat, 1)
	r.progress(fmt.Sprintf("%s: %d ops p50 %v p99 %v max %v; deleted %d (%.0f/s)", name, res.ops,
		res.p50.Round(time.Microsecond), res.p99.Round(time.Microsecond), res.max.Round(time.Microsecond), res.cleared, res.rate()))
	return res, nil
}

// rateOf is the deletion rate of c over its windows in ws.
func rateOf(ws []window, c *contender) float64 {
	n, t := 0, 0.0
	for _, w := range ws {
		if w.c == c {
			n += w.cleared
			t += w.elapsed.Seconds()
		}
	}
	return float64(n) / t
}

// quantile returns the q-quantile (nearest rank) of sorted, 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
