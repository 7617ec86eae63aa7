// Package retentionui is an operator's console for retention sweeps: an
// http.Handler that shows what every sweep of a service is doing and lets
// an operator act on it, and the JSON the retentionctl command reads.
//
// # Basics
//
// Give New the sweeps (and a Recorder, set also as each sweep's
// Config.Observer), and mount the Handler behind your authentication (it
// has none of its own) under any path, with http.StripPrefix: see the
// package's example.
//
// The overview says for each sweep its state in a word (ok, behind,
// retrying, parked, error) and a sentence, its Backlog, its last pass, its
// lease and its lag. A sweep's page lists the markers it has not cleared
// under their one state, as the overview counts them: due (clearable now:
// the next pass clears them, longest overdue first), retrying (with their
// next try), held (until their hold's end; not late), with a Release
// action for one whose hold is lifted, and parked (they wait for a
// requeue), with a Requeue action for one or all; and it looks an id up:
// when it will be cleared, and why not yet.
//
// # A fleet
//
// With Config.Replica set on the sweeps of every replica, the overview
// reads what the fleet shares in its store (retention.Sweep.Fleet), so
// that every replica's console shows the same: who sweeps and since when,
// whether this replica does, the last passes, and the last hour as a chart
// drawn on the server (FleetStatus). A requeue or a release then wakes the
// replica that sweeps, wherever it was made, and the answer says by when
// it passes.
//
// # JSON
//
// Every page answers with JSON when asked with "Accept: application/json",
// at the same URL: GET / gives an Overview, GET /sweep?prefix=P a
// SweepPage, GET /why?prefix=P&id=X a Why, POST /requeue (a form of
// prefix and id, or prefix and all=true) a Requeued, and POST /release (a
// form of prefix and id) a Released: each exactly that type, with no key
// the type lacks. An error is an ErrorBody with the status: 400 for a
// malformed request or an id the sweep's rule refuses, 403 for a refused
// action (read-only, or a cross-origin POST), 404 for an unknown prefix or
// page, 405 for a wrong method, 409 for requeueing an id that is not
// parked or releasing one that is not held, 500 for a store error or
// Options.Timeout.
//
// # Safety
//
// Every change is a POST; a POST whose Origin or Sec-Fetch-Site header
// says it comes from another site is refused (http.CrossOriginProtection),
// and Options.ReadOnly hides and refuses every action. The prefix of a
// request must be one of the sweeps' and its id must pass the sweep's id
// rule; pages are html/template, which escapes by context; the handler
// logs nothing.
//
// A request reads a bounded number of keys however large the backlog: the
// overview calls Sweep.Backlog with Options.Limit for each sweep (at most
// four Scan calls of Limit+1 keys in each of three ranges), a sweep's
// page Sweep.Pending and Sweep.Parked with Limit, and a look-up those two and
// at most ten Scan calls of Limit keys more. Past the limit the counts
// read "or more" and the lists say they are cut off; a look-up of an id
// beyond what it read says so rather than guessing. Only Requeue of every
// parked marker reads the whole parked range, as Sweep.Requeue does, and a
// Release the retry range from now on, as Sweep.ReleaseHolds does.
//
// The handler calls the sweeps' read methods, which take no lock a pass
// needs, and the Recorder holds its mutex only to copy a few fields: a
// slow store makes the page slow (up to Options.Timeout), never the sweep.
package retentionui
