package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Limits and defaults of Config fields.
const (
	DefaultPageSize = 256
	MaxPageSize     = 1 << 16
	MaxConcurrency  = 1024
)

// dueSlack is how long after a marker falls due Run wakes for it: a clock
// with coarse resolution read exactly at the due time could still see the
// marker as unexpired and spin.
const dueSlack = time.Millisecond

// Config configures a Sweep. Prefix, Retention and Clear are required; every
// other field has a usable zero value.
type Config struct {
	// Prefix is the key prefix of this sweep's markers, such as "runs/done/".
	// Required. A sweep reads and deletes only keys that continue the prefix
	// with a digit; other keys under the prefix are never touched. No other
	// sweep or data may use keys of that shape under the same prefix.
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
	// clearing (the entity was resumed). Any other error, or a panic, keeps
	// the marker for a later pass. ctx is the pass's context.
	Clear func(ctx context.Context, id string) error

	// Clock tells the time. Nil means SystemClock.
	Clock Clock

	// PageSize is how many markers one Scan reads. Zero means
	// DefaultPageSize; otherwise 1 to MaxPageSize.
	PageSize int

	// Concurrency is how many Clear calls of one page may run at once. Zero
	// means 1: markers are cleared one at a time, oldest first. Otherwise 1
	// to MaxConcurrency. Above 1, the clears of a page start oldest first
	// but may finish in any order; pages still go in order, every clear of a
	// page ends before its markers are deleted and the next page is read,
	// and a marker is still deleted only after its own Clear succeeded.
	Concurrency int

	// Interval is the longest Run sleeps between passes. Run usually wakes
	// sooner, when the oldest unexpired marker falls due; Interval bounds how
	// long a marker written out of order, or whose Clear failed, waits. Zero
	// means the smaller of Retention and one minute; it must not be
	// negative.
	Interval time.Duration

	// Logger receives failed clears and passes (Error), malformed markers
	// (Warn) and per-pass summaries (Debug). Nil means nothing is logged.
	Logger *slog.Logger

	// ValidateID checks the id of every marker before Clear sees it. A
	// marker whose id it refuses is deleted as malformed, without Clear.
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
	Failed      int // markers whose Clear returned an error or panicked; they stay
	Malformed   int // malformed markers, deleted without Clear
	LiveAgain   int // markers whose Clear returned ErrLiveAgain, deleted without clearing
	ScanCalls   int // calls to KV.Scan
	DeleteCalls int // calls to KV.Delete

	// Duration is how long the pass took by the sweep's Clock.
	Duration time.Duration

	// MaxLag is how long past its due time the most overdue cleared marker
	// was when the pass started. Zero when nothing was cleared.
	MaxLag time.Duration

	// NextDue is when the oldest marker left unexpired falls due: the first
	// pass started after it clears that marker. Zero when there is none.
	NextDue time.Time
}

// Sweep clears entities whose terminal markers are older than a retention
// window. Create one with New; call Run for a background loop, or Pass for
// one sweep (in tests, or driven by your own scheduler). A Sweep is safe for
// concurrent use; its passes never overlap.
type Sweep struct {
	kv          KV
	prefix      string
	retention   time.Duration
	clear       func(context.Context, string) error
	clock       Clock
	pageSize    int
	concurrency int
	interval    time.Duration
	log         *slog.Logger
	validate    func(string) error // nil: ValidateID
	onPass      func(Stats, error)
	lease       Locker
	jitter      float64
	startJitter time.Duration

	// lower and upper bound the marker space: the prefix followed by a digit.
	lower, upper []byte

	// busy serialises passes and guards the buffers below, which passes reuse.
	busy  chan struct{}
	items []item
	ids   []byte
	del   [][]byte
	from  []byte
}

// item is one marker of a page on its way through a pass; items[i] stands
// for the page's keys[i].
type item struct {
	id     string
	ms     int64
	err    error // parse or Clear error
	lo, hi int32 // the id's bounds in the page's id buffer
	bad    bool  // malformed
}

