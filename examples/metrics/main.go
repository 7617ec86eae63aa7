// Metrics: a job service that keeps its state in a bbolt file, sweeps it,
// and serves Prometheus metrics of the sweep at /metrics. Jobs finish every
// 20ms and are kept for one second; for the first three seconds the store
// their state lives in is slow (a clear takes 40ms), so the sweep falls
// behind and the backlog age grows, then it catches up. One job cannot be
// deleted (a trigger refuses it): its clear fails, it is retried, and after
// three failed attempts it is parked, out of the backlog age, counted by
// retention_parked_markers. Every second the service scrapes its own
// /metrics over HTTP and prints the backlog; at the end it prints the whole
// scrape of the retention metrics.
//
//	go run ./examples/metrics                              # runs 5s, then exits
//	go run ./examples/metrics -duration 0 -addr :9090      # serves until interrupted
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
	"github.com/marksweep/retention/retentionprom"
)

var jobs = []byte("jobs")

// poison is the job whose deletion always fails.
const poison = "job-00005"

func main() {
	duration := flag.Duration("duration", 5*time.Second, "how long to run; 0 serves until interrupted")
	addr := flag.String("addr", "127.0.0.1:0", "address to serve /metrics on")
	flag.Parse()
	if err := run(*duration, *addr); err != nil {
		log.Fatal(err)
	}
}

func run(duration time.Duration, addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}

	dir, err := os.MkdirTemp("", "retention-metrics")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := bbolt.Open(filepath.Join(dir, "jobs.db"), 0o600, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucketIfNotExists(jobs); return err }); err != nil {
		return err
	}
	kv, err := boltkv.New(db, "markers")
	if err != nil {
		return err
	}

	// The collector observes the sweep and reads its backlog at each scrape.
	metrics, err := retentionprom.New(retentionprom.Options{})
	if err != nil {
		return err
	}
	start := time.Now()
	var slow atomic.Bool
	slow.Store(true)
	sweep, err := retention.New(kv, retention.Config{
		Prefix:      "jobs/done/",
		Retention:   time.Second,
		RetryDelay:  250 * time.Millisecond,
		MaxAttempts: 3, // then park it: an operator fixes the cause and calls Requeue
		Observer:    metrics,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Clear: func(ctx context.Context, id string) error {
			if slow.Load() {
				time.Sleep(40 * time.Millisecond) // a slow dependency
			}
			if id == poison {
				return errors.New("trigger refused the delete")
			}
			return db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(jobs).Delete([]byte(id)) })
		},
	})
	if err != nil {
		return err
	}
	metrics.Watch(sweep)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	url := "http://" + ln.Addr().String() + "/metrics"
	fmt.Printf("serving %s\n", url)

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Print(err)
		}
	})
	wg.Go(func() { _ = sweep.Run(ctx) })
	wg.Go(func() { finishJobs(ctx, db, kv) })

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			if slow.Load() && time.Since(start) > 3*time.Second {
				slow.Store(false)
				fmt.Printf("%4.1fs  the store is fast again\n", time.Since(start).Seconds())
			}
			lines, err := scrape(url, "retention_backlog_age", "retention_backlog_markers", "retention_retrying_", "retention_parked_")
			if err != nil {
				return err
			}
			fmt.Printf("%4.1fs  %s\n", time.Since(start).Seconds(), strings.Join(lines, "  "))
		}
	}

	lines, err := scrape(url, "retention_")
	if err != nil {
		return err
	}
	fmt.Println("final scrape of", url, "(histogram buckets left out):")
	for _, l := range lines {
		if !strings.Contains(l, "_bucket{") {
			fmt.Println("  " + l)
		}
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	wg.Wait()
	return err
}

// finishJobs finishes a job every 20ms: its state and its marker are
// written in one transaction.
func finishJobs(ctx context.Context, db *bbolt.DB, kv *boltkv.KV) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		id := fmt.Sprintf("job-%05d", i)
		err := db.Update(func(tx *bbolt.Tx) error {
			if err := tx.Bucket(jobs).Put([]byte(id), []byte("succeeded")); err != nil {
				return err
			}
			return kv.MarkTx(tx, "jobs/done/", id, time.Now())
		})
		if err != nil {
			log.Print(err)
		}
	}
}

// scrape fetches url and returns its sample lines that start with one of
// prefixes.
func scrape(url string, prefixes ...string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				lines = append(lines, l)
				break
			}
		}
	}
	return lines, sc.Err()
}
