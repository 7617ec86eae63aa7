package retentionui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// memLocker is a Locker of one process, shared by the replicas of a test.
type memLocker struct {
	mu     sync.Mutex
	holder *memLease
}

type memLease struct {
	l    *memLocker
	lost chan struct{}
	once sync.Once
}

func (m *memLocker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holder != nil {
		return nil, fmt.Errorf("memLocker: %w", retention.ErrLeaseHeld)
	}
	m.holder = &memLease{l: m, lost: make(chan struct{})}
	return m.holder, nil
}

func (m *memLocker) held() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.holder != nil
}

func (l *memLease) Lost() <-chan struct{} { return l.lost }

func (l *memLease) Release(context.Context) error {
	l.l.mu.Lock()
	if l.l.holder == l {
		l.l.holder = nil
	}
	l.l.mu.Unlock()
	l.once.Do(func() { close(l.lost) })
	return nil
}

// twoReplicas is a fleet of two replicas of the jobs sweep over one
// store, each with its console: web-a holds the lease and sweeps; web-b
// does not. The poison id's clear fails until fixed, and it is parked; the
// held id's clear holds it for a day until lifted.
type twoReplicas struct {
	kv       *retention.MemKV
	a, b     *retention.Sweep
	srvA     *httptest.Server
	srvB     *httptest.Server
	fixed    atomic.Bool
	lifted   atomic.Bool
	clearedN atomic.Int64
}

func newTwoReplicas(t *testing.T) *twoReplicas {
	t.Helper()
	f := &twoReplicas{kv: retention.NewMemKV()}
	locker := &memLocker{}
	clear := func(_ context.Context, id string) error {
		if id == poison && !f.fixed.Load() {
			return errors.New("the archive refuses it")
		}
		if id == held && !f.lifted.Load() {
			return retention.Hold(time.Now().Add(24 * time.Hour))
		}
		f.clearedN.Add(1)
		return nil
	}
	newReplica := func(name string) *retention.Sweep {
		s, err := retention.New(f.kv, retention.Config{
			Prefix: jobs, Retention: time.Hour, Interval: time.Minute, Clear: clear, MaxAttempts: 1,
			Lease: locker, Replica: name, Logger: discard,
		})
		require.NoError(t, err)
		return s
	}
	f.a, f.b = newReplica("web-a"), newReplica("web-b")
	ctx := t.Context()
	for i := range 20 {
		require.NoError(t, f.a.Mark(ctx, f.kv, fmt.Sprintf("job-%03d", i), time.Now().Add(-2*time.Hour)))
	}
	require.NoError(t, f.a.Mark(ctx, f.kv, poison, time.Now().Add(-3*time.Hour)))
	require.NoError(t, f.a.Mark(ctx, f.kv, held, time.Now().Add(-3*time.Hour)))
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { _ = f.a.Run(runCtx) })
	waitFor(t, "web-a to take the lease, park the poison id and hold the held one", func() bool {
		return locker.held() && len(parkedIDs(t, f.a)) == 1 && len(heldIDs(t, f.a)) == 1
	})
	wg.Go(func() { _ = f.b.Run(runCtx) })
	for _, r := range []struct {
		srv **httptest.Server
		s   *retention.Sweep
	}{{&f.srvA, f.a}, {&f.srvB, f.b}} {
		*r.srv = serve(t, retentionui.Options{Sweeps: []*retention.Sweep{r.s}, Details: map[string]retentionui.Detail{jobs: {Retention: time.Hour, KV: f.kv}}})
	}
	return f
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// overviewJSON gets the overview of the console at base.
func overviewJSON(t *testing.T, base string) retentionui.Overview {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/console/", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var o retentionui.Overview
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&o))
	return o
}

// TestFleetViewIsTheSameOnEveryReplica: the console of the replica that
// does not sweep shows the holder, the last passes and the hour that the
// sweeping replica's shows, read from the store, and says it does not
// sweep and who does.
func TestFleetViewIsTheSameOnEveryReplica(t *testing.T) {
	f := newTwoReplicas(t)
	a, b := overviewJSON(t, f.srvA.URL).Sweeps[0], overviewJSON(t, f.srvB.URL).Sweeps[0]
	require.NotNil(t, a.Fleet)
	require.NotNil(t, b.Fleet)
	assert.True(t, a.Fleet.Sweeps)
	assert.False(t, b.Fleet.Sweeps)
	assert.Equal(t, "acquired", a.Lease)
	assert.Equal(t, "held", b.Lease)
	assert.Contains(t, b.Fleet.Summary, "This replica (web-b) does not sweep: web-a does")
	assert.Contains(t, a.Fleet.Summary, "This replica (web-a) sweeps")
	assert.Equal(t, a.LastPass, b.LastPass, "the same last pass")
	require.NotNil(t, a.LastPass)
	assert.Equal(t, 20, a.LastPass.Cleared)
	assert.Equal(t, 1, a.LastPass.Parked)
	for _, fl := range []*retentionui.FleetStatus{a.Fleet, b.Fleet} {
		fl.Replica, fl.Sweeps, fl.Summary = "", false, ""
	}
	assert.Equal(t, a.Fleet, b.Fleet, "the same fleet on both consoles")
	assert.Equal(t, "web-a", a.Fleet.Holder)
	assert.Equal(t, "web-a", a.Fleet.LastPasses[0].Replica)
}

