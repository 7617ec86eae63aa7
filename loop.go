package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// releaseTimeout bounds the release of a lease when Run returns: ctx is done
// by then, and a store that does not answer must not hold up shutdown.
const releaseTimeout = 5 * time.Second

// loop is the Run loop shared by Sweep.Run and Group.Run: one lease, one
// schedule, one pass of every member per round.
type loop struct {
	members     []*Sweep
	locker      Locker // nil: no lease
	log         *slog.Logger
	jitter      float64
	startJitter time.Duration

	// dryAt is when each member in a dry run (Config.DryRun) last passed:
	// it passes at most once per Interval, whatever the others do.
	dryAt []time.Time

	warnUnfenced sync.Once

	// wake is the channel Wake signals for a member of a running loop.
	wake chan struct{}

	// freeSeen says the loop's wait for the lease ended on a free key,
	// which the next try of the lease deletes (see freed).
	freeSeen bool

	// What the last round did, for the fleet's record (fleet.go): when
	// the lease was taken, and per member the KV its pass wrote through
	// (nil: it did not pass), the fence on the writes' context, its error.
	since  time.Time
	kvs    []KV
	fences []Fencer
	errs   []error
}

func (l *loop) run(ctx context.Context) error {
	var lease Lease
	defer func() {
		if lease != nil {
			l.giveUp(ctx, lease, false)
		}
	}()
	if l.startJitter > 0 {
		if err := sleep(ctx, rand.N(l.startJitter)); err != nil {
			return err
		}
	}
	failures := 0
	for {
		wait, err := l.round(ctx, &lease, &failures)
		if err == nil {
			err = l.sleep(ctx, wait, lease)
		}
		if err != nil {
			return err
		}
	}
}

// round makes one round of Run, taking the lease first if it needs to.
func (l *loop) round(ctx context.Context, lease *Lease, failures *int) (time.Duration, error) {
	if l.locker != nil && *lease == nil {
		err := l.acquire(ctx, lease)
		if err == nil || errors.Is(err, ErrLeaseHeld) && l.freeSeen && ctx.Err() == nil {
			l.clearFree(ctx) // taken, or held by another: free no more
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case errors.Is(err, ErrLeaseHeld):
			return l.atLeastMinWait(l.interval()), nil
		default:
			return l.failed(failures, "retention: acquire lease", err), nil
		}
	}
	stats, lost, err := l.passAll(ctx, *lease)
	switch {
	case ctx.Err() != nil:
		return 0, ctx.Err()
	case errors.Is(err, ErrUnfenced):
		return 0, err // a setting to change, not a failure to retry
	case lost || (*lease != nil && isLost(*lease)):
		l.record(ctx, *lease, stats, 0)
		l.giveUp(ctx, *lease, true)
		*lease = nil
		// Do not take it straight back: whoever took it, or an operator
		// who revoked it, gets one interval first.
		return l.atLeastMinWait(l.interval()), nil
	case err != nil:
		wait := l.failed(failures, "retention: pass failed", err)
		l.record(ctx, *lease, stats, wait)
		return wait, nil
	}
	*failures = 0
	wait := l.jittered(l.nextWait(stats))
	l.record(ctx, *lease, stats, wait)
	return wait, nil
}

// record adds the round's passes to the fleet's record of each member with
// a Replica, under the lease; wait is how long until the next round, 0
// when there is none (a LeasedPass).
func (l *loop) record(ctx context.Context, lease Lease, stats []Stats, wait time.Duration) {
	if lease == nil {
		return
	}
	for i, m := range l.members {
		if l.kvs[i] == nil {
			continue // the round ended before its pass
		}
		var next time.Time
		if wait > 0 {
			next = m.clock.Now().Add(wait)
		}
		m.recordPass(ctx, fleetWrite{kv: l.kvs[i], fence: l.fences[i]}, l.since, stats[i], l.errs[i], next)
	}
}

// failed logs a failed round, one more in a row, and returns the backoff.
func (l *loop) failed(failures *int, msg string, err error) time.Duration {
	*failures++
	wait := l.backoff(*failures)
	l.log.Error(msg, "error", err, "retry_in", wait)
	return l.atLeastMinWait(wait)
}

// nextWait is how long the loop waits after passes that succeeded with
// stats, one per member (docs/clearing.md, "When Run wakes").
func (l *loop) nextWait(stats []Stats) time.Duration {
	wait := l.interval()
	progress := false
	for i, m := range l.members {
		if m.dryRun {
			continue // its due markers stay due
		}
		wait = min(wait, m.untilDue(stats[i]))
		progress = progress || stats[i].Cleared+stats[i].LiveAgain+stats[i].Malformed+stats[i].Retried+stats[i].Held+stats[i].Duplicates+stats[i].Gone > 0
	}
	switch {
	case wait <= 0 && !progress:
		// Due, yet the pass found nothing to do: the store or the clock
		// disagrees with the sweep. Do not spin on it.
		return minWait
	case progress:
		// Steady traffic: not a pass per marker or two.
		return max(wait, l.minInterval())
	}
	return wait
}

