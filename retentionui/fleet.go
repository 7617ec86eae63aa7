package retentionui

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/marksweep/retention"
)

// FleetStatus is what the replicas of a fleet share about a sweep, read
// from its store (retention.Sweep.Fleet), so that every replica's console
// shows the same: who sweeps and since when, the last passes and the last
// hour. It is there when the sweeps' Config.Replica is set.
type FleetStatus struct {
	// Replica is this replica's Config.Replica; Sweeps says it holds the
	// lease.
	Replica string `json:"replica"`
	Sweeps  bool   `json:"sweeps"`
	// Holder is the replica that holds the lease, since Since; Released
	// says it gave the lease up after its last pass, and none holds it.
	Holder   string     `json:"holder"`
	Since    *time.Time `json:"since"`
	Released bool       `json:"released"`
	// NextPass is when Holder passes next unless woken; null when not
	// known. WakePollMs is how often it reads the wake key that a Requeue
	// on any replica writes: 0 when it reads none.
	NextPass   *time.Time `json:"next_pass"`
	WakePollMs int64      `json:"wake_poll_ms"`
	// Silent says Holder's next pass is more than a minute late on its
	// record: it may be gone, and another replica takes over once its
	// lease expires.
	Silent bool `json:"silent"`
	// Summary says who sweeps in a sentence.
	Summary string `json:"summary"`
	// LastPasses are the last pass of each of the last minutes that had
	// one, newest first, at most five.
	LastPasses []FleetPass `json:"last_passes"`
	// Minutes are the last hour's passes by minute, oldest first: the
	// overview's chart.
	Minutes []FleetMinute `json:"minutes"`

	now time.Time // the page's, for the chart
}

