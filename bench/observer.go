package bench

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/marksweep/retention"
)

// Recorder is a retention.Observer that keeps what a dashboard would be
// built from: the Stats of every pass, summed, and every lag sample the
// sweep reports, so that percentiles can be taken from them exactly rather
// than from histogram buckets. One Recorder may serve several replicas. The
// zero value is ready to use.
type Recorder struct {
	mu         sync.Mutex
	sum        retention.Stats
	passes     int
	passErrors int
	maxLag     time.Duration // the largest Stats.MaxLag of a pass
	lags       []time.Duration
}

var _ retention.Observer = (*Recorder)(nil)

// ObservePass implements retention.Observer.
func (r *Recorder) ObservePass(_ string, st retention.Stats, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.passes++
	if err != nil {
		r.passErrors++
	}
	// Only fields of Stats that v0.1.0 has are read, and the failed calls
	// (FailedCalls, TimedOutCalls: drop those two lines to build against
	// a core older than them).
	r.sum.Scanned += st.Scanned
	r.sum.Cleared += st.Cleared
	r.sum.Failed += st.Failed
	r.sum.Retried += st.Retried
	r.sum.ClearCalls += st.ClearCalls
	r.sum.FailedCalls += st.FailedCalls
	r.sum.TimedOutCalls += st.TimedOutCalls
	r.sum.PutCalls += st.PutCalls
	r.sum.DeleteCalls += st.DeleteCalls
	r.sum.ScanCalls += st.ScanCalls
	r.maxLag = max(r.maxLag, st.MaxLag)
}

// ObserveLags implements retention.Observer.
func (r *Recorder) ObserveLags(_ string, lags []time.Duration) {
	r.mu.Lock()
	r.lags = append(r.lags, lags...)
	r.mu.Unlock()
}

// ObserveLease implements retention.Observer.
func (r *Recorder) ObserveLease(string, retention.LeaseEvent) {}

// ObservePage implements retention.Observer.
func (r *Recorder) ObservePage(string, retention.Stats) {}

// Summary returns the summed Stats, the number of passes and of passes
// that ended in an error, the largest Stats.MaxLag, and the lag samples,
// sorted.
func (r *Recorder) Summary() (sum retention.Stats, passes, passErrors int, maxLag time.Duration, lags []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lags = slices.Clone(r.lags)
	slices.Sort(lags)
	return r.sum, r.passes, r.passErrors, r.maxLag, lags
}

// quantile returns the q-quantile (nearest rank) of sorted, 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// logCounter is a slog.Handler that counts the records of Warn and above
// and keeps the text of the first Error record and of the one with the
// largest "failed" count: they show which ids a failed clear is blamed on.
type logCounter struct {
	mu          sync.Mutex
	errors      int
	warns       int
	first       string
	worst       string
	worstFailed int64
}

func (h *logCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Level < slog.LevelError {
		h.warns++
		return nil
	}
	h.errors++
	var b strings.Builder
	b.WriteString(r.Message)
	var failed int64
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		if a.Key == "failed" && a.Value.Kind() == slog.KindInt64 {
			failed = a.Value.Int64()
		}
		return true
	})
	if h.errors == 1 {
		h.first = b.String()
	}
	if failed > h.worstFailed {
		h.worst, h.worstFailed = b.String(), failed
	}
	return nil
}

// samples returns the Error lines kept, the first and the worst.
func (h *logCounter) samples() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	if h.first != "" {
		out = append(out, "first: "+h.first)
	}
	if h.worst != "" && h.worst != h.first {
		out = append(out, "most failed: "+h.worst)
	}
	return out
}

func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCounter) WithGroup(string) slog.Handler      { return h }
