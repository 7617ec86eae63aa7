package retention

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// waitBudget waits for n tokens of Config.Limiter, in parts of its burst.
// A limiter that cannot grant them within budgetSlice (paused, too slow, a
// wait past ctx's deadline) is asked again every budgetPoll until ctx ends:
// raising its limit resumes the wait within a poll.
func (s *Sweep) waitBudget(ctx context.Context, p *passState, n int) error {
	lim := s.limiter
	if lim == nil || lim.Limit() == rate.Inf {
		return nil
	}
	start := s.clock.Now()
	defer func() { p.budgetWait.Add(int64(max(s.clock.Now().Sub(start), 0))) }()
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(n, lim.Burst())
		if lim.Limit() > 0 && k > 0 {
			// WaitN refuses, without taking tokens, a wait longer than
			// its context allows: bounded here, a paused or slowed
			// limiter is polled rather than waited on for ever.
			wctx, cancel := context.WithTimeout(ctx, budgetSlice)
			err := lim.WaitN(wctx, k)
			cancel()
			if err == nil {
				n -= k
				continue
			}
		}
		if err := sleep(ctx, budgetPoll); err != nil {
			return err
		}
	}
	return nil
}

// budgetPoll is how often a limiter that cannot grant a wait is asked
// again, and budgetSlice the longest wait it is asked to grant at once.
const (
	budgetPoll  = time.Millisecond
	budgetSlice = time.Minute
)
