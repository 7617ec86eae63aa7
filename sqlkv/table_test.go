package sqlkv_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
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

// jobsTable is a table of jobs whose rows are markers: a test's own,
// dropped when it ends, with an artifacts table whose rows depend on the
// jobs'.
type jobsTable struct {
	dl        dialect
	db        *sql.DB
	name      string
	artifacts string
	unit      sqlkv.TimeUnit
	side      *sqlkv.KV
}

const tablePrefix = "jobs/done/"

// newJobsTable creates the tables; with index false, the jobs table has
// no index on (finished, id). On PostgreSQL the finish time is a
// timestamptz, elsewhere Unix milliseconds.
func newJobsTable(t testing.TB, dl dialect, index bool) *jobsTable {
	t.Helper()
	db := dl.open(t, "")
	n := tableSeq.Add(1)
	j := &jobsTable{dl: dl, db: db, unit: sqlkv.UnixMilli,
		name: fmt.Sprintf("jobs_%d_%d", os.Getpid(), n), artifacts: fmt.Sprintf("artifacts_%d_%d", os.Getpid(), n)}
	finished := "finished BIGINT NULL"
	if dl.d == sqlkv.PostgreSQL {
		finished, j.unit = "finished timestamptz NULL", sqlkv.Timestamp
	}
	ctx := context.Background()
	stmts := []string{
		"CREATE TABLE " + j.name + " (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, " + finished + ")",
		"CREATE TABLE " + j.artifacts + " (job_id BIGINT NOT NULL, name VARCHAR(32) NOT NULL)",
	}
	if index {
		stmts = append(stmts, "CREATE INDEX "+j.name+"_finished ON "+j.name+" (finished, id)")
	}
	for _, s := range stmts {
		_, err := db.ExecContext(ctx, s)
		require.NoError(t, err, s)
	}
	t.Cleanup(func() {
		for _, tb := range []string{j.name, j.artifacts} {
			_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb)
			assert.NoError(t, err)
		}
	})
	side, err := sqlkv.New(db, dl.d, freshTable(t, db, dl.d))
	require.NoError(t, err)
	j.side = side
	return j
}

// kv returns a TableKV over the jobs whose state is done or failed.
func (j *jobsTable) kv(t testing.TB) *sqlkv.TableKV {
	t.Helper()
	kv, err := sqlkv.NewTable(context.Background(), j.side, sqlkv.Table{Name: j.name, ID: "id", Time: "finished",
		TimeUnit: j.unit, Filter: "state IN ('done', 'failed')", Prefix: tablePrefix})
	require.NoError(t, err)
	return kv
}

// atomic returns an AtomicTableKV whose clear deletes the jobs' artifacts.
func (j *jobsTable) atomic(t testing.TB) *sqlkv.AtomicTableKV {
	return j.kv(t).WithClear(j.deleteArtifacts)
}

// deleteArtifacts is a ClearFunc that deletes the jobs' artifacts.
func (j *jobsTable) deleteArtifacts(ctx context.Context, tx *sql.Tx, ids []string) error {
	for _, id := range ids {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, q(j.dl.d, "DELETE FROM "+j.artifacts+" WHERE job_id = ?"), n); err != nil {
			return err
		}
	}
	return nil
}

// timeArg returns the finish time as the table's column holds it.
func (j *jobsTable) timeArg(at time.Time) any {
	if j.unit == sqlkv.Timestamp {
		return at
	}
	return at.UnixMilli()
}

// finish writes job id as finished at with state (running: no finish
// time), and an artifact of it.
func (j *jobsTable) finish(t testing.TB, id int64, state string, at time.Time) {
	t.Helper()
	var fin any
	if state != "running" {
		fin = j.timeArg(at)
	}
	ctx := context.Background()
	_, err := j.db.ExecContext(ctx, q(j.dl.d, "DELETE FROM "+j.name+" WHERE id = ?"), id)
	require.NoError(t, err)
	_, err = j.db.ExecContext(ctx, q(j.dl.d, "INSERT INTO "+j.name+" (id, state, finished) VALUES (?, ?, ?)"), id, state, fin)
	require.NoError(t, err)
	_, err = j.db.ExecContext(ctx, q(j.dl.d, "INSERT INTO "+j.artifacts+" (job_id, name) VALUES (?, ?)"), id, "log")
	require.NoError(t, err)
}

