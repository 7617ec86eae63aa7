package retentionui

import (
	"time"
)

// The JSON of each page: the same URL as the page, asked for with
// "Accept: application/json". Times are RFC 3339 in UTC, durations whole
// milliseconds (fields ending in _ms); a field that is not known is null.

// Overview is the JSON of the overview, GET /.
type Overview struct {
	Now      time.Time     `json:"now"`
	ReadOnly bool          `json:"read_only"`
	Limit    int           `json:"limit"` // the most markers a count goes up to
	Sweeps   []SweepStatus `json:"sweeps"`
}

// The states of a sweep, worst last: SweepStatus.State is the worst that
// applies.
const (
	StateOK       = "ok"       // nothing due past Options.Behind, nothing retrying, parked or failing
	StateBehind   = "behind"   // the oldest due marker is more than Options.Behind past due
	StateRetrying = "retrying" // clears failed and are tried again
	StateParked   = "parked"   // markers wait for a Requeue
	StateError    = "error"    // the backlog could not be read, or the last pass failed
)

// SweepStatus is one sweep on the overview.
type SweepStatus struct {
	Prefix      string `json:"prefix"`
	RetentionMs *int64 `json:"retention_ms"` // Detail.Retention; null when not given
	State       string `json:"state"`        // StateOK ... StateError
	Summary     string `json:"summary"`      // the state in a sentence
	// Backlog is Sweep.Backlog's answer; null when it failed (see Error).
	Backlog *BacklogStatus `json:"backlog"`
	Error   string         `json:"error,omitempty"`
	// LastPass is the last pass the Recorder saw; null when none.
	LastPass *PassStatus `json:"last_pass"`
	// Lease is the last lease event the Recorder saw: "acquired" (this
	// replica sweeps), "held" (another replica does), "lost", "released";
	// "unknown" when none was seen (no Lease, or no Recorder).
	Lease string `json:"lease"`
	// LagMs is how long past due the newest entity cleared was when its
	// marker was deleted; null when the Recorder saw none.
	LagMs *int64 `json:"lag_ms"`
	// Fleet is what the fleet's replicas share through the store: who
	// sweeps, the last passes and the last hour. With it, LastPass, Lease
	// and LagMs are the fleet's, the same on every replica. Null when the
	// store holds no record (no Config.Replica).
	Fleet *FleetStatus `json:"fleet"`
}

// BacklogStatus is a retention.Backlog. Counts stop at Overview.Limit;
// More says one did, or may have.
type BacklogStatus struct {
	Due           int        `json:"due"`
	OldestID      string     `json:"oldest_id,omitempty"`
	OldestDue     *time.Time `json:"oldest_due"`
	AgeMs         int64      `json:"age_ms"`
	Retrying      int        `json:"retrying"`
	RetryingAgeMs int64      `json:"retrying_age_ms"`
	Held          int        `json:"held"`
	Parked        int        `json:"parked"`
	More          bool       `json:"more"`
}

// PassStatus is the last pass of a sweep, from its retention.Stats.
type PassStatus struct {
	At         time.Time `json:"at"` // when it ended
	Passes     int       `json:"passes"`
	Error      string    `json:"error,omitempty"`
	Cleared    int       `json:"cleared"`
	Failed     int       `json:"failed"`
	Retried    int       `json:"retried"`
	Parked     int       `json:"parked"`
	Held       int       `json:"held"`
	Malformed  int       `json:"malformed"`
	Scanned    int       `json:"scanned"`
	DurationMs int64     `json:"duration_ms"`
	MaxLagMs   int64     `json:"max_lag_ms"`
}

// SweepPage is the JSON of one sweep's page, GET /sweep?prefix=P: the
// markers not cleared, one list per state (see retention.MarkerState), so
// that Due counts what the overview's BacklogStatus.Due counts.
type SweepPage struct {
	Now      time.Time `json:"now"`
	ReadOnly bool      `json:"read_only"`
	Limit    int       `json:"limit"`
	Prefix   string    `json:"prefix"`
	// Due, Retrying and Held are Sweep.Pending's markers of each state,
	// longest past due first. Due holds the markers that are due:
	// clearable now, the next pass clears them. Retrying and held markers
	// are not due: they wait for their next try or their hold's end.
	// PendingCut says Sweep.Pending stopped at Limit: the lists may miss
	// some.
	Due        []Marker `json:"due"`
	Retrying   []Marker `json:"retrying"`
	Held       []Marker `json:"held"`
	PendingCut bool     `json:"pending_cut"`
	// Parked is Sweep.Parked: the parked markers, oldest first. They wait
	// for a requeue; no pass tries them until then. ParkedCut says the
	// list stopped at Limit.
	Parked    []Marker `json:"parked"`
	ParkedCut bool     `json:"parked_cut"`
}

