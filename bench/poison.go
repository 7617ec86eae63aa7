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

// Poison is one configuration of the poison-id scenario: a job
// service on PostgreSQL, as a new user would build it, finishing jobs at a
// steady rate while a few of them cannot be deleted for a while. Each job's
// row and its marker are written in one transaction (pgkv's MarkTx); the
// sweep clears through a pgkv.AtomicKV whose ClearFunc deletes the jobs and
// records, in the same transaction, each job's due time and the server's
// clock_timestamp() in a cleared_log table: the database's own figures are
// the truth the sweep's metrics are compared with.
//
// The faults: a fraction Poison of the jobs is poisoned (a trigger on the
// jobs table raises an error when one is deleted, until PoisonFor after it
// fell due, or for the whole run when PoisonFor is zero), and a fraction
// Locked has its row locked by another transaction (SELECT ... FOR
// UPDATE) for LockFor from just before it falls due.
type Poison struct {
	// Name labels the configuration in tables.
	Name string

	Jobs      int           // jobs written
	Rate      float64       // jobs finished per second
	Writers   int           // goroutines writing jobs; 0 means 4
	Retention time.Duration // Config.Retention

	BatchSize    int           // Config.BatchSize
	PageSize     int           // Config.PageSize
	ClearTimeout time.Duration // Config.ClearTimeout (0: the library's default)
	RetryDelay   time.Duration // Config.RetryDelay (0: the library's default)
	Replicas     int           // sweeps under Run, sharing a pgkv.Locker; 0 means 1
	LockTimeout  time.Duration // pgkv.LockTimeout of the AtomicKV (0: none)

	Poison    float64       // fraction of jobs whose delete fails
	PoisonFor time.Duration // how long past due a poisoned job stays so; 0: the whole run
	Locked    float64       // fraction of jobs whose row is locked when they fall due
	LockFor   time.Duration // how long such a row stays locked

	// Drain bounds how long the run goes on after the last job fell due,
	// waiting for the sweep to clear what it can.
	Drain time.Duration

	// Seed picks the faulty jobs: configurations with the same seed and
	// numbers fault the same job numbers.
	Seed uint64
}

// Fault kinds, as the jobs table and cleared_log record them.
const (
	faultNone   = ""
	faultPoison = "poison"
	faultLocked = "locked"
)

// poisonRun holds one run's tables and counters.
type poisonRun struct {
	cfg    Poison
	pool   *pgxpool.Pool
	schema string
	jobs   string // quoted and qualified, like the others
	poison string
	log    string
	kv     *pgkv.KV
	faults []string // by job number (id-1)

	locksTaken  atomic.Int64 // lock holders that found their row
	locksMissed atomic.Int64 // lock holders that came after its deletion
	lastDue     atomic.Int64 // unix ms of the last job's due time
}

// RunPoison runs cfg once on pool in a new schema, dropped at the end, and
// returns what the database and the sweep reported. progress, when not
// nil, gets a line now and then.
func RunPoison(ctx context.Context, pool *pgxpool.Pool, cfg Poison, progress func(string)) (PoisonResult, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 4
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	schema := fmt.Sprintf("bench_poison_%d", rand.Uint32())
	q := pgx.Identifier{schema}.Sanitize()
	r := &poisonRun{cfg: cfg, pool: pool, schema: schema, jobs: q + ".jobs", poison: q + ".poison", log: q + ".cleared_log"}
	r.faults = pickFaults(cfg.Jobs, cfg.Poison, cfg.Locked, cfg.Seed)
	if err := r.setup(ctx); err != nil {
		return PoisonResult{}, err
	}
	defer func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+q+` CASCADE`); err != nil {
			progress("dropping " + schema + ": " + err.Error())
		}
	}()
	return r.run(ctx, progress)
}

// pickFaults returns the fault of every job number: exactly round(n·poison)
// poisoned and round(n·locked) locked, at random places chosen by seed.
func pickFaults(n int, poison, locked float64, seed uint64) []string {
	faults := make([]string, n)
	perm := rand.New(rand.NewPCG(seed, 0x16)).Perm(n)
	np := int(float64(n)*poison + 0.5)
	nl := int(float64(n)*locked + 0.5)
	for i, j := range perm {
		switch {
		case i < np:
			faults[j] = faultPoison
		case i < np+nl:
			faults[j] = faultLocked
		}
	}
	return faults
}

