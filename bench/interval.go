package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// Interval is one cell of the MinInterval measure: a job
// service on PostgreSQL finishing jobs at a steady Rate for Duration, each
// job's row and marker in one transaction (MarkTx), swept under Run
// through a pgkv.AtomicKV whose ClearFunc logs each job's due time and the
// server's clock at its deletion, as Poison does. It measures what
// Config.MinInterval trades: passes and clear transactions per second
// against the database's lag past due.
type Interval struct {
	Name        string
	Rate        float64       // jobs finished per second
	Duration    time.Duration // how long jobs are written
	Writers     int           // goroutines writing jobs; 0 means 4
	Retention   time.Duration // Config.Retention
	BatchSize   int           // Config.BatchSize
	PageSize    int           // Config.PageSize
	MinInterval time.Duration // Config.MinInterval (negative: none)
	Drain       time.Duration // the longest the run waits after the last job fell due
}

// IntervalResult is what one Interval run measured. Passes and clear
// calls are counted over the steady window: from the first job's due time
// to the last's, Duration long.
type IntervalResult struct {
	Config     Interval
	Written    int     // jobs written
	WriteRate  float64 // jobs written per second, as reached
	Passes     int     // passes in the window
	Working    int     // of them, passes that cleared something
	ClearCalls int     // clear transactions in the window
	Window     time.Duration
	Lags       DBLags // from cleared_log, every job
	Left       int    // jobs not cleared at the end
}

// RunInterval runs cfg once on pool in a new schema, dropped at the end.
func RunInterval(ctx context.Context, pool *pgxpool.Pool, cfg Interval, progress func(string)) (IntervalResult, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 4
	}
	res := IntervalResult{Config: cfg}
	schema := fmt.Sprintf("bench_interval_%d", rand.Uint32())
	q := pgx.Identifier{schema}.Sanitize()
	jobs, clog := q+".jobs", q+".cleared_log"
	defer func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+q+` CASCADE`); err != nil {
			progress("dropping " + schema + ": " + err.Error())
		}
	}()
	for _, s := range []string{
		`CREATE SCHEMA ` + q,
		`CREATE TABLE ` + jobs + ` (id bigint PRIMARY KEY, kind text NOT NULL, state text NOT NULL,
			finished_at timestamptz NOT NULL, output jsonb NOT NULL)`,
		`CREATE TABLE ` + clog + ` (id bigint NOT NULL, due_at timestamptz NOT NULL, deleted_at timestamptz NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return res, fmt.Errorf("%.50s...: %w", s, err)
		}
	}
	if err := pgkv.Migrate(ctx, pool, schema+".markers"); err != nil {
		return res, err
	}
	kv, err := pgkv.New(pool, schema+".markers")
	if err != nil {
		return res, err
	}
	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		n, err := bigints(ids)
		if err != nil {
			return err
		}
		b.Queue(`WITH d AS (DELETE FROM `+jobs+` WHERE id = ANY($1::bigint[]) RETURNING id, finished_at)
			INSERT INTO `+clog+` (id, due_at, deleted_at)
			SELECT id, finished_at + $2::bigint * interval '1 millisecond', clock_timestamp() FROM d`,
			n, cfg.Retention.Milliseconds())
		return nil
	})
	if err != nil {
		return res, err
	}

	type passAt struct {
		at      time.Time
		cleared int
		calls   int
	}
	var (
		mu     sync.Mutex
		passes []passAt
	)
	s, err := retention.New(akv, retention.Config{
		Prefix:      Prefix,
		Retention:   cfg.Retention,
		BatchSize:   cfg.BatchSize,
		PageSize:    cfg.PageSize,
		MinInterval: cfg.MinInterval,
		Logger:      slog.New(slog.DiscardHandler),
		OnPass: func(st retention.Stats, _ error) {
			mu.Lock()
			passes = append(passes, passAt{time.Now(), st.Cleared, st.ClearCalls})
			mu.Unlock()
		},
	})
	if err != nil {
		return res, err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(runCtx) }()
	defer func() {
		stopRun()
		<-runErr
	}()

	start := time.Now()
	var written atomic.Int64
	if err := writeJobs(ctx, cfg.Writers, cfg.Rate, cfg.Duration, func(ctx context.Context, id int64) error {
		finished := time.Now().Truncate(time.Millisecond)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+jobs+` (id, kind, state, finished_at, output)
				VALUES ($1, 'report', 'completed', $2, '{"pages": 3}')`, id, finished); err != nil {
				return err
			}
			return kv.MarkTx(ctx, tx, Prefix, strconv.FormatInt(id, 10), finished)
		})
		if err == nil {
			written.Add(1)
		}
		return err
	}); err != nil {
		return res, fmt.Errorf("writer: %w", err)
	}
	wrote := time.Since(start)
	res.Written = int(written.Load())
	res.WriteRate = float64(res.Written) / wrote.Seconds()
	progress(fmt.Sprintf("%s: wrote %d jobs in %v (%.0f/s)", cfg.Name, res.Written, wrote.Round(time.Millisecond), res.WriteRate))

	lastDue := start.Add(wrote + cfg.Retention)
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+jobs).Scan(&left); err != nil {
			return res, err
		}
		res.Left = left
		if (left == 0 && time.Now().After(lastDue)) || time.Now().After(lastDue.Add(cfg.Drain)) {
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	stopRun()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		return res, fmt.Errorf("sweep run: %w", err)
	}
	runErr <- nil // for the deferred receive

	from, to := start.Add(cfg.Retention), lastDue
	res.Window = to.Sub(from)
	mu.Lock()
	for _, p := range passes {
		if p.at.Before(from) || p.at.After(to) {
			continue
		}
		res.Passes++
		res.ClearCalls += p.calls
		if p.cleared > 0 {
			res.Working++
		}
	}
	mu.Unlock()

	var n int
	var p50, p99, mx float64
	err = pool.QueryRow(ctx, `SELECT count(*),
			COALESCE(extract(epoch FROM percentile_disc(0.5) WITHIN GROUP (ORDER BY deleted_at - due_at)), 0)::float8,
			COALESCE(extract(epoch FROM percentile_disc(0.99) WITHIN GROUP (ORDER BY deleted_at - due_at)), 0)::float8,
			COALESCE(extract(epoch FROM max(deleted_at - due_at)), 0)::float8
		FROM `+clog).Scan(&n, &p50, &p99, &mx)
	res.Lags = DBLags{Cleared: n, P50: seconds(p50), P99: seconds(p99), Max: seconds(mx)}
	return res, err
}

// writeJobs calls write for ids 1, 2, ... at rate per second for d, from
// writers goroutines, and returns the first error.
func writeJobs(ctx context.Context, writers int, rate float64, d time.Duration, write func(context.Context, int64) error) error {
	next := make(chan int64, writers)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for id := range next {
				if err := write(ctx, id); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	n := int(rate * d.Seconds())
	start := time.Now()
	var err error
pace:
	for i := range n {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if w := time.Until(at); w > time.Millisecond {
			time.Sleep(w)
		}
		select {
		case next <- int64(i + 1):
		case err = <-errs:
			break pace
		case <-ctx.Done():
			err = ctx.Err()
			break pace
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}