// ids returns the ids of the jobs left, and of their artifacts.
func (j *jobsTable) ids(t testing.TB) (jobs, artifacts map[int64]bool) {
	t.Helper()
	read := func(q string) map[int64]bool {
		rows, err := j.db.QueryContext(context.Background(), q)
		require.NoError(t, err)
		defer rows.Close()
		out := map[int64]bool{}
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			out[id] = true
		}
		require.NoError(t, rows.Err())
		return out
	}
	return read("SELECT id FROM " + j.name), read("SELECT job_id FROM " + j.artifacts)
}

// rowKey is the key of job id finished at.
func rowKey(t testing.TB, at time.Time, id int64) []byte {
	t.Helper()
	key, err := retention.MarkerKey(tablePrefix, at, fmt.Sprintf("%020d", id))
	require.NoError(t, err)
	return key
}

func keyStrings(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = string(k)
	}
	return out
}

func TestNewTableChecksTheTable(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, false)
		ctx := context.Background()
		base := sqlkv.Table{Name: j.name, ID: "id", Time: "finished", TimeUnit: j.unit, Filter: "state = 'done'", Prefix: tablePrefix}
		_, err := sqlkv.NewTable(ctx, j.side, base)
		require.ErrorIs(t, err, sqlkv.ErrNoIndex)
		assert.Contains(t, err.Error(), "CREATE INDEX")
		assert.Contains(t, err.Error(), "WHERE state = 'done'", "the index the error names has the filter's WHERE")

		if dl.d != sqlkv.MySQL { // MySQL has no partial indexes
			_, err = j.db.ExecContext(ctx, "CREATE INDEX "+j.name+"_other ON "+j.name+" (finished, id) WHERE state = 'failed'")
			require.NoError(t, err)
			_, err = sqlkv.NewTable(ctx, j.side, base)
			require.ErrorIs(t, err, sqlkv.ErrNoIndex, "a partial index whose WHERE the filter does not imply")
			assert.Contains(t, err.Error(), "does not serve the filter's rows")
			_, err = j.db.ExecContext(ctx, "DROP INDEX "+j.name+"_other")
			require.NoError(t, err)
		}

		_, err = j.db.ExecContext(ctx, "CREATE INDEX "+j.name+"_fin ON "+j.name+" (finished, id)")
		require.NoError(t, err)
		tests := []struct {
			name    string
			modify  func(*sqlkv.Table)
			wantErr string
		}{
			{"valid", func(*sqlkv.Table) {}, ""},
			{"id not an integer", func(c *sqlkv.Table) { c.ID = "state" }, "must be an integer column"},
			{"no such column", func(c *sqlkv.Table) { c.ID = "nope" }, "has no column"},
			{"no time column", func(c *sqlkv.Table) { c.Time = "" }, "Table.ID and Table.Time must be set"},
			{"placeholder in the filter", func(c *sqlkv.Table) { c.Filter = "state = ?" }, "must hold no placeholder"},
			{"a filter closing our parentheses", func(c *sqlkv.Table) { c.Filter = "state = 'done') OR (state = 'failed'" },
				"closes a parenthesis it did not open"},
			{"a filter with an open parenthesis", func(c *sqlkv.Table) { c.Filter = "(state = 'done'" }, "leaves a parenthesis open"},
			{"a filter with a comment", func(c *sqlkv.Table) { c.Filter = "state = 'done' --" }, "holds a comment"},
			{"a filter with an open quote", func(c *sqlkv.Table) { c.Filter = "state = 'done" }, "leaves ' unclosed"},
			{"a filter with a backslash", func(c *sqlkv.Table) { c.Filter = `state = 'a\' OR 1 = 1 OR state = ''` }, "backslash"},
			{"a filter with quoted parentheses and OR", func(c *sqlkv.Table) { c.Filter = "(state = 'done' OR state = ')(''')" }, ""},
			{"prefix ending in an id byte", func(c *sqlkv.Table) { c.Prefix = "jobs" }, "Table.Prefix"},
			{"bad unit", func(c *sqlkv.Table) { c.TimeUnit = 7 }, "neither Timestamp nor UnixMilli"},
			{"no filter, the index serves every row", func(c *sqlkv.Table) { c.Filter = "" }, ""},
			{"a time column of another kind", func(c *sqlkv.Table) { c.TimeUnit = 1 - c.TimeUnit }, "Table.Time"},
		}
		for _, tt := range tests {
			cfg := base
			tt.modify(&cfg)
			kv, err := sqlkv.NewTable(ctx, j.side, cfg)
			if tt.wantErr == "" {
				require.NoError(t, err, tt.name)
				assert.NotNil(t, kv)
				continue
			}
			require.Error(t, err, tt.name)
			assert.Contains(t, err.Error(), tt.wantErr, tt.name)
		}
	})
}