// Marker is one marker of a list.
type Marker struct {
	ID    string `json:"id"`
	State string `json:"state"` // "due", "retrying", "held" or "parked"
	// Due is when the entity fell due; null for a parked marker of a
	// sweep whose retention was not given.
	Due *time.Time `json:"due"`
	// OverdueMs is how long past due a due marker is; null for a retrying,
	// held or parked one, which is not overdue but waits for its next try,
	// its hold's end or a requeue.
	OverdueMs *int64     `json:"overdue_ms"`
	Finished  *time.Time `json:"finished,omitempty"` // parked markers: when the entity finished
	Attempts  int        `json:"attempts"`
	// Next is a retrying marker's next try or a held marker's hold's end;
	// null when none is set: a due marker, a retrying one whose next try
	// came (the next pass tries them) or a parked one (it waits for a
	// requeue).
	Next *time.Time `json:"next"`
}

// The states of Why.State beyond those of a Marker.
const (
	WhyWaiting  = "waiting"   // not due yet: it falls due at Due
	WhyNotFound = "not found" // in none of the places searched
)

// Why is the JSON of a look-up, GET /why?prefix=P&id=X: when the entity
// of id X will be cleared, and why not yet.
type Why struct {
	Now    time.Time `json:"now"`
	Prefix string    `json:"prefix"`
	ID     string    `json:"id"`
	// State is a Marker state, WhyWaiting or WhyNotFound.
	State    string     `json:"state"`
	Due      *time.Time `json:"due"`
	Finished *time.Time `json:"finished,omitempty"`
	Attempts int        `json:"attempts"`
	Next     *time.Time `json:"next"`
	// Answer says it in a sentence; Searched says what was read.
	Answer   string `json:"answer"`
	Searched string `json:"searched"`
}

// Requeued is the JSON answer to POST /requeue.
type Requeued struct {
	Prefix   string `json:"prefix"`
	ID       string `json:"id,omitempty"` // the id asked for; empty with all
	All      bool   `json:"all"`
	Requeued int    `json:"requeued"` // markers put back
	// Sweeper is the replica that sweeps, woken to try them, and PassBy
	// when it passes at the latest; "" and null when the store holds no
	// fleet record (see FleetStatus).
	Sweeper string     `json:"sweeper,omitempty"`
	PassBy  *time.Time `json:"pass_by"`
	// Pass says when they are tried, in a sentence.
	Pass string `json:"pass,omitempty"`
}

// Released is the JSON answer to POST /release: the hold of a held marker
// lifted before its end (retention.Sweep.ReleaseHolds), its marker due at
// once. The sweep's next pass asks its Clear again: a Clear that still
// answers Hold holds it again.
type Released struct {
	Prefix   string `json:"prefix"`
	ID       string `json:"id"`
	Released int    `json:"released"` // held markers made due
	// Sweeper is the replica that sweeps, woken to clear them, and PassBy
	// when it passes at the latest; "" and null when the store holds no
	// fleet record (see FleetStatus).
	Sweeper string     `json:"sweeper,omitempty"`
	PassBy  *time.Time `json:"pass_by"`
	// Pass says when they are cleared, in a sentence.
	Pass string `json:"pass,omitempty"`
}

// ErrorBody is the JSON of every error answer, with its HTTP status: 400
// malformed request or id, 403 read-only or cross-origin, 404 unknown page
// or prefix, 405 wrong method, 409 requeue of an id not parked or release
// of an id not held, 500 a store error or timeout.
type ErrorBody struct {
	Status int    `json:"status"`
	Error  string `json:"error"`
}

func msOf(d time.Duration) int64 { return d.Milliseconds() }

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}
