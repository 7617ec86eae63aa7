// River: sweep River's own river_job table by finalized_at, in place of
// River's JobCleaner, with a retention per kind, the jobs' artifacts in a
// second table cleared in the same transaction, two replicas under one
// lease, and the console mounted.
//
//	RETENTION_POSTGRES_DSN=postgres://user@127.0.0.1:5432/db go run ./examples/river
//
// The finished jobs are the markers: a sqlkv.TableKV, made over the pgx
// pool by pgkv.Tables, reads the rows of river_job that pass a filter, oldest finalized_at first, through an
// index on (finalized_at, id); no marker row is written, and River's
// JobCleaner keeps everything (its retention periods are -1). Three sweeps
// share the table, each with a filter and a prefix of its own:
//
//	river/email/      kind 'email',  completed or cancelled   kept 1s
//	river/report/     kind 'report', completed or cancelled   kept 3s
//	river/discarded/  any kind, discarded (failed for good)   kept a week
//
// Replica a sweeps while b waits for the lease; a shuts down halfway and b
// takes over. At the end the example checks its own outcome and exits 1 if
// it is wrong: every email and report job cleared exactly once and not
// before its retention, with its artifacts; every discarded job and its
// artifacts kept; nothing else deleted. It creates the schema
// retention_river_example (River's tables, the artifacts, the side and
// lease tables) and drops it when it is done.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
	"github.com/marksweep/retention/retentionui"
	"github.com/marksweep/retention/sqlkv"
)

const (
	schema    = "retention_river_example"
	riverJob  = schema + ".river_job"
	artifacts = schema + ".artifacts"
	// cleared is the example's ledger of clears, written by the ClearFunc
	// in the clear's transaction: it holds a row per commit, so it counts
	// exactly how many times each job was cleared.
	cleared = schema + ".cleared"
	side    = schema + ".retention_markers"
	leases  = schema + ".retention_leases"
)

// policy is the retention of one class of River's jobs: a sweep over the
// rows of river_job that pass filter, under a prefix of its own.
type policy struct {
	prefix string
	filter string
	keep   time.Duration
}

// The discarded jobs (failed for good) have a sweep of their own kept a
// week, rather than a filter of the other two that leaves them out: so they
// remain markers the library knows, counted by Backlog, shown by the
// console (a look-up of one says when it falls due), and cleared with their
// artifacts by the same transaction a week on. Left out, nothing would ever
// delete them, now that River's JobCleaner is off.
var policies = []policy{
	{prefix: "river/email/", filter: "kind = 'email' AND state IN ('completed', 'cancelled')", keep: time.Second},
	{prefix: "river/report/", filter: "kind = 'report' AND state IN ('completed', 'cancelled')", keep: 3 * time.Second},
	{prefix: "river/discarded/", filter: "state = 'discarded'", keep: 7 * 24 * time.Hour},
}

var begin = time.Now()

