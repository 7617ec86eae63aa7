package pgkv_test

import (
	"context"
	"errors"
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

func TestLockTimeoutOption(t *testing.T) {
	t.Parallel()
	// No server: WithClear does not talk to it, and pgxpool connects lazily.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	defer pool.Close()
	kv, err := pgkv.New(pool, "markers")
	require.NoError(t, err)
	clear := func(_ context.Context, b *pgx.Batch, ids []string) error { return nil }
	for _, tc := range []struct {
		name string
		opts []pgkv.AtomicOption
		ok   bool
	}{
		{"none", nil, true},
		{"zero", []pgkv.AtomicOption{pgkv.LockTimeout(0)}, true},
		{"sub-millisecond", []pgkv.AtomicOption{pgkv.LockTimeout(time.Microsecond)}, true},
		{"a day", []pgkv.AtomicOption{pgkv.LockTimeout(24 * time.Hour)}, true},
		{"negative", []pgkv.AtomicOption{pgkv.LockTimeout(-time.Millisecond)}, false},
		{"past PostgreSQL's limit", []pgkv.AtomicOption{pgkv.LockTimeout(30 * 24 * time.Hour)}, false},
		{"nil", []pgkv.AtomicOption{nil}, false},
	} {
		_, err := kv.WithClear(clear, tc.opts...)
		if tc.ok {
			assert.NoError(t, err, "WithClear(%s)", tc.name)
		} else {
			assert.Error(t, err, "WithClear(%s)", tc.name)
		}
	}
	// docs/clearing.md's example: retention.New accepts its Config.
	_, err = newLockAwareSweep(kv)
	assert.NoError(t, err, "newLockAwareSweep()")
}

// lockRow locks the job id's row (SELECT ... FOR UPDATE) in a transaction
// of its own connection, as the application would, and returns the
// function that ends it.
func lockRow(t testing.TB, pool *pgxpool.Pool, jobs, id string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var got string
	require.NoError(t, tx.QueryRow(ctx, "SELECT id FROM "+jobs+" WHERE id = $1 FOR UPDATE", id).Scan(&got))
	done := false
	release = func() {
		if !done {
			done = true
			require.NoError(t, tx.Rollback(ctx))
		}
	}
	t.Cleanup(release)
	return release
}

// TestAtomicLockTimeout: with LockTimeout, a batch that meets a row locked
// by the application fails within about the lock timeout (SQLSTATE 55P03)
// and changes nothing; the sweep bisects down to the locked id, clears the
// others in the same pass, and clears the locked one in a later pass once
// the lock is gone. Without it, the call waits for the lock until its
// context ends. The SET LOCAL does not outlive the call on its connection.
func TestAtomicLockTimeout(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()

	// One connection, so that a setting left behind would show on it.
	pcfg := pool.Config().Copy()
	pcfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	kv, err := pgkv.New(one, markers)
	require.NoError(t, err)
	clear := deleteJobs(jobs)
	const lockTimeout = 100 * time.Millisecond
	akv, err := kv.WithClear(clear, pgkv.LockTimeout(lockTimeout))
	require.NoError(t, err)
	waiting, err := kv.WithClear(clear)
	require.NoError(t, err)

	now := time.Now()
	ids := finishJobs(t, pool, kv, jobs, 200, now.Add(-2*time.Hour))
	release := lockRow(t, pool, jobs, ids[42])
	keys, err := kv.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 1000)
	require.NoError(t, err)
	require.Len(t, keys, 200)

	// One call over every id: it fails at the lock timeout, not at its
	// context's end.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	start := time.Now()
	err = akv.ClearAndDelete(cctx, ids, keys)
	took := time.Since(start)
	cancel()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "ClearAndDelete() = %v, want a PostgreSQL error", err)
	assert.Equal(t, "55P03", pgErr.Code, "ClearAndDelete() = %v, want lock_not_available", err)
	assert.GreaterOrEqual(t, took, lockTimeout)
	assert.Less(t, took, 2*time.Second, "the call failed at the lock timeout")
	assert.Equal(t, 200, count(t, pool, jobs), "the failed call changed nothing")
	assert.Equal(t, 200, count(t, pool, markers))
	var setting string
	require.NoError(t, one.QueryRow(ctx, "SHOW lock_timeout").Scan(&setting))
	assert.Equal(t, "0", setting, "SET LOCAL ended with the call")

	// Without the option the call waits for the lock until ctx ends.
	cctx, cancel = context.WithTimeout(ctx, 700*time.Millisecond)
	start = time.Now()
	err = waiting.ClearAndDelete(cctx, ids, keys)
	took = time.Since(start)
	cancel()
	require.Error(t, err)
	assert.GreaterOrEqual(t, took, 700*time.Millisecond, "without LockTimeout the call waited for its context")
	assert.Equal(t, 200, count(t, pool, jobs))

	clock := retention.NewManualClock(now)
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, BatchSize: 100,
		ClearTimeout: 30 * time.Second, Clock: clock})
	require.NoError(t, err)
	start = time.Now()
	st, err := s.Pass(ctx)
	took = time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, 199, st.Cleared, "Pass() = %+v: every id but the locked one is cleared in the first pass", st)
	assert.Equal(t, 1, st.Failed, "Pass() = %+v, want the locked id failed", st)
	assert.Positive(t, st.FailedCalls)
	assert.Zero(t, st.TimedOutCalls, "the calls failed at the lock timeout, not ClearTimeout")
	// The calls that held the locked id each waited the lock timeout:
	// about log2(100)+1 of them.
	assert.Less(t, took, time.Duration(st.FailedCalls)*lockTimeout+5*time.Second)
	left, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
	require.NoError(t, err)
	require.Len(t, left, 1, "the locked id's marker, moved to the retry range")
	assert.Equal(t, 1, count(t, pool, jobs))

	// The lock goes; once its retry delay has passed, the locked id is
	// cleared, alone.
	release()
	clock.Advance(time.Minute)
	st, err = s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass() = %+v after the lock went", st)
	assert.Zero(t, st.Failed)
	assert.Equal(t, 1, st.ClearCalls)
	assert.Zero(t, count(t, pool, jobs))
	assert.Zero(t, count(t, pool, markers))
}

