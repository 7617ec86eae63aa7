package sqlkv_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// shardFleet runs the replicas of TestShardedSweepOnOneTable, each with a
// *sql.DB and a Sharded of its own, and follows from their Observers who
// holds each shard.
type shardFleet struct {
	t    *testing.T
	dl   dialect
	path string // SQLite's file, which every replica opens

	markers, leases, jobs, cleared string // tables
	cfg                            retention.Config
	sc                             retention.ShardConfig
	ttl                            time.Duration

	mu     sync.Mutex
	owners []string // by shard: the replica that last took its lease, "" once it gave it up
	ever   []bool   // by shard: taken by some replica at least once
	lost   int      // leases lost while held, not given up
	stops  map[string]func() error
}

// shardWatch is a replica's Observer.
type shardWatch struct {
	f    *shardFleet
	name string
}

func (w shardWatch) ObservePass(string, retention.Stats, error) {}
func (w shardWatch) ObserveLags(string, []time.Duration)        {}
func (w shardWatch) ObservePage(string, retention.Stats)        {}
func (w shardWatch) ObserveLease(prefix string, e retention.LeaseEvent) {
	shard, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(prefix, w.f.cfg.Prefix+"s"), "/"))
	if !assert.NoError(w.f.t, err, "the shard of %q", prefix) {
		return
	}
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	switch e {
	case retention.LeaseAcquired:
		w.f.owners[shard], w.f.ever[shard] = w.name, true
	case retention.LeaseLost, retention.LeaseReleased:
		if e == retention.LeaseLost {
			w.f.lost++
		}
		if w.f.owners[shard] == w.name {
			w.f.owners[shard] = ""
		}
	}
}

// start starts replica name's Run on a *sql.DB of its own (on SQLite, of
// the one file): its shards' leases are rows of one lease table named by
// the shards' prefixes, and its clears delete the jobs and log each id
// with the replica's name in the transaction that deletes their markers.
func (f *shardFleet) start(name string) {
	d := f.dl.d
	db := f.dl.open(f.t, f.path)
	// Room for a lease's renewals per shard held, the replica's key and a
	// clear.
	db.SetMaxOpenConns(f.sc.Shards + 4)
	db.SetMaxIdleConns(f.sc.Shards + 4)
	kv, err := sqlkv.New(db, d, f.markers)
	require.NoError(f.t, err)
	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		for part := range slices.Chunk(ids, 500) {
			del := "DELETE FROM " + f.jobs + " WHERE id IN (?" + strings.Repeat(", ?", len(part)-1) + ")"
			if _, err := tx.ExecContext(ctx, q(d, del), anyOf(part)...); err != nil {
				return err
			}
		}
		return insertRows(ctx, tx, d, "INSERT INTO "+f.cleared+" (id, replica) VALUES ", "(?, '"+name+"')", anyOf(ids))
	})
	require.NoError(f.t, err)
	cfg := f.cfg
	cfg.Replica = name
	cfg.Observer = shardWatch{f: f, name: name}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if os.Getenv("SHARD_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("dialect", f.dl.name, "replica", name)
	}
	sc := f.sc
	sc.Lease = func(_ int, prefix string) (retention.Locker, error) {
		return sqlkv.NewLocker(kv, prefix, &sqlkv.LockerOptions{TTL: f.ttl, Table: f.leases})
	}
	s, err := retention.NewSharded(akv, cfg, sc)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	f.stops[name] = func() error {
		cancel()
		err := <-done
		_ = db.Close()
		return err
	}
}

func (f *shardFleet) stop(name string) {
	require.ErrorIs(f.t, f.stops[name](), context.Canceled, "%s's Run", name)
	delete(f.stops, name)
}

func (f *shardFleet) held() (owners []string, counts map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	counts = map[string]int{}
	for _, o := range f.owners {
		if o != "" {
			counts[o]++
		}
	}
	return slices.Clone(f.owners), counts
}

// balanced reports whether every shard is held, by the replicas named
// alone, each within one of the even share.
func (f *shardFleet) balanced(names ...string) bool {
	owners, counts := f.held()
	even := float64(len(owners)) / float64(len(names))
	total := 0
	for _, name := range names {
		if math.Abs(float64(counts[name])-even) > 1 {
			return false
		}
		total += counts[name]
	}
	return total == len(owners)
}

