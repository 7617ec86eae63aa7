package retention

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Stats describes one pass.
type Stats struct {
	Scanned    int // keys read by Scan, including the one read past the expired range
	Cleared    int // markers whose Clear returned nil
	Failed     int // markers whose Clear failed (error, panic, timeout, Goexit); they stay
	Retried    int // failed markers put off until their retry delay is over
	Parked     int // failed markers moved to the parked range, having failed Config.MaxAttempts times
	Deferred   int // markers skipped because their retry delay is not over (KVs that are no Mover)
	Malformed  int // marker-shaped keys with a refused id or time, deleted without Clear
	Foreign    int // keys under the prefix that are not marker-shaped, left alone
	LiveAgain  int // markers whose Clear returned ErrLiveAgain, deleted without clearing
	Duplicates int // further markers of an id met earlier in the pass, deleted without a clear of their own
	Held       int // markers whose Clear returned Hold: kept until the hold's end, no failure
	// Gone counts markers found deleted after a ClearDeleter's call whose
	// outcome the sweep could not hear (a timeout, a lost connection, the
	// pass cut short): this replica's call or another replica's cleared
	// their entities, and the store cannot tell which. They are not in
	// Cleared, so that the Cleared of a fleet's replicas add up to no more
	// than the entities cleared.
	Gone        int
	WouldClear  int // in a dry run (Config.DryRun), markers whose entity the pass would have cleared
	ScanCalls   int // calls to KV.Scan
	DeleteCalls int // calls to KV.Delete
	PutCalls    int // calls to Mover.Move, rescheduling failed and held markers
	ClearCalls  int // calls of Config.Clear or Config.ClearBatch, or of a ClearDeleter

	// FailedCalls counts the calls of ClearCalls that failed as a whole
	// (an error other than a BatchError, a panic, runtime.Goexit or
	// ClearTimeout), also those whose ids a bisection then cleared apart:
	// Failed counts only the ids that end the pass failed. TimedOutCalls
	// and PanickedCalls (runtime.Goexit included) are those of them that
	// ran past ClearTimeout or panicked.
	FailedCalls, TimedOutCalls, PanickedCalls int

	// BudgetWait is how long the pass's clears waited for Config.Limiter,
	// added over the calls (which may wait at once, with Concurrency).
	BudgetWait time.Duration

	// BatchSize is the batch size the pass ended with: Config.BatchSize,
	// or less after slow calls (see Config.BatchTarget). Zero with Clear.
	BatchSize int

	// Duration is how long the pass took by the sweep's Clock.
	Duration time.Duration

	// MaxLag is how long past its due time the most overdue cleared marker
	// was when the pass started. Zero when nothing was cleared.
	MaxLag time.Duration

	// NextDue is when a pass will next find work: the oldest marker left
	// unexpired falls due, or the first marker kept in memory for a retry
	// (on a KV that is no Mover) may be tried again. Zero when there is none.
	NextDue time.Time
}

// Sweep clears entities whose terminal markers are older than a retention
// window. Create one with New; call Run for a background loop, or Pass for
// one sweep (in tests, or driven by your own scheduler). A Sweep is safe for
// concurrent use; its passes never overlap. The zero value is not usable:
// its methods return an error matching ErrNotConfigured.
type Sweep struct {
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
	curBatch     atomic.Int64 // the batch size now, adapted to BatchTarget

	// lower and upper bound the marker space: the prefix followed by a
	// digit; retryLower and retryUpper the retry range's, the prefix and
	// 'r' followed by a digit.
	lower, upper           []byte
	retryLower, retryUpper []byte
	maxAttempts            int

	// running is set while a Run (or a Group's Run) runs the sweep.
	running atomic.Bool

	// busy serialises passes and guards what follows, which passes reuse.
	// It is nil in a Sweep not made by New.
	busy          chan struct{}
	retries       retries
	foreignSeen   int       // foreign keys of the last pass that had any
	foreignWarned time.Time // when they were last logged at Warn
	items         []item
	ids           []byte
	lags          []time.Duration // reused by observeLags
	seen          seenIDs         // the ids of the page in hand
	plan          pagePlan        // reused by settle
	ps            passState       // the pass's state
	// idle: the last pass found nothing below its cutoff, so the next
	// starts with one key (see passRanges).
	idle bool
	pst  Stats // the pass's Stats, which ps.st points to
}

