package sqlkv_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/sqlkv"
)

const leaseTTL = 1500 * time.Millisecond

// sqliteLeaseTTL is the fleet proofs' TTL on SQLite: its renewals queue
// for the file's one write lock behind every replica's writes (SQLite's
// busy handler is not fair: a waiter sleeps and retries while others take
// the lock), and under the race detector on a loaded machine 1.5s, and in
// CI 4s, left them too little room (a lease lost to a late renewal is
// cleared again by the next holder).
const sqliteLeaseTTL = 10 * time.Second

// freshLeaseTable returns the name of a new, migrated lease table that is
// dropped when t ends.
func freshLeaseTable(t testing.TB, db *sql.DB, d sqlkv.Dialect) string {
	t.Helper()
	name := fmt.Sprintf("sqlkv_leases_%d_%d", os.Getpid(), tableSeq.Add(1))
	require.NoError(t, sqlkv.MigrateLeases(context.Background(), db, d, name))
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

// expireLease ends the lease called name from outside, as an operator would,
// without telling its holder.
func expireLease(t testing.TB, db *sql.DB, d sqlkv.Dialect, table, name string) {
	t.Helper()
	now := map[sqlkv.Dialect]string{
		sqlkv.MySQL:      "UTC_TIMESTAMP(6)",
		sqlkv.SQLite:     "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
		sqlkv.PostgreSQL: "clock_timestamp()",
	}[d]
	_, err := db.ExecContext(context.Background(), q(d, "UPDATE "+table+" SET expires_at = "+now+" WHERE name = ?"), name)
	require.NoError(t, err)
}

func (dl dialect) harness(t testing.TB) leasetest.Harness {
	path := ""
	if dl.d == sqlkv.SQLite {
		path = t.TempDir() + "/fleet.db"
	}
	admin := dl.open(t, path)
	markers := freshTable(t, admin, dl.d)
	state := markers + "_state"
	ctx := context.Background()
	_, err := admin.ExecContext(ctx, "CREATE TABLE "+state+" (id VARCHAR(100) PRIMARY KEY, outcome VARCHAR(20) NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+state) })
	lease := dl.fleetLease(t, admin, "lease-"+markers)
	writer, err := sqlkv.New(admin, dl.d, markers)
	require.NoError(t, err)

	return leasetest.Harness{
		TTL: lease.ttl,
		NewReplica: func(t testing.TB) leasetest.Replica {
			db := dl.open(t, path)
			db.SetMaxOpenConns(4)
			kv, err := sqlkv.New(db, dl.d, markers)
			require.NoError(t, err)
			return leasetest.Replica{
				KV:     kv,
				Locker: lease.locker(t, kv, db),
				Clear: func(ctx context.Context, id string) error {
					_, err := db.ExecContext(ctx, q(dl.d, "DELETE FROM "+state+" WHERE id = ?"), id)
					return err
				},
				// The process dies: its connections close, renewals stop,
				// and nothing is released.
				Kill: func() { _ = db.Close() },
			}
		},
		Finish: func(ctx context.Context, prefix string, ids []string, at time.Time) error {
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := insertRows(ctx, tx, dl.d, "INSERT INTO "+state+" VALUES ", "(?, 'succeeded')", anyOf(ids)); err != nil {
				return err
			}
			for _, id := range ids {
				if err := writer.MarkTx(ctx, tx, prefix, id, at); err != nil {
					return err
				}
			}
			return tx.Commit()
		},
		Present: func(ctx context.Context, ids []string) (map[string]bool, error) {
			return presentIDs(ctx, admin, dl.d, state, "id", ids, func(id string) (any, error) { return id, nil })
		},
		Expire: lease.expire,
	}
}

// presentIDs reports which of ids the column col of table holds; arg
// returns an id's value in the column.
func presentIDs(ctx context.Context, db *sql.DB, d sqlkv.Dialect, table, col string, ids []string, arg func(id string) (any, error)) (map[string]bool, error) {
	present := map[string]bool{}
	for part := 0; part < len(ids); part += 500 {
		chunk := ids[part:min(part+500, len(ids))]
		args := make([]any, len(chunk))
		idOf := make(map[string]string, len(chunk)) // the column's value as text: the id
		for i, id := range chunk {
			v, err := arg(id)
			if err != nil {
				return nil, err
			}
			args[i], idOf[fmt.Sprint(v)] = v, id
		}
		rows, err := db.QueryContext(ctx, q(d, "SELECT "+col+" FROM "+table+" WHERE "+col+" IN (?"+strings.Repeat(", ?", len(chunk)-1)+")"), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				rows.Close()
				return nil, err
			}
			present[idOf[v]] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return present, nil
}

// fleetLease is the lease the replicas of a fleet harness share, with a
// watch that fails the test when one is lost for no reason: no lease may
// be lost while its holder lives and the database answers, only the
// harness's Expire, a Kill or a Release may end one.
type fleetLease struct {
	dl          dialect
	admin       *sql.DB
	table, name string
	ttl         time.Duration
	watch       *leaseWatch
}

// fleetLease makes a lease table in admin's database for a fleet harness's
// lease called name.
func (dl dialect) fleetLease(t testing.TB, admin *sql.DB, name string) *fleetLease {
	l := &fleetLease{dl: dl, admin: admin, table: freshLeaseTable(t, admin, dl.d), name: name, ttl: leaseTTL, watch: &leaseWatch{}}
	if dl.d == sqlkv.SQLite {
		l.ttl = sqliteLeaseTTL
	}
	t.Cleanup(func() {
		if lost := l.watch.unexplained(); lost != "" {
			t.Errorf("a lease was lost while its holder lived and the database answered: %s", lost)
		}
	})
	return l
}

// locker returns a replica's Locker of the lease, over kv and its db.
func (l *fleetLease) locker(t testing.TB, kv *sqlkv.KV, db *sql.DB) retention.Locker {
	locker, err := sqlkv.NewLocker(kv, l.name, &sqlkv.LockerOptions{TTL: l.ttl, Table: l.table})
	require.NoError(t, err)
	return watchedLocker{Locker: locker, watch: l.watch, db: db}
}

// expire takes the lease away from its holder from outside.
func (l *fleetLease) expire(t testing.TB) {
	l.watch.takenAway.Store(true)
	expireLease(t, l.admin, l.dl.d, l.table, l.name)
}

// leaseWatch records the leases of a fleet harness lost for no reason:
// neither released, nor taken away by the harness, nor lost with their
// holder's *sql.DB closed (a Kill, or the end of the test).
type leaseWatch struct {
	takenAway atomic.Bool
	mu        sync.Mutex
	lost      []string
}

func (w *leaseWatch) unexplained() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lost, "; ")
}

// watchedLocker hands out its Locker's leases, watched.
type watchedLocker struct {
	retention.Locker
	watch *leaseWatch
	db    *sql.DB
}

func (w watchedLocker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	l, err := w.Locker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	wl := &watchedLease{Lease: l}
	acquired := time.Now()
	go func() {
		<-l.Lost()
		if wl.released.Load() || w.watch.takenAway.Load() || w.db.PingContext(context.Background()) != nil {
			return
		}
		w.watch.mu.Lock()
		w.watch.lost = append(w.watch.lost, fmt.Sprintf("a lease held %v", time.Since(acquired).Round(time.Millisecond)))
		w.watch.mu.Unlock()
	}()
	return wl, nil
}

// watchedLease is a lease that notes its Release, and fences as its own.
type watchedLease struct {
	retention.Lease
	released atomic.Bool
}

func (l *watchedLease) Release(ctx context.Context) error {
	l.released.Store(true)
	return l.Lease.Release(ctx)
}

func (l *watchedLease) Fence(kv retention.KV) (retention.KV, bool) {
	return l.Lease.(retention.Fencer).Fence(kv)
}

func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet proofs take a while")
	}
	// On a machine whose every core is busy, as in production under load:
	// the lease must hold while its holder lives. One fleet at a time: the
	// replicas of a fleet are goroutines of this process, and three
	// fleets side by side, each proof's four replicas and a writer, left
	// a renewal waiting for a core past the TTL (a lease lost that a
	// process of its own would have kept).
	loadCPU(t)
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) { leasetest.Run(t, dl.harness) })
	}
}

