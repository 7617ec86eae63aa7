package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river/riverdriver"
	"golang.org/x/time/rate"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/bench"
	"github.com/marksweep/retention/pgkv"
	"github.com/marksweep/retention/sqlkv"
)

// curveConfig is the -curve measure: the foreground's latency against
// the deletion rate, for budgets of a share of the marker sweep's
// flat-out rate, for River's cleaner at its own pace, and for the table
// sweep of river_job at River's rate (and at shares of the same rate).
type curveConfig struct {
	fg            bench.Budget  // its FG fields: the foreground
	Rounds        int           // rounds of every contender
	Window        time.Duration // each window, alone or with a contender
	Percents      []float64     // budgets of the marker sweep, in percent of its flat-out rate
	TablePercents []float64     // the same for the table sweep of river_job, beside its budget at River's rate
	BatchTime     time.Duration // a budget's batch is what it grants in this long
	FlatBatch     int           // BatchSize (and PageSize) flat out
	SVG           string        // where to write the plot; "" for none
}

// River's JobCleaner in v0.51 (internal/maintenance/job_cleaner.go, and
// riversharedmaintenance): batches of BatchSizeDefault, each under
// JobCleanerTimeoutDefault, back to back with a pause drawn between
// BatchBackoffMin and BatchBackoffMax, until a batch comes back short;
// then it waits JobCleanerIntervalDefault (30 s), which never comes into
// play here since no window may run out of backlog.
const (
	riverBatch      = bench.RiverBatch
	riverTimeout    = 30 * time.Second
	riverBackoffMin = 50 * time.Millisecond
	riverBackoffMax = time.Second
	riverRetention  = 24 * time.Hour // Cancelled and CompletedJobRetentionPeriodDefault; Discarded is 7 days
)

// curveDB is the schema of one -curve run: the foreground's table, the
// jobs and markers the marker sweeps delete, and River's tables, whose
// river_job both River's cleaner and the table sweeps delete from.
type curveDB struct {
	pool      *pgxpool.Pool
	db        *sql.DB // over pool, for table
	schema    string
	fg        string // quoted, schema-qualified
	jobs      string
	markers   string
	riverJ    string
	side      string // the table sweep's side table
	river     riverdriver.Executor
	akv       *pgkv.AtomicKV
	table     *sqlkv.AtomicTableKV // river_job itself
	base      time.Time            // every job of both tables finished this long after the epoch, plus its id in ms
	nextID    int64                // the next id of the jobs table
	firstID   int64                // the smallest id left: sweeps delete in id order
	pgLeft    int                  // entities left in jobs and markers
	rvNextID  int64                // the next id of river_job
	rvFirstID int64                // the smallest id left in river_job
	rvLeft    int                  // jobs left in river_job
}

