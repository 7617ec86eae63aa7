package retention

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// errClearExited records a Clear that ended its goroutine with
// runtime.Goexit (as t.FailNow does) instead of returning.
var errClearExited = errors.New("retention: clear did not return: it called runtime.Goexit")

// errClearTimedOut marks a clear that ran past ClearTimeout.
var errClearTimedOut = errors.New("retention: clear timed out")

// clearAll calls Clear for the page's pending items, at most Concurrency at
// a time, oldest first, recording each outcome in its item. It returns
// ctx.Err() if ctx is done before every Clear started.
//
// Clears run on worker goroutines, even one at a time: a Clear that calls
// runtime.Goexit then ends a worker, not the caller, and a new worker takes
// over the rest of the page. A pool rather than a goroutine per marker:
// with fast clears the goroutines would cost more than the clears.
//
// It returns how many calls of Clear (or ClearBatch) it made.
func (s *Sweep) clearAll(ctx context.Context, p *passState, keys [][]byte, items []item) (calls int, err error) {
	n := 0
	for i := range items {
		if items[i].out == pending {
			n++
		}
	}
	if n == 0 {
		return 0, ctx.Err()
	}
	if s.clearBatch != nil || s.clear == nil {
		return s.clearBatches(ctx, p, keys, items)
	}
	c := &clearing{s: s, p: p, ctx: ctx, items: items}
	if s.clearTimeout > 0 {
		c.ctxs = make([]clearCtx, len(items))
	}
	for range min(s.concurrency, n) {
		c.wg.Add(1)
		go c.work()
	}
	c.wg.Wait()
	return n, ctx.Err()
}

// panicked is the error of a Clear that panicked with r, with its stack.
func panicked(r any) error {
	return fmt.Errorf("%w: %v\n%s", ErrClearPanicked, r, debug.Stack())
}

// clearing is one page's clears in flight.
type clearing struct {
	s     *Sweep
	p     *passState
	ctx   context.Context
	items []item
	ctxs  []clearCtx   // ctxs[i] is items[i]'s, under ClearTimeout
	next  atomic.Int64 // index of the next item to take
	wg    sync.WaitGroup
}

func (c *clearing) work() {
	defer c.wg.Done()
	for c.ctx.Err() == nil {
		i := int(c.next.Add(1)) - 1
		if i >= len(c.items) {
			return
		}
		if c.items[i].out == pending {
			c.clearOne(i)
		}
	}
}

// clearOne calls Clear for one item under ClearTimeout and records the
// outcome. Only a Clear that returned nil, ErrLiveAgain or Hold is recorded
// as such; one that returned another error, panicked or never returned
// (runtime.Goexit) is recorded as failed.
func (c *clearing) clearOne(i int) {
	if c.s.limiter != nil && c.s.waitBudget(c.ctx, c.p, 1) != nil {
		return // the pass is over: the item stays pending
	}
	it := &c.items[i]
	returned := false
	defer func() {
		if returned {
			return
		}
		it.out = failed
		if r := recover(); r != nil {
			it.err = panicked(r)
			c.p.callFailed(it.err)
			return // the worker goes on
		}
		c.p.callFailed(errClearExited)
		// runtime.Goexit: this goroutine ends once the deferred calls ran.
		// Another worker takes its place.
		it.err = errClearExited
		c.wg.Add(1)
		go c.work()
	}()
	var ctx context.Context = c.ctx
	if c.ctxs != nil {
		cctx := &c.ctxs[i]
		cctx.c = c
		defer cctx.end()
		ctx = cctx
	}
	err := c.s.clear(ctx, it.id)
	switch it.out = outcomeOf(err); it.out {
	case cleared, liveAgain:
	case held:
		it.err = err
	default:
		if cctx, ok := ctx.(*clearCtx); ok && cctx.timedOut() {
			err = fmt.Errorf("%w after ClearTimeout (%v): %w", errClearTimedOut, c.s.clearTimeout, err)
		}
		it.err = err
		c.p.callFailed(err)
	}
	returned = true
}
