package retention

import (
	"context"
	"sync/atomic"
	"time"
)

// fleetRun is what a Sweep shares with the Run that sweeps it: how to wake
// that Run, whether it holds the lease, and its record in the store.
type fleetRun struct {
	waker   atomic.Pointer[chan struct{}] // the channel that wakes the Run of this sweep; nil while none runs it
	holding atomic.Bool                   // that Run holds the lease
	book    fleetBook                     // its record of passes (fleet.go)
}

// The keys a fleet shares under a sweep's prefix lie after fleetInfix, a
// byte no id holds, followed by id bytes that start with neither a digit nor
// r or p: no sweep reads them as markers, not even one whose prefix is this
// one and fleetInfix.
const (
	fleetInfix  = '#'
	wakeKind    = 'w' // <prefix>#w: a pass is wanted (Wake)
	historyKind = 'h' // <prefix>#h<minute, ms:020>-<record>: passes (fleet.go)
	freeKind    = 'l' // <prefix>#l: the lease was released, and is free to take
)

// wakeRange returns the bounds of s's wake key: the key and the key after it.
func (s *Sweep) wakeRange() (key, end []byte) { return s.fleetKey(wakeKind) }

// freeRange returns the bounds of s's key that says the lease is free.
func (s *Sweep) freeRange() (key, end []byte) { return s.fleetKey(freeKind) }

func (s *Sweep) fleetKey(kind byte) (key, end []byte) {
	key = append([]byte(s.prefix), fleetInfix, kind)
	return key, append(key[:len(key):len(key)], 0)
}

// Wake asks the Run that sweeps s for a pass at once, rather than at its
// next due time: a Run of this process at once, and with Config.Replica
// set, the Run that holds the lease on any replica within its WakePoll,
// through a key it writes to the store. Requeue calls it. It returns an
// error when that key could not be written; without Config.Replica it
// writes nothing and returns nil.
func (s *Sweep) Wake(ctx context.Context) error {
	if err := s.configured("Wake"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if w := s.waker.Load(); w != nil {
		select {
		case *w <- struct{}{}:
		default: // a wake-up is pending already
		}
		if s.holding.Load() {
			return nil // the Run woken is the one that sweeps
		}
	}
	if s.replica == "" {
		return nil
	}
	key, _ := s.wakeRange()
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	if err := s.kv.(Putter).Put(cctx, key, nil); err != nil { // New checked it is a Putter
		return s.storeErr(ctx, cctx, "write the wake key", err)
	}
	return nil
}

// wakePoll is how often the loop reads its members' wake keys while it
// holds a lease, and their free keys while it waits for one: the shortest
// WakePoll of those with a Replica, or 0.
func (l *loop) wakePoll() time.Duration {
	if l.locker == nil {
		return 0 // without a lease every replica sweeps: a Wake reaches its own
	}
	var d time.Duration
	for _, m := range l.members {
		if m.replica != "" && m.wakePoll > 0 && (d == 0 || m.wakePoll < d) {
			d = m.wakePoll
		}
	}
	return d
}

// sleep waits d, or less: until ctx is done, a Wake of this process, or,
// while it holds lease, a wake key in the store, and while it waits for the
// lease (lease nil), a free key (see freed).
func (l *loop) sleep(ctx context.Context, d time.Duration, lease Lease) error {
	t := time.NewTimer(d)
	defer t.Stop()
	var tick <-chan time.Time
	reads := time.Duration(0) // the ticks before the wait's end: the one at its end reads nothing
	if poll := l.wakePoll(); poll > 0 && poll < d {
		tk := time.NewTicker(poll)
		defer tk.Stop()
		tick, reads = tk.C, (d-1)/poll
	}
	polled := l.woken
	if lease == nil {
		polled = l.freed
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-l.wake:
			return nil
		case <-tick:
			if reads--; reads == 0 {
				tick = nil
			}
			if polled(ctx) {
				return nil
			}
		}
	}
}

// woken reads the wake key of each member with a Replica, deleting the
// ones it finds, and reports whether it found one. The key goes before the
// pass it asks for: a Wake after the delete came after its own change (a
// Requeue's Move), which that pass sees. A store that fails is not asked
// again before the next poll.
func (l *loop) woken(ctx context.Context) bool {
	found := false
	for _, m := range l.members {
		if m.replica == "" || m.wakePoll <= 0 {
			continue
		}
		key, end := m.wakeRange()
		keys, err := m.scanKV(ctx, m.kv, key, end, 1)
		if err != nil {
			m.log.Debug("retention: read the wake key", "error", err)
			continue
		}
		if len(keys) == 0 {
			continue
		}
		found = true
		cctx, cancel := withTimeout(ctx, m.storeTimeout)
		if err := m.kv.Delete(cctx, key); err != nil {
			m.log.Debug("retention: delete the wake key", "error", err)
		}
		cancel()
	}
	return found
}

// The lease's hand-over after a clean release: the Run that releases the
// lease as it returns writes its members' free keys (<prefix>#l), which the
// Runs waiting for the lease read every WakePoll (freed). The first to read
// one tries the lease at once, rather than at its next try up to an
// Interval later. A Run that takes the lease deletes the key, and so does
// one that read it and found the lease held: the key was stale, written
// as another Run took the lease. A replica restarted with a lowered
// Retention, say, sweeps with it as soon as the replica it replaces has
// released the lease.

// freed reads the free key of each member with a Replica, and reports
// whether it found one. It deletes none: the round that tries the lease
// does (see clearFree), so that a try that fails in the store leaves it.
func (l *loop) freed(ctx context.Context) bool {
	for _, m := range l.members {
		if m.replica == "" || m.wakePoll <= 0 {
			continue
		}
		key, end := m.freeRange()
		keys, err := m.scanKV(ctx, m.kv, key, end, 1)
		if err != nil {
			m.log.Debug("retention: read the lease's free key", "error", err)
			continue
		}
		if len(keys) > 0 {
			l.freeSeen = true
			return true
		}
	}
	return false
}

// markFree writes the free key of each member with a Replica, once the
// lease was released; a store that fails leaves the waiting Runs to their
// next try.
func (l *loop) markFree(ctx context.Context) {
	for _, m := range l.members {
		if m.replica == "" || m.wakePoll <= 0 {
			continue
		}
		key, _ := m.freeRange()
		cctx, cancel := withTimeout(ctx, m.storeTimeout)
		if err := m.kv.(Putter).Put(cctx, key, nil); err != nil { // New checked it is a Putter
			m.log.Debug("retention: write the lease's free key", "error", err)
		}
		cancel()
	}
}

// clearFree deletes the members' free keys after the loop tried the
// lease: taken or held by another, it is free no more. One Delete per
// member with a Replica, when the lease changes hands.
func (l *loop) clearFree(ctx context.Context) {
	l.freeSeen = false
	for _, m := range l.members {
		if m.replica == "" || m.wakePoll <= 0 {
			continue
		}
		key, _ := m.freeRange()
		cctx, cancel := withTimeout(ctx, m.storeTimeout)
		if err := m.kv.Delete(cctx, key); err != nil {
			m.log.Debug("retention: delete the lease's free key", "error", err)
		}
		cancel()
	}
}
