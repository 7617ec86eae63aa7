// Command sql measures how fast retention clears a backlog of expired
// entities through the sqlkv module, on MariaDB (or MySQL), SQLite and
// PostgreSQL, against a floor that deletes the same jobs and markers by
// hand in batches of the same size, and prints a Markdown table per
// database: medians and ratios, as bench/cmd/peers does. Run it through
// the test script, which starts the servers:
//
//	./scripts/test --exec ./scripts/bench sql
//
// Beside them it runs the table sweep (sqlkv.AtomicTableKV), whose
// markers are the jobs' rows by their finish time, against a batched
// DELETE by that time written by hand, in runs of 10,000 and of the batch
// size, in the same rounds; the table gives every contender's ratio to
// the floor and to the DELETE of either size.
//
// With -pages it adds the atomic sweep with the AtomicKV's runs hidden,
// which reads each page and clears it by ClearAndDelete: what the runs
// (AtomicKV.ClearRun) buy. With -cpu it reports the CPU time per entity
// of the server and of this process too, and the ratios by CPU, which
// swing less than rates on a loaded machine; -cpuprofile writes this
// process's profile, each contender's clears labelled.
//
// It reads RETENTION_MYSQL_DSN (github.com/go-sql-driver/mysql) and
// RETENTION_POSTGRES_DSN (pgx's database/sql driver); SQLite is a file in
// a temporary directory (modernc.org/sqlite, WAL).
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/marksweep/retention/bench"
	"github.com/marksweep/retention/sqlkv"
)

var (
	pages      = flag.Bool("pages", false, "add the atomic sweep with its runs hidden, which reads pages and clears them by ClearAndDelete (what runs buy)")
	cpuprofile = flag.String("cpuprofile", "", "write this process's CPU profile of the whole run to the file (SQLite runs in it), each contender's clears labelled contender=<its name> (pprof -tagfocus)")
	match      = flag.String("match", "", "run only the contenders whose name contains one of these comma-separated strings, besides the baselines (the floor and the DELETEs by finished_at)")
	cpu        = flag.Bool("cpu", false, "also measure the CPU time per entity of the server (on this machine) and of this process, and the ratios by CPU, which swing less with the load than rates (SQLite's is all this process's)")
)

func main() {
	n := flag.Int("n", 100_000, "expired entities per run on MariaDB and PostgreSQL")
	sqliteN := flag.Int("sqlite-n", 100_000, "expired entities per run on SQLite")
	rounds := flag.Int("rounds", 5, "rounds; every contender runs once per round")
	batch := flag.Int("batch", 1000, "the floor's rows per transaction, the sweeps' BatchSize and PageSize, and the smaller runs of the table sweep and of the DELETE by finished_at (the larger: 10,000)")
	only := flag.String("only", "mysql,mysql-interpolate,sqlite,pg", "comma-separated suites to run: mysql, mysql-interpolate (the driver's interpolateParams=true), sqlite, pg")
	timing := flag.Bool("timing", false, "after the rounds, run each sweep once more and break its time down by call (scan, marker delete, clear)")
	flag.Parse()
	log.SetFlags(0)
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	fmt.Printf("contenders alternated (order rotated every round), %d rounds, batches of %d; %d CPUs, %s\n\n",
		*rounds, *batch, runtime.NumCPU(), runtime.Version())
	ctx := context.Background()
	for s := range strings.SplitSeq(*only, ",") {
		var err error
		switch s {
		case "mysql":
			err = runServer(ctx, "mysql", "RETENTION_MYSQL_DSN", "", sqlkv.MySQL, *n, *rounds, *batch, *timing)
		case "mysql-interpolate":
			err = runServer(ctx, "mysql", "RETENTION_MYSQL_DSN", "interpolateParams=true", sqlkv.MySQL, *n, *rounds, *batch, *timing)
		case "pg":
			err = runServer(ctx, "pgx", "RETENTION_POSTGRES_DSN", "", sqlkv.PostgreSQL, *n, *rounds, *batch, *timing)
		case "sqlite":
			err = runSQLite(ctx, *sqliteN, *rounds, *batch, *timing)
		default:
			err = fmt.Errorf("unknown suite %q", s)
		}
		if err != nil {
			log.Fatalf("%s: %v", s, err)
		}
	}
}

// runServer runs the suite on the server of the DSN in env, with param
// (a DSN parameter, or "") added to it.
func runServer(ctx context.Context, driver, env, param string, d sqlkv.Dialect, n, rounds, batch int, timing bool) error {
	dsn := os.Getenv(env)
	if dsn == "" {
		return fmt.Errorf("%s is not set: run through ./scripts/test --exec ./scripts/bench sql", env)
	}
	if param != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + param
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	var title string
	if d == sqlkv.MySQL {
		var version, flush string
		if err := db.QueryRowContext(ctx, `SELECT VERSION(), @@innodb_flush_log_at_trx_commit`).Scan(&version, &flush); err != nil {
			return err
		}
		driver := "go-sql-driver/mysql, default DSN: the floor's and the ClearFunc's statements prepared, sqlkv's own inlined"
		if param != "" {
			driver = "go-sql-driver/mysql, " + param
		}
		title = fmt.Sprintf("MariaDB/MySQL %s, innodb_flush_log_at_trx_commit=%s (%s)", version, flush, driver)
	} else {
		var version, fsync string
		if err := db.QueryRowContext(ctx, `SELECT current_setting('server_version'), current_setting('fsync')`).Scan(&version, &fsync); err != nil {
			return err
		}
		title = fmt.Sprintf("PostgreSQL %s, fsync %s (sqlkv over pgx's database/sql driver)", version, fsync)
	}
	return suite(ctx, title, db, d, n, rounds, batch, timing)
}