// atLeastMinWait is d lengthened by the jitter, but at least minWait, so
// that Run never spins.
func (l *loop) atLeastMinWait(d time.Duration) time.Duration {
	return max(l.jittered(d), minWait)
}

// passAll passes every member once, in order. With a lease, the passes run
// under a context cancelled as soon as it is lost, and lost says so.
func (l *loop) passAll(ctx context.Context, lease Lease) (stats []Stats, lost bool, err error) {
	passCtx := ctx
	if lease != nil {
		c, cancel := context.WithCancel(ctx)
		passCtx = leaseContext{Context: c, lost: lease.Lost()}
		var wg sync.WaitGroup
		done := make(chan struct{})
		wg.Go(func() {
			select {
			case <-lease.Lost():
				cancel() // wakes whatever the pass is blocked on
			case <-done:
			}
		})
		defer func() {
			close(done)
			wg.Wait()
			cancel()
		}()
	}
	stats = make([]Stats, len(l.members))
	l.kvs, l.fences, l.errs = make([]KV, len(l.members)), make([]Fencer, len(l.members)), make([]error, len(l.members))
	// Every member's fence is settled before any passes: one that cannot
	// be fenced stops the round before the others have swept.
	kvs, fences := make([]KV, len(l.members)), make([]Fencer, len(l.members))
	for i, m := range l.members {
		var err error
		if kvs[i], fences[i], err = l.fenced(passCtx, lease, m); err != nil {
			return stats, false, err
		}
	}
	var errs []error
	if l.dryAt == nil {
		l.dryAt = make([]time.Time, len(l.members))
	}
	for i, m := range l.members {
		if m.dryRun {
			now := m.clock.Now()
			if !l.dryAt[i].IsZero() && now.Sub(l.dryAt[i]) < m.interval && !now.Before(l.dryAt[i]) {
				continue // its due markers stay due: not before its Interval
			}
			l.dryAt[i] = now
		}
		st, err := m.pass(passCtx, kvs[i], fences[i])
		if err != nil && lease != nil && (isLost(lease) || errors.Is(err, ErrLeaseLost)) {
			err, lost = fmt.Errorf("%w: %w", ErrLeaseLost, err), true
		}
		stats[i] = st
		l.kvs[i], l.fences[i], l.errs[i] = kvs[i], fences[i], err
		if m.onPass != nil {
			m.onPass(st, err)
		}
		if lost || ctx.Err() != nil {
			return stats, lost, nil
		}
		if err != nil {
			errs = append(errs, l.named(m, err))
		}
	}
	return stats, false, errors.Join(errs...)
}

// named names m's prefix in err when the loop runs several sweeps; the log
// of a single sweep's loop names it already.
func (l *loop) named(m *Sweep, err error) error {
	if len(l.members) == 1 {
		return err
	}
	return fmt.Errorf("prefix %q: %w", m.prefix, err)
}

// fenced returns the KV a member's pass writes through, or the fence its
// writes carry on their context (see fenceFor); when the lease can do
// neither, an error matching ErrUnfenced, unless the member allows it.
func (l *loop) fenced(ctx context.Context, lease Lease, m *Sweep) (KV, Fencer, error) {
	f, ok := lease.(Fencer)
	if !ok {
		return m.kv, nil, nil
	}
	view, onCtx, ok := fenceFor(f, m.kv)
	switch {
	case ok && onCtx:
		// A wrapper that does not pass the context on would write
		// unfenced: find out with a write of nothing.
		pctx, mark := withFence(ctx, f)
		err := m.kv.Delete(pctx)
		if err == nil {
			err = checkFenced(mark, m.kv, "Delete")
		}
		if err != nil {
			return nil, nil, l.named(m, err)
		}
		return m.kv, f, nil
	case ok:
		return view, nil, nil
	case m.unfencedOK:
		l.warnUnfenced.Do(func() {
			m.log.Warn("retention: the lease cannot fence this store; deletes rely on the lease's timing alone (Config.AllowUnfenced)")
		})
		return m.kv, nil, nil
	}
	return nil, nil, fmt.Errorf("%w: prefix %q: a lease of %T cannot fence a %T, and no KV it wraps (Unwrap) is one it can: "+
		"give the wrapper an Unwrap method, or set Config.AllowUnfenced", ErrUnfenced, m.prefix, lease, m.kv)
}

// acquire tries to take the lease into *lease, logging and observing the
// outcome. *lease is set before the Observer is called, so that a caller's
// deferred giveUp releases it even if the Observer panics.
func (l *loop) acquire(ctx context.Context, lease *Lease) error {
	got, err := l.locker.TryAcquire(ctx)
	switch {
	case err == nil:
		*lease = got
		l.since = l.members[0].clock.Now()
		l.holding(true)
		l.log.Info("retention: lease acquired")
		l.observeLease(LeaseAcquired)
	case ctx.Err() == nil && errors.Is(err, ErrLeaseHeld):
		l.observeLease(LeaseHeld)
	}
	return err
}