func TestNewLocker(t *testing.T) {
	db := openSQLite(t, "")
	kv, err := sqlkv.New(db, sqlkv.SQLite, "markers")
	require.NoError(t, err)
	tests := []struct {
		name    string
		kv      *sqlkv.KV
		lease   string
		opts    *sqlkv.LockerOptions
		wantErr string
	}{
		{"defaults", kv, "sweeper", nil, ""},
		{"zero options", kv, "sweeper", &sqlkv.LockerOptions{}, ""},
		{"ttl and table", kv, "sweeper", &sqlkv.LockerOptions{TTL: time.Second, Table: "app.leases"}, ""},
		{"nil kv", nil, "sweeper", nil, "sqlkv: kv must not be nil"},
		{"empty name", kv, "", nil, "sqlkv: lease name must not be empty"},
		{"short ttl", kv, "sweeper", &sqlkv.LockerOptions{TTL: time.Millisecond}, "sqlkv: LockerOptions.TTL must be at least 100ms, got 1ms"},
		{"negative ttl", kv, "sweeper", &sqlkv.LockerOptions{TTL: -time.Second}, "sqlkv: LockerOptions.TTL must be at least 100ms, got -1s"},
		{"bad table", kv, "sweeper", &sqlkv.LockerOptions{Table: "a."}, `sqlkv: LockerOptions.Table: sqlkv: invalid table name "a.": empty name or schema`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := sqlkv.NewLocker(tt.kv, tt.lease, tt.opts)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, l)
				return
			}
			require.NoError(t, err)
		})
	}
}