// TestRequeueAnswersWhenTheSweepRuns: a requeue's answer names the replica
// that sweeps and when it passes, through the console of either replica.
func TestRequeueAnswersWhenTheSweepRuns(t *testing.T) {
	f := newTwoReplicas(t)
	f.fixed.Store(true)
	req, err := http.NewRequest(http.MethodPost, f.srvB.URL+"/console/requeue", strings.NewReader(url.Values{"prefix": {jobs}, "id": {poison}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var r retentionui.Requeued
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	assert.Equal(t, 1, r.Requeued)
	assert.Equal(t, "web-a", r.Sweeper)
	require.NotNil(t, r.PassBy)
	assert.WithinDuration(t, start.Add(retention.DefaultWakePoll), *r.PassBy, 2*time.Second)
	assert.Contains(t, r.Pass, "web-a, which sweeps, reads the wake-up every 1s")
}

// TestReleaseAnswersWhenTheSweepRuns: a release through the console of the
// replica that does not sweep names the replica that does and when it
// passes, and that replica, whose memory holds the id for a day, clears it
// within its wake-up.
func TestReleaseAnswersWhenTheSweepRuns(t *testing.T) {
	f := newTwoReplicas(t)
	f.lifted.Store(true)
	before := f.clearedN.Load()
	req, err := http.NewRequest(http.MethodPost, f.srvB.URL+"/console/release", strings.NewReader(url.Values{"prefix": {jobs}, "id": {held}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var r retentionui.Released
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	assert.Equal(t, 1, r.Released)
	assert.Equal(t, "web-a", r.Sweeper)
	require.NotNil(t, r.PassBy)
	assert.WithinDuration(t, start.Add(retention.DefaultWakePoll), *r.PassBy, 2*time.Second)
	assert.Contains(t, r.Pass, "web-a, which sweeps, reads the wake-up every 1s")
	waitFor(t, "web-a to clear the released id", func() bool { return f.clearedN.Load() > before })
	took := time.Since(start)
	t.Logf("release through web-b's console to cleared by web-a, Interval 1m: %v", took)
	assert.Less(t, took, 10*time.Second, "within the wake-up and a pass, not the Interval nor the hold's end")
}

// TestBrowserFleetViewOnTwoReplicas: two replicas, two consoles: both show
// one fleet (who sweeps, the last passes) and the last hour's chart; a
// requeue through the console of the replica that does not sweep is
// cleared by the one that does within a wake-up and a pass, under a 1m
// Interval.
func TestBrowserFleetViewOnTwoReplicas(t *testing.T) {
	tab := newTab(t)
	f := newTwoReplicas(t)
	section := `section[data-prefix="` + jobs + `"] `
	seen := map[string]map[string]string{}
	for name, srv := range map[string]*httptest.Server{"a": f.srvA, "b": f.srvB} {
		require.NoError(t, chromedp.Do(tab, chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS(section+`[data-field="chart"]`))))
		seen[name] = map[string]string{}
		for _, field := range []string{"holder", "holder-since", "last-pass", "lease", "fleet-summary"} {
			seen[name][field] = text(t, tab, section+`[data-field="`+field+`"]`)
		}
		seen[name]["passes"] = text(t, tab, section+`[data-field="last-passes"] tbody`)
		assert.Positive(t, count(t, tab, section+`svg[data-field="chart"] rect.cleared`), "%s: the chart has a bar of cleared entities", name)
		assert.Positive(t, count(t, tab, section+`svg[data-field="chart"] rect.pass`), "%s: the chart has a tick per minute with passes", name)
	}
	for _, field := range []string{"holder", "holder-since", "last-pass", "passes"} {
		_, a, _ := strings.Cut(seen["a"][field], " ago ") // the last pass's age is the page's
		_, b, _ := strings.Cut(seen["b"][field], " ago ")
		assert.Equal(t, a, b, "the same %s on both consoles", field)
	}
	if *updateScreenshot {
		shot, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile("fleet.png", shot, 0o644))
	}
	assert.Equal(t, "web-a", seen["b"]["holder"])
	assert.Contains(t, seen["b"]["fleet-summary"], "This replica (web-b) does not sweep: web-a does")
	assert.Contains(t, seen["b"]["lease"], "another replica")
	assert.Contains(t, seen["a"]["lease"], "this replica")

	f.fixed.Store(true)
	before := f.clearedN.Load()
	start := time.Now()
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(f.srvB.URL+"/console/sweep?prefix="+url.QueryEscape(jobs)),
		chromedp.Click(chromedp.CSS(`tr[data-parked-id="`+poison+`"] [data-action="requeue"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-field="wake"]`)),
	))
	assert.Contains(t, text(t, tab, `[data-field="wake"]`), "web-a, which sweeps, reads the wake-up every 1s: it passes by")
	waitFor(t, "web-a to clear the requeued id", func() bool { return f.clearedN.Load() > before })
	took := time.Since(start)
	t.Logf("requeue through web-b's console to cleared by web-a, Interval 1m: %v", took)
	assert.Less(t, took, 10*time.Second, "within the wake-up and a pass, not the Interval")
	waitFor(t, "the marker's delete", func() bool {
		b, err := f.a.Backlog(context.Background(), 10)
		return err == nil && b == (retention.Backlog{Held: 1}) // the held id stays held
	})
}

// TestBrowserReleaseOnTwoReplicas: a release through the console of the
// replica that does not sweep says which replica clears it and by when,
// and that replica, whose memory holds the id for a day, clears it within
// a wake-up and a pass, under a 1m Interval.
func TestBrowserReleaseOnTwoReplicas(t *testing.T) {
	tab := newTab(t)
	f := newTwoReplicas(t)
	f.lifted.Store(true)
	before := f.clearedN.Load()
	require.NoError(t, chromedp.Do(tab, chromedp.Navigate(f.srvB.URL+"/console/sweep?prefix="+url.QueryEscape(jobs))))
	start := time.Now()
	require.NoError(t, chromedp.Do(tab,
		chromedp.Click(chromedp.CSS(`tr[data-held-id="`+held+`"] [data-action="release"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-field="wake"]`)),
	))
	assert.Contains(t, text(t, tab, `[data-field="released"]`), "Released 1")
	assert.Contains(t, text(t, tab, `[data-field="wake"]`), "web-a, which sweeps, reads the wake-up every 1s: it passes by")
	waitFor(t, "web-a to clear the released id", func() bool { return f.clearedN.Load() > before })
	took := time.Since(start)
	t.Logf("click of Release on web-b's console to cleared by web-a, Interval 1m, hold a day: %v", took)
	assert.Less(t, took, 10*time.Second, "within the wake-up and a pass, not the Interval nor the hold's end")
	assert.Empty(t, heldIDs(t, f.a))
}

// TestFleetSaysWhenTheHolderFellSilent: a holder whose next pass is more
// than a minute late on its record may be gone, and the page says so.
func TestFleetSaysWhenTheHolderFellSilent(t *testing.T) {
	kv := &cutOffKV{MemKV: retention.NewMemKV()}
	clock := retention.NewManualClock(t0)
	s, err := retention.New(kv, retention.Config{Prefix: jobs, Retention: time.Hour, Interval: time.Minute, Clock: clock,
		Lease: &memLocker{}, Replica: "web-a", Logger: discard, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	waitFor(t, "the first record", func() bool { f, err := s.Fleet(ctx); return err == nil && f.Holder == "web-a" })
	kv.cut.Store(true) // the holder's host vanishes: it writes nothing more, not even its release
	cancel()
	<-done
	kv.cut.Store(false)

	other, err := retention.New(kv, retention.Config{Prefix: jobs, Retention: time.Hour, Clock: clock, Replica: "web-b",
		Logger: discard, Clear: func(context.Context, string) error { return nil }})
	require.NoError(t, err)
	h, err := retentionui.New(retentionui.Options{Sweeps: []*retention.Sweep{other}, Clock: clock})
	require.NoError(t, err)
	fleetOf := func() *retentionui.FleetStatus {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("Accept", "application/json")
		h.ServeHTTP(rec, req)
		var o retentionui.Overview
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &o))
		require.NotNil(t, o.Sweeps[0].Fleet)
		return o.Sweeps[0].Fleet
	}
	clock.Advance(90 * time.Second) // its next pass was due 30s ago
	assert.False(t, fleetOf().Silent)
	clock.Advance(time.Minute)
	fl := fleetOf()
	assert.True(t, fl.Silent)
	assert.False(t, fl.Released)
	assert.Contains(t, fl.Summary, "web-a holds the lease since 09:26:53 UTC, but its pass due at 09:27:53 UTC has not been recorded: it may be gone")
}

// cutOffKV is a store a replica can no longer write to once cut.
type cutOffKV struct {
	*retention.MemKV
	cut atomic.Bool
}

var errCutOff = errors.New("cut off")

func (c *cutOffKV) Put(ctx context.Context, key, value []byte) error {
	if c.cut.Load() {
		return errCutOff
	}
	return c.MemKV.Put(ctx, key, value)
}

func (c *cutOffKV) Move(ctx context.Context, from, to [][]byte) error {
	if c.cut.Load() {
		return errCutOff
	}
	return c.MemKV.Move(ctx, from, to)
}
