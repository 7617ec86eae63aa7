package pgkv_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// heldJobsTable creates, beside the marker table, a jobs table whose rows
// carry their hold (hold_until) and a table of further holds (job_holds,
// a foreign key to the job that goes with it).
func heldJobsTable(t testing.TB, pool *pgxpool.Pool, markers string) (jobs, holds string) {
	t.Helper()
	jobs, holds = markers+"_jobs", markers+"_holds"
	_, err := pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s (id text PRIMARY KEY, hold_until timestamptz);
CREATE TABLE %s (job_id text NOT NULL REFERENCES %s (id) ON DELETE CASCADE, until timestamptz)`, jobs, holds, jobs))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+holds+", "+jobs) })
	return jobs, holds
}

// holdJustBefore is a DB over a pool that commits hold, on a connection of
// its own, just before it sends the first clear that checks holds: after
// everything the ClearFunc did in Go, before the clear's transaction.
type holdJustBefore struct {
	*pgxpool.Pool
	once sync.Once
	hold func()
}

func (h *holdJustBefore) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.Contains(sql, "pgkv: held:") {
		h.once.Do(h.hold)
	}
	return h.Pool.Exec(ctx, sql, args...)
}

// TestAHoldCommittedJustBeforeTheClearIsHonoured: the hold is decided in
// the clear's transaction, so a hold committed after the ClearFunc ran (a
// read of the holds there saw none) and before the transaction started
// keeps the job and its marker, which waits, held, for the hold's end; the
// other jobs of the batch are cleared in the same pass, and the held one
// once the hold is lifted.
func TestAHoldCommittedJustBeforeTheClearIsHonoured(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	markers := freshTable(t, pool)
	jobs, _ := heldJobsTable(t, pool, markers)
	until := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	db := &holdJustBefore{Pool: pool, hold: func() {
		_, err := pool.Exec(ctx, "UPDATE "+jobs+" SET hold_until = $1 WHERE id = 'j00002'", until)
		assert.NoError(t, err)
	}}
	kv, err := pgkv.New(db, markers)
	require.NoError(t, err)
	var seenInGo []*time.Time
	akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
		var h *time.Time
		if err := pool.QueryRow(ctx, "SELECT hold_until FROM "+jobs+" WHERE id = 'j00002'").Scan(&h); err == nil {
			seenInGo = append(seenInGo, h)
		}
		b.Queue("SELECT FROM "+jobs+" WHERE id = ANY($1) FOR UPDATE", ids)
		pgkv.QueueHolds(b, "SELECT id, hold_until FROM "+jobs+" WHERE id = ANY($1) AND hold_until > now()", ids)
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		return nil
	})
	require.NoError(t, err)
	now := time.Now()
	clock := retention.NewManualClock(now)
	finishJobs(t, pool, kv, jobs, 5, now.Add(-2*time.Hour))
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, Clock: clock})
	require.NoError(t, err)

	st, err := s.Pass(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, seenInGo)
	assert.Nil(t, seenInGo[0], "the ClearFunc's own read of the hold, before the transaction")
	assert.Equal(t, 4, st.Cleared, "Pass().Cleared = %d, want 4", st.Cleared)
	assert.Equal(t, 1, st.Held, "Pass().Held = %d, want 1", st.Held)
	assert.Zero(t, st.Failed, "a hold is no failure")
	var left []string
	rows, err := pool.Query(ctx, "SELECT id FROM "+jobs)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"j00002"}, left, "the jobs left")
	due, err := s.Pending(ctx, 10)
	require.NoError(t, err)
	require.Len(t, due, 1, "the markers left")
	assert.Equal(t, "j00002", due[0].ID)
	assert.Equal(t, retention.StateHeld, due[0].State)
	assert.WithinDuration(t, until, due[0].Next, time.Millisecond, "held until the hold's end, read in the transaction")

	// Lifted: cleared once its marker falls due again.
	_, err = pool.Exec(ctx, "UPDATE "+jobs+" SET hold_until = NULL")
	require.NoError(t, err)
	clock.Set(until.Add(time.Millisecond))
	st, err = s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d after the hold's end, want 1", st.Cleared)
	assert.Zero(t, count(t, pool, jobs), "jobs left")
	assert.Zero(t, count(t, pool, markers), "markers left")
}

// TestAHoldPlacedWhileTheClearRunsIsHonoured: a hold inserted (a foreign
// key to the job, which locks its row) by a transaction that commits while
// the clear's transaction runs is honoured when the clear locks the rows
// before it looks for holds, as QueueHolds says; without that lock the
// look comes first, finds nothing, and the DELETE, having waited for the
// hold's transaction, takes the job and its hold.
func TestAHoldPlacedWhileTheClearRunsIsHonoured(t *testing.T) {
	for _, lock := range []bool{true, false} {
		t.Run(fmt.Sprintf("lock=%v", lock), func(t *testing.T) {
			pool := connect(t)
			ctx := context.Background()
			markers := freshTable(t, pool)
			jobs, holds := heldJobsTable(t, pool, markers)
			kv, err := pgkv.New(pool, markers)
			require.NoError(t, err)
			akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
				if lock {
					b.Queue("SELECT FROM "+jobs+" WHERE id = ANY($1) FOR UPDATE", ids)
				}
				pgkv.QueueHolds(b, "SELECT job_id, until FROM "+holds+" WHERE job_id = ANY($1) AND until > now()", ids)
				b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
				return nil
			})
			require.NoError(t, err)
			now := time.Now()
			finishJobs(t, pool, kv, jobs, 3, now.Add(-2*time.Hour))
			s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour,
				Clock: retention.NewManualClock(now)})
			require.NoError(t, err)

			hold, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = hold.Rollback(ctx) }()
			_, err = hold.Exec(ctx, "INSERT INTO "+holds+" VALUES ('j00001', now() + interval '1 hour')")
			require.NoError(t, err)
			type result struct {
				st  retention.Stats
				err error
			}
			done := make(chan result, 1)
			go func() {
				st, err := s.Pass(ctx)
				done <- result{st, err}
			}()
			require.Eventually(t, func() bool {
				var waiting int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, jobs).Scan(&waiting)
				return err == nil && waiting > 0
			}, 30*time.Second, 5*time.Millisecond, "the clear never waited for the hold's transaction")
			require.NoError(t, hold.Commit(ctx))
			r := <-done
			require.NoError(t, r.err)

			if lock {
				assert.Equal(t, 2, r.st.Cleared, "Pass().Cleared = %d, want 2", r.st.Cleared)
				assert.Equal(t, 1, r.st.Held, "Pass().Held = %d, want 1", r.st.Held)
				assert.Equal(t, 1, count(t, pool, jobs), "the held job stays")
				assert.Equal(t, 1, count(t, pool, holds), "and its hold")
				assert.Equal(t, 1, count(t, pool, markers), "and its marker")
				return
			}
			assert.Equal(t, 3, r.st.Cleared, "Pass().Cleared = %d without the lock, want 3: the hold was missed", r.st.Cleared)
			assert.Zero(t, count(t, pool, holds), "the hold went with its job")
		})
	}
}

// TestQueueHoldsRefusesTheCallWithItsHolds: a ClearAndDelete that meets
// held ids changes nothing and returns a BatchError holding a Hold for
// each, of the latest end returned for it, NULL and -infinity being past
// and infinity the last time a marker holds; a sweep clears the others.
func TestQueueHoldsRefusesTheCallWithItsHolds(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	markers := freshTable(t, pool)
	jobs, holds := heldJobsTable(t, pool, markers)
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		pgkv.QueueHolds(b, "SELECT job_id, until FROM "+holds+" WHERE job_id = ANY($1);\n", ids)
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		return nil
	})
	require.NoError(t, err)
	now := time.Now()
	ids := finishJobs(t, pool, kv, jobs, 5, now.Add(-2*time.Hour))
	later := now.Add(2 * time.Hour).Truncate(time.Microsecond)
	_, err = pool.Exec(ctx, "INSERT INTO "+holds+" VALUES ('j00001', $1), ('j00001', $2), ('j00002', NULL), ('j00003', 'infinity'), ('j00004', '-infinity')",
		now.Add(time.Hour), later)
	require.NoError(t, err)
	keys, err := kv.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 10)
	require.NoError(t, err)

	err = akv.ClearAndDelete(ctx, ids, keys)
	var be retention.BatchError
	require.ErrorAs(t, err, &be)
	assert.True(t, strings.HasPrefix(err.Error(), "pgkv: clear and delete from "), "ClearAndDelete() = %v", err)
	want := map[string]time.Time{
		"j00001": later,
		"j00002": time.Unix(0, 0),
		"j00003": retention.MaxMarkerTime,
		"j00004": time.Unix(0, 0),
	}
	require.Len(t, be, len(want), "ClearAndDelete() = %v", err)
	for id, until := range want {
		require.Contains(t, be, id)
		assert.ErrorIs(t, be[id], retention.ErrHeld)
		assert.Equal(t, retention.Hold(until).Error(), be[id].Error(), "the hold of %s", id)
	}
	assert.Equal(t, 5, count(t, pool, jobs), "jobs after a refused call")
	assert.Equal(t, 5, count(t, pool, markers), "markers after a refused call")

	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, Clock: retention.NewManualClock(now)})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
	assert.Equal(t, 4, st.Held, "Pass().Held = %d, want 4", st.Held)
	assert.Equal(t, 4, count(t, pool, jobs), "the held jobs")
}

// TestClearFuncGetsTheCallsContext: a ClearFunc's work outside its
// statements is bounded by ClearTimeout and ends when the pass is
// cancelled; either way nothing is sent, and the job and its marker stay.
func TestClearFuncGetsTheCallsContext(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	markers := freshTable(t, pool)
	jobs, _ := heldJobsTable(t, pool, markers)
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	entered := make(chan struct{}, 10)
	ended := make(chan error, 10)
	akv, err := kv.WithClear(func(ctx context.Context, b *pgx.Batch, ids []string) error {
		entered <- struct{}{}
		<-ctx.Done() // a file delete that hangs
		ended <- ctx.Err()
		return ctx.Err()
	})
	require.NoError(t, err)
	now := time.Now()
	finishJobs(t, pool, kv, jobs, 1, now.Add(-2*time.Hour))

	t.Run("ClearTimeout", func(t *testing.T) {
		s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour,
			Clock: retention.NewManualClock(now), ClearTimeout: 100 * time.Millisecond})
		require.NoError(t, err)
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Zero(t, st.Cleared, "Pass().Cleared")
		assert.Equal(t, 1, st.Failed, "Pass().Failed = %d, want 1", st.Failed)
		<-entered
		assert.ErrorIs(t, <-ended, context.DeadlineExceeded)
	})
	t.Run("cancelled", func(t *testing.T) {
		s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour,
			Clock: retention.NewManualClock(now.Add(time.Hour))}) // past the retry of the first subtest
		require.NoError(t, err)
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			<-entered
			cancel()
		}()
		_, err = s.Pass(pctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, <-ended, context.Canceled)
	})
	assert.Equal(t, 1, count(t, pool, jobs), "the job")
	assert.Equal(t, 1, count(t, pool, markers), "its marker")
}
