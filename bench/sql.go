package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// SQL holds the tables of the database/sql contenders on one server, for
// any dialect of the sqlkv module: a jobs table (an entity's state, bigint
// ids, the finish time indexed with the id) and a sqlkv marker table
// beside it. Create it with NewSQL and drop its tables with Close.
//
// Unlike the PostgreSQL suite of PG, whose floor is one DELETE of every
// expired row, the floor here deletes what a sweep deletes, jobs and their
// markers, in batches of the sweep's size, one transaction a batch: what
// it measures is the sweep's cost over the same work written by hand.
//
// The jobs table is also the marker store of its own sweep (Table): its
// rows, by their finish time, through a sqlkv.AtomicTableKV whose side
// table is the marker table, against the batched DELETE by the finish
// time a user would write instead (ColumnDelete).
type SQL struct {
	db      *sql.DB
	d       sqlkv.Dialect
	jobs    string // quoted
	markers string // quoted
	names   []string
	kv      *sqlkv.KV
	table   *sqlkv.AtomicTableKV // over jobs, its side table the marker table
	batch   int

	// Timing, when not nil, adds up the calls of the retention contenders.
	Timing *Timing
}

// NewSQL creates the tables name_jobs and name_markers (which must not
// exist) in db, whose dialect is d. batch is the size of the batches of
// the contenders over the marker table: the floor's transactions and the
// sweeps' BatchSize and PageSize.
func NewSQL(ctx context.Context, db *sql.DB, d sqlkv.Dialect, name string, batch int) (*SQL, error) {
	if batch < 1 {
		return nil, fmt.Errorf("batch must be at least 1, got %d", batch)
	}
	s := &SQL{db: db, d: d, batch: batch, names: []string{name + "_jobs", name + "_markers"}}
	s.jobs, s.markers = s.quote(s.names[0]), s.quote(s.names[1])
	// Shaped like PG's jobs table, with the types of each database. The
	// finish time is Unix milliseconds on MySQL and SQLite, the type a
	// sqlkv.TableKV reads there, and its index is the (time, id) one the
	// table sweep needs; InnoDB's and SQLite's indexes end with the
	// primary key anyway.
	var create []string
	unit := sqlkv.UnixMilli
	switch d {
	case sqlkv.MySQL:
		create = []string{`CREATE TABLE ` + s.jobs + ` (
			id BIGINT NOT NULL PRIMARY KEY,
			kind VARCHAR(64) NOT NULL,
			state VARCHAR(16) NOT NULL,
			finished_at BIGINT NOT NULL, -- Unix milliseconds
			args JSON NOT NULL,
			INDEX (finished_at, id)) ENGINE=InnoDB`}
	case sqlkv.SQLite:
		// INTEGER PRIMARY KEY is the rowid: the fastest key SQLite has.
		create = []string{`CREATE TABLE ` + s.jobs + ` (
			id INTEGER PRIMARY KEY,
			kind TEXT NOT NULL,
			state TEXT NOT NULL,
			finished_at INTEGER NOT NULL, -- Unix milliseconds
			args TEXT NOT NULL)`,
			`CREATE INDEX ` + s.quote(name+"_jobs_finished_at") + ` ON ` + s.jobs + ` (finished_at, id)`}
	case sqlkv.PostgreSQL:
		unit = sqlkv.Timestamp
		create = []string{`CREATE TABLE ` + s.jobs + ` (
			id bigint PRIMARY KEY,
			kind text NOT NULL,
			state text NOT NULL,
			finished_at timestamptz NOT NULL,
			args jsonb NOT NULL)`,
			`CREATE INDEX ON ` + s.jobs + ` (finished_at, id)`}
	default:
		return nil, fmt.Errorf("dialect %v", d)
	}
	for _, q := range create {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return nil, fmt.Errorf("create %s: %w", s.jobs, err)
		}
	}
	if err := sqlkv.Migrate(ctx, db, d, s.names[1]); err != nil {
		return nil, err
	}
	kv, err := sqlkv.New(db, d, s.names[1])
	if err != nil {
		return nil, err
	}
	s.kv = kv
	t, err := sqlkv.NewTable(ctx, kv, sqlkv.Table{Name: s.names[0], ID: "id", Time: "finished_at", TimeUnit: unit, Prefix: Prefix})
	if err != nil {
		return nil, err
	}
	s.table = t.WithClear(nil)
	return s, nil
}

