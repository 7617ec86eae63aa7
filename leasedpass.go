package retention

import (
	"context"
	"errors"
	"fmt"
)

// LeasedPass makes one pass the way Run does, for callers who schedule
// passes themselves (a cron job, an admin endpoint): it takes Config.Lease,
// makes one pass under it, fenced as under Run, and releases it. It returns
// an error matching ErrLeaseLost when the lease was lost during the pass,
// ErrLeaseHeld when another replica holds it (no pass), and ErrUnfenced as
// Run does. Without a lease it makes the pass unguarded. Config.OnPass and
// Config.Observer see it as under Run. Most callers want Run.
func (s *Sweep) LeasedPass(ctx context.Context) (Stats, error) {
	if err := s.configured("LeasedPass"); err != nil {
		return Stats{}, err
	}
	l := &loop{members: []*Sweep{s}, locker: s.lease, log: s.log}
	stats, err := l.once(ctx)
	if len(stats) == 0 {
		return Stats{}, err
	}
	return stats[0], err
}

// LeasedPass passes every sweep of the group once under GroupConfig.Lease,
// as Sweep.LeasedPass does, and returns their Stats in order (none when
// another replica held the lease). The error joins every failure.
func (g *Group) LeasedPass(ctx context.Context) ([]Stats, error) {
	if err := g.configured("LeasedPass"); err != nil {
		return nil, err
	}
	l := &loop{members: g.loop.members, locker: g.loop.locker, log: g.loop.log}
	return l.once(ctx)
}

// once makes one round of passes, under the lease if there is one.
func (l *loop) once(ctx context.Context) ([]Stats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var (
		lease Lease
		lost  bool
	)
	defer func() {
		// Deferred: a caller may recover a panic of OnPass or the Observer
		// (net/http does), and a lease left held would be renewed for ever.
		if lease != nil {
			l.giveUp(ctx, lease, lost || isLost(lease))
		}
	}()
	if l.locker != nil {
		switch err := l.acquire(ctx, &lease); {
		case err == nil:
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, ErrLeaseHeld):
			return nil, err
		default:
			return nil, fmt.Errorf("retention: acquire lease: %w", err)
		}
	}
	stats, lost, err := l.passAll(ctx, lease)
	lost = lost || (lease != nil && isLost(lease))
	if !lost && ctx.Err() == nil {
		l.record(ctx, lease, stats, 0)
	}
	switch {
	case ctx.Err() != nil:
		return stats, ctx.Err()
	case lost:
		return stats, fmt.Errorf("%w: the pass was cut short", ErrLeaseLost)
	}
	return stats, err
}
