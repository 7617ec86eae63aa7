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
	DefaultWakePoll      = time.Second

	// MaxReplicaLen is the longest Config.Replica.
	MaxReplicaLen = 64
)

// Config configures a Sweep. Prefix and Retention are required, and one
// way to clear: Clear, ClearBatch, or neither when the KV is a
// ClearDeleter. Every other field has a usable zero value.
type Config struct {
	// Prefix is the key prefix of this sweep's markers, such as "runs/done/".
	// Required. It must end in a byte that is not an id byte (A-Z a-z 0-9 _
	// -), such as '/' or ':'. A sweep deletes only marker-shaped keys under
	// it: other keys are foreign, counted and logged, never deleted. It must
	// not hold TimestampWidth digits and '/' after a byte that ends a
	// prefix (or after r or p following one): a sweep of the shorter prefix
	// would take this sweep's markers for its own.
	Prefix string

	// Retention is how long an entity's state is kept after it finished: a
	// marker is expired once it is strictly older. At least 1ms.
	Retention time.Duration

	// Clear removes the state of the entity with the given id. Set it, or
	// ClearBatch, unless the KV is a ClearDeleter: then leave both nil.
	//
	// Clear must be idempotent: a crash between it and the marker's delete
	// makes the next pass clear the same id again. Return nil when there is
	// nothing left to clear, and an error wrapping ErrLiveAgain to drop the
	// marker without clearing. Any other error, a panic, a timeout or a
	// runtime.Goexit keeps the marker, which is tried again after
	// RetryDelay. ctx is done when ClearTimeout runs out or the pass is
	// cancelled; a Clear that ignores it holds up its page. See
	// docs/clearing.md.
	Clear func(ctx context.Context, id string) error

	// ClearBatch, set instead of Clear, clears up to BatchSize ids of one
	// page in one call. It returns nil when every id is cleared, or a
	// BatchError naming those that are not. Every rule of Clear holds per
	// id, and an ErrLiveAgain or a Hold for the whole call holds for each
	// id. Any other failure fails the call as a whole: the sweep bisects
	// the batch to find the ids at fault (docs/clearing.md, "When some
	// clears fail"). ClearTimeout bounds each call; Concurrency is the
	// number of batches in flight.
	ClearBatch func(ctx context.Context, ids []string) error

	// BatchSize is the most ids a ClearBatch (or ClearDeleter) call gets,
	// and the most markers a RunClearer's run takes. Zero means
	// DefaultBatchSize; otherwise 1 to PageSize. Not with Clear.
	BatchSize int

	// ClearTimeout bounds each call of Clear (from its first look at ctx)
	// or ClearBatch (from the call). Zero means DefaultClearTimeout; a
	// negative value means no limit; otherwise at least 1ms.
	ClearTimeout time.Duration

	// StoreTimeout bounds each call to the KV; one that runs out fails the
	// pass. Zero means DefaultStoreTimeout; a negative value means no
	// limit; otherwise at least 1ms.
	StoreTimeout time.Duration

	// RetryDelay is how long a marker whose clear failed waits before it is
	// tried again; each further failure doubles the wait, with up to a
	// fifth of it added at random, up to MaxRetryDelay. Zero means
	// DefaultRetryDelay and MaxRetryDelay zero means DefaultMaxRetryDelay;
	// otherwise 1ms <= RetryDelay <= MaxRetryDelay. On a Mover the wait and
	// the count of failed attempts are kept in the store (see Mover).
	RetryDelay    time.Duration
	MaxRetryDelay time.Duration

	// MaxAttempts parks a marker whose clear failed this many times in a
	// row: it moves to the sweep's parked range, where no pass reads it,
	// until Sweep.Requeue puts it back. Zero means no limit. It needs a KV
	// that is a Mover.
	MaxAttempts int

	// Limiter is a delete budget, counted in entities: every clear call
	// waits for as many tokens as it has ids, and a RunClearer's run for
	// as many as it may take, the wait counted in Stats.BudgetWait. Share one between sweeps to give one database one
	// budget (docs/protecting-the-database.md). Nil means no limit. A
	// limiter whose burst is below 1 is refused, unless its limit is
	// rate.Inf.
	Limiter *rate.Limiter

	// BatchTarget is how long a call of ClearBatch (or of a ClearDeleter)
	// should take at most: a call that runs longer, or times out, halves
	// the batch size, down to 1; calls under a quarter of it double it
	// back, up to BatchSize. Zero means a quarter of ClearTimeout (none
	// when ClearTimeout is negative); a negative value turns it off;
	// otherwise at least 1ms. Not with Clear.
	BatchTarget time.Duration

	// MinInterval is the least Run waits after a pass that changed
	// something before the next. Zero means DefaultMinInterval; a negative
	// value means none.
	MinInterval time.Duration

	// DryRun makes passes read and classify the markers, and count in
	// Stats what they would have done, without any clear call, delete or
	// move (docs/policies.md, "Dry runs"). False sweeps for real.
	DryRun bool

	// Clock tells the time. Nil means SystemClock.
	Clock Clock

	// PageSize is how many markers one Scan reads. Zero means
	// DefaultPageSize, or BatchSize when that is larger; otherwise 1 to
	// MaxPageSize.
	PageSize int

	// Concurrency is how many Clear (or ClearBatch) calls of one page may
	// run at once. Zero means 1; otherwise 1 to MaxConcurrency. Pages still
	// go in order, and a marker is still deleted only after its own clear
	// succeeded. Above 1, a RunClearer's runs are not used: each picks the
	// next batch, so they go one at a time.
	Concurrency int

	// Interval is the longest Run sleeps between passes. Zero means the
	// smaller of Retention and one minute; it must not be negative.
	Interval time.Duration

	// Logger receives failed clears and passes (Error), malformed markers
	// and foreign keys (Warn) and per-pass summaries (Debug), at most one
	// line per kind per pass (docs/operating.md, "Logs"). Nil means
	// slog.Default() as it is when New runs.
	Logger *slog.Logger

	// ValidateID checks the id of every marker before it is cleared; a
	// marker whose id it refuses is deleted as malformed. Nil means the
	// package's ValidateID. An empty id is always refused. Write markers of
	// such ids with Sweep.MarkerKey or Sweep.Mark.
	ValidateID func(id string) error

	// OnPass is called after every pass of Run (and a Group's Run), on the
	// loop's goroutine, and of LeasedPass, on its caller's: a LeasedPass
	// while Run runs makes two goroutines call it. Nil means no call. Pass
	// does not call it.
	OnPass func(Stats, error)

	// Observer, when set, sees every pass, the lag of every cleared entity
	// and the lease's events, for metrics (see Observer). Nil means none.
	Observer Observer

	// Lease, when set, makes Run sweep only while this replica holds the
	// lease (docs/fleet.md). Nil means no lease: every replica sweeps. A
	// Sweep in a Group must leave it nil and use GroupConfig.Lease.
	Lease Locker

	// AllowUnfenced lets Run and LeasedPass sweep under a lease that is a
	// Fencer but cannot fence the KV, its deletes then relying on the
	// lease's timing alone. False means such a Run or LeasedPass returns an
	// error matching ErrUnfenced. In a Group, each sweep's own setting
	// counts.
	AllowUnfenced bool

	// Jitter lengthens every wait of Run by a random fraction of itself, up
	// to Jitter. Zero means exact waits; otherwise 0 to 1.
	Jitter float64

	// StartJitter delays Run's first pass by a random duration below it.
	// Zero means none; it must not be negative.
	StartJitter time.Duration

	// Replica names this process in its fleet, such as its pod's name
	// (os.Hostname in Kubernetes): set it, different on each, on every
	// replica of a fleet that shares the store under a Lease. Then the
	// replica that holds the lease keeps a record of its passes in the
	// store, under the prefix outside the markers' ranges, which
	// Sweep.Fleet reads on any replica; between passes it reads the
	// store's wake key every WakePoll, which Sweep.Wake, Sweep.Requeue and
	// Sweep.ReleaseHolds write on any replica; and a Run that releases the
	// lease as it returns writes a key that the replicas waiting for the
	// lease read every WakePoll, to take it at once (docs/fleet.md, "The
	// fleet view"). It needs a KV that is a Putter and a Mover. Empty means
	// none of this: the sweep writes no key but its markers, Wake reaches
	// this process's Run alone, and a released lease is taken at the next
	// try. At most MaxReplicaLen bytes of printable ASCII.
	Replica string

	// WakePoll is how often Run, with Replica set, reads the store between
	// passes while it holds the lease (the wake key: a Requeue on another
	// replica starts a pass within it), and between its tries while it
	// waits for the lease (the key that says it was released: it takes it
	// within WakePoll). Each read is one Scan of one key. Zero means
	// DefaultWakePoll; a negative value means never (a Requeue on another
	// replica waits for the next pass, a released lease for the next try);
	// otherwise at least 1ms.
	WakePoll time.Duration
}

