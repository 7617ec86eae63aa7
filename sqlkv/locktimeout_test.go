package sqlkv_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

func TestNewWithOptions(t *testing.T) {
	db := openSQLite(t, "")
	tests := []struct {
		name    string
		opts    *sqlkv.Options
		wantErr string
	}{
		{"nil", nil, ""},
		{"zero", &sqlkv.Options{}, ""},
		{"a millisecond", &sqlkv.Options{LockTimeout: time.Millisecond}, ""},
		{"a day", &sqlkv.Options{LockTimeout: 24 * time.Hour}, ""},
		{"negative", &sqlkv.Options{LockTimeout: -time.Second}, "sqlkv: Options.LockTimeout must be between 0 and 24h0m0s, got -1s"},
		{"past a day", &sqlkv.Options{LockTimeout: 25 * time.Hour}, "sqlkv: Options.LockTimeout must be between 0 and 24h0m0s, got 25h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := sqlkv.NewWithOptions(db, sqlkv.SQLite, "markers", tt.opts)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, kv)
				return
			}
			require.NoError(t, err)
		})
	}
}

// frozenIDs is how many expired jobs the frozen-writer test sweeps, and
// frozenLocked the one whose row the frozen writer locks.
const (
	frozenIDs    = 12
	frozenLocked = "j05"
)

// TestFrozenWriterDoesNotHoldTheSweep: an application transaction locks
// one row and freezes (it never commits while the pass runs), as a
// process stopped with SIGSTOP mid-transaction does. With
// Options.LockTimeout, a pass of an AtomicKV sweep over 12 expired jobs
// returns while the writer is still frozen, though Config.ClearTimeout is
// 10 minutes: on MySQL and PostgreSQL with every job but the locked one
// cleared, its marker put off for a retry; on SQLite, where the writer
// holds the database's one write lock, with nothing cleared. Once the
// writer rolls back, the next pass due clears the rest. Every job is
// cleared exactly once, and every marker goes with its job. The row the
// writer locks is the locked job's own, or its marker.
func TestFrozenWriterDoesNotHoldTheSweep(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		kinds := []struct {
			name string
			lock func(tx *sql.Tx, f *frozenFixture) error
		}{
			{"job row", func(tx *sql.Tx, f *frozenFixture) error {
				if dl.d == sqlkv.SQLite {
					// SQLite has no row locks: any write takes the
					// database's write lock until the transaction ends.
					_, err := tx.Exec("UPDATE "+f.jobs+" SET id = id WHERE id = ?", frozenLocked)
					return err
				}
				_, err := tx.Exec(q(dl.d, "SELECT id FROM "+f.jobs+" WHERE id = ? FOR UPDATE"), frozenLocked)
				return err
			}},
			{"marker row", func(tx *sql.Tx, f *frozenFixture) error {
				if dl.d == sqlkv.SQLite {
					_, err := tx.Exec("UPDATE "+f.markers+" SET marker = marker WHERE marker = ?", f.keys[frozenLocked])
					return err
				}
				_, err := tx.Exec(q(dl.d, "SELECT marker FROM "+f.markers+" WHERE marker = ? FOR UPDATE"), f.keys[frozenLocked])
				return err
			}},
		}
		for _, kind := range kinds {
			t.Run(kind.name, func(t *testing.T) {
				f := newFrozenFixture(t, dl)
				ctx := context.Background()

				// The frozen writer: its own connection pool, like another
				// process, with a transaction left open.
				writer := dl.open(t, f.path)
				tx, err := writer.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback() }()
				require.NoError(t, kind.lock(tx, f))

				f.clock.Advance(time.Hour)
				passCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				start := time.Now()
				st, err := f.sweep.Pass(passCtx)
				took := time.Since(start)
				require.NoError(t, passCtx.Err(), "the pass waited for the frozen writer")
				cancel()
				t.Logf("pass with the writer frozen: %v, %+v, err %v", took.Round(time.Millisecond), st, err)

				cleared := f.cleared(t)
				if dl.d == sqlkv.SQLite {
					assert.Empty(t, cleared, "a pass cleared a job while another connection held SQLite's write lock")
				} else {
					require.NoError(t, err, "Pass with one row locked")
					assert.Equal(t, frozenIDs-1, st.Cleared, "Pass() cleared %d, want every job but the locked one", st.Cleared)
					assert.Len(t, cleared, frozenIDs-1)
					assert.NotContains(t, cleared, frozenLocked)
					assert.Equal(t, 1, st.Retried, "Pass() retried %d, want the locked job's marker", st.Retried)
				}
				f.checkEachJobWithItsMarker(t)

				require.NoError(t, tx.Rollback()) // the writer thaws, or its session ends
				f.clock.Advance(time.Minute)      // past the retry delay
				st, err = f.sweep.Pass(ctx)
				require.NoError(t, err, "Pass after the writer went")
				t.Logf("pass after: %+v", st)
				cleared = f.cleared(t)
				assert.Len(t, cleared, frozenIDs, "jobs cleared once the writer went")
				for id, n := range cleared {
					assert.Equal(t, 1, n, "job %s cleared %d times", id, n)
				}
				f.checkEachJobWithItsMarker(t)
			})
		}
	})
}