func newCurveDB(ctx context.Context, pool *pgxpool.Pool, rows int) (*curveDB, error) {
	schema := fmt.Sprintf("bench_curve_%d", rand.Uint32())
	q := pgx.Identifier{schema}.Sanitize()
	d := &curveDB{pool: pool, schema: schema, fg: q + ".fg", jobs: q + ".jobs",
		markers: pgx.Identifier{schema, "markers"}.Sanitize(), riverJ: q + ".river_job", side: q + ".river_side",
		base: time.Now().Add(-48 * time.Hour).Truncate(time.Millisecond), nextID: 1, firstID: 1, rvNextID: 1, rvFirstID: 1}
	// Autovacuum is off on the deleted tables and each contender's window
	// is followed by a VACUUM of its tables outside any window: otherwise
	// a vacuum of one contender's dead rows lands in whichever window
	// comes next.
	stmts := []string{
		`CREATE SCHEMA ` + q,
		`CREATE TABLE ` + d.fg + ` (id int PRIMARY KEY, v bigint NOT NULL, pad text NOT NULL)`,
		`INSERT INTO ` + d.fg + ` SELECT i, 0, repeat('x', 100) FROM generate_series(1, ` + strconv.Itoa(rows) + `) AS i`,
		`VACUUM ANALYZE ` + d.fg,
		`CREATE TABLE ` + d.jobs + ` (id bigint PRIMARY KEY, kind text NOT NULL, state text NOT NULL,
			finished_at timestamptz NOT NULL, args jsonb NOT NULL) WITH (autovacuum_enabled = off)`,
		`CREATE INDEX ON ` + d.jobs + ` (finished_at)`,
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return d, fmt.Errorf("%.50s...: %w", s, err)
		}
	}
	if err := pgkv.Migrate(ctx, pool, schema+".markers"); err != nil {
		return d, err
	}
	var err error
	if d.river, err = bench.MigrateRiver(ctx, pool, schema); err != nil {
		return d, err
	}
	d.db = stdlib.OpenDBFromPool(pool)
	if d.table, err = bench.NewRiverTable(ctx, pool, d.db, schema); err != nil {
		return d, err
	}
	for _, t := range []string{d.markers, d.riverJ, d.side} {
		if _, err := pool.Exec(ctx, `ALTER TABLE `+t+` SET (autovacuum_enabled = off)`); err != nil {
			return d, err
		}
	}
	kv, err := pgkv.New(pool, schema+".markers")
	if err != nil {
		return d, err
	}
	d.akv, err = kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		n := make([]int64, len(ids))
		for i, id := range ids {
			if n[i], err = strconv.ParseInt(id, 10, 64); err != nil {
				return fmt.Errorf("job id %q: %w", id, err)
			}
		}
		b.Queue(`DELETE FROM `+d.jobs+` WHERE id = ANY($1)`, n)
		return nil
	})
	return d, err
}

func (d *curveDB) drop() error {
	_, err := d.pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{d.schema}.Sanitize()+` CASCADE`)
	if d.db != nil {
		err = errors.Join(err, d.db.Close())
	}
	return err
}

// fillJobs appends n expired jobs and their markers, as MarkTx would
// write them, after the ones left: the sweep reaches them last.
func (d *curveDB) fillJobs(ctx context.Context, n int) error {
	first := d.nextID
	err := d.exec(ctx,
		stmt{`INSERT INTO ` + d.jobs + ` (id, kind, state, finished_at, args)
			SELECT i, 'bench', 'completed', $1::timestamptz + i * interval '1 ms', '{"n": 1}'
			FROM generate_series($2::bigint, $3::bigint) AS i`, []any{d.base, first, first + int64(n) - 1}},
		stmt{`INSERT INTO ` + d.markers + ` (key)
			SELECT convert_to($1 || lpad(($2::bigint + i)::text, 20, '0') || '/' || i::text, 'UTF8')
			FROM generate_series($3::bigint, $4::bigint) AS i`, []any{bench.Prefix, d.base.UnixMilli(), first, first + int64(n) - 1}},
		stmt{`VACUUM ANALYZE ` + d.jobs, nil},
		stmt{`VACUUM ANALYZE ` + d.markers, nil},
		stmt{`CHECKPOINT`, nil})
	if err == nil {
		d.nextID += int64(n)
		d.pgLeft += n
	}
	return err
}

// fillRiver appends n completed River jobs after the ones left, finalized
// two days ago, each 1 ms after the one before it: id order is
// finalized_at order, so River's cleaner (by id) and the table sweep (by
// finalized_at, id) both delete the smallest ids left.
func (d *curveDB) fillRiver(ctx context.Context, n int) error {
	first := d.rvNextID
	err := d.exec(ctx,
		stmt{`INSERT INTO ` + d.riverJ + ` (id, args, attempt, attempted_at, created_at, finalized_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state)
			SELECT i, '{"n": 1}', 1, t, t, t, 'bench', 25, '{}', 1, 'default', t, 'completed'
			FROM (SELECT i, $1::timestamptz + i * interval '1 ms' AS t FROM generate_series($2::bigint, $3::bigint) AS i) AS s`,
			[]any{d.base, first, first + int64(n) - 1}},
		stmt{`VACUUM ANALYZE ` + d.riverJ, nil},
		stmt{`CHECKPOINT`, nil})
	if err == nil {
		d.rvNextID += int64(n)
		d.rvLeft += n
	}
	return err
}

