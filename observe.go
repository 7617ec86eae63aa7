package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Observer receives what a Sweep does, for metrics: every pass with its
// Stats, the lag of every cleared entity, and the lease's comings and
// goings. Set it as Config.Observer; one Observer may serve many sweeps, as
// every call names the sweep's prefix. The retentionprom and retentionotel
// modules provide Observers that export Prometheus and OpenTelemetry
// metrics.
//
// Calls come from the goroutine that runs the pass (or Run's loop), or,
// with Concurrency 1, from the sweep's goroutine that walks its pages
// while the pass waits for it. The passes of one sweep are serialised, and
// so are their calls, but a lease
// event of a LeasedPass tried while Run holds the lease may come at the
// same time as a call of Run's pass, and one Observer may serve sweeps that
// run concurrently: an Observer must be safe for concurrent use. The
// methods must be quick and must not call back into the sweep: a pass
// waits for them. A panic in a method is not recovered, as one in OnPass is
// not: it reaches the caller of Pass, Run or LeasedPass, after the markers
// of the page were deleted, the pass's reads ended and, for Run and
// LeasedPass, the lease was released.
type Observer interface {
	// ObservePass is called at the end of every pass that started, by Pass,
	// Run and LeasedPass alike, with its Stats (counts by outcome and
	// Duration) and its error: nil, ctx.Err() for a cancelled pass (also
	// matching ErrLeaseLost when the loss of the lease cut it short), or
	// the store's error.
	ObservePass(prefix string, st Stats, err error)

	// ObserveLags is called after the markers of a page were deleted, with
	// the lag of each entity of the page that was cleared: how long past
	// due (its marker time plus Retention) its marker was deleted, by the
	// sweep's Clock. Over a pass the calls carry Stats.Cleared lags in all,
	// less those of a page whose delete failed (but for the markers a
	// ClearDeleter deleted with their entities). The lags come in the order
	// of their markers, oldest first, and the clock is read once per page,
	// so they never increase along the slice: a histogram can count a
	// page per bucket rather than per lag. The slice is reused once the
	// call returns: do not keep it.
	ObserveLags(prefix string, lags []time.Duration)

	// ObservePage is called after each page of a pass is settled, just
	// after ObserveLags for its cleared markers, with what the page did:
	// its counts by outcome (Cleared, Failed, Retried, Parked, Deferred,
	// Malformed, Foreign, LiveAgain, Duplicates, Held, WouldClear, Gone) and of calls (Scanned,
	// ScanCalls, DeleteCalls, PutCalls, ClearCalls, FailedCalls,
	// TimedOutCalls, PanickedCalls) and its BudgetWait; Duration, MaxLag,
	// NextDue and BatchSize are zero. A last call just before ObservePass carries what the pass did
	// outside its pages (the keys its reads past the due range met, the
	// clears a ClearDeleter committed in a page the pass left unsettled).
	// Over a pass the calls add up to the counts of ObservePass's Stats:
	// counters fed from ObservePage advance with the lag histogram, page by
	// page, and ObservePass is left to count passes.
	ObservePage(prefix string, page Stats)

	// ObserveLease is called when Run or LeasedPass acquires, loses or
	// releases the lease, or finds it held by another replica. A Group
	// calls it for each of its sweeps.
	ObserveLease(prefix string, event LeaseEvent)
}

// LeaseEvent is what happened to a sweep's lease, as an Observer sees it.
type LeaseEvent uint8

// The lease events. After LeaseAcquired this replica sweeps until
// LeaseLost or LeaseReleased; LeaseHeld means another replica sweeps.
const (
	LeaseAcquired LeaseEvent = iota + 1 // TryAcquire took the lease
	LeaseHeld                           // TryAcquire found it held by another replica
	LeaseLost                           // the lease was lost while held
	LeaseReleased                       // the lease was given up: Run returned, or LeasedPass is done
)

var leaseEventNames = [...]string{LeaseAcquired: "acquired", LeaseHeld: "held", LeaseLost: "lost", LeaseReleased: "released"}

// String returns the event's name in lower case ("acquired", "held",
// "lost", "released"), fit for a metric label.
func (e LeaseEvent) String() string {
	if int(e) < len(leaseEventNames) && leaseEventNames[e] != "" {
		return leaseEventNames[e]
	}
	return "unknown"
}

// observeLags hands the observer the lags of the page's cleared markers,
// whose deletion just succeeded, or with gone only those a ClearDeleter
// deleted. Only called with an observer set, so a sweep without one reads
// no clock and loops over nothing more.
func (s *Sweep) observeLags(items []item, gone bool) {
	// lag = now - (ms + Retention) = base - ms, in whole milliseconds of
	// base plus its remainder: integer arithmetic per marker, no time.Time.
	base := s.clock.Now().Add(-s.retention)
	baseMs := base.UnixMilli()
	rem := base.Sub(time.UnixMilli(baseMs))
	lags := s.lags[:0]
	for i := range items {
		if out := items[i].out; out != clearedGone && (gone || out != cleared) {
			continue
		}
		var lag time.Duration
		bMs, bRem := baseMs, rem
		if at := items[i].doneAt; at != 0 {
			// Cleared in its own transaction: lag to the commit, not to
			// the end of the page, which may wait for slower batches.
			b := time.Unix(0, at).Add(-s.retention)
			bMs = b.UnixMilli()
			bRem = b.Sub(time.UnixMilli(bMs))
		}
		switch d := bMs - items[i].lagMs; {
		case d < 0: // a clock that stepped back
		case d > int64(maxDuration/time.Millisecond)-1:
			lag = maxDuration
		default:
			lag = time.Duration(d)*time.Millisecond + bRem
		}
		lags = append(lags, lag)
	}
	s.lags = lags
	// Markers of the retry range keep their finish times in no order: the
	// Observer is promised lags that never increase.
	if !slices.IsSortedFunc(lags, func(a, b time.Duration) int { return cmp.Compare(b, a) }) {
		slices.SortFunc(lags, func(a, b time.Duration) int { return cmp.Compare(b, a) })
	}
	if len(lags) > 0 {
		s.obs.ObserveLags(s.prefix, lags)
	}
}

// observeLease tells the observers of the loop's members of a lease event.
func (l *loop) observeLease(e LeaseEvent) {
	for _, m := range l.members {
		if m.obs != nil {
			m.obs.ObserveLease(m.prefix, e)
		}
	}
}

// observePage tells the observer what the pass did since the last call:
// one page, or the rest of the pass.
func (s *Sweep) observePage(p *passState) {
	if s.obs == nil {
		return
	}
	d := p.st.counts().minus(p.observed)
	if d == (Stats{}) {
		return
	}
	p.observed = p.st.counts()
	s.obs.ObservePage(s.prefix, d)
}

// observePass tells the observer of a pass under ctx that ended with err.
// Like OnPass, it sees the error of a pass cut short by the loss of its
// lease match ErrLeaseLost, not only context.Canceled.
func (s *Sweep) observePass(ctx context.Context, st Stats, err error) {
	if s.obs == nil {
		return
	}
	if lc, ok := ctx.(leaseContext); ok && err != nil && !errors.Is(err, ErrLeaseLost) {
		select {
		case <-lc.lost:
			err = fmt.Errorf("%w: %w", ErrLeaseLost, err)
		default:
		}
	}
	s.obs.ObservePass(s.prefix, st, err)
}
