// Command peers measures how fast retention clears a backlog of expired
// entities against River's and asynq's cleaners on the same servers, and
// prints Markdown tables of medians and ratios. Run it through the test
// script, which starts the servers:
//
//	./scripts/test --exec ./scripts/bench peers
//
// It reads RETENTION_POSTGRES_DSN and RETENTION_REDIS_ADDR, and
// RETENTION_POSTGRES_FSYNC_DSN for a second PostgreSQL server that runs
// with fsync on (scripts/bench peers starts one). Without it, it tries
// ALTER SYSTEM SET fsync = on on the first server, which works only when
// fsync was not set on the server's command line.
//
// With -tripwire it runs instead the quick check that CI runs (scripts/bench
// tripwire): each adapter's atomic clear against its peer on a small
// backlog, failing when a ratio falls below -min-river or -min-asynq.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention/bench"
)

func main() {
	n := flag.Int("n", 100_000, "expired entities per run")
	rounds := flag.Int("rounds", 3, "rounds; every contender runs once per round")
	only := flag.String("only", "pg,pg-fsync,redis,river", "comma-separated suites to run: pg, pg-fsync, redis, river, river-fsync (river_job itself)")
	match := flag.String("match", "", "run only the contenders whose name contains one of these comma-separated strings, besides the two baselines of each table")
	profile := flag.String("profile", "", "after the rounds, run the contenders whose name contains this once more, breaking down their time and writing a CPU profile of this process to <tmp>/peers-<suite>-<k>.pprof")
	trip := flag.Bool("tripwire", false, "run only the tripwire: each atomic clear (concurrency 1; runs of 10,000 through WithClearSQL on PostgreSQL, batches of 1,000 on Redis) against River and the asynq-style script, on a backlog of 50,000 (unless -n) in 5 rounds (unless -rounds), and fail when a median ratio falls below -min-river or -min-asynq")
	minRiver := flag.Float64("min-river", 0.6, "with -tripwire: the lowest pgkv.AtomicKV / River ratio that passes")
	minAsynq := flag.Float64("min-asynq", 0.9, "with -tripwire: the lowest rediskv.AtomicKV / asynq-style ratio that passes")
	minTable := flag.Float64("min-table", 0.6, "with -tripwire: the lowest table sweep of river_job / River ratio that passes")
	attempts := flag.Int("attempts", 3, "with -tripwire: how many times a suite below its minimum runs before it fails")
	flag.Parse()
	log.SetFlags(0)
	if *trip {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["n"] {
			*n = 50_000
		}
		if !set["rounds"] {
			*rounds = 5
		}
		if err := tripwire(context.Background(), *n, *rounds, max(*attempts, 1), strings.Split(*only, ","), *minRiver, *minAsynq, *minTable); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(context.Background(), *n, *rounds, strings.Split(*only, ","), *match, *profile); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, n, rounds int, suites []string, match, profile string) error {
	keep := func(cs []bench.Contender) []bench.Contender {
		if match == "" {
			return cs
		}
		out := cs[:2:2] // the baselines
		for _, c := range cs[2:] {
			for m := range strings.SplitSeq(match, ",") {
				if strings.Contains(c.Name, m) {
					out = append(out, c)
					break
				}
			}
		}
		return out
	}
	fmt.Printf("%d expired entities per run, %d rounds, contenders alternated (order rotated every round); %d CPUs, %s\n\n",
		n, rounds, runtime.NumCPU(), runtime.Version())
	for _, s := range suites {
		var err error
		switch s {
		case "pg":
			_, err = runPG(ctx, os.Getenv("RETENTION_POSTGRES_DSN"), false, n, rounds, pgAll(keep), []string{"floor", "River"}, profile)
		case "pg-fsync":
			_, err = runPG(ctx, os.Getenv("RETENTION_POSTGRES_FSYNC_DSN"), true, n, rounds, pgAll(keep), []string{"floor", "River"}, profile)
		case "river", "river-fsync":
			// River's own table as River's migrations make it: the table
			// sweep of river_job against River's JobDeleteBefore on the
			// same rows.
			fmt.Printf("On river_job itself: River's cleaner and the table sweep (sqlkv.AtomicTableKV) delete the same finalized jobs.\n\n")
			river := func(p *bench.PG) []bench.Contender { return keep(p.RiverContenders()) }
			dsn := os.Getenv("RETENTION_POSTGRES_DSN")
			if s == "river-fsync" {
				dsn = os.Getenv("RETENTION_POSTGRES_FSYNC_DSN")
			}
			_, err = runPG(ctx, dsn, s == "river-fsync", n, rounds, river, []string{"floor", "River"}, profile)
		case "redis":
			_, err = runRedis(ctx, n, rounds, redisAll(keep, n), []string{"floor", "asynq-style"}, profile)
		default:
			err = fmt.Errorf("unknown suite %q", s)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// pgAll picks the PostgreSQL contenders that keep keeps; redisAll the
// Redis ones. The first two of either are the table's baselines.
func pgAll(keep func([]bench.Contender) []bench.Contender) func(*bench.PG) []bench.Contender {
	return func(p *bench.PG) []bench.Contender { return keep(p.Contenders()) }
}

func redisAll(keep func([]bench.Contender) []bench.Contender, n int) func(*bench.Redis) []bench.Contender {
	return func(r *bench.Redis) []bench.Contender { return keep(r.Contenders(n)) }
}

// runPG runs the contenders pick returns, the floor or another baseline
// first and River second, and prints their table.
func runPG(ctx context.Context, dsn string, fsync bool, n, rounds int, pick func(*bench.PG) []bench.Contender, labels []string, profile string) ([]bench.Result, error) {
	restore := func() error { return nil }
	if dsn == "" && fsync {
		// No second server: turn fsync on in the first one, if it lets us.
		var err error
		dsn = os.Getenv("RETENTION_POSTGRES_DSN")
		if restore, err = fsyncOn(ctx, dsn); err != nil {
			fmt.Printf("## PostgreSQL, fsync on\n\nskipped: %v\n\n", err)
			return nil, nil
		}
	}
	if dsn == "" {
		return nil, fmt.Errorf("RETENTION_POSTGRES_DSN is not set: run through ./scripts/test --exec")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 72 // concurrency 64, plus the sweep's own scans and deletes
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var version, fsyncSetting string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync')`).Scan(&version, &fsyncSetting); err != nil {
		return nil, err
	}
	if fsync != (fsyncSetting == "on") {
		return nil, fmt.Errorf("server %s runs with fsync %s", cfg.ConnConfig.Host, fsyncSetting)
	}
	p, err := bench.NewPG(ctx, pool, fmt.Sprintf("bench_peers_%d", rand.Uint32()))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := p.Close(ctx); err != nil {
			log.Printf("dropping the bench schema: %v", err)
		}
		if err := restore(); err != nil {
			log.Printf("turning fsync off again: %v", err)
		}
	}()
	title := fmt.Sprintf("PostgreSQL %s, fsync %s", version, fsyncSetting)
	meter, err := bench.PGServerCPU(ctx, pool)
	if err != nil {
		log.Printf("%s: no CPU times: %v", title, err)
	}
	cs := pick(p)
	res, err := report(ctx, title, cs, n, rounds, labels, meter)
	if err != nil || profile == "" {
		return res, err
	}
	suite := "pg"
	if fsync {
		suite = "pg-fsync"
	}
	return res, profileRuns(ctx, suite, cs, n, profile, func(t *bench.Timing) { p.Timing = t })
}

// fsyncOn turns fsync on with ALTER SYSTEM and returns how to turn it off.
func fsyncOn(ctx context.Context, dsn string) (func() error, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	set := func(ctx context.Context, v string) (string, error) {
		if _, err := pool.Exec(ctx, `ALTER SYSTEM SET fsync = `+v); err != nil {
			return "", err
		}
		if _, err := pool.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			return "", err
		}
		time.Sleep(500 * time.Millisecond) // the reload is asynchronous
		var got, source string
		err := pool.QueryRow(ctx, `SELECT setting, source FROM pg_settings WHERE name = 'fsync'`).Scan(&got, &source)
		if got != v {
			err = fmt.Errorf("fsync still %s after ALTER SYSTEM (set on the %s, which ALTER SYSTEM does not override; set RETENTION_POSTGRES_FSYNC_DSN or run ./scripts/bench peers)", got, source)
		}
		return got, err
	}
	reset := func() error {
		defer pool.Close()
		_, err := pool.Exec(context.Background(), `ALTER SYSTEM RESET fsync`)
		if err == nil {
			_, err = pool.Exec(context.Background(), `SELECT pg_reload_conf()`)
		}
		return err
	}
	if _, err := set(ctx, "on"); err != nil {
		return nil, fmt.Errorf("%w%s", err, errString(reset()))
	}
	return reset, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return "; and resetting: " + err.Error()
}

// runRedis is runPG for Redis.
func runRedis(ctx context.Context, n, rounds int, pick func(*bench.Redis) []bench.Contender, labels []string, profile string) ([]bench.Result, error) {
	addr := os.Getenv("RETENTION_REDIS_ADDR")
	if addr == "" {
		return nil, fmt.Errorf("RETENTION_REDIS_ADDR is not set: run through ./scripts/test --exec")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 72})
	defer func() {
		if err := rdb.Close(); err != nil {
			log.Print(err)
		}
	}()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return nil, err
	}
	version := "?"
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			version = v
		}
	}
	r, err := bench.NewRedis(rdb, fmt.Sprintf("bench:peers:%d:", rand.Uint32()))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := r.Close(ctx); err != nil {
			log.Printf("deleting the bench keys: %v", err)
		}
	}()
	meter, err := bench.RedisServerCPU(ctx, rdb)
	if err != nil {
		log.Printf("Redis %s: no CPU times: %v", version, err)
	}
	cs := pick(r)
	res, err := report(ctx, "Redis "+version, cs, n, rounds, labels, meter)
	if err != nil || profile == "" {
		return res, err
	}
	return res, profileRuns(ctx, "redis", cs, n, profile, func(t *bench.Timing) { r.Timing = t })
}

