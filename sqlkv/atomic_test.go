package sqlkv_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/sqlkv"
)

// TestClearAndDelete: one call clears and deletes in one transaction; a
// call whose marker is gone, or whose ClearFunc refuses, changes nothing;
// keys may outnumber ids.
func TestClearAndDelete(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		db := dl.open(t, "")
		ctx := context.Background()
		markers := freshTable(t, db, dl.d)
		jobs := markers + "_jobs"
		_, err := db.ExecContext(ctx, "CREATE TABLE "+jobs+" (id VARCHAR(20) PRIMARY KEY)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs) })
		kv, err := sqlkv.New(db, dl.d, markers)
		require.NoError(t, err)
		refuse := errors.New("refused")
		var fail bool
		akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
			for _, id := range ids {
				if _, err := tx.ExecContext(ctx, q(dl.d, "DELETE FROM "+jobs+" WHERE id = ?"), id); err != nil {
					return err
				}
			}
			if fail {
				return refuse
			}
			return nil
		})
		require.NoError(t, err)
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		key := func(id string, d time.Duration) []byte {
			k, err := retention.MarkerKey("jobs/", at.Add(d), id)
			require.NoError(t, err)
			return k
		}
		for _, id := range []string{"a", "b", "c"} {
			_, err := db.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" VALUES (?)"), id)
			require.NoError(t, err)
		}
		a1, a2, b, c := key("a", 0), key("a", time.Second), key("b", 2*time.Second), key("c", 3*time.Second)
		for _, k := range [][]byte{a1, a2, b, c} {
			require.NoError(t, kv.Put(ctx, k, nil))
		}
		count := func(table string) int {
			var n int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n))
			return n
		}

		fail = true
		require.ErrorIs(t, akv.ClearAndDelete(ctx, []string{"b"}, [][]byte{b}), refuse)
		assert.Equal(t, 4, count(markers), "a refused call deletes no marker")
		assert.Equal(t, 3, count(jobs), "a refused call clears nothing")
		fail = false

		require.NoError(t, akv.ClearAndDelete(ctx, []string{"a"}, [][]byte{a1, a2}), "two markers of one id")
		assert.Equal(t, 2, count(markers))
		assert.Equal(t, 2, count(jobs))

		err = akv.ClearAndDelete(ctx, []string{"a", "b"}, [][]byte{a2, b})
		require.ErrorIs(t, err, retention.ErrMarkerGone, "a call sent again")
		assert.Equal(t, 2, count(markers), "a call with a gone marker deletes nothing")
		assert.Equal(t, 2, count(jobs), "a call with a gone marker clears nothing")

		require.NoError(t, akv.ClearAndDelete(ctx, []string{"b", "c"}, [][]byte{b, c}))
		assert.Zero(t, count(markers))
		assert.Zero(t, count(jobs))
	})
}

func TestWithClear(t *testing.T) {
	kv, err := sqlkv.New(openSQLite(t, ""), sqlkv.SQLite, "markers")
	require.NoError(t, err)
	_, err = kv.WithClear(nil)
	require.EqualError(t, err, "sqlkv: WithClear: clear must not be nil")
}

func TestNew(t *testing.T) {
	db := openSQLite(t, "")
	tests := []struct {
		name    string
		db      *sql.DB
		d       sqlkv.Dialect
		table   string
		wantErr error
		msg     string
	}{
		{"ok", db, sqlkv.SQLite, "markers", nil, ""},
		{"schema", db, sqlkv.MySQL, "app.markers", nil, ""},
		{"nil db", nil, sqlkv.SQLite, "markers", nil, "sqlkv: db must not be nil"},
		{"zero dialect", db, 0, "markers", sqlkv.ErrInvalidDialect, "sqlkv: invalid dialect: 0 (use sqlkv.MySQL, sqlkv.SQLite or sqlkv.PostgreSQL)"},
		{"empty table", db, sqlkv.SQLite, "", sqlkv.ErrInvalidTable, `sqlkv: invalid table name "": empty name or schema`},
		{"long MySQL name", db, sqlkv.MySQL, string(make([]byte, 65)), sqlkv.ErrInvalidTable, ""},
		{"NUL", db, sqlkv.PostgreSQL, "mark\x00ers", sqlkv.ErrInvalidTable, `sqlkv: invalid table name "mark\x00ers": holds a NUL byte`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := sqlkv.New(tt.db, tt.d, tt.table)
			if tt.wantErr == nil && tt.msg == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.d, kv.Dialect())
				return
			}
			require.Error(t, err)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			}
			if tt.msg != "" {
				require.EqualError(t, err, tt.msg)
			}
		})
	}
}

