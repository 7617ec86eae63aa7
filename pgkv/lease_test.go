package pgkv_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/pgkv"
)

// terminateHolder ends the session that holds the advisory lock of the
// lease called name, as a crash of the holder would.
func terminateHolder(t testing.TB, admin *pgxpool.Pool, name string) {
	t.Helper()
	key := uint64(pgkv.LockKey(name))
	_, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`,
		int64(key>>32), int64(key&0xffffffff))
	require.NoError(t, err)
}

func newHarness(t testing.TB) leasetest.Harness {
	admin := connect(t)
	markers := freshTable(t, admin)
	state := markers + "_state"
	ctx := context.Background()
	_, err := admin.Exec(ctx, "CREATE TABLE "+state+" (id text PRIMARY KEY, outcome text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+state) })
	lease := "lease-" + markers
	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)

	return leasetest.Harness{
		TTL: time.Second, // the lock goes with the session; the holder checks it every 200ms
		NewReplica: func(t testing.TB) leasetest.Replica {
			cfg, err := pgxpool.ParseConfig(kvtestDSN(t))
			require.NoError(t, err)
			cfg.MaxConns = 4
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			kv, err := pgkv.New(pool, markers)
			require.NoError(t, err)
			locker, err := pgkv.NewLocker(pool, lease, &pgkv.LockerOptions{CheckInterval: 200 * time.Millisecond})
			require.NoError(t, err)
			return leasetest.Replica{
				KV:     kv,
				Locker: locker,
				Clear: func(ctx context.Context, id string) error {
					_, err := pool.Exec(ctx, "DELETE FROM "+state+" WHERE id = $1", id)
					return err
				},
				Kill: func() { terminateHolder(t, admin, lease) },
			}
		},
		Finish: func(ctx context.Context, prefix string, ids []string, at time.Time) error {
			return pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO "+state+" SELECT unnest($1::text[]), 'succeeded'", ids); err != nil {
					return err
				}
				for _, id := range ids {
					if err := writer.MarkTx(ctx, tx, prefix, id, at); err != nil {
						return err
					}
				}
				return nil
			})
		},
		Present: func(ctx context.Context, ids []string) (map[string]bool, error) {
			rows, err := admin.Query(ctx, "SELECT id FROM "+state+" WHERE id = ANY($1)", ids)
			if err != nil {
				return nil, err
			}
			found, err := pgx.CollectRows(rows, pgx.RowTo[string])
			present := map[string]bool{}
			for _, id := range found {
				present[id] = true
			}
			return present, err
		},
		Expire: func(t testing.TB) { terminateHolder(t, admin, lease) },
	}
}

func kvtestDSN(t testing.TB) string {
	dsn := os.Getenv("RETENTION_POSTGRES_DSN")
	require.NotEmpty(t, dsn)
	return dsn
}

func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet proofs take a while")
	}
	leasetest.Run(t, newHarness)
}

func TestNewLocker(t *testing.T) {
	pool := &pgxpool.Pool{}
	tests := []struct {
		name    string
		pool    *pgxpool.Pool
		lease   string
		opts    *pgkv.LockerOptions
		wantErr string
	}{
		{"valid", pool, "sweeper", nil, ""},
		{"check interval", pool, "sweeper", &pgkv.LockerOptions{CheckInterval: time.Second}, ""},
		{"nil pool", nil, "sweeper", nil, "pgkv: pool must not be nil"},
		{"empty name", pool, "", nil, "pgkv: lease name must not be empty"},
		{"negative check", pool, "sweeper", &pgkv.LockerOptions{CheckInterval: -1}, "pgkv: LockerOptions.CheckInterval must not be negative, got -1ns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := pgkv.NewLocker(tt.pool, tt.lease, tt.opts)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, l)
				return
			}
			require.NoError(t, err)
		})
	}
	assert.NotEqual(t, pgkv.LockKey("a"), pgkv.LockKey("b"))
	assert.Equal(t, pgkv.LockKey("a"), pgkv.LockKey("a"))
}