// checkLeft checks that the rows left are what was written less what was
// counted deleted (swept and sweptRiver count the smallest ids gone, so a
// deletion out of id order shows here), and that the table sweeps left
// nothing in their side table.
func (d *curveDB) checkLeft(ctx context.Context) error {
	var jobs, markers, river, side int
	if err := d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+d.jobs+`), (SELECT count(*) FROM `+d.markers+`), (SELECT count(*) FROM `+d.riverJ+`), (SELECT count(*) FROM `+d.side+`)`).
		Scan(&jobs, &markers, &river, &side); err != nil {
		return err
	}
	if jobs != d.pgLeft || markers != d.pgLeft || river != d.rvLeft || side != 0 {
		return fmt.Errorf("rows left: %d jobs, %d markers, %d River jobs, %d side keys; want %d, %d, %d, 0", jobs, markers, river, side, d.pgLeft, d.pgLeft, d.rvLeft)
	}
	return nil
}

// swept returns how many jobs the marker sweeps deleted since it was last
// called: they delete in id order, so the smallest id left says.
// Stats.Cleared can fall short of it: a batch that commits as a window's
// context ends is reported as failed.
func (d *curveDB) swept(ctx context.Context) (int, error) {
	n, err := d.gone(ctx, d.jobs, d.nextID, &d.firstID)
	d.pgLeft -= n
	return n, err
}

// sweptRiver returns how many jobs of river_job River's cleaner or the
// table sweep deleted since it was last called, as swept does.
func (d *curveDB) sweptRiver(ctx context.Context) (int, error) {
	n, err := d.gone(ctx, d.riverJ, d.rvNextID, &d.rvFirstID)
	d.rvLeft -= n
	return n, err
}

// gone returns how many ids of table, which holds first to next-1 less
// the smallest ones deleted, are gone since first, and moves first on.
func (d *curveDB) gone(ctx context.Context, table string, next int64, first *int64) (int, error) {
	var left int64
	if err := d.pool.QueryRow(ctx, `SELECT coalesce(min(id), $1) FROM `+table, next).Scan(&left); err != nil {
		return 0, err
	}
	n := int(left - *first)
	*first = left
	return n, nil
}

type stmt struct {
	sql  string
	args []any
}

func (d *curveDB) exec(ctx context.Context, stmts ...stmt) error {
	for _, s := range stmts {
		if _, err := d.pool.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("%.50s...: %w", s.sql, err)
		}
	}
	return nil
}

// contender deletes from one backlog for a window at a time.
type contender struct {
	name    string
	percent float64 // budget as a share of the marker sweep's flat out; 0 flat out or River
	limit   float64 // the budget, entities/s; 0 for none
	batch   int
	river   bool // River's cleaner
	table   bool // a table sweep of river_job itself
	atRiver bool // the budget set to River's rate
	offRule bool // its batch is not budgetBatch's: a point off the curve
	run     func(ctx context.Context, window time.Duration) (int, error)
}

// onRiverJob says that c deletes from river_job.
func (c *contender) onRiverJob() bool { return c.river || c.table }

// sweepContender is a pgkv.AtomicKV sweep of the jobs and their marker
// table, with a budget (limit > 0) or flat out.
func (d *curveDB) sweepContender(name string, percent, limit float64, batch, page int) (*contender, error) {
	return d.passContender(d.akv, "marker table, "+name, percent, limit, batch, page)
}

