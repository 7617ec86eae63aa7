package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
	"github.com/marksweep/retention/sqlkv"
)

// Prefix is the marker prefix of every retention contender.
const Prefix = "jobs/done/"

// Retention is the retention of every contender: every entity Setup
// writes finished two days before it, far past it.
const Retention = time.Hour

// RiverBatch is the batch size River's JobCleaner gives JobDeleteBefore
// (riversharedmaintenance.BatchSizeDefault in River v0.51).
const RiverBatch = 10_000

// PG holds the tables of the PostgreSQL contenders, all in one schema of
// their own: jobs (an entity's state, one row per job), markers (the pgkv
// marker table) and River's tables, migrated by rivermigrate. Create it
// with NewPG and drop it with Close.
type PG struct {
	pool     *pgxpool.Pool
	schema   string // unquoted
	jobs     string // quoted and schema-qualified
	jobsText string // the same with text ids
	kv       *pgkv.KV
	textKV   *pgkv.KV // kv over a DB that is no pool: statements go as text
	river    riverdriver.Executor
	db       *sql.DB              // over pool, for table; its goroutine lives until Close
	table    *sqlkv.AtomicTableKV // over river_job

	// Timing, when not nil, adds up the calls of the retention contenders.
	Timing *Timing
}

// NewPG creates schema (which must not exist), the jobs table, the marker
// table and River's schema in it. The pool must allow the largest
// Concurrency of the contenders plus a few connections.
func NewPG(ctx context.Context, pool *pgxpool.Pool, schema string) (*PG, error) {
	q := pgx.Identifier{schema}.Sanitize()
	p := &PG{pool: pool, schema: schema, jobs: q + ".jobs", jobsText: q + ".jobs_text"}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+q); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	// Shaped like a job table of a service, with an index on the finish
	// time for the floor's DELETE. jobs has bigint ids like River's
	// river_job, so that both delete rows by the same kind of key;
	// jobs_text has text ids, compared under the database's collation.
	for table, idType := range map[string]string{p.jobs: "bigint", p.jobsText: "text"} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
			id `+idType+` PRIMARY KEY,
			kind text NOT NULL,
			state text NOT NULL,
			finished_at timestamptz NOT NULL,
			args jsonb NOT NULL)`); err != nil {
			return nil, fmt.Errorf("create %s: %w", table, err)
		}
		if _, err := pool.Exec(ctx, `CREATE INDEX ON `+table+` (finished_at)`); err != nil {
			return nil, fmt.Errorf("create %s index: %w", table, err)
		}
	}
	if err := pgkv.Migrate(ctx, pool, schema+".markers"); err != nil {
		return nil, err
	}
	kv, err := pgkv.New(pool, schema+".markers")
	if err != nil {
		return nil, err
	}
	p.kv = kv
	if p.textKV, err = pgkv.New(struct{ pgkv.DB }{pool}, schema+".markers"); err != nil {
		return nil, err
	}
	if p.river, err = MigrateRiver(ctx, pool, schema); err != nil {
		return nil, err
	}
	p.db = stdlib.OpenDBFromPool(pool)
	if p.table, err = newRiverTable(ctx, pool, p.db, schema); err != nil {
		_ = p.db.Close()
		return nil, err
	}
	return p, nil
}

// RiverStates are the states of the jobs River's JobCleaner deletes, the
// filter of the table sweep of river_job.
const RiverStates = "state IN ('completed', 'cancelled', 'discarded')"

// newRiverTable makes the table sweep's store over river_job: the index
// on (finalized_at, id) a sqlkv.TableKV reads by, its WHERE the filter
// (as NewTable's error advises), beside River's own on (state,
// finalized_at), and the side table for what a row cannot hold.
func newRiverTable(ctx context.Context, pool *pgxpool.Pool, db *sql.DB, schema string) (*sqlkv.AtomicTableKV, error) {
	if _, err := pool.Exec(ctx, `CREATE INDEX river_job_finalized_at_id ON `+pgx.Identifier{schema, "river_job"}.Sanitize()+` (finalized_at, id) WHERE `+RiverStates); err != nil {
		return nil, fmt.Errorf("create river_job index: %w", err)
	}
	if err := sqlkv.Migrate(ctx, db, sqlkv.PostgreSQL, schema+".river_side"); err != nil {
		return nil, err
	}
	side, err := sqlkv.New(db, sqlkv.PostgreSQL, schema+".river_side")
	if err != nil {
		return nil, err
	}
	t, err := sqlkv.NewTable(ctx, side, sqlkv.Table{Name: schema + ".river_job", ID: "id", Time: "finalized_at",
		Filter: RiverStates, Prefix: Prefix})
	if err != nil {
		return nil, err
	}
	return t.WithClear(nil), nil
}

// RiverFloor is the floor on river_job: one DELETE of every finalized job
// past the horizon, by River's own index.
func (p *PG) RiverFloor() Contender {
	return Contender{
		Name:  "floor: one DELETE of river_job's finalized jobs",
		Setup: p.SetupRiver,
		Clear: func(ctx context.Context) (int, error) {
			tag, err := p.pool.Exec(ctx, `DELETE FROM `+p.riverJob()+` WHERE `+RiverStates+` AND finalized_at < $1`, time.Now().Add(-Retention))
			return int(tag.RowsAffected()), err
		},
		Check: func(ctx context.Context) error { return p.checkEmpty(ctx, p.riverJob()) },
	}
}

// Table sweeps river_job itself with one Pass over a
// sqlkv.AtomicTableKV: the finalized jobs are the markers, by
// finalized_at, and each run deletes its rows by the index's range.
func (p *PG) Table(size int) Contender {
	return Contender{
		Name:  fmt.Sprintf("retention table sweep of river_job, runs of %d", size),
		Setup: p.SetupRiver,
		Clear: func(ctx context.Context) (int, error) { return sweep(ctx, p.table, runsOf(size), p.Timing) },
		Check: func(ctx context.Context) error {
			return p.checkEmpty(ctx, p.riverJob(), pgx.Identifier{p.schema, "river_side"}.Sanitize())
		},
	}
}

// TableObserved is Table with an Observer (a Recorder, which keeps every
// lag as a metrics module would bucket it): each run is then asked for
// its markers' times, which come back a row each.
func (p *PG) TableObserved(size int) Contender {
	c := p.Table(size)
	c.Name = fmt.Sprintf("retention table sweep of river_job, runs of %d, observed (each lag)", size)
	c.Clear = func(ctx context.Context) (int, error) {
		cfg := runsOf(size)
		cfg.Observer = &Recorder{}
		return sweep(ctx, p.table, cfg, p.Timing)
	}
	return c
}

// RiverContenders returns the contenders on river_job: the floor, River,
// and the table sweep.
func (p *PG) RiverContenders() []Contender {
	return []Contender{p.RiverFloor(), p.River(), p.Table(RiverBatch), p.TableObserved(RiverBatch),
		p.Table(retention.MaxPageSize), p.TableRunsOnly(RiverBatch)}
}

// MigrateRiver creates River's tables in schema and returns River's
// executor over pool.
func MigrateRiver(ctx context.Context, pool *pgxpool.Pool, schema string) (riverdriver.Executor, error) {
	driver := riverpgxv5.New(pool)
	m, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	return driver.GetExecutor(), nil
}

// Close drops the schema and everything in it, and closes the *sql.DB
// NewPG opened over the pool (the pool stays open).
func (p *PG) Close(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{p.schema}.Sanitize()+` CASCADE`)
	return errors.Join(err, p.db.Close())
}

// finishedAt is when every entity of a backlog finished: far enough back
// that all are expired, and 1ms apart so markers sort in id order.
func finishedAt() time.Time { return time.Now().Add(-48 * time.Hour).Truncate(time.Millisecond) }

// expiredEnd is the end of the range of markers expired now: Prefix and
// the cutoff's Unix milliseconds in TimestampWidth digits.
func expiredEnd() []byte {
	return fmt.Appendf([]byte(Prefix), "%0*d", retention.TimestampWidth, time.Now().Add(-Retention).UnixMilli())
}

// SetupJobs writes n expired jobs (bigint ids) and their markers, each
// id's row and marker as MarkTx would write them, in set-based statements
// for speed, then vacuums and checkpoints so that every contender starts
// alike.
func (p *PG) SetupJobs(ctx context.Context, n int) error {
	return p.setupJobs(ctx, p.jobs, `i`, `i::text`, n)
}

// SetupTextJobs is SetupJobs for the jobs_text table, ids j000000001 on.
func (p *PG) SetupTextJobs(ctx context.Context, n int) error {
	id := `'j' || lpad(i::text, 9, '0')`
	return p.setupJobs(ctx, p.jobsText, id, id, n)
}

// setupJobs fills table: job i has the id rowID, an SQL expression of i,
// and its marker the id markerID.
func (p *PG) setupJobs(ctx context.Context, table, rowID, markerID string, n int) error {
	base := finishedAt()
	stmts := []struct {
		sql  string
		args []any
	}{
		{`TRUNCATE ` + p.jobs + `, ` + p.jobsText + `, ` + p.markers() + `, ` + p.riverJob(), nil},
		{`INSERT INTO ` + table + ` (id, kind, state, finished_at, args)
			SELECT ` + rowID + `, 'bench', 'completed', $1::timestamptz + i * interval '1 ms', '{"n": 1}'
			FROM generate_series(1, $2) AS i`, []any{base, n}},
		{`INSERT INTO ` + p.markers() + ` (key)
			SELECT convert_to($1 || lpad(($2::bigint + i)::text, 20, '0') || '/' || ` + markerID + `, 'UTF8')
			FROM generate_series(1, $3) AS i`, []any{Prefix, base.UnixMilli(), n}},
		{`VACUUM ANALYZE ` + table, nil},
		{`VACUUM ANALYZE ` + p.markers(), nil},
		{`CHECKPOINT`, nil},
	}
	for _, s := range stmts {
		if _, err := p.pool.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("%.40s...: %w", s.sql, err)
		}
	}
	return nil
}

// SetupRiver writes n completed River jobs finalized two days ago into
// River's river_job, then vacuums and checkpoints.
func (p *PG) SetupRiver(ctx context.Context, n int) error {
	stmts := []struct {
		sql  string
		args []any
	}{
		{`TRUNCATE ` + p.jobs + `, ` + p.jobsText + `, ` + p.markers() + `, ` + p.riverJob(), nil},
		{`INSERT INTO ` + p.riverJob() + ` (args, attempt, attempted_at, created_at, finalized_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state)
			SELECT '{"n": 1}', 1, t, t, t, 'bench', 25, '{}', 1, 'default', t, 'completed'
			FROM (SELECT $1::timestamptz + i * interval '1 ms' AS t FROM generate_series(1, $2) AS i) AS s`, []any{finishedAt(), n}},
		{`VACUUM ANALYZE ` + p.riverJob(), nil},
		{`CHECKPOINT`, nil},
	}
	for _, s := range stmts {
		if _, err := p.pool.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("%.40s...: %w", s.sql, err)
		}
	}
	return nil
}

func (p *PG) markers() string  { return pgx.Identifier{p.schema, "markers"}.Sanitize() }
func (p *PG) riverJob() string { return pgx.Identifier{p.schema, "river_job"}.Sanitize() }

// checkEmpty returns an error naming every table of tables with rows left.
func (p *PG) checkEmpty(ctx context.Context, tables ...string) error {
	var errs []error
	for _, t := range tables {
		var left int
		if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM `+t).Scan(&left); err != nil {
			return err
		}
		if left != 0 {
			errs = append(errs, fmt.Errorf("%s: %d rows left", t, left))
		}
	}
	return errors.Join(errs...)
}

