package sqlkv_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