func TestAcquireWithoutLeaseTable(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		db := dl.open(t, "")
		kv, err := sqlkv.New(db, dl.d, "markers")
		require.NoError(t, err)
		l, err := sqlkv.NewLocker(kv, "sweeper", &sqlkv.LockerOptions{Table: fmt.Sprintf("missing_leases_%d", os.Getpid())})
		require.NoError(t, err)
		_, err = l.TryAcquire(context.Background())
		require.ErrorIs(t, err, sqlkv.ErrNoLeaseTable)
		assert.NotErrorIs(t, err, sqlkv.ErrNoTable, "the marker table is not the one missing")
	})
}

// TestLeaseRenewedPastTTL holds a lease past its TTL: renewals keep it,
// Release frees it at once, and the fence grows with every acquisition.
func TestLeaseRenewedPastTTL(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		db := dl.open(t, "")
		table := freshLeaseTable(t, db, dl.d)
		ctx := context.Background()
		kv, err := sqlkv.New(db, dl.d, "markers")
		require.NoError(t, err)
		// Past the TTL, four renewals. The lease is lost only when no
		// renewal gets through for most of a TTL, which a busy machine
		// (every core loaded, the tests beside this one writing to
		// SQLite) must not cause: the TTL leaves a renewal seconds.
		const ttl = 3 * time.Second
		a, err := sqlkv.NewLocker(kv, "renewed", &sqlkv.LockerOptions{TTL: ttl, Table: table})
		require.NoError(t, err)
		lease, err := a.TryAcquire(ctx)
		require.NoError(t, err)
		time.Sleep(ttl + ttl/3)
		select {
		case <-lease.Lost():
			t.Fatal("the lease was lost while its holder renewed it")
		default:
		}
		_, err = a.TryAcquire(ctx)
		require.ErrorIs(t, err, retention.ErrLeaseHeld)
		require.NoError(t, lease.Release(ctx))
		again, err := a.TryAcquire(ctx)
		require.NoError(t, err, "TryAcquire right after Release")
		var fence int64
		require.NoError(t, db.QueryRowContext(ctx, "SELECT fence FROM "+table+" WHERE name = 'renewed'").Scan(&fence))
		assert.Equal(t, int64(2), fence, "the fencing counter grows with every acquisition")
		require.NoError(t, again.Release(ctx))
	})
}

