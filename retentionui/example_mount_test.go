package retentionui_test

import (
	"net/http"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionui"
)

// mountConsole mounts the console for two sweeps under /admin/retention/,
// behind the service's own authentication. rec must also be the sweeps'
// Config.Observer; its Next passes every call on to the metrics observer.
func mountConsole(mux *http.ServeMux, requireAdmin func(http.Handler) http.Handler, rec *retentionui.Recorder, kv retention.KV, runs, uploads *retention.Sweep) error {
	console, err := retentionui.New(retentionui.Options{
		Sweeps:   []*retention.Sweep{runs, uploads},
		Details:  map[string]retentionui.Detail{"runs/done/": {Retention: 7 * 24 * time.Hour, KV: kv}},
		Recorder: rec,   // last pass, lease and lag on the overview
		ReadOnly: false, // true hides and refuses every action
	})
	if err != nil {
		return err
	}
	mux.Handle("/admin/retention/", requireAdmin(http.StripPrefix("/admin/retention", console)))
	return nil
}

var _ = mountConsole