func runSQLite(ctx context.Context, n, rounds, batch int, timing bool) error {
	dir, err := os.MkdirTemp("", "retention-bench-sql")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	db, err := sql.Open("sqlite", bench.SQLiteDSN(filepath.Join(dir, "bench.db")))
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	var version, journal string
	var sync int
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&version); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&journal); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync); err != nil {
		return err
	}
	title := fmt.Sprintf("SQLite %s (modernc.org/sqlite), journal_mode=%s, synchronous=%s, file on %s",
		version, journal, map[int]string{0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[sync], fsType(dir))
	return suite(ctx, title, db, sqlkv.SQLite, n, rounds, batch, timing)
}

// labelled returns clear, which runs under the pprof label
// contender=name, as do the goroutines it starts.
func labelled(name string, clear func(context.Context) (int, error)) func(context.Context) (int, error) {
	return func(ctx context.Context) (n int, err error) {
		pprof.Do(ctx, pprof.Labels("contender", name), func(ctx context.Context) { n, err = clear(ctx) })
		return n, err
	}
}

// serverCPU returns the CPUMeter of the server of s, whose dialect is d.
func serverCPU(ctx context.Context, s *bench.SQL, d sqlkv.Dialect) (bench.CPUMeter, error) {
	if d != sqlkv.PostgreSQL {
		return s.ServerCPU(ctx)
	}
	pool, err := pgxpool.New(ctx, os.Getenv("RETENTION_POSTGRES_DSN"))
	if err != nil {
		return nil, err
	}
	defer pool.Close() // the meter reads /proc once it has the server's pid
	return bench.PGServerCPU(ctx, pool)
}

// fsType names the file system of dir when it is one whose speed differs
// a lot, else its magic number.
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "?"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs " + dir
	case 0xEF53:
		return "ext4 " + dir
	case 0x794c7630:
		return "overlayfs " + dir
	case 0x58465342:
		return "xfs " + dir
	}
	return fmt.Sprintf("fs 0x%x %s", st.Type, dir)
}

func suite(ctx context.Context, title string, db *sql.DB, d sqlkv.Dialect, n, rounds, batch int, timing bool) error {
	s, err := bench.NewSQL(ctx, db, d, fmt.Sprintf("bench_sql_%d", rand.Uint32()), batch)
	if err != nil {
		return err
	}
	defer func() {
		if err := s.Close(context.Background()); err != nil {
			log.Printf("dropping the bench tables: %v", err)
		}
	}()
	cs := s.Contenders()
	if *pages {
		cs = append(cs, s.AtomicPages())
	}
	// The baselines: the floor of the marker table's contenders, and the
	// DELETE by finished_at of each size of the table sweep's runs.
	base := []bench.Baseline{{Label: "floor", Name: cs[0].Name}}
	for _, size := range []int{bench.TableRuns, batch} {
		b := bench.Baseline{Label: fmt.Sprintf("DELETE %d", size), Name: s.ColumnDelete(size).Name}
		if !slices.Contains(base, b) {
			base = append(base, b)
		}
	}
	isBase := func(c bench.Contender) bool {
		return slices.ContainsFunc(base, func(b bench.Baseline) bool { return b.Name == c.Name })
	}
	if *match != "" {
		cs = slices.DeleteFunc(cs, func(c bench.Contender) bool {
			if isBase(c) {
				return false
			}
			for m := range strings.SplitSeq(*match, ",") {
				if strings.Contains(c.Name, m) {
					return false
				}
			}
			return true
		})
	}
	if *cpuprofile != "" {
		for i := range cs {
			cs[i].Clear = labelled(cs[i].Name, cs[i].Clear)
		}
	}
	var meter bench.CPUMeter
	if *cpu {
		if meter, err = serverCPU(ctx, s, d); err != nil {
			return err
		}
	}
	start := time.Now()
	res, err := bench.RunMetered(ctx, cs, n, rounds, meter, func(round int, name string, rate float64) {
		log.Printf("%s: round %d: %s: %s entities/s", d, round, name, bench.Rate(rate))
	})
	if err != nil {
		return err
	}
	fmt.Printf("## %s, %d expired entities per run\n\n", title, n)
	if err := bench.Table(os.Stdout, res, base...); err != nil {
		return err
	}
	fmt.Printf("\n(%d rounds in %v, setup included; every run checked to leave 0 jobs and 0 markers)\n\n", rounds, time.Since(start).Round(time.Second))
	if !timing {
		return nil
	}
	for _, c := range cs {
		if isBase(c) {
			continue
		}
		s.Timing = &bench.Timing{}
		rate, err := bench.Once(ctx, c, n)
		if err != nil {
			return err
		}
		fmt.Printf("timing %s: %s: %s entities/s: %s\n\n", d, c.Name, bench.Rate(rate), s.Timing)
	}
	s.Timing = nil
	return nil
}