// ServerCPU returns a CPUMeter of the database server of s, which must
// run on this machine: every thread of the MariaDB or MySQL process
// (@@pid_file). For SQLite, which runs in this process, it reads 0:
// RunMetered's client CPU time then holds all of it. For PostgreSQL use
// PGServerCPU.
func (s *SQL) ServerCPU(ctx context.Context) (CPUMeter, error) {
	switch s.d {
	case sqlkv.SQLite:
		return func() (time.Duration, error) { return 0, nil }, nil
	case sqlkv.MySQL:
		var file string
		if err := s.db.QueryRowContext(ctx, `SELECT @@pid_file`).Scan(&file); err != nil {
			return nil, err
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("the server is not on this machine, or its pid file cannot be read: %w", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("pid file %s: %w", file, err)
		}
		return func() (time.Duration, error) {
			tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
			if err != nil || len(tasks) == 0 {
				return 0, fmt.Errorf("server process %d: no threads to read (%v)", pid, err)
			}
			var total time.Duration
			for _, t := range tasks {
				if d, err := readSchedstat(t); err == nil {
					total += d // a thread that ended meanwhile takes its time with it
				}
			}
			return total, nil
		}, nil
	}
	return nil, fmt.Errorf("ServerCPU of %v: use PGServerCPU", s.d)
}

// Close drops the tables.
func (s *SQL) Close(ctx context.Context) error {
	return errors.Join(s.exec(ctx, `DROP TABLE IF EXISTS `+s.jobs), s.exec(ctx, `DROP TABLE IF EXISTS `+s.markers))
}

func (s *SQL) exec(ctx context.Context, q string, args ...any) error {
	_, err := s.db.ExecContext(ctx, q, args...)
	return err
}

func (s *SQL) quote(name string) string {
	if s.d == sqlkv.MySQL {
		return "`" + name + "`"
	}
	return `"` + name + `"`
}

// phs returns n placeholders from the first-th, comma-separated.
func (s *SQL) phs(first, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		if s.d == sqlkv.PostgreSQL {
			b.WriteString("$" + strconv.Itoa(first+i))
		} else {
			b.WriteString("?")
		}
	}
	return b.String()
}

// Setup writes n expired jobs and their markers, the marker of each as
// MarkTx would write it (retention.MarkerKey), in one transaction of
// multi-row INSERTs of 1,000 rows, then has the database update its
// statistics (and, on SQLite, checkpoint its WAL), so that every
// contender starts alike.
func (s *SQL) Setup(ctx context.Context, n int) error { return s.setup(ctx, n, true) }

// SetupRows is Setup with no marker rows: the jobs alone, for the
// contenders whose markers are the jobs' rows.
func (s *SQL) SetupRows(ctx context.Context, n int) error { return s.setup(ctx, n, false) }