// checkConfig checks what New cannot default.
func checkConfig(kv KV, cfg *Config) error {
	first, most := cfg.RetryDelay, cfg.MaxRetryDelay
	_, clearDeleter := kv.(ClearDeleter)
	_, mover := kv.(Mover)
	switch {
	case kv == nil:
		return invalidConfig("kv must not be nil")
	case cfg.Prefix == "":
		return invalidConfig("Config.Prefix must not be empty")
	case idByte(cfg.Prefix[len(cfg.Prefix)-1]):
		return invalidConfig("Config.Prefix %q ends in %q, a byte of ids and timestamps: end it with a separator "+
			"such as '/' or ':' (%q) so markers cannot be confused with other keys", cfg.Prefix, cfg.Prefix[len(cfg.Prefix)-1], cfg.Prefix+"/")
	case stampInPrefix(cfg.Prefix) >= 0:
		i := stampInPrefix(cfg.Prefix)
		return invalidConfig("Config.Prefix %q holds %q, %d digits and '/' where a marker's time stands: a sweep of prefix %q "+
			"would read this sweep's markers as its own and delete them as malformed; put another byte than '/' after the "+
			"digits (%q) or give them another width", cfg.Prefix, cfg.Prefix[i:i+TimestampWidth+1], TimestampWidth,
			cfg.Prefix[:outerEnd(cfg.Prefix, i)], cfg.Prefix[:i+TimestampWidth]+":"+cfg.Prefix[i+TimestampWidth+1:])
	case cfg.Clear == nil && cfg.ClearBatch == nil && !clearDeleter:
		return invalidConfig("Config.Clear or Config.ClearBatch must be set (or kv must be a ClearDeleter)")
	case cfg.Clear != nil && cfg.ClearBatch != nil:
		return invalidConfig("set one of Config.Clear and Config.ClearBatch, not both")
	case (cfg.Clear != nil || cfg.ClearBatch != nil) && clearDeleter:
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
	case cfg.MaxAttempts > 0 && !mover:
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
	case cfg.WakePoll > 0 && cfg.WakePoll < time.Millisecond:
		return invalidConfig("Config.WakePoll must be 0 (default %v), negative (never) or at least 1ms, got %v", DefaultWakePoll, cfg.WakePoll)
	case len(cfg.Replica) > MaxReplicaLen || !printable(cfg.Replica):
		return invalidConfig("Config.Replica must be at most %d bytes of printable ASCII, got %q", MaxReplicaLen, cfg.Replica)
	case cfg.Replica != "" && !putMover(kv):
		return invalidConfig("Config.Replica is set but the KV (%T) is not a Putter and a Mover: the fleet's record and wake key need both", kv)
	case cfg.StoreTimeout > 0 && cfg.StoreTimeout < time.Millisecond:
		return invalidConfig("Config.StoreTimeout must be 0 (default %v), negative (none) or at least 1ms, got %v", DefaultStoreTimeout, cfg.StoreTimeout)
	case first < 0 || (first > 0 && first < time.Millisecond):
		return invalidConfig("Config.RetryDelay must be 0 (default %v) or at least 1ms, got %v", DefaultRetryDelay, first)
	case most < 0 || (most > 0 && most < time.Millisecond):
		return invalidConfig("Config.MaxRetryDelay must be 0 (default %v) or at least 1ms, got %v", DefaultMaxRetryDelay, most)
	case first > 0 && most > 0 && first > most:
		return invalidConfig("Config.RetryDelay (%v) must not exceed Config.MaxRetryDelay (%v)", first, most)
	case first > DefaultMaxRetryDelay && most == 0:
		return invalidConfig("Config.RetryDelay (%v) exceeds the default MaxRetryDelay (%v): set Config.MaxRetryDelay too", first, DefaultMaxRetryDelay)
	case most > 0 && most < DefaultRetryDelay && first == 0:
		return invalidConfig("Config.MaxRetryDelay (%v) is below the default RetryDelay (%v): set Config.RetryDelay too", most, DefaultRetryDelay)
	}
	return checkJitter("Config", cfg.Jitter, cfg.StartJitter)
}

// printable reports whether s is printable ASCII.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func putMover(kv KV) bool {
	_, put := kv.(Putter)
	_, move := kv.(Mover)
	return put && move
}

func invalidConfig(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

func checkJitter(config string, jitter float64, startJitter time.Duration) error {
	switch {
	case !(jitter >= 0 && jitter <= 1):
		return invalidConfig("%s.Jitter must be between 0 and 1, got %v", config, jitter)
	case startJitter < 0:
		return invalidConfig("%s.StartJitter must not be negative, got %v", config, startJitter)
	}
	return nil
}
