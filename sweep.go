package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Limits and defaults of Config fields.
const (
	DefaultPageSize = 256
	MaxPageSize     = 1 << 16
	MaxConcurrency  = 1024

	DefaultClearTimeout  = time.Minute
	DefaultStoreTimeout  = 30 * time.Second
	DefaultRetryDelay    = time.Second
	DefaultMaxRetryDelay = 10 * time.Minute
)

// Config configures a Sweep. Prefix, Retention and Clear are required; every
// other field has a usable zero value.
type Config struct {
	// Prefix is the key prefix of this sweep's markers, such as "runs/done/".
	// Required. It must end in a byte that is not an id byte (A-Z a-z 0-9 _
	// -), such as '/' or ':', so that "job" + "123" is never mistaken for a
	// marker's timestamp. A sweep deletes only marker-shaped keys: the
	// prefix, 20 digits, '/' and an id. Other keys under the prefix are
	// foreign: counted and logged, never deleted nor passed to Clear.
	Prefix string

	// Retention is how long an entity's state is kept after it finished. A
	// marker is expired, and its entity cleared, once it is strictly older
	// than Retention: a marker exactly Retention old is kept. At least 1ms.
	Retention time.Duration

	// Clear removes the state of the entity with the given id. Required.
	//
	// Clear must be idempotent: a marker is deleted only after its Clear
	// returned nil, so a crash or failed delete in between makes the next
	// pass clear the same id again. Return nil when there is nothing left to
	// clear. Return an error wrapping ErrLiveAgain to drop the marker without
	// clearing (the entity was resumed). Any other error, a panic, a timeout
	// (ClearTimeout) or a call of runtime.Goexit keeps the marker, which is
	// tried again after RetryDelay (doubling up to MaxRetryDelay). ctx is
	// done when ClearTimeout runs out or the pass is cancelled; a Clear that
	// ignores ctx cannot be stopped and holds up its page until it returns.
	Clear func(ctx context.Context, id string) error

	// ClearBatch, set instead of Clear, clears the entities of many ids in
	// one call: up to BatchSize ids of one page, oldest first. It returns
	// nil when every id is cleared, and a BatchError to report ids one by
	// one (ids not in it were cleared). Every rule of Clear holds per id:
	// idempotent, a marker deleted only once its id is cleared, failures
	// retried after RetryDelay. Any other error, a panic, a timeout or a
	// runtime.Goexit fails the call as a whole: the sweep then tries each
	// half of the batch and splits further the half that fails, so one id
	// that always fails costs about 2·log2(BatchSize) more calls and keeps
	// no other id from being cleared. Where both halves fail, the fault is
	// taken to be no one id's (a dependency is down): every id of the
	// batch waits out its retry delay instead of being called one by one.
	// An error wrapping ErrLiveAgain for the whole call drops every marker
	// of the batch. ClearTimeout bounds each call; Concurrency is the
	// number of batches in flight.
	ClearBatch func(ctx context.Context, ids []string) error

	// BatchSize is the most ids a ClearBatch (or ClearDeleter) call gets; a
	// page (PageSize) is cut into batches of it. Zero means
	// DefaultBatchSize; otherwise 1 to MaxPageSize. Not with Clear.
	BatchSize int

	// ClearTimeout bounds each call of Clear (or ClearBatch): Clear's ctx
	// is done this long after Clear first consults it (Done, Err or
	// Deadline), which for a Clear that waits on I/O is when it starts; a
	// ClearBatch's ctx, from the call. Zero means DefaultClearTimeout; a
	// negative value means no limit; otherwise at least 1ms.
	ClearTimeout time.Duration

	// StoreTimeout bounds each call to the KV (Scan, Delete, Put). A call
	// that runs out fails the pass, which Run retries after its backoff.
	// Zero means DefaultStoreTimeout; a negative value means no limit;
	// otherwise at least 1ms.
	StoreTimeout time.Duration

	// RetryDelay is how long a marker whose Clear failed waits before it is
	// tried again; each further failure doubles the wait, with up to a
	// fifth of it added at random, up to MaxRetryDelay. Zero means
	// DefaultRetryDelay and MaxRetryDelay zero means DefaultMaxRetryDelay;
	// otherwise 1ms <= RetryDelay <= MaxRetryDelay.
	//
	// On a KV that is a Putter, the sweep reschedules the marker: it writes
	// the marker again with a time that makes it fall due after the wait,
	// then deletes the old one, so passes in between do not read it again
	// (a crash in between leaves both, and the id is cleared twice, never
	// lost). The rescheduled marker no longer records the entity's finish
	// time. On any other KV the wait is kept in memory and the marker is
	// skipped, unread by Clear, until it is over. The count of failures
	// behind a wait lives in memory: after a restart an id starts again at
	// RetryDelay.
	RetryDelay    time.Duration
	MaxRetryDelay time.Duration

	// Clock tells the time. Nil means SystemClock.
	Clock Clock

	// PageSize is how many markers one Scan reads. Zero means
	// DefaultPageSize; otherwise 1 to MaxPageSize. While a full page is
	// cleared, the next one is read.
	PageSize int

	// Concurrency is how many Clear calls (or ClearBatch calls) of one page
	// may run at once. Zero means 1: markers are cleared one at a time,
	// oldest first. Otherwise 1 to MaxConcurrency. Above 1, the clears of a
	// page start oldest first but may finish in any order; pages still go
	// in order: every clear of a page ends before its markers are deleted
	// and the next page's clears start, and a marker is still deleted only
	// after its own Clear succeeded.
	Concurrency int

	// Interval is the longest Run sleeps between passes. Run usually wakes
	// sooner, when the oldest unexpired marker falls due; Interval bounds how
	// long a marker written out of order, or whose Clear failed, waits. Zero
	// means the smaller of Retention and one minute; it must not be
	// negative.
	Interval time.Duration

	// Logger receives failed clears and passes (Error), malformed markers
	// and foreign keys (Warn; foreign keys again only when their number
	// changes, or after an hour) and per-pass summaries (Debug). A pass logs
	// at most one line per kind with a count and a few examples, however
	// many markers failed. Nil means slog.Default() as it is when New runs;
	// to silence it, pass slog.New(slog.DiscardHandler).
	Logger *slog.Logger

	// ValidateID checks the id of every marker before Clear sees it. A
	// marker-shaped key whose id it refuses is deleted as malformed, without
	// Clear.
	// Nil means the package's ValidateID. An empty id is refused whatever
	// this function says.
	ValidateID func(id string) error

	// OnPass is called by Run (and by a Group's Run) after every pass, on
	// the loop's goroutine, with the pass's Stats and error. Nil means no
	// call. Pass does not call it.
	OnPass func(Stats, error)

	// Lease, when set, makes Run sweep only while this replica holds the
	// lease, so that a fleet sharing one store clears each entity once.
	// Nil means no lease: every replica sweeps, and an entity may be
	// cleared by several replicas at about the same time. Adapters for
	// shared stores provide Lockers. A Sweep in a Group must leave it nil
	// and use GroupConfig.Lease.
	Lease Locker

	// Jitter lengthens every wait of Run by a random fraction of itself, up
	// to Jitter, so replicas that start together do not wake together. Zero
	// means exact waits; otherwise 0 to 1.
	Jitter float64

	// StartJitter delays Run's first pass by a random duration below it.
	// Zero means the first pass runs at once; it must not be negative.
	StartJitter time.Duration
}

