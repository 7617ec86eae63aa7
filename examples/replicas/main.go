// Replicas: three replicas of a job service sweep one shared PostgreSQL.
// They share a lease, so one of them sweeps at a time; when that one shuts
// down, another takes over. Each line says which replica swept.
//
//	RETENTION_POSTGRES_DSN=postgres://user@127.0.0.1:5432/db go run ./examples/replicas
//
// Without RETENTION_POSTGRES_DSN it falls back to bbolt, which one process
// opens at a time: there the "replicas" are goroutines of one process over
// one database, there is nothing to lease, and the demo shows instead what
// sweeping without a lease costs: entities cleared more than once.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
	"github.com/marksweep/retention/pgkv"
)

const (
	replicas = 3
	keep     = 500 * time.Millisecond
	prefix   = "jobs/done/"
)

var begin = time.Now()

func say(format string, args ...any) {
	fmt.Printf("%4.1fs  %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
}

// service is what one replica needs from the store.
type service struct {
	kv     retention.KV
	lease  retention.Locker // nil: no lease
	clear  func(ctx context.Context, id string) error
	finish func(ctx context.Context, id string) error
	count  func() int
}

func main() {
	if dsn := os.Getenv("RETENTION_POSTGRES_DSN"); dsn != "" {
		runPostgres(dsn)
		return
	}
	runBolt()
}

func runPostgres(dsn string) {
	ctx := context.Background()
	const jobs, markers, leases = "retention_replicas_jobs", "retention_replicas_markers", "retention_replicas_leases"
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+jobs+" (id text PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	if err := pgkv.Migrate(ctx, admin, markers); err != nil {
		log.Fatal(err)
	}
	if err := pgkv.MigrateLeases(ctx, admin, leases); err != nil {
		log.Fatal(err)
	}
	defer admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs+", "+markers+", "+leases)

	say("PostgreSQL: %d replicas, each with its own pool, share one lease", replicas)
	services := make([]service, replicas)
	for i := range services {
		pool, err := pgxpool.New(ctx, dsn) // a connection pool per replica, as separate processes would have
		if err != nil {
			log.Fatal(err)
		}
		defer pool.Close()
		kv, err := pgkv.New(pool, markers)
		if err != nil {
			log.Fatal(err)
		}
		lease, err := pgkv.NewLocker(pool, "replicas-example", &pgkv.LockerOptions{TTL: time.Second, Table: leases})
		if err != nil {
			log.Fatal(err)
		}
		services[i] = service{
			kv:    kv,
			lease: lease,
			clear: func(ctx context.Context, id string) error {
				_, err := pool.Exec(ctx, "DELETE FROM "+jobs+" WHERE id = $1", id)
				return err
			},
			finish: func(ctx context.Context, id string) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "INSERT INTO "+jobs+" VALUES ($1)", id); err != nil {
						return err
					}
					return kv.MarkTx(ctx, tx, prefix, id, time.Now())
				})
			},
			count: func() int {
				var n int
				_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM "+jobs).Scan(&n)
				return n
			},
		}
	}
	demo(services)
}

func runBolt() {
	dir, err := os.MkdirTemp("", "retention-replicas")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := bbolt.Open(filepath.Join(dir, "jobs.db"), 0o600, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	kv, err := boltkv.New(db, "markers")
	if err != nil {
		log.Fatal(err)
	}
	bucket := []byte("jobs")
	say("No RETENTION_POSTGRES_DSN: using bbolt. A bbolt file is opened by one process at a time,")
	say("so replicas of a fleet cannot share it and there is no lease to take. Below, %d sweeps", replicas)
	say("in one process share the database without a lease; they may clear a job more than once (counted at the end).")
	s := service{
		kv: kv,
		clear: func(_ context.Context, id string) error {
			return db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucket).Delete([]byte(id)) })
		},
		finish: func(_ context.Context, id string) error {
			return db.Update(func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists(bucket)
				if err != nil {
					return err
				}
				if err := b.Put([]byte(id), []byte("done")); err != nil {
					return err
				}
				return kv.MarkTx(tx, prefix, id, time.Now())
			})
		},
		count: func() int {
			n := 0
			_ = db.View(func(tx *bbolt.Tx) error {
				if b := tx.Bucket(bucket); b != nil {
					n = b.Stats().KeyN
				}
				return nil
			})
			return n
		},
	}
	demo([]service{s, s, s})
}

// demo runs one Sweep per replica while jobs finish, stops the replica that
// swept first half-way, and reports who cleared what.
func demo(services []service) {
	ctx := context.Background()
	var mu sync.Mutex
	clears := map[string]int{}
	stops := make([]func(), len(services))
	firstSweeper := -1
	for i, s := range services {
		sweep, err := retention.New(s.kv, retention.Config{
			Prefix:    prefix,
			Retention: keep,
			Interval:  200 * time.Millisecond,
			Jitter:    0.2,
			Lease:     s.lease,
			Clear: func(ctx context.Context, id string) error {
				if err := s.clear(ctx, id); err != nil {
					return err
				}
				mu.Lock()
				clears[id]++
				mu.Unlock()
				return nil
			},
			OnPass: func(st retention.Stats, err error) {
				if st.Cleared == 0 && err == nil {
					return
				}
				mu.Lock()
				if firstSweeper < 0 {
					firstSweeper = i
				}
				mu.Unlock()
				if err != nil {
					say("replica %d: pass ended early: %v", i, err)
					return
				}
				say("replica %d swept: cleared %d", i, st.Cleared)
			},
		})
		if err != nil {
			log.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- sweep.Run(runCtx) }()
		var once sync.Once
		stops[i] = func() { once.Do(func() { cancel(); <-done }) }
	}

	for j := 1; j <= 12; j++ {
		if err := services[0].finish(ctx, fmt.Sprintf("job-%02d", j)); err != nil {
			log.Fatal(err)
		}
		if j == 6 {
			mu.Lock()
			first := firstSweeper
			mu.Unlock()
			if first >= 0 {
				stops[first]()
				say("replica %d shut down (releasing its lease, if it had one)", first)
			}
		}
		time.Sleep(150 * time.Millisecond)
	}
	time.Sleep(2 * keep)
	for _, stop := range stops {
		stop()
	}
	dups := 0
	for _, n := range clears {
		dups += n - 1
	}
	say("done: %d jobs cleared, %d duplicate clears, %d jobs left", len(clears), dups, services[0].count())
}
