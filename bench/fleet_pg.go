package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// PGFleet is the sharded-fleet measure's PostgreSQL store: every shard a
// prefix of one pgkv marker table, each shard's lease a pgkv.Locker row of
// one lease table named by the shard's prefix, as pgkv's
// TestShardedFleetOnOneTable runs them. Each replica gets a pool of its
// own. Create it with NewPGFleet.
type PGFleet struct {
	admin *pgxpool.Pool
	dsn   string
	ttl   time.Duration
}

// NewPGFleet returns the store on the database of dsn; admin, a pool of
// that database, writes the backlogs and drops the tables. ttl is the
// leases'.
func NewPGFleet(admin *pgxpool.Pool, dsn string, ttl time.Duration) *PGFleet {
	return &PGFleet{admin: admin, dsn: dsn, ttl: ttl}
}

// Name implements FleetStore.
func (*PGFleet) Name() string { return "PostgreSQL" }

// Open implements FleetStore: a schema of its own, with the marker table
// and the lease table.
func (p *PGFleet) Open(ctx context.Context, shards int) (FleetSweep, error) {
	schema := fmt.Sprintf("bench_fleet_%d", rand.Uint32())
	s := &pgFleetSweep{p: p, shards: shards, schema: schema, markers: schema + ".markers", leases: schema + ".leases"}
	if _, err := p.admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, err
	}
	if err := pgkv.Migrate(ctx, p.admin, s.markers); err != nil {
		_ = s.Close(ctx)
		return nil, err
	}
	if err := pgkv.MigrateLeases(ctx, p.admin, s.leases); err != nil {
		_ = s.Close(ctx)
		return nil, err
	}
	return s, nil
}

type pgFleetSweep struct {
	p                       *PGFleet
	shards                  int
	schema, markers, leases string
}

func (s *pgFleetSweep) table() string { return pgx.Identifier{s.schema, "markers"}.Sanitize() }

// Fill implements FleetSweep with one COPY, then ANALYZE.
func (s *pgFleetSweep) Fill(ctx context.Context, prefix string, n int, at time.Time) error {
	kv, err := pgkv.New(s.p.admin, s.markers)
	if err != nil {
		return err
	}
	writer, err := fleetWriter(kv, s.shards)
	if err != nil {
		return err
	}
	rows := make([][]any, n)
	for i := range rows {
		key, err := writer.MarkerKey(at.Add(time.Duration(i)*time.Microsecond), fleetID(i))
		if err != nil {
			return err
		}
		rows[i] = []any{key}
	}
	if _, err := s.p.admin.CopyFrom(ctx, pgx.Identifier{s.schema, "markers"}, []string{"key"}, pgx.CopyFromRows(rows)); err != nil {
		return err
	}
	_, err = s.p.admin.Exec(ctx, "ANALYZE "+s.table())
	return err
}

// Replica implements FleetSweep: a pool of its own, big enough for every
// shard's store calls and lease renewals at once.
func (s *pgFleetSweep) Replica(ctx context.Context, cfg retention.Config, sc retention.ShardConfig) (*retention.Sharded, func(), error) {
	pcfg, err := pgxpool.ParseConfig(s.p.dsn)
	if err != nil {
		return nil, nil, err
	}
	pcfg.MaxConns = int32(sc.Shards + 4)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	kv, err := pgkv.New(pool, s.markers)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	sc.Lease = func(_ int, prefix string) (retention.Locker, error) {
		return pgkv.NewLocker(pool, prefix, &pgkv.LockerOptions{TTL: s.p.ttl, Table: s.leases})
	}
	sh, err := retention.NewSharded(kv, cfg, sc)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return sh, pool.Close, nil
}

// Left implements FleetSweep.
func (s *pgFleetSweep) Left(ctx context.Context, prefix string) ([]int, error) {
	left := make([]int, s.shards)
	for i := range left {
		lo, hi := shardMarkers(prefix, i)
		if err := s.p.admin.QueryRow(ctx, "SELECT count(*) FROM "+s.table()+" WHERE key >= $1 AND key < $2", lo, hi).Scan(&left[i]); err != nil {
			return nil, err
		}
	}
	return left, nil
}

// Close implements FleetSweep.
func (s *pgFleetSweep) Close(ctx context.Context) error {
	_, err := s.p.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s.schema}.Sanitize()+" CASCADE")
	return err
}