// TestNoTable: every dialect reports a missing table as ErrNoTable.
func TestNoTable(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		kv, err := sqlkv.New(dl.open(t, ""), dl.d, "no_such_table_at_all")
		require.NoError(t, err)
		ctx := context.Background()
		_, err = kv.Scan(ctx, []byte("a"), []byte("b"), 1)
		require.ErrorIs(t, err, sqlkv.ErrNoTable)
		require.ErrorIs(t, kv.Delete(ctx, []byte("a")), sqlkv.ErrNoTable)
	})
}

// TestMySQLKeyTooLong: a key the VARBINARY column cannot hold is refused
// before it is sent, not truncated.
func TestMySQLKeyTooLong(t *testing.T) {
	db := openMySQL(t, "")
	kv, err := sqlkv.New(db, sqlkv.MySQL, freshTable(t, db, sqlkv.MySQL))
	require.NoError(t, err)
	long := make([]byte, sqlkv.MaxKeyLen+1)
	require.ErrorIs(t, kv.Put(context.Background(), long, nil), sqlkv.ErrKeyTooLong)
	require.NoError(t, kv.Put(context.Background(), long[:sqlkv.MaxKeyLen], nil))
}

// TestCustomIDRule runs kvtest.CustomIDRule, writing markers with
// MarkKeyTx in the transaction that ships the order.
func TestCustomIDRule(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		db := dl.open(t, "")
		ctx := context.Background()
		kv, err := sqlkv.New(db, dl.d, freshTable(t, db, dl.d))
		require.NoError(t, err)
		orders := "orders_" + dl.name
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+orders)
		_, err = db.ExecContext(ctx, "CREATE TABLE "+orders+" (id VARCHAR(50) PRIMARY KEY, state VARCHAR(20) NOT NULL)")
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, "INSERT INTO "+orders+" VALUES ('order.42', 'open'), ('order.7', 'open')")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+orders) })
		ship := func(ctx context.Context, id string, mark func(*sql.Tx) error, commit bool) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, q(dl.d, "UPDATE "+orders+" SET state = 'shipped' WHERE id = ?"), id); err != nil {
				return err
			}
			if err := mark(tx); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		}
		kvtest.CustomIDRule(t, kvtest.IDRuleHarness{
			KV: kv,
			MarkDefault: func(ctx context.Context, prefix, id string, at time.Time) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				if err := kv.MarkTx(ctx, tx, prefix, id, at); err != nil {
					return err
				}
				return tx.Commit()
			},
			Finish: func(ctx context.Context, sweep *retention.Sweep, id string, at time.Time) error {
				key, err := sweep.MarkerKey(at, id)
				if err != nil {
					return err
				}
				return ship(ctx, id, func(tx *sql.Tx) error { return kv.MarkKeyTx(ctx, tx, key) }, true)
			},
			Abandon: func(ctx context.Context, id string, key []byte) error {
				return ship(ctx, id, func(tx *sql.Tx) error { return kv.MarkKeyTx(ctx, tx, key) }, false)
			},
			Shipped: func(ctx context.Context, id string) (bool, error) {
				var state string
				err := db.QueryRowContext(ctx, q(dl.d, "SELECT state FROM "+orders+" WHERE id = ?"), id).Scan(&state)
				if errors.Is(err, sql.ErrNoRows) {
					return false, nil
				}
				return state == "shipped", err
			},
			Clear: func(ctx context.Context, id string) error {
				_, err := db.ExecContext(ctx, q(dl.d, "DELETE FROM "+orders+" WHERE id = ?"), id)
				return err
			},
		})
	})
}

// jobsFixture is an AtomicKV over a fresh marker table, with a jobs table
// beside it: its ClearFunc deletes the ids' jobs and records each id in a
// table cleared, in the transaction of the call, so that cleared counts
// the committed transactions that cleared an id. fail, when set, makes
// the ClearFunc return that error after its statements.
type jobsFixture struct {
	db                     *sql.DB
	d                      sqlkv.Dialect
	path                   string // SQLite's file
	markers, jobs, cleared string
	kv                     *sqlkv.KV
	akv                    *sqlkv.AtomicKV

	mu    sync.Mutex
	fail  error
	calls [][]string // the ids of each ClearFunc call
}