// Floor is the fastest way to delete the backlog's state, one DELETE of
// every expired row, with nothing else: no markers, no batches.
func (p *PG) Floor() Contender {
	return Contender{
		Name:  "floor: one DELETE ... WHERE finished_at < cutoff",
		Setup: p.SetupJobs,
		Clear: func(ctx context.Context) (int, error) {
			tag, err := p.pool.Exec(ctx, `DELETE FROM `+p.jobs+` WHERE finished_at < $1`, time.Now().Add(-Retention))
			return int(tag.RowsAffected()), err
		},
		Check: func(ctx context.Context) error { return p.checkEmpty(ctx, p.jobs) },
	}
}

// River deletes the backlog the way River's JobCleaner does: JobDeleteBefore
// through riverpgxv5 with batches of RiverBatch, each under the cleaner's
// 30s timeout, until a batch comes back short. The cleaner sleeps 50ms to
// 1s between batches to spare the database; that pause is left out here,
// so this is River's query at full speed.
func (p *PG) River() Contender {
	return Contender{
		Name:  "River JobDeleteBefore (10k batches)",
		Setup: p.SetupRiver,
		Clear: func(ctx context.Context) (int, error) {
			total := 0
			for {
				horizon := time.Now().Add(-Retention)
				bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				n, err := p.river.JobDeleteBefore(bctx, &riverdriver.JobDeleteBeforeParams{
					CancelledDoDelete:           true,
					CancelledFinalizedAtHorizon: horizon,
					CompletedDoDelete:           true,
					CompletedFinalizedAtHorizon: horizon,
					DiscardedDoDelete:           true,
					DiscardedFinalizedAtHorizon: horizon,
					Max:                         RiverBatch,
					Schema:                      p.schema,
				})
				cancel()
				total += n
				if err != nil || n < RiverBatch {
					return total, err
				}
			}
		},
		Check: func(ctx context.Context) error { return p.checkEmpty(ctx, p.riverJob()) },
	}
}

