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

	pgCrashPrefix    = "crash/"
	pgCrashExpired   = 20000
	pgCrashUnexpired = 2000
	pgCrashPoison    = 300 // expired ids whose delete fails half the time
	pgCrashKills     = 24
	pgCrashTimeout   = 20 * time.Millisecond // the child's ClearTimeout
)

// TestCrashAtomic: a child process sweeps 20,000 expired and 2,000
// unexpired jobs through an AtomicKV whose ClearFunc deletes the jobs and
// records every cleared id with its transaction id in a cleared table, in
// the transaction that deletes their markers. A trigger fails the delete of
// poison jobs half the time, so batches fail, bisect and reschedule their
// markers; some batches sleep about as long as the ClearTimeout, so
// timeouts fire while the batch may still commit. The child is killed with
// SIGKILL at random moments, right after a reschedule, right after a
// timed-out batch, pgCrashKills times. After every kill one REPEATABLE
// READ snapshot must show: every job present has exactly one marker and
// every marker a job, no id cleared by two committed transactions, and no
// unexpired job touched. A final clean sweep must leave no expired job.
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
	jobs, cleared := markers+"_jobs", markers+"_cleared"
	_, err := admin.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (id text PRIMARY KEY, expired bool NOT NULL, poison bool NOT NULL);
CREATE TABLE %[2]s (id text NOT NULL, txid bigint NOT NULL);
CREATE FUNCTION %[1]s_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF OLD.poison AND random() < 0.5 THEN
		RAISE EXCEPTION 'job %% is poisoned', OLD.id;
	END IF;
	RETURN OLD;
END $$;
CREATE TRIGGER poison BEFORE DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_poison()`, jobs, cleared))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs+", "+cleared+"; DROP FUNCTION IF EXISTS "+jobs+"_poison()")
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

	tables := strings.Join([]string{markers, jobs, cleared}, ",")
	start := time.Now()
	modes := map[string]int{}
	var worst pgCrashState
	for kill := 1; kill <= pgCrashKills; kill++ {
		// Where to kill: at a random moment, after the k-th batch cleared,
		// right after the k-th reschedule, or right after the k-th batch
		// whose timeout fired.
		mode := []string{"time", "cleared", "resched", "timeout"}[rng.IntN(4)]
		k := 1 + rng.IntN(5)
		delay := time.Duration(rng.Int64N(int64(400 * time.Millisecond)))
		modes[mode]++

		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashAtomic$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnvTables+"="+tables, crashEnvSeed+"="+strconv.FormatUint(rng.Uint64(), 10))
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
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

		st := pgCrashCheck(t, admin, markers, jobs, cleared)
		t.Logf("kill %2d (%s %d; child saw %v): %s", kill, mode, k, seen, st)
		worst = worst.max(st)
	}
	t.Logf("%d kills in %v (%v)", pgCrashKills, time.Since(start).Round(time.Millisecond), modes)

	// A clean sweep: no poison, no sleep, every retry due.
	_, err = admin.Exec(ctx, "DROP TRIGGER poison ON "+jobs)
	require.NoError(t, err)
	s := pgCrashSweep(t, admin, markers, jobs, cleared, retention.NewManualClock(now.Add(10*time.Minute)), nil, nil)
	for range 10 {
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		if st.Cleared == 0 && st.Failed == 0 {
			break
		}
	}
	final := pgCrashCheck(t, admin, markers, jobs, cleared)
	t.Logf("after the final sweep: %s", final)
	worst = worst.max(final)
	assert.Zero(t, final.expiredLeft, "expired jobs left after the final sweep")
	assert.Equal(t, pgCrashExpired, final.clearedIDs, "every expired id was cleared")
	assert.Zero(t, worst.lost, "a job without a marker: it is never cleared")
	assert.Zero(t, worst.orphans, "a marker without its job: cleared again")
	assert.Zero(t, worst.dupMarkers, "an id with two markers")
	assert.Zero(t, worst.doubleCleared, "an id cleared by two committed transactions")
	assert.Zero(t, worst.unexpiredTouched, "an unexpired job touched")
}

// pgCrashState is what one snapshot shows.
type pgCrashState struct {
	expiredLeft, clearedIDs                  int
	lost, orphans, dupMarkers, doubleCleared int
	unexpiredTouched                         int
}

func (s pgCrashState) String() string {
	return fmt.Sprintf("%d expired left, %d ids cleared; violations: %d jobs without marker, %d markers without job, %d ids with several markers, %d ids cleared twice, %d unexpired touched",
		s.expiredLeft, s.clearedIDs, s.lost, s.orphans, s.dupMarkers, s.doubleCleared, s.unexpiredTouched)
}

func (s pgCrashState) max(o pgCrashState) pgCrashState {
	return pgCrashState{
		expiredLeft: o.expiredLeft, clearedIDs: o.clearedIDs,
		lost: max(s.lost, o.lost), orphans: max(s.orphans, o.orphans), dupMarkers: max(s.dupMarkers, o.dupMarkers),
		doubleCleared: max(s.doubleCleared, o.doubleCleared), unexpiredTouched: max(s.unexpiredTouched, o.unexpiredTouched),
	}
}

// pgCrashCheck reads one REPEATABLE READ snapshot of the three tables.
func pgCrashCheck(t testing.TB, admin *pgxpool.Pool, markers, jobs, cleared string) pgCrashState {
	t.Helper()
	var s pgCrashState
	ctx := context.Background()
	err := pgx.BeginTxFunc(ctx, admin, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `WITH m AS (SELECT regexp_replace(convert_from(key, 'UTF8'), '^.*/', '') AS id FROM `+markers+`), -- the id, after the last '/' of a marker or a retry key
