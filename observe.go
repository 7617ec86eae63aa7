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
// Stats, the lag of every cleared entity, and the lease's events. Set it
// as Config.Observer; one Observer may serve many sweeps, as every call
// names the sweep's prefix. The retentionprom and retentionotel modules
// provide Observers (docs/operating.md).
//
// The calls of one sweep's passes are serialised, but a lease event of a
// LeasedPass may come during a call of Run's pass, and one Observer may
// serve sweeps that run concurrently: an Observer must be safe for
// concurrent use. The methods must be quick and must not call back into
// the sweep: a pass waits for them. A panic in a method is not recovered:
// it reaches the caller of Pass, Run or LeasedPass, after the page's
// markers were deleted and, for Run and LeasedPass, the lease released.
type Observer interface {
	// ObservePass is called at the end of every pass that started, by Pass,
	// Run and LeasedPass alike, with its Stats and its error: nil,
	// ctx.Err() for a cancelled pass (also matching ErrLeaseLost when the
	// loss of the lease cut it short), or the store's error.
	ObservePass(prefix string, st Stats, err error)

	// ObserveLags is called after the markers of a page were deleted, with
	// how long past due each entity of the page that was cleared had its
	// marker deleted, by the sweep's Clock: over a pass, Stats.Cleared lags
	// less those of a page whose delete failed. The lags never increase
	// along the slice, which is reused once the call returns: do not keep
	// it.
	ObserveLags(prefix string, lags []time.Duration)

	// ObservePage is called after each page of a pass is settled, just
	// after its ObserveLags, with the page's counts (Duration, MaxLag,
	// NextDue and BatchSize zero), and once more before ObservePass with
	// what the pass did outside its pages. Over a pass the calls add up to
	// the counts of ObservePass's Stats.
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

// lagBase returns the start of the lag of a marker cleared at now: lag =
// now - (ms + Retention) = base - ms, in whole milliseconds of base plus
// its remainder, integer arithmetic per marker, no time.Time.
func (s *Sweep) lagBase(now time.Time) (int64, time.Duration) {
	b := now.Add(-s.retention)
	return b.UnixMilli(), b.Sub(time.UnixMilli(b.UnixMilli()))
}

// lag returns the lag of a marker of time ms from lagBase's base.
func lag(baseMs int64, rem time.Duration, ms int64) time.Duration {
	switch d := baseMs - ms; {
	case d < 0: // a clock that stepped back
		return 0
	case d > int64(maxDuration/time.Millisecond)-1:
		return maxDuration
	default:
		return time.Duration(d)*time.Millisecond + rem
	}
}

// observeLags hands the observer the lags of the page's cleared markers
// (gone: only those a ClearDeleter deleted).
func (s *Sweep) observeLags(items []item, gone bool) {
	baseMs, rem := s.lagBase(s.clock.Now())
	lags := s.lags[:0]
	for i := range items {
		if out := items[i].out; out != clearedGone && (gone || out != cleared) {
			continue
		}
		bMs, bRem := baseMs, rem
		if at := items[i].doneAt; at != 0 {
			// Lag to the commit, not to the end of the page, which may
			// wait for slower batches.
			bMs, bRem = s.lagBase(time.Unix(0, at))
		}
		lags = append(lags, lag(bMs, bRem, items[i].lagMs))
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

// observeTimes hands the observer the lags of a counted run's markers, of
// the times given ascending, deleted at done.
func (s *Sweep) observeTimes(times []int64, done time.Time) {
	baseMs, rem := s.lagBase(done)
	lags := s.lags[:0]
	for _, ms := range times {
		lags = append(lags, lag(baseMs, rem, ms))
	}
	s.lags = lags
	s.obs.ObserveLags(s.prefix, lags)
}

func (l *loop) observeLease(e LeaseEvent) {
	for _, m := range l.members {
		if m.obs != nil {
			m.obs.ObserveLease(m.prefix, e)
		}
	}
}

// observePage tells the observer what the pass did since the last call.
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

// observePass tells the observer of a pass under ctx that ended with err,
// matching ErrLeaseLost when the loss of the lease cut it short.
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