// jobsAt is the finish time of the fixture's first job.
var jobsAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newJobsFixture(t *testing.T, dl dialect) *jobsFixture {
	t.Helper()
	ctx := context.Background()
	f := &jobsFixture{d: dl.d}
	if dl.d == sqlkv.SQLite {
		f.path = filepath.Join(t.TempDir(), "jobs.db")
	}
	f.db = dl.open(t, f.path)
	f.markers = freshTable(t, f.db, dl.d)
	f.jobs, f.cleared = f.markers+"_jobs", f.markers+"_cleared"
	for _, s := range []string{"CREATE TABLE " + f.jobs + " (id VARCHAR(20) PRIMARY KEY)", "CREATE TABLE " + f.cleared + " (id VARCHAR(20) NOT NULL)"} {
		_, err := f.db.ExecContext(ctx, s)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = f.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+f.jobs)
		_, _ = f.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+f.cleared)
	})
	f.kv, f.akv = f.replica(t, f.db)
	return f
}

// replica returns a KV and an AtomicKV over the fixture's tables through
// db, as another process would make them.
func (f *jobsFixture) replica(t *testing.T, db *sql.DB) (*sqlkv.KV, *sqlkv.AtomicKV) {
	t.Helper()
	kv, err := sqlkv.New(db, f.d, f.markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		f.mu.Lock()
		f.calls = append(f.calls, slices.Clone(ids))
		fail := f.fail
		f.mu.Unlock()
		in := strings.Repeat(", ?", len(ids))[2:]
		if _, err := tx.ExecContext(ctx, q(f.d, "DELETE FROM "+f.jobs+" WHERE id IN ("+in+")"), anyOf(ids)...); err != nil {
			return err
		}
		if err := insertRows(ctx, tx, f.d, "INSERT INTO "+f.cleared+" (id) VALUES ", "(?)", anyOf(ids)); err != nil {
			return err
		}
		return fail
	})
	require.NoError(t, err)
	return kv, akv
}

// add writes the job and the marker of each id, finished at jobsAt plus
// the id's index in ids in ms, in one transaction, and returns the keys;
// keys holds further keys to write into the marker table as they are.
func (f *jobsFixture) add(t testing.TB, ids []string, keys ...[]byte) [][]byte {
	t.Helper()
	ctx := context.Background()
	tx, err := f.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var marks [][]byte
	for i, id := range ids {
		key, err := retention.MarkerKey("jobs/", jobsAt.Add(time.Duration(i)*time.Millisecond), id)
		require.NoError(t, err)
		marks = append(marks, key)
	}
	if len(ids) > 0 {
		require.NoError(t, insertRows(ctx, tx, f.d, "INSERT INTO "+f.jobs+" (id) VALUES ", "(?)", anyOf(slices.Compact(slices.Sorted(slices.Values(ids))))))
	}
	if all := append(slices.Clone(marks), keys...); len(all) > 0 {
		require.NoError(t, insertRows(ctx, tx, f.d, "INSERT INTO "+f.markers+" (marker) VALUES ", "(?)", anyOf(all)))
	}
	require.NoError(t, tx.Commit())
	return marks
}

// jobIDs returns n ids, j0000 to j<n-1>.
func jobIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("j%04d", i)
	}
	return ids
}

// tables is what the fixture's tables hold: the markers, the jobs left,
// and how many committed transactions cleared each id.
type tables struct {
	markers [][]byte
	jobs    []string
	cleared map[string]int
}

func (f *jobsFixture) tables(t testing.TB) tables {
	t.Helper()
	ctx := context.Background()
	markers, err := f.kv.Scan(ctx, nil, []byte("\xff"), 1<<20)
	require.NoError(t, err)
	s := tables{markers: markers, cleared: map[string]int{}}
	for _, table := range []string{f.jobs, f.cleared} {
		rows, err := f.db.QueryContext(ctx, "SELECT id FROM "+table+" ORDER BY id")
		require.NoError(t, err)
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			if table == f.jobs {
				s.jobs = append(s.jobs, id)
			} else {
				s.cleared[id]++
			}
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
	}
	return s
}