// New returns a Sweep of kv's markers configured by cfg. The error matches
// ErrInvalidConfig and names the field at fault.
func New(kv KV, cfg Config) (*Sweep, error) {
	if err := checkConfig(kv, &cfg); err != nil {
		return nil, err
	}
	s := &Sweep{
		kv:           kv,
		prefix:       cfg.Prefix,
		retention:    cfg.Retention,
		clear:        cfg.Clear,
		clearBatch:   cfg.ClearBatch,
		batchSize:    cmp.Or(cfg.BatchSize, DefaultBatchSize),
		clock:        cmp.Or(cfg.Clock, SystemClock),
		pageSize:     cmp.Or(cfg.PageSize, DefaultPageSize),
		concurrency:  cmp.Or(cfg.Concurrency, 1),
		interval:     cfg.Interval,
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
		busy:         make(chan struct{}, 1),
		retries:      newRetries(cmp.Or(cfg.RetryDelay, DefaultRetryDelay), cmp.Or(cfg.MaxRetryDelay, DefaultMaxRetryDelay)),
	}
	s.retryLower, s.retryUpper = infixRange(cfg.Prefix, retryInfix)
	if s.interval == 0 {
		s.interval = min(s.retention, time.Minute)
	}
	if s.batchTarget == 0 && s.clearTimeout > 0 {
		s.batchTarget = s.clearTimeout / 4
	}
	s.curBatch.Store(int64(s.batchSize))
	return s, nil
}

// Pass makes one sweep: every expired marker is handled, oldest first, then
// Pass returns. Per marker it calls Clear and, only once Clear returned nil
// (or ErrLiveAgain), deletes the marker; markers of one page are deleted in
// one KV.Delete call. A marker whose Clear failed stays, put off until its
// retry delay is over (see Config.RetryDelay); the pass goes on with the
// next one. Malformed markers are deleted without Clear; foreign keys are
// left alone.
//
// Pass reads only the expired range of keys, plus one key past it to learn
// Stats.NextDue, and the due part of the retry range (one key when none is
// due), so a pass with nothing expired costs three Scan calls however many
// markers wait, and two after a pass that found nothing expired either.
// It returns an error when the KV fails or does not answer within
// StoreTimeout, and ctx.Err() when ctx is done; in every case no marker
// whose Clear did not succeed has been deleted.
func (s *Sweep) Pass(ctx context.Context) (st Stats, err error) {
	if err := s.configured("Pass"); err != nil {
		return st, err
	}
	return s.pass(ctx, s.kv, nil)
}