// giveUp releases a held lease: one that was lost is logged and observed
// as LeaseLost first, one that was not as LeaseReleased after.
func (l *loop) giveUp(ctx context.Context, lease Lease, lost bool) {
	l.holding(false)
	if lost {
		l.log.Warn("retention: lease lost")
		l.observeLease(LeaseLost)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	released := true
	if err := lease.Release(rctx); err != nil {
		released = false
		l.log.Warn("retention: release lease", "error", err)
	}
	for _, m := range l.members {
		m.recordRelease(rctx)
	}
	if !lost {
		if released && l.wake != nil {
			l.markFree(rctx) // a Run that returns: another may take the lease now
		}
		l.observeLease(LeaseReleased)
	}
}

// holding tells the members of a Run's loop whether it holds the lease, so
// that a Wake in this process need not go through the store.
func (l *loop) holding(held bool) {
	if l.wake == nil {
		return // LeasedPass: no Run to wake
	}
	for _, m := range l.members {
		m.holding.Store(held)
	}
}

// interval is the shortest Interval of the members, and minInterval the
// shortest MinInterval: the loop must not keep the most demanding waiting.
func (l *loop) interval() time.Duration {
	return l.shortest(func(m *Sweep) time.Duration { return m.interval })
}

func (l *loop) minInterval() time.Duration {
	return l.shortest(func(m *Sweep) time.Duration { return m.minInterval })
}

func (l *loop) shortest(of func(*Sweep) time.Duration) time.Duration {
	d := of(l.members[0])
	for _, m := range l.members[1:] {
		d = min(d, of(m))
	}
	return d
}

// backoff is the wait after the n-th failure: 1s, doubling up to the interval.
func (l *loop) backoff(n int) time.Duration {
	return min(time.Second<<min(n-1, 30), l.interval())
}

// jittered lengthens d by a random fraction of itself, below l.jitter.
func (l *loop) jittered(d time.Duration) time.Duration {
	if l.jitter == 0 || d <= 0 {
		return d
	}
	extra := rand.Float64() * l.jitter * float64(d)
	if extra >= float64(maxDuration-d) {
		return maxDuration
	}
	return d + time.Duration(extra)
}

// dueSlack is how long after a marker falls due Run wakes for it: a coarse
// clock read exactly at the due time would see the marker unexpired.
const dueSlack = time.Millisecond

// minWait is the least Run waits after a failed pass, around a lease, and
// after a pass that found nothing to do although something was due.
const minWait = 5 * time.Millisecond

const maxDuration = time.Duration(math.MaxInt64)

// addSat is a+b for b >= 0, saturating at the largest Duration.
func addSat(a, b time.Duration) time.Duration {
	if a > maxDuration-b {
		return maxDuration
	}
	return a + b
}

// untilDue is how long Run sleeps after a pass of s: to its next due time.
func (s *Sweep) untilDue(st Stats) time.Duration {
	if st.NextDue.IsZero() {
		return s.interval
	}
	// Sub saturates; the slack must not then wrap it negative.
	return min(max(addSat(st.NextDue.Sub(s.clock.Now()), dueSlack), 0), s.interval)
}

// leaseContext is a pass's context under a lease. Err reads the lease's
// Lost channel itself: waiting for the goroutine that cancels the context
// would let a Delete through in the moment before it runs.
type leaseContext struct {
	context.Context
	lost <-chan struct{}
}

func (c leaseContext) Err() error {
	select {
	case <-c.lost:
		return context.Canceled
	default:
		return c.Context.Err()
	}
}

func isLost(lease Lease) bool {
	select {
	case <-lease.Lost():
		return true
	default:
		return false
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Run sweeps until ctx is done, then returns ctx.Err(): a first pass at
// once (or after Config.StartJitter), then one when the next marker falls
// due, at most Config.Interval later; a failed pass is logged and retried
// after a backoff (docs/clearing.md, "The rules in full"). Config.OnPass
// sees every pass.
//
// With Config.Lease set, Run passes only while it holds the lease; a pass
// during which it is lost is cancelled before it deletes another marker. A
// lease that is a Fencer also fences the pass's writes; when it cannot
// fence the KV, Run returns an error matching ErrUnfenced, unless
// Config.AllowUnfenced is set (docs/fleet.md). Run releases a held lease
// and leaves no goroutine behind when it returns. While another Run runs
// the Sweep (on its own or in a Group), Run returns an error matching
// ErrRunning at once.
func (s *Sweep) Run(ctx context.Context) error {
	if err := s.configured("Run"); err != nil {
		return err
	}
	l := &loop{
		members:     []*Sweep{s},
		locker:      s.lease,
		log:         s.log,
		jitter:      s.jitter,
		startJitter: s.startJitter,
	}
	return l.runExclusive(ctx)
}
