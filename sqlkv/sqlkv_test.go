package sqlkv_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/sqlkv"
)

func TestMain(m *testing.M) {
	spinMain()                            // returns unless this process is a load generator of loadCPU
	leasetest.ReplicaMain(connectReplica) // returns unless this process is a replica of TestProcesses
	parallelByDefault()
	// database/sql closes idle connections from a goroutine of its own
	// that outlives a closed DB for a moment.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// minParallel is how many tests of the package run at once unless -parallel
// says otherwise. The default, GOMAXPROCS, would leave them waiting in
// turn on 2 cores: they spend their time waiting for the databases, for
// leases to expire and for replica processes, not computing. Eight at
// once on a loaded 2-core machine ran past the suites' own deadlines
// (kvtest's, the process proofs' 30s for a replica to start).
const minParallel = 4

// parallelByDefault raises -test.parallel to minParallel when the command
// line did not set it.
func parallelByDefault() {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < minParallel {
		if err := flag.Set("test.parallel", strconv.Itoa(minParallel)); err != nil {
			panic(err)
		}
	}
}

// dialect is one database the tests run against.
type dialect struct {
	name string
	d    sqlkv.Dialect
	// open returns a new *sql.DB of the test database, closed when t ends;
	// for SQLite, of the file path (a new one in t's temporary directory
	// when path is "").
	open func(t testing.TB, path string) *sql.DB
}

var dialects = []dialect{
	{"SQLite", sqlkv.SQLite, openSQLite},
	{"MySQL", sqlkv.MySQL, openMySQL},
	{"PostgreSQL", sqlkv.PostgreSQL, openPostgres},
}

// forEach runs f as a subtest per dialect, the three side by side: each
// makes its own tables, or its own SQLite file.
func forEach(t *testing.T, f func(t *testing.T, dl dialect)) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			t.Parallel()
			f(t, dl)
		})
	}
}

// sqliteDSN is how the tests, and the package documentation, open SQLite:
// wait for a busy database rather than fail, WAL so readers do not block
// the writer, and BEGIN IMMEDIATE so a transaction takes the write lock
// first. synchronous=NORMAL, unlike the documentation, leaves out the
// fsync of every commit, as the test servers run without fsync: WAL stays
// safe when a process is killed, which is all the crash tests do.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

func openSQLite(t testing.TB, path string) *sql.DB {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "markers.db")
	}
	db, err := sql.Open("sqlite", sqliteDSN(path))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// idleConns is how many idle connections the tests' pools keep: enough
// for kvtest.Benchmark's Concurrency 16 and a lease (see the package
// documentation).
const idleConns = 18

func openMySQL(t testing.TB, _ string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", kvtest.ServerAddr(t, "RETENTION_MYSQL_DSN"))
	require.NoError(t, err)
	db.SetMaxIdleConns(idleConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func openPostgres(t testing.TB, _ string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
	require.NoError(t, err)
	db.SetMaxIdleConns(idleConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

var tableSeq atomic.Int64

// freshTable returns the name of a new, migrated marker table that is
// dropped when t ends.
func freshTable(t testing.TB, db *sql.DB, d sqlkv.Dialect) string {
	t.Helper()
	name := fmt.Sprintf("sqlkv_markers_%d_%d", os.Getpid(), tableSeq.Add(1))
	ctx := context.Background()
	_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
	require.NoError(t, err)
	require.NoError(t, sqlkv.Migrate(ctx, db, d, name))
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name)
		assert.NoError(t, err)
	})
	return name
}

func (dl dialect) store(t testing.TB) kvtest.Store {
	db := dl.open(t, "")
	table := freshTable(t, db, dl.d)
	kv, err := sqlkv.New(db, dl.d, table)
	require.NoError(t, err)
	return kvtest.Store{
		KV:  kv,
		Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) },
		PutMany: func(ctx context.Context, keys [][]byte) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			for _, k := range keys {
				if err := kv.MarkKeyTx(ctx, tx, k); err != nil {
					// PutMany takes any key, not only markers.
					if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (marker) VALUES ("+ph(dl.d, 1)+")", k); err != nil {
						return err
					}
				}
			}
			return tx.Commit()
		},
	}
}

// insertRows inserts a row per argument through tx, 500 rows a
// statement: insert is the statement up to VALUES, row one row's
// parenthesised values with one ? for the argument.
func insertRows(ctx context.Context, tx *sql.Tx, d sqlkv.Dialect, insert, row string, args []any) error {
	for len(args) > 0 {
		part := args[:min(500, len(args))]
		args = args[len(part):]
		rows := strings.Repeat(", "+row, len(part))[2:]
		if _, err := tx.ExecContext(ctx, q(d, insert+rows), part...); err != nil {
			return err
		}
	}
	return nil
}

