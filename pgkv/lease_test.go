package pgkv_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/pgkv"
)

const leaseTTL = 1500 * time.Millisecond

// freshLeaseTable returns the name of a new, migrated lease table that is
// dropped when t ends.
func freshLeaseTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := fmt.Sprintf("leases_%d_%d", os.Getpid(), tableSeq.Add(1))
	ctx := context.Background()
	require.NoError(t, pgkv.MigrateLeases(ctx, pool, name))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

// expireLease ends the lease called name from outside, as an operator would,
// without telling its holder.
func expireLease(t testing.TB, admin *pgxpool.Pool, table, name string) {
	t.Helper()
	_, err := admin.Exec(context.Background(), "UPDATE "+table+" SET expires_at = clock_timestamp() WHERE name = $1", name)
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
	leases := freshLeaseTable(t, admin)
	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)

	return leasetest.Harness{
		TTL: leaseTTL,
		NewReplica: func(t testing.TB) leasetest.Replica {
			pool := poolOf(t, 4)
			kv, err := pgkv.New(pool, markers)
			require.NoError(t, err)
			locker, err := pgkv.NewLocker(pool, lease, &pgkv.LockerOptions{TTL: leaseTTL, Table: leases})
			require.NoError(t, err)
			return leasetest.Replica{
				KV:     kv,
				Locker: locker,
				Clear: func(ctx context.Context, id string) error {
					_, err := pool.Exec(ctx, "DELETE FROM "+state+" WHERE id = $1", id)
					return err
				},
				// The process dies: its connections close, renewals stop,
				// and nothing is released.
				Kill: pool.Close,
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
		Expire: func(t testing.TB) { expireLease(t, admin, leases, lease) },
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
		{"defaults", pool, "sweeper", nil, ""},
		{"zero options", pool, "sweeper", &pgkv.LockerOptions{}, ""},
		{"ttl and table", pool, "sweeper", &pgkv.LockerOptions{TTL: time.Second, Table: "app.leases"}, ""},
		{"nil pool", nil, "sweeper", nil, "pgkv: pool must not be nil"},
		{"empty name", pool, "", nil, "pgkv: lease name must not be empty"},
		{"short ttl", pool, "sweeper", &pgkv.LockerOptions{TTL: time.Millisecond}, "pgkv: LockerOptions.TTL must be at least 100ms, got 1ms"},
		{"negative ttl", pool, "sweeper", &pgkv.LockerOptions{TTL: -time.Second}, "pgkv: LockerOptions.TTL must be at least 100ms, got -1s"},
		{"bad table", pool, "sweeper", &pgkv.LockerOptions{Table: "a."}, `pgkv: LockerOptions.Table: pgkv: invalid table name "a.": empty name or schema`},
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
}

func TestAcquireWithoutLeaseTable(t *testing.T) {
	pool := connect(t)
	l, err := pgkv.NewLocker(pool, "sweeper", &pgkv.LockerOptions{Table: fmt.Sprintf("missing_leases_%d", os.Getpid())})
	require.NoError(t, err)
	_, err = l.TryAcquire(context.Background())
	require.ErrorIs(t, err, pgkv.ErrNoLeaseTable)
	assert.NotErrorIs(t, err, pgkv.ErrNoTable, "the marker table is not the one missing")
}

// TestLeaseRenewedPastTTL holds a lease past its TTL: renewals keep it,
// and Release frees it at once. The lease is lost only when no renewal gets
// through for most of a TTL, which a busy machine must not cause: the TTL
// leaves a renewal seconds to be scheduled, and the hold spans four
// renewals.
func TestLeaseRenewedPastTTL(t *testing.T) {
	pool := connect(t)
	table := freshLeaseTable(t, pool)
	ctx := context.Background()
	const ttl = 3 * time.Second
	a, err := pgkv.NewLocker(pool, "renewed", &pgkv.LockerOptions{TTL: ttl, Table: table})
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
	require.NoError(t, pool.QueryRow(ctx, "SELECT fence FROM "+table+" WHERE name = 'renewed'").Scan(&fence))
	assert.Equal(t, int64(2), fence, "the fencing counter grows with every acquisition")
	require.NoError(t, again.Release(ctx))
}

// TestTakeoverWaitsForFencedDelete: a takeover updates the lease row, so it
// waits for a fenced delete that locked it to commit, and the old holder's
// later writes are refused.
func TestTakeoverWaitsForFencedDelete(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	leases := freshLeaseTable(t, pool)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	a, err := pgkv.NewLocker(pool, "fenced", &pgkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
	require.NoError(t, err)
	lease, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	fenced, ok := lease.(retention.Fencer).Fence(kv)
	require.True(t, ok)
	require.NoError(t, kv.Put(ctx, []byte("k1"), nil))
	require.NoError(t, kv.Put(ctx, []byte("k2"), nil))

	// A transaction that holds the row lock a fenced delete takes stands
	// for a fenced delete in flight.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+leases+" WHERE name = 'fenced' FOR SHARE")
	require.NoError(t, err)

	// A takeover (here forced by an operator) must wait for that lock.
	done := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, "UPDATE "+leases+" SET holder = 'thief', fence = fence + 1 WHERE name = 'fenced'")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the takeover did not wait for the row lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)

	err = fenced.Delete(ctx, []byte("k1"))
	require.ErrorIs(t, err, retention.ErrLeaseLost)
	err = fenced.(retention.Putter).Put(ctx, []byte("k3"), nil)
	require.ErrorIs(t, err, retention.ErrLeaseLost)
	keys, err := kv.Scan(ctx, []byte("k"), []byte("l"), 10)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{[]byte("k1"), []byte("k2")}, keys, "refused writes change nothing")
	select {
	case <-lease.Lost():
	default:
		t.Error("Lost is open after a refused write")
	}
}