// TestTableScanReadsRowsAsMarkers: the rows that are markers are read in
// key order, those of one millisecond by id though the index orders them
// by time, at every page size and from any start.
func TestTableScanReadsRowsAsMarkers(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		kv := j.kv(t)
		base := time.UnixMilli(1_700_000_000_000)
		var want []string
		for i := range 40 {
			id := int64(40 - i) // later rows of a millisecond have smaller ids
			at := base.Add(time.Duration(i/4) * time.Millisecond)
			if j.unit == sqlkv.Timestamp {
				at = at.Add(-time.Duration(3-i%4) * 100 * time.Microsecond) // four times in one rounded-up millisecond
			}
			state := []string{"done", "failed", "done", "running"}[i%4]
			if i%8 == 3 {
				state = "cancelled" // not a marker by the filter
			}
			j.finish(t, id, state, at)
			if state == "done" || state == "failed" {
				want = append(want, string(rowKey(t, at, id)))
			}
		}
		sortStrings(want)
		ctx := context.Background()
		for _, page := range []int{1, 2, 3, 7, 100} {
			var got []string
			from := []byte(tablePrefix)
			for {
				keys, err := kv.Scan(ctx, from, []byte(tablePrefix+"\xff"), page)
				require.NoError(t, err)
				got = append(got, keyStrings(keys)...)
				if len(keys) < page {
					break
				}
				from = append(keys[len(keys)-1], 0)
			}
			assert.Equal(t, want, got, "pages of %d", page)
		}
		// From inside a key, and up to one.
		keys, err := kv.Scan(ctx, []byte(want[3][:len(want[3])-3]), []byte(want[7]), 100)
		require.NoError(t, err)
		assert.Equal(t, want[3:7], keyStrings(keys))
	})
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for k := i; k > 0 && s[k] < s[k-1]; k-- {
			s[k], s[k-1] = s[k-1], s[k]
		}
	}
}

// TestTableSweepClearsRowsOnce: an atomic sweep over the table deletes
// the expired jobs that are markers with their artifacts, in runs and in
// pages alike, and keeps every other row.
func TestTableSweepClearsRowsOnce(t *testing.T) {
	for _, conc := range []int{1, 4} { // runs, then pages
		t.Run(fmt.Sprintf("Concurrency%d", conc), func(t *testing.T) {
			forEach(t, func(t *testing.T, dl dialect) {
				j := newJobsTable(t, dl, true)
				now := time.UnixMilli(1_800_000_000_000)
				var want []int64
				for i := range 300 {
					id := int64(i + 1)
					at := now.Add(-2*time.Hour + time.Duration(i/3)*time.Millisecond)
					state := "done"
					switch {
					case i%10 == 0:
						state = "running"
					case i%10 == 1:
						state = "cancelled"
					case i >= 270:
						at = now.Add(-time.Minute) // not expired
					default:
						want = append(want, id)
					}
					j.finish(t, id, state, at)
				}
				s, err := retention.New(j.atomic(t), retention.Config{Prefix: tablePrefix, Retention: time.Hour,
					Clock: retention.NewManualClock(now), Concurrency: conc, BatchSize: 16, PageSize: 64})
				require.NoError(t, err)
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, len(want), st.Cleared)
				jobs, arts := j.ids(t)
				for _, id := range want {
					assert.False(t, jobs[id], "job %d left", id)
					assert.False(t, arts[id], "artifact of job %d left", id)
				}
				assert.Len(t, jobs, 300-len(want))
				assert.Len(t, arts, 300-len(want))
				st, err = s.Pass(context.Background())
				require.NoError(t, err)
				assert.Zero(t, st.Cleared, "a second pass clears nothing")
			})
		})
	}
}

