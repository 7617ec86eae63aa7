package retention

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// errClearExited records a Clear that called runtime.Goexit (as t.FailNow).
var errClearExited = errors.New("retention: clear did not return: it called runtime.Goexit")

// errClearTimedOut marks a clear that ran past ClearTimeout.
var errClearTimedOut = errors.New("retention: clear timed out")

// clearAll calls Clear (or ClearBatch, or a ClearDeleter) for the page's
// pending items, at most Concurrency at a time, oldest first, recording
// each outcome in its item. It returns how many calls it made, and
// ctx.Err() if ctx is done before every one started.
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
	c := p.clearing
	if c == nil {
		c = &clearing{s: s, p: p, ctx: ctx, pages: make(chan struct{}, s.concurrency)}
		p.clearing = c
	}
	c.items = items
	if s.clearTimeout > 0 {
		// A slab per page, not reused: a Clear may keep its context,
		// which must stay cancelled once it returned.
		c.ctxs = make([]clearCtx, len(items))
		c.ctxPage = &ctxPage{c: c, page: c.pagesOver.Load()}
	}
	c.next.Store(0)
	c.keys, c.calls, c.inRetry = keys, n, p.inRetry
	// The pass's own goroutine takes one share, workers the others; on
	// the caller's goroutine (see runPass), workers take them all.
	shares, own := min(s.concurrency, n), 1
	if p.onCaller {
		own = 0
	}
	for c.started < shares-own {
		c.started++
		c.workers.Add(1)
		go c.serve(false)
	}
	c.page.Add(shares)
	for range shares - own {
		c.pages <- struct{}{}
	}
	if own == 1 {
		c.work(true)
	}
	c.endClears()
	p.rethrow()
	return n, ctx.Err()
}

func (c *clearing) endClears() {
	c.page.Wait()
	c.endPage()
	c.keys, c.items, c.ctxs = nil, nil, nil
}

// panicked is the error of a Clear that panicked with r, with its stack.
func panicked(r any) error {
	return fmt.Errorf("%w: %v\n%s", ErrClearPanicked, r, debug.Stack())
}

// clearing is the clears of a pass: the page they clear, and the workers.
type clearing struct {
	s   *Sweep
	p   *passState
	ctx context.Context

	// The page, set before its clears start.
	keys    [][]byte
	items   []item
	ctxs    []clearCtx // ctxs[i] is items[i]'s, under ClearTimeout
	ctxPage *ctxPage
	calls   int
	inRetry bool // the page is the retry range's

	passExited bool         // a Clear ended the pass's goroutine (see passOn)
	pagesOver  atomic.Int64 // pages whose clears are all done (see clearCtx)

	pages   chan struct{}  // one token per worker's share of a page
	workers sync.WaitGroup // the workers alive
	started int            // workers started, on the pass's goroutine
	page    sync.WaitGroup // the shares of the page not done yet
	next    atomic.Int64   // index of the page's next item to take
}

// clearRun calls Clear for the page's pending items, taken from the
// workers' shared index, until none is left or the pass is over. It
// returns true when a Clear panicked, for the caller to run on. One
// deferred call covers the run, not one per Clear (see interrupted).
func (c *clearing) clearRun(onPass bool) (again bool) {
	var cur clearCall
	defer func() {
		switch {
		case cur.item != nil:
			again = c.interrupted(&cur, recover(), onPass)
		case !onPass:
			// Outside a Clear (a Clock's or a Limiter's panic): raised
			// again on the pass's goroutine once the page's clears end.
			c.p.catch(recover())
		}
	}()
	// A context that can never be cancelled has no Done channel: no check
	// per Clear. Others are asked for Err, not Done, before each: a pass's
	// context under a lease reads its loss there first (see leaseContext).
	cancellable := c.ctx.Done() != nil
	items := c.items
	for {
		if cancellable && c.ctx.Err() != nil {
			return false
		}
		i := int(c.next.Add(1)) - 1
		if i >= len(items) {
			return false
		}
		if items[i].out != pending {
			continue
		}
		if !c.clearOne(i, &cur) {
			return false
		}
	}
}

// clearCall is the call of Clear under way in a run, if any.
type clearCall struct {
	item *item     // nil between calls
	ctx  *clearCtx // its context under ClearTimeout, or nil
}

// ctxFor returns the context of items[i]'s Clear under ClearTimeout, or nil.
func (c *clearing) ctxFor(i int) *clearCtx {
	if c.ctxs == nil {
		return nil
	}
	cctx := &c.ctxs[i]
	cctx.pg = c.ctxPage
	return cctx
}