// Stats describes one pass.
type Stats struct {
	Scanned     int // keys read by Scan, including the one read past the expired range
	Cleared     int // markers whose Clear returned nil
	Failed      int // markers whose Clear failed (error, panic, timeout, Goexit); they stay
	Retried     int // failed markers put off until their retry delay is over
	Deferred    int // markers skipped because their retry delay is not over (KVs without Put)
	Malformed   int // marker-shaped keys with a refused id or time, deleted without Clear
	Foreign     int // keys under the prefix that are not marker-shaped, left alone
	LiveAgain   int // markers whose Clear returned ErrLiveAgain, deleted without clearing
	ScanCalls   int // calls to KV.Scan
	DeleteCalls int // calls to KV.Delete
	PutCalls    int // calls to Putter.Put, rescheduling failed markers
	ClearCalls  int // calls of Config.Clear or Config.ClearBatch

	// Duration is how long the pass took by the sweep's Clock.
	Duration time.Duration

	// MaxLag is how long past its due time the most overdue cleared marker
	// was when the pass started. Zero when nothing was cleared.
	MaxLag time.Duration

	// NextDue is when a pass will next find work: the oldest marker left
	// unexpired falls due, or the first marker kept in memory for a retry
	// (on a KV without Put) may be tried again. Zero when there is none.
	NextDue time.Time
}