// TestTableRetriesHoldsAndRequeue: a failed clear moves its row's marker
// to the side table (the row stays, shadowed), and the retry clears it
// later; a held one waits; a parked one waits for Requeue, which makes the
// row a marker again; a held one released (Sweep.ReleaseHolds) is due at
// once and cleared by the next pass.
func TestTableRetriesHoldsAndRequeue(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		now := time.UnixMilli(1_800_000_000_000)
		for id := int64(1); id <= 6; id++ {
			j.finish(t, id, "done", now.Add(-2*time.Hour+time.Duration(id)*time.Millisecond))
		}
		kv := j.kv(t)
		clock := retention.NewManualClock(now)
		var mu sync.Mutex
		fail := map[string]error{
			fmt.Sprintf("%020d", 2): errors.New("bucket unreachable"),
			fmt.Sprintf("%020d", 3): retention.Hold(now.Add(3 * time.Hour)),
			fmt.Sprintf("%020d", 4): errors.New("always fails"),
		}
		cleared := map[string]int{}
		s, err := retention.New(kv, retention.Config{Prefix: tablePrefix, Retention: time.Hour, Clock: clock,
			RetryDelay: time.Minute, MaxAttempts: 2,
			Clear: func(_ context.Context, id string) error {
				mu.Lock()
				defer mu.Unlock()
				if err := fail[id]; err != nil {
					return err
				}
				cleared[id]++
				return nil
			}})
		require.NoError(t, err)
		ctx := context.Background()
		_, err = s.Pass(ctx)
		require.NoError(t, err)
		jobs, _ := j.ids(t)
		assert.Equal(t, map[int64]bool{2: true, 3: true, 4: true}, jobs, "the cleared jobs' rows went; the others stay")
		keys, err := kv.Scan(ctx, []byte(tablePrefix), []byte(tablePrefix+"~"), 100)
		require.NoError(t, err)
		assert.Len(t, keys, 3, "one marker each, in the side table: %q", keys)

		mu.Lock()
		delete(fail, fmt.Sprintf("%020d", 2))
		mu.Unlock()
		clock.Advance(2 * time.Minute)
		_, err = s.Pass(ctx)
		require.NoError(t, err)
		clock.Advance(5 * time.Minute)
		_, err = s.Pass(ctx) // 4 fails its second attempt: parked
		require.NoError(t, err)
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true, 4: true}, jobs, "the retry cleared 2")

		mu.Lock()
		delete(fail, fmt.Sprintf("%020d", 4))
		mu.Unlock()
		n, err := s.Requeue(ctx, fmt.Sprintf("%020d", 4))
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		_, err = s.Pass(ctx)
		require.NoError(t, err)
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true}, jobs, "the requeued job was cleared; the held one waits")
		clock.Advance(time.Hour)
		_, err = s.Pass(ctx)
		require.NoError(t, err)
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true}, jobs, "still held until its hold ends")

		// Released two hours before its hold's end, the held row is due at
		// once, and the next pass clears it.
		held := fmt.Sprintf("%020d", 3)
		n, err = s.ReleaseHolds(ctx, fmt.Sprintf("%020d", 5))
		require.NoError(t, err)
		assert.Zero(t, n, "a cleared job has no held marker")
		mu.Lock()
		delete(fail, held)
		mu.Unlock()
		n, err = s.ReleaseHolds(ctx, held)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		pending, err := s.Pending(ctx, 10)
		require.NoError(t, err)
		require.Len(t, pending, 1)
		assert.Equal(t, retention.StateDue, pending[0].State, "released: due at once")
		assert.Equal(t, held, pending[0].ID)
		clock.Advance(time.Millisecond)
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Cleared)
		jobs, _ = j.ids(t)
		assert.Empty(t, jobs, "the released job was cleared")
		keys, err = kv.Scan(ctx, []byte(tablePrefix), []byte(tablePrefix+"~"), 100)
		require.NoError(t, err)
		assert.Empty(t, keys, "no marker left, in the table or the side table")

		mu.Lock()
		defer mu.Unlock()
		for id, n := range cleared {
			assert.Equal(t, 1, n, "job %s cleared %d times", id, n)
		}
	})
}

