package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Limits and defaults of ShardConfig fields.
const (
	// MaxShards is the most shards a Sharded sweep has: a shard's number
	// takes shardWidth digits of its prefix.
	MaxShards = 1000

	DefaultHeartbeat = time.Second
)

// A shard's prefix is the sweep's prefix, shardInfix and the shard's number
// in shardWidth digits, then '/': "runs/done/s007/". After the prefix, s is
// none of the bytes a sweep of the prefix reads (a digit, r or p and a
// digit, the fleet's '#'), so a Sweep of the prefix itself, the one that
// drains the markers written before the sweep was sharded, never reads a
// shard's keys, nor a shard another's. The width is fixed whatever the
// number of shards, so that shard i keeps its prefix when it changes.
const (
	shardInfix = 's'
	shardWidth = 3
)

// ShardOf returns the shard, 0 to n-1, of the entity id in a sweep of n
// shards: the FNV-1a 64-bit hash of id's bytes, mixed by MurmurHash3's
// 64-bit finalizer (fmix64), modulo n. It is part of the marker format and
// never changes, so that a writer and a sweep built from different
// versions agree. The finalizer spreads ids that differ in their last
// bytes (run-1, run-2, ...), which FNV-1a alone places unevenly over some
// numbers of shards. It panics if n is below 1.
func ShardOf(id string, n int) int {
	if n < 1 {
		panic("retention: ShardOf needs at least 1 shard, got " + strconv.Itoa(n))
	}
	h := uint64(14695981039346656037) // FNV-1a's offset basis
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211 // FNV's 64-bit prime
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return int(h % uint64(n))
}

// ShardPrefix returns the prefix of shard number shard of a sharded sweep
// of prefix: prefix, 's', the number in three digits and '/', as in
// "runs/done/s007/". A writer that builds no Sharded writes the marker of
// id with MarkerKey(ShardPrefix(prefix, ShardOf(id, n)), t, id). It panics
// if shard is not 0 to MaxShards-1.
func ShardPrefix(prefix string, shard int) string {
	if shard < 0 || shard >= MaxShards {
		panic(fmt.Sprintf("retention: shard %d is not 0 to %d", shard, MaxShards-1))
	}
	b := make([]byte, 0, len(prefix)+shardWidth+2)
	b = append(append(b, prefix...), shardInfix)
	for d := 100; d > 0; d /= 10 {
		b = append(b, byte('0'+shard/d%10))
	}
	return string(append(b, '/'))
}

// ShardConfig configures the shards of a Sharded sweep. Shards is
// required; the other fields have usable zero values.
type ShardConfig struct {
	// Shards is how many shards the sweep has: 1 to MaxShards. The marker
	// of an entity lies in shard ShardOf(id, Shards). Raising it later
	// keeps every marker written swept, since a shard keeps its prefix,
	// unless KV places a shard by Shards too (rediskv.ShardTags does: a
	// new Shards is a new set for every shard, swept beside the old ones
	// until they are empty); lowering it leaves the markers of the shards
	// dropped to a Sweep of each of their prefixes. While replicas of two
	// values of Shards run together, some shards may wait for the last
	// replica of the old one to stop (docs/fleet.md, "Sharded sweeps").
	Shards int

	// Lease returns the Locker of the lease of shard number shard, whose
	// prefix is prefix, such as a store's NewLocker of a name made from
	// them; NewSharded calls it once per shard. With it, Run on each
	// replica holds about Shards / live replicas of the shards, each under
	// its own lease, taking over those of replicas that stop or die, and
	// Config.Replica must name the replica. Nil means no lease: Run sweeps
	// every shard, as a Sweep without a lease does, for one process.
	Lease func(shard int, prefix string) (Locker, error)

	// KV returns the store of shard number shard's markers, for a store
	// that places shards apart (the sorted set of a Redis Cluster slot of
	// its own); NewSharded calls it once per shard. Nil means every shard's
	// markers in the KV given to NewSharded, which, with a Lease, keeps the
	// replicas' keys in either case.
	KV func(shard int, prefix string) (KV, error)

	// Heartbeat is how often Run, with a Lease, writes this replica's key
	// in the store, reads the other replicas' keys, and takes or gives up
	// shards: a Put or Move and a Scan of a key per replica each time. A
	// replica whose key has not changed for three of its Heartbeats is
	// taken for gone. Zero means DefaultHeartbeat; otherwise at least 1ms.
	// Keep it at most a third of the leases' TTL: the shards of a replica
	// that died are then taken within the TTL and a Heartbeat.
	Heartbeat time.Duration
}