// New returns a Sweep of kv's markers configured by cfg. The error matches
// ErrInvalidConfig and names the field at fault.
func New(kv KV, cfg Config) (*Sweep, error) {
	switch {
	case kv == nil:
		return nil, invalidConfig("kv must not be nil")
	case cfg.Prefix == "":
		return nil, invalidConfig("Config.Prefix must not be empty")
	case cfg.Clear == nil:
		return nil, invalidConfig("Config.Clear must not be nil")
	case cfg.Retention < time.Millisecond:
		return nil, invalidConfig("Config.Retention must be at least 1ms, got %v", cfg.Retention)
	case cfg.PageSize < 0 || cfg.PageSize > MaxPageSize:
		return nil, invalidConfig("Config.PageSize must be 0 (default %d) or 1 to %d, got %d", DefaultPageSize, MaxPageSize, cfg.PageSize)
	case cfg.Concurrency < 0 || cfg.Concurrency > MaxConcurrency:
		return nil, invalidConfig("Config.Concurrency must be 0 (default 1) or 1 to %d, got %d", MaxConcurrency, cfg.Concurrency)
	case cfg.Interval < 0:
		return nil, invalidConfig("Config.Interval must not be negative, got %v", cfg.Interval)
	}
	if err := checkJitter("Config", cfg.Jitter, cfg.StartJitter); err != nil {
		return nil, err
	}
	s := &Sweep{
		kv:          kv,
		prefix:      cfg.Prefix,
		retention:   cfg.Retention,
		clear:       cfg.Clear,
		clock:       cmp.Or(cfg.Clock, SystemClock),
		pageSize:    cmp.Or(cfg.PageSize, DefaultPageSize),
		concurrency: cmp.Or(cfg.Concurrency, 1),
		interval:    cfg.Interval,
		log:         cfg.Logger,
		validate:    cfg.ValidateID,
		onPass:      cfg.OnPass,
		lease:       cfg.Lease,
		jitter:      cfg.Jitter,
		startJitter: cfg.StartJitter,
		lower:       append([]byte(cfg.Prefix), '0'),
		upper:       append([]byte(cfg.Prefix), '9'+1),
		busy:        make(chan struct{}, 1),
	}
	if s.interval == 0 {
		s.interval = min(s.retention, time.Minute)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("prefix", s.prefix)
	return s, nil
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
	if err := s.validate(id); err != nil {
		if !errors.Is(err, ErrInvalidID) {
			err = fmt.Errorf("%w: %w", ErrInvalidID, err)
		}
		return err
	}
	return nil
}

// Pass makes one sweep: every expired marker is handled, oldest first, then
// Pass returns. Per marker it parses the key, calls Clear and, only once
// Clear returned nil (or ErrLiveAgain), deletes the marker; markers of one
// page are deleted in one KV.Delete call. Malformed markers are deleted
// without Clear. A failed or panicking Clear is counted and logged, and the
// pass goes on with the next marker.
//
// Pass reads only the expired range of keys, plus one key past it to learn
// Stats.NextDue, so a pass with nothing expired costs two Scan calls however
// many markers wait. It returns an error when the KV fails, and ctx.Err()
// when ctx is done; in both cases no marker whose Clear did not succeed has
// been deleted.
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
	defer func() { st.Duration = s.clock.Now().Sub(start) }()
	cutoff := start.Add(-s.retention)
	cutoffMs := cutoffMillis(cutoff)
	cutoffKey := appendTimestamp(append([]byte(nil), s.prefix...), uint64(cutoffMs))

	from := s.lower
	for {
		keys, err := kv.Scan(ctx, from, cutoffKey, s.pageSize)
		st.ScanCalls++
		if err != nil {
			return st, s.kvErr(ctx, "scan markers", err)
		}
		st.Scanned += len(keys)
		if err := s.page(ctx, kv, keys, cutoff, cutoffMs, &st); err != nil {
			return st, err
		}
		if len(keys) < s.pageSize {
			break
		}
		// Resume just after the last key: markers that stay (failed clears)
		// must not be read again in this pass.
		s.from = append(append(s.from[:0], keys[len(keys)-1]...), 0)
		from = s.from
	}
	if err := s.peek(ctx, kv, cutoffKey, &st); err != nil {
		return st, err
	}
	s.log.Debug("retention pass", "cleared", st.Cleared, "failed", st.Failed, "malformed", st.Malformed,
		"live_again", st.LiveAgain, "max_lag", st.MaxLag, "next_due", st.NextDue)
	return st, nil
}