// TestTableNeverDeletesARowThatFinishedAgain: a marker read before its
// job ran again and finished later deletes nothing, in any write path.
func TestTableNeverDeletesARowThatFinishedAgain(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		a := j.atomic(t)
		ctx := context.Background()
		old := time.UnixMilli(1_700_000_000_000)
		for id := int64(1); id <= 3; id++ {
			j.finish(t, id, "done", old)
		}
		keys, err := a.Scan(ctx, []byte(tablePrefix), []byte(tablePrefix+"\xff"), 10)
		require.NoError(t, err)
		require.Len(t, keys, 3)
		for id := int64(1); id <= 3; id++ {
			j.finish(t, id, "done", old.Add(time.Hour)) // ran again
		}
		require.NoError(t, a.Delete(ctx, keys[0]))
		err = a.ClearAndDelete(ctx, []string{fmt.Sprintf("%020d", 2)}, keys[1:2])
		require.ErrorIs(t, err, retention.ErrMarkerGone)
		require.NoError(t, a.Move(ctx, keys[2:3], [][]byte{[]byte(tablePrefix + "r-elsewhere")}))
		jobs, arts := j.ids(t)
		assert.Len(t, jobs, 3, "no job deleted")
		assert.Len(t, arts, 3, "no artifact deleted")
		left, err := a.Scan(ctx, []byte(tablePrefix), []byte(tablePrefix+"\xff"), 10)
		require.NoError(t, err)
		assert.Len(t, left, 3, "each job is a marker at its new time: %q", left)
	})
}

// TestTableRunsTakeExactlyTheFirstMarkers: a run takes the first limit
// markers in key order, those of a millisecond with many rows by id, and
// refuses, changing nothing, a range where a side key lies.
func TestTableRunsTakeExactlyTheFirstMarkers(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		a := j.atomic(t)
		ctx := context.Background()
		base := time.UnixMilli(1_700_000_000_000)
		var want []string
		for i := range 30 {
			id := int64(100 - i)
			at := base.Add(time.Duration(i/5) * time.Millisecond)
			if j.unit == sqlkv.Timestamp {
				at = at.Add(-time.Duration(4-i%5) * 100 * time.Microsecond)
			}
			j.finish(t, id, "done", at)
			want = append(want, string(rowKey(t, at, id)))
		}
		sortStrings(want)
		end := []byte(tablePrefix + ":")
		from := []byte(tablePrefix)
		var got []string
		for _, limit := range []int{3, 7, 1, 12, 100} {
			keys, err := a.ClearRun(ctx, tablePrefix, from, end, limit)
			require.NoError(t, err, "limit %d", limit)
			got = append(got, keyStrings(keys)...)
			if len(keys) > 0 {
				from = append(keys[len(keys)-1], 0)
			}
		}
		assert.Equal(t, want, got)
		jobs, arts := j.ids(t)
		assert.Empty(t, jobs)
		assert.Empty(t, arts)

		// A key of the side table in the range is taken in its place.
		j.finish(t, 1, "done", base)
		j.finish(t, 2, "done", base.Add(time.Second))
		put := rowKey(t, base.Add(time.Millisecond), 99)
		require.NoError(t, a.Put(ctx, put, nil))
		keys, err := a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), end, 2)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, base, 1)), string(put)}, keyStrings(keys))
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{2: true}, jobs)
		keys, err = a.ClearRun(ctx, tablePrefix, append(put, 0), end, 2)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, base.Add(time.Second), 2))}, keyStrings(keys))

		// A retry key in the range is no marker: the run is refused, and
		// changes nothing.
		j.finish(t, 3, "done", base)
		retry := tablePrefix + "r" + strings.Repeat("0", 20) + "/" + strings.Repeat("0", 20) + "/1/" + fmt.Sprintf("%020d", 4)
		require.NoError(t, a.Put(ctx, []byte(retry), nil))
		_, err = a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), []byte(tablePrefix+"\xff"), 10)
		require.ErrorIs(t, err, retention.ErrMalformedMarker)
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true}, jobs, "a refused run changes nothing")
	})
}

// TestTableConformance runs kvtest over a TableKV and an AtomicTableKV
// (its runs among the behaviours): stores of the keys a side table holds
// and of the rows' markers.
func TestTableConformance(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		t.Run("TableKV", func(t *testing.T) {
			kvtest.Run(t, func(t testing.TB) kvtest.Store {
				kv := newJobsTable(t, dl, true).kv(t)
				return kvtest.Store{KV: kv, Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) }}
			})
		})
		t.Run("AtomicTableKV", func(t *testing.T) {
			kvtest.Run(t, func(t testing.TB) kvtest.Store {
				kv := newJobsTable(t, dl, true).kv(t).WithClear(nil)
				return kvtest.Store{KV: kv, Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) }}
			})
		})
	})
}