func (r *poisonRun) setup(ctx context.Context) error {
	q := pgx.Identifier{r.schema}.Sanitize()
	stmts := []string{
		`CREATE SCHEMA ` + q,
		`CREATE TABLE ` + r.jobs + ` (
			id bigint PRIMARY KEY,
			kind text NOT NULL,
			state text NOT NULL,
			finished_at timestamptz NOT NULL,
			fault text NOT NULL,
			output jsonb NOT NULL)`,
		`CREATE TABLE ` + r.poison + ` (id bigint PRIMARY KEY, until timestamptz NOT NULL)`,
		`CREATE TABLE ` + r.log + ` (
			id bigint NOT NULL,
			fault text NOT NULL,
			due_at timestamptz NOT NULL,
			deleted_at timestamptz NOT NULL)`,
		// The poison: deleting a poisoned job's row fails, and with it the
		// transaction of the whole batch, as a foreign key or a failing
		// trigger of a real schema would.
		`CREATE FUNCTION ` + q + `.refuse_poisoned() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT 1 FROM ` + r.poison + ` WHERE id = OLD.id AND until > clock_timestamp()) THEN
				RAISE EXCEPTION 'job % is poisoned', OLD.id;
			END IF;
			RETURN OLD;
		END $$`,
		`CREATE TRIGGER refuse_poisoned BEFORE DELETE ON ` + r.jobs + ` FOR EACH ROW EXECUTE FUNCTION ` + q + `.refuse_poisoned()`,
	}
	for _, s := range stmts {
		if _, err := r.pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("%.50s...: %w", s, err)
		}
	}
	if err := pgkv.Migrate(ctx, r.pool, r.schema+".markers"); err != nil {
		return err
	}
	if r.cfg.Replicas > 1 {
		if err := pgkv.MigrateLeases(ctx, r.pool, r.schema+".leases"); err != nil {
			return err
		}
	}
	kv, err := pgkv.New(r.pool, r.schema+".markers")
	if err != nil {
		return err
	}
	r.kv = kv
	return nil
}

// clear is the ClearFunc: it deletes the jobs and logs, for each, its due
// time and the server's clock at the deletion, in the sweep's transaction.
func (r *poisonRun) clear(_ context.Context, b *pgx.Batch, ids []string) error {
	n, err := bigints(ids)
	if err != nil {
		return err
	}
	b.Queue(`WITH d AS (DELETE FROM `+r.jobs+` WHERE id = ANY($1::bigint[]) RETURNING id, fault, finished_at)
		INSERT INTO `+r.log+` (id, fault, due_at, deleted_at)
		SELECT id, fault, finished_at + $2::bigint * interval '1 millisecond', clock_timestamp() FROM d`,
		n, r.cfg.Retention.Milliseconds())
	return nil
}

func (r *poisonRun) run(ctx context.Context, progress func(string)) (PoisonResult, error) {
	cfg := r.cfg
	res := PoisonResult{Config: cfg}
	for _, f := range r.faults {
		switch f {
		case faultPoison:
			res.PoisonJobs++
		case faultLocked:
			res.LockedJobs++
		}
	}
	akv, err := r.kv.WithClear(r.clear, pgkv.LockTimeout(cfg.LockTimeout))
	if err != nil {
		return res, err
	}
	rec := &Recorder{}
	logs := &logCounter{}
	var lease retention.Locker
	if cfg.Replicas > 1 {
		l, err := pgkv.NewLocker(r.pool, "poison", &pgkv.LockerOptions{Table: r.schema + ".leases"})
		if err != nil {
			return res, err
		}
		lease = l
	}
	sweeps := make([]*retention.Sweep, cfg.Replicas)
	for i := range sweeps {
		s, err := retention.New(akv, retention.Config{
			Prefix:       Prefix,
			Retention:    cfg.Retention,
			BatchSize:    cfg.BatchSize,
			PageSize:     cfg.PageSize,
			ClearTimeout: cfg.ClearTimeout,
			RetryDelay:   cfg.RetryDelay,
			Observer:     rec,
			Lease:        lease,
			Logger:       slog.New(logs),
		})
		if err != nil {
			return res, err
		}
		sweeps[i] = s
	}

	runCtx, stopRun := context.WithCancel(ctx)
	var sweepers sync.WaitGroup
	runErrs := make([]error, len(sweeps))
	for i, s := range sweeps {
		sweepers.Go(func() { runErrs[i] = s.Run(runCtx) })
	}

	start := time.Now()
	writeCtx, stopWrite := context.WithCancel(ctx)
	var workers sync.WaitGroup // the writer and the row-lock holders it starts
	writeErr := make(chan error, 1)
	workers.Go(func() { writeErr <- r.write(writeCtx, &workers) })
	// Every goroutine of the run ends before RunPoison drops the schema.
	defer func() {
		stopWrite()
		stopRun()
		workers.Wait()
		sweepers.Wait()
	}()

	mon := &monitor{}
	written := false
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	nextProgress := start.Add(5 * time.Second)
loop:
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-writeErr:
			if err != nil {
				return res, fmt.Errorf("writer: %w", err)
			}
			written = true
		case now := <-tick.C:
			if err := r.sample(ctx, sweeps[0], mon); err != nil {
				return res, err
			}
			if now.After(nextProgress) {
				nextProgress = now.Add(5 * time.Second)
				progress(fmt.Sprintf("%s: %.0fs: %s", cfg.Name, now.Sub(start).Seconds(), mon.last))
			}
			if !written {
				continue
			}
			lastDue := time.UnixMilli(r.lastDue.Load())
			done, err := r.drained(ctx)
			if err != nil {
				return res, err
			}
			if (done && now.After(lastDue)) || now.After(lastDue.Add(cfg.Drain)) {
				break loop
			}
		}
	}
	stopRun()
	sweepers.Wait()
	workers.Wait()
	res.Wall = time.Since(start)
	for _, err := range runErrs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return res, fmt.Errorf("sweep run: %w", err)
		}
	}
	res.LocksTaken = int(r.locksTaken.Load())
	res.LocksMissed = int(r.locksMissed.Load())
	res.Sweep, res.Passes, res.PassErrors, res.MaxLag, res.Lags = rec.Summary()
	res.ErrorLines, res.WarnLines, res.ErrorSamples = logs.errors, logs.warns, logs.samples()
	res.BacklogMax, res.DBHealthyMax, res.DBAnyMax, res.BacklogBlind, res.Samples = mon.backlogMax, mon.healthyMax, mon.anyMax, mon.blindMax, mon.n
	return res, r.truth(ctx, &res)
}

