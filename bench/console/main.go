// Command console measures the retentionui console on a real store: the
// overview's load time with a large backlog due, and a requeue of many
// parked ids from the page (a click in headless Chromium on "Requeue every
// parked marker", until the page shows the count) and from retentionctl
// (the command run as a process, start to exit). The figures are in
// retentionui/README.md.
//
//	go build -o /tmp/retentionctl ./retentionui/cmd/retentionctl
//	go run ./bench/console -store bolt -ctl /tmp/retentionctl
//	./scripts/test --exec go run ./bench/console -store pg -ctl /tmp/retentionctl
//
// The store holds two sweeps: jobs/done/ with -due markers due (written
// straight into the store, oldest a day past due) and stuck/done/ with
// -parked markers parked (each failed its one attempt).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
	"github.com/marksweep/retention/pgkv"
	"github.com/marksweep/retention/retentionui"
)

const (
	jobs  = "jobs/done/"
	stuck = "stuck/done/"
)

// store is a KV the sweep can write to, and a bulk loader of marker keys.
type store interface {
	retention.KV
	retention.Putter
}

func main() {
	kind := flag.String("store", "bolt", "bolt or pg (pg reads RETENTION_POSTGRES_DSN)")
	due := flag.Int("due", 1_000_000, "markers due in jobs/done/")
	parked := flag.Int("parked", 1000, "markers parked in stuck/done/")
	rounds := flag.Int("rounds", 5, "rounds of each measurement")
	ctl := flag.String("ctl", "", "path of a retentionctl binary; empty: skip the CLI requeue")
	flag.Parse()
	if err := run(*kind, *due, *parked, *rounds, *ctl); err != nil {
		log.Fatal(err)
	}
}

func run(kind string, due, parked, rounds int, ctl string) error {
	ctx := context.Background()
	kv, load, done, err := open(ctx, kind)
	if err != nil {
		return err
	}
	defer done()
	now := time.Now()
	newSweep := func(prefix string) (*retention.Sweep, error) {
		return retention.New(kv, retention.Config{
			Prefix: prefix, Retention: time.Hour, MaxAttempts: 1, Logger: slog.New(slog.DiscardHandler),
			// Never called for jobs/done/ (no pass runs there); every clear
			// of stuck/done/ fails, so each pass parks its markers again.
			Clear: func(context.Context, string) error { return errors.New("refused") },
		})
	}
	big, err := newSweep(jobs)
	if err != nil {
		return err
	}
	small, err := newSweep(stuck)
	if err != nil {
		return err
	}
	// Park first: a pass of stuck/done/ reads nothing of jobs/done/.
	keys := make([][]byte, parked)
	for i := range keys {
		if keys[i], err = small.MarkerKey(now.Add(-2*time.Hour), fmt.Sprintf("stuck-%06d", i)); err != nil {
			return err
		}
	}
	if err := load(ctx, keys); err != nil {
		return err
	}
	park := func() error {
		st, err := small.Pass(ctx)
		if err != nil {
			return err
		}
		if st.Parked != parked {
			return fmt.Errorf("parked %d, want %d", st.Parked, parked)
		}
		return nil
	}
	if err := park(); err != nil {
		return err
	}
	start := time.Now()
	const chunk = 100_000
	for from := 0; from < due; from += chunk {
		keys := make([][]byte, 0, chunk)
		for i := from; i < min(from+chunk, due); i++ {
			// Oldest a day past due, one per 50µs after.
			key, err := big.MarkerKey(now.Add(-25*time.Hour+time.Duration(i)*50*time.Microsecond), fmt.Sprintf("job-%08d", i))
			if err != nil {
				return err
			}
			keys = append(keys, key)
		}
		if err := load(ctx, keys); err != nil {
			return err
		}
	}
	fmt.Printf("store %s: loaded %d due markers in %v, parked %d\n", kind, due, time.Since(start).Round(time.Millisecond), parked)
	b, err := big.Backlog(ctx, retentionui.DefaultLimit)
	if err != nil {
		return err
	}
	fmt.Printf("Backlog(%d) of %s: due %d, more %v, oldest %v past due\n", retentionui.DefaultLimit, jobs, b.Due, b.More, b.Age.Round(time.Second))

	h, err := retentionui.New(retentionui.Options{
		Sweeps:  []*retention.Sweep{big, small},
		Details: map[string]retentionui.Detail{jobs: {Retention: time.Hour, KV: kv}, stuck: {Retention: time.Hour, KV: kv}},
	})
	if err != nil {
		return err
	}
	// posts records how long the server took over each POST /requeue,
	// to tell the store's and handler's share from the browser's.
	var posts []time.Duration
	var postsMu sync.Mutex
	timed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h.ServeHTTP(w, r)
		if r.Method == http.MethodPost {
			postsMu.Lock()
			posts = append(posts, time.Since(start))
			postsMu.Unlock()
		}
	})
	taken := func() []time.Duration {
		postsMu.Lock()
		defer postsMu.Unlock()
		p := posts
		posts = nil
		return p
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", timed))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	base := srv.URL + "/console/"

	// The first load after the markers were written, on caches as cold
	// as this process left them; then the rounds of each page.
	cold, err := get(base, "text/html")
	if err != nil {
		return err
	}
	fmt.Printf("GET overview HTML with %d due, the first load: %v\n", due, cold.Round(100*time.Microsecond))
	for _, page := range []struct{ name, path, accept string }{
		{"overview HTML", "", "text/html"},
		{"overview JSON", "", "application/json"},
		{"jobs/done/ page HTML", "sweep?prefix=" + url.QueryEscape(jobs), "text/html"},
		{"look-up of an id not there (JSON)", "why?prefix=" + url.QueryEscape(jobs) + "&id=nope", "application/json"},
	} {
		var times []time.Duration
		for range rounds {
			d, err := get(base+page.path, page.accept)
			if err != nil {
				return err
			}
			times = append(times, d)
		}
		report(fmt.Sprintf("GET %s with %d due", page.name, due), times)
	}

	if err := browserRequeue(base, parked, rounds, park); err != nil {
		return err
	}
	report("  of which the server's POST /requeue", taken())
	if ctl != "" {
		var times []time.Duration
		for range rounds {
			start := time.Now()
			out, err := exec.Command(ctl, "-addr", base, "requeue", stuck, "--all").CombinedOutput()
			d := time.Since(start)
			if err != nil || !strings.Contains(string(out), fmt.Sprintf("requeued %d ", parked)) {
				return fmt.Errorf("retentionctl: %v: %s", err, out)
			}
			times = append(times, d)
			if err := park(); err != nil {
				return err
			}
		}
		report(fmt.Sprintf("retentionctl requeue --all of %d parked (process start to exit)", parked), times)
		report("  of which the server's POST /requeue", taken())
	}
	return nil
}

