package pgkv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/pgkv"
)

// shardProcsEngine is the leasetest.ShardEngine of PostgreSQL: every shard
// a prefix of one marker table, each shard's lease a row of one lease
// table named by its prefix, and a jobs table whose rows the replicas'
// clear (WithClearSQL, a RunClearer) stamps with the process's name, in
// the statement that deletes the markers: cleared_by holds one name per
// clear. The store's name is "markers,leases,jobs".
func shardProcsEngine(t *testing.T) leasetest.ShardEngine {
	dsn := kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN")
	tables := func(store string) (markers, leases, jobs string) {
		parts := strings.Split(store, ",")
		return parts[0], parts[1], parts[2]
	}
	var admin *pgxpool.Pool // the test process's, made by Setup
	return leasetest.ShardEngine{
		TTL:       3 * time.Second,
		Heartbeat: 500 * time.Millisecond,
		Interval:  3 * time.Second,
		Setup: func(t testing.TB, _ int, _ []string) string {
			admin = connect(t)
			markers := freshTable(t, admin)
			leases, jobs := freshLeaseTable(t, admin), markers+"_jobs"
			_, err := admin.Exec(context.Background(), "CREATE TABLE "+jobs+` (id text COLLATE "C" PRIMARY KEY, cleared_by text[] NOT NULL DEFAULT '{}')`)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs) })
			return strings.Join([]string{markers, leases, jobs}, ",")
		},
		Connect: func(ctx context.Context, store string, p leasetest.ShardProcess) (leasetest.ShardReplica, error) {
			markers, leases, jobs := tables(store)
			cfg, err := pgxpool.ParseConfig(dsn)
			if err != nil {
				return leasetest.ShardReplica{}, err
			}
			// 16 shards' passes, their lease renewals and the heartbeat
			// share the pool: a renewal must not wait long for a connection.
			cfg.MaxConns = 8
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				return leasetest.ShardReplica{}, err
			}
			kv, err := pgkv.New(pool, markers)
			if err != nil {
				pool.Close()
				return leasetest.ShardReplica{}, err
			}
			akv, err := kv.WithClearSQL(fmt.Sprintf("UPDATE %s SET cleared_by = cleared_by || '%s'::text WHERE id = ANY($1)",
				jobs, strings.ReplaceAll(p.Process, "'", "''")))
			if err != nil {
				pool.Close()
				return leasetest.ShardReplica{}, err
			}
			return leasetest.ShardReplica{
				KV: akv,
				Lease: func(_ int, prefix string) (retention.Locker, error) {
					return pgkv.NewLocker(pool, prefix, &pgkv.LockerOptions{TTL: p.TTL, Table: leases})
				},
				Close: pool.Close,
			}, nil
		},
		Finish: func(ctx context.Context, store string, ids []string, keys [][]byte) error {
			markers, _, jobs := tables(store)
			return pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO "+jobs+" (id) SELECT unnest($1::text[])", ids); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+markers+" SELECT unnest($1::bytea[])", keys)
				return err
			})
		},
		Clears: func(ctx context.Context, store string, ids []string) (map[string][]string, error) {
			_, _, jobs := tables(store)
			rows, err := admin.Query(ctx, "SELECT id, cleared_by FROM "+jobs+" WHERE id = ANY($1)", ids)
			if err != nil {
				return nil, err
			}
			clears := map[string][]string{}
			var id string
			var by []string
			_, err = pgx.ForEachRow(rows, []any{&id, &by}, func() error {
				clears[id] = by
				return nil
			})
			return clears, err
		},
		Remaining: func(ctx context.Context, store string) (int, error) {
			markers, _, _ := tables(store)
			var n int
			// The shards' markers: keys under <prefix>s, not the fleet's
			// own keys under each shard's prefix (#...).
			err := admin.QueryRow(ctx, "SELECT count(*) FROM "+markers+" WHERE key >= $1 AND key < $2 AND key NOT LIKE $3",
				[]byte(leasetest.Prefix+"s"), []byte(leasetest.Prefix+"t"), []byte(leasetest.Prefix+"s___/#%")).Scan(&n)
			return n, err
		},
		Members: func(ctx context.Context, store string) (int, error) {
			markers, _, _ := tables(store)
			var n int
			err := admin.QueryRow(ctx, "SELECT count(*) FROM "+markers+" WHERE key >= $1 AND key < $2",
				[]byte(leasetest.Prefix+"#m"), []byte(leasetest.Prefix+"#n")).Scan(&n)
			return n, err
		},
	}
}

// TestShardedProcessesKilledAndStopped runs leasetest.RunShardedProcesses
// on PostgreSQL: 4 replica processes of a sweep of 16 shards, prefixes of
// one marker table; one SIGKILLed and one SIGSTOPped mid-run, then resumed
// and restarted, then one stopped: each shard taken within TTL + Interval,
// the shares within one of even within 2 TTLs, and every job cleared
// exactly once by the atomic clear.
func TestShardedProcessesKilledAndStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	leasetest.RunShardedProcesses(t, shardProcsEngine(t))
}
