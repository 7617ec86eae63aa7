package retention

import (
	"context"
	"log/slog"
	"strconv"
)

// maxExamples is how many examples of each kind of trouble a pass logs:
// enough to diagnose, bounded however many markers fail.
const maxExamples = 3

// passNotes gathers what a pass logs at its end: one line per kind of
// trouble, with a count and a few examples.
type passNotes struct {
	failed, malformed, foreign tally
}

// tally counts occurrences and keeps the first few as examples.
type tally struct {
	n        int
	examples []string
}

func (t *tally) add(key []byte, err error) {
	t.n++
	if len(t.examples) >= maxExamples {
		return
	}
	ex := strconv.Quote(string(key))
	if err != nil {
		ex += ": " + err.Error()
	}
	t.examples = append(t.examples, ex)
}

// logPass logs a pass's troubles (Error for failed clears, Warn for
// malformed and foreign keys) and its summary (Debug). Run logs a failed
// pass itself.
func (s *Sweep) logPass(p *passState) {
	st, n := p.st, &p.notes
	if n.failed.n > 0 {
		s.log.Error("retention: clears failed; their markers stay and are retried later",
			"failed", n.failed.n, "retried", st.Retried, "examples", n.failed.examples)
	}
	if n.malformed.n > 0 {
		s.log.Warn("retention: deleted malformed markers without clearing them",
			"malformed", n.malformed.n, "examples", n.malformed.examples)
	}
	if n.foreign.n > 0 {
		s.log.Warn("retention: keys under the prefix are not markers; left alone",
			"foreign", n.foreign.n, "example", n.foreign.examples[0])
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("retention pass", "cleared", st.Cleared, "failed", st.Failed, "retried", st.Retried,
			"deferred", st.Deferred, "malformed", st.Malformed, "foreign", st.Foreign, "live_again", st.LiveAgain,
			"max_lag", st.MaxLag, "next_due", st.NextDue, "duration", st.Duration)
	}
}
