package sqlkv_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/sqlkv"
)

// TestTableScanReadsAMillisecondOnce: paging through the markers of rows
// that finished in one millisecond (a batch of jobs one statement
// finished, with one timestamp) reads each row from the database a few
// times at most, and so do the runs of an AtomicTableKV: each page read
// the rest of the millisecond, 126,000 rows for 2,000 in pages of 16
// (n²/2p), until b2ded78, and the fleet proofs' 3,000 jobs of one
// millisecond outlasted NoDeleteAfterLoss's two minutes on SQLite. The
// rows the driver hands the client are counted.
func TestTableScanReadsAMillisecondOnce(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		const n, page = 2000, 16
		var read atomic.Int64
		db := countingDB(t, dl, &read)
		side := freshTable(t, db, dl.d)
		jobs := side + "_jobs"
		finished, unit := "finished BIGINT NULL", sqlkv.UnixMilli
		if dl.d == sqlkv.PostgreSQL {
			finished, unit = "finished timestamptz NULL", sqlkv.Timestamp
		}
		ctx := context.Background()
		for _, s := range []string{
			"CREATE TABLE " + jobs + " (id BIGINT PRIMARY KEY, " + finished + ")",
			"CREATE INDEX " + jobs + "_finished ON " + jobs + " (finished, id)",
		} {
			_, err := db.ExecContext(ctx, s)
			require.NoError(t, err, s)
		}
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs) })
		at := time.UnixMilli(1_700_000_000_000)
		var fin any = at.UnixMilli()
		if unit == sqlkv.Timestamp {
			fin = at
		}
		ids := make([]any, 0, n)
		for id := range n {
			ids = append(ids, id+1)
		}
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for i := 0; i < n; i += 500 {
			values := strings.Repeat(", (?, ?)", 500)[2:]
			args := make([]any, 0, 1000)
			for _, id := range ids[i : i+500] {
				args = append(args, id, fin)
			}
			_, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" (id, finished) VALUES "+values), args...)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		kv, err := sqlkv.New(db, dl.d, side)
		require.NoError(t, err)
		table, err := sqlkv.NewTable(ctx, kv, sqlkv.Table{Name: jobs, ID: "id", Time: "finished", TimeUnit: unit, Prefix: tablePrefix})
		require.NoError(t, err)

		read.Store(0)
		got := 0
		from := []byte(tablePrefix)
		for {
			keys, err := table.Scan(ctx, from, []byte(tablePrefix+"\xff"), page)
			require.NoError(t, err)
			for _, k := range keys {
				require.Equal(t, string(rowKey(t, at, int64(got+1))), string(k), "key %d", got)
				got++
			}
			if len(keys) < page {
				break
			}
			from = append(keys[len(keys)-1], 0)
		}
		assert.Equal(t, n, got, "keys")
		assert.LessOrEqual(t, read.Load(), int64(3*n), "rows read to page through %d rows of one millisecond in pages of %d", n, page)

		// Runs of an AtomicTableKV: each finds its end in the millisecond.
		read.Store(0)
		got = 0
		from = []byte(tablePrefix)
		atomic := table.WithClear(nil)
		for {
			keys, err := atomic.ClearRun(ctx, tablePrefix, from, []byte(tablePrefix+"\xff"), page)
			require.NoError(t, err)
			got += len(keys)
			if len(keys) < page {
				break
			}
			from = append(keys[len(keys)-1], 0)
		}
		assert.Equal(t, n, got, "rows cleared")
		assert.LessOrEqual(t, read.Load(), int64(3*n), "rows read to clear %d rows of one millisecond in runs of %d", n, page)
	})
}

// countingDB returns a database of the dialect, closed when t ends, that
// adds to read each row its driver hands the client.
func countingDB(t testing.TB, dl dialect, read *atomic.Int64) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "count.db")
	dsn := sqliteDSN(path)
	switch dl.d {
	case sqlkv.MySQL:
		dsn = kvtest.ServerAddr(t, "RETENTION_MYSQL_DSN")
	case sqlkv.PostgreSQL:
		dsn = kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	}
	db := sql.OpenDB(countingConnector{drv: dl.open(t, path).Driver(), dsn: dsn, read: read})
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// countingConnector opens connections of drv that count the rows their
// queries return.
type countingConnector struct {
	drv  driver.Driver
	dsn  string
	read *atomic.Int64
}

