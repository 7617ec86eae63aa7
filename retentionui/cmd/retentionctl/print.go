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

func printDue(w io.Writer, body []byte) error {
	p, err := decode[retentionui.SweepPage](body)
	if err != nil {
		return err
	}
	tw := table(w)
	fmt.Fprintln(tw, "ID\tSTATE\tDUE\tOVERDUE\tATTEMPTS\tNEXT TRY")
	for _, m := range p.Due {
		next := "next pass"
		if m.Next != nil {
			next = stamp(m.Next)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", clean(m.ID), m.State, stamp(m.Due), ms(m.OverdueMs), m.Attempts, next)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d due%s\n", len(p.Due), cut(p.DueCut, p.Limit))
	return nil
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
	fmt.Fprintln(tw, "ID\tFINISHED\tDUE\tATTEMPTS")
	for _, m := range p.Parked {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", clean(m.ID), stamp(m.Finished), stamp(m.Due), m.Attempts)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d parked%s\n", len(p.Parked), cut(p.ParkedCut, p.Limit))
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
	fmt.Fprintf(tw, "next try\t%s\n", stamp(y.Next))
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
