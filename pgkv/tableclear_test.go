package pgkv_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// pad is the id of a row as the table store gives it to a ClearFunc.
func pad(n int64) string { return fmt.Sprintf("%020d", n) }

// sorted returns the ids of a and b, ascending.
func sorted(a, b []int64) []int64 {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return out
}

// noOrphans checks the invariant of TableClear: a job and what depends on
// it go together or not at all, and every job that went is in the ledger.
func (j *tableOfJobs) noOrphans(t *testing.T) {
	t.Helper()
	jobs := j.ids(t, "SELECT id FROM "+j.jobs+" ORDER BY id")
	arts := j.ids(t, "SELECT DISTINCT job_id FROM "+j.artifacts+" ORDER BY job_id")
	assert.Equal(t, jobs, arts, "jobs and the jobs of the artifacts left")
	gone := j.ids(t, "SELECT g FROM generate_series(1, 30) g EXCEPT SELECT id FROM "+j.jobs+" ORDER BY 1")
	ledger := j.ids(t, "SELECT job_id FROM "+j.ledger+" ORDER BY job_id") // once each
	assert.Equal(t, gone, ledger, "jobs deleted and jobs cleared (ledger)")
}

// TestTableClearHoldKeepsHeldRowsUntilTheHoldEnds: the doc of TableClear
// says to return a retention.BatchError of retention.Holds to hold
// entities. On a real sweep, in runs and in batches: the held jobs stay
// with their artifacts until the hold ends, the others go, and at the
// hold's end the held jobs go, each cleared once.
func TestTableClearHoldKeepsHeldRowsUntilTheHoldEnds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		concurrency int
	}{
		{"runs", 1},
		{"batches", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			j := newTableOfJobs(t, connect(t))
			clock := retention.NewManualClock(time.Now())
			until := clock.Now().Add(10 * time.Minute)
			held := []int64{3, 11}
			var mu sync.Mutex
			asked := map[string]int{}
			clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
				be := retention.BatchError{}
				for _, id := range ids {
					mu.Lock()
					asked[id]++
					mu.Unlock()
					if (id == pad(held[0]) || id == pad(held[1])) && clock.Now().Before(until) {
						be[id] = retention.Hold(until)
					}
				}
				if len(be) > 0 {
					return be
				}
				return j.clearArtifacts(ctx, b, ids)
			}
			s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
				Prefix: "jobs/", Retention: time.Hour, BatchSize: 7, PageSize: 7, Concurrency: tc.concurrency, Clock: clock,
			})
			require.NoError(t, err)

			st, err := s.Pass(ctx)
			require.NoError(t, err)
			t.Logf("Pass() = %+v", st)
			assert.Equal(t, len(j.expired)-2, st.Cleared, "Pass() cleared")
			assert.Equal(t, 2, st.Held, "Pass() held")
			assert.Zero(t, st.Failed, "Pass() failed")
			kept := sorted(held, append(slices.Clone(j.unexpired), j.active...))
			assert.Equal(t, kept, j.ids(t, "SELECT id FROM "+j.jobs+" ORDER BY id"))
			j.noOrphans(t)

			st, err = s.Pass(ctx)
			require.NoError(t, err)
			assert.Zero(t, st.Cleared, "second Pass() before the hold's end cleared")
			assert.Equal(t, kept, j.ids(t, "SELECT id FROM "+j.jobs+" ORDER BY id"), "held jobs stay until the hold ends")

			clock.Advance(11 * time.Minute)
			st, err = s.Pass(ctx)
			require.NoError(t, err)
			assert.Equal(t, 2, st.Cleared, "Pass() after the hold's end cleared")
			assert.Equal(t, append(slices.Clone(j.unexpired), j.active...), j.ids(t, "SELECT id FROM "+j.jobs+" ORDER BY id"))
			assert.Equal(t, j.expired, j.ids(t, "SELECT job_id FROM "+j.ledger+" ORDER BY job_id"), "each expired job cleared once")
			j.noOrphans(t)
		})
	}
}

// TestTableClearHoldInARunIsNoFailedCall: a hold is no failure
// (retention.Hold), but a run (Concurrency 1) whose ClearFunc holds an id
// comes back from the table store with its BatchError and no keys, though
// the store knew them: the sweep counts a failed call, logs "clear calls
// failed as a whole", and reads and clears the page again.
func TestTableClearHoldInARunIsNoFailedCall(t *testing.T) {
	t.Parallel()
	j := newTableOfJobs(t, connect(t))
	until := time.Now().Add(10 * time.Minute)
	clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
		if slices.Contains(ids, pad(3)) {
			return retention.BatchError{pad(3): retention.Hold(until)}
		}
		return j.clearArtifacts(ctx, b, ids)
	}
	s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
		Prefix: "jobs/", Retention: time.Hour, BatchSize: 7, PageSize: 7,
	})
	require.NoError(t, err)
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Held, "Pass() held")
	assert.Zero(t, st.FailedCalls, "Pass() failed calls, for a hold")
}