// clearCalls returns the ids of each ClearFunc call so far.
func (f *jobsFixture) clearCalls() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// runCounter is a sweep's view of an AtomicKV (or AtomicTableKV) that records the ranges of
// its Scans and counts its runs, after each of which it pauses for pause;
// it unwraps to the AtomicKV, so that a lease fences it through the
// context (retention.Fenced).
type runCounter struct {
	atomicStore
	pause  time.Duration
	mu     sync.Mutex
	scans  [][2][]byte
	runs   int
	counts int // CountRun calls but those the store said it cannot count
}

func (c *runCounter) Unwrap() retention.KV { return c.atomicStore }

func (c *runCounter) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	c.mu.Lock()
	c.scans = append(c.scans, [2][]byte{slices.Clone(start), slices.Clone(end)})
	c.mu.Unlock()
	return c.atomicStore.Scan(ctx, start, end, limit)
}

func (c *runCounter) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	c.mu.Lock()
	c.runs++
	c.mu.Unlock()
	defer time.Sleep(c.pause)
	return c.atomicStore.ClearRun(ctx, prefix, from, end, limit)
}

// lagCounter is an Observer that counts the lags it is given.
type lagCounter struct{ n atomic.Int64 }

func (o *lagCounter) ObservePass(string, retention.Stats, error) {}
func (o *lagCounter) ObservePage(string, retention.Stats)        {}
func (o *lagCounter) ObserveLease(string, retention.LeaseEvent)  {}
func (o *lagCounter) ObserveLags(_ string, lags []time.Duration) { o.n.Add(int64(len(lags))) }

// CountRun implements retention.RunCounter, for a store that is one.
func (c *runCounter) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (retention.RunCount, error) {
	rc, ok := c.atomicStore.(retention.RunCounter)
	if !ok {
		return retention.RunCount{}, fmt.Errorf("a %T counts no runs: %w", c.atomicStore, errors.ErrUnsupported)
	}
	n, err := rc.CountRun(ctx, prefix, from, end, limit, times)
	if !errors.Is(err, errors.ErrUnsupported) {
		c.mu.Lock()
		c.counts++
		c.mu.Unlock()
		time.Sleep(c.pause)
	}
	return n, err
}

// RunStore implements retention.RunClearer.
func (c *runCounter) RunStore() retention.RunClearer { return c }

// TestClearRun: a run takes the first limit markers of its range and no
// key outside it, clears their jobs and deletes them in one transaction,
// and returns them ascending; an empty range calls no ClearFunc; a limit
// below 1 is refused.
func TestClearRun(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		f := newJobsFixture(t, dl)
		ctx := context.Background()
		keys := f.add(t, jobIDs(6))

		got, err := f.akv.ClearRun(ctx, "jobs/", keys[1], keys[5], 3)
		require.NoError(t, err)
		assert.Equal(t, keys[1:4], got, "ClearRun() keys")
		assert.Equal(t, [][]string{{"j0001", "j0002", "j0003"}}, f.clearCalls())
		s := f.tables(t)
		assert.Equal(t, [][]byte{keys[0], keys[4], keys[5]}, s.markers, "markers left")
		assert.Equal(t, []string{"j0000", "j0004", "j0005"}, s.jobs, "jobs left")

		got, err = f.akv.ClearRun(ctx, "jobs/", keys[1], keys[4], 3)
		require.NoError(t, err)
		assert.Empty(t, got, "ClearRun() of an empty range")
		assert.Len(t, f.clearCalls(), 1, "a ClearFunc call for an empty run")

		_, err = f.akv.ClearRun(ctx, "jobs/", keys[0], nil, 0)
		require.EqualError(t, err, "sqlkv: ClearRun limit must be at least 1, got 0")
		assert.Equal(t, s, f.tables(t))
	})
}

// TestSweepClearsABacklogInRuns: a sweep over an AtomicKV with
// Concurrency 1 clears its expired markers in runs, never reading the
// expired range itself (its Scans read past it only); each job is cleared
// once, and the markers not expired stay.
func TestSweepClearsABacklogInRuns(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		f := newJobsFixture(t, dl)
		ids := jobIDs(2500)
		keys := f.add(t, ids)
		late, err := retention.MarkerKey("jobs/", jobsAt.Add(2*time.Hour), "late")
		require.NoError(t, err)
		f.add(t, nil, late)
		c := &runCounter{atomicStore: f.akv}
		s, err := retention.New(c, retention.Config{
			Prefix: "jobs/", Retention: time.Hour, Clock: retention.NewManualClock(jobsAt.Add(90 * time.Minute)),
			BatchSize: 1000, PageSize: 1000, Concurrency: 1,
		})
		require.NoError(t, err)

		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 2500, st.Cleared)
		assert.Equal(t, 3, st.ClearCalls, "Pass() made %d clear calls, want runs of 1000, 1000 and 500", st.ClearCalls)
		assert.Equal(t, 3, c.runs)
		for _, r := range c.scans {
			assert.Positive(t, bytes.Compare(r[0], keys[len(keys)-1]), "a Scan of [%q, %q) reads the expired range", r[0], r[1])
		}
		tb := f.tables(t)
		assert.Equal(t, [][]byte{late}, tb.markers, "markers left")
		assert.Empty(t, tb.jobs, "jobs left")
		assert.Len(t, tb.cleared, len(ids))
		for id, n := range tb.cleared {
			assert.Equal(t, 1, n, "job %s cleared %d times", id, n)
		}
	})
}