// Retention sweeps the backlog with one retention Pass. cfg gets Prefix,
// Retention and a silent Logger; set Clear or ClearBatch (ClearByID and
// ClearBatchByID here delete jobs), PageSize, BatchSize and Concurrency.
func (p *PG) Retention(name string, cfg retention.Config) Contender {
	return p.retention(name, p.SetupJobs, p.kv, cfg)
}

// Atomic sweeps the backlog with one retention Pass over a pgkv.AtomicKV:
// each batch's DELETE of jobs and of their markers go in one round trip
// and one transaction, so each job is cleared exactly once. cfg is as for
// Retention, with neither Clear nor ClearBatch.
func (p *PG) Atomic(name string, cfg retention.Config) Contender {
	return p.atomicOver(p.kv, name, cfg)
}

func (p *PG) atomicOver(over *pgkv.KV, name string, cfg retention.Config) Contender {
	return p.atomic(over, name, p.SetupJobs, func(_ context.Context, b *pgx.Batch, ids []string) error {
		n, err := bigints(ids)
		if err != nil {
			return err
		}
		b.Queue(`DELETE FROM `+p.jobs+` WHERE id = ANY($1)`, n)
		return nil
	}, cfg)
}

// AtomicText is Atomic over the jobs_text table, whose ids are text
// compared under the database's collation.
func (p *PG) AtomicText(name string, cfg retention.Config) Contender {
	return p.atomic(p.kv, name, p.SetupTextJobs, func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue(`DELETE FROM `+p.jobsText+` WHERE id = ANY($1)`, ids)
		return nil
	}, cfg)
}