// tableContender is a sqlkv.AtomicTableKV sweep of river_job itself by
// finalized_at, with a budget (limit > 0) or flat out.
func (d *curveDB) tableContender(name string, percent, limit float64, batch, page int) (*contender, error) {
	c, err := d.passContender(d.table, "river_job itself, "+name, percent, limit, batch, page)
	if c != nil {
		c.table = true
	}
	return c, err
}

// passContender sweeps kv with a budget (limit > 0) or flat out. Each
// window is one Pass cut short by its context; the limiter carries over
// from window to window, as in a Run that paused.
func (d *curveDB) passContender(kv retention.KV, name string, percent, limit float64, batch, page int) (*contender, error) {
	var lim *rate.Limiter
	if limit > 0 {
		lim = rate.NewLimiter(rate.Limit(limit), batch)
	}
	s, err := retention.New(kv, retention.Config{
		Prefix: bench.Prefix, Retention: bench.Retention,
		BatchSize: batch, PageSize: max(page, batch), Limiter: lim,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	c := &contender{name: name, percent: percent, limit: limit, batch: batch}
	c.run = func(ctx context.Context, window time.Duration) (int, error) {
		wctx, cancel := context.WithTimeout(ctx, window)
		defer cancel()
		st, err := s.Pass(wctx)
		if wctx.Err() == nil {
			if err == nil {
				err = errors.New("the pass ended before its window: the backlog ran out")
			}
			return st.Cleared, err
		}
		return st.Cleared, nil
	}
	return c, nil
}

// riverContender runs River's cleaner loop (see riverBatch) on river_job
// until the window ends. A batch under way at the end finishes; a pause
// under way is carried into the contender's next window, so the loop is
// one loop paused between windows. It returns what JobDeleteBefore said
// it deleted.
func (d *curveDB) riverContender() *contender {
	var owed time.Duration
	c := &contender{name: "River's cleaner, its own pace", batch: riverBatch, river: true}
	c.run = func(ctx context.Context, window time.Duration) (int, error) {
		deadline := time.Now().Add(window)
		pause := func(p time.Duration) {
			now := time.Now()
			owed = max(now.Add(p).Sub(deadline), 0)
			time.Sleep(min(p, deadline.Sub(now)))
		}
		pause(owed)
		total := 0
		for time.Now().Before(deadline) {
			bctx, cancel := context.WithTimeout(ctx, riverTimeout)
			now := time.Now()
			n, err := d.river.JobDeleteBefore(bctx, &riverdriver.JobDeleteBeforeParams{
				CancelledDoDelete: true, CancelledFinalizedAtHorizon: now.Add(-riverRetention),
				CompletedDoDelete: true, CompletedFinalizedAtHorizon: now.Add(-riverRetention),
				DiscardedDoDelete: true, DiscardedFinalizedAtHorizon: now.Add(-7 * riverRetention),
				Max: riverBatch, Schema: d.schema,
			})
			cancel()
			total += n
			if err != nil {
				return total, err
			}
			if n < riverBatch {
				return total, errors.New("a batch of River's came back short: the backlog ran out")
			}
			pause(riverBackoffMin + rand.N(riverBackoffMax-riverBackoffMin))
		}
		return total, nil
	}
	return c
}

// budgetBatch is the BatchSize of a budget: what it grants in batchTime,
// rounded to the nearest of 10, 20, 25, 50, 100, ... and at most 1,000.
func budgetBatch(limit float64, batchTime time.Duration) int {
	want := limit * batchTime.Seconds()
	best := 10
	for _, b := range []int{10, 20, 25, 50, 100, 200, 250, 500, 1000} {
		if math.Abs(math.Log(float64(b)/want)) < math.Abs(math.Log(float64(best)/want)) {
			best = b
		}
	}
	return best
}

// rotated returns the contenders in the order of round r: each round
// starts one later, so that none always follows the same neighbour.
func rotated(cs []*contender, r int) []*contender {
	k := r % len(cs)
	return append(slices.Clone(cs[k:]), cs[:k]...)
}
