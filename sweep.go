package retention

import (
	"cmp"
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Sweep clears entities whose terminal markers are older than a retention
// window. Create one with New; call Run for a background loop, or Pass for
// one sweep (in tests, or driven by your own scheduler). A Sweep is safe for
// concurrent use; its passes never overlap. The zero value is not usable:
// its methods return an error matching ErrNotConfigured.
type Sweep struct {
	settings                // what New configured, never changed
	memory                  // what passes remember, guarded by busy
	scratch                 // one pass's state and buffers, reused by the next, guarded by busy
	curBatch  atomic.Int64  // the batch size now, adapted to BatchTarget
	running   atomic.Bool   // set while a Run (or a Group's Run) runs the sweep
	busy      chan struct{} // serialises passes; nil in a Sweep not made by New
	requeuing chan struct{} // serialises Requeue and ReleaseHolds calls (see Requeue)
	fleetRun                // the Run that sweeps it, and its record in the store (fleet.go, wake.go)
}

// settings are a Sweep's Config, with defaults applied.
type settings struct {
	kv           KV
	prefix       string
	retention    time.Duration
	clear        func(context.Context, string) error
	clearBatch   func(context.Context, []string) error
	batchSize    int
	clock        Clock
	pageSize     int
	concurrency  int
	interval     time.Duration
	clearTimeout time.Duration // <= 0: none
	storeTimeout time.Duration // <= 0: none
	log          *slog.Logger
	validate     func(string) error // nil: ValidateID
	onPass       func(Stats, error)
	obs          Observer // nil: none
	lease        Locker
	jitter       float64
	startJitter  time.Duration
	unfencedOK   bool
	limiter      *rate.Limiter // nil: none
	batchTarget  time.Duration // <= 0: batches do not adapt
	minInterval  time.Duration // <= 0: none
	dryRun       bool
	maxAttempts  int
	runs         bool          // the expired range may be cleared by a RunClearer's runs (see startRun)
	replica      string        // "": no fleet record, no wake key
	wakePoll     time.Duration // <= 0: Run reads no wake key

	lower, upper           []byte // the marker range: the prefix and a digit
	retryLower, retryUpper []byte // the retry range (see infixRange)
}

// memory is what a Sweep's passes remember from one to the next.
type memory struct {
	retries       retries   // failed and held ids, and when to try them again
	foreignSeen   int       // foreign keys of the last pass that had any
	foreignWarned time.Time // when they were last logged at Warn
	idle          bool      // the last pass found nothing expired (see stillIdle)
	noRuns        bool      // the KV said it cannot clear runs (see startRun)
	noCount       bool      // the RunCounter said it cannot count its runs
}

// scratch is one pass's state and buffers, which the next pass reuses: an
// idle pass allocates (nearly) nothing.
type scratch struct {
	ps       passState
	pst      Stats // ps.st points to it
	items    []item
	ids      []byte
	lags     []time.Duration
	seen     seenIDs
	plan     pagePlan
	passDone chan passEnd // how the pass's goroutine ended (see runPass)
}

// New returns a Sweep of kv's markers configured by cfg. The error matches
// ErrInvalidConfig and names the field at fault.
func New(kv KV, cfg Config) (*Sweep, error) {
	if err := checkConfig(kv, &cfg); err != nil {
		return nil, err
	}
	s := &Sweep{settings: settings{
		kv:           kv,
		prefix:       cfg.Prefix,
		retention:    cfg.Retention,
		clear:        cfg.Clear,
		clearBatch:   cfg.ClearBatch,
		batchSize:    cmp.Or(cfg.BatchSize, DefaultBatchSize),
		clock:        cmp.Or(cfg.Clock, SystemClock),
		pageSize:     cmp.Or(cfg.PageSize, max(DefaultPageSize, cfg.BatchSize)), // a batch is cut from one page
		concurrency:  cmp.Or(cfg.Concurrency, 1),
		interval:     cmp.Or(cfg.Interval, min(cfg.Retention, time.Minute)),
		clearTimeout: cmp.Or(cfg.ClearTimeout, DefaultClearTimeout),
		storeTimeout: cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout),
		log:          cmp.Or(cfg.Logger, slog.Default()).With("prefix", cfg.Prefix),
		validate:     cfg.ValidateID,
		onPass:       cfg.OnPass,
		obs:          cfg.Observer,
		lease:        cfg.Lease,
		jitter:       cfg.Jitter,
		startJitter:  cfg.StartJitter,
		unfencedOK:   cfg.AllowUnfenced,
		limiter:      cfg.Limiter,
		batchTarget:  cfg.BatchTarget,
		minInterval:  cmp.Or(cfg.MinInterval, DefaultMinInterval),
		dryRun:       cfg.DryRun,
		lower:        append([]byte(cfg.Prefix), '0'),
		upper:        append([]byte(cfg.Prefix), '9'+1),
		maxAttempts:  cfg.MaxAttempts,
		replica:      cfg.Replica,
		wakePoll:     cmp.Or(cfg.WakePoll, DefaultWakePoll),
		runs: cfg.Clear == nil && cfg.ClearBatch == nil && cfg.ValidateID == nil &&
			!cfg.DryRun && cfg.Concurrency <= 1,
	}, busy: make(chan struct{}, 1), requeuing: make(chan struct{}, 1)}
	s.retries = newRetries(cmp.Or(cfg.RetryDelay, DefaultRetryDelay), cmp.Or(cfg.MaxRetryDelay, DefaultMaxRetryDelay))
	s.retryLower, s.retryUpper = infixRange(cfg.Prefix, retryInfix)
	if s.batchTarget == 0 && s.clearTimeout > 0 {
		s.batchTarget = s.clearTimeout / 4
	}
	s.curBatch.Store(int64(s.batchSize))
	return s, nil
}