// get times one GET of url, reading the whole body.
func get(u, accept string) (time.Duration, error) {
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", accept)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var buf [32 << 10]byte
	for {
		if _, err := resp.Body.Read(buf[:]); err != nil {
			break
		}
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return time.Since(start), nil
}

// browserRequeue times a click on "Requeue every parked marker" until the
// page says how many were requeued, parking them again between rounds.
func browserRequeue(base string, parked, rounds int, park func() error) error {
	path, err := exec.LookPath("chromium")
	if err != nil {
		return fmt.Errorf("no chromium: %w", err)
	}
	dir, err := os.MkdirTemp("", "console-bench-chromium")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path), chromedp.UserDataDir(dir),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("no-first-run", true))
	defer cancelAlloc()
	tab, cancel := chromedp.NewContext(alloc)
	defer cancel()
	var times []time.Duration
	for range rounds {
		if err := chromedp.Do(tab, chromedp.Navigate(base+"sweep?prefix="+url.QueryEscape(stuck))); err != nil {
			return err
		}
		start := time.Now()
		if err := chromedp.Do(tab,
			chromedp.Click(chromedp.CSS(`[data-action="requeue"][data-scope="all"]`)),
			chromedp.WaitVisible(chromedp.CSS(`[data-field="requeued"]`))); err != nil {
			return err
		}
		d := time.Since(start)
		msg, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(`[data-field="requeued"]`)))
		if err != nil {
			return err
		}
		if !strings.Contains(msg, fmt.Sprintf("Requeued %d:", parked)) {
			return fmt.Errorf("the page says %q", msg)
		}
		times = append(times, d)
		if err := park(); err != nil {
			return err
		}
	}
	report(fmt.Sprintf("requeue of %d parked from the page (click to the page showing the count)", parked), times)
	return nil
}

func report(what string, times []time.Duration) {
	slices.Sort(times)
	fmt.Printf("%s: median %v, min %v, max %v (%d rounds)\n", what,
		times[len(times)/2].Round(100*time.Microsecond), times[0].Round(100*time.Microsecond), times[len(times)-1].Round(100*time.Microsecond), len(times))
}

// open returns the store, a bulk loader of marker keys, and its cleanup.
func open(ctx context.Context, kind string) (store, func(context.Context, [][]byte) error, func(), error) {
	switch kind {
	case "bolt":
		dir, err := os.MkdirTemp("", "console-bench")
		if err != nil {
			return nil, nil, nil, err
		}
		db, err := bbolt.Open(filepath.Join(dir, "markers.db"), 0o600, &bbolt.Options{NoSync: true})
		if err != nil {
			return nil, nil, nil, err
		}
		kv, err := boltkv.New(db, "markers")
		if err != nil {
			return nil, nil, nil, err
		}
		load := func(_ context.Context, keys [][]byte) error {
			return db.Update(func(tx *bbolt.Tx) error {
				for _, k := range keys {
					if err := kv.MarkKeyTx(tx, k); err != nil {
						return err
					}
				}
				return nil
			})
		}
		return kv, load, func() { db.Close(); os.RemoveAll(dir) }, nil
	case "pg":
		dsn := os.Getenv("RETENTION_POSTGRES_DSN")
		if dsn == "" {
			return nil, nil, nil, errors.New("RETENTION_POSTGRES_DSN is not set: run it under ./scripts/test --exec")
		}
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		const table = "console_bench_markers"
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
			return nil, nil, nil, err
		}
		if err := pgkv.Migrate(ctx, pool, table); err != nil {
			return nil, nil, nil, err
		}
		kv, err := pgkv.New(pool, table)
		if err != nil {
			return nil, nil, nil, err
		}
		load := func(ctx context.Context, keys [][]byte) error {
			_, err := pool.CopyFrom(ctx, pgx.Identifier{table}, []string{"key"}, pgx.CopyFromSlice(len(keys), func(i int) ([]any, error) { return []any{keys[i]}, nil }))
			if err == nil {
				_, err = pool.Exec(ctx, "ANALYZE "+table)
			}
			return err
		}
		return kv, load, func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table); pool.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("-store %q: want bolt or pg", kind)
}
