package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// maxExamples is how many examples of each kind of trouble a pass logs.
const maxExamples = 3

// passNotes gathers what a pass logs at its end.
type passNotes struct {
	failed, panicked, malformed, foreign tally
	parked                               tally
	wouldClear                           tally // a dry run's
	putOff                               int   // ids not tried alone: every clear of the pass failed
	outageErr                            error // the error of the first of them
	rescheduleErr                        error // why failed markers could not be rewritten
}

// tally counts occurrences and keeps the first few as examples.
type tally struct {
	n        int
	examples []string
}

// add counts one occurrence; example is called only when it is kept.
func (t *tally) add(example func() string) {
	t.n++
	if len(t.examples) < maxExamples {
		t.examples = append(t.examples, example())
	}
}

func (n *passNotes) noteFailed(id string, err error) {
	if oe := (*outageError)(nil); errors.As(err, &oe) {
		if n.putOff == 0 {
			n.outageErr = oe.err
		}
		n.putOff++
		return
	}
	if !errors.Is(err, ErrClearPanicked) {
		n.failed.add(func() string { return strconv.Quote(id) + ": " + errString(err) })
		return
	}
	// Panics go apart, so they are never crowded out; the first keeps its
	// stack, the others only their value.
	first := n.panicked.n == 0
	n.panicked.add(func() string {
		msg := errString(err)
		if i := strings.IndexByte(msg, '\n'); i >= 0 && !first {
			msg = msg[:i]
		}
		return strconv.Quote(id) + ": " + msg
	})
}

func (n *passNotes) noteParked(id string, err error) {
	n.parked.add(func() string { return strconv.Quote(id) + ": " + errString(err) })
}

func (n *passNotes) noteMalformed(err error) {
	n.malformed.add(func() string { return errString(err) })
}

func (n *passNotes) noteForeign(key []byte) {
	n.foreign.add(func() string { return strconv.Quote(string(key)) })
}

// logPass logs a pass's troubles and its summary (docs/operating.md,
// "Logs"). Run logs a failed pass itself.
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
	if n.putOff > 0 {
		s.log.Error("retention: every clear of the pass failed (the dependency seems down); markers not tried alone are put off",
			"put_off", n.putOff, "error", errString(n.outageErr))
	}
	if alone := st.Failed - n.putOff; st.FailedCalls > alone {
		// No id ends the pass failed for these calls, yet they cost time.
		s.log.Warn("retention: clear calls failed as a whole; a bisection cleared their other ids apart",
			"failed_calls", st.FailedCalls, "timed_out", st.TimedOutCalls, "panicked", st.PanickedCalls, "failed_ids", st.Failed)
	}
	if n.parked.n > 0 {
		s.log.Error("retention: markers parked after Config.MaxAttempts failed clears; they stay until requeued (Sweep.Requeue)",
			"parked", n.parked.n, "examples", n.parked.examples)
	}
	if n.rescheduleErr != nil {
		s.log.Error("retention: could not reschedule failed markers; their retry delays are kept in memory",
			"error", errString(n.rescheduleErr))
	}
	if n.malformed.n > 0 && !s.dryRun {
		s.log.Warn("retention: deleted malformed markers without clearing them",
			"malformed", n.malformed.n, "examples", n.malformed.examples)
	}
	if n.foreign.n > 0 {
		// Foreign keys stay, so a Warn at every pass would repeat itself:
		// warn when their number changes, and once an hour.
		level, now := slog.LevelDebug, s.clock.Now()
		if n.foreign.n != s.foreignSeen || now.Sub(s.foreignWarned) >= time.Hour || now.Before(s.foreignWarned) {
			level, s.foreignSeen, s.foreignWarned = slog.LevelWarn, n.foreign.n, now
		}
		s.log.Log(context.Background(), level, "retention: keys under the prefix are not markers; left alone",
			"foreign", n.foreign.n, "example", n.foreign.examples[0])
	}
	if s.dryRun {
		s.log.Info("retention: dry run; nothing was cleared, deleted or moved",
			"would_clear", st.WouldClear, "examples", n.wouldClear.examples,
			"would_drop_malformed", st.Malformed, "would_drop_duplicates", st.Duplicates)
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("retention pass", "cleared", st.Cleared, "failed", st.Failed, "retried", st.Retried,
			"deferred", st.Deferred, "held", st.Held, "malformed", st.Malformed, "foreign", st.Foreign, "live_again", st.LiveAgain, "duplicates", st.Duplicates,
			"max_lag", st.MaxLag, "next_due", st.NextDue, "duration", st.Duration)
	}
}

// errString is err.Error(), which a caller's error type may make panic (a
// typed nil pointer, say): the sweep must not.
func errString(err error) string {
	msg, perr := errorPanics(err)
	if perr != nil {
		return perr.Error()
	}
	return msg
}

// errorPanics calls err.Error() and walks err's chain as the sweep does;
// when either panics it returns an error that says so instead.
func errorPanics(err error) (msg string, perr error) {
	method := "Error"
	defer func() {
		if r := recover(); r != nil {
			perr = fmt.Errorf("retention: an error of type %T whose %s method panics: %v", err, method, r)
		}
	}()
	msg = err.Error()
	method = "Unwrap, Is or As"
	_ = errors.Is(err, errNeverMatches)
	_ = errors.As(err, new(BatchError))
	return msg, nil
}

// errNeverMatches is an error no other is: errorPanics walks a chain with it.
var errNeverMatches = errors.New("retention: (no error is this one)")
