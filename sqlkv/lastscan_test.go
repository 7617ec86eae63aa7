package sqlkv_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
	"modernc.org/sqlite"
)

// TestClearAfterScanSeesWritesSince: on SQLite a clear that follows a Scan
// on the same connection skips its read of the range only while nothing
// was written since; a marker deleted and a key written into the range
// meanwhile, which leave the range as many rows as the clear's keys, make
// it refuse (ErrMarkerGone) and change nothing, whichever connection wrote
// them and wherever the table lives.
func TestClearAfterScanSeesWritesSince(t *testing.T) {
	open := func(t *testing.T, path string, attach string) *sql.DB {
		db := openSQLite(t, path)
		db.SetMaxOpenConns(1) // one connection: the Scan's and the clear's
		if attach != "" {
			_, err := db.Exec("ATTACH DATABASE '" + attach + "' AS aux")
			require.NoError(t, err)
		}
		return db
	}
	for _, tc := range []struct {
		name   string
		other  bool // the writes come through another connection
		attach bool // the table lives in an attached database
	}{
		{"same connection", false, false},
		{"another connection", true, false},
		{"another connection, attached database", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			aux, table := "", "markers"
			if tc.attach {
				aux, table = filepath.Join(dir, "aux.db"), "aux.markers"
			}
			db := open(t, filepath.Join(dir, "main.db"), aux)
			writer := db
			if tc.other {
				writer = open(t, filepath.Join(dir, "main.db"), aux)
			}
			require.NoError(t, sqlkv.Migrate(ctx, db, sqlkv.SQLite, table))
			kv, err := sqlkv.New(db, sqlkv.SQLite, table)
			require.NoError(t, err)
			atomicKV, cleared := recordingClear(t, kv)
			keys, ids, between := markerRun(t, 5)
			insertMarkers(t, db, table, keys...)
			page, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
			require.NoError(t, err)
			require.Equal(t, keys, page)

			// As many rows as before: the range's count cannot tell.
			_, err = writer.Exec("DELETE FROM "+table+" WHERE marker = ?", keys[3])
			require.NoError(t, err)
			_, err = writer.Exec("INSERT INTO "+table+" (marker) VALUES (?)", between)
			require.NoError(t, err)

			clearRefused(t, kv, atomicKV, cleared, ids, keys, [][]byte{keys[0], keys[1], between, keys[2], keys[4]})
		})
	}
}

// TestClearAfterScanSkipsItsRead: on SQLite a clear of a run of the page a
// Scan read on the same connection, with nothing written since, deletes
// its markers without reading the range; a second clear, after the first
// wrote, reads it.
func TestClearAfterScanSkipsItsRead(t *testing.T) {
	ctx := context.Background()
	dsn := sqliteDSN(filepath.Join(t.TempDir(), "markers.db"))
	plain, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	reads := 0
	db := sql.OpenDB(hookConnector{drv: plain.Driver(), dsn: dsn, before: func(q string) {
		if strings.HasPrefix(q, "SELECT marker FROM") {
			reads++
		}
	}})
	db.SetMaxOpenConns(1) // one connection: the Scan's and the clear's
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, sqlkv.Migrate(ctx, db, sqlkv.SQLite, "markers"))
	kv, err := sqlkv.New(db, sqlkv.SQLite, "markers")
	require.NoError(t, err)
	atomicKV, err := kv.WithClear(func(context.Context, *sql.Tx, []string) error { return nil })
	require.NoError(t, err)
	keys, ids, _ := markerRun(t, 6)
	insertMarkers(t, db, "markers", keys...)
	_, err = kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
	require.NoError(t, err)
	reads = 0
	require.NoError(t, atomicKV.ClearAndDelete(ctx, ids[:3], keys[:3]))
	assert.Zero(t, reads, "reads of the range by the clear right after the Scan")
	require.NoError(t, atomicKV.ClearAndDelete(ctx, ids[3:], keys[3:]))
	assert.Equal(t, 1, reads, "reads of the range by the clear after another clear")
	left, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
	require.NoError(t, err)
	assert.Empty(t, left, "markers left")
}