// TestTableClearRefusesLiveAgainOfAFinishedRow: a ClearFunc that says an
// entity is live again (retention.ErrLiveAgain, for an id or for the whole
// call) while its row is still finished would have the sweep drop its
// marker, which is the row: the row would go without what depends on it.
// The id fails instead, in runs and in batches: every job left keeps its
// artifacts, and every job gone is in the ledger.
func TestTableClearRefusesLiveAgainOfAFinishedRow(t *testing.T) {
	for _, tc := range []struct {
		name        string
		concurrency int
		answer      func(ids []string) error
	}{
		{"a BatchError, runs", 1, func([]string) error { return retention.BatchError{pad(5): retention.ErrLiveAgain} }},
		{"a BatchError, batches", 2, func([]string) error { return retention.BatchError{pad(5): retention.ErrLiveAgain} }},
		{"the whole call, batches", 2, func([]string) error { return fmt.Errorf("job 5 runs again: %w", retention.ErrLiveAgain) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			j := newTableOfJobs(t, connect(t))
			clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
				if slices.Contains(ids, pad(5)) {
					return tc.answer(ids)
				}
				return j.clearArtifacts(ctx, b, ids)
			}
			s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
				Prefix: "jobs/", Retention: time.Hour, BatchSize: 7, PageSize: 7, Concurrency: tc.concurrency,
			})
			require.NoError(t, err)
			st, err := s.Pass(ctx)
			require.NoError(t, err)
			t.Logf("Pass() = %+v", st)
			assert.Contains(t, j.ids(t, "SELECT id FROM "+j.jobs), int64(5), "the job that must stay")
			j.noOrphans(t)
		})
	}
}

// TestTableClearHoldsOfQueueHolds: a ClearFunc that decides holds with
// QueueHolds, from a table of holds: the held job stays, counted as held,
// not failed, and the others go with their artifacts.
func TestTableClearHoldsOfQueueHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	j := newTableOfJobs(t, connect(t))
	holds := j.jobs + "_holds"
	_, err := j.pool.Exec(ctx, "CREATE TABLE "+holds+" (job_id bigint PRIMARY KEY, until timestamptz)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = j.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+holds) })
	_, err = j.pool.Exec(ctx, "INSERT INTO "+holds+" VALUES (4, now() + interval '1 hour')")
	require.NoError(t, err)

	clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
		pgkv.QueueHolds(b, "SELECT lpad(job_id::text, 20, '0'), until FROM "+holds+" WHERE job_id = ANY($1::bigint[])", ids)
		return j.clearArtifacts(ctx, b, ids)
	}
	s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
		Prefix: "jobs/", Retention: time.Hour, BatchSize: 7, PageSize: 7, Concurrency: 2, MaxAttempts: 2,
	})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	t.Logf("Pass() = %+v", st)
	assert.Contains(t, j.ids(t, "SELECT id FROM "+j.jobs), int64(4), "the held job stays")
	assert.Equal(t, 1, st.Held, "Pass() held")
	assert.Zero(t, st.Failed, "Pass() failed")
	j.noOrphans(t)
}

// noteValuer is a custom argument type that is a driver.Valuer.
type noteValuer struct{ s string }

func (n noteValuer) Value() (driver.Value, error) { return "valuer:" + n.s, nil }

// jobNote is a custom argument type of a basic kind.
type jobNote string

