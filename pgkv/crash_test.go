package pgkv_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// The atomic crash test kills a process that sweeps through an AtomicKV
// with SIGKILL, again and again, and checks the database after every kill.
// The child process is this test binary run again with crashEnvTables set.
const (
	crashEnvTables = "RETENTION_PGCRASH_TABLES" // markers,jobs,cleared
	crashEnvSeed   = "RETENTION_PGCRASH_SEED"   // the child's seed
	crashEnvHold   = "RETENTION_PGCRASH_HOLD"   // the holds' base, Unix milliseconds
	crashEnvRuns   = "RETENTION_PGCRASH_RUNS"   // the form of the clear of a child that clears in runs, or ""

	pgCrashPrefix    = "crash/"
	pgCrashExpired   = 20000
	pgCrashUnexpired = 2000
	pgCrashPoison    = 300 // expired ids whose delete fails half the time
	pgCrashKills     = 24
	pgCrashTimeout   = 20 * time.Millisecond // the child's ClearTimeout
	// A child that clears in runs: its ClearTimeout and batches. A run
	// that fails (a poisoned id, a held one) stops the runs until its ids
	// are cleared: small runs meet fewer of them. 50ms was too short under
	// the race detector on a loaded machine: no child cleared a run.
	pgCrashRunTimeout = 200 * time.Millisecond
	pgCrashRunBatch   = 20

	// Held jobs: one in pgCrashHeldEvery of the first pgCrashHeldAmong
	// expired ids (2% of the jobs, among the first ids, which are the
	// ones the children reach), each held until a moment of its own
	// between pgCrashHoldFrom and pgCrashHoldFrom+pgCrashHoldSpan after
	// the kills start: the children of about the first half of the kills
	// meet holds, those after them clear in runs, which no hold stops,
	// and every hold is over before the final sweep.
	pgCrashHeldEvery = 10
	pgCrashHeldAmong = 4000
	pgCrashHoldFrom  = 5 * time.Second
	pgCrashHoldSpan  = 10 * time.Second
)

// pgCrashHold returns the end of the hold on the job id, held from the
// moment base, and whether id is held at all.
func pgCrashHold(base time.Time, id string) (time.Time, bool) {
	i, err := strconv.Atoi(id[1:])
	if err != nil || id[0] != 'x' || i >= pgCrashHeldAmong || i%pgCrashHeldEvery != 7 {
		return time.Time{}, false
	}
	spread := time.Duration(i*7919%int(pgCrashHoldSpan/time.Millisecond)) * time.Millisecond
	return base.Add(pgCrashHoldFrom + spread), true
}

// pgCrashHolds returns the hold check of the crash test's clears: the ids
// of the call still held at now get retention.Hold with their hold's end.
// An AtomicKV's clear that holds refuses the whole call, changing nothing,
// so it names the held ids in a retention.BatchError (the sweep sends the
// others again), or returns one Hold for the whole call when every id of
// it is held until the same moment.
func pgCrashHolds(base time.Time, now func() time.Time) func(ids []string) error {
	return func(ids []string) error {
		t := now()
		perID := retention.BatchError{}
		var last time.Time
		same, n := true, 0
		for _, id := range ids {
			if until, ok := pgCrashHold(base, id); ok && t.Before(until) {
				n++
				perID[id] = retention.Hold(until)
				same = same && (last.IsZero() || until.Equal(last))
				last = until
			}
		}
		switch {
		case len(perID) == 0:
			return nil
		case n == len(ids) && same:
			return retention.Hold(last)
		}
		return perID
	}
}

