package retentionui_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/retentionui"
)

var updateScreenshot = flag.Bool("screenshot", false, "write the overview's screenshot to overview.png")

// One headless Chromium serves every browser test of the binary: each test
// opens a tab of its own.
var browser struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
	dir    string
}

// chromiumPath finds Debian's chromium (scripts/test installs it).
func chromiumPath() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// newTab returns a tab of the shared browser, which it starts the first
// time. Without chromium the test is skipped, or fails when
// RETENTION_REQUIRE_SERVERS=1 (scripts/test sets it).
func newTab(t *testing.T) context.Context {
	t.Helper()
	browser.once.Do(func() {
		path, err := chromiumPath()
		if err != nil {
			browser.err = fmt.Errorf("no chromium on PATH: %w", err)
			return
		}
		if browser.dir, err = os.MkdirTemp("", "retentionui-chromium"); err != nil {
			browser.err = err
			return
		}
		// The flags a root user on a closed network needs: no sandbox (it
		// refuses root), no GPU, and nothing that calls home.
		opts := []chromedp.ExecAllocatorOption{
			chromedp.ExecPath(path),
			chromedp.UserDataDir(browser.dir),
			chromedp.Flag("headless", true),
			chromedp.Flag("no-sandbox", true),
			chromedp.Flag("disable-gpu", true),
			chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true),
			chromedp.Flag("no-first-run", true),
			chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.WindowSize(1100, 900),
		}
		allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelCtx := chromedp.NewContext(allocCtx)
		browser.ctx = ctx
		browser.cancel = func() { cancelCtx(); cancelAlloc() }
		// Start the browser now, so that a broken install fails here.
		browser.err = chromedp.Do(ctx)
	})
	if browser.err != nil {
		if os.Getenv("RETENTION_REQUIRE_SERVERS") == "1" {
			t.Fatalf("browser test: %v (RETENTION_REQUIRE_SERVERS=1)", browser.err)
		}
		t.Skipf("browser test skipped: %v", browser.err)
	}
	tab, cancel := chromedp.NewContext(browser.ctx)
	tab, cancelTimeout := context.WithTimeout(tab, time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel() })
	return tab
}

// stopBrowser ends the shared browser, if a test started it.
func stopBrowser() {
	if browser.cancel != nil {
		browser.cancel()
	}
	if browser.dir != "" {
		os.RemoveAll(browser.dir)
	}
}

// text returns the visible text of the first element sel selects.
func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err, "text of %s", sel)
	return v
}

// count returns how many elements sel selects.
func count(t *testing.T, tab context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(tab, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
	require.NoError(t, err, "count of %s", sel)
	return n
}

func TestBrowserOverviewShowsTheBacklog(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	srv := serve(t, f.options())
	require.NoError(t, chromedp.Do(tab, chromedp.Navigate(srv.URL+"/console/")))
	b, err := f.jobs.Backlog(context.Background(), retentionui.DefaultLimit)
	require.NoError(t, err)
	require.Equal(t, backlogSize, b.Due)
	section := `section[data-prefix="` + jobs + `"] `
	for field, want := range map[string]int{"due": b.Due, "held": b.Held, "parked": b.Parked, "retrying": b.Retrying} {
		assert.Equal(t, strconv.Itoa(want), text(t, tab, section+`[data-field="`+field+`"]`), "the page's %s", field)
	}
	assert.Equal(t, "PARKED", strings.ToUpper(text(t, tab, section+`[data-field="state"]`)), "the state in words, not colour alone")
	assert.Contains(t, text(t, tab, section+`[data-field="summary"]`), "1 parked")

	shot, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(shot))
	require.NoError(t, err, "the screenshot is a PNG")
	assert.Greater(t, img.Bounds().Dy(), 200)
	if *updateScreenshot {
		require.NoError(t, os.WriteFile("overview.png", shot, 0o644))
	}
}

func TestBrowserRequeueMovesTheParkedMarkerBack(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	srv := serve(t, f.options())
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(srv.URL+"/console/sweep?prefix="+url.QueryEscape(jobs)),
		chromedp.Click(chromedp.CSS(`tr[data-parked-id="`+poison+`"] [data-action="requeue"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-field="requeued"]`)),
	))
	assert.Contains(t, text(t, tab, `[data-field="requeued"]`), "Requeued 1")
	assert.Empty(t, parkedIDs(t, f.jobs), "the store holds no parked marker")
	assertDueAgain(t, f.jobs, poison)
	assert.Zero(t, count(t, tab, "tr[data-parked-id]"), "the page no longer lists it as parked")
}