func say(format string, args ...any) {
	fmt.Printf("%4.1fs  %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	dsn := os.Getenv("RETENTION_POSTGRES_DSN")
	if dsn == "" {
		fmt.Fprintln(os.Stderr, "set RETENTION_POSTGRES_DSN to a PostgreSQL connection string, e.g.\n"+
			"  RETENTION_POSTGRES_DSN=postgres://user@127.0.0.1:5432/db go run ./examples/river\n"+
			"or run it with servers started for you: ./scripts/test --exec go run ./examples/river")
		os.Exit(2)
	}
	if err := run(context.Background(), dsn); err != nil {
		fmt.Fprintln(os.Stderr, "river example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn string) error {
	admin, err := newPool(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := setUp(ctx, admin); err != nil {
		return err
	}
	defer func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			fmt.Fprintln(os.Stderr, "river example: drop schema:", err)
		}
	}()
	say("River's tables migrated into schema %s; River's JobCleaner keeps every job (retention periods -1)", schema)

	rs := &results{finalized: map[int64]time.Time{}}
	a, err := newReplica(ctx, "a", dsn, rs)
	if err != nil {
		return err
	}
	defer a.close()
	b, err := newReplica(ctx, "b", dsn, rs)
	if err != nil {
		return err
	}
	defer b.close()

	// Replica a starts first, so that it is the one that sweeps until it
	// shuts down.
	if err := a.start(ctx); err != nil {
		return err
	}
	select {
	case <-a.leases.acquired:
	case <-time.After(10 * time.Second):
		return errors.New("replica a did not acquire the lease within 10s")
	}
	if err := b.start(ctx); err != nil {
		return err
	}

	console := httptest.NewServer(a.consoleMux())
	defer console.Close()

	wave1, err := insertJobs(ctx, a.river, 1, 30, 15)
	if err != nil {
		return err
	}
	rs.add(wave1)
	say("wave 1: %d jobs inserted through replica a's River client", len(wave1))
	if err := waitFor(ctx, admin, "wave 1 finalized and its email jobs cleared", 20*time.Second,
		"SELECT count(*) FROM "+riverJob+" WHERE id = ANY($1) AND (finalized_at IS NULL OR kind = 'email' AND state IN ('completed', 'cancelled'))",
		ids(wave1)); err != nil {
		return err
	}
	if err := printOverview(ctx, console.URL+"/admin/retention/", "river/email/"); err != nil {
		return err
	}

	say("replica a shuts down")
	a.stop()
	wave2, err := insertJobs(ctx, b.river, 2, 15, 10)
	if err != nil {
		return err
	}
	rs.add(wave2)
	say("wave 2: %d jobs inserted through replica b's River client", len(wave2))
	if err := waitFor(ctx, admin, "every email and report job cleared", 20*time.Second,
		"SELECT count(*) FROM "+riverJob+" WHERE finalized_at IS NULL OR state IN ('completed', 'cancelled')"); err != nil {
		return err
	}
	b.stop()
	return check(ctx, admin, rs)
}

func newPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	// River's listener, its producer and completer, ten workers writing
	// artifacts, the sweep and the lease's renewals share a replica's pool:
	// the default of four connections on a two-core machine makes them queue.
	cfg.MaxConns = 16
	return pgxpool.NewWithConfig(ctx, cfg)
}

// setUp creates the schema with River's tables, the artifacts and the
// ledger, an index per sweep, and the side and lease tables.
func setUp(ctx context.Context, admin *pgxpool.Pool) error {
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(admin), &rivermigrate.Config{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	stmts := []string{
		"CREATE TABLE " + artifacts + " (job_id bigint NOT NULL, name text NOT NULL, body text NOT NULL, PRIMARY KEY (job_id, name))",
		"CREATE TABLE " + cleared + " (job_id bigint NOT NULL, replica text NOT NULL, cleared_at timestamptz NOT NULL)",
	}
	// An index per sweep whose WHERE is its filter, as the TableKV reads
	// them: each holds only that sweep's finished jobs, so a pass that
	// stops at the first unexpired one reads a few entries of its own
	// index, whatever the other kinds and the running jobs are doing.
	for i, p := range policies {
		stmts = append(stmts, fmt.Sprintf("CREATE INDEX river_job_retention_%d ON %s (finalized_at, id) WHERE %s", i, riverJob, p.filter))
	}
	for _, s := range stmts {
		if _, err := admin.Exec(ctx, s); err != nil {
			return err
		}
	}
	tables, err := pgkv.NewTables(admin, side, nil)
	if err != nil {
		return err
	}
	defer tables.Close()
	if err := tables.Migrate(ctx); err != nil {
		return err
	}
	return pgkv.MigrateLeases(ctx, admin, leases)
}

// A job's args say how it ends, so that the example knows what to expect.
const (
	complete = "complete"
	cancel   = "cancel" // River cancels it: finalized, state cancelled
	fail     = "fail"   // an error with MaxAttempts 1: finalized, state discarded
)

// EmailArgs are the args of an email job.
type EmailArgs struct {
	To      string `json:"to"`
	Outcome string `json:"outcome"`
}

// Kind implements river.JobArgs.
func (EmailArgs) Kind() string { return "email" }

func (a EmailArgs) outcome() string { return a.Outcome }

// artifacts are the rows the job leaves behind, by name.
func (a EmailArgs) artifacts() map[string]string {
	return map[string]string{"receipt": "sent to " + a.To}
}

// ReportArgs are the args of a report job.
type ReportArgs struct {
	Customer int    `json:"customer"`
	Outcome  string `json:"outcome"`
}

// Kind implements river.JobArgs.
func (ReportArgs) Kind() string { return "report" }

func (a ReportArgs) outcome() string { return a.Outcome }

func (a ReportArgs) artifacts() map[string]string {
	return map[string]string{
		"report.csv": fmt.Sprintf("customer %d, 12 rows", a.Customer),
		"chart.png":  fmt.Sprintf("chart of customer %d", a.Customer),
	}
}

type jobArgs interface {
	river.JobArgs
	outcome() string
	artifacts() map[string]string
}

// worker writes a job's artifacts, then ends it as its args say.
type worker[T jobArgs] struct {
	river.WorkerDefaults[T]
	pool *pgxpool.Pool
}

func (w *worker[T]) Work(ctx context.Context, job *river.Job[T]) error {
	for name, body := range job.Args.artifacts() {
		if _, err := w.pool.Exec(ctx, "INSERT INTO "+artifacts+" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", job.ID, name, body); err != nil {
			return err
		}
	}
	switch job.Args.outcome() {
	case cancel:
		return river.JobCancel(errors.New("the customer withdrew the request"))
	case fail:
		return errors.New("the mail server refused the message")
	}
	return nil
}

// replica is one process of the service: a River client working jobs and
// a retention.Group sweeping them, on a pool of its own.
type replica struct {
	name   string
	pool   *pgxpool.Pool
	tables *pgkv.Tables
	river  *river.Client[pgx.Tx]
	sweeps []*retention.Sweep
	kvs    []*sqlkv.AtomicTableKV
	group  *retention.Group
	rec    *retentionui.Recorder
	leases *leaseLog

	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

func newReplica(ctx context.Context, name, dsn string, rs *results) (*replica, error) {
	pool, err := newPool(ctx, dsn)
	if err != nil {
		return nil, err
	}
	r := &replica{name: name, pool: pool}
	workers := river.NewWorkers()
	river.AddWorker(workers, &worker[EmailArgs]{pool: pool})
	river.AddWorker(workers, &worker[ReportArgs]{pool: pool})
	r.river, err = river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:  schema,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: workers,
		// River's JobCleaner keeps every finalized job: the sweeps decide.
		CompletedJobRetentionPeriod: -1,
		CancelledJobRetentionPeriod: -1,
		DiscardedJobRetentionPeriod: -1,
		Logger:                      slog.New(slog.DiscardHandler), // the failing jobs would log their errors
	})
	if err != nil {
		r.close()
		return nil, err
	}
	// The finalized_at of each job, as River reports it, to check that no
	// job was cleared before its retention.
	events, _ := r.river.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled, river.EventKindJobFailed)
	go func() {
		for ev := range events {
			if ev.Job.FinalizedAt != nil {
				rs.finalize(ev.Job.ID, *ev.Job.FinalizedAt)
			}
		}
	}()

	// The side table holds the few keys a row cannot: retry, held and
	// parked markers. The lease is made by the same Tables as the
	// TableKVs, so that its leases fence their clears.
	if r.tables, err = pgkv.NewTables(pool, side, nil); err != nil {
		r.close()
		return nil, err
	}
	locker, err := r.tables.NewLocker("river-retention", &pgkv.LockerOptions{Table: leases})
	if err != nil {
		r.close()
		return nil, err
	}
	r.leases = &leaseLog{replica: name, prefix: policies[0].prefix, acquired: make(chan struct{})}
	r.rec = &retentionui.Recorder{Next: r.leases}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for _, p := range policies {
		t, err := r.tables.Table(ctx, sqlkv.Table{Name: riverJob, ID: "id", Time: "finalized_at", Filter: p.filter, Prefix: p.prefix})
		if err != nil {
			r.close()
			return nil, err
		}
		kv := t.WithClear(pgkv.TableClear(clearArtifacts(name)))
		s, err := retention.New(kv, retention.Config{Prefix: p.prefix, Retention: p.keep, Observer: r.rec, Logger: logger})
		if err != nil {
			r.close()
			return nil, err
		}
		r.kvs = append(r.kvs, kv)
		r.sweeps = append(r.sweeps, s)
	}
	r.group, err = retention.NewGroup(retention.GroupConfig{Lease: locker, Logger: logger}, r.sweeps...)
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// clearArtifacts is the sweeps' ClearFunc: it runs in the transaction
// that deleted the jobs' rows, so a job and its artifacts go together or
// not at all.
func clearArtifacts(replica string) pgkv.ClearFunc {
	return func(_ context.Context, b *pgx.Batch, ids []string) error {
		jobIDs := make([]int64, len(ids))
		for i, id := range ids {
			n, err := strconv.ParseInt(id, 10, 64) // ids are zero-padded to 20 digits
			if err != nil {
				return err
			}
			jobIDs[i] = n
		}
		b.Queue("DELETE FROM "+artifacts+" WHERE job_id = ANY($1)", jobIDs)
		b.Queue("INSERT INTO "+cleared+" SELECT unnest($1::bigint[]), $2::text, $3::timestamptz", jobIDs, replica, time.Now())
		return nil
	}
}

func (r *replica) start(ctx context.Context) error {
	if err := r.river.Start(ctx); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.group.Run(runCtx) }()
	return nil
}