// TestClearRunRefusesAKeyNotAMarker: a run whose range holds a key that is
// no marker of the prefix, or one whose id ValidateID refuses, or a retry
// key (which ParseMarkerKey reads, but which is no marker), is refused
// with ErrMalformedMarker and changes nothing, the markers before that key
// included.
func TestClearRunRefusesAKeyNotAMarker(t *testing.T) {
	t.Parallel()
	retry := []byte("jobs/r00000000000000000001/00000000000000000001/1/j0001")
	_, _, err := retention.ParseMarkerKey("jobs/", retry)
	require.NoError(t, err, "ParseMarkerKey of a retry key")
	for _, tc := range []struct {
		name string
		key  []byte
	}{
		{"foreign", []byte("jobs/1767225600000/short-time")},
		{"id ValidateID refuses", []byte("jobs/00000001767225600000/bad.id")},
		{"retry key", retry},
		{"other prefix", []byte("jobsx/00000001767225600000/j0009")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, dl dialect) {
				f := newJobsFixture(t, dl)
				f.add(t, jobIDs(3), tc.key)
				before := f.tables(t)

				got, err := f.akv.ClearRun(context.Background(), "jobs/", []byte("jobs/"), []byte("jobsz"), 10)
				require.ErrorIs(t, err, retention.ErrMalformedMarker, "ClearRun() = %q, %v", got, err)
				assert.Nil(t, got)
				assert.Empty(t, f.clearCalls(), "ClearFunc calls")
				assert.Equal(t, before, f.tables(t), "the tables after a refused run")
			})
		})
	}
}

// TestClearRunRefusedWholeByItsClearFunc: a ClearFunc that fails, or
// names ids at fault in a BatchError, refuses the whole run: ClearRun
// returns its error with the run's keys and nothing changes; the run
// clears once it succeeds.
func TestClearRunRefusedWholeByItsClearFunc(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"error", errors.New("refused")},
		{"BatchError", retention.BatchError{"j0001": retention.ErrLiveAgain}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, dl dialect) {
				f := newJobsFixture(t, dl)
				keys := f.add(t, jobIDs(3))
				before := f.tables(t)
				f.fail = tc.err

				got, err := f.akv.ClearRun(context.Background(), "jobs/", []byte("jobs/"), []byte("jobs0"), 10)
				var be retention.BatchError
				if errors.As(tc.err, &be) {
					require.ErrorAs(t, err, &be, "ClearRun() = %q, %v", got, err)
					assert.Equal(t, tc.err, be)
				} else {
					require.ErrorIs(t, err, tc.err, "ClearRun() = %q, %v", got, err)
				}
				assert.Equal(t, keys, got, "the run's keys come with its clear's refusal")
				assert.Equal(t, before, f.tables(t), "the tables after a refused run")

				f.fail = nil
				got, err = f.akv.ClearRun(context.Background(), "jobs/", []byte("jobs/"), []byte("jobs0"), 10)
				require.NoError(t, err)
				assert.Equal(t, keys, got)
				assert.Empty(t, f.tables(t).markers)
			})
		})
	}
}

