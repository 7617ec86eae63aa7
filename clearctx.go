package retention

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// clearCtx is the context of one Clear call under ClearTimeout. Its
// deadline counts from the first time Clear consults it (Deadline, Done or
// Err), which for any Clear that waits on I/O is when it starts: a Clear
// that never consults its context cannot be stopped anyway. Until then it
// holds no state, and no timer, clock read or allocation of its own:
// clearAll allocates a page's contexts at once.
//
// When Clear returns, returned cancels the context if Clear consulted it,
// as the cancel function of WithTimeout would. One it never consulted reads
// as cancelled once its page's clears are done: only a goroutine that Clear
// left behind with the context can tell, if it consults it first between
// the two; it is then cancelled with the page, or at its own ClearTimeout.
type clearCtx struct {
	c     *clearing                  // the pass's clears: parent context and timeout
	page  int64                      // the pass's page it belongs to, from 0
	state atomic.Pointer[clearState] // nil until first consulted or ended
}

// clearState is the state of a consulted clearCtx.
type clearState struct {
	deadline time.Time // zero: none
	own      bool      // the deadline is the context's timeout's, not the parent's
	mu       sync.Mutex
	done     chan struct{} // nil until Done is called
	err      error         // set once ended, cancelled or past the deadline
	timer    *time.Timer
	stop     func() bool // stops the watch on the parent
}

// ended is the state of a context whose call returned before consulting
// it.
var ended = func() *clearState {
	done := make(chan struct{})
	close(done)
	return &clearState{done: done, err: context.Canceled}
}()

// lazyState returns the state in *state, creating it on first use with a
// deadline timeout from now, or parent's when that is earlier.
func lazyState(state *atomic.Pointer[clearState], parent context.Context, timeout time.Duration) *clearState {
	if st := state.Load(); st != nil {
		return st
	}
	st := &clearState{}
	d, ok := parent.Deadline()
	if timeout > 0 {
		if own := time.Now().Add(timeout); !ok || own.Before(d) {
			d, ok, st.own = own, true, true
		}
	}
	if ok {
		st.deadline = d
	}
	if !state.CompareAndSwap(nil, st) {
		return state.Load()
	}
	return st
}

// get returns the state, creating it on first use; cancelled at once when
// the context's page is over.
func (c *clearCtx) get() *clearState {
	if st := c.state.Load(); st != nil {
		return st
	}
	st := lazyState(&c.state, c.c.ctx, c.c.s.clearTimeout)
	if c.c.pagesOver.Load() > c.page {
		// Its Clear returned; the page's end may have looked at its state
		// before it was set. Either sees the other: both are atomic.
		st.cancel(context.Canceled)
	}
	return st
}

func (c *clearCtx) Deadline() (time.Time, bool) { return c.get().deadlineOf() }

func (c *clearCtx) Value(key any) any { return c.c.ctx.Value(key) }

func (c *clearCtx) Err() error { return c.get().errOf(c.c.ctx) }

func (c *clearCtx) Done() <-chan struct{} { return c.get().doneOf(c.c.ctx) }

// returned cancels the context once Clear returned, if Clear consulted it.
func (c *clearCtx) returned() {
	if st := c.state.Load(); st != nil {
		st.cancel(context.Canceled)
	}
}

// end cancels the context, consulted or not.
func (c *clearCtx) end() { endState(&c.state) }

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

// timedOut reports whether the deadline of ClearTimeout, not the parent,
// ended the context.
func (c *clearCtx) timedOut() bool {
	st := c.state.Load()
	if st == nil || st == ended {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err == context.DeadlineExceeded && st.own
}

// endState cancels the context of state once its call returned.
func endState(state *atomic.Pointer[clearState]) {
	if !state.CompareAndSwap(nil, ended) {
		state.Load().cancel(context.Canceled)
	}
}

func (st *clearState) deadlineOf() (time.Time, bool) {
	return st.deadline, !st.deadline.IsZero()
}

func (st *clearState) errOf(parent context.Context) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.errLocked(parent)
}

// errLocked settles err from the parent and the clock if it is not set yet.
func (st *clearState) errLocked(parent context.Context) error {
	if st.err == nil {
		if err := parent.Err(); err != nil {
			st.cancelLocked(err)
		} else if st.own && !time.Now().Before(st.deadline) {
			// Only its own deadline: the parent's ends the parent first,
			// so that the caller's deadline reads as the caller's.
			st.cancelLocked(context.DeadlineExceeded)
		}
	}
	return st.err
}

func (st *clearState) doneOf(parent context.Context) <-chan struct{} {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done != nil {
		return st.done
	}
	if st.errLocked(parent) != nil {
		st.done = ended.done // closed
		return st.done
	}
	st.done = make(chan struct{})
	if st.own {
		st.timer = time.AfterFunc(time.Until(st.deadline), func() { st.cancel(context.DeadlineExceeded) })
	}
	st.stop = context.AfterFunc(parent, func() { st.cancel(parent.Err()) })
	return st.done
}

func (st *clearState) cancel(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.cancelLocked(err)
}

func (st *clearState) cancelLocked(err error) {
	if st.err != nil {
		return
	}
	st.err = err
	if st.done != nil {
		close(st.done)
	}
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.stop != nil {
		st.stop()
	}
}