// TestBrowserReleaseMakesTheHeldMarkerDue: the held row's Release lifts
// the hold in the store; the page says so and lists the marker as due.
func TestBrowserReleaseMakesTheHeldMarkerDue(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	srv := serve(t, f.options())
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(srv.URL+"/console/sweep?prefix="+url.QueryEscape(jobs)),
		chromedp.Click(chromedp.CSS(`tr[data-held-id="`+held+`"] [data-action="release"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-field="released"]`)),
	))
	assert.Contains(t, text(t, tab, `[data-field="released"]`), "Released 1: due at once")
	assert.Empty(t, heldIDs(t, f.jobs), "the store holds no held marker")
	assert.Zero(t, count(t, tab, "tr[data-held-id]"), "the page no longer lists it as held")
	assert.Equal(t, 1, count(t, tab, `tr[data-due-id="`+held+`"]`), "it lists it as due")
}

func TestBrowserCrossSitePostIsRefused(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	srv := serve(t, f.options())
	// Another origin (another port) whose page posts to the console.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form method="post" action="%s/console/requeue"><input type="hidden" name="prefix" value="%s"><input type="hidden" name="id" value="%s"><button id="go">go</button></form>`,
			srv.URL, jobs, poison)
	}))
	defer evil.Close()
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(evil.URL),
		chromedp.Click(chromedp.CSS("#go")),
		chromedp.WaitVisible(chromedp.CSS("h1")),
	))
	assert.Equal(t, "403 Forbidden", text(t, tab, "h1"))
	assert.Equal(t, []string{poison}, parkedIDs(t, f.jobs), "still parked")
}

func TestBrowserReadOnlyHidesTheAction(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	opts := f.options()
	opts.ReadOnly = true
	srv := serve(t, opts)
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(srv.URL+"/console/sweep?prefix="+url.QueryEscape(jobs)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-parked-id="`+poison+`"]`)),
	))
	assert.Equal(t, 1, count(t, tab, "tr[data-parked-id]"))
	assert.Zero(t, count(t, tab, "[data-action]"))
}

// TestBrowserDueMeansTheSameOnEveryPage: the sweep page's due count is the
// overview's; the held marker reads as held until its hold's end and the
// parked one as waiting for a requeue, neither under Due nor as overdue.
func TestBrowserDueMeansTheSameOnEveryPage(t *testing.T) {
	tab := newTab(t)
	f := newFixture(t)
	srv := serve(t, f.options())
	section := `section[data-prefix="` + jobs + `"] `
	require.NoError(t, chromedp.Do(tab, chromedp.Navigate(srv.URL+"/console/")))
	overviewDue := text(t, tab, section+`[data-field="due"]`)
	require.Equal(t, strconv.Itoa(backlogSize), overviewDue)

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(srv.URL+"/console/sweep?prefix="+url.QueryEscape(jobs)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-held-id="`+held+`"]`)),
	))
	assert.Equal(t, overviewDue, text(t, tab, `[data-field="due-count"]`), "Due on the sweep page, want the overview's")
	assert.Equal(t, backlogSize, count(t, tab, "tr[data-due-id]"))
	assert.Zero(t, count(t, tab, `tr[data-due-id="`+held+`"], tr[data-due-id="`+poison+`"]`), "held and parked are not due")
	assert.Equal(t, "1", text(t, tab, `[data-field="held-count"]`))
	heldRow := text(t, tab, `tr[data-held-id="`+held+`"]`)
	assert.Contains(t, text(t, tab, `tr[data-held-id="`+held+`"] [data-field="next"]`), t0.Add(2*time.Hour).Format("15:04:05"), "held until its hold's end")
	assert.NotContains(t, strings.ToLower(heldRow), "next pass", heldRow)
	assert.Equal(t, "waits for a requeue", text(t, tab, `tr[data-parked-id="`+poison+`"] [data-field="next"]`))

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(srv.URL+"/console/why?"+url.Values{"prefix": {jobs}, "id": {poison}}.Encode()),
		chromedp.WaitVisible(chromedp.CSS(`[data-field="next"]`)),
	))
	assert.Equal(t, "waits for a requeue", text(t, tab, `[data-field="next"]`), "why of a parked id")
}