// report runs cs and prints their table, with a column for each of
// labels: the ratio to the contender of that rank; and, when meter is
// not nil, the CPU time each contender cost the server and this process.
func report(ctx context.Context, title string, cs []bench.Contender, n, rounds int, labels []string, meter bench.CPUMeter) ([]bench.Result, error) {
	start := time.Now()
	res, err := bench.RunMetered(ctx, cs, n, rounds, meter, func(round int, name string, rate float64) {
		log.Printf("%s: round %d: %s: %s entities/s", title, round, name, bench.Rate(rate))
	})
	if err != nil {
		return nil, err
	}
	var baselines []bench.Baseline
	for i, l := range labels {
		baselines = append(baselines, bench.Baseline{Label: l, Name: cs[i].Name})
	}
	fmt.Printf("## %s\n\n", title)
	if err := bench.Table(os.Stdout, res, baselines...); err != nil {
		return nil, err
	}
	fmt.Printf("\n(%d rounds in %v, setup included; load %s)\n\n", rounds, time.Since(start).Round(time.Second), loadavg())
	return res, nil
}

// loadavg is the machine's load average over 1, 5 and 15 minutes, or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// profileRuns runs once more every contender whose name contains match,
// with a Timing set through setTiming and a CPU profile of this process.
func profileRuns(ctx context.Context, suite string, cs []bench.Contender, n int, match string, setTiming func(*bench.Timing)) error {
	defer setTiming(nil)
	for k, c := range cs {
		if !strings.Contains(c.Name, match) {
			continue
		}
		if err := c.Setup(ctx, n); err != nil {
			return err
		}
		t := &bench.Timing{}
		setTiming(t)
		file := filepath.Join(os.TempDir(), fmt.Sprintf("peers-%s-%d.pprof", suite, k))
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		start := time.Now()
		cleared, err := c.Clear(ctx)
		elapsed := time.Since(start)
		pprof.StopCPUProfile()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = c.Check(ctx)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		rate := float64(cleared) / elapsed.Seconds()
		fmt.Printf("profile %s: %s: %s entities/s in %v: %s; CPU profile in %s\n\n", suite, c.Name, bench.Rate(rate), elapsed.Round(time.Millisecond), t, file)
	}
	return nil
}
