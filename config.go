package retention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
)

// Limits and defaults of Config fields.
const (
	DefaultPageSize = 256
	MaxPageSize     = 1 << 16
	MaxConcurrency  = 1024

	DefaultClearTimeout  = time.Minute
	DefaultMinInterval   = 50 * time.Millisecond
	DefaultStoreTimeout  = 30 * time.Second
	DefaultRetryDelay    = time.Second
	DefaultMaxRetryDelay = 10 * time.Minute
)

// Config configures a Sweep. Prefix and Retention are required, and one
// way to clear: Clear, ClearBatch, or neither when the KV is a
// ClearDeleter (which clears in the transaction that deletes the markers).
// Every other field has a usable zero value.
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

	// Clear removes the state of the entity with the given id. Set it, or
	// ClearBatch, unless the KV is a ClearDeleter: then leave both nil.
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
	// nil when every id is cleared, or a BatchError naming the ids that are
	// not (the others are; a BatchError naming an id not in the batch fails
	// the call). Every rule of Clear holds per id. Any other error, a
	// panic, a timeout or a runtime.Goexit fails the call as a whole: the
	// sweep then bisects the batch to find the ids at fault, which go alone
	// afterwards, and when ids tried alone fail too it takes a dependency
	// to be down and puts the batch off (docs/clearing.md, "When some clears
	// fail"). An error wrapping ErrLiveAgain for the whole call drops every
	// marker of the batch. ClearTimeout bounds each call; Concurrency is
	// the number of batches in flight.
	ClearBatch func(ctx context.Context, ids []string) error

	// BatchSize is the most ids a ClearBatch (or ClearDeleter) call gets; a
	// page (PageSize) is cut into batches of it. Zero means
	// DefaultBatchSize; otherwise 1 to PageSize. Not with Clear.
	BatchSize int

	// ClearTimeout bounds each call of Clear (or ClearBatch): Clear's ctx
	// is done this long after Clear first consults it (Done, Err or
	// Deadline), which for a Clear that waits on I/O is when it starts; a
	// ClearBatch's ctx, from the call. Zero means DefaultClearTimeout; a
	// negative value means no limit; otherwise at least 1ms.
	ClearTimeout time.Duration

	// StoreTimeout bounds each call to the KV (Scan, Delete, Put, Move). A call
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
	// On a KV that is a Mover, the marker moves to the sweep's retry range,
	// due after the wait, keeping the entity's finish time and its count
	// of failed attempts (so lag, Backlog and the backoff survive
	// restarts). On any other KV the wait is kept in memory, and a restart
	// starts the id again at RetryDelay. An id put off untried because the
	// dependency seemed down (see ClearBatch) backs off the same way but
	// counts no attempt of its own.
	RetryDelay    time.Duration
	MaxRetryDelay time.Duration

	// MaxAttempts parks a marker whose clear failed this many times in a
	// row: it moves to the sweep's parked range, where no pass reads it,
	// is counted in Stats.Parked and logged at Error, and stays until
	// Sweep.Requeue puts it back (list them with Sweep.Parked). Markers
	// keep their count of failed attempts in the store, so it survives
	// restarts and lease hand-overs. Zero means no limit: a marker is
	// retried for ever, at most every MaxRetryDelay. It needs a KV that
	// is a Mover.
	MaxAttempts int

	// Limiter is a delete budget, counted in entities: every call of
	// Clear, ClearBatch or a ClearDeleter waits for as many tokens as it
	// has ids before it goes out (in parts of the limiter's burst), and the
	// wait honours the pass's context. Share one Limiter between sweeps,
	// a Group's or several services', to give one database one budget.
	// Time spent waiting is in Stats.BudgetWait: it is not lag a sweep can
	// make up. Nil means no limit. A limiter whose burst is below 1 takes
	// nothing and is refused, unless its limit is rate.Inf.
	Limiter *rate.Limiter

	// BatchTarget is how long a call of ClearBatch (or of a ClearDeleter)
	// should take at most. A call that runs longer, or times out, halves
	// the batch size for the calls that follow, down to 1; calls under a
	// quarter of it double it back, up to BatchSize. Stats.BatchSize tells
	// the size a pass ended with. Zero means a quarter of ClearTimeout (no
	// target when ClearTimeout is negative); a negative value turns the
	// adapting off; otherwise at least 1ms. Not with Clear.
	BatchTarget time.Duration

	// MinInterval is the least Run waits after a pass that changed
	// something (cleared, dropped or moved markers) before the next, so
	// that steady traffic costs at most one pass per MinInterval, each
	// clearing what fell due meanwhile, and an entity waits at most
	// MinInterval plus one pass past due (lengthened by Jitter). Zero
	// means DefaultMinInterval; a negative value means none: a pass
	// whenever the next marker falls due.
	MinInterval time.Duration

	// DryRun makes passes read and classify the markers as they would, and
	// report what they would have done, without doing it: no Clear,
	// ClearBatch or ClearDeleter call, and no marker deleted, moved or
	// parked. Stats.WouldClear counts the markers whose entities a pass
	// would have cleared (Malformed and Duplicates those it would have
	// dropped); each pass logs them at Info with a few ids, and an
	// Observer sees them. Run waits Interval between dry passes, since
	// the same markers stay due. False, the default, sweeps for real.
	DryRun bool

	// Clock tells the time. Nil means SystemClock.
	Clock Clock

	// PageSize is how many markers one Scan reads. Zero means
	// DefaultPageSize, or BatchSize when that is larger; otherwise 1 to
	// MaxPageSize. While a full page is cleared, the next one is read.
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
	// this function says. Write markers with ids of this rule through the
	// sweep: Sweep.MarkerKey (whose key the adapters' MarkKeyTx write in a
	// transaction) or Sweep.Mark; the package-level MarkerKey and Mark
	// check ids by the default rule only.
	ValidateID func(id string) error

	// OnPass is called by Run (and by a Group's Run) after every pass, on
	// the loop's goroutine, with the pass's Stats and error, and by
	// LeasedPass on its caller's goroutine: one called while Run runs makes
	// two goroutines call it. Nil means no call. Pass does not call it.
	OnPass func(Stats, error)

	// Observer, when set, sees every pass (Pass, Run and LeasedPass), the
	// lag of every cleared entity and the lease's events, for metrics: see
	// the retentionprom and retentionotel modules. Nil means none, at no
	// cost to a pass.
	Observer Observer

	// Lease, when set, makes Run sweep only while this replica holds the
	// lease, so that a fleet sharing one store clears each entity once.
	// Nil means no lease: every replica sweeps, and an entity may be
	// cleared by several replicas at about the same time. Adapters for
	// shared stores provide Lockers. A Sweep in a Group must leave it nil
	// and use GroupConfig.Lease.
	Lease Locker

	// AllowUnfenced lets Run and LeasedPass sweep under a lease that is a
	// Fencer but cannot fence the KV (a store of another engine, or a
	// wrapper without an Unwrap method; see Fencer): the pass's deletes
	// then rely on the lease's timing alone, and a replica that was frozen
	// or cut off past its lease may delete markers after another took it
	// over. False means such a Run or LeasedPass returns an error matching
	// ErrUnfenced instead. A lease that is no Fencer fences nothing and
	// needs no such consent. In a Group, each sweep's own setting counts.
	AllowUnfenced bool

	// Jitter lengthens every wait of Run by a random fraction of itself, up
	// to Jitter, so replicas that start together do not wake together. Zero
	// means exact waits; otherwise 0 to 1.
	Jitter float64

	// StartJitter delays Run's first pass by a random duration below it.
	// Zero means the first pass runs at once; it must not be negative.
	StartJitter time.Duration
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
	case cfg.PageSize != 0 && cfg.BatchSize > cfg.PageSize:
		return invalidConfig("Config.BatchSize (%d) is larger than Config.PageSize (%d): a batch is cut from one page; "+
			"raise PageSize, or leave it 0 to read pages of BatchSize", cfg.BatchSize, cfg.PageSize)
	case cfg.Concurrency < 0 || cfg.Concurrency > MaxConcurrency:
		return invalidConfig("Config.Concurrency must be 0 (default 1) or 1 to %d, got %d", MaxConcurrency, cfg.Concurrency)
	case cfg.MaxAttempts < 0 || cfg.MaxAttempts > maxAttempts:
		return invalidConfig("Config.MaxAttempts must be 0 (no limit) or 1 to %d, got %d", maxAttempts, cfg.MaxAttempts)
	case cfg.MaxAttempts > 0 && !isMover(kv):
		return invalidConfig("Config.MaxAttempts is set, but the KV (%T) is no Mover: it cannot park a marker", kv)
	case cfg.Limiter != nil && cfg.Limiter.Limit() != rate.Inf && cfg.Limiter.Burst() < 1:
		return invalidConfig("Config.Limiter has a burst of %d: it would never let a clear through (give it a burst of at least 1)", cfg.Limiter.Burst())
	case cfg.BatchTarget > 0 && cfg.BatchTarget < time.Millisecond:
		return invalidConfig("Config.BatchTarget must be 0 (a quarter of ClearTimeout), negative (none) or at least 1ms, got %v", cfg.BatchTarget)
	case cfg.BatchTarget != 0 && cfg.Clear != nil:
		return invalidConfig("Config.BatchTarget is set but Config.Clear clears one id at a time: use Config.ClearBatch")
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

// isMover reports whether kv is a Mover: the sweep reschedules, holds and
// parks markers in the store only over one.
func isMover(kv KV) bool {
	_, ok := kv.(Mover)
	return ok
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