// TestTableClearArguments: the arguments a pgkv ClearFunc may queue (see
// pgkv.ClearFunc) reach PostgreSQL through database/sql and pgx's stdlib
// as they would through pgx, in the rows' transaction; a statement that
// the server refuses rolls everything back, with an error that says which.
func TestTableClearArguments(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 891000000, time.UTC)
	type row struct {
		ids   []int64
		names []string
		note  *string
		at    *time.Time
	}
	str := func(s string) *string { return &s }
	ids3 := []int64{1, 2, 3}
	names3 := []string{pad(1), pad(2), pad(3)}
	for _, tc := range []struct {
		name    string
		queue   func(b *pgx.Batch, args string, ids []string)
		want    []row  // the rows of args after a commit
		wantErr string // else: refused, everything rolled back
	}{
		{"NamedArgs", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (ids, note) VALUES (@ids::bigint[], @note)", pgx.NamedArgs{"ids": ids, "note": "named"})
		}, []row{{ids: ids3, note: str("named")}}, ""},
		{"StrictNamedArgs", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (ids, note) VALUES (@ids::bigint[], @note)", pgx.StrictNamedArgs{"ids": ids, "note": "strict"})
		}, []row{{ids: ids3, note: str("strict")}}, ""},
		{"StrictNamedArgs missing one", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (ids, note) VALUES (@ids::bigint[], @note)", pgx.StrictNamedArgs{"ids": ids})
		}, nil, "statement 1"},
		{"[]string into text[] uncast", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (names) VALUES ($1)", ids)
		}, []row{{names: names3}}, ""},
		{"[]string into bigint[] uncast", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (ids) VALUES ($1)", ids)
		}, []row{{ids: ids3}}, ""},
		{"[]string in unnest uncast", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (note) SELECT unnest($1)", ids)
		}, nil, "statement 1"},
		{"[]int64", func(b *pgx.Batch, args string, _ []string) {
			b.Queue("INSERT INTO "+args+" (ids) VALUES ($1)", ids3)
		}, []row{{ids: ids3}}, ""},
		{"nil", func(b *pgx.Batch, args string, _ []string) {
			b.Queue("INSERT INTO "+args+" (note, at) VALUES ($1, $2)", nil, nil)
		}, []row{{}}, ""},
		{"time.Time", func(b *pgx.Batch, args string, _ []string) {
			b.Queue("INSERT INTO "+args+" (at) VALUES ($1)", at)
		}, []row{{at: &at}}, ""},
		{"a driver.Valuer", func(b *pgx.Batch, args string, _ []string) {
			b.Queue("INSERT INTO "+args+" (note) VALUES ($1)", noteValuer{"x"})
		}, []row{{note: str("valuer:x")}}, ""},
		{"a named string type", func(b *pgx.Batch, args string, _ []string) {
			b.Queue("INSERT INTO "+args+" (note) VALUES ($1)", jobNote("kind"))
		}, []row{{note: str("kind")}}, ""},
		{"QueryExecModeSimpleProtocol first", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (ids, note, at) VALUES ($1::bigint[], $2, $3)", pgx.QueryExecModeSimpleProtocol, ids, "it's simple", at)
		}, []row{{ids: ids3, note: str("it's simple"), at: &at}}, ""},
		{"QueryExecModeExec first, NamedArgs second", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (ids, note) VALUES (@ids::bigint[], @note)", pgx.QueryExecModeExec, pgx.NamedArgs{"ids": ids, "note": "exec"})
		}, []row{{ids: ids3, note: str("exec")}}, ""},
		{"two statements, with arguments", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO "+args+" (note) VALUES ('first')", nil...)
			b.Queue("INSERT INTO "+args+" (note) VALUES ($1); INSERT INTO "+args+" (note) VALUES ('second')", "x")
		}, nil, "statement 2"},
		{"two statements, no arguments", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO " + args + " (note) VALUES ('a'); INSERT INTO " + args + " (note) VALUES ('b')")
		}, []row{{note: str("a")}, {note: str("b")}}, ""},
		{"an error in the second of two statements, no arguments", func(b *pgx.Batch, args string, ids []string) {
			b.Queue("INSERT INTO " + args + " (note) VALUES ('a'); INSERT INTO " + args + " (ids) VALUES ('not an array')")
		}, nil, "statement 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			j := newTableOfJobs(t, connect(t))
			args := j.jobs + "_args"
			_, err := j.pool.Exec(ctx, "CREATE TABLE "+args+" (n serial, ids bigint[], names text[], note text, at timestamptz)")
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = j.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+args) })
			tkv := j.table(t)
			akv := tkv.WithClear(pgkv.TableClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
				tc.queue(b, args, ids)
				return nil
			}))
			keys, err := tkv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 3)
			require.NoError(t, err)
			ids := make([]string, len(keys))
			for i, k := range keys {
				_, id, err := retention.ParseMarkerKey("jobs/", k)
				require.NoError(t, err)
				ids[i] = string(id)
			}
			err = akv.ClearAndDelete(ctx, ids, keys)

			rows, qerr := j.pool.Query(ctx, "SELECT ids, names, note, at FROM "+args+" ORDER BY n")
			require.NoError(t, qerr)
			got, qerr := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
				var x row
				return x, r.Scan(&x.ids, &x.names, &x.note, &x.at)
			})
			require.NoError(t, qerr)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				t.Logf("ClearAndDelete() = %v", err)
				assert.Empty(t, got, "nothing written")
				assert.Len(t, j.ids(t, "SELECT id FROM "+j.jobs), 30, "every job stays")
				return
			}
			require.NoError(t, err)
			for i := range got {
				if got[i].at != nil {
					u := got[i].at.UTC()
					got[i].at = &u
				}
			}
			assert.Equal(t, tc.want, got)
			assert.Len(t, j.ids(t, "SELECT id FROM "+j.jobs), 27, "three jobs went")
		})
	}
}

