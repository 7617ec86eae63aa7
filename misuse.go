package retention

import (
	"context"
	"fmt"
)

// configured returns an error matching ErrNotConfigured unless New made s.
func (s *Sweep) configured(method string) error {
	if s == nil || s.busy == nil {
		return fmt.Errorf("%w: Sweep.%s called on a Sweep not made by New (a zero value?): create it with retention.New", ErrNotConfigured, method)
	}
	return nil
}

// configured is Sweep.configured for a Group made by NewGroup.
func (g *Group) configured(method string) error {
	if g == nil || len(g.loop.members) == 0 {
		return fmt.Errorf("%w: Group.%s called on a Group not made by NewGroup (a zero value?): create it with retention.NewGroup", ErrNotConfigured, method)
	}
	return nil
}

// claim marks every member of the loop as run by it, or none (ErrRunning).
func (l *loop) claim() (release func(), err error) {
	for i, m := range l.members {
		if !m.running.CompareAndSwap(false, true) {
			for _, c := range l.members[:i] {
				c.running.Store(false)
			}
			return nil, fmt.Errorf("%w: the sweep of prefix %q is already run by another Run; cancel that one first", ErrRunning, m.prefix)
		}
	}
	l.wake = make(chan struct{}, 1)
	for _, m := range l.members {
		m.waker.Store(&l.wake)
	}
	return func() {
		for _, m := range l.members {
			m.waker.Store(nil)
			m.holding.Store(false)
			m.running.Store(false)
		}
	}, nil
}

// runExclusive is run for a loop whose members no other Run runs.
func (l *loop) runExclusive(ctx context.Context) error {
	release, err := l.claim()
	if err != nil {
		return err
	}
	defer release()
	return l.run(ctx)
}
