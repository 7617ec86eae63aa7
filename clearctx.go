package retention

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// clearCtx is the context of one Clear call under ClearTimeout. Its
// deadline counts from the first time Clear consults it (Deadline, Done or
// Err), which for any Clear that waits on I/O is when it starts: a Clear
// that never consults its context cannot be stopped anyway. Until then it
// is a slot of a page's slab, allocated at once by clearAll, with no timer,
// clock read or allocation of its own; on first use it becomes
// context.WithTimeout of the pass's context.
//
// When Clear returns, returned cancels the context if Clear consulted it,
// as the cancel function of WithTimeout would. One it never consulted reads
// as cancelled once its page's clears are done: only a goroutine that Clear
// left behind with the context can tell, if it consults it first between
// the two; it is then cancelled with the page, or at its own ClearTimeout.
type clearCtx struct {
	pg    *ctxPage                 // the page it belongs to
	state atomic.Pointer[timedCtx] // nil until first consulted or ended
}

// ctxPage is what the clearCtx of a page share.
type ctxPage struct {
	c    *clearing // the pass's clears: parent context and timeout
	page int64     // the pass's page, from 0
}

// timedCtx is what a clearCtx becomes once consulted.
type timedCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// errOwnTimeout is the cause of a clearCtx ended by its own ClearTimeout.
var errOwnTimeout = errors.New("retention: ClearTimeout")

// ended is the state of a context whose call returned before consulting it.
var ended = func() *timedCtx {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return &timedCtx{ctx: ctx, cancel: cancel}
}()

// get returns the state, made on first use (cancelled if the page is over).
func (c *clearCtx) get() *timedCtx {
	if st := c.state.Load(); st != nil {
		return st
	}
	var st timedCtx
	st.ctx, st.cancel = context.WithTimeoutCause(c.pg.c.ctx, c.pg.c.s.clearTimeout, errOwnTimeout)
	if !c.state.CompareAndSwap(nil, &st) {
		st.cancel()
		return c.state.Load()
	}
	if c.pg.c.pagesOver.Load() > c.pg.page {
		// Its Clear returned; the page's end may have looked at its state
		// before it was set. Either sees the other: both are atomic.
		st.cancel()
	}
	return &st
}

func (c *clearCtx) Deadline() (time.Time, bool) { return c.get().ctx.Deadline() }

func (c *clearCtx) Value(key any) any { return c.pg.c.ctx.Value(key) }

// Err and Done ask the pass's context first: under a lease it reports its
// loss from Err before its Done channel closes (see leaseContext).
func (c *clearCtx) Err() error {
	st := c.get()
	if err := c.pg.c.ctx.Err(); err != nil {
		st.cancel()
		return err
	}
	return st.ctx.Err()
}

func (c *clearCtx) Done() <-chan struct{} {
	st := c.get()
	if c.pg.c.ctx.Err() != nil {
		st.cancel()
	}
	return st.ctx.Done()
}

// returned cancels the context once Clear returned, if Clear consulted it.
func (c *clearCtx) returned() {
	if st := c.state.Load(); st != nil {
		st.cancel()
	}
}

// end cancels the context, consulted or not.
func (c *clearCtx) end() {
	if !c.state.CompareAndSwap(nil, ended) {
		c.state.Load().cancel()
	}
}

// endPage cancels the contexts of a page whose clears are all done: a
// context consulted now or later reads as cancelled.
func (c *clearing) endPage() {
	c.pagesOver.Add(1)
	for i := range c.ctxs {
		if c.ctxs[i].state.Load() != nil {
			c.ctxs[i].end()
		}
	}
}

// timedOut reports whether ClearTimeout, not the parent, ended the context.
func (c *clearCtx) timedOut() bool {
	st := c.state.Load()
	return st != nil && context.Cause(st.ctx) == errOwnTimeout
}