// write finishes cfg.Jobs jobs at cfg.Rate, each job's row, its poison
// entry and its marker in one transaction, and starts the holder of each
// locked job's row lock.
func (r *poisonRun) write(ctx context.Context, workers *sync.WaitGroup) error {
	cfg := r.cfg
	next := make(chan int)
	errs := make(chan error, cfg.Writers)
	var writers sync.WaitGroup
	for range cfg.Writers {
		writers.Go(func() {
			for i := range next {
				if err := r.writeJob(ctx, i, workers); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	start := time.Now()
	var err error
pace:
	for i := range cfg.Jobs {
		at := start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
		if d := time.Until(at); d > time.Millisecond {
			time.Sleep(d)
		}
		select {
		case next <- i:
		case err = <-errs:
			break pace
		case <-ctx.Done():
			err = ctx.Err()
			break pace
		}
	}
	close(next)
	writers.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

func (r *poisonRun) writeJob(ctx context.Context, i int, workers *sync.WaitGroup) error {
	id := int64(i + 1)
	fault := r.faults[i]
	// The marker holds milliseconds: the row gets the same time, so that
	// the due time the database logs is the one the sweep goes by.
	finished := time.Now().Truncate(time.Millisecond)
	due := finished.Add(r.cfg.Retention)
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+r.jobs+` (id, kind, state, finished_at, fault, output)
			VALUES ($1, 'report', 'completed', $2, $3, '{"pages": 3}')`, id, finished, fault); err != nil {
			return err
		}
		if fault == faultPoison {
			until := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
			if r.cfg.PoisonFor > 0 {
				until = due.Add(r.cfg.PoisonFor)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+r.poison+` (id, until) VALUES ($1, $2)`, id, until); err != nil {
				return err
			}
		}
		return r.kv.MarkTx(ctx, tx, Prefix, strconv.FormatInt(id, 10), finished)
	})
	if err != nil {
		return fmt.Errorf("job %d: %w", id, err)
	}
	for {
		last := r.lastDue.Load()
		if due.UnixMilli() <= last || r.lastDue.CompareAndSwap(last, due.UnixMilli()) {
			break
		}
	}
	if fault == faultLocked {
		workers.Go(func() { r.holdLock(ctx, id, due) })
	}
	return nil
}

// holdLock locks job id's row from just before it falls due, for
// cfg.LockFor, as a slow transaction of the service would.
func (r *poisonRun) holdLock(ctx context.Context, id int64, due time.Time) {
	select {
	case <-time.After(time.Until(due.Add(-100 * time.Millisecond))):
	case <-ctx.Done():
		return
	}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1 FROM `+r.jobs+` WHERE id = $1 FOR UPDATE`, id).Scan(&one); err != nil {
			return err
		}
		r.locksTaken.Add(1)
		select {
		case <-time.After(r.cfg.LockFor):
		case <-ctx.Done():
		}
		return nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		r.locksMissed.Add(1)
	}
}

// drained reports whether the sweep has cleared every job it can: all but
// the poisoned ones when the poison stays for the run, else all.
func (r *poisonRun) drained(ctx context.Context) (bool, error) {
	var left int
	cond := ``
	if r.cfg.PoisonFor == 0 {
		cond = ` WHERE fault <> 'poison'`
	}
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.jobs+cond).Scan(&left)
	return left == 0, err
}

// monitor keeps the backlog samples: what Sweep.Backlog said and what the
// database said at the same moment.
type monitor struct {
	n          int
	backlogMax time.Duration // the largest Backlog.Age
	healthyMax time.Duration // the largest age of the oldest due healthy job
	anyMax     time.Duration // the same over every job
	blindMax   time.Duration // the largest (healthy age - Backlog.Age) of one sample
	last       string
}

// sample reads the backlog through the sweep, then the database's view:
// how long past due the oldest job still there is, among healthy jobs and
// among all.
func (r *poisonRun) sample(ctx context.Context, s *retention.Sweep, m *monitor) error {
	b, err := s.Backlog(ctx, 1000)
	if err != nil {
		return fmt.Errorf("sweep backlog: %w", err)
	}
	var healthy, all float64
	err = r.pool.QueryRow(ctx, `SELECT
			COALESCE(extract(epoch FROM clock_timestamp() - min(finished_at) FILTER (WHERE fault = '') - $1::bigint * interval '1 millisecond'), 0)::float8,
			COALESCE(extract(epoch FROM clock_timestamp() - min(finished_at) - $1::bigint * interval '1 millisecond'), 0)::float8
		FROM `+r.jobs+` WHERE finished_at < clock_timestamp() - $1::bigint * interval '1 millisecond'`,
		r.cfg.Retention.Milliseconds()).Scan(&healthy, &all)
	if err != nil {
		return fmt.Errorf("oldest due job: %w", err)
	}
	h, a := seconds(healthy), seconds(all)
	m.n++
	m.backlogMax = max(m.backlogMax, b.Age)
	m.healthyMax = max(m.healthyMax, h)
	m.anyMax = max(m.anyMax, a)
	m.blindMax = max(m.blindMax, h-b.Age)
	m.last = fmt.Sprintf("Backlog.Age %v (due %d), database: oldest due healthy job %v past due, any job %v",
		b.Age.Round(time.Millisecond), b.Due, h.Round(time.Millisecond), a.Round(time.Millisecond))
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// truth reads the database's figures at the end of the run into res.
func (r *poisonRun) truth(ctx context.Context, res *PoisonResult) error {
	rows, err := r.pool.Query(ctx, `SELECT fault, count(*), count(DISTINCT id),
			count(*) FILTER (WHERE deleted_at < due_at),
			count(*) FILTER (WHERE deleted_at - due_at > interval '1 second'),
			COALESCE(extract(epoch FROM percentile_disc(0.5) WITHIN GROUP (ORDER BY deleted_at - due_at)), 0)::float8,
			COALESCE(extract(epoch FROM percentile_disc(0.99) WITHIN GROUP (ORDER BY deleted_at - due_at)), 0)::float8,
			COALESCE(extract(epoch FROM max(deleted_at - due_at)), 0)::float8
		FROM `+r.log+` GROUP BY ROLLUP (fault)`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var (
			fault                      *string // nil: the total
			n, distinct, early, over1s int
			p50, p99, maxLag           float64
		)
		if err := rows.Scan(&fault, &n, &distinct, &early, &over1s, &p50, &p99, &maxLag); err != nil {
			rows.Close()
			return err
		}
		l := DBLags{Cleared: n, Over1s: over1s, P50: seconds(p50), P99: seconds(p99), Max: seconds(maxLag)}
		if fault == nil {
			res.All = l
			res.ClearedTwice, res.Early = n-distinct, early
			continue
		}
		switch *fault {
		case faultNone:
			res.Healthy = l
		case faultPoison:
			res.Poisoned = l
		case faultLocked:
			res.LockedLags = l
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	err = r.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM `+r.jobs+` WHERE fault = ''),
			(SELECT count(*) FROM `+r.jobs+`),
			(SELECT count(*) FROM `+pgx.Identifier{r.schema, "markers"}.Sanitize()+`)`).
		Scan(&res.HealthyLeft, &res.JobsLeft, &res.MarkersLeft)
	return err
}