// cutoffMillis returns the smallest whole millisecond not before cutoff: a
// marker of ts milliseconds is expired iff ts is below it.
func cutoffMillis(cutoff time.Time) int64 {
	switch {
	case cutoff.Before(epoch):
		return 0
	case cutoff.After(maxMarkerTime):
		return math.MaxInt64
	}
	ms := cutoff.UnixMilli()
	if time.UnixMilli(ms).Before(cutoff) {
		ms++
	}
	return ms
}

// page handles one page of the expired range.
func (s *Sweep) page(ctx context.Context, kv KV, keys [][]byte, cutoff time.Time, cutoffMs int64, st *Stats) error {
	items := s.items[:0]
	ids := s.ids[:0]
	for _, key := range keys {
		ms, id, err := parseKey(s.prefix, key)
		if err == nil && ms >= cutoffMs {
			// Only a KV that breaks its end bound gets here; clearing this
			// marker would delete state before its retention ran out.
			break
		}
		if err == nil && s.validate == nil {
			// The default rule runs on the bytes, before any string exists.
			if verr := validateIDBytes(id); verr != nil {
				err = malformed(key, "id", verr)
			}
		}
		items = append(items, item{})
		it := &items[len(items)-1]
		it.ms, it.err, it.bad, it.lo = ms, err, err != nil, int32(len(ids))
		ids = append(ids, id...)
		it.hi = int32(len(ids))
	}
	s.ids = ids
	// One string holds the page's ids and Clear gets substrings of it: one
	// allocation per page rather than per marker.
	all := string(ids)
	for i := range items {
		it := &items[i]
		if it.bad {
			continue
		}
		it.id = all[it.lo:it.hi]
		if s.validate == nil {
			continue
		}
		if err := s.checkID(it.id); err != nil {
			it.err, it.bad = malformed(keys[i], "id", err), true
		}
	}
	s.items = items

	if err := s.clearAll(ctx, items); err != nil {
		return err
	}
	// Deleting now would drop markers of clears that the cancellation cut
	// short; they are all retried by the next pass instead.
	if err := ctx.Err(); err != nil {
		return err
	}

	del := s.del[:0]
	oldest := int64(-1) // ms of the oldest cleared marker: it has the largest lag
	for i := range items {
		it := &items[i]
		switch {
		case it.bad:
			st.Malformed++
			s.log.Warn("retention: deleting malformed marker", "key", string(keys[i]), "error", it.err)
		case it.err == nil:
			st.Cleared++
			if oldest < 0 {
				oldest = it.ms // items ascend, so the first cleared is the oldest
			}
		case errors.Is(it.err, ErrLiveAgain):
			st.LiveAgain++
		default:
			st.Failed++
			if errors.Is(it.err, ErrClearPanicked) {
				s.log.Error("retention: clear panicked", "id", it.id, "error", it.err)
			} else {
				s.log.Error("retention: clear failed", "id", it.id, "error", it.err)
			}
			continue
		}
		del = append(del, keys[i])
	}
	s.del = del
	if oldest >= 0 {
		st.MaxLag = max(st.MaxLag, cutoff.Sub(time.UnixMilli(oldest)))
	}
	if len(del) == 0 {
		return nil
	}
	st.DeleteCalls++
	if err := kv.Delete(ctx, del...); err != nil {
		return s.kvErr(ctx, fmt.Sprintf("delete %d markers", len(del)), err)
	}
	return nil
}

