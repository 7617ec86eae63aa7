package retention

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
)

// maxExamples is how many examples of each kind of trouble a pass logs:
// enough to diagnose, bounded however many markers fail.
const maxExamples = 3

// passNotes gathers what a pass logs at its end: one line per kind of
// trouble, with a count and a few examples.
type passNotes struct {
	failed, panicked, malformed, foreign tally
}

// tally counts occurrences and keeps the first few as examples.
type tally struct {
	n        int
	examples []string
}

// add counts one occurrence; example builds its description, only when it
// is kept.
func (t *tally) add(example func() string) {
	t.n++
	if len(t.examples) < maxExamples {
		t.examples = append(t.examples, example())
	}
}

// noteFailed records a failed Clear of id.
func (n *passNotes) noteFailed(id string, err error) {
	t := &n.failed
	if errors.Is(err, ErrClearPanicked) {
		t = &n.panicked // with their stacks, apart, so they are never crowded out
	}
	t.add(func() string { return strconv.Quote(id) + ": " + err.Error() })
}

// noteMalformed records a malformed marker; err names the key.
func (n *passNotes) noteMalformed(err error) {
	n.malformed.add(err.Error)
}

// noteForeign records a foreign key.
func (n *passNotes) noteForeign(key []byte) {
	n.foreign.add(func() string { return strconv.Quote(string(key)) })
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
	if n.panicked.n > 0 {
		s.log.Error("retention: clears panicked; their markers stay and are retried later",
			"panicked", n.panicked.n, "examples", n.panicked.examples)
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
