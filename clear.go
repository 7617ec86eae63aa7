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
// a time, oldest first, recording each outcome in its item. While they run,
// the pass's goroutine reads the next page (see readAhead). It returns
// ctx.Err() if ctx is done before every Clear started.
//
// Clears run on worker goroutines, even one at a time: a Clear that calls
// runtime.Goexit then ends a worker, not the caller, and a new worker takes
// over the rest of the page. The workers live for the pass and take a page
// at a time: with fast clears, a goroutine or a hand-over per marker, or
// even per page, would cost more than the clears.
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
		s.readAhead(ctx, p)
		return 0, ctx.Err()
	}
	if s.clearBatch != nil || s.clear == nil {
		return s.clearBatches(ctx, p, keys, items)
	}
	c := p.clearing
	if c == nil {
		c = &clearing{s: s, p: p, ctx: ctx, pages: make(chan struct{}, s.concurrency)}
		p.clearing = c
	}
	c.items, c.next = items, atomic.Int64{}
	if s.clearTimeout > 0 {
		// A slab per page, not reused: a Clear may keep its context, which
		// must stay cancelled once it returned.
		c.ctxs = make([]clearCtx, len(items))
		c.pageNo = c.pagesOver.Load()
	}
	// One worker takes the whole page at once; more take an item at a
	// time, so that a slow Clear holds up no other.
	c.chunk = 1
	if s.concurrency == 1 {
		c.chunk = len(items)
	}
	shares := min(s.concurrency, n)
	for c.started < shares {
		c.started++
		c.workers.Add(1)
		go c.serve(false, 0, 0)
	}
	c.page.Add(shares)
	for range shares {
		c.pages <- struct{}{}
	}
	s.readAhead(ctx, p)
	c.page.Wait()
	if c.ctxs != nil {
		c.endPage(c.ctxs)
	}
	c.items, c.ctxs = nil, nil
	return n, ctx.Err()
}

// panicked is the error of a Clear that panicked with r, with its stack.
func panicked(r any) error {
	return fmt.Errorf("%w: %v\n%s", ErrClearPanicked, r, debug.Stack())
}

// clearing is the clears of a pass: its workers and the page they clear.
type clearing struct {
	s   *Sweep
	p   *passState
	ctx context.Context

	pages   chan struct{}  // one token per worker's share of a page
	workers sync.WaitGroup // the workers alive
	started int            // workers started, on the pass's goroutine
	page    sync.WaitGroup // the shares of the page not done yet

	// The page, set before its tokens are sent.
	items  []item
	ctxs   []clearCtx   // ctxs[i] is items[i]'s, under ClearTimeout
	next   atomic.Int64 // index of the next item to take
	chunk  int          // how many items a worker takes at once
	pageNo int64        // the page's number among those with contexts

	pagesOver atomic.Int64 // pages whose clears are all done (see clearCtx)
}

// serve is a worker: it clears its share of each page until the pass ends.
// A worker that takes the place of one ended by runtime.Goexit first
// resumes its share of the page, from lo to hi.
func (c *clearing) serve(resume bool, lo, hi int) {
	defer c.workers.Done()
	if resume {
		c.work(lo, hi)
	}
	for range c.pages {
		c.work(0, 0)
	}
}

// stop ends the workers once their pages are done; the pass calls it as it
// ends, however it ends.
func (c *clearing) stop() {
	close(c.pages)
	c.workers.Wait()
}

// work clears the items from lo to hi, then takes more of the page until
// none is left.
func (c *clearing) work(lo, hi int) {
	defer c.page.Done()
	for {
		for i := lo; i < hi; i++ {
			if c.ctx.Err() != nil {
				return // the pass is over: the items stay pending
			}
			if c.items[i].out == pending && !c.clearOne(i) {
				return
			}
		}
		end := int(c.next.Add(int64(c.chunk)))
		lo, hi = end-c.chunk, min(end, len(c.items))
		if lo >= hi {
			return
		}
	}
}

// clearOne calls Clear for one item under ClearTimeout and records the
// outcome. Only a Clear that returned nil, ErrLiveAgain or Hold is recorded
// as such; one that returned another error, panicked or never returned
// (runtime.Goexit) is recorded as failed. It returns false when the pass is
// over before the call.
func (c *clearing) clearOne(i int) (started bool) {
	if c.s.limiter != nil && c.s.waitBudget(c.ctx, c.p, 1) != nil {
		return false // the item stays pending
	}
	it := &c.items[i]
	returned := false
	defer func() {
		if returned {
			return
		}
		it.out, started = failed, true
		if r := recover(); r != nil {
			it.err = panicked(r)
			c.p.callFailed(it.err)
			return // the worker goes on
		}
		c.p.callFailed(errClearExited)
		// runtime.Goexit: this goroutine ends once the deferred calls ran.
		// Another worker takes its place and the rest of the items it took,
		// which end at the next multiple of chunk.
		it.err = errClearExited
		c.page.Add(1)
		c.workers.Add(1)
		go c.serve(true, i+1, min((i/c.chunk+1)*c.chunk, len(c.items)))
	}()
	var ctx context.Context = c.ctx
	if c.ctxs != nil {
		cctx := &c.ctxs[i]
		cctx.c, cctx.page = c, c.pageNo
		defer cctx.returned()
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
	return true
}