func (c countingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &countingConn{hookConn: &hookConn{conn, func(string) {}}, read: c.read}, nil
}

func (c countingConnector) Driver() driver.Driver { return c.drv }

// countingConn counts the rows of its queries, run directly or prepared.
type countingConn struct {
	*hookConn
	read *atomic.Int64
}

func (c *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rs, err := c.hookConn.QueryContext(ctx, query, args)
	if err != nil {
		return nil, err
	}
	return countingRows{rs, c.read}, nil
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.hookConn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return countingStmt{s, c.read}, nil
}

type countingStmt struct {
	driver.Stmt
	read *atomic.Int64
}

func (s countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	rs, err := s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	return countingRows{rs, s.read}, nil
}

type countingRows struct {
	driver.Rows
	read *atomic.Int64
}

func (r countingRows) Next(dest []driver.Value) error {
	err := r.Rows.Next(dest)
	if err == nil {
		r.read.Add(1)
	}
	return err
}

// tableEnd is the key of millisecond ms under tablePrefix, with no id:
// the end of a sweep's expired range.
func tableEnd(ms int64) []byte {
	return fmt.Appendf(nil, "%s%020d", tablePrefix, ms)
}

// TestTableFilterWithOrBindsInItsParentheses checks that a filter of two conditions
// joined by OR binds inside its parentheses everywhere: a row that passes
// the filter's second condition but is unexpired, running or outside the
// read's range is no marker to any read or write.
func TestTableFilterWithOrBindsInItsParentheses(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		kv, err := sqlkv.NewTable(ctx, j.side, sqlkv.Table{Name: j.name, ID: "id", Time: "finished",
			TimeUnit: j.unit, Filter: "state = 'done' OR state = 'failed'", Prefix: tablePrefix})
		require.NoError(t, err)
		a := kv.WithClear(nil)
		base := time.UnixMilli(1_700_000_000_000)
		expiry := base.Add(time.Hour)
		j.finish(t, 1, "done", base)
		j.finish(t, 2, "failed", base.Add(time.Millisecond))
		j.finish(t, 3, "cancelled", base)                      // filtered out
		j.finish(t, 4, "failed", base)                         // then running: NULL time
		j.finish(t, 5, "failed", expiry.Add(time.Minute))      // unexpired
		j.finish(t, 6, "failed", base.Add(2*time.Millisecond)) // shadowed by a Move
		_, err = j.db.ExecContext(ctx, q(dl.d, "UPDATE "+j.name+" SET finished = NULL WHERE id = ?"), 4)
		require.NoError(t, err)
		retry := fmt.Appendf(nil, "%sr%020d/%020d/1/%020d", tablePrefix, expiry.UnixMilli()+1000, base.Add(2*time.Millisecond).UnixMilli(), 6)
		require.NoError(t, a.Move(ctx, [][]byte{rowKey(t, base.Add(2*time.Millisecond), 6)}, [][]byte{retry}))

		end := tableEnd(expiry.UnixMilli())
		keys, err := a.Scan(ctx, []byte(tablePrefix), end, 100)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, base, 1)), string(rowKey(t, base.Add(time.Millisecond), 2))}, keyStrings(keys))

		// Keys of the rows that are no markers delete nothing.
		require.NoError(t, a.Delete(ctx, rowKey(t, base, 3), rowKey(t, base, 4), rowKey(t, base, 5)))
		err = a.ClearAndDelete(ctx, []string{fmt.Sprintf("%020d", 3)}, [][]byte{rowKey(t, base, 3)})
		require.ErrorIs(t, err, retention.ErrMarkerGone)

		// A run of the expired range takes rows 1 and 2 only.
		keys, err = a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), end, 100)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, base, 1)), string(rowKey(t, base.Add(time.Millisecond), 2))}, keyStrings(keys))
		jobs, _ := j.ids(t)
		assert.Equal(t, map[int64]bool{3: true, 4: true, 5: true, 6: true}, jobs)

		// A run of a range of the future takes the unexpired row only.
		keys, err = a.ClearRun(ctx, tablePrefix, end, []byte(tablePrefix+":"), 100)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, expiry.Add(time.Minute), 5))}, keyStrings(keys))
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true, 4: true, 6: true}, jobs)

		// The retry key of row 6 deletes its row; row 4's never-finished
		// state stays.
		require.NoError(t, a.Delete(ctx, retry))
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true, 4: true}, jobs)
	})
}