// TestClearRunClearsAnIDOnce: a run holding two markers of one id deletes
// both and hands the id to the ClearFunc once, in key order; a sweep
// counts the second a duplicate.
func TestClearRunClearsAnIDOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		f := newJobsFixture(t, dl)
		keys := f.add(t, []string{"b", "a", "c", "a"})

		got, err := f.akv.ClearRun(context.Background(), "jobs/", []byte("jobs/"), []byte("jobs0"), 10)
		require.NoError(t, err)
		assert.Equal(t, keys, got)
		assert.Equal(t, [][]string{{"b", "a", "c"}}, f.clearCalls())
		s := f.tables(t)
		assert.Empty(t, s.markers)
		assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, s.cleared)

		f.add(t, []string{"d", "e", "d"})
		sweep, err := retention.New(f.akv, retention.Config{
			Prefix: "jobs/", Retention: time.Hour, Clock: retention.NewManualClock(jobsAt.Add(2 * time.Hour)),
		})
		require.NoError(t, err)
		st, err := sweep.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 2, st.Cleared)
		assert.Equal(t, 1, st.Duplicates)
		assert.Equal(t, []string{"d", "e"}, f.clearCalls()[1])
		assert.Empty(t, f.tables(t).markers)
	})
}

// TestFencedClearRunRefusedOnceTheLeaseIsLost: a run through the fenced
// view of an AtomicKV clears while its lease holds, and once the lease
// row is taken away (its holder not yet told) is refused with
// ErrLeaseLost by the check in its transaction, changing nothing; a sweep
// under the lease over a wrapper of the AtomicKV, fenced through the
// context, clears in runs.
func TestFencedClearRunRefusedOnceTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		f := newJobsFixture(t, dl)
		ctx := context.Background()
		keys := f.add(t, jobIDs(6))
		leases := freshLeaseTable(t, f.db, dl.d)
		locker, err := sqlkv.NewLocker(f.kv, "runs", &sqlkv.LockerOptions{TTL: 10 * time.Second, Table: leases})
		require.NoError(t, err)
		lease, err := locker.TryAcquire(ctx)
		require.NoError(t, err)
		defer func() { _ = lease.Release(ctx) }()
		view, ok := lease.(retention.Fencer).Fence(f.akv)
		require.True(t, ok)
		rc, ok := view.(retention.RunClearer)
		require.True(t, ok, "the fenced view of an AtomicKV is a %T, not a RunClearer", view)

		got, err := rc.ClearRun(ctx, "jobs/", []byte("jobs/"), []byte("jobs0"), 2)
		require.NoError(t, err)
		assert.Equal(t, keys[:2], got)

		expireLease(t, f.db, dl.d, leases, "runs")
		before := f.tables(t)
		got, err = rc.ClearRun(ctx, "jobs/", []byte("jobs/"), []byte("jobs0"), 2)
		require.ErrorIs(t, err, retention.ErrLeaseLost, "ClearRun() = %q, %v", got, err)
		assert.Equal(t, before, f.tables(t), "the tables after a refused run")
		select {
		case <-lease.Lost():
		default:
			t.Error("Lost is open after a refused run")
		}

		c := &runCounter{atomicStore: f.akv}
		sweep, err := retention.New(c, retention.Config{
			Prefix: "jobs/", Retention: time.Hour, Clock: retention.NewManualClock(jobsAt.Add(2 * time.Hour)),
			Lease: locker, BatchSize: 3, Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		st, err := sweep.LeasedPass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 4, st.Cleared)
		assert.Equal(t, 2, c.runs, "runs of 3 and 1")
		assert.Empty(t, f.tables(t).markers)
	})
}