// TestTakeoverWaitsForFencedWrite: on MySQL and PostgreSQL, a takeover
// updates the lease row, so it waits for a transaction that locked it the
// way a fenced write does, and the old holder's later writes are refused.
func TestTakeoverWaitsForFencedWrite(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		if dl.d == sqlkv.SQLite {
			t.Skip("SQLite runs one writer at a time")
		}
		db := dl.open(t, "")
		markers := freshTable(t, db, dl.d)
		leases := freshLeaseTable(t, db, dl.d)
		ctx := context.Background()
		kv, err := sqlkv.New(db, dl.d, markers)
		require.NoError(t, err)
		a, err := sqlkv.NewLocker(kv, "fenced", &sqlkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
		require.NoError(t, err)
		lease, err := a.TryAcquire(ctx)
		require.NoError(t, err)
		defer func() { _ = lease.Release(ctx) }()
		fenced, ok := lease.(retention.Fencer).Fence(kv)
		require.True(t, ok)
		require.NoError(t, kv.Put(ctx, []byte("k1"), nil))
		require.NoError(t, kv.Put(ctx, []byte("k2"), nil))

		lock := " FOR SHARE"
		if dl.d == sqlkv.MySQL {
			lock = " LOCK IN SHARE MODE"
		}
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = tx.ExecContext(ctx, "SELECT 1 FROM "+leases+" WHERE name = 'fenced'"+lock)
		require.NoError(t, err)

		done := make(chan error, 1)
		go func() {
			_, err := db.ExecContext(ctx, "UPDATE "+leases+" SET holder = 'thief', fence = fence + 1 WHERE name = 'fenced'")
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("the takeover did not wait for the row lock: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(t, tx.Commit())
		require.NoError(t, <-done)

		require.ErrorIs(t, fenced.Delete(ctx, []byte("k1")), retention.ErrLeaseLost)
		require.ErrorIs(t, fenced.(retention.Putter).Put(ctx, []byte("k3"), nil), retention.ErrLeaseLost)
		keys, err := kv.Scan(ctx, []byte("k"), []byte("l"), 10)
		require.NoError(t, err)
		assert.Equal(t, [][]byte{[]byte("k1"), []byte("k2")}, keys, "refused writes change nothing")
		select {
		case <-lease.Lost():
		default:
			t.Error("Lost is open after a refused write")
		}
	})
}

// proofLease is the lease name of the process proofs.
const proofLease = "proof"

// connectReplica connects a replica process of TestProcesses: store is
// "dialect,file,markers,leases" (file: the SQLite database, else empty),
// or for TestProcessesAtomic "dialect,file,markers,leases,jobs,cleared":
// the replica then clears with an AtomicKV, a RunClearer, that deletes the
// jobs and records each clear in the cleared table, in the transaction
// that deletes their markers.
func connectReplica(ctx context.Context, addr, store string, ttl time.Duration) (retention.KV, retention.Locker, func(), error) {
	parts := strings.Split(store, ",")
	name, target, markers, leases := parts[0], parts[1], parts[2], parts[3]
	var (
		db  *sql.DB
		err error
		d   sqlkv.Dialect
	)
	switch name {
	case "SQLite":
		d = sqlkv.SQLite
		db, err = sql.Open("sqlite", sqliteDSN(target))
	case "MySQL":
		d = sqlkv.MySQL
		// Through the proxy: replace the DSN's address.
		dsn := os.Getenv("RETENTION_MYSQL_DSN")
		start, end := strings.Index(dsn, "tcp("), strings.Index(dsn, ")/")
		db, err = sql.Open("mysql", dsn[:start]+"tcp("+addr+dsn[end:])
	case "PostgreSQL":
		d = sqlkv.PostgreSQL
		var u *url.URL
		if u, err = url.Parse(os.Getenv("RETENTION_POSTGRES_DSN")); err == nil {
			u.Host = addr
			db, err = sql.Open("pgx", u.String())
		}
	}
	if err != nil {
		return nil, nil, nil, err
	}
	db.SetMaxOpenConns(4)
	kv, err := sqlkv.New(db, d, markers)
	if err != nil {
		_ = db.Close()
		return nil, nil, nil, err
	}
	locker, err := sqlkv.NewLocker(kv, proofLease, &sqlkv.LockerOptions{TTL: ttl, Table: leases})
	if err != nil {
		_ = db.Close()
		return nil, nil, nil, err
	}
	if len(parts) < 6 {
		return kv, locker, func() { _ = db.Close() }, nil
	}
	jobs, cleared := parts[4], parts[5]
	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		// Two statements a batch, as a service would write them: the
		// replicas of a loaded machine keep up with the proofs' pace.
		in := strings.Repeat(", ?", len(ids))[2:]
		if _, err := tx.ExecContext(ctx, q(d, "DELETE FROM "+jobs+" WHERE id IN ("+in+")"), anyOf(ids)...); err != nil {
			return err
		}
		return insertRows(ctx, tx, d, "INSERT INTO "+cleared+" (id) VALUES ", "(?)", anyOf(ids))
	})
	if err != nil {
		_ = db.Close()
		return nil, nil, nil, err
	}
	return akv, locker, func() { _ = db.Close() }, nil
}

