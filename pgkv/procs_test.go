package pgkv_test

import (
	"context"
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
// "markers,leases", the two tables.
func connectReplica(ctx context.Context, addr, store string, ttl time.Duration) (retention.KV, retention.Locker, func(), error) {
	markers, leases, _ := strings.Cut(store, ",")
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
	return kv, locker, pool.Close, nil
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