// TestRunLockTimeout: with LockTimeout, a run that meets a row locked by
// another transaction, whether a job's (with the clear inline or after the
// run statement), a marker's or, under a lease, the lease row, fails
// within about the lock timeout (SQLSTATE 55P03) and changes nothing; the
// setting ends with the run.
func TestRunLockTimeout(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	leases := freshLeaseTable(t, pool)
	ctx := context.Background()

	// One connection, so that a setting left behind would show on it.
	pcfg := pool.Config().Copy()
	pcfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	kv, err := pgkv.New(one, markers)
	require.NoError(t, err)
	const lockTimeout = 100 * time.Millisecond
	akv, err := kv.WithClearSQL(deleteJobsSQL(jobs), pgkv.LockTimeout(lockTimeout))
	require.NoError(t, err)
	after, err := kv.WithClearSQL(runForms[1].stmt(jobs), pgkv.LockTimeout(lockTimeout))
	require.NoError(t, err)
	locker, err := pgkv.NewLocker(pool, "runs", &pgkv.LockerOptions{Table: leases})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, ok := lease.(retention.Fencer).Fence(akv)
	require.True(t, ok)

	now := time.Now()
	ids := finishJobs(t, pool, kv, jobs, 50, now.Add(-2*time.Hour))
	end := expiredEnd(now)
	for _, tc := range []struct {
		name string
		kv   retention.RunClearer
		lock string // a query that locks a row, with its argument
		arg  any
	}{
		{"a job's row", akv, "SELECT 1 FROM " + jobs + " WHERE id = $1 FOR UPDATE", ids[7]},
		{"a job's row, cleared after the run", after, "SELECT 1 FROM " + jobs + " WHERE id = $1 FOR UPDATE", ids[7]},
		{"a marker's row", akv, "SELECT 1 FROM " + markers + " WHERE key > $1 LIMIT 1 FOR UPDATE", []byte("jobs/done/0")},
		{"the lease row", view.(retention.RunClearer), "SELECT 1 FROM " + leases + " WHERE name = $1 FOR UPDATE", "runs"},
	} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, tc.lock, tc.arg)
		require.NoError(t, err, tc.name)

		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		keys, err := tc.kv.ClearRun(cctx, "jobs/done/", []byte("jobs/done/0"), end, 100)
		took := time.Since(start)
		cancel()
		require.NoError(t, tx.Rollback(ctx))
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: ClearRun() = %v, want a PostgreSQL error", tc.name, err)
		assert.Equal(t, "55P03", pgErr.Code, "%s: ClearRun() = %v, want lock_not_available", tc.name, err)
		assert.Nil(t, keys)
		assert.GreaterOrEqual(t, took, lockTimeout, tc.name)
		assert.Less(t, took, 2*time.Second, "%s: the run failed at the lock timeout", tc.name)
		assert.Equal(t, 50, count(t, pool, jobs), "%s: the failed run changed nothing", tc.name)
		assert.Equal(t, 50, count(t, pool, markers), tc.name)
		var setting string
		require.NoError(t, one.QueryRow(ctx, "SHOW lock_timeout").Scan(&setting))
		assert.Equal(t, "0", setting, "%s: the setting ended with the run", tc.name)
	}
	keys, err := view.(retention.RunClearer).ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), end, 100)
	require.NoError(t, err, "no lock left")
	assert.Len(t, keys, 50)
	assert.Zero(t, count(t, pool, jobs))
}