// Sharded is a sweep split into shards by a hash of the entity's id (see
// ShardOf): each shard is a Sweep of its own prefix (ShardPrefix), under a
// lease of its own, and the replicas that run the Sharded share the shards
// out among themselves, so that several of them sweep at once. Every
// guarantee of a Sweep holds per shard. Create one with NewSharded; most
// callers want Run, and writers MarkerKey. The zero value is not usable:
// its methods return an error matching ErrNotConfigured.
type Sharded struct {
	kv        KV
	prefix    string
	shards    []*Sweep
	loops     []*loop          // one per shard, as Sweep.Run would make
	observers []*shardObserver // one per shard, with a Lease
	replica   string
	heartbeat time.Duration
	log       *slog.Logger
	startJit  time.Duration
	storeTime time.Duration

	// fleetBudget is Config.Limiter, the budget of the whole fleet; budget
	// is the part of it this process spends, which its shards share:
	// fleetBudget's limit times sweeping / Shards.
	fleetBudget *rate.Limiter
	budget      *rate.Limiter
	budgetMu    sync.Mutex
	sweeping    atomic.Int64 // the shards this process sweeps: all of them but under Run with a Lease
}

// NewSharded returns a sweep of cfg.Prefix's markers split into
// sc.Shards shards. Each shard is a Sweep made by New from cfg, with the
// shard's prefix, lease (cfg.Lease must be nil: see ShardConfig.Lease) and
// store (kv, unless ShardConfig.KV); a Config.Limiter is the budget of
// every replica together (see Run). With a lease, kv keeps the replicas'
// keys and must be a Putter and a Mover. The error matches
// ErrInvalidConfig and names the field at fault.
func NewSharded(kv KV, cfg Config, sc ShardConfig) (*Sharded, error) {
	switch {
	case sc.Shards < 1 || sc.Shards > MaxShards:
		return nil, invalidConfig("ShardConfig.Shards must be 1 to %d, got %d", MaxShards, sc.Shards)
	case sc.Heartbeat < 0 || sc.Heartbeat > 0 && sc.Heartbeat < time.Millisecond:
		return nil, invalidConfig("ShardConfig.Heartbeat must be 0 (default %v) or at least 1ms, got %v", DefaultHeartbeat, sc.Heartbeat)
	case cfg.Lease != nil:
		return nil, invalidConfig("Config.Lease is set: a sharded sweep holds a lease per shard; set ShardConfig.Lease, which makes them")
	case kv == nil:
		return nil, invalidConfig("kv must not be nil")
	case sc.Lease != nil && cfg.Replica == "":
		return nil, invalidConfig("ShardConfig.Lease is set but Config.Replica is empty: the replicas of a sharded sweep find each other by name")
	case sc.Lease != nil && !putMover(kv):
		return nil, invalidConfig("ShardConfig.Lease is set but the KV (%T) is not a Putter and a Mover: the replicas' keys need both", kv)
	}
	kvs := make([]KV, sc.Shards)
	for i := range kvs {
		kvs[i] = kv
		if sc.KV == nil {
			continue
		}
		k, err := sc.KV(i, ShardPrefix(cfg.Prefix, i))
		if err != nil {
			return nil, fmt.Errorf("retention: ShardConfig.KV(%d): %w", i, err)
		}
		if k == nil {
			return nil, invalidConfig("ShardConfig.KV(%d) returned a nil KV", i)
		}
		kvs[i] = k
	}
	// The prefix itself, which the shards' prefixes hold, as New checks it.
	if err := checkConfig(kvs[0], &cfg); err != nil {
		return nil, err
	}
	s := &Sharded{
		kv:          kv,
		prefix:      cfg.Prefix,
		replica:     cfg.Replica,
		heartbeat:   cmp.Or(sc.Heartbeat, DefaultHeartbeat),
		log:         cmp.Or(cfg.Logger, slog.Default()).With("prefix", cfg.Prefix),
		startJit:    cfg.StartJitter,
		storeTime:   cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout),
		fleetBudget: cfg.Limiter,
	}
	if cfg.Limiter != nil {
		s.budget = rate.NewLimiter(cfg.Limiter.Limit(), cfg.Limiter.Burst())
	}
	s.sweeping.Store(int64(sc.Shards))
	for i := range sc.Shards {
		c := cfg
		c.Prefix = ShardPrefix(cfg.Prefix, i)
		c.Limiter = s.budget
		if sc.Lease != nil {
			lock, err := sc.Lease(i, c.Prefix)
			if err != nil {
				return nil, fmt.Errorf("retention: ShardConfig.Lease(%d, %q): %w", i, c.Prefix, err)
			}
			if lock == nil {
				return nil, invalidConfig("ShardConfig.Lease(%d, %q) returned a nil Locker", i, c.Prefix)
			}
			c.Lease = lock
			obs := &shardObserver{inner: cfg.Observer}
			s.observers = append(s.observers, obs)
			c.Observer = obs
		}
		sw, err := New(kvs[i], c)
		if err != nil {
			return nil, err
		}
		s.shards = append(s.shards, sw)
		s.loops = append(s.loops, &loop{
			members:     []*Sweep{sw},
			locker:      c.Lease,
			log:         sw.log,
			jitter:      sw.jitter,
			startJitter: sw.startJitter,
		})
	}
	return s, nil
}