// processEngine is the leasetest.Engine of the dialect; with atomic, its
// replicas clear through a fenced AtomicKV, by runs.
func (dl dialect) processEngine(t *testing.T, atomic bool) leasetest.Engine {
	ctx := context.Background()
	addr := "127.0.0.1:1" // SQLite: the replicas open the file, not the proxy
	switch dl.d {
	case sqlkv.MySQL:
		dsn := kvtest.ServerAddr(t, "RETENTION_MYSQL_DSN")
		addr = dsn[strings.Index(dsn, "tcp(")+4 : strings.Index(dsn, ")/")]
	case sqlkv.PostgreSQL:
		u, err := url.Parse(kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN"))
		require.NoError(t, err)
		addr = u.Host
	}
	var file string
	if dl.d == sqlkv.SQLite {
		file = filepath.Join(t.TempDir(), "proof.db")
	}
	admin := dl.open(t, file)
	table := func(store string, i int) string { return strings.Split(store, ",")[i] }
	count := func(ctx context.Context, table string) (int, error) {
		var n int
		err := admin.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n)
		return n, err
	}
	e := leasetest.Engine{
		Addr:    addr,
		TTL:     1500 * time.Millisecond,
		Connect: connectReplica,
		Setup: func(t testing.TB, keys [][]byte) string {
			markers, leases := freshTable(t, admin, dl.d), freshLeaseTable(t, admin, dl.d)
			store := []string{dl.name, file, markers, leases}
			var ids []string
			if atomic {
				jobs, cleared := markers+"_jobs", markers+"_cleared"
				for _, s := range []string{"CREATE TABLE " + jobs + " (id VARCHAR(100) PRIMARY KEY)", "CREATE TABLE " + cleared + " (id VARCHAR(100) NOT NULL)"} {
					_, err := admin.ExecContext(ctx, s)
					require.NoError(t, err)
				}
				t.Cleanup(func() {
					_, _ = admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs)
					_, _ = admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+cleared)
				})
				store = append(store, jobs, cleared)
				for _, k := range keys {
					_, id, err := retention.ParseMarkerKey("proof/", k)
					require.NoError(t, err)
					ids = append(ids, string(id))
				}
			}
			tx, err := admin.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, insertRows(ctx, tx, dl.d, "INSERT INTO "+markers+" (marker) VALUES ", "(?)", anyOf(keys)))
			if atomic {
				require.NoError(t, insertRows(ctx, tx, dl.d, "INSERT INTO "+store[4]+" (id) VALUES ", "(?)", anyOf(ids)))
			}
			require.NoError(t, tx.Commit())
			return strings.Join(store, ",")
		},
		TakeAway: func(t testing.TB, store string) {
			expireLease(t, admin, dl.d, table(store, 3), proofLease)
		},
		Remaining: func(ctx context.Context, store string) (int, error) { return count(ctx, table(store, 2)) },
	}
	if atomic {
		e.Duplicates = func(ctx context.Context, store string) (int, error) {
			markers, jobs, cleared := table(store, 2), table(store, 4), table(store, 5)
			var dups int
			err := admin.QueryRowContext(ctx, "SELECT count(*) FROM (SELECT id FROM "+cleared+" GROUP BY id HAVING count(*) > 1) d").Scan(&dups)
			if err != nil {
				return 0, err
			}
			// Atomic both ways: an entity is gone exactly when its marker is.
			nm, err := count(ctx, markers)
			if err != nil {
				return 0, err
			}
			nj, err := count(ctx, jobs)
			if err != nil {
				return 0, err
			}
			if nm != nj {
				return 0, fmt.Errorf("%d markers but %d jobs left: a marker went without its entity, or the reverse", nm, nj)
			}
			return dups, nil
		}
		e.Runs = true
	}
	return e
}

func TestProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	forEach(t, func(t *testing.T, dl dialect) { leasetest.RunProcesses(t, dl.processEngine(t, false)) })
}

// TestProcessesAtomic runs the process proofs with replicas that clear
// through a fenced AtomicKV, by runs (ClearRun): each entity is cleared
// exactly once across the fleet, even when the lease is taken away
// mid-pass, a holder's host crashes, or a holder freezes past its TTL in a
// run.
func TestProcessesAtomic(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	forEach(t, func(t *testing.T, dl dialect) { leasetest.RunProcesses(t, dl.processEngine(t, true)) })
}