// anyOf returns s as statement arguments.
func anyOf[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// ph is the i-th placeholder of the dialect.
func ph(d sqlkv.Dialect, i int) string {
	if d == sqlkv.PostgreSQL {
		return fmt.Sprintf("$%d", i)
	}
	return "?"
}

// q rewrites the ? placeholders of a test's statement for the dialect.
func q(d sqlkv.Dialect, s string) string {
	if d != sqlkv.PostgreSQL {
		return s
	}
	var b strings.Builder
	n := 0
	for _, r := range s {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestConformance(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) { kvtest.Run(t, dl.store) })
}

// TestConformanceAtomicKV runs the suite over an AtomicKV, a
// retention.RunClearer, on each dialect: it checks ClearRun's keys, so
// its ClearFunc clears nothing; the tests of atomic_test.go check what a
// ClearFunc clears.
func TestConformanceAtomicKV(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) { kvtest.Run(t, dl.atomicStore) })
}

// atomicStore is a kvtest.Store over an AtomicKV of the dialect whose
// ClearFunc clears nothing.
func (dl dialect) atomicStore(t testing.TB) kvtest.Store {
	s := dl.store(t)
	akv, err := s.KV.(*sqlkv.KV).WithClear(func(context.Context, *sql.Tx, []string) error { return nil })
	require.NoError(t, err)
	s.KV = akv
	return s
}

func BenchmarkSweep(b *testing.B) {
	for _, dl := range dialects {
		b.Run(dl.name, func(b *testing.B) { kvtest.Benchmark(b, dl.store) })
	}
}

// BenchmarkSweepAtomic is BenchmarkSweep over an AtomicKV of each dialect:
// runs at concurrency 1, ClearAndDelete at 16.
func BenchmarkSweepAtomic(b *testing.B) {
	for _, dl := range dialects {
		b.Run(dl.name, func(b *testing.B) { kvtest.Benchmark(b, dl.atomicStore) })
	}
}

// TestMySQLLongestMarkerIsParked: a marker of MaxMarkerKeyLen bytes, whose
// clear always fails, is rescheduled and then parked within the MySQL
// column; MarkKeyTx and Put (which retention.Mark calls) refuse one byte
// more, naming the length that fits, so that no marker the sweep cannot
// move is ever written.
func TestMySQLLongestMarkerIsParked(t *testing.T) {
	db := openMySQL(t, "")
	ctx := context.Background()
	kv, err := sqlkv.New(db, sqlkv.MySQL, freshTable(t, db, sqlkv.MySQL))
	require.NoError(t, err)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prefix := "jobs/"
	// A long prefix, since an id is at most retention.MaxIDLen bytes.
	for len(prefix)+retention.TimestampWidth+1+retention.MaxIDLen < sqlkv.MaxMarkerKeyLen {
		prefix = "x" + prefix
	}
	id := strings.Repeat("i", sqlkv.MaxMarkerKeyLen-len(prefix)-retention.TimestampWidth-1)
	key, err := retention.MarkerKey(prefix, at, id)
	require.NoError(t, err)
	require.Len(t, key, sqlkv.MaxMarkerKeyLen)

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	long := append(append([]byte{}, key[:len(key)-len(id)]...), id+"i"...)
	err = kv.MarkKeyTx(ctx, tx, long)
	require.ErrorIs(t, err, sqlkv.ErrKeyTooLong)
	assert.Contains(t, err.Error(), fmt.Sprintf("at most %d bytes", sqlkv.MaxMarkerKeyLen))
	err = kv.Put(ctx, long, nil)
	require.ErrorIs(t, err, sqlkv.ErrKeyTooLong, "Put of a marker one byte longer")
	assert.Contains(t, err.Error(), fmt.Sprintf("at most %d bytes", sqlkv.MaxMarkerKeyLen))
	require.NoError(t, kv.MarkKeyTx(ctx, tx, key))
	require.NoError(t, tx.Commit())

	clock := retention.NewManualClock(at.Add(time.Hour))
	sweep, err := retention.New(kv, retention.Config{
		Prefix: prefix, Retention: time.Minute, Clock: clock, MaxAttempts: 2,
		RetryDelay: time.Second, MaxRetryDelay: time.Second,
		Clear: func(context.Context, string) error { return errors.New("always fails") },
	})
	require.NoError(t, err)
	st, err := sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Retried, "Pass() retried %d, want the marker rescheduled", st.Retried)
	left, err := kv.Scan(ctx, key, append(append([]byte{}, key...), 0), 1)
	require.NoError(t, err)
	assert.Empty(t, left, "the marker was not moved to its retry key")
	clock.Advance(time.Minute)
	st, err = sweep.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Parked, "Pass() parked %d, want the marker parked", st.Parked)
	parked, err := sweep.Parked(ctx, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
}