// configured returns an error matching ErrNotConfigured unless NewSharded
// made s.
func (s *Sharded) configured(method string) error {
	if s == nil || len(s.shards) == 0 {
		return fmt.Errorf("%w: Sharded.%s called on a Sharded not made by NewSharded (a zero value?): create it with retention.NewSharded",
			ErrNotConfigured, method)
	}
	return nil
}

// Prefix returns the sweep's Config.Prefix, which the shards' prefixes
// extend.
func (s *Sharded) Prefix() string { return s.prefix }

// Shard returns the shard of id: ShardOf(id, ShardConfig.Shards), or -1 on a
// Sharded not made by NewSharded.
func (s *Sharded) Shard(id string) int {
	if s.configured("Shard") != nil {
		return -1
	}
	return ShardOf(id, len(s.shards))
}

// Shards returns the shards' Sweeps, shard i at index i, for what a Sweep
// tells of its own markers: Backlog, Pending, Parked, Requeue,
// ReleaseHolds, Fleet, Prefix. Sweep them through the Sharded's Run, not
// their own. Nil on a Sharded not made by NewSharded.
func (s *Sharded) Shards() []*Sweep {
	if s.configured("Shards") != nil {
		return nil
	}
	return slices.Clone(s.shards)
}

// MarkerKey returns the key of the marker for id finished at t, under the
// prefix of id's shard, as its Sweep's MarkerKey does (Config.ValidateID
// included). Write it in the transaction that records the entity's terminal
// state. A store that places shards apart (a Redis Cluster) places the
// entity's own keys by Shard(id).
func (s *Sharded) MarkerKey(t time.Time, id string) ([]byte, error) {
	if err := s.configured("MarkerKey"); err != nil {
		return nil, err
	}
	return s.shards[ShardOf(id, len(s.shards))].MarkerKey(t, id)
}