// TestTableRowsNoKeyCanNameAreNoMarkers checks rows no key can name: a negative id, no
// finish time, a finish time before 1970 or past retention.MaxMarkerTime.
// No read returns them and no run deletes them; the extreme ids and the
// first and last millisecond a key can carry are markers.
func TestTableRowsNoKeyCanNameAreNoMarkers(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		a := j.atomic(t)
		first, last := time.UnixMilli(0), retention.MaxMarkerTime
		j.finish(t, 0, "done", first)
		j.finish(t, math.MaxInt64, "done", last)
		j.finish(t, 7, "done", time.UnixMilli(1_700_000_000_000))
		// No markers:
		j.finish(t, -1, "done", time.UnixMilli(1_700_000_000_000))
		j.finish(t, 8, "running", time.Time{})
		j.finish(t, 9, "done", time.UnixMilli(-5))
		j.finish(t, 10, "done", last.Add(time.Millisecond))
		want := []string{string(rowKey(t, first, 0)), string(rowKey(t, time.UnixMilli(1_700_000_000_000), 7)), string(rowKey(t, last, math.MaxInt64))}
		for _, page := range []int{1, 2, 100} {
			var got []string
			from := []byte(tablePrefix)
			for {
				keys, err := a.Scan(ctx, from, []byte(tablePrefix+"\xff"), page)
				require.NoError(t, err)
				got = append(got, keyStrings(keys)...)
				if len(keys) < page {
					break
				}
				from = append(keys[len(keys)-1], 0)
			}
			assert.Equal(t, want, got, "pages of %d", page)
		}
		keys, err := a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), []byte(tablePrefix+"\xff"), 100)
		require.NoError(t, err)
		assert.Equal(t, want, keyStrings(keys))
		jobs, arts := j.ids(t)
		assert.Equal(t, map[int64]bool{-1: true, 8: true, 9: true, 10: true}, jobs)
		assert.Equal(t, map[int64]bool{-1: true, 8: true, 9: true, 10: true}, arts)
	})
}

// TestTablePagesAndRunsOfSubMillisecondRowsFollowKeyOrder pages through, and runs over, rows of
// a few milliseconds whose times fall anywhere in them and whose ids are
// in no order of time, on PostgreSQL's timestamptz: every page and every
// run is exactly the next keys in key order.
func TestTablePagesAndRunsOfSubMillisecondRowsFollowKeyOrder(t *testing.T) {
	dl := dialects[2]
	require.Equal(t, sqlkv.PostgreSQL, dl.d)
	t.Parallel()
	j := newJobsTable(t, dl, true)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	base := time.UnixMilli(1_700_000_000_000)
	var want []string
	ids := map[int64]bool{}
	tx, err := j.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for len(ids) < 400 {
		id := rng.Int64N(1000)
		if ids[id] {
			continue
		}
		ids[id] = true
		// 4 milliseconds; some rows on a millisecond's boundary.
		at := base.Add(time.Duration(rng.IntN(4000)) * time.Microsecond)
		if rng.IntN(5) == 0 {
			at = at.Truncate(time.Millisecond)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+j.name+" (id, state, finished) VALUES ($1, 'done', $2)", id, at)
		require.NoError(t, err)
		want = append(want, string(rowKey(t, at, id)))
	}
	require.NoError(t, tx.Commit())
	sortStrings(want)
	a := j.atomic(t)
	for _, page := range []int{1, 3, 17, 64} {
		var got []string
		from := []byte(tablePrefix)
		for {
			keys, err := a.Scan(ctx, from, []byte(tablePrefix+"\xff"), page)
			require.NoError(t, err)
			got = append(got, keyStrings(keys)...)
			if len(keys) < page {
				break
			}
			from = append(keys[len(keys)-1], 0)
		}
		require.Equal(t, want, got, "pages of %d", page)
	}
	// A range that ends inside the third millisecond takes its keys only.
	end := tableEnd(base.UnixMilli() + 2)
	n := 0
	for n < len(want) && want[n] < string(end) {
		n++
	}
	var got []string
	from := []byte(tablePrefix)
	for i := 0; ; i++ {
		limit := []int{1, 5, 13, 2, 40}[i%5]
		keys, err := a.ClearRun(ctx, tablePrefix, from, end, limit)
		require.NoError(t, err)
		require.Equal(t, want[len(got):min(len(got)+limit, n)], keyStrings(keys), "run %d of %d", i, limit)
		got = append(got, keyStrings(keys)...)
		if len(keys) < limit {
			break
		}
		from = append(keys[len(keys)-1], 0)
	}
	assert.Equal(t, want[:n], got)
	var left int
	require.NoError(t, j.db.QueryRowContext(ctx, "SELECT count(*) FROM "+j.name).Scan(&left))
	assert.Equal(t, len(want)-n, left)
}