// AtomicSQL sweeps the backlog with one retention Pass over a
// pgkv.AtomicKV made by WithClearSQL, whose clear is one statement the
// server binds to each batch's ids: with Concurrency 1 the database picks
// each batch (a run of up to Config.BatchSize keys) itself, as River's
// JobDeleteBefore does, and no key of the expired range is scanned. cfg
// is as for Atomic.
func (p *PG) AtomicSQL(name string, cfg retention.Config) Contender {
	return p.atomicSQL(name, p.kv, cfg)
}

func (p *PG) atomicSQL(name string, over *pgkv.KV, cfg retention.Config) Contender {
	kv, err := over.WithClearSQL(`DELETE FROM ` + p.jobs + ` WHERE id = ANY($1::bigint[])`)
	if err != nil {
		return Contender{Name: name, Setup: func(context.Context, int) error { return err }}
	}
	return p.retention(name, p.SetupJobs, kv, cfg)
}

// AtomicRuns is the AtomicSQL contender with runs (batches and pages) of
// size, concurrency 1.
func (p *PG) AtomicRuns(size int) Contender {
	return p.AtomicSQL(fmt.Sprintf("retention runs+atomic %d (WithClearSQL), concurrency 1", size), runsOf(size))
}

// AtomicRunsText is AtomicRuns over a DB that is no *pgxpool.Pool, so
// that each run goes as text, parsed and planned by the server every time,
// where over the pool it is prepared once per connection.
func (p *PG) AtomicRunsText(size int) Contender {
	return p.atomicSQL(fmt.Sprintf("retention runs+atomic %d (WithClearSQL), concurrency 1, not prepared", size), p.textKV, runsOf(size))
}

// runsOf is the configuration of the runs contenders: batches and pages
// of size, concurrency 1, where the sweep takes runs.
func runsOf(size int) retention.Config { return batchesOf(size, 1) }

// batchesOf is a configuration with batches and pages of size and
// Concurrency conc.
func batchesOf(size, conc int) retention.Config {
	return retention.Config{BatchSize: size, PageSize: size, Concurrency: conc}
}

func (p *PG) atomic(over *pgkv.KV, name string, setup func(context.Context, int) error, clear pgkv.ClearFunc, cfg retention.Config) Contender {
	kv, err := over.WithClear(clear)
	if err != nil {
		// The pool can always send a batch: only a programming error
		// gets here, and the contender reports it when run.
		return Contender{Name: name, Setup: func(context.Context, int) error { return err }}
	}
	return p.retention(name, setup, kv, cfg)
}