// Pass passes every shard once, in order, without leases, as Sweep.Pass
// does, and returns the Stats of each and their total: counts added,
// Duration the whole call's, MaxLag the largest, NextDue the earliest,
// BatchSize zero. A failing shard does not stop the others; the error
// joins every failure.
func (s *Sharded) Pass(ctx context.Context) (total Stats, shards []Stats, err error) {
	if err := s.configured("Pass"); err != nil {
		return Stats{}, nil, err
	}
	s.setBudget()
	clock := s.shards[0].clock
	start := clock.Now()
	shards = make([]Stats, len(s.shards))
	var errs []error
	for i, sw := range s.shards {
		st, err := sw.Pass(ctx)
		shards[i] = st
		if err != nil {
			if ctx.Err() != nil {
				errs = []error{ctx.Err()}
				break
			}
			errs = append(errs, fmt.Errorf("shard %d: %w", i, err))
		}
	}
	total = sumStats(shards)
	total.Duration = max(clock.Now().Sub(start), 0)
	return total, shards, errors.Join(errs...)
}

// sumStats adds up the Stats of shards (see Sharded.Pass).
func sumStats(shards []Stats) Stats {
	var t Stats
	for _, st := range shards {
		c := st.counts()
		t = Stats{
			Scanned: t.Scanned + c.Scanned, Cleared: t.Cleared + c.Cleared, Failed: t.Failed + c.Failed,
			Retried: t.Retried + c.Retried, Parked: t.Parked + c.Parked, Deferred: t.Deferred + c.Deferred,
			Malformed: t.Malformed + c.Malformed, Foreign: t.Foreign + c.Foreign, LiveAgain: t.LiveAgain + c.LiveAgain,
			Duplicates: t.Duplicates + c.Duplicates, Held: t.Held + c.Held, Gone: t.Gone + c.Gone,
			WouldClear: t.WouldClear + c.WouldClear, ScanCalls: t.ScanCalls + c.ScanCalls,
			DeleteCalls: t.DeleteCalls + c.DeleteCalls, PutCalls: t.PutCalls + c.PutCalls, ClearCalls: t.ClearCalls + c.ClearCalls,
			FailedCalls: t.FailedCalls + c.FailedCalls, TimedOutCalls: t.TimedOutCalls + c.TimedOutCalls,
			PanickedCalls: t.PanickedCalls + c.PanickedCalls, BudgetWait: t.BudgetWait + c.BudgetWait,
			Duration: t.Duration + st.Duration,
			MaxLag:   max(t.MaxLag, st.MaxLag),
			NextDue:  earliest(t.NextDue, st.NextDue),
		}
	}
	return t
}

// Backlog tells how far behind each shard is, as Sweep.Backlog does with
// limit (1 to MaxPageSize) per shard, and the total: counts added, the
// oldest late entity of all shards, the largest RetryingAge, More if any
// shard's. It reads every shard: four Scans of each range per shard at
// most. The error joins the shards' failures; their Backlogs are zero.
func (s *Sharded) Backlog(ctx context.Context, limit int) (total Backlog, shards []Backlog, err error) {
	if err := s.configured("Backlog"); err != nil {
		return Backlog{}, nil, err
	}
	shards = make([]Backlog, len(s.shards))
	var errs []error
	for i, sw := range s.shards {
		b, err := sw.Backlog(ctx, limit)
		if err != nil {
			if ctx.Err() != nil {
				return Backlog{}, nil, ctx.Err()
			}
			errs = append(errs, fmt.Errorf("shard %d: %w", i, err))
			continue
		}
		shards[i] = b
		total.Due += b.Due
		total.Retrying += b.Retrying
		total.Held += b.Held
		total.Parked += b.Parked
		total.More = total.More || b.More
		total.RetryingAge = max(total.RetryingAge, b.RetryingAge)
		if b.OldestID != "" && (total.OldestID == "" || b.OldestDue.Before(total.OldestDue)) {
			total.OldestID, total.OldestDue, total.Age = b.OldestID, b.OldestDue, b.Age
		}
	}
	return total, shards, errors.Join(errs...)
}

