package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/retentionui"
)

// TestStatusSaysWhoSweeps: status prints, for a sweep with the fleet's
// record, who sweeps, the last passes by whom, and the last hour; requeue
// and release say when the sweep passes.
func TestStatusSaysWhoSweeps(t *testing.T) {
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	since := now.Add(-time.Hour)
	o := retentionui.Overview{Now: now, Sweeps: []retentionui.SweepStatus{{
		Prefix: "jobs/done/", State: retentionui.StateOK, Lease: "held",
		Fleet: &retentionui.FleetStatus{
			Replica: "web-b", Holder: "web-a", Since: &since,
			Summary: "This replica (web-b) does not sweep: web-a does, holding the lease since 00:00:00 UTC.",
			LastPasses: []retentionui.FleetPass{
				{At: now.Add(-2 * time.Second), Replica: "web-a", Cleared: 7},
				{At: now.Add(-62 * time.Second), Replica: "web-a", Failed: 1, Error: "boom"},
			},
			Minutes: []retentionui.FleetMinute{{Passes: 3, Cleared: 7}, {Passes: 1, Failed: 1, Errors: 1}},
		},
	}}}
	body, err := json.Marshal(o)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, printStatus(&out, body))
	assert.Contains(t, out.String(), "jobs/done/: This replica (web-b) does not sweep: web-a does")
	assert.Contains(t, out.String(), "last passes: 2s ago by web-a: 7 cleared, 0 failed; 1m2s ago by web-a: 0 cleared, 1 failed, failed")
	assert.Contains(t, out.String(), "last hour: 4 passes, 7 cleared, 1 failed clears")

	by := now.Add(time.Second)
	body, err = json.Marshal(retentionui.Requeued{Prefix: "jobs/done/", ID: "job-1", Requeued: 1, Sweeper: "web-a", PassBy: &by,
		Pass: "web-a, which sweeps, reads the wake-up every 1s: it passes by 01:00:01.000 UTC."})
	require.NoError(t, err)
	out.Reset()
	require.NoError(t, printRequeued(&out, body))
	assert.Contains(t, out.String(), "web-a, which sweeps, reads the wake-up every 1s: it passes by 01:00:01.000 UTC.")

	body, err = json.Marshal(retentionui.Released{Prefix: "jobs/done/", ID: "job-2", Released: 1, Sweeper: "web-a", PassBy: &by,
		Pass: "web-a, which sweeps, reads the wake-up every 1s: it passes by 01:00:01.000 UTC."})
	require.NoError(t, err)
	out.Reset()
	require.NoError(t, printReleased(&out, body))
	assert.Contains(t, out.String(), "released 1 (job-2 of jobs/done/): due at once")
	assert.Contains(t, out.String(), "web-a, which sweeps, reads the wake-up every 1s: it passes by 01:00:01.000 UTC.")
}
