package retention

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Store calls go through these three, which give each call its own deadline
// (Config.StoreTimeout), count it and name it in errors.

func (s *Sweep) scan(ctx context.Context, p *passState, start, end []byte, limit int) ([][]byte, error) {
	keys, err := s.scanKV(ctx, p.kv, start, end, limit)
	p.countScan(keys)
	return keys, err
}

// countScan counts a Scan call that returned keys in the pass's Stats.
func (p *passState) countScan(keys [][]byte) {
	p.st.ScanCalls++
	p.st.Scanned += len(keys)
}

// scanKV is scan without the counting, for a goroutine of its own.
func (s *Sweep) scanKV(ctx context.Context, kv KV, start, end []byte, limit int) ([][]byte, error) {
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	keys, err := kv.Scan(cctx, start, end, limit)
	if err != nil {
		return nil, s.storeErr(ctx, cctx, "scan markers", err)
	}
	return keys, nil
}

// prefetch is a Scan of the next page of the expired range in flight.
type prefetch struct {
	done chan struct{}
	keys [][]byte
	err  error
}

// prefetch starts reading the page of the expired range from start.
func (s *Sweep) prefetch(ctx context.Context, p *passState, start []byte) *prefetch {
	f := &prefetch{done: make(chan struct{})}
	kv, end := p.kv, p.cutoffKey
	go func() {
		defer close(f.done)
		f.keys, f.err = s.scanKV(ctx, kv, start, end, s.pageSize)
	}()
	return f
}

// wait returns the prefetched page, counted in the pass's Stats, once the
// current page is done with err; a failure of the current page comes
// first. It always waits, so that no Scan outlives the pass.
func (f *prefetch) wait(p *passState, err error) ([][]byte, error) {
	<-f.done
	p.countScan(f.keys)
	if err != nil {
		return nil, err
	}
	return f.keys, f.err
}

func (s *Sweep) delete(ctx context.Context, p *passState, keys [][]byte) error {
	wctx, mark := p.writeCtx(ctx)
	cctx, cancel := withTimeout(wctx, s.storeTimeout)
	defer cancel()
	p.st.DeleteCalls++
	if err := p.kv.Delete(cctx, keys...); err != nil {
		return s.storeErr(ctx, cctx, fmt.Sprintf("delete %d markers", len(keys)), err)
	}
	return checkFenced(mark, p.kv, "Delete")
}

func (s *Sweep) put(ctx context.Context, p *passState, key []byte) error {
	wctx, mark := p.writeCtx(ctx)
	cctx, cancel := withTimeout(wctx, s.storeTimeout)
	defer cancel()
	p.st.PutCalls++
	if err := p.putter.Put(cctx, key, nil); err != nil {
		return s.storeErr(ctx, cctx, "reschedule marker", err)
	}
	return checkFenced(mark, p.kv, "Put")
}

func (s *Sweep) move(ctx context.Context, p *passState, from, to [][]byte) error {
	wctx, mark := p.writeCtx(ctx)
	cctx, cancel := withTimeout(wctx, s.storeTimeout)
	defer cancel()
	p.st.PutCalls++
	if err := p.mover.Move(cctx, from, to); err != nil {
		return s.storeErr(ctx, cctx, fmt.Sprintf("reschedule %d markers", len(from)), err)
	}
	return checkFenced(mark, p.kv, "Move")
}

// writeCtx is the context of a write of the pass: ctx, carrying the
// lease's fence when the pass writes through a wrapper (see Fencer), with
// the mark that tells whether the write applied it.
func (p *passState) writeCtx(ctx context.Context) (context.Context, *fenceMark) {
	if p.fence == nil {
		return ctx, nil
	}
	return withFence(ctx, p.fence)
}

// withTimeout is context.WithTimeout, or ctx itself when d is not positive.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// storeErr wraps the error of a store call made under cctx, a child of ctx:
// ctx's own error when ctx ended the call, a timeout naming StoreTimeout
// when cctx did, else the store's error.
func (s *Sweep) storeErr(ctx, cctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return ctxErr
	}
	if ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("retention: %s: no answer within StoreTimeout (%v): %w", what, s.storeTimeout, err)
	}
	return fmt.Errorf("retention: %s: %w", what, err)
}

// clearCtx is the context of one Clear call under ClearTimeout. Its
// deadline counts from the first time Clear consults it (Deadline, Done or
// Err), which for any Clear that waits on I/O is when it starts: a Clear
// that never consults its context cannot be stopped anyway. Until then it
// holds no state; clearAll allocates a page's contexts at once. That spares
// the allocations, the timer and the clock read that context.WithTimeout
// costs per marker, several times the sweep's own work per marker. end
// cancels it when Clear returns, as the cancel function of WithTimeout
// would.
type clearCtx struct {
	c     *clearing                  // the page's clears: parent context and timeout
	state atomic.Pointer[clearState] // nil until first consulted or ended
}

// clearState is a consulted clearCtx's state.
type clearState struct {
	deadline time.Time
	own      bool // the deadline is ClearTimeout's, not the parent's
	mu       sync.Mutex
	done     chan struct{} // nil until Done is called
	err      error         // set once ended, cancelled or past the deadline
	timer    *time.Timer
	stop     func() bool // stops the watch on the parent
}

// ended is the state of a clearCtx whose Clear returned before consulting
// it.
var ended = func() *clearState {
	done := make(chan struct{})
	close(done)
	return &clearState{done: done, err: context.Canceled}
}()

// get returns the state, creating it on first use.
func (c *clearCtx) get() *clearState {
	if st := c.state.Load(); st != nil {
		return st
	}
	st := &clearState{deadline: time.Now().Add(c.c.s.clearTimeout), own: true}
	if d, ok := c.c.ctx.Deadline(); ok && !st.deadline.Before(d) {
		st.deadline, st.own = d, false
	}
	if !c.state.CompareAndSwap(nil, st) {
		return c.state.Load()
	}
	return st
}

func (c *clearCtx) Deadline() (time.Time, bool) {
	st := c.get()
	return st.deadline, !st.deadline.IsZero()
}

func (c *clearCtx) Value(key any) any { return c.c.ctx.Value(key) }

func (c *clearCtx) Err() error {
	st := c.get()
	st.mu.Lock()
	defer st.mu.Unlock()
	return c.errLocked(st)
}

// errLocked settles err from the parent and the clock if it is not set yet.
func (c *clearCtx) errLocked(st *clearState) error {
	if st.err == nil {
		if err := c.c.ctx.Err(); err != nil {
			st.cancelLocked(err)
		} else if !time.Now().Before(st.deadline) {
			st.cancelLocked(context.DeadlineExceeded)
		}
	}
	return st.err
}

func (c *clearCtx) Done() <-chan struct{} {
	st := c.get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done != nil {
		return st.done
	}
	if c.errLocked(st) != nil {
		st.done = ended.done // closed
		return st.done
	}
	st.done = make(chan struct{})
	st.timer = time.AfterFunc(time.Until(st.deadline), func() { st.cancel(context.DeadlineExceeded) })
	parent := c.c.ctx
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

// end cancels the context once Clear returned.
func (c *clearCtx) end() {
	if !c.state.CompareAndSwap(nil, ended) {
		c.state.Load().cancel(context.Canceled)
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
