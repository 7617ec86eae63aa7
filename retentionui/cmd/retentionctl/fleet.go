package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/marksweep/retention/retentionui"
)

// printFleet says, for each sweep whose store holds the fleet's record,
// who sweeps and the fleet's last passes: the same from every replica.
func printFleet(w io.Writer, o retentionui.Overview) {
	for _, s := range o.Sweeps {
		f := s.Fleet
		if f == nil {
			continue
		}
		fmt.Fprintf(w, "%s: %s\n", clean(s.Prefix), clean(f.Summary))
		var last []string
		for _, p := range f.LastPasses {
			e := ""
			if p.Error != "" {
				e = ", failed"
			}
			last = append(last, fmt.Sprintf("%s ago by %s: %d cleared, %d failed%s", ms(o.Now.Sub(p.At).Milliseconds()), clean(p.Replica), p.Cleared, p.Failed, e))
		}
		if len(last) > 0 {
			fmt.Fprintf(w, "  last passes: %s\n", strings.Join(last, "; "))
		}
		passes, cleared, failed := 0, 0, 0
		for _, m := range f.Minutes {
			passes, cleared, failed = passes+m.Passes, cleared+m.Cleared, failed+m.Failed
		}
		fmt.Fprintf(w, "  last hour: %d passes, %d cleared, %d failed clears\n", passes, cleared, failed)
	}
}