// clearAll calls Clear for the well-formed items, recording each result in
// the item. It returns ctx.Err() if ctx is done before every Clear started.
func (s *Sweep) clearAll(ctx context.Context, items []item) error {
	if s.concurrency == 1 {
		for i := 0; i < len(items); {
			var err error
			if i, err = s.clearFrom(ctx, items, i); err != nil {
				return err
			}
		}
		return nil
	}
	// A pool of workers rather than a goroutine per marker: with fast clears
	// the goroutines would cost more than the clears.
	var g errgroup.Group
	g.SetLimit(s.concurrency) // the pool below never exceeds it; the limit says so
	var next atomic.Int64
	for range min(s.concurrency, len(items)) {
		g.Go(func() error {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(items) {
					break
				}
				if !items[i].bad {
					items[i].err = s.callClear(ctx, items[i].id)
				}
			}
			return nil
		})
	}
	_ = g.Wait() // workers return nil; results are in the items
	return ctx.Err()
}

// clearFrom clears items from index i on, one at a time, and returns where
// it stopped. A panicking Clear ends it early, with the panic recorded as
// that item's error: one deferred recover then serves a whole page rather
// than each marker.
func (s *Sweep) clearFrom(ctx context.Context, items []item, i int) (next int, err error) {
	defer func() {
		if r := recover(); r != nil {
			items[i].err = panicked(r)
			next = i + 1
		}
	}()
	for ; i < len(items); i++ {
		if items[i].bad {
			continue
		}
		if err := ctx.Err(); err != nil {
			return i, err
		}
		items[i].err = s.clear(ctx, items[i].id)
	}
	return i, nil
}

// callClear runs Clear, turning a panic into an error that carries the stack.
func (s *Sweep) callClear(ctx context.Context, id string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicked(r)
		}
	}()
	return s.clear(ctx, id)
}

func panicked(r any) error {
	return fmt.Errorf("%w: %v\n%s", ErrClearPanicked, r, debug.Stack())
}

// peek reads the first marker past the expired range to set st.NextDue.
// Malformed keys found there are deleted; each round removes one, so the
// loop ends, and with no malformed keys it reads at most one key.
func (s *Sweep) peek(ctx context.Context, kv KV, cutoffKey []byte, st *Stats) error {
	for {
		keys, err := kv.Scan(ctx, cutoffKey, s.upper, 1)
		st.ScanCalls++
		if err != nil {
			return s.kvErr(ctx, "scan markers", err)
		}
		st.Scanned += len(keys)
		if len(keys) == 0 {
			return nil
		}
		ms, id, err := parseKey(s.prefix, keys[0])
		if err == nil {
			if err = s.checkID(string(id)); err == nil {
				st.NextDue = time.UnixMilli(ms).Add(s.retention)
				return nil
			}
			err = malformed(keys[0], "id", err)
		}
		st.Malformed++
		s.log.Warn("retention: deleting malformed marker", "key", string(keys[0]), "error", err)
		st.DeleteCalls++
		if err := kv.Delete(ctx, keys[0]); err != nil {
			return s.kvErr(ctx, "delete malformed marker", err)
		}
	}
}

// kvErr wraps a KV error, returning ctx's own error when that is the cause.
func (s *Sweep) kvErr(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return ctxErr
	}
	return fmt.Errorf("retention: %s: %w", what, err)
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
// deletes another marker. A replica without the lease retries every
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

// untilDue is how long Run sleeps after a successful pass.
func (s *Sweep) untilDue(st Stats) time.Duration {
	if st.NextDue.IsZero() {
		return s.interval
	}
	return min(max(st.NextDue.Sub(s.clock.Now())+dueSlack, 0), s.interval)
}