func (s *SQL) setup(ctx context.Context, n int, withMarkers bool) error {
	empty := []string{`TRUNCATE TABLE ` + s.jobs, `TRUNCATE TABLE ` + s.markers}
	if s.d == sqlkv.SQLite {
		empty = []string{`DELETE FROM ` + s.jobs, `DELETE FROM ` + s.markers}
	}
	for _, q := range empty {
		if err := s.exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	base := finishedAt()
	const rows = 1000
	for lo := 1; lo <= n; lo += rows {
		hi := min(lo+rows-1, n)
		var jobs, markers strings.Builder
		var jobArgs, markerArgs []any
		for i := lo; i <= hi; i++ {
			if i > lo {
				jobs.WriteString(", ")
				markers.WriteString(", ")
			}
			at := base.Add(time.Duration(i) * time.Millisecond)
			k := len(jobArgs)
			fmt.Fprintf(&jobs, "(%s, 'bench', 'completed', %s, '{\"n\": 1}')", s.phs(k+1, 1), s.phs(k+2, 1))
			var finished any = at.UnixMilli()
			if s.d == sqlkv.PostgreSQL {
				finished = at
			}
			jobArgs = append(jobArgs, int64(i), finished)
			key, err := retention.MarkerKey(Prefix, at, strconv.Itoa(i))
			if err != nil {
				return err
			}
			markers.WriteString("(" + s.phs(len(markerArgs)+1, 1) + ")")
			markerArgs = append(markerArgs, key)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.jobs+` (id, kind, state, finished_at, args) VALUES `+jobs.String(), jobArgs...); err != nil {
			return fmt.Errorf("insert jobs: %w", err)
		}
		if !withMarkers {
			continue
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.markers+` (marker) VALUES `+markers.String(), markerArgs...); err != nil {
			return fmt.Errorf("insert markers: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	var after []string
	switch s.d {
	case sqlkv.MySQL:
		after = []string{`ANALYZE TABLE ` + s.jobs + `, ` + s.markers}
	case sqlkv.SQLite:
		after = []string{`ANALYZE`, `PRAGMA wal_checkpoint(TRUNCATE)`}
	case sqlkv.PostgreSQL:
		after = []string{`VACUUM ANALYZE ` + s.jobs, `VACUUM ANALYZE ` + s.markers, `CHECKPOINT`}
	}
	for _, q := range after {
		if err := s.exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// Check returns an error naming every table with rows left.
func (s *SQL) Check(ctx context.Context) error {
	var errs []error
	for _, t := range []string{s.jobs, s.markers} {
		var left int
		if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM `+t).Scan(&left); err != nil {
			return err
		}
		if left != 0 {
			errs = append(errs, fmt.Errorf("%s: %d rows left", t, left))
		}
	}
	return errors.Join(errs...)
}

// Floor deletes the backlog by hand, with no sweep: one transaction per
// batch, which reads the next batch's markers (an index range scan with
// LIMIT, as the sweep's Scan), deletes their jobs with one DELETE ...
// WHERE id IN (...) and the markers with one range DELETE between the
// first and the last key read, until a batch comes back short. It knows
// that nothing else writes in that range, which a sweep does not assume.
func (s *SQL) Floor() Contender {
	return Contender{
		Name:  fmt.Sprintf("floor: by hand, %d per transaction (IN + marker range DELETE)", s.batch),
		Setup: s.Setup,
		Clear: func(ctx context.Context) (int, error) {
			start := []byte(Prefix)
			end := expiredEnd()
			total := 0
			for {
				read, deleted, err := s.floorBatch(ctx, start, end)
				total += deleted
				if err != nil || read < s.batch {
					return total, err
				}
			}
		},
		Check: s.Check,
	}
}

// floorBatch runs one transaction of the floor and returns how many
// markers it read and how many jobs it deleted.
func (s *SQL) floorBatch(ctx context.Context, start, end []byte) (read, deleted int, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback() }()
	cast := ""
	if s.d == sqlkv.PostgreSQL {
		cast = "::bytea"
	}
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(`SELECT marker FROM %s WHERE marker >= %s%s AND marker < %s%s ORDER BY marker LIMIT %d`,
		s.markers, s.phs(1, 1), cast, s.phs(2, 1), cast, s.batch), start, end)
	if err != nil {
		return 0, 0, err
	}
	var first, last []byte
	var ids []any
	for rows.Next() {
		var key []byte
		if err := rows.Scan(&key); err != nil {
			_ = rows.Close()
			return 0, 0, err
		}
		_, id, err := retention.ParseMarkerKey(Prefix, key)
		if err != nil {
			_ = rows.Close()
			return 0, 0, err
		}
		n, err := strconv.ParseInt(string(id), 10, 64)
		if err != nil {
			_ = rows.Close()
			return 0, 0, fmt.Errorf("job id %q: %w", id, err)
		}
		if first == nil {
			first = key
		}
		last = key
		ids = append(ids, n)
	}
	if err := rows.Close(); err != nil {
		return 0, 0, err
	}
	if len(ids) == 0 {
		return 0, 0, tx.Commit()
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM `+s.jobs+` WHERE id IN (`+s.phs(1, len(ids))+`)`, ids...)
	if err != nil {
		return 0, 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, 0, err
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %s WHERE marker >= %s%s AND marker <= %s%s`,
		s.markers, s.phs(1, 1), cast, s.phs(2, 1), cast), first, last); err != nil {
		return 0, 0, err
	}
	return len(ids), int(n), tx.Commit()
}

// deleteJobs deletes the jobs of ids with one DELETE ... WHERE id IN
// (...) through db.
func (s *SQL) deleteJobs(ctx context.Context, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, ids []string) error {
	args := make([]any, len(ids))
	for i, id := range ids {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return fmt.Errorf("job id %q: %w", id, err)
		}
		args[i] = n
	}
	_, err := db.ExecContext(ctx, `DELETE FROM `+s.jobs+` WHERE id IN (`+s.phs(1, len(args))+`)`, args...)
	return err
}

// Batched sweeps the backlog with one Pass over the KV and a ClearBatch
// that deletes the batch's jobs in one statement of its own: the jobs,
// then the markers, each in its own transaction.
func (s *SQL) Batched() Contender {
	cfg := retention.Config{
		ClearBatch: func(ctx context.Context, ids []string) error { return s.deleteJobs(ctx, s.db, ids) },
		BatchSize:  s.batch, PageSize: s.batch, Concurrency: 1,
	}
	return s.retention(fmt.Sprintf("retention batched %d, page %d, concurrency 1 (ClearBatch)", s.batch, s.batch), s.kv, cfg)
}

// Atomic sweeps the backlog with one Pass over a sqlkv.AtomicKV: each
// batch's markers and jobs go in one transaction (KV.WithClear), which
// reads the batch's markers too, as the floor's does: with Concurrency 1
// the sweep clears in runs (AtomicKV.ClearRun) and scans none of them.
func (s *SQL) Atomic() Contender {
	name := fmt.Sprintf("retention batched+atomic %d, page %d, concurrency 1 (WithClear)", s.batch, s.batch)
	kv, err := s.kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error { return s.deleteJobs(ctx, tx, ids) })
	if err != nil {
		// Only a nil clear gets here: a programming error, which the
		// contender reports when run.
		return Contender{Name: name, Setup: func(context.Context, int) error { return err }}
	}
	return s.retention(name, kv, retention.Config{BatchSize: s.batch, PageSize: s.batch, Concurrency: 1})
}

// AtomicPages is Atomic with the AtomicKV's runs hidden from the sweep,
// which then reads each page with a Scan and hands its keys to
// ClearAndDelete: what Atomic was before AtomicKV.ClearRun, to measure
// what the runs buy.
func (s *SQL) AtomicPages() Contender {
	name := fmt.Sprintf("retention batched+atomic %d, page %d, concurrency 1 (WithClear, pages: no runs)", s.batch, s.batch)
	kv, err := s.kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error { return s.deleteJobs(ctx, tx, ids) })
	if err != nil {
		return Contender{Name: name, Setup: func(context.Context, int) error { return err }}
	}
	return s.retention(name, pagesOnly{kv}, retention.Config{BatchSize: s.batch, PageSize: s.batch, Concurrency: 1})
}

// pagesOnly is a ClearDeleter that hides whether it is a RunClearer.
type pagesOnly struct{ retention.ClearDeleter }

func (s *SQL) retention(name string, kv retention.KV, cfg retention.Config) Contender {
	return Contender{
		Name:  name,
		Setup: s.Setup,
		Clear: func(ctx context.Context) (int, error) {
			return sweep(ctx, s.Timing.kv(kv), cfg, s.Timing)
		},
		Check: s.Check,
	}
}

// ColumnDelete deletes the backlog by hand by the jobs' finish time, with
// no marker and no sweep: what a user would run from cron in place of a
// sweep. Each statement deletes the oldest size expired jobs by the index
// on (finished_at, id), in a transaction of its own, until one comes back
// short: on MySQL DELETE ... ORDER BY finished_at LIMIT size, elsewhere,
// which have no LIMIT on a DELETE, DELETE ... WHERE id IN (SELECT id ...
// ORDER BY finished_at LIMIT size).
func (s *SQL) ColumnDelete(size int) Contender {
	q := fmt.Sprintf(`DELETE FROM %s WHERE id IN (SELECT id FROM %s WHERE finished_at < %s ORDER BY finished_at LIMIT %d)`,
		s.jobs, s.jobs, s.phs(1, 1), size)
	if s.d == sqlkv.MySQL {
		q = fmt.Sprintf(`DELETE FROM %s WHERE finished_at < ? ORDER BY finished_at LIMIT %d`, s.jobs, size)
	}
	return Contender{
		Name:  fmt.Sprintf("by hand: DELETE by finished_at, %d per statement (no markers)", size),
		Setup: s.SetupRows,
		Clear: func(ctx context.Context) (int, error) {
			total := 0
			for {
				var cutoff any = time.Now().Add(-Retention).UnixMilli()
				if s.d == sqlkv.PostgreSQL {
					cutoff = time.Now().Add(-Retention)
				}
				res, err := s.db.ExecContext(ctx, q, cutoff)
				if err != nil {
					return total, err
				}
				n, err := res.RowsAffected()
				total += int(n)
				if err != nil || n < int64(size) {
					return total, err
				}
			}
		},
		Check: s.Check,
	}
}

// Table sweeps the jobs table itself with one Pass over a
// sqlkv.AtomicTableKV: the jobs are the markers, by finished_at, and each
// run of size (concurrency 1) deletes its rows by the index's range.
func (s *SQL) Table(size int) Contender {
	c := s.retention(fmt.Sprintf("retention table sweep of the jobs, runs of %d (AtomicTableKV)", size), s.table, runsOf(size))
	c.Setup = s.SetupRows
	return c
}

// TableRuns is the size of the runs of ColumnDelete and Table that the
// table sweep is held to: River's batch.
const TableRuns = RiverBatch

// Contenders returns the floor first (the baseline of the table), then
// the atomic and the batched sweep; then the batched DELETE by the
// finish time (ColumnDelete, the baseline of the table sweep) of
// TableRuns and of the batch size, and the table sweep with runs of
// either.
func (s *SQL) Contenders() []Contender {
	cs := []Contender{s.Floor(), s.Atomic(), s.Batched(), s.ColumnDelete(TableRuns), s.Table(TableRuns)}
	if s.batch != TableRuns {
		cs = append(cs, s.ColumnDelete(s.batch), s.Table(s.batch))
	}
	return cs
}

// SQLiteDSN is how the benchmark opens SQLite through modernc.org/sqlite,
// as the sqlkv documentation advises: a busy timeout, WAL, and BEGIN
// IMMEDIATE so that a transaction takes the write lock first. The
// synchronous setting is SQLite's default (FULL).
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate"
}