// Pass makes one sweep: every expired marker is handled, oldest first, then
// Pass returns. Per marker it calls Clear and, only once Clear returned nil
// (or ErrLiveAgain), deletes the marker, a page's markers in one KV.Delete.
// A marker whose Clear failed stays, put off until its retry delay is over;
// malformed markers are deleted without Clear; foreign keys are left alone
// (docs/clearing.md). A pass with nothing expired costs three Scan calls
// however many markers wait (over a RunClearer, two and an empty run),
// and two after a pass that found nothing expired either. It returns an error when the KV fails or does not answer
// within StoreTimeout, and ctx.Err() when ctx is done; in every case no
// marker whose Clear did not succeed has been deleted.
func (s *Sweep) Pass(ctx context.Context) (st Stats, err error) {
	if err := s.configured("Pass"); err != nil {
		return st, err
	}
	return s.pass(ctx, s.kv, nil)
}

// pass is Pass over kv, the sweep's KV or a fenced view of it; fence, if
// not nil, goes on the context of every write (see Fencer).
func (s *Sweep) pass(ctx context.Context, kv KV, fence Fencer) (st Stats, err error) {
	if err := ctx.Err(); err != nil {
		return st, err
	}
	select {
	case s.busy <- struct{}{}:
	case <-ctx.Done():
		return st, ctx.Err()
	}
	defer func() { <-s.busy }()

	start := s.clock.Now()
	p := &s.ps
	*p = passState{kv: kv, fence: fence, st: &s.pst, start: start, cutoff: start.Add(-s.retention),
		buf: p.buf}
	s.pst = Stats{}
	if !s.dryRun { // a dry run writes nothing: no Move (nor Delete, see delete)
		p.mover, _ = kv.(Mover)
	}
	p.cutoffMs = cutoffMillis(p.cutoff)
	defer func() {
		if p.clearing != nil {
			p.clearing.stop() // no Clear outlives the pass, even one an Observer's panic cut short
		}
		st = *p.st
		st.Duration = max(s.clock.Now().Sub(start), 0) // a clock may step back
		if s.clear == nil {
			st.BatchSize = int(s.curBatch.Load())
		}
		*p.st = st
		s.logPass(p)
		s.observePage(p)
		s.observePass(ctx, st, err)
		p.kv, p.fence, p.mover, p.clearing = nil, nil, nil, nil
	}()
	err = s.runPass(ctx, p)
	return *p.st, err
}