// pass is Pass over kv, which is the sweep's KV or a fenced view of it.
// fence, when not nil, goes on the context of every write: kv wraps a KV
// the fence can fence (see Fencer).
func (s *Sweep) pass(ctx context.Context, kv KV, fence Fencer) (st Stats, err error) {
	if err := ctx.Err(); err != nil {
		return st, err
	}
	select {
	case s.busy <- struct{}{}: // most passes: a select of two cases costs more
	default:
		select {
		case s.busy <- struct{}{}:
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
	defer func() { <-s.busy }()

	start := s.clock.Now()
	// The state is the sweep's, reused by every pass, as are its buffers:
	// an idle pass allocates (nearly) nothing.
	p := &s.ps
	*p = passState{kv: kv, fence: fence, st: &s.pst, start: start, cutoff: start.Add(-s.retention),
		buf: p.buf}
	s.pst = Stats{}
	p.mover, _ = kv.(Mover)
	s.seen.reset()
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
	err = s.passRanges(ctx, p)
	return *p.st, err
}

// passRanges is the work of a pass: the expired range a page at a time,
// the first marker past it, and the due part of the retry range.
func (s *Sweep) passRanges(ctx context.Context, p *passState) error {
	idle, err := s.stillIdle(ctx, p)
	if err != nil {
		return err
	}
	if !idle {
		p.cutoffKey = appendTimestamp(append(p.buf.cutoffKey[:0], s.prefix...), uint64(p.cutoffMs))
		p.buf.cutoffKey = p.cutoffKey
		keys, err := s.scan(ctx, p, s.lower, p.cutoffKey, s.pageSize)
		if err == nil {
			err = s.walk(ctx, p, keys, p.cutoffKey)
		}
		if err != nil {
			return err
		}
		clean, err := s.peek(ctx, p)
		if err != nil {
			return err
		}
		s.idle = len(keys) == 0 && clean
	}
	if err := s.retryPass(ctx, p); err != nil {
		return err
	}
	s.retries.prune(s.clock)
	return nil
}

// walk handles the pages of a range up to end, from keys, its first page
// on: the next page of a full one is read while its clears run (see
// readAhead), starting just after its last key, so markers that stay
// (failed clears) are not read again in the pass.
func (s *Sweep) walk(ctx context.Context, p *passState, keys [][]byte, end []byte) error {
	for len(keys) > 0 {
		p.ahead = readAhead{}
		if len(keys) == s.pageSize {
			p.buf.after = append(append(p.buf.after[:0], keys[len(keys)-1]...), 0)
			p.ahead = readAhead{from: p.buf.after, end: end, want: true}
		}
		err := s.finishPage(ctx, p, keys, s.preparePage(p, keys))
		if err == nil {
			err = p.ahead.err // a failure of the page comes first
		}
		if err != nil {
			return err
		}
		keys = p.ahead.keys
		p.ahead = readAhead{}
	}
	return nil
}

// readAhead is the read of the page after the current one, made while the
// current page's clears run.
type readAhead struct {
	from, end []byte // the range to read, when want
	want      bool
	done      bool
	keys      [][]byte
	err       error
}

// readAhead reads the next page, if the current one has one and it was not
// read yet. Every way through a page calls it, once its clears run.
func (s *Sweep) readAhead(ctx context.Context, p *passState) {
	a := &p.ahead
	if !a.want || a.done {
		return
	}
	a.keys, a.err = s.scan(ctx, p, a.from, a.end, s.pageSize)
	a.done = true
}

// retryPass handles the markers of the retry range whose retry is due:
// markers whose clear failed before, moved there with the time of their
// next try. Most passes find none, in one Scan of one key, which also
// tells when the next one falls due.
func (s *Sweep) retryPass(ctx context.Context, p *passState) error {
	p.inRetry = true
	defer func() { p.inRetry = false }()
	// Due, like a marker, once strictly past: at < start, in whole ms.
	p.retryDueMs = p.start.UnixMilli()
	if time.UnixMilli(p.retryDueMs).Before(p.start) {
		p.retryDueMs++
	}
	first, err := s.scan(ctx, p, s.retryLower, s.retryUpper, 1)
	if err != nil || len(first) == 0 {
		return err
	}
	if k, _, err := parseRetryKey(s.prefix, retryInfix, first[0]); err == nil && k.at >= p.retryDueMs {
		s.noteRetry(p, time.UnixMilli(k.at))
		return nil
	}
	dueKey := appendTimestamp(append(p.buf.dueKey[:0], s.retryUpper[:len(s.retryUpper)-1]...), uint64(p.retryDueMs))
	p.buf.dueKey = dueKey
	// Something is due, or a key that is no retry marker comes first:
	// the pages handle both (malformed keys deleted, foreign ones counted).
	keys, err := s.scan(ctx, p, s.retryLower, dueKey, s.pageSize)
	if err == nil {
		err = s.walk(ctx, p, keys, dueKey)
	}
	if err != nil {
		return err
	}
	if at, found, err := s.nextRetry(ctx, p, dueKey); err != nil || !found {
		return err
	} else {
		s.noteRetry(p, time.UnixMilli(at))
	}
	return nil
}

// nextRetry returns the retry time of the first key of the retry range
// from start that parses, reading one key when that is it, as it nearly
// always is, else stepping over the others a page at a time.
func (s *Sweep) nextRetry(ctx context.Context, p *passState, start []byte) (at int64, found bool, err error) {
	for limit := 1; ; limit = s.pageSize {
		keys, err := s.scan(ctx, p, start, s.retryUpper, limit)
		if err != nil {
			return 0, false, err
		}
		for _, key := range keys {
			if k, _, err := parseRetryKey(s.prefix, retryInfix, key); err == nil {
				return k.at, true, nil
			}
		}
		if len(keys) < limit {
			return 0, false, nil
		}
		start = keyAfter(keys[len(keys)-1])
	}
}

// passState is what one pass carries from page to page.
type passState struct {
	kv          KV
	fence       Fencer // on the context of writes, or nil
	mover       Mover  // kv as a Mover, or nil
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
	observed    Stats // the counts an Observer was told of, page by page
	ahead       readAhead
	clearing    *clearing   // the pass's clear workers, once a page has clears
	buf         passBuffers // kept from pass to pass

	// Written by the clears of a page, which run concurrently.
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
// park them: over a Mover, until a Move failed. Without, delays and holds
// are kept in memory, and nothing is parked.
func (p *passState) writes() bool { return p.mover != nil && !p.noMove }

// foldCalls adds the page's failed calls to the pass's Stats.
func (p *passState) foldCalls() {
	p.st.FailedCalls += int(p.failedCalls.Swap(0))
	p.st.TimedOutCalls += int(p.timedOutCalls.Swap(0))
	p.st.PanickedCalls += int(p.panickedCalls.Swap(0))
	p.st.BudgetWait += time.Duration(p.budgetWait.Swap(0))
}

// dueEnd returns the exclusive end of the range of markers due before
// cutoffMs: the prefix followed by cutoffMs as a timestamp.
func (s *Sweep) dueEnd(cutoffMs int64) []byte {
	return appendTimestamp(append([]byte(nil), s.prefix...), uint64(cutoffMs))
}

// keyAfter returns the first key after key in byte order, where the read
// of the next page starts.
func keyAfter(key []byte) []byte {
	return append(append([]byte(nil), key...), 0)
}

// cutoffMillis returns the smallest whole millisecond not before cutoff: a
// marker of ts milliseconds is expired iff ts is below it.
func cutoffMillis(cutoff time.Time) int64 {
	switch {
	case cutoff.Before(epoch):
		return 0
	case cutoff.After(MaxMarkerTime):
		return maxMarkerMs + 1
	}
	ms := cutoff.UnixMilli()
	if time.UnixMilli(ms).Before(cutoff) {
		ms++
	}
	return ms
}

// outcome is what became of one key of a page. Every clear mode (Clear,
// ClearBatch, a ClearDeleter) ends in one of these, and settle alone acts
// on them, as the README's guarantees say:
//
//	outcome      marker                         counted in
//	cleared      deleted after the clear        Cleared
//	clearedGone  deleted in the clear's own     Cleared
//	             transaction (ClearDeleter)
//	foundGone    found gone after a call whose  Gone
//	             outcome is unknown: cleared by
//	             it or by another replica
//	liveAgain    deleted, entity not cleared    LiveAgain
//	failed       moved to its retry time (or    Failed, Retried
//	             kept, its delay in memory)
//	held         moved to the hold's end (or    Held
//	             kept, the hold in memory)
//	unknown      kept as it is, its delay in    Failed, Retried
//	             memory: a failed call may have
//	             committed and the store could
//	             not tell
//	duplicate    deleted once the id's first    Duplicates
//	             marker in the pass is settled
//	bad          deleted without a clear        Malformed
//	foreign      kept                           Foreign
//	deferred     kept: in its retry delay       Deferred
//	unexpired    kept: a retry of a marker not
//	             expired under today's Retention
//	pending      kept: the clear never returned (a cancelled pass)
//	wouldClear   kept: a dry run calls no clear WouldClear
//
// A dry run (Config.DryRun) counts every outcome as it comes, but deletes
// and moves nothing.
type outcome uint8

const (
	pending     outcome = iota // Clear has not returned (yet): the marker stays
	cleared                    // Clear returned nil
	clearedGone                // cleared with its marker deleted, by a ClearDeleter
	foundGone                  // its marker found gone after a call whose outcome is unknown
	liveAgain                  // Clear returned ErrLiveAgain
	failed                     // Clear failed; the marker stays, put off for a retry
	held                       // Clear returned Hold: the marker waits for the hold's end
	unknown                    // a ClearDeleter failed and its commit could not be checked
	duplicate                  // another marker of an id met before in the pass
	bad                        // malformed: deleted without Clear
	foreign                    // not marker-shaped: left alone
	deferred                   // in its retry delay: left for later
	unexpired                  // in the retry range, not expired under today's Retention: left
	wouldClear                 // a dry run would have cleared it
)

// item is one key of a page on its way through a pass; items[i] stands for
// the page's keys[i].
type item struct {
	id     string
	ms     int64 // the finish time its key records (a deadline key's: the deadline)
	lagMs  int64 // the finish time its lag counts from: ms, or later for a hold's end or a deadline
	err    error // why the key is malformed, or how Clear failed
	lo, hi int32 // the id's bounds in the page's id buffer
	// For a duplicate, primary is the item of the id's first marker in the
	// page, or -1 when that was on an earlier page; for the others, next is
	// one more than the item of the id's next marker in the page, or 0.
	primary, next int32
	attempts      int32 // failed attempts the key records (retry range)
	out           outcome
	withDups      bool   // cleared by a ClearDeleter's call that deleted its duplicates too
	kind          byte   // a retry-range key's kind: keyDeadline and keyHeld flags
	hash          uint32 // of the id, for the pass's seenIDs
	doneAt        int64  // when a ClearDeleter's call cleared it, Unix ns by the sweep's Clock, or 0
}

// preparePage sorts a page's keys into items (see parsePage), and marks
// those in their retry delay and the duplicates.
func (s *Sweep) preparePage(p *passState, keys [][]byte) []item {
	items := s.parsePage(p, keys)
	if len(s.retries.byID) > 0 { // else no id waits: most pages
		s.markWaiting(p, items)
	}
	return items
}

// markWaiting marks the pending items whose id waits for its retry delay
// or hold in this process.
func (s *Sweep) markWaiting(p *passState, items []item) {
	now := s.clock.Now()
	canWrite := p.writes() && !s.dryRun
	for i := range items {
		it := &items[i]
		if it.out != pending || !s.retries.waiting(it.id, now) {
			continue
		}
		it.out = deferred
		if until, ok := s.retries.heldUntil(it.id, now); ok && canWrite {
			// Another marker of an id held in memory: it waits for the
			// hold in the store too (see settle), so that a restart
			// keeps it.
			it.err = Hold(until)
		}
	}
}

// finishPage clears a prepared page and settles it.
func (s *Sweep) finishPage(ctx context.Context, p *passState, keys [][]byte, items []item) error {
	var err error
	if s.dryRun {
		for i := range items {
			if items[i].out == pending {
				items[i].out = wouldClear
			}
		}
	} else {
		var calls int
		calls, err = s.clearAll(ctx, p, keys, items)
		p.st.ClearCalls += calls
		p.foldCalls()
	}
	s.readAhead(ctx, p) // if the clears did not
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		// Deleting now would drop markers of clears that the cancellation
		// cut short; they are all retried by the next pass instead. The
		// batches a ClearDeleter committed are gone already: count them.
		// Holds are kept in memory, so that the next pass does not ask
		// for them again before their ends.
		s.countGone(p, items)
		s.rememberHolds(items)
		s.observePage(p)
		return err
	}
	err = s.settle(ctx, p, keys, items)
	s.observePage(p)
	return err
}

// parsePage sorts the keys of a page into items: markers to clear (pending),
// malformed and foreign keys. It stops at a marker that is not expired,
// which only a KV that breaks Scan's end bound returns.
func (s *Sweep) parsePage(p *passState, keys [][]byte) []item {
	items := s.items[:0]
	ids := s.ids[:0]
	for _, key := range keys {
		var (
			ms, at     int64
			lagMs      = int64(-1) // -1: ms
			id         []byte
			isForeign  bool
			err        error
			attempts   int
			kind       byte
			notExpired bool
		)
		if p.inRetry {
			var k retryKey
			k, isForeign, err = parseRetryKey(s.prefix, retryInfix, key)
			ms, at, id, attempts, kind = k.finished, k.at, k.id, k.attempts, k.kind
			if err == nil && at >= p.retryDueMs {
				break // only a KV that breaks Scan's end bound returns it
			}
			lagMs = ms
			if kind&keyDeadline != 0 {
				// Due at its deadline (ms) whatever the Retention, and
				// late from then.
				lagMs = max(ms-s.retention.Milliseconds(), 0)
			} else {
				// A Retention raised since the marker failed (or was
				// held): it is not expired any more, and stays until it is.
				notExpired = err == nil && ms >= p.cutoffMs
			}
			if kind&keyHeld != 0 {
				// Late from the hold's end, when that is after the due
				// time.
				lagMs = max(at-s.retention.Milliseconds(), lagMs)
			}
		} else {
			ms, id, isForeign, err = parseKey(s.prefix, key)
			if err == nil && ms >= p.cutoffMs {
				// Clearing this marker would delete state before its
				// retention ran out.
				break
			}
		}
		var h uint32
		if err == nil {
			// The default rule runs on the bytes, before any string
			// exists.
			if s.validate == nil && !validID(id) {
				err = malformed(key, "id", validateIDBytes(id))
			} else {
				h = s.seen.hash(id)
			}
		}
		out := pending
		switch {
		case isForeign:
			out = foreign
		case err != nil:
			out = bad
		case notExpired:
			out = unexpired
		}
		if lagMs < 0 {
			lagMs = ms
		}
		it := item{ms: ms, lagMs: lagMs, kind: kind, err: err, out: out, attempts: int32(attempts), lo: int32(len(ids))}
		if out == pending {
			ids = append(ids, id...)
			it.hash = h
		}
		it.hi = int32(len(ids))
		items = append(items, it)
	}
	s.ids = ids
	// One string holds the page's ids, which Clear gets substrings of.
	all := string(ids)
	s.seen.startPage(len(items))
	for i := range items {
		it := &items[i]
		if it.out != pending {
			continue
		}
		it.id = all[it.lo:it.hi]
		if s.validate != nil {
			switch err := s.checkID(it.id); {
			case errors.Is(err, errValidatePanicked):
				it.err, it.out = err, failed // kept, and tried again after its delay
				continue
			case err != nil:
				it.err, it.out = malformed(keys[i], "id", err), bad
				continue
			}
		}
		if !s.seen.claim(it.hash, i) {
			s.seen.probe(items, i)
		}
	}
	s.items = items
	return items
}

// peek reads the first marker past the expired range to set st.NextDue. It
// reads one key when that is a marker, as it nearly always is; foreign and
// malformed keys there are stepped over a page at a time, and the malformed
// ones deleted. It reports whether the first key it read was a marker (or
// none was there).
func (s *Sweep) peek(ctx context.Context, p *passState) (clean bool, err error) {
	st := p.st
	from, limit := p.cutoffKey, 1
	clean = true
	for {
		keys, err := s.scan(ctx, p, from, s.upper, limit)
		if err != nil {
			return false, err
		}
		var del [][]byte
		found := false
		for _, key := range keys {
			ms, isForeign, err := s.parseNext(key)
			switch {
			case isForeign:
				st.Foreign++
				p.notes.noteForeign(key)
				clean = false
				continue
			case err != nil:
				st.Malformed++
				p.notes.noteMalformed(err)
				del = append(del, key)
				clean = false
				continue
			}
			st.NextDue = earliest(st.NextDue, time.UnixMilli(ms).Add(s.retention))
			found = true
			break
		}
		if len(del) > 0 && !s.dryRun {
			if err := s.delete(ctx, p, del); err != nil {
				return false, err
			}
		}
		if found || len(keys) < limit {
			return clean, nil
		}
		from = keyAfter(keys[len(keys)-1])
		limit = s.pageSize
	}
}

// parseNext parses a key read past the expired range (see peek and
// stillIdle): a marker, a foreign key, or a malformed one (err). An id
// whose Config.ValidateID panicked is not known to be malformed: its key
// counts as a marker.
func (s *Sweep) parseNext(key []byte) (ms int64, foreign bool, err error) {
	ms, id, foreign, err := parseKey(s.prefix, key)
	if err == nil {
		if err = s.checkIDBytes(key, id); errors.Is(err, errValidatePanicked) {
			err = nil
		}
	}
	return ms, foreign, err
}

// stillIdle reports whether the range of markers holds nothing expired,
// from its first key alone, when the last pass found nothing expired: most
// passes of a quiet sweep then read one key in one Scan, where the expired
// range and the key past it take two. That key must be a marker (neither
// foreign nor malformed) and not expired; else the pass reads the range as
// usual, one Scan more than without the guess.
func (s *Sweep) stillIdle(ctx context.Context, p *passState) (bool, error) {
	if !s.idle {
		return false, nil
	}
	keys, err := s.scan(ctx, p, s.lower, s.upper, 1)
	if err != nil || len(keys) == 0 {
		return err == nil, err
	}
	ms, _, err := s.parseNext(keys[0])
	if err != nil || ms < p.cutoffMs {
		s.idle = false
		return false, nil
	}
	p.st.NextDue = time.UnixMilli(ms).Add(s.retention)
	return true, nil
}

// earliest returns the earlier of a and b, where the zero time means none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