// TestCrashAtomic: a child process sweeps 20,000 expired and 2,000
// unexpired jobs through an AtomicKV whose ClearFunc deletes the jobs and
// records every cleared id with its transaction id and the time in a
// cleared table, in the transaction that deletes their markers. A trigger
// fails the delete of poison jobs half the time, so batches fail, bisect
// and reschedule their markers; some batches sleep about as long as the
// ClearTimeout, so timeouts fire while the batch may still commit. Some
// jobs are held (pgCrashHold): until its hold ends the ClearFunc refuses a
// call that holds one, and the sweep moves their markers to held keys.
// The child is killed with SIGKILL at random moments, right after a
// reschedule, right after a timed-out batch, right after a refused call,
// pgCrashKills times. Every other child, and every child once the holds
// are over, clears in runs instead (AtomicKV.ClearRun, Concurrency 1)
// through an AtomicKV of WithClearSQL, whose statement fails, changing
// nothing, for a job held at the moment and sleeps in one call of eight;
// it reads pages and clears them by ClearAndDelete with that statement
// when a run fails. After every kill
// one REPEATABLE READ snapshot must
// show: every job present, held ones included, has exactly one marker and
// every marker a job, no id cleared by two committed transactions, no
// unexpired job touched, no held job cleared before its hold's end, and a
// held key only for a held job, at its hold's end (or just after the
// check, where the hold ended before the sweep moved the marker: it is
// then put off by the RetryDelay). A final clean sweep in runs,
// once every hold is over, must leave no expired job: every job, held ones
// included, is cleared exactly once; and some children must have cleared
// runs.
func TestCrashAtomic(t *testing.T) {
	if tables := os.Getenv(crashEnvTables); tables != "" {
		crashAtomicChild(t, tables)
		return
	}
	if testing.Short() {
		t.Skip("crash test: starts and kills dozens of processes")
	}
	admin := connect(t)
	ctx := context.Background()
	markers := freshTable(t, admin)
	jobs, cleared, held := markers+"_jobs", markers+"_cleared", markers+"_held"
	_, err := admin.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (id text PRIMARY KEY, expired bool NOT NULL, poison bool NOT NULL);
CREATE TABLE %[2]s (id text NOT NULL, txid bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE %[3]s (id text PRIMARY KEY, until_ms bigint NOT NULL);
CREATE FUNCTION %[1]s_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF OLD.poison AND random() < 0.5 THEN
		RAISE EXCEPTION 'job %% is poisoned', OLD.id;
	END IF;
	RETURN OLD;
END $$;
CREATE TRIGGER poison BEFORE DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_poison();
CREATE FUNCTION %[1]s_cleared(id text) RETURNS bool LANGUAGE sql AS $$
	INSERT INTO %[2]s (id, txid) VALUES (id, txid_current()) RETURNING true
$$`, jobs, cleared, held))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs+", "+cleared+", "+held+"; DROP FUNCTION IF EXISTS "+jobs+"_poison(), "+jobs+"_cleared(text)")
	})

	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	// The jobs, their markers, and the poison among the expired.
	now := time.Now()
	var ids []string
	var keys [][]byte
	var expired, poison []bool
	for i := range pgCrashExpired + pgCrashUnexpired {
		exp := i < pgCrashExpired
		id, at := fmt.Sprintf("x%05d", i), now.Add(-2*time.Hour+time.Duration(i)*time.Millisecond)
		if !exp {
			id, at = fmt.Sprintf("u%05d", i), now.Add(time.Duration(i)*time.Millisecond)
		}
		key, err := retention.MarkerKey(pgCrashPrefix, at, id)
		require.NoError(t, err)
		ids, keys, expired = append(ids, id), append(keys, key), append(expired, exp)
		poison = append(poison, false)
	}
	for _, i := range rng.Perm(pgCrashExpired)[:pgCrashPoison] {
		poison[i] = true
	}
	_, err = admin.Exec(ctx, "INSERT INTO "+jobs+" SELECT * FROM unnest($1::text[], $2::bool[], $3::bool[])", ids, expired, poison)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "INSERT INTO "+markers+" SELECT unnest($1::bytea[])", keys)
	require.NoError(t, err)

	// The holds, timed from the start of the kills.
	holdBase := time.UnixMilli(time.Now().UnixMilli())
	lastHold := holdBase.Add(pgCrashHoldFrom + pgCrashHoldSpan)
	var heldIDs []string
	var untils []int64
	for _, id := range ids {
		if until, ok := pgCrashHold(holdBase, id); ok {
			heldIDs, untils = append(heldIDs, id), append(untils, until.UnixMilli())
		}
	}
	_, err = admin.Exec(ctx, "INSERT INTO "+held+" SELECT * FROM unnest($1::text[], $2::bigint[])", heldIDs, untils)
	require.NoError(t, err)
	tb := pgCrashTables{markers: markers, jobs: jobs, cleared: cleared, held: held}

	tables := strings.Join([]string{markers, jobs, cleared}, ",")
	start := time.Now()
	modes := map[string]int{}
	holds := pgCrashHoldCount{ids: map[string]bool{}}
	var worst pgCrashState
	runs := 0 // the runs children cleared
	for kill := 1; kill <= pgCrashKills; kill++ {
		// A child that meets a hold clears no run while it lasts (an id
		// that waits stops the runs): once the holds are over, every
		// child clears in runs.
		inRuns := kill%2 == 0 || time.Now().After(lastHold)
		runForm := ""
		if inRuns {
			runForm = []string{"inline", "after"}[kill/2%2]
		}
		// Where to kill: at a random moment, after the k-th batch cleared,
		// right after the k-th reschedule, right after the k-th batch
		// whose timeout fired, right after the k-th call refused for a
		// hold (while holds last), or right after the k-th run (in runs).
		mode := []string{"time", "cleared", "resched", "timeout", "hold", "run"}[rng.IntN(6)]
		if mode == "hold" && time.Until(lastHold) < 5*time.Second {
			mode = "time"
		}
		if mode == "run" && !inRuns {
			mode = "cleared"
		}
		k := 1 + rng.IntN(5)
		delay := time.Duration(rng.Int64N(int64(400 * time.Millisecond)))
		modes[mode]++

		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashAtomic$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnvTables+"="+tables, crashEnvSeed+"="+strconv.FormatUint(rng.Uint64(), 10),
			crashEnvHold+"="+strconv.FormatInt(holdBase.UnixMilli(), 10), crashEnvRuns+"="+runForm)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		lines := make(chan string, 1024)
		childHolds := pgCrashHoldCount{ids: map[string]bool{}} // the reader's until lines closes
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				childHolds.add(sc.Text())
				lines <- sc.Text()
			}
			close(lines)
		}()
		seen := map[string]int{}
		timer := time.NewTimer(delay)
		if mode != "time" {
			timer.Reset(3 * time.Second) // nothing of the kind: kill anyway
		}
	wait:
		for {
			select {
			case <-timer.C:
				break wait
			case line, ok := <-lines:
				if !ok {
					require.Failf(t, "child exited by itself", "kill %d:\n%s", kill, stderr.String())
				}
				word, _, _ := strings.Cut(line, " ")
				seen[word]++
				if word == mode && seen[word] >= k {
					break wait
				}
			}
		}
		timer.Stop()
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
		for range lines {
		}
		err = cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "kill %d:\n%s", kill, stderr.String())
		holds.merge(childHolds)

		st := pgCrashCheck(t, admin, tb, time.Now())
		t.Logf("kill %2d (runs %q, %s %d; child saw %v; %s): %s", kill, runForm, mode, k, seen, childHolds, st)
		worst = worst.max(st)
		runs += seen["run"]
	}
	t.Logf("%d kills in %v (%v); children's holds: %s", pgCrashKills, time.Since(start).Round(time.Millisecond), modes, holds)

	// A clean sweep, once every hold is over: no poison, no sleep, every
	// retry due. Its clear still refuses a job held at the moment, so
	// that one cleared too early would show.
	if d := time.Until(lastHold); d > 0 {
		t.Logf("waiting %v for the last hold to end", d.Round(time.Millisecond))
		time.Sleep(d)
	}
	_, err = admin.Exec(ctx, "DROP TRIGGER poison ON "+jobs)
	require.NoError(t, err)
	s := pgCrashSweep(t, admin, markers, jobs, cleared, retention.NewManualClock(now.Add(10*time.Minute)), "inline", nil, nil, pgCrashHolds(holdBase, time.Now))
	for range 10 {
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		if st.Cleared == 0 && st.Failed == 0 && st.Held == 0 {
			break
		}
	}
	final := pgCrashCheck(t, admin, tb, time.Now())
	t.Logf("after the final sweep: %s", final)
	worst = worst.max(final)
	assert.Zero(t, final.expiredLeft, "expired jobs left after the final sweep")
	assert.Equal(t, pgCrashExpired, final.clearedIDs, "every expired id was cleared")
	assert.Equal(t, len(heldIDs), final.heldCleared, "every held id was cleared")
	assert.NotEmpty(t, holds.ids, "no child refused a call for a hold: the test did not exercise holds")
	assert.Positive(t, runs, "no child cleared a run: the test did not exercise runs")
	assert.Zero(t, worst.lost, "a job without a marker: it is never cleared")
	assert.Zero(t, worst.orphans, "a marker without its job: cleared again")
	assert.Zero(t, worst.dupMarkers, "an id with two markers")
	assert.Zero(t, worst.doubleCleared, "an id cleared by two committed transactions")
	assert.Zero(t, worst.unexpiredTouched, "an unexpired job touched")
	assert.Zero(t, worst.heldEarly, "a held job cleared before its hold's end")
	assert.Zero(t, worst.badHeldKeys, "a held key of a job not held, or not at its hold's end")
}

// pgCrashTables are the crash test's tables: the markers, the jobs, the
// ids cleared, and the held ids with their holds' ends.
type pgCrashTables struct{ markers, jobs, cleared, held string }

// pgCrashHoldCount counts the holds children returned, from the lines
// their clears print.
type pgCrashHoldCount struct {
	calls, whole, n int // refused calls, those refused with one Hold, ids held
	ids             map[string]bool
}

// add counts line when it tells of a hold: "hold batch|whole <id>...".
func (c *pgCrashHoldCount) add(line string) {
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "hold" {
		return
	}
	c.calls++
	if f[1] == "whole" {
		c.whole++
	}
	for _, id := range f[2:] {
		c.n++
		c.ids[id] = true
	}
}

func (c *pgCrashHoldCount) merge(o pgCrashHoldCount) {
	c.calls, c.whole, c.n = c.calls+o.calls, c.whole+o.whole, c.n+o.n
	for id := range o.ids {
		c.ids[id] = true
	}
}

func (c pgCrashHoldCount) String() string {
	return fmt.Sprintf("%d holds of %d ids in %d refused calls (%d by one Hold)", c.n, len(c.ids), c.calls, c.whole)
}

// pgCrashState is what one snapshot shows.
type pgCrashState struct {
	expiredLeft, clearedIDs                  int
	heldKeys, heldCleared                    int
	lost, orphans, dupMarkers, doubleCleared int
	unexpiredTouched, heldEarly, badHeldKeys int
}

func (s pgCrashState) String() string {
	return fmt.Sprintf("%d expired left, %d ids cleared, %d held keys, %d held ids cleared; violations: %d jobs without marker, %d markers without job, %d ids with several markers, %d ids cleared twice, %d unexpired touched, %d held cleared early, %d bad held keys",
		s.expiredLeft, s.clearedIDs, s.heldKeys, s.heldCleared, s.lost, s.orphans, s.dupMarkers, s.doubleCleared, s.unexpiredTouched, s.heldEarly, s.badHeldKeys)
}

func (s pgCrashState) max(o pgCrashState) pgCrashState {
	return pgCrashState{
		expiredLeft: o.expiredLeft, clearedIDs: o.clearedIDs, heldKeys: o.heldKeys, heldCleared: o.heldCleared,
		lost: max(s.lost, o.lost), orphans: max(s.orphans, o.orphans), dupMarkers: max(s.dupMarkers, o.dupMarkers),
		doubleCleared: max(s.doubleCleared, o.doubleCleared), unexpiredTouched: max(s.unexpiredTouched, o.unexpiredTouched),
		heldEarly: max(s.heldEarly, o.heldEarly), badHeldKeys: max(s.badHeldKeys, o.badHeldKeys),
	}
}

// pgCrashCheck reads one REPEATABLE READ snapshot of the tables, taken
// after now. A held job is cleared early when the cleared table has it
// before its hold's end, or when it is gone though its hold ends after
// now. A held key must be a held job's, at its hold's end, or up to a
// second later (a hold that ended as the sweep moved the marker is put
// off by the RetryDelay).
func pgCrashCheck(t testing.TB, admin *pgxpool.Pool, tb pgCrashTables, now time.Time) pgCrashState {
	t.Helper()
	var s pgCrashState
	ctx := context.Background()
	err := pgx.BeginTxFunc(ctx, admin, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `WITH m AS (SELECT regexp_replace(convert_from(key, 'UTF8'), '^.*/', '') AS id FROM `+tb.markers+`), -- the id, after the last '/' of a marker or a retry key
mc AS (SELECT id, count(*) AS n FROM m GROUP BY id),
hk AS (SELECT r[1]::bigint AS until_ms, r[2] AS id FROM (
	SELECT regexp_match(convert_from(key, 'UTF8'), '^`+pgCrashPrefix+`r([0-9]{20})/[0-9]{20}/h[0-9]+/(.+)$') AS r FROM `+tb.markers+`
	WHERE key >= '`+pgCrashPrefix+`r' AND key < '`+pgCrashPrefix+`s') k -- the retry range
	WHERE r IS NOT NULL)
SELECT
	(SELECT count(*) FROM `+tb.jobs+` WHERE expired),
	(SELECT count(DISTINCT id) FROM `+tb.cleared+`),
	(SELECT count(*) FROM hk),
	(SELECT count(DISTINCT id) FROM `+tb.cleared+` c WHERE EXISTS (SELECT 1 FROM `+tb.held+` h WHERE h.id = c.id)),
	(SELECT count(*) FROM `+tb.jobs+` j WHERE NOT EXISTS (SELECT 1 FROM mc WHERE mc.id = j.id)),
	(SELECT count(*) FROM mc WHERE NOT EXISTS (SELECT 1 FROM `+tb.jobs+` j WHERE j.id = mc.id)),
	(SELECT count(*) FROM mc WHERE n > 1),
	(SELECT count(*) FROM (SELECT id FROM `+tb.cleared+` GROUP BY id HAVING count(DISTINCT txid) > 1) d),
	`+strconv.Itoa(pgCrashUnexpired)+` - (SELECT count(*) FROM `+tb.jobs+` j JOIN mc ON mc.id = j.id AND mc.n = 1 WHERE NOT j.expired)
		+ (SELECT count(*) FROM `+tb.cleared+` WHERE id LIKE 'u%'),
	(SELECT count(*) FROM `+tb.held+` h WHERE
		EXISTS (SELECT 1 FROM `+tb.cleared+` c WHERE c.id = h.id AND c.at < timestamptz 'epoch' + h.until_ms * interval '1 millisecond')
		OR (h.until_ms > $1::bigint AND NOT EXISTS (SELECT 1 FROM `+tb.jobs+` j WHERE j.id = h.id))),
	(SELECT count(*) FROM hk LEFT JOIN `+tb.held+` h ON h.id = hk.id
		WHERE h.id IS NULL OR hk.until_ms NOT BETWEEN h.until_ms AND greatest(h.until_ms, $1::bigint) + 1000)`, now.UnixMilli()).Scan(
			&s.expiredLeft, &s.clearedIDs, &s.heldKeys, &s.heldCleared, &s.lost, &s.orphans, &s.dupMarkers, &s.doubleCleared,
			&s.unexpiredTouched, &s.heldEarly, &s.badHeldKeys)
	})
	require.NoError(t, err)
	return s
}

// pgCrashSweep makes the sweep of the crash test over a wrapper of its
// AtomicKV. sleep, when not nil, gives how long a batch sleeps before it
// commits, as a fraction of the ClearTimeout (0: not at all); say, when not nil, is told of each reschedule, cleared
// batch or run, timed-out batch or run and call refused for a hold; hold,
// when not nil, runs last in each call of the ClearFunc, which returns its
// error. With runs ("inline" or "after", the form of its statement; see
// pgCrashClearSQL), the AtomicKV is one of WithClearSQL, whose statement
// fails for a job held at the moment (the held table says until when), and
// the sweep clears in runs (Concurrency 1); a call sleeps when sleep says
// so, for one of three spans around the ClearTimeout.
func pgCrashSweep(t testing.TB, pool *pgxpool.Pool, markers, jobs, cleared string, clock retention.Clock, runs string, sleep func() float64, say func(string), hold func([]string) error) *retention.Sweep {
	t.Helper()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	if say == nil {
		say = func(string) {}
	}
	cfg := retention.Config{
		Prefix: pgCrashPrefix, Retention: time.Hour, Clock: clock,
		PageSize: 1000, BatchSize: 100, Concurrency: 2,
		Logger: slog.New(slog.DiscardHandler),
	}
	timeout := pgCrashTimeout
	if runs != "" {
		cfg.BatchSize, cfg.Concurrency, timeout = pgCrashRunBatch, 1, pgCrashRunTimeout
	}
	if sleep != nil {
		cfg.ClearTimeout, cfg.RetryDelay, cfg.MaxRetryDelay, cfg.Interval = timeout, 5*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
		// Pages a child settles several of before its kill: the markers
		// of failed and held ids move when their page is settled, and the
		// kills are to land after those moves too.
		cfg.PageSize = 200
		if runs != "" {
			// After a run failed, the sweep reads a page itself before it
			// tries a run again: a short one.
			cfg.PageSize = 3 * pgCrashRunBatch
		}
	}
	c := &crashKV{say: say}
	if runs != "" {
		// One AtomicKV per span of sleep: its statement is fixed.
		sleeps := []float64{0, 0.6 * timeout.Seconds(), timeout.Seconds(), 1.4 * timeout.Seconds()}
		akvs := make([]*pgkv.AtomicKV, len(sleeps))
		for i, s := range sleeps {
			akvs[i], err = kv.WithClearSQL(pgCrashClearSQL(runs, markers, jobs, cleared, s))
			require.NoError(t, err)
		}
		c.akv, c.pick = akvs[0], func() *pgkv.AtomicKV {
			if sleep == nil {
				return akvs[0]
			}
			f := sleep() // 0, or in [0.5, 1.5)
			if f == 0 {
				return akvs[0]
			}
			return akvs[1+min(int((f-0.5)*3), 2)]
		}
	} else {
		c.akv, err = kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
			b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[])", ids)
			b.Queue("INSERT INTO "+cleared+" (id, txid) SELECT unnest($1::text[]), txid_current()", ids)
			if sleep != nil {
				if f := sleep(); f > 0 {
					b.Queue("SELECT pg_sleep($1::float8)", f*timeout.Seconds())
				}
			}
			// Refused after the statements are queued: a ClearFunc's error
			// sends nothing of what it queued, and a held job deleted early
			// would show it did.
			if hold != nil {
				return hold(ids)
			}
			return nil
		})
		require.NoError(t, err)
	}
	s, err := retention.New(c, cfg)
	require.NoError(t, err)
	return s
}

// pgCrashClearSQL is the statement of WithClearSQL of a child that clears
// in runs: it fails for a job held at the moment, deletes the jobs of $1,
// records each with its transaction, and sleeps for the seconds sleep
// first, when not 0. Of the form "inline" it is a DELETE, which a run
// makes a CTE of its statement (recording each job through a function of
// its WHERE); of the form "after", a chain of CTEs, which a run sends
// after its statement.
func pgCrashClearSQL(form, markers, jobs, cleared string, sleep float64) string {
	nap := ""
	if sleep > 0 {
		nap = " AND EXISTS (SELECT 1 FROM pg_sleep(" + strconv.FormatFloat(sleep, 'f', 3, 64) + "))"
	}
	// A count, not EXISTS, whose select list PostgreSQL never computes: a
	// statement that deleted no job would still commit the deletion of
	// their markers. The clock is taken in whole milliseconds rounded
	// down, as pgCrashCheck reads a hold: a cast to bigint rounds to the
	// nearest, and let a run clear a job up to half a millisecond before
	// its hold's end (seen in 1 of 30 runs of the test under load).
	notHeld := `(SELECT CASE WHEN count(*) = 0 THEN true ELSE ('pgkv crash test: ' || count(*) || ' jobs held')::int > 0 END
	FROM ` + markers + `_held WHERE id = ANY($1) AND until_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)`
	if form == "inline" {
		return `DELETE FROM ` + jobs + ` WHERE id = ANY($1) AND ` + notHeld + nap + ` AND ` + jobs + `_cleared(id)`
	}
	return `WITH d AS (DELETE FROM ` + jobs + ` WHERE id = ANY($1) AND ` + notHeld + nap + ` RETURNING id)
INSERT INTO ` + cleared + ` (id, txid) SELECT id, txid_current() FROM d`
}

// crashKV forwards to an AtomicKV and tells of what it did. Its clears
// go to the AtomicKV pick returns, or akv.
type crashKV struct {
	akv  *pgkv.AtomicKV
	pick func() *pgkv.AtomicKV
	say  func(string)
}

// clearer is the AtomicKV of a clear.
func (c *crashKV) clearer() *pgkv.AtomicKV {
	if c.pick == nil {
		return c.akv
	}
	return c.pick()
}

func (c *crashKV) Unwrap() retention.KV { return c.akv }

func (c *crashKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return c.akv.Scan(ctx, start, end, limit)
}

func (c *crashKV) Delete(ctx context.Context, keys ...[]byte) error {
	return c.akv.Delete(ctx, keys...)
}

func (c *crashKV) Put(ctx context.Context, key, value []byte) error {
	err := c.akv.Put(ctx, key, value)
	if err == nil {
		c.say("resched put")
	}
	return err
}

func (c *crashKV) Move(ctx context.Context, from, to [][]byte) error {
	err := c.akv.Move(ctx, from, to)
	if err == nil {
		c.say(fmt.Sprintf("resched move %d", len(from)))
	}
	return err
}

func (c *crashKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	err := c.clearer().ClearAndDelete(ctx, ids, keys)
	var perID retention.BatchError
	switch {
	case errors.As(err, &perID):
		var heldIDs []string
		for id, e := range perID {
			if errors.Is(e, retention.ErrHeld) {
				heldIDs = append(heldIDs, id)
			}
		}
		c.say("hold batch " + strings.Join(heldIDs, " "))
	case errors.Is(err, retention.ErrHeld):
		c.say("hold whole " + strings.Join(ids, " "))
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.say(fmt.Sprintf("timeout %d err=%v", len(ids), err != nil))
	case err == nil:
		c.say(fmt.Sprintf("cleared %d", len(ids)))
	}
	return err
}

func (c *crashKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	keys, err := c.clearer().ClearRun(ctx, prefix, from, end, limit)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.say(fmt.Sprintf("timeout run err=%v", err != nil))
	case err == nil && len(keys) > 0:
		c.say(fmt.Sprintf("run %d", len(keys)))
		c.say(fmt.Sprintf("cleared %d", len(keys)))
	}
	return keys, err
}

// RunStore implements retention.RunClearer.
func (c *crashKV) RunStore() retention.RunClearer { return c }

// crashAtomicChild sweeps until it is killed.
func crashAtomicChild(t *testing.T, tables string) {
	parts := strings.Split(tables, ",")
	seed, err := strconv.ParseUint(os.Getenv(crashEnvSeed), 10, 64)
	require.NoError(t, err)
	holdMs, err := strconv.ParseInt(os.Getenv(crashEnvHold), 10, 64)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, seed))
	var mu sync.Mutex
	sleep := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(8) != 0 {
			return 0
		}
		// About the ClearTimeout: some commit before it fires, some
		// after, some are cancelled.
		return 0.5 + rng.Float64()
	}
	var out sync.Mutex
	say := func(line string) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintln(os.Stdout, line)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("RETENTION_POSTGRES_DSN"))
	require.NoError(t, err)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	s := pgCrashSweep(t, pool, parts[0], parts[1], parts[2], nil, os.Getenv(crashEnvRuns), sleep, say, pgCrashHolds(time.UnixMilli(holdMs), time.Now))
	err = s.Run(context.Background())
	t.Fatalf("Run returned: %v", err)
}