func (p *PG) retention(name string, setup func(context.Context, int) error, kv retention.KV, cfg retention.Config) Contender {
	return Contender{
		Name:  name,
		Setup: setup,
		Clear: func(ctx context.Context) (int, error) {
			return sweep(ctx, p.Timing.kv(kv), cfg, p.Timing)
		},
		Check: func(ctx context.Context) error { return p.checkEmpty(ctx, p.jobs, p.jobsText, p.markers()) },
	}
}

// bigints parses the ids of the jobs table.
func bigints(ids []string) ([]int64, error) {
	n := make([]int64, len(ids))
	for i, id := range ids {
		v, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("job id %q: %w", id, err)
		}
		n[i] = v
	}
	return n, nil
}

// ClearByID is a Config.Clear that deletes one job: one round trip per id.
func (p *PG) ClearByID(ctx context.Context, id string) error {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return fmt.Errorf("job id %q: %w", id, err)
	}
	_, err = p.pool.Exec(ctx, `DELETE FROM `+p.jobs+` WHERE id = $1`, n)
	return err
}

// ClearBatchByID is a Config.ClearBatch that deletes the batch's jobs in
// one statement.
func (p *PG) ClearBatchByID(ctx context.Context, ids []string) error {
	n, err := bigints(ids)
	if err != nil {
		return err
	}
	_, err = p.pool.Exec(ctx, `DELETE FROM `+p.jobs+` WHERE id = ANY($1)`, n)
	return err
}

// sweep runs one Pass of a sweep over kv with cfg and returns how many
// markers it cleared; any marker not cleared is an error.
func sweep(ctx context.Context, kv retention.KV, cfg retention.Config, t *Timing) (int, error) {
	cfg.Prefix = Prefix
	cfg.Retention = Retention
	// Warnings (a failed clear, a malformed marker) are kept to explain a
	// failed run.
	var warnings bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if cfg.Clear != nil {
		cfg.Clear = t.clearFn(cfg.Clear)
	}
	if cfg.ClearBatch != nil {
		cfg.ClearBatch = t.batchFn(cfg.ClearBatch)
	}
	s, err := retention.New(kv, cfg)
	if err != nil {
		return 0, err
	}
	st, err := s.Pass(ctx)
	if err != nil {
		return st.Cleared, err
	}
	if st.Failed != 0 || st.Malformed != 0 || st.Foreign != 0 {
		return st.Cleared, fmt.Errorf("pass: %+v; the sweep's warnings: %.2000s", st, warnings.String())
	}
	return st.Cleared, nil
}

// AtomicBatches is the Atomic contender with batches and pages of size and
// Concurrency conc.
func (p *PG) AtomicBatches(size, conc int) Contender {
	return p.Atomic(fmt.Sprintf("retention batched+atomic %d, page %d, concurrency %d", size, size, conc), batchesOf(size, conc))
}

// AtomicBatchesText is AtomicBatches over a DB that is no
// *pgxpool.Pool, whose marker statements go as text, parsed and planned
// by the server every time.
func (p *PG) AtomicBatchesText(size, conc int) Contender {
	return p.atomicOver(p.textKV, fmt.Sprintf("retention batched+atomic %d, page %d, concurrency %d, not prepared", size, size, conc), batchesOf(size, conc))
}

// DatabasePicks is no sweep but a bound on one: statements that each let
// the database pick the next size markers of the expired range, delete
// them and, in the same statement, the jobs their ids name, returning only
// a count. No key travels to the client and nothing checks the range, as
// in River's JobDeleteBefore; what a sweep adds (reading the page, the
// range check, the ids sent back) is the difference to Atomic.
func (p *PG) DatabasePicks(size int) Contender {
	idAt := len(Prefix) + retention.TimestampWidth + 2 // 1-based, after the '/'
	sql := `WITH m AS (DELETE FROM ` + p.markers() + ` WHERE key >= $1 AND key < $2 AND key <= coalesce((
	SELECT key FROM ` + p.markers() + ` WHERE key >= $1 AND key < $2 ORDER BY key OFFSET $3 - 1 LIMIT 1), $2)
	RETURNING key),
j AS (DELETE FROM ` + p.jobs + ` WHERE id = ANY(ARRAY(SELECT convert_from(substring(key FROM $4), 'UTF8')::bigint FROM m)))
SELECT count(*) FROM m`
	return Contender{
		Name:  fmt.Sprintf("bound: the database picks each run of %d (no sweep)", size),
		Setup: p.SetupJobs,
		Clear: func(ctx context.Context) (int, error) {
			return p.countedRuns(ctx, size, sql, func() []any { return []any{[]byte(Prefix + "0"), expiredEnd(), size, idAt} })
		},
		Check: func(ctx context.Context) error { return p.checkEmpty(ctx, p.jobs, p.markers()) },
	}
}