// stop shuts the replica down: its group releases the lease, and its River
// client finishes the jobs it works.
func (r *replica) stop() {
	r.stopOnce.Do(func() {
		if r.cancel == nil {
			return
		}
		r.cancel()
		if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
			say("replica %s: the group's Run: %v", r.name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.river.Stop(ctx); err != nil {
			say("replica %s: River's Stop: %v", r.name, err)
		}
	})
}

func (r *replica) close() {
	r.stop()
	if r.tables != nil {
		_ = r.tables.Close()
	}
	r.pool.Close()
}

// consoleMux mounts the replica's console. A service mounts it behind its
// own authentication; here it listens on 127.0.0.1 only, read-only.
func (r *replica) consoleMux() *http.ServeMux {
	details := map[string]retentionui.Detail{}
	for i, p := range policies {
		details[p.prefix] = retentionui.Detail{Retention: p.keep, KV: r.kvs[i]}
	}
	console, err := retentionui.New(retentionui.Options{Sweeps: r.sweeps, Details: details, Recorder: r.rec, ReadOnly: true})
	if err != nil {
		panic(err) // the options above are valid
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/retention/", http.StripPrefix("/admin/retention", console))
	return mux
}

// leaseLog says when a replica's lease changes hands: a Group reports each
// event once per sweep, and it reports them for the first prefix only.
type leaseLog struct {
	replica, prefix string
	acquired        chan struct{}

	mu   sync.Mutex
	last retention.LeaseEvent
}

func (l *leaseLog) ObservePass(string, retention.Stats, error) {}
func (l *leaseLog) ObserveLags(string, []time.Duration)        {}
func (l *leaseLog) ObservePage(string, retention.Stats)        {}
func (l *leaseLog) ObserveLease(prefix string, e retention.LeaseEvent) {
	if prefix != l.prefix {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e == l.last {
		return // a waiting replica finds the lease held at every try
	}
	if e == retention.LeaseAcquired && l.last == 0 {
		close(l.acquired)
	}
	l.last = e
	say("replica %s: lease %s", l.replica, e)
}

// job is what the example knows of a job it inserted.
type job struct {
	id      int64
	wave    int
	kind    string
	outcome string
}

// insertJobs inserts emails email jobs and reports report jobs, every
// tenth cancelled and every tenth from the fifth failing.
func insertJobs(ctx context.Context, c *river.Client[pgx.Tx], wave, emails, reports int) ([]job, error) {
	outcome := func(i int) string {
		switch i % 10 {
		case 4:
			return fail
		case 7:
			return cancel
		}
		return complete
	}
	var params []river.InsertManyParams
	for i := range emails {
		params = append(params, river.InsertManyParams{Args: EmailArgs{To: fmt.Sprintf("user%d@example.com", i), Outcome: outcome(i)}})
	}
	for i := range reports {
		params = append(params, river.InsertManyParams{Args: ReportArgs{Customer: i, Outcome: outcome(i)}})
	}
	for i := range params {
		// A failure discards the job at once, rather than after River's
		// retries with backoff.
		params[i].InsertOpts = &river.InsertOpts{MaxAttempts: 1}
	}
	res, err := c.InsertMany(ctx, params)
	if err != nil {
		return nil, err
	}
	jobs := make([]job, len(res))
	for i, r := range res {
		args := params[i].Args.(jobArgs)
		jobs[i] = job{id: r.Job.ID, wave: wave, kind: args.Kind(), outcome: args.outcome()}
	}
	return jobs, nil
}

func ids(jobs []job) []int64 {
	out := make([]int64, len(jobs))
	for i, j := range jobs {
		out[i] = j.id
	}
	return out
}

// waitFor polls until query counts zero rows, for at most limit.
func waitFor(ctx context.Context, admin *pgxpool.Pool, what string, limit time.Duration, query string, args ...any) error {
	deadline := time.Now().Add(limit)
	for {
		var n int
		if err := admin.QueryRow(ctx, query, args...).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			say("%s", what)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %v: %s (%d rows left)", limit, what, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// printOverview fetches the console's overview, as JSON, and prints the
// line of one sweep.
func printOverview(ctx context.Context, url, prefix string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("console: GET %s: %s", url, resp.Status)
	}
	var o retentionui.Overview
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	for _, s := range o.Sweeps {
		if s.Prefix != prefix {
			continue
		}
		last := "no pass yet"
		if s.LastPass != nil {
			last = fmt.Sprintf("%d passes, the last cleared %d", s.LastPass.Passes, s.LastPass.Cleared)
		}
		say("console of replica a, GET /: %s %s, lease %s, %s: %q", s.Prefix, s.State, s.Lease, last, s.Summary)
		return nil
	}
	return fmt.Errorf("console: the overview has no sweep %q", prefix)
}

// results is what the example saw happen: the jobs it inserted and when
// River finalized each.
type results struct {
	mu        sync.Mutex
	jobs      []job
	finalized map[int64]time.Time
}

func (rs *results) add(jobs []job) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.jobs = append(rs.jobs, jobs...)
}

func (rs *results) finalize(id int64, at time.Time) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.finalized[id] = at
}

// clearing is a row of the ledger.
type clearing struct {
	replica string
	at      time.Time
}

// check reads what the database holds after both replicas stopped and
// compares it with what each job should have come to.
func check(ctx context.Context, admin *pgxpool.Pool, rs *results) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rows := map[int64]string{} // river_job: id -> state
	if err := scan(ctx, admin, "SELECT id, state FROM "+riverJob, func(r pgx.Rows) error {
		var id int64
		var state string
		err := r.Scan(&id, &state)
		rows[id] = state
		return err
	}); err != nil {
		return err
	}
	clears := map[int64][]clearing{}
	if err := scan(ctx, admin, "SELECT job_id, replica, cleared_at FROM "+cleared, func(r pgx.Rows) error {
		var id int64
		var c clearing
		err := r.Scan(&id, &c.replica, &c.at)
		clears[id] = append(clears[id], c)
		return err
	}); err != nil {
		return err
	}
	arts := map[int64]int{}
	if err := scan(ctx, admin, "SELECT job_id FROM "+artifacts, func(r pgx.Rows) error {
		var id int64
		err := r.Scan(&id)
		arts[id]++
		return err
	}); err != nil {
		return err
	}

	keep := map[string]time.Duration{"email": policies[0].keep, "report": policies[1].keep}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var kept, once int
	byReplica := map[string]int{}
	margin := time.Duration(1<<63 - 1)
	for _, j := range rs.jobs {
		state, inTable := rows[j.id]
		cs := clears[j.id]
		switch {
		case !inTable && len(cs) == 0:
			bad("job %d (%s) was deleted, not by a sweep: River's JobCleaner?", j.id, j.kind)
		case j.outcome == fail:
			if !inTable || state != "discarded" || len(cs) > 0 {
				bad("discarded job %d: in river_job %v, state %q, cleared %d times; want kept, discarded", j.id, inTable, state, len(cs))
			}
			if arts[j.id] == 0 {
				bad("discarded job %d lost its artifacts", j.id)
			}
			kept++
		case inTable:
			bad("%s job %d (%s) is still in river_job, state %q", j.kind, j.id, j.outcome, state)
		case len(cs) != 1:
			bad("%s job %d was cleared %d times", j.kind, j.id, len(cs))
		default:
			once++
			byReplica[cs[0].replica]++
			if arts[j.id] > 0 {
				bad("%s job %d was cleared but %d artifacts remain", j.kind, j.id, arts[j.id])
			}
			fin, ok := rs.finalized[j.id]
			if !ok {
				bad("River reported no finalization of job %d", j.id)
				continue
			}
			// The sweep compares its clock with finalized_at, as this does.
			if past := cs[0].at.Sub(fin) - keep[j.kind]; past <= 0 {
				bad("%s job %d was cleared %v after it finished, before its retention of %v", j.kind, j.id, cs[0].at.Sub(fin), keep[j.kind])
			} else {
				margin = min(margin, past)
			}
			if j.wave == 2 && cs[0].replica != "b" {
				bad("job %d of wave 2 was cleared by replica %s, after it had shut down", j.id, cs[0].replica)
			}
		}
	}
	known := map[int64]bool{}
	for _, j := range rs.jobs {
		known[j.id] = true
	}
	for id := range clears {
		if !known[id] {
			bad("the ledger holds a clear of job %d, which the example never inserted", id)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	say("checked %d jobs: %d email and report jobs cleared once each (replica a %d, replica b %d), "+
		"the earliest %v after its retention; %d discarded jobs kept with their artifacts; "+
		"no artifact of a cleared job left; nothing else deleted (River's JobCleaner is off)",
		len(rs.jobs), once, byReplica["a"], byReplica["b"], margin.Round(time.Millisecond), kept)
	return nil
}

func scan(ctx context.Context, admin *pgxpool.Pool, q string, row func(pgx.Rows) error) error {
	rows, err := admin.Query(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
