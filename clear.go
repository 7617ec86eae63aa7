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

// clearAll calls Clear for the page's pending items from the walk's next
// one on, at most Concurrency at a time, oldest first, recording each
// outcome in its item, and reads the next page (see readAhead). It returns
// ctx.Err() if ctx is done before every Clear started.
//
// Clears never run on the goroutine that called Pass: a Clear that calls
// runtime.Goexit then ends a goroutine of the sweep's, whose work another
// takes up, and not the caller. With Concurrency 1 they run on the walk's
// goroutine (see walk), one after the other. With more, they run on
// workers that live for the pass and take the page's items one at a time,
// while the pass's goroutine reads the next page: a goroutine or a
// hand-over per marker would cost more than quick clears.
//
// It returns how many calls of Clear (or ClearBatch) it made.
func (s *Sweep) clearAll(ctx context.Context, p *passState, keys [][]byte, items []item, w *walk) (calls int, err error) {
	n := 0
	for i := w.next; i < len(items); i++ {
		if items[i].out == pending {
			n++
			if s.concurrency == 1 {
				break // there are clears; only workers share them out by their number
			}
		}
	}
	c := p.clearing
	if n == 0 && (c == nil || c.calls == 0) {
		s.readAhead(ctx, p)
		return 0, ctx.Err()
	}
	if s.clearBatch != nil || s.clear == nil {
		return s.clearBatches(ctx, p, keys, items)
	}
	if c == nil {
		c = &clearing{s: s, p: p, ctx: ctx, inline: s.concurrency == 1}
		p.clearing = c
	}
	if w.next == 0 {
		c.items, c.slot = items, nil
		c.cleared.Store(0)
		c.pageNo = c.pagesOver.Load()
		if s.clearTimeout > 0 && !c.inline {
			// A slab per page, not reused: a Clear may keep its context,
			// which must stay cancelled once it returned.
			c.ctxs = make([]clearCtx, len(items))
		}
	}
	if c.inline {
		// This goroutine makes the clears: the next page is read once this
		// one is settled (see readsSettled), or meanwhile on a goroutine of
		// its own from a slow store.
		s.prefetch(ctx, p)
		if p.ahead.inFlight == nil && !p.readsSettled() {
			s.readAhead(ctx, p)
		}
		c.clearFrom(w)
		if !p.readsSettled() {
			s.readAhead(ctx, p)
		}
	} else {
		c.next.Store(0)
		shares := min(s.concurrency, n)
		if c.pages == nil {
			c.pages = make(chan struct{}, s.concurrency)
		}
		for c.started < shares {
			c.started++
			c.workers.Add(1)
			go c.serve(false)
		}
		c.page.Add(shares)
		for range shares {
			c.pages <- struct{}{}
		}
		s.readAhead(ctx, p)
		c.page.Wait()
		c.calls = n
	}
	c.endPage()
	p.pageCleared = int(c.cleared.Load())
	c.items, c.ctxs, c.slot = nil, nil, nil
	calls, c.calls = c.calls, 0
	return calls, ctx.Err()
}

// panicked is the error of a Clear that panicked with r, with its stack.
func panicked(r any) error {
	return fmt.Errorf("%w: %v\n%s", ErrClearPanicked, r, debug.Stack())
}

// clearing is the clears of a pass: the page they clear, and the workers
// of a Concurrency above 1.
type clearing struct {
	s      *Sweep
	p      *passState
	ctx    context.Context
	inline bool // Concurrency 1: the walk's goroutine clears

	// The page, set before its clears start.
	items  []item
	ctxs   []clearCtx // ctxs[i] is items[i]'s, under ClearTimeout, with workers
	pageNo int64      // the page's number in the pass
	// Without workers, consecutive clears share a context until one is
	// consulted (see ctxFor): slot, taken from spare.
	slot   *clearCtx
	spare  []clearCtx
	inPage []*clearCtx // the slots the page took
	calls  int         // calls of Clear made for the page
	exited bool        // an inline Clear called runtime.Goexit (see runWalk)

	pagesOver atomic.Int64 // pages whose clears are all done (see clearCtx)
	cleared   atomic.Int64 // the page's items whose Clear returned nil (see settle)

	// The workers, with Concurrency above 1.
	pages   chan struct{}  // one token per worker's share of a page
	workers sync.WaitGroup // the workers alive
	started int            // workers started, on the pass's goroutine
	page    sync.WaitGroup // the shares of the page not done yet
	next    atomic.Int64   // index of the page's next item to take
}

// clearFrom clears the page's pending items from the walk's next on, one
// at a time, on the walk's goroutine.
func (c *clearing) clearFrom(w *walk) {
	for c.clearRun(w) {
	}
}