// runPass runs passRanges on a goroutine of its own, which makes the
// pass's clears, so that a Clear's runtime.Goexit ends that goroutine,
// not the caller's: a new one settles the page and goes on after it. A
// panic under the pass (on a worker too), or a runtime.Goexit outside a
// Clear, reaches the caller's goroutine.
func (s *Sweep) runPass(ctx context.Context, p *passState) error {
	if s.idle {
		// Most passes after an idle one clear nothing: a goroutine would
		// cost more than it saves. Their clears, if any, run on workers.
		p.onCaller = true
		return s.passRanges(ctx, p)
	}
	if s.passDone == nil {
		s.passDone = make(chan passEnd, 1)
	}
	resume := false
	for {
		go s.passOn(ctx, p, resume)
		switch e := <-s.passDone; e.how {
		case passReturned:
			return e.err
		case passPanicked:
			// Re-raised here, the panic's stack is this one: the log
			// keeps where it was raised.
			s.log.Error("retention: a panic under the pass", "panic", e.value, "stack", string(e.stack))
			panic(e.value)
		case passExited:
			runtime.Goexit()
		}
		resume = true // clearExited
	}
}

// passEnd is how a goroutine of runPass ended.
type passEnd struct {
	how   byte // passReturned, passPanicked, passExited or clearExited
	err   error
	value any    // a panic's
	stack []byte // where it was raised
}

const (
	passReturned = iota
	passPanicked
	passExited  // runtime.Goexit outside a Clear
	clearExited // runtime.Goexit in a Clear
)

// passOn is a goroutine of runPass: it settles the page a Clear's
// runtime.Goexit interrupted when resume, then runs passRanges.
func (s *Sweep) passOn(ctx context.Context, p *passState, resume bool) {
	e := passEnd{how: passExited}
	defer func() {
		if e.how == passExited {
			if r := recover(); r != nil {
				e = passEnd{how: passPanicked, value: r, stack: debug.Stack()}
				if c := p.caught.Load(); c != nil {
					e.stack = c.stack // where a worker raised it
				}
			} else if c := p.clearing; c != nil && c.passExited {
				c.passExited = false
				e.how = clearExited
			}
		}
		s.passDone <- e
	}()
	var err error
	if resume {
		// Settled, the page the Clear interrupted is not read again.
		c := p.clearing
		keys, items, calls := c.keys, c.items, c.calls
		p.resumeIn, p.resumeAt = resumeExpired, keyAfter(keys[len(keys)-1])
		if c.inRetry {
			p.resumeIn = resumeRetry
		}
		c.endClears()
		p.rethrow()
		err = s.afterClears(ctx, p, keys, items, calls, nil)
	}
	if err == nil {
		err = s.passRanges(ctx, p)
	}
	e = passEnd{how: passReturned, err: err}
}

// resumeFrom returns where the walk of range r starts: from, or just after
// the page a Clear's runtime.Goexit interrupted when that was in r.
func (p *passState) resumeFrom(r byte, from []byte) []byte {
	if p.resumeIn == r {
		return p.resumeAt
	}
	return from
}

// The range a pass resumes in after a Clear's runtime.Goexit (see passOn).
const (
	resumeExpired = 1 + iota
	resumeRetry
)