// TestClearAfterScanSeesWritesInSharedCache: connections of one process
// that share SQLite's cache (cache=shared) see each other's commits at
// once, with no snapshot of their own; a clear that recalled the Scan's
// page must therefore keep another connection from writing the range
// between its check and its delete, as its read of the range did. A marker
// deleted and another written into the range there, by another connection
// of the shared cache, must make it refuse, or else have waited for it:
// no marker goes whose id the ClearFunc did not clear.
func TestClearAfterScanSeesWritesInSharedCache(t *testing.T) {
	for _, txlock := range []string{"deferred", "immediate"} {
		t.Run(txlock, func(t *testing.T) {
			ctx := context.Background()
			dsn := "file:" + filepath.Join(t.TempDir(), "shared.db") +
				"?cache=shared&_pragma=busy_timeout(20000)&_txlock=" + txlock
			plain, err := sql.Open("sqlite", dsn)
			require.NoError(t, err)
			t.Cleanup(func() { _ = plain.Close() })
			// The sweep's database: its statements pass through before, which
			// runs just before the clear's range delete, once armed.
			var before func()
			db := sql.OpenDB(hookConnector{drv: plain.Driver(), dsn: dsn, before: func(q string) {
				if f := before; f != nil && strings.HasPrefix(q, "DELETE FROM") && strings.Contains(q, "marker >=") {
					before = nil
					f()
				}
			}})
			db.SetMaxOpenConns(1) // one connection: the Scan's and the clear's
			t.Cleanup(func() { _ = db.Close() })
			require.NoError(t, sqlkv.Migrate(ctx, db, sqlkv.SQLite, "markers"))
			kv, err := sqlkv.New(db, sqlkv.SQLite, "markers")
			require.NoError(t, err)
			atomicKV, cleared := recordingClear(t, kv)
			keys, ids, between := markerRun(t, 5)
			insertMarkers(t, db, "markers", keys...)
			idOf := map[string]string{string(between): "2a"}
			for i, key := range keys {
				idOf[string(key)] = ids[i]
			}
			page, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
			require.NoError(t, err)
			require.Equal(t, keys, page)

			// As many rows as before: the range's count cannot tell.
			// A writer the clear's locks hold back waits for its transaction
			// to end: the clear goes on without it after a while.
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
			err = atomicKV.ClearAndDelete(ctx, ids, keys)
			<-wrote
			t.Logf("ClearAndDelete() = %v; the other connection's delete: %v, insert: %v", err, deletedErr, insertedErr)

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

// TestClearAfterScanSeesTableSwappedSince: a table renamed into the
// marker table's name on the Scan's connection, which neither commits from
// another connection nor changes a row, holds other keys than the Scan
// read: the clear must read its range again, and delete nothing whose id
// it did not clear.
func TestClearAfterScanSeesTableSwappedSince(t *testing.T) {
	ctx := context.Background()
	db := openSQLite(t, "")
	db.SetMaxOpenConns(1) // one connection: the Scan's, the swap's and the clear's
	for _, table := range []string{"markers", "staging"} {
		require.NoError(t, sqlkv.Migrate(ctx, db, sqlkv.SQLite, table))
	}
	kv, err := sqlkv.New(db, sqlkv.SQLite, "markers")
	require.NoError(t, err)
	atomicKV, cleared := recordingClear(t, kv)
	keys, ids, between := markerRun(t, 5)
	// staging: as many rows in the range, keys[3] replaced by between.
	for i, key := range keys {
		_, err = db.Exec("INSERT INTO markers (marker) VALUES (?)", key)
		require.NoError(t, err)
		if i == 3 {
			key = between
		}
		_, err = db.Exec("INSERT INTO staging (marker) VALUES (?)", key)
		require.NoError(t, err)
	}
	page, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
	require.NoError(t, err)
	require.Equal(t, keys, page)

	_, err = db.Exec("ALTER TABLE markers RENAME TO markers_old")
	require.NoError(t, err)
	_, err = db.Exec("ALTER TABLE staging RENAME TO markers")
	require.NoError(t, err)

	clearRefused(t, kv, atomicKV, cleared, ids, keys, [][]byte{keys[0], keys[1], between, keys[2], keys[4]})
}

// TestClearAfterScanSeesRestoreSince: a backup restored into the Scan's
// connection (SQLite's backup API, which modernc.org/sqlite's connection
// offers as NewRestore) replaces the database's rows with no commit of
// another connection and no row change counted (only the schema_version
// moves, which the restore raises even from a copy of the file): the clear
// must read its range again, and delete nothing whose id it did not clear.
func TestClearAfterScanSeesRestoreSince(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openSQLite(t, filepath.Join(dir, "markers.db"))
	db.SetMaxOpenConns(1) // one connection: the Scan's, the restore's and the clear's
	require.NoError(t, sqlkv.Migrate(ctx, db, sqlkv.SQLite, "markers"))
	kv, err := sqlkv.New(db, sqlkv.SQLite, "markers")
	require.NoError(t, err)
	atomicKV, cleared := recordingClear(t, kv)
	keys, ids, between := markerRun(t, 5)
	// The backup, a copy of the file: as many rows in the range, keys[3]
	// replaced by between, and the same schema.
	insertMarkers(t, db, "markers", keys[0], keys[1], between, keys[2], keys[4])
	_, err = db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
	require.NoError(t, err)
	file, err := os.ReadFile(filepath.Join(dir, "markers.db"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "backup.db"), file, 0o600))
	_, err = db.Exec("DELETE FROM markers WHERE marker = ?", between)
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO markers (marker) VALUES (?)", keys[3])
	require.NoError(t, err)
	page, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
	require.NoError(t, err)
	require.Equal(t, keys, page)

	type restorer interface {
		NewRestore(string) (*sqlite.Backup, error)
	}
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	require.NoError(t, conn.Raw(func(dc any) error {
		r, err := dc.(restorer).NewRestore("file:" + filepath.Join(dir, "backup.db"))
		if err != nil {
			return err
		}
		if _, err := r.Step(-1); err != nil {
			return err
		}
		return r.Finish()
	}))
	require.NoError(t, conn.Close())

	clearRefused(t, kv, atomicKV, cleared, ids, keys, [][]byte{keys[0], keys[1], between, keys[2], keys[4]})
}

// hookConnector opens connections of drv whose statements pass their text
// to before first.
type hookConnector struct {
	drv    driver.Driver
	dsn    string
	before func(query string)
}

func (c hookConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &hookConn{conn, c.before}, nil
}

func (c hookConnector) Driver() driver.Driver { return c.drv }

// hookConn is a driver's connection whose statements pass their text to
// before first. The driver's connection must implement the context
// interfaces of database/sql/driver, as modernc.org/sqlite's does.
type hookConn struct {
	driver.Conn
	before func(query string)
}

func (c *hookConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *hookConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.before(query)
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *hookConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.before(query)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *hookConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.before(query)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *hookConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *hookConn) IsValid() bool {
	v, ok := c.Conn.(driver.Validator)
	return !ok || v.IsValid()
}

// recordingClear returns an AtomicKV over kv whose ClearFunc records the
// ids it clears in cleared.
func recordingClear(t *testing.T, kv *sqlkv.KV) (a *sqlkv.AtomicKV, cleared map[string]bool) {
	t.Helper()
	cleared = map[string]bool{}
	a, err := kv.WithClear(func(_ context.Context, _ *sql.Tx, ids []string) error {
		for _, id := range ids {
			cleared[id] = true
		}
		return nil
	})
	require.NoError(t, err)
	return a, cleared
}

// markerRun returns the keys of n markers under "jobs/", 1ms apart, with
// ids 1 to n, and the key of a marker "2a" that sorts between the second
// and the third.
func markerRun(t *testing.T, n int) (keys [][]byte, ids []string, between []byte) {
	t.Helper()
	at := time.UnixMilli(1_700_000_000_000)
	for i := range n {
		id := strconv.Itoa(i + 1)
		key, err := retention.MarkerKey("jobs/", at.Add(time.Duration(i)*time.Millisecond), id)
		require.NoError(t, err)
		keys, ids = append(keys, key), append(ids, id)
	}
	between, err := retention.MarkerKey("jobs/", at.Add(time.Millisecond), "2a")
	require.NoError(t, err)
	return keys, ids, between
}

// insertMarkers writes keys into table through db.
func insertMarkers(t *testing.T, db *sql.DB, table string, keys ...[]byte) {
	t.Helper()
	for _, key := range keys {
		_, err := db.Exec("INSERT INTO "+table+" (marker) VALUES (?)", key)
		require.NoError(t, err)
	}
}

// clearRefused clears ids with their markers keys through a and checks
// that the call refused with ErrMarkerGone and changed nothing: no id in
// cleared, and the markers of kv are left.
func clearRefused(t *testing.T, kv *sqlkv.KV, a *sqlkv.AtomicKV, cleared map[string]bool, ids []string, keys, left [][]byte) {
	t.Helper()
	err := a.ClearAndDelete(context.Background(), ids, keys)
	assert.ErrorIs(t, err, retention.ErrMarkerGone, "ClearAndDelete() = %v, want ErrMarkerGone", err)
	assert.Empty(t, cleared, "ids cleared")
	got, err := kv.Scan(context.Background(), []byte("jobs/"), []byte("jobs0"), 10)
	require.NoError(t, err)
	assert.Equal(t, left, got, "markers left")
}