// TestTableScanWindowsOfEveryShape reads windows [start, end) of every shape (a
// row's key, a key cut short, a key with a byte past '9' or below '0', the
// prefix's neighbours) over rows of sub-millisecond times on PostgreSQL,
// and of whole milliseconds elsewhere: each page is the window's first
// keys, and a run of the window takes exactly them.
func TestTableScanWindowsOfEveryShape(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(3, uint64(len(dl.name))))
		base := time.UnixMilli(1_700_000_000_000)
		var want []string
		ids := map[int64]bool{}
		for len(ids) < 40 {
			id := rng.Int64N(60)
			if rng.IntN(10) == 0 {
				id = math.MaxInt64 - rng.Int64N(3)
			}
			if ids[id] {
				continue
			}
			ids[id] = true
			at := base.Add(time.Duration(rng.IntN(5)) * time.Millisecond)
			if j.unit == sqlkv.Timestamp {
				at = base.Add(time.Duration(rng.IntN(5000)) * time.Microsecond)
			}
			j.finish(t, id, "done", at)
			want = append(want, string(rowKey(t, at, id)))
		}
		sortStrings(want)
		a := j.atomic(t)
		bound := func() []byte {
			k := []byte(want[rng.IntN(len(want))])
			switch rng.IntN(6) {
			case 0:
				return k
			case 1:
				return k[:len(tablePrefix)+rng.IntN(len(k)-len(tablePrefix))]
			case 2:
				i := len(tablePrefix) + rng.IntN(len(k)-len(tablePrefix))
				return append(k[:i:i], []byte{'/', ':', '\xff', '0' - 1, '9' + 1}[rng.IntN(5)])
			case 3:
				return append(k, 0)
			case 4:
				return []byte(tablePrefix)
			}
			return []byte(tablePrefix + ":")
		}
		for range 150 {
			start, end := bound(), bound()
			var in []string
			for _, k := range want {
				if k >= string(start) && k < string(end) {
					in = append(in, k)
				}
			}
			limit := 1 + rng.IntN(8)
			keys, err := a.Scan(ctx, start, end, limit)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprint(in[:min(limit, len(in))]), fmt.Sprint(keyStrings(keys)), "Scan(%q, %q, %d)", start, end, limit)
		}
		// Runs of random windows, rolled back by their clear: each would
		// clear the ids of the window's first keys, ascending.
		stop := errors.New("roll back")
		var cleared []string
		b := j.kv(t).WithClear(func(_ context.Context, _ *sql.Tx, ids []string) error {
			cleared = ids
			return stop
		})
		for range 60 {
			start, end := bound(), bound()
			var in []string
			for _, k := range want {
				if k >= string(start) && k < string(end) {
					in = append(in, k[len(k)-20:])
				}
			}
			limit := 1 + rng.IntN(8)
			cleared = nil
			keys, err := b.ClearRun(ctx, tablePrefix, start, end, limit)
			require.Empty(t, keys)
			if len(in) == 0 {
				require.NoError(t, err, "ClearRun(%q, %q, %d)", start, end, limit)
				continue
			}
			require.ErrorIs(t, err, stop, "ClearRun(%q, %q, %d)", start, end, limit)
			require.Equal(t, in[:min(limit, len(in))], cleared, "ClearRun(%q, %q, %d)", start, end, limit)
		}
		jobs, _ := j.ids(t)
		assert.Len(t, jobs, len(want), "rows left after runs rolled back")
	})
}