// TestTableModel sweeps a table with random clear outcomes, rows finishing
// again and new rows, and checks what the model says: no row deleted
// before its retention, none that is no marker, each expired marker's job
// cleared in the end, and, atomic, none cleared twice.
func TestTableModel(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		for seed := range uint64(3) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) { tableModel(t, dl, seed, false) })
		}
		for seed := range uint64(3) {
			t.Run(fmt.Sprint("counted/", seed), func(t *testing.T) { tableModel(t, dl, seed, true) })
		}
	})
}

// tableModel runs the model of seed; counted, the rows are the whole
// state (no ClearFunc), and the sweep's runs are counted.
func tableModel(t *testing.T, dl dialect, seed uint64, counted bool) {
	j := newJobsTable(t, dl, true)
	rng := rand.New(rand.NewPCG(seed, 42))
	now := time.UnixMilli(1_800_000_000_000)
	clock := retention.NewManualClock(now)
	type job struct {
		state string
		at    time.Time
	}
	jobs := map[int64]job{}
	var mu sync.Mutex
	clears := map[int64]int{}
	fails := map[int64]bool{}
	clearIDs := func(_ context.Context, _ *sql.Tx, ids []string) error {
		mu.Lock()
		defer mu.Unlock()
		bad := retention.BatchError{}
		for _, s := range ids {
			id, err := strconv.ParseInt(s, 10, 64)
			require.NoError(t, err)
			if fails[id] {
				bad[s] = errors.New("refused")
			}
		}
		if len(bad) > 0 {
			return bad
		}
		for _, s := range ids {
			id, _ := strconv.ParseInt(s, 10, 64)
			clears[id]++
		}
		return nil
	}
	if counted {
		clearIDs = nil
	}
	a := &runCounter{atomicStore: j.kv(t).WithClear(clearIDs)}
	const retentionD = time.Hour
	cfg := retention.Config{Prefix: tablePrefix, Retention: retentionD, Clock: clock,
		BatchSize: 8, PageSize: 32, RetryDelay: time.Minute, MaxRetryDelay: time.Minute}
	lags := &lagCounter{}
	if seed%2 == 1 {
		cfg.Observer = lags // counted runs asked for their times
		defer func() { assert.Positive(t, lags.n.Load(), "lags observed") }()
	}
	s, err := retention.New(a, cfg)
	require.NoError(t, err)
	ctx := context.Background()
	next := int64(1)
	for round := range 12 {
		var live []int64
		for id := range jobs {
			live = append(live, id)
		}
		for range rng.IntN(40) {
			id := next
			at := clock.Now().Add(-time.Duration(rng.IntN(3*3600)) * time.Second)
			if len(live) > 0 && rng.IntN(4) == 0 {
				// Runs again, or finishes again, now.
				id, at = live[rng.IntN(len(live))], clock.Now().Add(-time.Duration(rng.IntN(600))*time.Second)
			} else {
				next++
			}
			st := []string{"done", "failed", "running", "cancelled"}[rng.IntN(4)]
			mu.Lock()
			fails[id] = !counted && round < 9 && rng.IntN(6) == 0
			mu.Unlock()
			j.finish(t, id, st, at)
			jobs[id] = job{st, at}
		}
		before := clock.Now()
		_, err := s.Pass(ctx)
		require.NoError(t, err, "round %d", round)
		left, _ := j.ids(t)
		for id, jb := range jobs {
			marker := jb.state == "done" || jb.state == "failed"
			expired := marker && before.Sub(jb.at) > retentionD
			if !left[id] {
				require.True(t, expired, "round %d: job %d (%s at %v) deleted, not an expired marker", round, id, jb.state, jb.at)
				delete(jobs, id)
			}
		}
		clock.Advance(time.Duration(rng.IntN(20)+1) * time.Minute)
		if round == 9 {
			mu.Lock()
			clear(fails)
			mu.Unlock()
		}
	}
	clock.Advance(2 * time.Minute)
	_, err = s.Pass(ctx)
	require.NoError(t, err)
	left, _ := j.ids(t)
	for id, jb := range jobs {
		marker := jb.state == "done" || jb.state == "failed"
		if marker && clock.Now().Sub(jb.at) > retentionD+time.Minute {
			assert.False(t, left[id], "expired job %d (%s at %v) never cleared", id, jb.state, jb.at)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range clears {
		assert.LessOrEqual(t, n, 1, "job %d cleared %d times", id, n)
	}
	if counted {
		assert.Positive(t, a.counts, "counted runs")
	} else {
		assert.Zero(t, a.counts, "counted runs with a ClearFunc")
	}
}

// TestTableSweepReadsNoPageOfRows: a sweep over an AtomicTableKV clears
// the expired rows in runs, one ClearRun a batch, and scans no page of the
// rows' range, however many there are; an idle pass reads one key of it.
func TestTableSweepReadsNoPageOfRows(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		now := time.UnixMilli(1_800_000_000_000)
		for i := range 250 {
			j.finish(t, int64(i+1), "done", now.Add(-2*time.Hour+time.Duration(i)*time.Millisecond))
		}
		j.finish(t, 1000, "done", now.Add(-time.Minute)) // not expired
		c := &runCounter{atomicStore: j.atomic(t)}
		s, err := retention.New(c, retention.Config{Prefix: tablePrefix, Retention: time.Hour,
			Clock: retention.NewManualClock(now), BatchSize: 50, PageSize: 50})
		require.NoError(t, err)
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 250, st.Cleared)
		assert.Equal(t, 6, c.runs, "runs: 5 of 50 and the short one that ends the range")
		rows := 0
		for _, r := range c.scans {
			if string(r[0]) >= tablePrefix+"0" && string(r[0]) < tablePrefix+":" && string(r[1]) != tablePrefix+":" {
				rows++ // a page of the expired rows
			}
		}
		assert.Zero(t, rows, "pages of rows scanned: %q", c.scans)
		before := len(c.scans)
		st, err = s.Pass(context.Background())
		require.NoError(t, err)
		assert.Zero(t, st.Cleared)
		assert.LessOrEqual(t, len(c.scans)-before, 2, "an idle pass's Scans: %q", c.scans[before:])
	})
}

