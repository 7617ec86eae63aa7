package bench

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
	"github.com/marksweep/retention/sqlkv"
)

// NewRiverTable makes the table sweep's store over schema's river_job,
// exactly as the peers measure makes it: its partial index on
// (finalized_at, id), the side table river_side, and no ClearFunc (the
// rows are the whole state). db is a *sql.DB over pool, such as
// stdlib.OpenDBFromPool's. The budget curve sweeps river_job with it
// beside River's cleaner.
func NewRiverTable(ctx context.Context, pool *pgxpool.Pool, db *sql.DB, schema string) (*sqlkv.AtomicTableKV, error) {
	return newRiverTable(ctx, pool, db, schema)
}

// Budget is the delete-budget measure: a foreground workload
// (point selects and updates at a fixed rate on a table of its own, as a
// service would send) whose latency is measured alone and while a backlog
// of expired jobs is swept, with and without Config.Limiter.
//
// The budgeted sweep is measured in windows that alternate with windows of
// the foreground alone, each Window long, until the backlog is gone: on a
// shared machine the foreground's latency alone drifts by more than the
// budget's effect, and alternating lets each budgeted window be compared
// with the alone windows on either side of it.
type Budget struct {
	Backlog   int           // expired jobs per sweep
	BatchSize int           // Config.BatchSize
	PageSize  int           // Config.PageSize
	Limit     float64       // the budget, entities per second
	Burst     int           // the budget's burst
	FGRate    float64       // foreground operations per second
	FGWorkers int           // goroutines sending them
	FGRows    int           // rows of the foreground table
	FGUpdates float64       // fraction of operations that are updates
	Window    time.Duration // length of each alone and budgeted window
}

// BudgetPhase is the figures of one window or one unbudgeted sweep.
type BudgetPhase struct {
	Name       string
	Budgeted   bool          // a window of the budgeted sweep
	Ops        int           // foreground operations measured
	P50, P99   time.Duration // their latency, from the call
	Max        time.Duration
	LateP99    time.Duration // p99 from the time the operation was due (queueing included)
	Cleared    int           // entities the sweep cleared (0: no sweep)
	Elapsed    time.Duration // the phase's wall time
	ClearCalls int
	BudgetWait time.Duration
	WAL        float64 // bytes of WAL written during the phase
}