// clearRun calls Clear for the page's pending items one after the other,
// taken from the walk w on its goroutine, or from the workers' shared
// index when w is nil, until none is left or the pass is over. It returns
// true when a Clear panicked, for the caller to run on from the next item.
//
// One deferred call covers the run rather than one per Clear, which cost a
// tenth of the sweep's own work per marker: a Clear that panics or calls
// runtime.Goexit is recorded by interrupted.
func (c *clearing) clearRun(w *walk) (again bool) {
	var cur clearCall
	defer func() {
		c.cleared.Add(int64(cur.cleared))
		if cur.item != nil {
			again = c.interrupted(&cur, recover())
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
		var i int
		if w != nil {
			if w.next >= len(items) {
				return false
			}
			i = w.next
			w.next++
		} else if i = int(c.next.Add(1)) - 1; i >= len(items) {
			return false
		}
		if items[i].out != pending {
			continue
		}
		if w != nil {
			c.calls++
		}
		if !c.clearOne(i, &cur) {
			return false
		}
	}
}

// clearCall is the call of Clear under way in a run, if any.
type clearCall struct {
	item    *item     // nil between calls
	ctx     *clearCtx // its context under ClearTimeout, or nil
	cleared int       // the run's calls that returned nil
}

// ctxFor returns the context of the Clear of items[i] under ClearTimeout,
// or nil when there is none.
//
// On the walk's goroutine a context serves the clears that follow one
// another until one consults it: most quick clears never do, and a context
// each would cost an allocation and its clearing per marker. A Clear still
// gets a context that no clear before it consulted, its deadline counting
// from its own first look; only a goroutine an earlier Clear left behind
// with it could share it, and it reads as cancelled by the page's end.
func (c *clearing) ctxFor(i int) *clearCtx {
	switch {
	case c.s.clearTimeout <= 0:
		return nil
	case !c.inline:
		if c.ctxs == nil {
			return nil
		}
		cctx := &c.ctxs[i]
		cctx.c, cctx.page = c, c.pageNo
		return cctx
	}
	if c.shared() == nil {
		if len(c.spare) == 0 {
			c.spare = make([]clearCtx, 32)
		}
		c.slot, c.spare = &c.spare[0], c.spare[1:]
		c.slot.c, c.slot.page = c, c.pageNo
		c.inPage = append(c.inPage, c.slot)
	}
	return c.slot
}

// shared returns the context the walk's clears share while none of them
// consulted it (see ctxFor), or nil. Only the walk's goroutine sets slot.
func (c *clearing) shared() *clearCtx {
	if slot := c.slot; slot != nil && slot.state.Load() == nil {
		return slot
	}
	return nil
}

// serve is a worker: it clears its share of each page until the pass ends.
// A worker that takes the place of one ended by runtime.Goexit resumes the
// page first.
func (c *clearing) serve(resume bool) {
	defer c.workers.Done()
	if resume {
		c.work()
	}
	for range c.pages {
		c.work()
	}
}

// stop ends the workers once their pages are done; the pass calls it as it
// ends, however it ends.
func (c *clearing) stop() {
	if c.pages != nil {
		close(c.pages)
		c.workers.Wait()
	}
}

// work takes the page's items one at a time until none is left.
func (c *clearing) work() {
	defer c.page.Done()
	for c.clearRun(nil) {
	}
}

// clearOne calls Clear for one item under ClearTimeout and records the
// outcome; cur says which call is under way while it is. Only a Clear that
// returned nil, ErrLiveAgain or Hold is recorded as such; one that returned
// another error is recorded as failed here, and one that panicked or never
// returned (runtime.Goexit) by interrupted. It returns false when the pass
// is over before the call.
func (c *clearing) clearOne(i int, cur *clearCall) bool {
	s := c.s
	if s.limiter != nil && s.waitBudget(c.ctx, c.p, 1) != nil {
		return false // the item stays pending
	}
	it := &c.items[i]
	var ctx context.Context = c.ctx
	cctx := c.shared() // most clears, without a call
	if cctx == nil {
		cctx = c.ctxFor(i)
	}
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
	case cleared:
		cur.cleared++
	case liveAgain:
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

// interrupted records the call cur of a run as failed: its Clear panicked
// with r, or called runtime.Goexit when r is nil. It reports whether the
// run goes on after a panic. After runtime.Goexit this goroutine ends once
// the deferred calls ran, and another takes its place: the walk's next
// (see runWalk), or a worker that takes its share of the page.
func (c *clearing) interrupted(cur *clearCall, r any) (again bool) {
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
	if c.inline {
		c.exited = true
		return false
	}
	c.page.Add(1)
	c.workers.Add(1)
	go c.serve(true)
	return false
}