// Sweep clears entities whose terminal markers are older than a retention
// window. Create one with New; call Run for a background loop, or Pass for
// one sweep (in tests, or driven by your own scheduler). A Sweep is safe for
// concurrent use; its passes never overlap.
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
	lease        Locker
	jitter       float64
	startJitter  time.Duration

	// lower and upper bound the marker space: the prefix followed by a digit.
	lower, upper []byte

	// busy serialises passes and guards what follows, which passes reuse.
	busy          chan struct{}
	retries       retries
	foreignSeen   int       // foreign keys of the last pass that had any
	foreignWarned time.Time // when they were last logged at Warn
	items         []item
	ids           []byte
	del           [][]byte
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
		lease:        cfg.Lease,
		jitter:       cfg.Jitter,
		startJitter:  cfg.StartJitter,
		lower:        append([]byte(cfg.Prefix), '0'),
		upper:        append([]byte(cfg.Prefix), '9'+1),
		busy:         make(chan struct{}, 1),
		retries:      newRetries(cmp.Or(cfg.RetryDelay, DefaultRetryDelay), cmp.Or(cfg.MaxRetryDelay, DefaultMaxRetryDelay)),
	}
	if s.interval == 0 {
		s.interval = min(s.retention, time.Minute)
	}
	return s, nil
}

// checkConfig checks what New cannot default.
func checkConfig(kv KV, cfg *Config) error {
	switch {
	case kv == nil:
		return invalidConfig("kv must not be nil")
	case cfg.Prefix == "":
		return invalidConfig("Config.Prefix must not be empty")
	case idByte(cfg.Prefix[len(cfg.Prefix)-1]):
		return invalidConfig("Config.Prefix %q ends in %q, a byte of ids and timestamps: end it with a separator "+
			"such as '/' or ':' (%q) so markers cannot be confused with other keys", cfg.Prefix, cfg.Prefix[len(cfg.Prefix)-1], cfg.Prefix+"/")
	case cfg.Clear == nil && cfg.ClearBatch == nil && !isClearDeleter(kv):
		return invalidConfig("Config.Clear or Config.ClearBatch must be set (or kv must be a ClearDeleter)")
	case cfg.Clear != nil && cfg.ClearBatch != nil:
		return invalidConfig("set one of Config.Clear and Config.ClearBatch, not both")
	case (cfg.Clear != nil || cfg.ClearBatch != nil) && isClearDeleter(kv):
		return invalidConfig("kv is a ClearDeleter, which clears in the transaction that deletes the markers: leave Config.Clear and Config.ClearBatch nil")
	case cfg.BatchSize < 0 || cfg.BatchSize > MaxPageSize:
		return invalidConfig("Config.BatchSize must be 0 (default %d) or 1 to %d, got %d", DefaultBatchSize, MaxPageSize, cfg.BatchSize)
	case cfg.BatchSize != 0 && cfg.Clear != nil:
		return invalidConfig("Config.BatchSize is set but Config.Clear clears one id at a time: use Config.ClearBatch")
	case cfg.Retention < time.Millisecond:
		return invalidConfig("Config.Retention must be at least 1ms, got %v", cfg.Retention)
	case cfg.PageSize < 0 || cfg.PageSize > MaxPageSize:
		return invalidConfig("Config.PageSize must be 0 (default %d) or 1 to %d, got %d", DefaultPageSize, MaxPageSize, cfg.PageSize)
	case cfg.Concurrency < 0 || cfg.Concurrency > MaxConcurrency:
		return invalidConfig("Config.Concurrency must be 0 (default 1) or 1 to %d, got %d", MaxConcurrency, cfg.Concurrency)
	case cfg.Interval < 0:
		return invalidConfig("Config.Interval must not be negative, got %v", cfg.Interval)
	case cfg.ClearTimeout > 0 && cfg.ClearTimeout < time.Millisecond:
		return invalidConfig("Config.ClearTimeout must be 0 (default %v), negative (none) or at least 1ms, got %v", DefaultClearTimeout, cfg.ClearTimeout)
	case cfg.StoreTimeout > 0 && cfg.StoreTimeout < time.Millisecond:
		return invalidConfig("Config.StoreTimeout must be 0 (default %v), negative (none) or at least 1ms, got %v", DefaultStoreTimeout, cfg.StoreTimeout)
	}
	if err := checkRetryDelays(cfg.RetryDelay, cfg.MaxRetryDelay); err != nil {
		return err
	}
	return checkJitter("Config", cfg.Jitter, cfg.StartJitter)
}