// RunBudget runs the measure of cfg on pool in a new schema, dropped at
// the end: the budgeted atomic sweep of the backlog in windows alternating
// with the foreground alone (starting and ending alone), then an atomic
// sweep of the backlog without a budget and a non-atomic (ClearBatch) one,
// each with the foreground running.
func RunBudget(ctx context.Context, pool *pgxpool.Pool, cfg Budget, progress func(string)) ([]BudgetPhase, error) {
	schema := fmt.Sprintf("bench_budget_%d", rand.Uint32())
	q := pgx.Identifier{schema}.Sanitize()
	fg, jobs := q+".fg", q+".jobs"
	markers := pgx.Identifier{schema, "markers"}.Sanitize()
	defer func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+q+` CASCADE`); err != nil {
			progress("dropping " + schema + ": " + err.Error())
		}
	}()
	for _, s := range []struct {
		sql  string
		args []any
	}{
		{`CREATE SCHEMA ` + q, nil},
		{`CREATE TABLE ` + fg + ` (id int PRIMARY KEY, v bigint NOT NULL, pad text NOT NULL)`, nil},
		{`INSERT INTO ` + fg + ` SELECT i, 0, repeat('x', 100) FROM generate_series(1, $1) AS i`, []any{cfg.FGRows}},
		{`CREATE TABLE ` + jobs + ` (id bigint PRIMARY KEY, kind text NOT NULL, state text NOT NULL,
			finished_at timestamptz NOT NULL, args jsonb NOT NULL)`, nil},
		{`VACUUM ANALYZE ` + fg, nil},
	} {
		if _, err := pool.Exec(ctx, s.sql, s.args...); err != nil {
			return nil, fmt.Errorf("%.50s...: %w", s.sql, err)
		}
	}
	if err := pgkv.Migrate(ctx, pool, schema+".markers"); err != nil {
		return nil, err
	}
	kv, err := pgkv.New(pool, schema+".markers")
	if err != nil {
		return nil, err
	}
	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		n, err := bigints(ids)
		if err != nil {
			return err
		}
		b.Queue(`DELETE FROM `+jobs+` WHERE id = ANY($1)`, n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	clearBatch := func(ctx context.Context, ids []string) error {
		n, err := bigints(ids)
		if err != nil {
			return err
		}
		_, err = pool.Exec(ctx, `DELETE FROM `+jobs+` WHERE id = ANY($1)`, n)
		return err
	}

	setup := func() error {
		base := finishedAt()
		for _, s := range []struct {
			sql  string
			args []any
		}{
			{`INSERT INTO ` + jobs + ` (id, kind, state, finished_at, args)
				SELECT i, 'bench', 'completed', $1::timestamptz + i * interval '1 ms', '{"n": 1}'
				FROM generate_series(1, $2) AS i`, []any{base, cfg.Backlog}},
			{`INSERT INTO ` + markers + ` (key)
				SELECT convert_to($1 || lpad(($2::bigint + i)::text, 20, '0') || '/' || i::text, 'UTF8')
				FROM generate_series(1, $3) AS i`, []any{Prefix, base.UnixMilli(), cfg.Backlog}},
			{`VACUUM ANALYZE ` + jobs, nil},
			{`VACUUM ANALYZE ` + markers, nil},
			{`CHECKPOINT`, nil},
		} {
			if _, err := pool.Exec(ctx, s.sql, s.args...); err != nil {
				return fmt.Errorf("%.40s...: %w", s.sql, err)
			}
		}
		return nil
	}
	left := func() (int, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+jobs+`) + (SELECT count(*) FROM `+markers+`)`).Scan(&n)
		return n, err
	}
	newSweep := func(kv retention.KV, clear func(context.Context, []string) error, limiter *rate.Limiter) (*retention.Sweep, error) {
		return retention.New(kv, retention.Config{
			Prefix: Prefix, Retention: Retention, ClearBatch: clear,
			BatchSize: cfg.BatchSize, PageSize: cfg.PageSize, Limiter: limiter,
			Logger: slog.New(slog.DiscardHandler),
		})
	}

	// measure runs the foreground while sweep runs (or for cfg.Window when
	// sweep is nil) and fills in the phase's latency and WAL.
	measure := func(res *BudgetPhase, sweep func() error) error {
		var lsn0 string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
			return err
		}
		fctx, stopFG := context.WithCancel(ctx)
		type fgResult struct {
			service, late []time.Duration
			err           error
		}
		fgDone := make(chan fgResult, 1)
		go func() {
			s, l, err := Foreground(fctx, pool, fg, cfg)
			fgDone <- fgResult{s, l, err}
		}()
		start := time.Now()
		var err error
		if sweep == nil {
			select {
			case <-time.After(cfg.Window):
			case <-ctx.Done():
			}
		} else {
			err = sweep()
		}
		res.Elapsed = time.Since(start)
		stopFG()
		r := <-fgDone
		if err != nil {
			return fmt.Errorf("%s: %w", res.Name, err)
		}
		if r.err != nil {
			return fmt.Errorf("%s: foreground: %w", res.Name, r.err)
		}
		if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8`, lsn0).Scan(&res.WAL); err != nil {
			return err
		}
		res.Ops = len(r.service)
		slices.Sort(r.service)
		slices.Sort(r.late)
		res.P50, res.P99, res.Max = quantile(r.service, 0.5), quantile(r.service, 0.99), quantile(r.service, 1)
		res.LateP99 = quantile(r.late, 0.99)
		progress(fmt.Sprintf("%s: %d ops p50 %v p99 %v; cleared %d in %v", res.Name, res.Ops, res.P50, res.P99, res.Cleared, res.Elapsed.Round(time.Millisecond)))
		return nil
	}

	var out []BudgetPhase
	alone := func(i int) error {
		res := BudgetPhase{Name: fmt.Sprintf("alone %d", i)}
		if err := measure(&res, nil); err != nil {
			return err
		}
		out = append(out, res)
		return nil
	}

	// The budgeted sweep, a window at a time: each window is one Pass cut
	// short by its context, and the limiter carries over from window to
	// window as it would in a Run that paused.
	if err := setup(); err != nil {
		return out, err
	}
	limiter := rate.NewLimiter(rate.Limit(cfg.Limit), cfg.Burst)
	budgeted, err := newSweep(akv, nil, limiter)
	if err != nil {
		return out, err
	}
	for i := 1; ; i++ {
		if err := alone(i); err != nil {
			return out, err
		}
		n, err := left()
		if err != nil {
			return out, err
		}
		if n == 0 {
			break
		}
		res := BudgetPhase{Name: fmt.Sprintf("budget %d", i), Budgeted: true}
		err = measure(&res, func() error {
			wctx, cancel := context.WithTimeout(ctx, cfg.Window)
			defer cancel()
			st, err := budgeted.Pass(wctx)
			res.Cleared, res.ClearCalls, res.BudgetWait = st.Cleared, st.ClearCalls, st.BudgetWait
			if err != nil && wctx.Err() == nil {
				return err
			}
			return nil
		})
		if err != nil {
			return out, err
		}
		out = append(out, res)
		if res.Cleared == 0 {
			return out, fmt.Errorf("%s cleared nothing with %d rows left", res.Name, n)
		}
	}

	for _, ph := range []struct {
		name  string
		kv    retention.KV
		clear func(context.Context, []string) error
	}{
		{"atomic sweep, no budget", akv, nil},
		{"non-atomic ClearBatch sweep, no budget", kv, clearBatch},
	} {
		if err := setup(); err != nil {
			return out, err
		}
		s, err := newSweep(ph.kv, ph.clear, nil)
		if err != nil {
			return out, err
		}
		res := BudgetPhase{Name: ph.name}
		err = measure(&res, func() error {
			st, err := s.Pass(ctx)
			res.Cleared, res.ClearCalls = st.Cleared, st.ClearCalls
			return err
		})
		if err != nil {
			return out, err
		}
		if n, err := left(); err != nil || n != 0 || res.Cleared != cfg.Backlog {
			return out, fmt.Errorf("%s: cleared %d of %d, %d rows left (%v)", ph.name, res.Cleared, cfg.Backlog, n, err)
		}
		out = append(out, res)
	}
	return out, nil
}

// Foreground sends cfg.FGRate operations a second (cfg.FGWorkers at a
// time, cfg.FGUpdates of them updates) to table's cfg.FGRows rows until ctx
// is done and returns each one's latency from its call and from its due
// time.
func Foreground(ctx context.Context, pool *pgxpool.Pool, table string, cfg Budget) (service, late []time.Duration, err error) {
	type op struct {
		due    time.Time
		id     int
		update bool
	}
	ops := make(chan op, 1024)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range cfg.FGWorkers {
		wg.Go(func() {
			var s, l []time.Duration
			for o := range ops {
				t0 := time.Now()
				var err error
				if o.update {
					_, err = pool.Exec(context.Background(), `UPDATE `+table+` SET v = v + 1 WHERE id = $1`, o.id)
				} else {
					var v int64
					var pad string
					err = pool.QueryRow(context.Background(), `SELECT v, pad FROM `+table+` WHERE id = $1`, o.id).Scan(&v, &pad)
				}
				t1 := time.Now()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					continue
				}
				s = append(s, t1.Sub(t0))
				l = append(l, t1.Sub(o.due))
			}
			mu.Lock()
			service = append(service, s...)
			late = append(late, l...)
			mu.Unlock()
		})
	}
	start := time.Now()
	for i := 0; ; i++ {
		due := start.Add(time.Duration(float64(i) / cfg.FGRate * float64(time.Second)))
		if w := time.Until(due); w > 0 {
			select {
			case <-time.After(w):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		ops <- op{due: due, id: 1 + rand.IntN(cfg.FGRows), update: rand.Float64() < cfg.FGUpdates}
	}
	close(ops)
	wg.Wait()
	if len(errs) > 0 {
		return service, late, fmt.Errorf("%d failed operations, first: %w", len(errs), errs[0])
	}
	return service, late, nil
}