// serve is a worker: it clears its share of each page until the pass ends,
// and first resumes the page of one that runtime.Goexit ended.
func (c *clearing) serve(resume bool) {
	defer c.workers.Done()
	if resume {
		c.work(false)
	}
	for range c.pages {
		c.work(false)
	}
}

// stop ends the workers once their pages are done, however the pass ends.
func (c *clearing) stop() {
	if c.pages != nil {
		close(c.pages)
		c.workers.Wait()
	}
}

func (c *clearing) work(onPass bool) {
	defer c.page.Done()
	for c.clearRun(onPass) {
	}
}

// clearOne calls Clear for items[i] under ClearTimeout and records the
// outcome (a panic or runtime.Goexit: interrupted); cur says which call is
// under way. It returns false when the pass is over before the call.
func (c *clearing) clearOne(i int, cur *clearCall) bool {
	s := c.s
	if s.limiter != nil && s.waitBudget(c.ctx, c.p, 1) != nil {
		return false // the item stays pending
	}
	it := &c.items[i]
	var ctx context.Context = c.ctx
	cctx := c.ctxFor(i)
	if cctx != nil {
		ctx = cctx
	}
	cur.item, cur.ctx = it, cctx
	err := s.clear(ctx, it.id)
	if cctx != nil {
		cur.ctx = nil
		cctx.returned()
	}
	// The call counts as under way until its outcome is recorded: reading
	// the error can panic too (a typed nil whose Unwrap dereferences it),
	// and is then recorded as the Clear's panic.
	switch it.out = outcomeOf(err); it.out {
	case cleared, liveAgain:
	case held:
		it.err = err
	default:
		if cctx != nil && cctx.timedOut() {
			err = fmt.Errorf("%w after ClearTimeout (%v): %w", errClearTimedOut, c.s.clearTimeout, err)
		}
		it.err = err
		c.p.callFailed(err)
	}
	cur.item = nil
	return true
}

// interrupted records the call cur as failed: its Clear panicked with r,
// or called runtime.Goexit (r nil), and then a new worker takes up this
// goroutine's share (see runPass). It reports whether the run goes on.
func (c *clearing) interrupted(cur *clearCall, r any, onPass bool) (again bool) {
	if cur.ctx != nil {
		cur.ctx.returned()
	}
	it := cur.item
	it.out = failed
	if r != nil {
		it.err = panicked(r)
		c.p.callFailed(it.err)
		return true
	}
	it.err = errClearExited
	c.p.callFailed(errClearExited)
	if onPass {
		c.passExited = true
	}
	c.page.Add(1)
	c.workers.Add(1)
	go c.serve(true)
	return false
}

func (s *Sweep) callBatch(ctx context.Context, ids []string) error {
	return s.guarded(ctx, func(ctx context.Context) error { return s.clearBatch(ctx, ids) })
}

// callAtomic runs ClearAndDelete under guarded: its clear may panic too.
func (s *Sweep) callAtomic(ctx context.Context, kv ClearDeleter, ids []string, keys [][]byte) error {
	return s.guarded(ctx, func(ctx context.Context) error { return kv.ClearAndDelete(ctx, ids, keys) })
}

// guarded runs call under ClearTimeout on a goroutine of its own, turning
// a panic or a runtime.Goexit into an error.
func (s *Sweep) guarded(ctx context.Context, call func(context.Context) error) error {
	return s.await(ctx, s.goGuarded(ctx, call))
}

// guardedCall is a call of guarded in flight. Its goroutine cancels cctx
// once the call is over, so that cctx tells whether ClearTimeout ran out
// during the call.
type guardedCall struct {
	cctx context.Context
	done chan error
}

// goGuarded starts call as guarded does; await waits for its error.
func (s *Sweep) goGuarded(ctx context.Context, call func(context.Context) error) guardedCall {
	cctx, cancel := withTimeout(ctx, s.clearTimeout)
	done := make(chan error, 1)
	go func() {
		returned := false
		defer func() {
			if returned {
				return
			}
			cancel() // cctx's deadline is read as of the call's end
			if r := recover(); r != nil {
				done <- panicked(r)
				return
			}
			done <- errClearExited
		}()
		err := call(cctx)
		returned = true
		cancel()
		done <- err
	}()
	return guardedCall{cctx: cctx, done: done}
}

func (s *Sweep) await(ctx context.Context, g guardedCall) error {
	err := <-g.done
	if err != nil {
		if _, perr := errorPanics(err); perr != nil {
			err = perr
		}
	}
	if err != nil && ctx.Err() == nil && errors.Is(g.cctx.Err(), context.DeadlineExceeded) && !errors.As(err, new(BatchError)) {
		err = fmt.Errorf("%w after ClearTimeout (%v): %w", errClearTimedOut, s.clearTimeout, err)
	}
	return err
}