// passRanges is the work of a pass: the expired range a page at a time,
// the first marker past it, and the due part of the retry range.
func (s *Sweep) passRanges(ctx context.Context, p *passState) error {
	idle, err := s.stillIdle(ctx, p)
	if err != nil {
		return err
	}
	if !idle && p.resumeIn != resumeRetry {
		p.cutoffKey = appendTimestamp(append(p.buf.cutoffKey[:0], s.prefix...), uint64(p.cutoffMs))
		p.buf.cutoffKey = p.cutoffKey
		empty, err := s.walk(ctx, p, p.resumeFrom(resumeExpired, s.lower), p.cutoffKey)
		if err != nil {
			return err
		}
		clean, err := s.peek(ctx, p)
		if err != nil {
			return err
		}
		s.idle = empty && clean
	}
	if err := s.retryPass(ctx, p); err != nil {
		return err
	}
	s.retries.prune(s.clock)
	return nil
}

// passState is what one pass carries from page to page.
type passState struct {
	kv          KV
	fence       Fencer // on the context of writes, or nil
	mover       Mover  // kv as a Mover, or nil
	onCaller    bool   // the pass runs on the caller's goroutine (see runPass)
	resumeIn    byte   // the range the pass resumes in after a Clear's runtime.Goexit, or 0
	resumeAt    []byte // where it resumes
	noMove      bool   // a Move failed this pass: keep retry delays in memory
	moveChecked bool   // a Move was read back this pass
	st          *Stats
	start       time.Time // the clock when the pass started
	inRetry     bool      // the pages are the retry range's
	retryDueMs  int64     // a retry-range marker is due when its time is below this
	cutoff      time.Time
	cutoffMs    int64
	cutoffKey   []byte
	notes       passNotes
	observed    Stats       // the counts an Observer was told of, page by page
	clearing    *clearing   // the pass's clear workers, once a page has clears
	buf         passBuffers // kept from pass to pass

	callTally // written by the clears of a page, which run concurrently

	caught atomic.Pointer[caughtPanic] // the first panic on a worker, outside a Clear
}

// caughtPanic is a panic on a goroutine of the pass other than its own.
type caughtPanic struct {
	value any
	stack []byte
}

// catch records r, a panic recovered on a worker of the pass, or recovers
// one when r is nil (deferred: "defer p.catch(nil)"), for rethrow.
func (p *passState) catch(r any) {
	if r == nil {
		r = recover()
	}
	if r != nil {
		p.caught.CompareAndSwap(nil, &caughtPanic{value: r, stack: debug.Stack()})
	}
}

// rethrow raises again, on the goroutine that runs the pass, the panic a
// worker caught, once the workers of the page are done.
func (p *passState) rethrow() {
	if c := p.caught.Load(); c != nil {
		panic(c.value)
	}
}

// callTally is what the clears of a page, which run concurrently, record for
// the pass: how calls went, for the outage detection and for Stats.
type callTally struct {
	streak                                    atomic.Int64          // clear calls that failed in a row
	probeFails                                atomic.Int64          // ids tried alone in vain since the last success
	oks                                       atomic.Int64          // calls that succeeded
	confirmed                                 atomic.Bool           // probes found the dependency down since the last success
	failedCalls, timedOutCalls, panickedCalls atomic.Int64          // folded into st after each page
	fenceErr                                  atomic.Pointer[error] // a ClearDeleter's call that did not apply the fence
	budgetWait                                atomic.Int64          // ns waited for Config.Limiter, folded into st
}

// passBuffers are the buffers of keys a pass builds, kept for the next.
type passBuffers struct {
	cutoffKey, dueKey, after []byte
}

// writes reports whether the pass moves markers to reschedule, hold and
// park them: over a Mover, until a Move failed; else delays stay in memory.
func (p *passState) writes() bool { return p.mover != nil && !p.noMove }

func (p *passState) foldCalls() {
	p.st.FailedCalls += int(p.failedCalls.Swap(0))
	p.st.TimedOutCalls += int(p.timedOutCalls.Swap(0))
	p.st.PanickedCalls += int(p.panickedCalls.Swap(0))
	p.st.BudgetWait += time.Duration(p.budgetWait.Swap(0))
}
