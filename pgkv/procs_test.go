package pgkv_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/pgkv"
)

// proofLease is the lease name of the process proofs; each proof has a lease
// table of its own.
const proofLease = "proof"

// connectReplica connects a replica process of TestProcesses: store is
// "markers,leases", the two tables, or for TestProcessesAtomic
// "markers,leases,jobs": then the replica clears with an AtomicKV of
// WithClearSQL, a RunClearer, that counts each clear of a job in its row,
// in the transaction that deletes its marker.
func connectReplica(ctx context.Context, addr, store string, ttl time.Duration) (retention.KV, retention.Locker, func(), error) {
	tables := strings.Split(store, ",")
	markers, leases := tables[0], tables[1]
	cfg, err := pgxpool.ParseConfig(os.Getenv("RETENTION_POSTGRES_DSN"))
	if err != nil {
		return nil, nil, nil, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, nil, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, nil, nil, err
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	kv, err := pgkv.New(pool, markers)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	locker, err := pgkv.NewLocker(pool, proofLease, &pgkv.LockerOptions{TTL: ttl, Table: leases})
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	if len(tables) < 3 {
		return kv, locker, pool.Close, nil
	}
	// An UPDATE joins the run's statement as a data-modifying CTE: the
	// form a run takes for most clears.
	akv, err := kv.WithClearSQL("UPDATE " + tables[2] + " SET clears = clears + 1 WHERE id = ANY($1)")
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return akv, locker, pool.Close, nil
}

func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	dsn := kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	admin := connect(t)
	leasetest.RunProcesses(t, leasetest.Engine{
		Addr:    net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))),
		TTL:     1500 * time.Millisecond,
		Connect: connectReplica,
		Setup: func(t testing.TB, keys [][]byte) string {
			markers, leases := freshTable(t, admin), freshLeaseTable(t, admin)
			_, err := admin.Exec(context.Background(), "INSERT INTO "+markers+" SELECT unnest($1::bytea[])", keys)
			require.NoError(t, err)
			return markers + "," + leases
		},
		TakeAway: func(t testing.TB, store string) {
			_, leases, _ := strings.Cut(store, ",")
			expireLease(t, admin, leases, proofLease)
		},
		Remaining: func(ctx context.Context, store string) (int, error) {
			markers, _, _ := strings.Cut(store, ",")
			var n int
			err := admin.QueryRow(ctx, "SELECT count(*) FROM "+markers).Scan(&n)
			return n, err
		},
	})
}

// TestProcessesAtomic runs the process proofs with replicas that clear
// through a fenced AtomicKV of WithClearSQL, by runs (ClearRun): each
// entity is cleared exactly once across the fleet, even when the lease is
// taken away mid-pass, a holder's host crashes, or a holder freezes past
// its TTL in a run.
func TestProcessesAtomic(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	dsn := kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	admin := connect(t)
	ctx := context.Background()
	leasetest.RunProcesses(t, leasetest.Engine{
		Addr:    net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))),
		TTL:     1500 * time.Millisecond,
		Connect: connectReplica,
		Setup: func(t testing.TB, keys [][]byte) string {
			markers, leases := freshTable(t, admin), freshLeaseTable(t, admin)
			jobs := markers + "_jobs"
			_, err := admin.Exec(ctx, "CREATE TABLE "+jobs+" (id text PRIMARY KEY, clears int NOT NULL DEFAULT 0)")
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs) })
			ids := make([]string, len(keys))
			for i, k := range keys {
				_, id, err := retention.ParseMarkerKey("proof/", k)
				require.NoError(t, err)
				ids[i] = string(id)
			}
			_, err = admin.Exec(ctx, "INSERT INTO "+markers+" SELECT unnest($1::bytea[])", keys)
			require.NoError(t, err)
			_, err = admin.Exec(ctx, "INSERT INTO "+jobs+" (id) SELECT unnest($1::text[])", ids)
			require.NoError(t, err)
			return strings.Join([]string{markers, leases, jobs}, ",")
		},
		TakeAway: func(t testing.TB, store string) {
			expireLease(t, admin, strings.Split(store, ",")[1], proofLease)
		},
		Remaining: func(ctx context.Context, store string) (int, error) {
			var n int
			err := admin.QueryRow(ctx, "SELECT count(*) FROM "+strings.Split(store, ",")[0]).Scan(&n)
			return n, err
		},
		Duplicates: func(ctx context.Context, store string) (int, error) {
			tables := strings.Split(store, ",")
			markers, jobs := tables[0], tables[2]
			var dups, lost int
			err := admin.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE clears > 1").Scan(&dups)
			if err != nil {
				return 0, err
			}
			// Atomic both ways: an entity is cleared exactly when its marker goes.
			err = admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+jobs+" WHERE clears = 0) - (SELECT count(*) FROM "+markers+")").Scan(&lost)
			if err != nil {
				return 0, err
			}
			if lost != 0 {
				return 0, fmt.Errorf("%d more entities uncleared than markers left: a marker went without its entity, or the reverse", lost)
			}
			return dups, nil
		},
		Runs: true,
	})
}