// rowLocked reports whether another transaction holds a lock on job id's row.
func (j *tableOfJobs) rowLocked(t *testing.T, id int64) bool {
	t.Helper()
	var one int
	err := j.pool.QueryRow(context.Background(), "SELECT 1 FROM "+j.jobs+" WHERE id = $1 FOR UPDATE NOWAIT", id).Scan(&one)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return true
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return false
	}
	require.NoError(t, err)
	return false
}

// backends returns how many server sessions run a statement holding tag.
func backends(t *testing.T, j *tableOfJobs, tag string) int {
	t.Helper()
	var n int
	require.NoError(t, j.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()", tag).Scan(&n))
	return n
}

// TestTableClearCutShortRollsBackAtOnce: a statement that hangs (pg_sleep)
// past Config.ClearTimeout, or a call whose context is cancelled: nothing
// is deleted, and the transaction's locks on the rows it deleted go with
// the call, so that the next call for those rows is not held up by it
// (pgx's cancel request on a cut-short statement).
func TestTableClearCutShortRollsBackAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(t *testing.T, j *tableOfJobs, clear pgkv.ClearFunc)
	}{
		{"ClearTimeout", func(t *testing.T, j *tableOfJobs, clear pgkv.ClearFunc) {
			s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
				Prefix: "jobs/", Retention: time.Hour, BatchSize: 7, PageSize: 7, Concurrency: 2, ClearTimeout: 300 * time.Millisecond,
			})
			require.NoError(t, err)
			st, err := s.Pass(context.Background())
			t.Logf("Pass() = %+v, %v", st, err)
		}},
		{"cancelled", func(t *testing.T, j *tableOfJobs, clear pgkv.ClearFunc) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			tkv := j.table(t)
			keys, err := tkv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 3)
			require.NoError(t, err)
			ids := make([]string, len(keys))
			for i, k := range keys {
				_, id, _ := retention.ParseMarkerKey("jobs/", k)
				ids[i] = string(id)
			}
			err = tkv.WithClear(pgkv.TableClear(clear)).ClearAndDelete(ctx, ids, keys)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			t.Logf("ClearAndDelete() = %v", err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := newTableOfJobs(t, connect(t))
			tag := "sleep_" + j.jobs
			var slept atomic.Bool
			clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
				if slices.Contains(ids, pad(1)) && slept.CompareAndSwap(false, true) {
					b.Queue("SELECT pg_sleep(10) /* " + tag + " */")
				}
				return j.clearArtifacts(ctx, b, ids)
			}
			start := time.Now()
			tc.cut(t, j, clear)
			t.Logf("took %v", time.Since(start))
			// The sweep may have cleared job 1 again since, once: either way
			// it went with its artifacts.
			j.noOrphans(t)
			// pgx's cancel request is sent as the call returns and reaches
			// the server a moment later: well before the 10s statement ends.
			assert.Eventually(t, func() bool { return backends(t, j, tag) == 0 }, 3*time.Second, 20*time.Millisecond,
				"server sessions still running the statement 3s after the call returned")
			assert.Eventually(t, func() bool { return !j.rowLocked(t, 1) }, 3*time.Second, 20*time.Millisecond,
				"job 1's row still locked 3s after the call returned")
		})
	}
}

// TestTableClearPanicRollsBack: a ClearFunc that panics inside the rows'
// transaction fails its call (ErrClearPanicked), the transaction rolls
// back, and no pool connection is left acquired.
func TestTableClearPanicRollsBack(t *testing.T) {
	t.Parallel()
	j := newTableOfJobs(t, connect(t))
	var panicked atomic.Bool
	clear := func(ctx context.Context, b *pgx.Batch, ids []string) error {
		if slices.Contains(ids, pad(2)) && panicked.CompareAndSwap(false, true) {
			b.Queue("DELETE FROM "+j.artifacts+" WHERE job_id = ANY($1::bigint[])", ids)
			panic("boom")
		}
		return j.clearArtifacts(ctx, b, ids)
	}
	s, err := retention.New(j.table(t).WithClear(pgkv.TableClear(clear)), retention.Config{
		Prefix: "jobs/", Retention: time.Hour, BatchSize: 7, PageSize: 7, Concurrency: 2,
	})
	require.NoError(t, err)
	st, err := s.Pass(context.Background())
	t.Logf("Pass() = %+v, %v", st, err)
	require.True(t, panicked.Load())
	assert.Equal(t, 1, st.PanickedCalls)
	j.noOrphans(t)
	assert.Eventually(t, func() bool { return j.pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond)
}
