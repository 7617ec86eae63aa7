// Console: a job service that serves the retentionui console at
// /admin/retention/, behind its own (basic) authentication, beside
// Prometheus metrics at /metrics. Jobs finish every 50ms and are kept for
// one second. One job cannot be deleted (the archive refuses it): after
// two failed clears it is parked; one job is held for a legal hold.
//
// With -duration (the default, 4s) it checks itself and exits: it reads
// the overview's JSON, fixes the archive, requeues the parked job from
// the console (POST, as the page's Requeue button does), and shows the
// job cleared. With -duration 0 it serves until interrupted: open the
// printed URL (user admin, password from -password), or point retentionctl
// at it:
//
//	go run ./examples/console                                   # runs 4s, then exits
//	go run ./examples/console -duration 0 -addr 127.0.0.1:8080  # serves until interrupted
//	RETENTIONCTL_PASSWORD=admin retentionctl -addr http://127.0.0.1:8080/admin/retention/ -user admin status
package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
	"github.com/marksweep/retention/retentionui"
)

const (
	prefix = "jobs/done/"
	poison = "job-00003" // the archive refuses to delete it until fixed
	legal  = "job-00005" // under a legal hold
)

func main() {
	duration := flag.Duration("duration", 4*time.Second, "how long to run before checking itself and exiting; 0 serves until interrupted")
	addr := flag.String("addr", "127.0.0.1:0", "address to serve on")
	password := flag.String("password", "admin", "the password of user admin")
	flag.Parse()
	if err := run(*duration, *addr, *password); err != nil {
		log.Fatal(err)
	}
}

// service is the job service: its jobs' state, and whether the archive
// refuses the poison job.
type service struct {
	mu      sync.Mutex
	jobs    map[string]string
	refuses atomic.Bool
}

func (s *service) clear(_ context.Context, id string) error {
	if id == poison && s.refuses.Load() {
		return errors.New("the archive refuses the delete")
	}
	if id == legal {
		return retention.Hold(time.Now().Add(time.Hour))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.jobs, id)
	return nil
}

func run(duration time.Duration, addr, password string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	svc := &service{jobs: map[string]string{}}
	svc.refuses.Store(true)
	kv := retention.NewMemKV()

	// The Recorder feeds the console and passes every call on to the
	// Prometheus collector: one Observer for both.
	metrics, err := retentionprom.New(retentionprom.Options{})
	if err != nil {
		return err
	}
	recorder := &retentionui.Recorder{Next: metrics}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:      prefix,
		Retention:   time.Second,
		RetryDelay:  100 * time.Millisecond,
		MaxAttempts: 2,
		MinInterval: 100 * time.Millisecond,
		Observer:    recorder,
		Clear:       svc.clear,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	metrics.Watch(sweep)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	console, err := retentionui.New(retentionui.Options{
		Sweeps:   []*retention.Sweep{sweep},
		Details:  map[string]retentionui.Detail{prefix: {Retention: time.Second, KV: kv}},
		Recorder: recorder,
	})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/admin/retention/", basicAuth("admin", password, http.StripPrefix("/admin/retention", console)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	base := "http://" + ln.Addr().String()
	fmt.Printf("console: %s/admin/retention/ (user admin)\nmetrics: %s/metrics\n", base, base)

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Print(err)
		}
	})
	runCtx, stopRun := context.WithCancel(ctx)
	wg.Go(func() { _ = sweep.Run(runCtx) })
	wg.Go(func() { finishJobs(runCtx, svc, sweep, kv) })

	if duration > 0 {
		err = selfCheck(ctx, duration, base+"/admin/retention/", password, svc, base+"/metrics")
	} else {
		<-ctx.Done()
	}
	stopRun()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = errors.Join(err, srv.Shutdown(shutdown))
	wg.Wait()
	return err
}

// basicAuth stands for the service's own authentication, which the
// console has none of.
func basicAuth(user, password string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="retention console"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// finishJobs finishes a job every 50ms: its state, then its marker.
func finishJobs(ctx context.Context, svc *service, sweep *retention.Sweep, kv *retention.MemKV) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		id := fmt.Sprintf("job-%05d", i)
		svc.mu.Lock()
		svc.jobs[id] = "succeeded"
		svc.mu.Unlock()
		if err := sweep.Mark(ctx, kv, id, time.Now()); err != nil && ctx.Err() == nil {
			log.Print(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// selfCheck waits, then uses the console as an operator would: reads the
// overview, fixes the archive, requeues the parked job and sees it go.
func selfCheck(ctx context.Context, wait time.Duration, console, password string, svc *service, metricsURL string) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(wait / 2):
	}
	c := &http.Client{Timeout: 5 * time.Second}
	call := func(method, path string, form url.Values, v any) error {
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequestWithContext(ctx, method, console+path, body)
		if err != nil {
			return err
		}
		req.SetBasicAuth("admin", password)
		req.Header.Set("Accept", "application/json")
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
		}
		return json.NewDecoder(resp.Body).Decode(v)
	}
	var o retentionui.Overview
	if err := call("GET", "", nil, &o); err != nil {
		return err
	}
	s := o.Sweeps[0]
	fmt.Printf("overview: %s is %q: %s\n", s.Prefix, s.State, s.Summary)
	if s.Backlog == nil || s.Backlog.Parked != 1 || s.Backlog.Held != 1 {
		return fmt.Errorf("overview: backlog %+v, want 1 parked (%s) and 1 held (%s)", s.Backlog, poison, legal)
	}
	var why retentionui.Why
	if err := call("GET", "why?"+url.Values{"prefix": {prefix}, "id": {legal}}.Encode(), nil, &why); err != nil {
		return err
	}
	fmt.Printf("why %s: %s (%s)\n", legal, why.State, why.Searched)

	svc.refuses.Store(false)
	fmt.Println("the archive is fixed: requeue the parked job from the console")
	var res retentionui.Requeued
	if err := call("POST", "requeue", url.Values{"prefix": {prefix}, "id": {poison}}, &res); err != nil {
		return err
	}
	fmt.Printf("requeued %d (%s)\n", res.Requeued, res.ID)
	deadline := time.Now().Add(wait / 2)
	for time.Now().Before(deadline) {
		svc.mu.Lock()
		_, left := svc.jobs[poison]
		svc.mu.Unlock()
		if !left {
			fmt.Printf("%s cleared by the next pass\n", poison)
			return scrapeParked(ctx, c, metricsURL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not cleared %v after its requeue", poison, wait/2)
}

// scrapeParked prints the parked gauge of /metrics, served beside the
// console.
func scrapeParked(ctx context.Context, c *http.Client, metricsURL string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", metricsURL, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "retention_parked_markers") {
			fmt.Println("metrics: " + line)
		}
	}
	return nil
}