// TestLeaseHeldUnderLoad: a holder keeps its lease for three TTLs while
// every CPU is busy, its pool's every other connection is taken by
// writers (fenced Puts and Deletes of its KV, and application
// transactions that write and linger), and, on SQLite, another pool's
// writers take the write lock in turn, each waiting in SQLite's busy
// handler while another holds it: its renewals go through on a connection
// of their own, and on SQLite get the write lock between two writers'.
// The TTL is sized from the stall the test imposes on a renewal: the
// writers' turns at the locks, measured, and stretched by the load.
func TestLeaseHeldUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("holds a lease for three TTLs")
	}
	loadCPU(t)
	forEach(t, func(t *testing.T, dl dialect) {
		path := ""
		if dl.d == sqlkv.SQLite {
			path = filepath.Join(t.TempDir(), "load.db")
		}
		db := dl.open(t, path)
		db.SetMaxOpenConns(3)
		markers, leases := freshTable(t, db, dl.d), freshLeaseTable(t, db, dl.d)
		app := markers + "_app"
		ctx := context.Background()
		_, err := db.ExecContext(ctx, "CREATE TABLE "+app+" (id VARCHAR(40) PRIMARY KEY)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+app) })
		kv, err := sqlkv.New(db, dl.d, markers)
		require.NoError(t, err)
		// A writer's turn at the locks is a 10ms linger and its
		// statements, which a machine whose every core is busy (these
		// spinners, the race detector, other tests) stretched to 1.8s at
		// a load of 20 on two cores, and SQLite may hand its write lock to
		// several writers in a row. A TTL of 1s left a renewal 900ms and
		// lost the lease in one run of three there; 3s leaves 2.7s.
		const ttl = 3 * time.Second
		locker, err := sqlkv.NewLocker(kv, "loaded", &sqlkv.LockerOptions{TTL: ttl, Table: leases})
		require.NoError(t, err)
		lease, err := locker.TryAcquire(ctx)
		require.NoError(t, err)
		defer func() { _ = lease.Release(ctx) }()
		fenced, ok := lease.(retention.Fencer).Fence(kv)
		require.True(t, ok)

		stop := make(chan struct{})
		var wg sync.WaitGroup
		var writes atomic.Int64
		var longest atomic.Int64 // the longest application transaction, in ns: a writer's turn at the locks
		took := func(begun time.Time) {
			d := int64(time.Since(begun))
			for {
				old := longest.Load()
				if d <= old || longest.CompareAndSwap(old, d) {
					return
				}
			}
		}
		writer := func(db *sql.DB, w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := []byte(fmt.Sprintf("load/%020d/w%d", i, w))
				if fenced.(retention.Putter).Put(ctx, key, nil) == nil && fenced.Delete(ctx, key) == nil {
					writes.Add(2)
				}
				begun := time.Now()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					continue
				}
				if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+app+" VALUES (?)"), fmt.Sprintf("w%d-%d", w, i)); err == nil {
					time.Sleep(10 * time.Millisecond) // the transaction lingers, holding its locks
					if tx.Commit() == nil {
						writes.Add(1)
					}
				}
				_ = tx.Rollback()
				took(begun)
				// Between two transactions the writer does other work,
				// so that the writers hold SQLite's one write lock about
				// 80% of the time: beyond 100%, anything else waits as
				// long as they go on, SQLite having no queue.
				time.Sleep(40 * time.Millisecond)
			}
		}
		for w := range 3 {
			wg.Add(1)
			go writer(db, w)
		}
		if dl.d == sqlkv.SQLite {
			other := dl.open(t, path)
			for w := 3; w < 4; w++ {
				wg.Add(1)
				go writer(other, w)
			}
		}
		select {
		case <-lease.Lost():
			t.Errorf("the lease was lost while its holder lived and the database answered (the longest writer's transaction so far took %v)",
				time.Duration(longest.Load()).Round(time.Millisecond))
		case <-time.After(3 * ttl):
		}
		close(stop)
		wg.Wait()
		t.Logf("%d writes meanwhile; the longest writer's transaction took %v", writes.Load(), time.Duration(longest.Load()).Round(time.Millisecond))
		assert.Positive(t, writes.Load(), "the writers wrote nothing: no load")
	})
}