// FleetPass is a pass of the fleet: when it ended, by whom, what it did.
type FleetPass struct {
	At         time.Time `json:"at"`
	Replica    string    `json:"replica"`
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

// FleetMinute is a minute of the fleet's passes: how many ended in it,
// how many of them failed, the entities they cleared and the clears that
// failed, and the backlog's age as a pass began (the most overdue entity
// cleared).
type FleetMinute struct {
	Start    time.Time `json:"start"`
	Passes   int       `json:"passes"`
	Errors   int       `json:"errors"`
	Cleared  int       `json:"cleared"`
	Failed   int       `json:"failed"`
	MaxLagMs int64     `json:"max_lag_ms"`
}

// lastPasses is how many passes FleetStatus.LastPasses holds.
const lastPasses = 5

// silentAfter is how late the holder's next pass may be on its record
// before the page says it may be gone: a pass takes time, and a record is
// written at most a second after it.
const silentAfter = time.Minute

// fleetStatus turns what Sweep.Fleet read into a FleetStatus, and nil when
// the store holds no record.
func fleetStatus(f retention.Fleet, now time.Time) *FleetStatus {
	if f.Holder == "" {
		return nil
	}
	fs := &FleetStatus{
		Replica: f.Replica, Sweeps: f.Replica != "" && f.Holder == f.Replica && !f.Released,
		Holder: f.Holder, Since: timePtr(f.Since), Released: f.Released, NextPass: timePtr(f.NextPass),
		WakePollMs: msOf(f.WakePoll), LastPasses: []FleetPass{}, Minutes: []FleetMinute{}, now: now,
	}
	for _, m := range f.Minutes {
		fs.Minutes = append(fs.Minutes, FleetMinute{Start: m.Start.UTC(), Passes: m.Passes, Errors: m.Errors,
			Cleared: m.Cleared, Failed: m.Failed, MaxLagMs: msOf(m.MaxLag)})
	}
	for i := len(f.Minutes) - 1; i >= 0 && len(fs.LastPasses) < lastPasses; i-- {
		m := f.Minutes[i]
		l := m.Last
		fs.LastPasses = append(fs.LastPasses, FleetPass{At: m.LastAt.UTC(), Replica: m.Replica, Error: m.LastErr,
			Cleared: l.Cleared, Failed: l.Failed, Retried: l.Retried, Parked: l.Parked, Held: l.Held,
			Malformed: l.Malformed, Scanned: l.Scanned, DurationMs: msOf(l.Duration), MaxLagMs: msOf(l.MaxLag)})
	}
	fs.Silent = !f.Released && !f.NextPass.IsZero() && now.Sub(f.NextPass) > silentAfter
	fs.Summary = fs.summary()
	return fs
}

// summary says who sweeps, and whether this replica does.
func (f *FleetStatus) summary() string {
	this := "This replica"
	if f.Replica != "" {
		this = "This replica (" + f.Replica + ")"
	}
	switch {
	case f.Released:
		return fmt.Sprintf("No replica sweeps: %s released the lease; the next to take it sweeps. %s does not sweep now.", f.Holder, this)
	case f.Silent:
		return fmt.Sprintf("%s holds the lease since %s, but its pass due at %s has not been recorded: it may be gone; another replica takes over once its lease expires. %s does not sweep.",
			f.Holder, f.Since.Format(time.TimeOnly+" MST"), f.NextPass.Format(time.TimeOnly+" MST"), this)
	case f.Sweeps:
		return fmt.Sprintf("%s sweeps: it holds the lease since %s.", this, f.Since.Format(time.TimeOnly+" MST"))
	}
	return fmt.Sprintf("%s does not sweep: %s does, holding the lease since %s.", this, f.Holder, f.Since.Format(time.TimeOnly+" MST"))
}

// applyFleet puts what the fleet shares in place of what the Recorder saw
// in this process: the last pass, the lease and the lag are then the same
// on every replica.
func applyFleet(st *SweepStatus, f *FleetStatus) {
	st.Fleet = f
	switch {
	case f.Released:
		st.Lease = retention.LeaseReleased.String()
	case f.Sweeps:
		st.Lease = retention.LeaseAcquired.String()
	default:
		st.Lease = retention.LeaseHeld.String()
	}
	if len(f.LastPasses) == 0 {
		return
	}
	l := f.LastPasses[0]
	passes := 0
	for _, m := range f.Minutes {
		passes += m.Passes
	}
	st.LastPass = &PassStatus{At: l.At, Passes: passes, Error: l.Error, Cleared: l.Cleared, Failed: l.Failed,
		Retried: l.Retried, Parked: l.Parked, Held: l.Held, Malformed: l.Malformed, Scanned: l.Scanned,
		DurationMs: l.DurationMs, MaxLagMs: l.MaxLagMs}
	lag := l.MaxLagMs
	st.LagMs = &lag
}

// wakeNote says when the sweep runs after a requeue: the replica that
// sweeps, and by when.
func wakeNote(f *FleetStatus, now time.Time) (by *time.Time, note string) {
	switch {
	case f == nil:
		return nil, ""
	case f.Released:
		return nil, "No replica holds the lease: the next to take it passes at once."
	case f.Sweeps:
		return timePtr(now), "This replica sweeps: it was woken and passes now."
	case f.WakePollMs > 0:
		t := now.Add(time.Duration(f.WakePollMs) * time.Millisecond)
		return timePtr(t), fmt.Sprintf("%s, which sweeps, reads the wake-up every %s: it passes by %s.",
			f.Holder, roundAge(time.Duration(f.WakePollMs)*time.Millisecond), t.UTC().Format("15:04:05.000 MST"))
	case f.NextPass != nil:
		return f.NextPass, fmt.Sprintf("%s, which sweeps, reads no wake-up: its next pass is at %s.",
			f.Holder, f.NextPass.Format("15:04:05.000 MST"))
	}
	return nil, ""
}

// chart is the overview's chart of the last hour, drawn on the server as
// inline SVG: a bar of cleared and one of failed clears per minute, and
// the backlog's age as a line. No script, nothing from elsewhere.
type chart struct {
	Bars        []chartBar
	Age         string // the polyline's points
	MaxCount    int
	MaxAge      string
	Label       string
	Width, Base int
}

type chartBar struct {
	X, Y, W, H int
	Class      string
	Title      string
}

const (
	chartMinutes = 60
	chartSlot    = 10 // px per minute
	chartHeight  = 100
)

// Chart draws the last hour of f, minute by minute, ending at the page's
// time.
func (f *FleetStatus) Chart() chart {
	c := chart{Width: chartMinutes * chartSlot, Base: chartHeight}
	end := f.now.Truncate(time.Minute)
	start := end.Add(-(chartMinutes - 1) * time.Minute)
	var maxAge int64
	for _, m := range f.Minutes {
		c.MaxCount = max(c.MaxCount, m.Cleared, m.Failed)
		maxAge = max(maxAge, m.MaxLagMs)
	}
	c.MaxCount = max(c.MaxCount, 1)
	var points []byte
	cleared, failed, passes := 0, 0, 0
	for _, m := range f.Minutes {
		if m.Start.Before(start) || m.Start.After(end) {
			continue
		}
		cleared, failed, passes = cleared+m.Cleared, failed+m.Failed, passes+m.Passes
		x := int(m.Start.Sub(start)/time.Minute) * chartSlot
		title := fmt.Sprintf("%s: %d passes (%d failed), cleared %d, failed clears %d, backlog age %s",
			m.Start.Format("15:04"), m.Passes, m.Errors, m.Cleared, m.Failed, roundAge(time.Duration(m.MaxLagMs)*time.Millisecond))
		if h := m.Cleared * chartHeight / c.MaxCount; m.Cleared > 0 {
			h = max(h, 1)
			c.Bars = append(c.Bars, chartBar{X: x + 1, Y: chartHeight - h, W: chartSlot/2 - 1, H: h, Class: "cleared", Title: title})
		}
		if h := m.Failed * chartHeight / c.MaxCount; m.Failed > 0 {
			h = max(h, 1)
			c.Bars = append(c.Bars, chartBar{X: x + chartSlot/2, Y: chartHeight - h, W: chartSlot/2 - 1, H: h, Class: "failed", Title: title})
		}
		// A minute with passes gets a tick, so that an idle hour shows its passes too.
		c.Bars = append(c.Bars, chartBar{X: x + 1, Y: chartHeight + 2, W: chartSlot - 2, H: 3, Class: passClass(m), Title: title})
		y := chartHeight
		if maxAge > 0 {
			y = chartHeight - int(m.MaxLagMs*chartHeight/maxAge)
		}
		points = fmt.Appendf(points, "%d,%d ", x+chartSlot/2, y)
	}
	c.Age = string(points)
	c.MaxAge = roundAge(time.Duration(maxAge) * time.Millisecond).String()
	c.Label = "The last hour: " + strconv.Itoa(passes) + " passes cleared " + strconv.Itoa(cleared) +
		" and failed " + strconv.Itoa(failed) + " clears; the backlog was at most " + c.MaxAge + " old."
	return c
}

func passClass(m FleetMinute) string {
	if m.Errors > 0 {
		return "pass-failed"
	}
	return "pass"
}

// fleet reads what the fleet shares about s, and nil when there is no
// record or it cannot be read: the page then shows what the Recorder saw.
func (h *Handler) fleet(ctx context.Context, s *retention.Sweep, now time.Time) *FleetStatus {
	f, err := s.Fleet(ctx)
	if err != nil {
		return nil
	}
	return fleetStatus(f, now)
}