// TestConcurrentRunsClearEachJobOnce: two replicas without a lease, each
// with its own pool, sweep one backlog in runs at the same time: every
// job is cleared by exactly one committed transaction, and every marker
// goes with its job; no run fails, as each waits for the locks of the
// other's and then takes the keys after them.
func TestConcurrentRunsClearEachJobOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		f := newJobsFixture(t, dl)
		ids := jobIDs(3000)
		f.add(t, ids)
		clock := retention.NewManualClock(jobsAt.Add(2 * time.Hour))
		var counters []*runCounter
		var sweeps []*retention.Sweep
		for range 2 {
			db := dl.open(t, f.path)
			_, akv := f.replica(t, db)
			// The pause lets the other replica in between two runs, as
			// SQLite's busy handler, which sleeps and retries, would not.
			c := &runCounter{atomicStore: akv, pause: 2 * time.Millisecond}
			s, err := retention.New(c, retention.Config{
				Prefix: "jobs/", Retention: time.Hour, Clock: clock, BatchSize: 100, PageSize: 100,
				RetryDelay: time.Millisecond, MaxRetryDelay: time.Millisecond,
				Logger: slog.New(slog.DiscardHandler),
			})
			require.NoError(t, err)
			counters, sweeps = append(counters, c), append(sweeps, s)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		left := func() int {
			n := -1
			_ = f.db.QueryRowContext(ctx, "SELECT count(*) FROM "+f.markers).Scan(&n)
			return n
		}
		var failed atomic.Int64
		var wg sync.WaitGroup
		for _, s := range sweeps {
			wg.Go(func() {
				for ctx.Err() == nil && left() != 0 {
					st, _ := s.Pass(ctx) // a failed pass leaves its markers to the next
					failed.Add(int64(st.FailedCalls))
				}
			})
		}
		wg.Wait()
		require.NoError(t, ctx.Err(), "the backlog was not cleared in time")
		tb := f.tables(t)
		assert.Empty(t, tb.markers, "markers left")
		assert.Empty(t, tb.jobs, "jobs left")
		assert.Len(t, tb.cleared, len(ids))
		for id, n := range tb.cleared {
			assert.Equal(t, 1, n, "job %s cleared by %d transactions", id, n)
		}
		assert.Zero(t, failed.Load(), "failed calls: a run waits for the other's to commit, then takes the keys after it")
		for i, c := range counters {
			assert.Positive(t, c.runs, "replica %d took no run", i)
			t.Logf("replica %d: %d runs", i, c.runs)
		}
	})
}

// TestClearRunOnSQLiteSeesWritesSinceItsRead: on SQLite, another
// connection that deletes a marker of a run and writes one into its range
// between the run's read and its delete either waits for the run's
// transaction (BEGIN IMMEDIATE; a shared cache's table lock) or makes it
// fail (a deferred transaction whose snapshot is stale cannot write): no
// marker goes whose id the ClearFunc did not clear, whatever the DSN.
func TestClearRunOnSQLiteSeesWritesSinceItsRead(t *testing.T) {
	for _, txlock := range []string{"deferred", "immediate"} {
		for _, cache := range []string{"private", "shared"} {
			t.Run(txlock+"/"+cache, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				dsn := "file:" + filepath.Join(t.TempDir(), "run.db") + "?cache=" + cache +
					"&_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=" + txlock
				plain, err := sql.Open("sqlite", dsn)
				require.NoError(t, err)
				t.Cleanup(func() { _ = plain.Close() })
				// The run's statements pass through before, which runs just
				// before its range delete, once armed.
				var before func()
				db := sql.OpenDB(hookConnector{drv: plain.Driver(), dsn: dsn, before: func(q string) {
					if f := before; f != nil && strings.HasPrefix(q, "DELETE FROM") && strings.Contains(q, "marker >=") {
						before = nil
						f()
					}
				}})
				t.Cleanup(func() { _ = db.Close() })
				require.NoError(t, sqlkv.Migrate(ctx, db, sqlkv.SQLite, "markers"))
				kv, err := sqlkv.New(db, sqlkv.SQLite, "markers")
				require.NoError(t, err)
				akv, cleared := recordingClear(t, kv)
				keys, ids, between := markerRun(t, 5)
				insertMarkers(t, db, "markers", keys...)
				idOf := map[string]string{string(between): "2a"}
				for i, key := range keys {
					idOf[string(key)] = ids[i]
				}

				var deletedErr, insertedErr error
				wrote := make(chan struct{})
				before = func() {
					go func() {
						defer close(wrote)
						_, deletedErr = plain.Exec("DELETE FROM markers WHERE marker = ?", keys[3])
						_, insertedErr = plain.Exec("INSERT INTO markers (marker) VALUES (?)", between)
					}()
					select {
					case <-wrote:
					case <-time.After(time.Second):
					}
				}
				got, err := akv.ClearRun(ctx, "jobs/", []byte("jobs/"), []byte("jobs0"), 10)
				<-wrote
				t.Logf("ClearRun() = %d keys, %v; the other connection's delete: %v, insert: %v", len(got), err, deletedErr, insertedErr)

				want := map[string]bool{} // the markers there were, less those the other connection deleted
				for _, key := range keys {
					want[string(key)] = true
				}
				if deletedErr == nil {
					delete(want, string(keys[3]))
				}
				if insertedErr == nil {
					want[string(between)] = true
				}
				left, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
				require.NoError(t, err)
				for _, key := range left {
					delete(want, string(key))
				}
				for key := range want {
					assert.True(t, cleared[idOf[key]], "the marker of %s was deleted, but its id was not cleared", idOf[key])
				}
			})
		}
	}
}