// waitBalanced waits until the replicas named are balanced, and returns
// how long that took. The limit is far above what an idle machine needs:
// it only stops a run that would never balance.
func (f *shardFleet) waitBalanced(names ...string) time.Duration {
	const limit = time.Minute
	start := time.Now()
	for !f.balanced(names...) && time.Since(start) < limit {
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	owners, counts := f.held()
	require.True(f.t, f.balanced(names...), "%v not within one of even after %v: %v (%v)", names, took, counts, owners)
	return took
}

// count returns the rows of table.
func (f *shardFleet) count(db *sql.DB, table string) int {
	var n int
	require.NoError(f.t, db.QueryRowContext(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// clearedBy returns how many jobs each replica's clears logged.
func (f *shardFleet) clearedBy(db *sql.DB) map[string]int {
	rows, err := db.QueryContext(context.Background(), "SELECT replica, count(*) FROM "+f.cleared+" GROUP BY replica")
	require.NoError(f.t, err)
	defer rows.Close()
	by := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		require.NoError(f.t, rows.Scan(&name, &n))
		by[name] = n
	}
	require.NoError(f.t, rows.Err())
	return by
}

// TestShardedSweepOnOneTable runs a sharded sweep of 8 shards, prefixes of
// one marker table, on 3 replicas with a *sql.DB each (on SQLite, each
// its own *sql.DB of one file), each shard's lease a row of one lease
// table named by its prefix, while a writer finishes jobs (the job's row
// and its marker, of Sharded.MarkerKey, in one transaction): every shard
// is taken, the replicas hold 2 or 3 each and each clears jobs; one stops
// and the other two take its shards and hold 4 each; it starts again and
// gets its share back. Every job is cleared exactly once: the atomic clear
// logs each id in the transaction that deletes the job and its marker, and
// the log holds every job once. Once every Run returned, no marker and no
// replica's key is left.
func TestShardedSweepOnOneTable(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet takes a while")
	}
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		const (
			shards    = 8
			ttl       = 3 * time.Second
			heartbeat = 500 * time.Millisecond
			interval  = time.Second
			keep      = 500 * time.Millisecond // Retention
			prefix    = "jobs/done/"
		)
		begun := time.Now()
		ctx := context.Background()
		path := ""
		if dl.d == sqlkv.SQLite {
			path = filepath.Join(t.TempDir(), "shards.db")
		}
		admin := dl.open(t, path)
		markers := freshTable(t, admin, dl.d)
		f := &shardFleet{
			t: t, dl: dl, path: path, ttl: ttl,
			markers: markers, leases: freshLeaseTable(t, admin, dl.d), jobs: markers + "_jobs", cleared: markers + "_cleared",
			cfg: retention.Config{
				Prefix: prefix, Retention: keep, Interval: interval,
				MinInterval:  250 * time.Millisecond, // a pass of a shard at most 4 times a second: 2 cores, -race
				StoreTimeout: 5 * time.Second,
			},
			sc:     retention.ShardConfig{Shards: shards, Heartbeat: heartbeat},
			owners: make([]string, shards),
			ever:   make([]bool, shards),
			stops:  map[string]func() error{},
		}
		for _, create := range []string{
			"CREATE TABLE " + f.jobs + " (id VARCHAR(40) PRIMARY KEY)",
			"CREATE TABLE " + f.cleared + " (id VARCHAR(40) NOT NULL, replica VARCHAR(20) NOT NULL)",
		} {
			_, err := admin.ExecContext(ctx, create)
			require.NoError(t, err)
		}
		t.Cleanup(func() {
			for _, table := range []string{f.jobs, f.cleared} {
				_, err := admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
				assert.NoError(t, err)
			}
		})

		// The writer: 5 jobs every 50ms, each with its marker in one
		// transaction. On MySQL it runs a transaction again after a
		// deadlock, as InnoDB asks of every application: the sweep's range
		// delete of a shard locks the gaps at its two ends (where the
		// markers of this shard and of the one before it go), and the
		// ClearFunc's DELETE of its jobs by IN (...) the job past its last
		// one, which may be the job this writer just inserted.
		kv, err := sqlkv.New(admin, dl.d, markers)
		require.NoError(t, err)
		writer, err := retention.NewSharded(kv, retention.Config{Prefix: prefix, Retention: keep, Clear: func(context.Context, string) error { return nil }},
			retention.ShardConfig{Shards: shards})
		require.NoError(t, err)
		finish := func(id string, key []byte) error {
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+f.jobs+" (id) VALUES (?)"), id); err != nil {
				return err
			}
			if err := kv.MarkKeyTx(ctx, tx, key); err != nil {
				return err
			}
			return tx.Commit()
		}
		deadlock := func(err error) bool {
			var my *mysql.MySQLError
			return errors.As(err, &my) && my.Number == 1213 // ER_LOCK_DEADLOCK
		}
		written, deadlocks := 0, 0
		wctx, stopWriting := context.WithCancel(ctx)
		writing := make(chan struct{})
		go func() {
			defer close(writing)
			for wctx.Err() == nil {
				for range 5 {
					id := fmt.Sprintf("job-%06d", written)
					key, err := writer.MarkerKey(time.Now(), id)
					if !assert.NoError(t, err) {
						return
					}
					for err = finish(id, key); deadlock(err); err = finish(id, key) {
						deadlocks++
					}
					if !assert.NoError(t, err, "finish %s", id) {
						return
					}
					written++
				}
				select {
				case <-wctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
		defer func() {
			stopWriting()
			<-writing
			for name, stop := range f.stops {
				_ = stop()
				delete(f.stops, name)
			}
		}()

		all := []string{"r0", "r1", "r2"}
		for _, name := range all {
			f.start(name)
		}
		took := f.waitBalanced(all...)
		_, counts := f.held()
		t.Logf("3 replicas, %d shards: every shard held, within one of even after %v: %v", shards, took.Round(time.Millisecond), counts)
		// The shards are swept side by side: each replica clears jobs.
		require.Eventually(t, func() bool { return len(f.clearedBy(admin)) == len(all) }, time.Minute, 50*time.Millisecond,
			"not every replica cleared a job")

		// r0 stops: its Run returns, giving its leases up and deleting its
		// replica's key; the other two take its shards.
		f.stop("r0")
		took = f.waitBalanced("r1", "r2")
		_, counts = f.held()
		t.Logf("r0 stopped: its shards taken, within one of even after %v: %v", took.Round(time.Millisecond), counts)

		// r0 starts again, as a new Run with a new *sql.DB, and gets its
		// share back.
		f.start("r0")
		took = f.waitBalanced(all...)
		_, counts = f.held()
		t.Logf("r0 started again: within one of even after %v: %v", took.Round(time.Millisecond), counts)

		// The writer stops; the replicas clear the rest.
		stopWriting()
		<-writing
		drained := time.Now()
		require.Eventually(t, func() bool { return f.count(admin, f.jobs) == 0 }, time.Minute, 50*time.Millisecond,
			"jobs left a minute after the writer stopped")
		t.Logf("%d jobs written (%d transactions run again after a deadlock); the last cleared %v after the writer stopped", written, deadlocks, time.Since(drained).Round(time.Millisecond))
		for _, name := range all {
			f.stop(name)
		}

		f.mu.Lock()
		for i, ok := range f.ever {
			assert.True(t, ok, "shard %d never held", i)
		}
		lost := f.lost
		f.mu.Unlock()

		var cleared, distinct int
		require.NoError(t, admin.QueryRowContext(ctx, "SELECT count(*), count(DISTINCT id) FROM "+f.cleared).Scan(&cleared, &distinct))
		assert.Equal(t, written, distinct, "jobs cleared")
		assert.Equal(t, distinct, cleared, "clears logged: each job exactly once")

		// What is left under the prefix: the shards' fleet records
		// (<prefix>s007/#...) stay; no marker, no replica's key
		// (<prefix>#m...).
		var left, members [][]byte
		records := 0
		from, end := []byte(prefix), []byte(prefix[:len(prefix)-1]+"0")
		for {
			page, err := kv.Scan(ctx, from, end, 1000)
			require.NoError(t, err)
			for _, k := range page {
				rest := k[len(prefix):]
				switch {
				case bytes.HasPrefix(rest, []byte("#m")):
					members = append(members, k)
				case len(rest) > 5 && rest[0] == 's' && rest[5] == '#':
					records++
				default:
					left = append(left, k)
				}
			}
			if len(page) < 1000 {
				break
			}
			from = append(slices.Clone(page[len(page)-1]), 0)
		}
		assert.Empty(t, left, "markers left")
		assert.Empty(t, members, "replicas' keys left after every Run returned")

		t.Logf("cleared by replica: %v; leases lost while held: %d; fleet records left: %d; %v in all",
			f.clearedBy(admin), lost, records, time.Since(begun).Round(time.Millisecond))
	})
}