// TestTableWithoutFilterRetriesFailedClears: over a table with no filter
// (every row with a finish time is a marker), a clear that failed is
// retried from the side table, and its row cleared then.
func TestTableWithoutFilterRetriesFailedClears(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		now := time.UnixMilli(1_800_000_000_000)
		for id := int64(1); id <= 3; id++ {
			j.finish(t, id, "done", now.Add(-2*time.Hour+time.Duration(id)*time.Millisecond))
		}
		kv, err := sqlkv.NewTable(context.Background(), j.side, sqlkv.Table{Name: j.name, ID: "id", Time: "finished",
			TimeUnit: j.unit, Prefix: tablePrefix})
		require.NoError(t, err)
		var failed atomic.Bool
		a := kv.WithClear(func(_ context.Context, _ *sql.Tx, ids []string) error {
			if slices.Contains(ids, fmt.Sprintf("%020d", 2)) && !failed.Swap(true) {
				return retention.BatchError{fmt.Sprintf("%020d", 2): errors.New("once")}
			}
			return nil
		})
		clock := retention.NewManualClock(now)
		for _, conc := range []int{1, 2} {
			s, err := retention.New(a, retention.Config{Prefix: tablePrefix, Retention: time.Hour, Clock: clock,
				Concurrency: conc, RetryDelay: time.Minute})
			require.NoError(t, err)
			_, err = s.Pass(context.Background())
			require.NoError(t, err)
			clock.Advance(2 * time.Minute)
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Zero(t, st.Failed, "Concurrency %d: the retry failed", conc)
			jobs, _ := j.ids(t)
			assert.Empty(t, jobs, "Concurrency %d", conc)
			failed.Store(false)
			for id := int64(1); id <= 3; id++ {
				j.finish(t, id, "done", clock.Now().Add(-2*time.Hour+time.Duration(id)*time.Millisecond))
			}
		}
	})
}

