package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/marksweep/retention/retentionui"
)

func decode[T any](body []byte) (T, error) {
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		return v, fmt.Errorf("the console's JSON: %w", err)
	}
	return v, nil
}

// clean makes s safe for a terminal: an id or prefix of a rule of the
// service's own may hold control bytes, which are shown escaped.
func clean(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func ms(v int64) string {
	d := time.Duration(v) * time.Millisecond
	if d >= time.Second {
		d = d.Round(time.Second)
	}
	return d.String()
}

func stamp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func atLeast(n int, more bool) string {
	if more {
		return strconv.Itoa(n) + "+"
	}
	return strconv.Itoa(n)
}

func printStatus(w io.Writer, body []byte) error {
	o, err := decode[retentionui.Overview](body)
	if err != nil {
		return err
	}
	tw := table(w)
	fmt.Fprintln(tw, "PREFIX\tSTATE\tDUE\tOLDEST\tRETRYING\tHELD\tPARKED\tLAST PASS\tLEASE\tLAG")
	for _, s := range o.Sweeps {
		due, oldest, retrying, held, parked := "?", "?", "?", "?", "?"
		if b := s.Backlog; b != nil {
			due, retrying, held, parked = atLeast(b.Due, b.More), atLeast(b.Retrying, b.More), atLeast(b.Held, b.More), atLeast(b.Parked, b.More)
			oldest = "-"
			if b.OldestID != "" {
				oldest = ms(b.AgeMs) + " late"
			}
		}
		last := "none seen"
		if p := s.LastPass; p != nil {
			last = fmt.Sprintf("%s ago, %d cleared", ms(o.Now.Sub(p.At).Milliseconds()), p.Cleared)
			if p.Error != "" {
				last += ", failed"
			}
		}
		lag := "-"
		if s.LagMs != nil {
			lag = ms(*s.LagMs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", clean(s.Prefix), s.State, due, oldest, retrying, held, parked, last, s.Lease, lag)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range o.Sweeps {
		if s.State != retentionui.StateOK {
			fmt.Fprintf(w, "%s: %s\n", clean(s.Prefix), clean(s.Summary))
		}
	}
	printFleet(w, o)
	return nil
}

// printDue lists the due markers: those the next pass clears. Retrying,
// held and parked markers are counted after them, never as due.
func printDue(w io.Writer, body []byte) error {
	p, err := decode[retentionui.SweepPage](body)
	if err != nil {
		return err
	}
	tw := table(w)
	fmt.Fprintln(tw, "ID\tDUE\tOVERDUE")
	for _, m := range p.Due {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", clean(m.ID), stamp(m.Due), overdue(m))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s due: the next pass clears them%s\n", atLeast(len(p.Due), p.PendingCut), cut(p.PendingCut, p.Limit))
	if len(p.Retrying)+len(p.Held)+len(p.Parked) > 0 {
		fmt.Fprintf(w, "not due: %s retrying, %s held, %s parked (retentionctl pending %s lists them)\n",
			atLeast(len(p.Retrying), p.PendingCut), atLeast(len(p.Held), p.PendingCut), atLeast(len(p.Parked), p.ParkedCut), clean(p.Prefix))
	}
	return nil
}

// printPending lists every marker not cleared, each with its state and
// what it waits for.
func printPending(w io.Writer, body []byte) error {
	p, err := decode[retentionui.SweepPage](body)
	if err != nil {
		return err
	}
	tw := table(w)
	fmt.Fprintln(tw, "ID\tSTATE\tDUE\tOVERDUE\tATTEMPTS\tNEXT TRY")
	for _, list := range [][]retentionui.Marker{p.Due, p.Retrying, p.Held, p.Parked} {
		for _, m := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", clean(m.ID), m.State, stamp(m.Due), overdue(m), m.Attempts, nextTry(m))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s due, %s retrying, %s held, %s parked%s\n",
		atLeast(len(p.Due), p.PendingCut), atLeast(len(p.Retrying), p.PendingCut), atLeast(len(p.Held), p.PendingCut),
		atLeast(len(p.Parked), p.ParkedCut), cut(p.PendingCut || p.ParkedCut, p.Limit))
	if len(p.Held) > 0 {
		fmt.Fprintf(w, "held ones wait for their hold's end; once a hold is lifted: retentionctl release %s ID\n", clean(p.Prefix))
	}
	return nil
}

// overdue says how long past due a due marker is; "-" for the others,
// which are not overdue.
func overdue(m retentionui.Marker) string {
	if m.OverdueMs == nil {
		return "-"
	}
	return ms(*m.OverdueMs)
}

// nextTry says when a pass tries m next, or what it waits for.
func nextTry(m retentionui.Marker) string {
	switch {
	case m.State == "parked":
		return "waits for a requeue"
	case m.State == "held" && m.Next != nil:
		return "held until " + stamp(m.Next)
	case m.Next != nil:
		return stamp(m.Next)
	}
	return "next pass"
}

func cut(isCut bool, limit int) string {
	if isCut {
		return fmt.Sprintf(" (the first %d: there may be more)", limit)
	}
	return ""
}

func printParked(w io.Writer, body []byte) error {
	p, err := decode[retentionui.SweepPage](body)
	if err != nil {
		return err
	}
	tw := table(w)
	fmt.Fprintln(tw, "ID\tFINISHED\tDUE\tATTEMPTS\tNEXT TRY")
	for _, m := range p.Parked {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", clean(m.ID), stamp(m.Finished), stamp(m.Due), m.Attempts, nextTry(m))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d parked%s\n", len(p.Parked), cut(p.ParkedCut, p.Limit))
	if len(p.Parked) > 0 {
		fmt.Fprintf(w, "they wait for a requeue: retentionctl requeue %s ID (or --all)\n", clean(p.Prefix))
	}
	return nil
}

func printWhy(w io.Writer, body []byte) error {
	y, err := decode[retentionui.Why](body)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s: %s\n%s\n", clean(y.ID), y.State, y.Answer)
	tw := table(w)
	fmt.Fprintf(tw, "due at\t%s\n", stamp(y.Due))
	next := stamp(y.Next)
	switch y.State {
	case "due", "retrying", "held", "parked":
		next = nextTry(retentionui.Marker{State: y.State, Next: y.Next})
	}
	fmt.Fprintf(tw, "next try\t%s\n", next)
	fmt.Fprintf(tw, "failed attempts\t%d\n", y.Attempts)
	fmt.Fprintf(tw, "searched\t%s\n", y.Searched)
	return tw.Flush()
}

func printRequeued(w io.Writer, body []byte) error {
	r, err := decode[retentionui.Requeued](body)
	if err != nil {
		return err
	}
	what := clean(r.ID)
	if r.All {
		what = "every parked marker"
	}
	_, err = fmt.Fprintf(w, "requeued %d (%s of %s): the next pass tries them again\n", r.Requeued, what, clean(r.Prefix))
	if err == nil && r.Pass != "" {
		_, err = fmt.Fprintln(w, clean(r.Pass))
	}
	return err
}

func printReleased(w io.Writer, body []byte) error {
	r, err := decode[retentionui.Released](body)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "released %d (%s of %s): due at once; the next pass clears it unless its clear still answers with a hold\n", r.Released, clean(r.ID), clean(r.Prefix))
	if err == nil && r.Pass != "" {
		_, err = fmt.Fprintln(w, clean(r.Pass))
	}
	return err
}