// Pending lists up to limit (1 to MaxPageSize) markers of all shards that
// are not cleared though their entity fell due, as Sweep.Pending does, the
// longest past due first; Shard(m.ID) says whose each is. It reads every
// shard.
func (s *Sharded) Pending(ctx context.Context, limit int) ([]PendingMarker, error) {
	if err := s.configured("Pending"); err != nil {
		return nil, err
	}
	var out []PendingMarker
	for i, sw := range s.shards {
		ms, err := sw.Pending(ctx, limit)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
		out = append(out, ms...)
	}
	slices.SortStableFunc(out, func(a, b PendingMarker) int { return a.Due.Compare(b.Due) })
	return out[:min(len(out), limit)], nil
}

// setBudget gives this process its part of the fleet's budget: the fleet's
// limit and burst times the shards it sweeps over all shards, the burst
// rounded up and at least 1 (replicas that each had the fleet's burst
// spent it several times over when a backlog fell due at once). A change
// of Config.Limiter takes effect at the next call.
func (s *Sharded) setBudget() {
	if s.budget == nil {
		return
	}
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	lim, b := s.fleetBudget.Limit(), s.fleetBudget.Burst()
	if lim != rate.Inf {
		held, n := int(s.sweeping.Load()), len(s.shards)
		lim = lim * rate.Limit(held) / rate.Limit(n)
		b = max(1, (b*held+n-1)/n)
	}
	if s.budget.Limit() != lim {
		s.budget.SetLimit(lim)
	}
	if s.budget.Burst() != b {
		s.budget.SetBurst(b)
	}
}

// Run sweeps the shards until ctx is done, then returns ctx.Err().
//
// With ShardConfig.Lease, Run shares the shards out with the replicas that
// run the same sweep over the same store: every Heartbeat it writes this
// replica's key (under the prefix, outside every range a sweep reads) and
// reads the others', takes free shards while it holds fewer than its
// share (Shards / live replicas, rounded down, then up), and gives up the
// shards above it while another replica holds fewer, each after the page
// under way, so that every replica ends up within one of the even share. A
// shard it holds it sweeps as Sweep.Run does under the shard's lease:
// fenced, a pass at once when taken, given up when lost. The shards of a
// replica that stopped are taken within two Heartbeats, those of one that
// died or froze within the lease's TTL and a Heartbeat (see
// ShardConfig.Heartbeat). A Config.Limiter is the budget of the whole
// fleet: this replica spends the part of it of the shards it holds.
//
// Without a Lease, Run sweeps every shard, each as Sweep.Run does, and
// spends the whole budget. Run releases every lease it holds and leaves no
// goroutine behind when it returns; while another Run runs one of its
// shards, it returns an error matching ErrRunning at once. A panic of
// Config.OnPass or Config.Observer reaches the caller of Run, as from
// Sweep.Run, once the leases are released.
func (s *Sharded) Run(ctx context.Context) error {
	if err := s.configured("Run"); err != nil {
		return err
	}
	var releases []func()
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	for _, l := range s.loops {
		r, err := l.claim()
		if err != nil {
			return err
		}
		releases = append(releases, r)
	}
	if s.loops[0].locker == nil {
		return s.runAll(ctx)
	}
	return s.balance(ctx)
}

// runAll runs every shard's loop, without leases, until ctx is done.
func (s *Sharded) runAll(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		panicked atomic.Pointer[caughtPanic]
	)
	for _, l := range s.loops {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					panicked.CompareAndSwap(nil, &caughtPanic{value: r})
					cancel()
				}
			}()
			_ = l.run(ctx) // without a lease, it ends when ctx does
		})
	}
	t := time.NewTicker(s.heartbeat)
	defer t.Stop()
	for ctx.Err() == nil {
		s.setBudget()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	wg.Wait()
	if p := panicked.Load(); p != nil {
		panic(p.value) // as Sweep.Run lets a panic of OnPass or the Observer through
	}
	return ctx.Err()
}
