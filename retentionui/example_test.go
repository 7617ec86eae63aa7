package retentionui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// The console mounted under /admin/retention/ beside the service's own
// routes; in a real service, wrap it in your authentication.
func ExampleNew() {
	ctx := context.Background()
	clock := retention.NewManualClock(time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC))
	kv := retention.NewMemKV()
	rec := &retentionui.Recorder{Clock: clock}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: time.Hour,
		Clear:     func(context.Context, string) error { return nil },
		Clock:     clock,
		Observer:  rec,
	})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"job-1", "job-2"} {
		if err := sweep.Mark(ctx, kv, id, clock.Now().Add(-90*time.Minute)); err != nil {
			panic(err)
		}
	}
	console, err := retentionui.New(retentionui.Options{
		Sweeps:   []*retention.Sweep{sweep},
		Details:  map[string]retentionui.Detail{"jobs/done/": {Retention: time.Hour, KV: kv}},
		Recorder: rec,
		Clock:    clock,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/retention/", http.StripPrefix("/admin/retention", console))

	overview := func() {
		r := httptest.NewRequest("GET", "/admin/retention/", nil)
		r.Header.Set("Accept", "application/json")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		var o retentionui.Overview
		if err := json.Unmarshal(w.Body.Bytes(), &o); err != nil {
			panic(err)
		}
		for _, s := range o.Sweeps {
			fmt.Printf("%s %s: %s\n", s.Prefix, s.State, s.Summary)
		}
	}
	overview()
	if _, err := sweep.Pass(ctx); err != nil {
		panic(err)
	}
	overview()
	// Output:
	// jobs/done/ behind: Behind: 2 due, the oldest 30m0s past due (more than 1m0s).
	// jobs/done/ ok: Keeping up: nothing is due.
}