func isClearDeleter(kv KV) bool {
	_, ok := kv.(ClearDeleter)
	return ok
}

// invalidConfig returns an error matching ErrInvalidConfig with the message
// format gives, which names the field at fault.
func invalidConfig(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// checkJitter validates the jitter fields of Config or GroupConfig, named
// by config.
func checkJitter(config string, jitter float64, startJitter time.Duration) error {
	switch {
	case !(jitter >= 0 && jitter <= 1):
		return invalidConfig("%s.Jitter must be between 0 and 1, got %v", config, jitter)
	case startJitter < 0:
		return invalidConfig("%s.StartJitter must not be negative, got %v", config, startJitter)
	}
	return nil
}

// MarkerKey returns the key of the marker for id finished at t under this
// sweep's prefix, checking id with the sweep's ValidateID. Use it instead of
// the package-level MarkerKey when Config.ValidateID is set.
func (s *Sweep) MarkerKey(t time.Time, id string) ([]byte, error) {
	if err := s.checkID(id); err != nil {
		return nil, err
	}
	return appendKey(nil, s.prefix, t, id)
}

func (s *Sweep) checkID(id string) error {
	if s.validate == nil {
		return ValidateID(id)
	}
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	if err := s.callValidate(id); err != nil {
		if errors.Is(err, errValidatePanicked) {
			return err // says nothing of the id
		}
		if !errors.Is(err, ErrInvalidID) {
			err = fmt.Errorf("%w: %s", ErrInvalidID, errString(err))
		}
		return err
	}
	return nil
}

// errValidatePanicked is the error of a Config.ValidateID that panicked: it
// says nothing of the id, so the marker is neither cleared nor deleted.
var errValidatePanicked = errors.New("retention: Config.ValidateID panicked")

func (s *Sweep) callValidate(id string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w on %q: %v", errValidatePanicked, id, r)
		}
	}()
	return s.validate(id)
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
// Stats.NextDue, so a pass with nothing expired costs two Scan calls however
// many markers wait. It returns an error when the KV fails or does not
// answer within StoreTimeout, and ctx.Err() when ctx is done; in every case
// no marker whose Clear did not succeed has been deleted.
func (s *Sweep) Pass(ctx context.Context) (st Stats, err error) {
	return s.pass(ctx, s.kv)
}

// pass is Pass over kv, which is the sweep's KV or a fenced view of it.
func (s *Sweep) pass(ctx context.Context, kv KV) (st Stats, err error) {
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
	p := &passState{kv: kv, st: &st, cutoff: start.Add(-s.retention)}
	p.putter, _ = kv.(Putter)
	p.cutoffMs = cutoffMillis(p.cutoff)
	p.cutoffKey = appendTimestamp(append([]byte(nil), s.prefix...), uint64(p.cutoffMs))
	defer func() {
		st.Duration = max(s.clock.Now().Sub(start), 0) // a clock may step back
		s.logPass(p)
	}()

	keys, err := s.scan(ctx, p, s.lower, p.cutoffKey, s.pageSize)
	for err == nil {
		// A full page may have a next one: read it while this one is
		// cleared. It starts just after this page's last key, so markers
		// that stay (failed clears) are not read again in this pass.
		var next *prefetch
		if len(keys) == s.pageSize {
			next = s.prefetch(ctx, p, append(append([]byte(nil), keys[len(keys)-1]...), 0))
		}
		err = s.page(ctx, p, keys)
		if next == nil {
			break
		}
		keys, err = next.wait(p, err)
	}
	if err != nil {
		return st, err
	}
	if err := s.peek(ctx, p); err != nil {
		return st, err
	}
	s.retries.prune(s.clock.Now())
	return st, nil
}