// ColumnPicks is the bound of a sweep whose marker is a column of the
// entity's row rather than a row of its own, as River keeps finalized_at:
// statements that each delete the next size expired jobs by the indexed
// finished_at, returning only a count (River's JobDeleteBefore over this
// benchmark's jobs table). Against DatabasePicks it tells what the
// marker table costs the database.
func (p *PG) ColumnPicks(size int) Contender {
	sql := `WITH j AS (DELETE FROM ` + p.jobs + ` WHERE id IN (
	SELECT id FROM ` + p.jobs + ` WHERE finished_at < $1 ORDER BY finished_at LIMIT $2) RETURNING 1)
SELECT count(*) FROM j`
	return Contender{
		Name:  fmt.Sprintf("bound: runs of %d by an indexed finish-time column (no marker table, no sweep)", size),
		Setup: p.SetupJobs,
		Clear: func(ctx context.Context) (int, error) {
			return p.countedRuns(ctx, size, sql, func() []any { return []any{time.Now().Add(-Retention), size} })
		},
		Check: func(ctx context.Context) error { return p.checkEmpty(ctx, p.jobs) },
	}
}

// countedRuns sends sql, a statement that deletes a run of at most size
// and returns how many it deleted, with the arguments args gives each
// time, until a run comes back short, and returns how many in all.
func (p *PG) countedRuns(ctx context.Context, size int, sql string, args func() []any) (int, error) {
	total := 0
	for {
		var n int
		if err := p.pool.QueryRow(ctx, sql, args()...).Scan(&n); err != nil {
			return total, err
		}
		total += n
		if n < size {
			return total, nil
		}
	}
}

// Contenders returns every PostgreSQL contender, the floor first and River
// second: the two baselines of the table.
func (p *PG) Contenders() []Contender {
	perID := func(conc int) Contender {
		return p.Retention(fmt.Sprintf("retention per-id, concurrency %d", conc), retention.Config{
			Clear: p.ClearByID, PageSize: 1000, Concurrency: conc,
		})
	}
	batched := func(size, conc int) Contender {
		return p.Retention(fmt.Sprintf("retention batched %d, page %d, concurrency %d", size, size, conc), retention.Config{
			ClearBatch: p.ClearBatchByID, BatchSize: size, PageSize: size, Concurrency: conc,
		})
	}
	return []Contender{
		p.Floor(), p.River(),
		perID(1), perID(16), perID(64),
		batched(1000, 1), batched(1000, 4), batched(10_000, 1),
		p.AtomicBatches(1000, 1), p.AtomicBatchesText(1000, 1), p.AtomicBatches(1000, 4), p.AtomicBatches(10_000, 1),
		p.AtomicBatches(10_000, 2), p.AtomicBatches(retention.MaxPageSize, 1),
		p.AtomicText("retention batched+atomic 10000, page 10000, concurrency 1, text ids", retention.Config{BatchSize: 10_000, PageSize: 10_000}),
		p.AtomicRuns(1000), p.AtomicRuns(10_000), p.AtomicRunsText(10_000), p.AtomicRuns(retention.MaxPageSize),
		p.DatabasePicks(10_000), p.ColumnPicks(10_000),
	}
}

// TableRunsOnly calls the table store's CountRun in a loop, asking for no
// times, as a sweep with no Observer does, with no sweep: the bound of the
// table sweep, what the store costs without the core.
func (p *PG) TableRunsOnly(size int) Contender {
	return Contender{
		Name:  fmt.Sprintf("bound: the table store's runs of %d (no sweep)", size),
		Setup: p.SetupRiver,
		Clear: func(ctx context.Context) (int, error) {
			total := 0
			from, end := []byte(Prefix), expiredEnd()
			for {
				c, err := p.table.CountRun(ctx, Prefix, from, end, size, false)
				total += c.N
				if err != nil || c.N < size {
					return total, err
				}
				from = append(c.Last, 0)
			}
		},
		Check: func(ctx context.Context) error { return p.checkEmpty(ctx, p.riverJob()) },
	}
}