// TestTablePutKeyOfARowIsItsOneMarker: a key Put for a row's id at
// another time (a deadline of its own, say) is the entity's one marker:
// its row is not, and a clear, a Delete or a Move of that key takes it.
func TestTablePutKeyOfARowIsItsOneMarker(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		a := j.atomic(t)
		ctx := context.Background()
		at := time.UnixMilli(1_700_000_000_000)
		later := at.Add(time.Hour)
		for id := int64(1); id <= 3; id++ {
			j.finish(t, id, "done", at)
			require.NoError(t, a.Put(ctx, rowKey(t, later, id), nil))
		}
		keys, err := a.Scan(ctx, []byte(tablePrefix), []byte(tablePrefix+":"), 10)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, later, 1)), string(rowKey(t, later, 2)), string(rowKey(t, later, 3))}, keyStrings(keys),
			"the Put keys, not the rows")

		require.NoError(t, a.ClearAndDelete(ctx, []string{fmt.Sprintf("%020d", 1)}, [][]byte{rowKey(t, later, 1)}))
		require.NoError(t, a.Delete(ctx, rowKey(t, later, 2)))
		retry := []byte(tablePrefix + "r" + fmt.Sprintf("%020d/%020d/1/%020d", later.Add(time.Minute).UnixMilli(), later.UnixMilli(), 3))
		require.NoError(t, a.Move(ctx, [][]byte{rowKey(t, later, 3)}, [][]byte{retry}))
		jobs, arts := j.ids(t)
		assert.Equal(t, map[int64]bool{3: true}, jobs, "the cleared and the deleted keys' rows went")
		assert.Equal(t, map[int64]bool{2: true, 3: true}, arts, "the cleared job's artifacts went")
		keys, err = a.Scan(ctx, []byte(tablePrefix), []byte(tablePrefix+"\xff"), 10)
		require.NoError(t, err)
		assert.Equal(t, []string{string(retry)}, keyStrings(keys), "the moved key, its row still shadowed")
	})
}

// postgresTable creates a table of PostgreSQL, its columns as given, with
// an index on (finished, id), and a side table; both dropped when t ends.
func postgresTable(t *testing.T, db *sql.DB, columns string) (name string, side *sqlkv.KV) {
	t.Helper()
	ctx := context.Background()
	sideName := freshTable(t, db, sqlkv.PostgreSQL)
	name = sideName + "_jobs"
	for _, s := range []string{
		"CREATE TABLE " + name + " (" + columns + ")",
		"CREATE INDEX " + name + "_finished ON " + name + " (finished, id)",
	} {
		_, err := db.ExecContext(ctx, s)
		require.NoError(t, err, s)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name) })
	side, err := sqlkv.New(db, sqlkv.PostgreSQL, sideName)
	require.NoError(t, err)
	return name, side
}

// TestTableRefusesATimestampWithoutZone: a PostgreSQL timestamp without a
// time zone holds the writer's local time; read as UTC, its keys were
// hours early west of Greenwich, and a run deleted a row that had just
// finished.
func TestTableRefusesATimestampWithoutZone(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")+"&timezone=America/New_York")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	name, side := postgresTable(t, db, "id BIGINT PRIMARY KEY, finished timestamp NULL")
	_, err = sqlkv.NewTable(context.Background(), side, sqlkv.Table{Name: name, ID: "id", Time: "finished", Prefix: tablePrefix})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "must be a timestamptz")
}

// TestTableScansPastTheLargestIDOfItsColumn: paging and runs go on past
// the largest id an int4 column holds, where the next page starts at
// that id plus one.
func TestTableScansPastTheLargestIDOfItsColumn(t *testing.T) {
	t.Parallel()
	db := openPostgres(t, "")
	ctx := context.Background()
	name, side := postgresTable(t, db, "id INTEGER PRIMARY KEY, finished timestamptz NULL")
	at := time.UnixMilli(1_700_000_000_000)
	for id, fin := range map[int64]time.Time{math.MaxInt32: at, 1: at.Add(time.Millisecond)} {
		_, err := db.ExecContext(ctx, "INSERT INTO "+name+" (id, finished) VALUES ($1, $2)", id, fin)
		require.NoError(t, err)
	}
	table, err := sqlkv.NewTable(ctx, side, sqlkv.Table{Name: name, ID: "id", Time: "finished", Prefix: tablePrefix})
	require.NoError(t, err)
	end := []byte(tablePrefix + ":")
	keys, err := table.Scan(ctx, []byte(tablePrefix), end, 1)
	require.NoError(t, err)
	require.Equal(t, []string{string(rowKey(t, at, math.MaxInt32))}, keyStrings(keys))
	keys, err = table.Scan(ctx, append(keys[0], 0), end, 1)
	require.NoError(t, err, "the page after id %d", math.MaxInt32)
	assert.Equal(t, []string{string(rowKey(t, at.Add(time.Millisecond), 1))}, keyStrings(keys))
	keys, err = table.WithClear(nil).ClearRun(ctx, tablePrefix, append(rowKey(t, at, math.MaxInt32), 0), end, 1)
	require.NoError(t, err, "the run after id %d", math.MaxInt32)
	assert.Equal(t, []string{string(rowKey(t, at.Add(time.Millisecond), 1))}, keyStrings(keys))
}