mc AS (SELECT id, count(*) AS n FROM m GROUP BY id)
SELECT
	(SELECT count(*) FROM `+jobs+` WHERE expired),
	(SELECT count(DISTINCT id) FROM `+cleared+`),
	(SELECT count(*) FROM `+jobs+` j WHERE NOT EXISTS (SELECT 1 FROM mc WHERE mc.id = j.id)),
	(SELECT count(*) FROM mc WHERE NOT EXISTS (SELECT 1 FROM `+jobs+` j WHERE j.id = mc.id)),
	(SELECT count(*) FROM mc WHERE n > 1),
	(SELECT count(*) FROM (SELECT id FROM `+cleared+` GROUP BY id HAVING count(DISTINCT txid) > 1) d),
	`+strconv.Itoa(pgCrashUnexpired)+` - (SELECT count(*) FROM `+jobs+` j JOIN mc ON mc.id = j.id AND mc.n = 1 WHERE NOT j.expired)
		+ (SELECT count(*) FROM `+cleared+` WHERE id LIKE 'u%')`).Scan(
			&s.expiredLeft, &s.clearedIDs, &s.lost, &s.orphans, &s.dupMarkers, &s.doubleCleared, &s.unexpiredTouched)
	})
	require.NoError(t, err)
	return s
}

// pgCrashSweep makes the sweep of the crash test over a wrapper of its
// AtomicKV. sleep, when not nil, gives the seconds a batch sleeps before it
// commits (0: none); say, when not nil, is told of each reschedule, cleared
// batch and timed-out batch.
func pgCrashSweep(t testing.TB, pool *pgxpool.Pool, markers, jobs, cleared string, clock retention.Clock, sleep func() float64, say func(string)) *retention.Sweep {
	t.Helper()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[])", ids)
		b.Queue("INSERT INTO "+cleared+" (id, txid) SELECT unnest($1::text[]), txid_current()", ids)
		if sleep != nil {
			if s := sleep(); s > 0 {
				b.Queue("SELECT pg_sleep($1::float8)", s)
			}
		}
		return nil
	})
	require.NoError(t, err)
	if say == nil {
		say = func(string) {}
	}
	cfg := retention.Config{
		Prefix: pgCrashPrefix, Retention: time.Hour, Clock: clock,
		PageSize: 1000, BatchSize: 100, Concurrency: 2,
		Logger: slog.New(slog.DiscardHandler),
	}
	if sleep != nil {
		cfg.ClearTimeout, cfg.RetryDelay, cfg.MaxRetryDelay, cfg.Interval = pgCrashTimeout, 5*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	}
	s, err := retention.New(&crashKV{akv: akv, say: say}, cfg)
	require.NoError(t, err)
	return s
}

// crashKV forwards to an AtomicKV and tells of what it did.
type crashKV struct {
	akv *pgkv.AtomicKV
	say func(string)
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
	err := c.akv.ClearAndDelete(ctx, ids, keys)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.say(fmt.Sprintf("timeout %d err=%v", len(ids), err != nil))
	case err == nil:
		c.say(fmt.Sprintf("cleared %d", len(ids)))
	}
	return err
}

// crashAtomicChild sweeps until it is killed.
func crashAtomicChild(t *testing.T, tables string) {
	parts := strings.Split(tables, ",")
	seed, err := strconv.ParseUint(os.Getenv(crashEnvSeed), 10, 64)
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
		return (0.5 + rng.Float64()) * pgCrashTimeout.Seconds()
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
	s := pgCrashSweep(t, pool, parts[0], parts[1], parts[2], nil, sleep, say)
	err = s.Run(context.Background())
	t.Fatalf("Run returned: %v", err)
}