// passState is what one pass carries from page to page.
type passState struct {
	kv         KV
	putter     Putter // kv as a Putter, or nil
	noPut      bool   // a rewrite failed this pass: keep retry delays in memory
	putChecked bool   // a rewrite was read back this pass
	st         *Stats
	cutoff     time.Time
	cutoffMs   int64
	cutoffKey  []byte
	notes      passNotes
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

// outcome is what became of one key of a page.
type outcome uint8

const (
	pending     outcome = iota // Clear has not returned (yet): the marker stays
	cleared                    // Clear returned nil
	clearedGone                // cleared with its marker deleted, by a ClearDeleter
	liveAgain                  // Clear returned ErrLiveAgain
	failed                     // Clear failed; the marker stays, put off for a retry
	bad                        // malformed: deleted without Clear
	foreign                    // not marker-shaped: left alone
	deferred                   // in its retry delay: left for later
)

// item is one key of a page on its way through a pass; items[i] stands for
// the page's keys[i].
type item struct {
	id     string
	ms     int64
	err    error // why the key is malformed, or how Clear failed
	lo, hi int32 // the id's bounds in the page's id buffer
	out    outcome
}

// page handles one page of the expired range.
func (s *Sweep) page(ctx context.Context, p *passState, keys [][]byte) error {
	items, now := s.parsePage(p, keys), s.clock.Now()
	for i := range items {
		if it := &items[i]; it.out == pending && s.retries.waiting(it.id, now) {
			it.out = deferred
		}
	}
	calls, err := s.clearAll(ctx, p, keys, items)
	p.st.ClearCalls += calls
	if err != nil {
		return err
	}
	// Deleting now would drop markers of clears that the cancellation cut
	// short; they are all retried by the next pass instead.
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.settle(ctx, p, keys, items)
}

// parsePage sorts the keys of a page into items: markers to clear (pending),
// malformed and foreign keys. It stops at a marker that is not expired,
// which only a KV that breaks Scan's end bound returns.
func (s *Sweep) parsePage(p *passState, keys [][]byte) []item {
	items := s.items[:0]
	ids := s.ids[:0]
	for _, key := range keys {
		ms, id, isForeign, err := parseKey(s.prefix, key)
		if err == nil && ms >= p.cutoffMs {
			// Clearing this marker would delete state before its retention
			// ran out.
			break
		}
		if err == nil && s.validate == nil {
			// The default rule runs on the bytes, before any string exists.
			if verr := validateIDBytes(id); verr != nil {
				err = malformed(key, "id", verr)
			}
		}
		out := pending
		switch {
		case isForeign:
			out = foreign
		case err != nil:
			out = bad
		}
		items = append(items, item{ms: ms, err: err, out: out, lo: int32(len(ids))})
		if out == pending {
			ids = append(ids, id...)
		}
		items[len(items)-1].hi = int32(len(ids))
	}
	s.ids = ids
	// One string holds the page's ids and Clear gets substrings of it: one
	// allocation per page rather than per marker.
	all := string(ids)
	for i := range items {
		it := &items[i]
		if it.out != pending {
			continue
		}
		it.id = all[it.lo:it.hi]
		if s.validate == nil {
			continue
		}
		switch err := s.checkID(it.id); {
		case errors.Is(err, errValidatePanicked):
			it.err, it.out = err, failed // kept, and tried again after its delay
		case err != nil:
			it.err, it.out = malformed(keys[i], "id", err), bad
		}
	}
	s.items = items
	return items
}

// settle acts on a page's outcomes: failed markers are put off for a retry,
// and the cleared, live-again and malformed ones are deleted in one call.
func (s *Sweep) settle(ctx context.Context, p *passState, keys [][]byte, items []item) error {
	st := p.st
	del := s.del[:0]
	oldest := int64(-1) // ms of the oldest cleared marker: it has the largest lag
	for i := range items {
		it := &items[i]
		switch it.out {
		case foreign:
			st.Foreign++
			p.notes.noteForeign(keys[i])
			continue
		case deferred:
			st.Deferred++
			s.noteRetry(p, s.retries.due(it.id))
			continue
		case pending:
			continue // only a cancelled pass leaves one, and it returned before
		case bad:
			st.Malformed++
			p.notes.noteMalformed(it.err)
		case cleared, clearedGone:
			st.Cleared++
			s.retries.forget(it.id)
			if oldest < 0 {
				oldest = it.ms // items ascend, so the first cleared is the oldest
			}
			if it.out == clearedGone {
				continue
			}
		case liveAgain:
			st.LiveAgain++
			s.retries.forget(it.id)
		case failed:
			st.Failed++
			p.notes.noteFailed(it.id, it.err)
			if !s.retry(ctx, p, it.id, keys[i]) {
				continue
			}
		}
		del = append(del, keys[i])
	}
	s.del = del
	if oldest >= 0 {
		st.MaxLag = max(st.MaxLag, p.cutoff.Sub(time.UnixMilli(oldest)))
	}
	if len(del) > 0 {
		return s.delete(ctx, p, del)
	}
	return nil
}

// peek reads the first marker past the expired range to set st.NextDue. It
// reads one key when that is a marker, as it nearly always is; foreign and
// malformed keys there are stepped over a page at a time, and the malformed
// ones deleted.
func (s *Sweep) peek(ctx context.Context, p *passState) error {
	st := p.st
	from, limit := p.cutoffKey, 1
	for {
		keys, err := s.scan(ctx, p, from, s.upper, limit)
		if err != nil {
			return err
		}
		var del [][]byte
		found := false
		for _, key := range keys {
			ms, id, isForeign, err := parseKey(s.prefix, key)
			if err == nil {
				if err = s.checkIDBytes(key, id); errors.Is(err, errValidatePanicked) {
					err = nil // not known to be malformed: it counts as a marker
				}
			}
			switch {
			case isForeign:
				st.Foreign++
				p.notes.noteForeign(key)
				continue
			case err != nil:
				st.Malformed++
				p.notes.noteMalformed(err)
				del = append(del, key)
				continue
			}
			st.NextDue = earliest(st.NextDue, time.UnixMilli(ms).Add(s.retention))
			found = true
			break
		}
		if len(del) > 0 {
			if err := s.delete(ctx, p, del); err != nil {
				return err
			}
		}
		if found || len(keys) < limit {
			return nil
		}
		from = append(append([]byte(nil), keys[len(keys)-1]...), 0)
		limit = s.pageSize
	}
}

// checkIDBytes checks a marker's id by the sweep's rule, returning the
// malformed-marker error for key.
func (s *Sweep) checkIDBytes(key, id []byte) error {
	var err error
	if s.validate == nil {
		err = validateIDBytes(id)
	} else {
		err = s.checkID(string(id))
	}
	if err != nil && !errors.Is(err, errValidatePanicked) {
		return malformed(key, "id", err)
	}
	return err
}

// earliest returns the earlier of a and b, where the zero time means none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// Run sweeps until ctx is done, then returns ctx.Err(). The first pass runs
// at once (or after a random delay below Config.StartJitter), so a fresh
// process clears what an earlier one left due. After a pass Run sleeps until
// the oldest remaining marker falls due (from Stats.NextDue), but never
// longer than Config.Interval, lengthened by up to Config.Jitter of itself;
// an idle sweep thus clears an entity within moments of it falling due. A
// pass that fails is logged and retried after a backoff that doubles from
// one second up to Interval. Config.OnPass sees every pass.
//
// With Config.Lease set, Run passes only while it holds the lease: it tries
// to take it before each pass and, once held, keeps it until ctx is done or
// it is lost; a pass during which the lease is lost is cancelled before it
// deletes another marker. A lease that is a Fencer also fences the pass's
// deletes in the store. A replica without the lease retries every
// Interval. Run releases a held lease and leaves no goroutine behind when it
// returns.
func (s *Sweep) Run(ctx context.Context) error {
	l := &loop{
		members:     []*Sweep{s},
		locker:      s.lease,
		log:         s.log,
		jitter:      s.jitter,
		startJitter: s.startJitter,
	}
	return l.run(ctx)
}