// frozenFixture is a sweep over an AtomicKV with a lock timeout, its jobs
// and the record of their clears.
type frozenFixture struct {
	db                  *sql.DB
	d                   sqlkv.Dialect
	path                string // SQLite's file
	markers, jobs, clrd string
	keys                map[string][]byte
	clock               *retention.ManualClock
	sweep               *retention.Sweep
}

func newFrozenFixture(t *testing.T, dl dialect) *frozenFixture {
	t.Helper()
	ctx := context.Background()
	f := &frozenFixture{d: dl.d, keys: map[string][]byte{}}
	if dl.d == sqlkv.SQLite {
		f.path = t.TempDir() + "/frozen.db"
	}
	f.db = dl.open(t, f.path)
	f.markers = freshTable(t, f.db, dl.d)
	f.jobs, f.clrd = f.markers+"_jobs", f.markers+"_cleared"
	for _, s := range []string{"CREATE TABLE " + f.jobs + " (id VARCHAR(20) PRIMARY KEY)", "CREATE TABLE " + f.clrd + " (id VARCHAR(20) NOT NULL)"} {
		_, err := f.db.ExecContext(ctx, s)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = f.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+f.jobs)
		_, _ = f.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+f.clrd)
	})
	kv, err := sqlkv.NewWithOptions(f.db, dl.d, f.markers, &sqlkv.Options{LockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tx, err := f.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for i := range frozenIDs {
		id := fmt.Sprintf("j%02d", i)
		_, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+f.jobs+" VALUES (?)"), id)
		require.NoError(t, err)
		require.NoError(t, kv.MarkTx(ctx, tx, "jobs/", id, at.Add(time.Duration(i)*time.Millisecond)))
		f.keys[id], err = retention.MarkerKey("jobs/", at.Add(time.Duration(i)*time.Millisecond), id)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, q(dl.d, "DELETE FROM "+f.jobs+" WHERE id = ?"), id); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+f.clrd+" VALUES (?)"), id); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	f.clock = retention.NewManualClock(at)
	f.sweep, err = retention.New(akv, retention.Config{
		Prefix: "jobs/", Retention: time.Minute, Clock: f.clock,
		BatchSize: 4, PageSize: frozenIDs, Concurrency: 1,
		ClearTimeout: 10 * time.Minute, // not what bounds the wait
		RetryDelay:   time.Second, MaxRetryDelay: time.Second,
	})
	require.NoError(t, err)
	return f
}

// cleared returns how many times each job was cleared.
func (f *frozenFixture) cleared(t testing.TB) map[string]int {
	t.Helper()
	rows, err := f.db.QueryContext(context.Background(), "SELECT id FROM "+f.clrd)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		out[id]++
	}
	require.NoError(t, rows.Err())
	return out
}

// checkEachJobWithItsMarker requires one marker (where the sweep last put
// it: the marker range, or the retry range) for every job left, and none
// for a job cleared.
func (f *frozenFixture) checkEachJobWithItsMarker(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	var jobs, markers int
	require.NoError(t, f.db.QueryRowContext(ctx, "SELECT count(*) FROM "+f.jobs).Scan(&jobs))
	require.NoError(t, f.db.QueryRowContext(ctx, "SELECT count(*) FROM "+f.markers).Scan(&markers))
	assert.Equal(t, jobs, markers, "%d jobs left but %d markers", jobs, markers)
}
