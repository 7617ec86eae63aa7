package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/marksweep/retention"
)

// Fleet is one cell of the sharded-fleet measure: Replicas replicas of one
// retention.Sharded sweep of Shards shards, each with a client and a
// Sharded of its own, under its own Config.Replica, sweep a backlog of
// expired markers under a lease per shard. Their Clear waits ClearTime and
// nothing else, I/O rather than CPU, so the replicas run in this process:
// what they share is the two cores, which a real fleet would not.
//
// The rate is counted between two instants once every shard is held, each
// replica within one of the even share, and two Heartbeats more have
// passed (a replica's share of the budget follows the shards it holds at
// its next Heartbeat): the balancing warm-up is left out.
type Fleet struct {
	Replicas int
	Shards   int

	// Concurrency is the Config.Concurrency of every replica, which a
	// Sharded gives each of its shards' Sweeps: a replica holding k shards
	// has up to k × Concurrency clears in flight.
	Concurrency int

	// Slots, when above 0, is each replica's own I/O capacity: its Clear
	// takes one of Slots before it waits, as calls through a client pool
	// of that size would, so a replica has at most Slots clears in flight
	// whatever the shards it holds. 0 means none.
	Slots int

	ClearTime time.Duration // how long Clear waits: time.Sleep's, which the timer makes a little longer
	Backlog   int           // expired markers written before the replicas start
	PageSize  int           // Config.PageSize; 0 means the default
	Window    time.Duration // the measured window
	Heartbeat time.Duration // ShardConfig.Heartbeat
	TTL       time.Duration // the shards' leases' TTL

	// Budget is the fleet's delete budget, entities a second (the
	// Config.Limiter of every replica, rate.NewLimiter(Budget, Burst)); 0
	// means none.
	Budget float64
	Burst  int
}

// FleetResult is what one Fleet cell measured.
type FleetResult struct {
	Cleared  int64         // clears that returned in the window
	Window   time.Duration // as measured
	Rate     float64       // Cleared / Window, entities a second
	Balanced time.Duration // from the replicas' start to every shard held, each replica within one of even
	Sleep    time.Duration // the mean time a Clear of the window waited, ClearTime as the timer kept it
	Held     []int         // shards each replica held during the window
	Moves    int           // leases acquired, lost or released during the window: 0 when the fleet stayed put
	MinLeft  int           // the fewest markers a shard had left at the window's end: 0 would mean one ran dry
	Load     float64       // the machine's load average over 1 minute at the window's end
}

// A FleetStore is a store the sharded-fleet measure runs on: one
// PostgreSQL marker table (NewPGFleet) or the sets of a Redis Cluster's
// slots (NewClusterFleet).
type FleetStore interface {
	// Name labels the store in results.
	Name() string

	// Open prepares a fresh sweep of shards shards for one cell: its
	// markers, replicas' keys and leases apart from every other cell's.
	Open(ctx context.Context, shards int) (FleetSweep, error)
}

// A FleetSweep is one cell's sweep on a FleetStore.
type FleetSweep interface {
	// Fill writes n markers of entities that finished at and after at,
	// each with the key a writer's Sharded.MarkerKey gives it, in the
	// store of its shard.
	Fill(ctx context.Context, prefix string, n int, at time.Time) error

	// Replica returns a replica's Sharded over a client of its own, made
	// from cfg and sc (their KV and Lease set here), and a func that
	// closes the client.
	Replica(ctx context.Context, cfg retention.Config, sc retention.ShardConfig) (*retention.Sharded, func(), error)

	// Left returns the markers left in each shard.
	Left(ctx context.Context, prefix string) ([]int, error)

	// Close deletes everything the sweep wrote.
	Close(ctx context.Context) error
}

// fleetPrefix is the sweep's prefix; its shards' are fleetPrefix + s007/.
const fleetPrefix = Prefix

// RunFleet runs one cell of the sharded-fleet measure on store: it writes
// the backlog, starts the replicas, waits until they hold every shard
// evenly, counts the clears of the window, stops them and deletes what is
// left. progress, when not nil, gets a line at each step.
func RunFleet(ctx context.Context, store FleetStore, cfg Fleet, progress func(string)) (FleetResult, error) {
	var res FleetResult
	if progress == nil {
		progress = func(string) {}
	}
	if cfg.Replicas < 1 || cfg.Shards < cfg.Replicas {
		return res, fmt.Errorf("fleet: %d replicas over %d shards", cfg.Replicas, cfg.Shards)
	}
	sw, err := store.Open(ctx, cfg.Shards)
	if err != nil {
		return res, err
	}
	defer func() {
		if err := sw.Close(context.WithoutCancel(ctx)); err != nil {
			progress("fleet: cleaning up: " + err.Error())
		}
	}()
	if err := sw.Fill(ctx, fleetPrefix, cfg.Backlog, time.Now().Add(-48*time.Hour)); err != nil {
		return res, fmt.Errorf("fleet: writing the backlog: %w", err)
	}

	w := &fleetWatch{owners: make([]int, cfg.Shards)}
	for i := range w.owners {
		w.owners[i] = -1
	}
	var (
		cleared atomic.Int64
		slept   atomic.Int64 // nanoseconds
	)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg     sync.WaitGroup
		closes []func()
		runErr = make(chan error, cfg.Replicas)
	)
	defer func() {
		stop()
		wg.Wait()
		for _, c := range closes {
			c()
		}
	}()
	started := time.Now()
	for r := range cfg.Replicas {
		var slots chan struct{}
		if cfg.Slots > 0 {
			slots = make(chan struct{}, cfg.Slots)
		}
		rc := retention.Config{
			Prefix:      fleetPrefix,
			Retention:   Retention,
			Replica:     "replica-" + strconv.Itoa(r),
			Concurrency: cfg.Concurrency,
			PageSize:    cfg.PageSize,
			Observer:    fleetReplicaWatch{w: w, replica: r},
			Logger:      slog.New(slog.DiscardHandler),
			Clear: func(ctx context.Context, _ string) error {
				if slots != nil {
					select {
					case slots <- struct{}{}:
						defer func() { <-slots }()
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				start := time.Now()
				t := time.NewTimer(cfg.ClearTime)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return ctx.Err()
				}
				slept.Add(int64(time.Since(start)))
				cleared.Add(1)
				return nil
			},
		}
		if cfg.Budget > 0 {
			rc.Limiter = rate.NewLimiter(rate.Limit(cfg.Budget), max(cfg.Burst, 1))
		}
		s, closeReplica, err := sw.Replica(ctx, rc, retention.ShardConfig{Shards: cfg.Shards, Heartbeat: cfg.Heartbeat})
		if err != nil {
			return res, fmt.Errorf("fleet: replica %d: %w", r, err)
		}
		closes = append(closes, closeReplica)
		wg.Go(func() {
			if err := s.Run(runCtx); !errors.Is(err, context.Canceled) {
				runErr <- fmt.Errorf("fleet: replica %d's Run: %w", r, err)
			}
		})
	}

	// The warm-up: replicas take shards from their second Heartbeat.
	limit := 10*cfg.Heartbeat + 2*cfg.TTL
	for !w.balanced(cfg.Replicas) {
		if time.Since(started) > limit {
			return res, fmt.Errorf("fleet: %d replicas not balanced after %v: shards held %v", cfg.Replicas, limit, w.counts(cfg.Replicas))
		}
		select {
		case err := <-runErr:
			return res, err
		case <-time.After(10 * time.Millisecond):
		}
	}
	res.Balanced = time.Since(started)
	progress(fmt.Sprintf("balanced after %v: %v", res.Balanced.Round(time.Millisecond), w.counts(cfg.Replicas)))
	time.Sleep(2 * cfg.Heartbeat)

	moves0 := w.moves.Load()
	c0, s0 := cleared.Load(), slept.Load()
	t0 := time.Now()
	select {
	case err := <-runErr:
		return res, err
	case <-time.After(cfg.Window):
	}
	c1, s1 := cleared.Load(), slept.Load()
	res.Window = time.Since(t0)
	res.Moves = int(w.moves.Load() - moves0)
	res.Held = w.counts(cfg.Replicas)
	res.Load = load1()
	res.Cleared = c1 - c0
	res.Rate = float64(res.Cleared) / res.Window.Seconds()
	if res.Cleared > 0 {
		res.Sleep = time.Duration((s1 - s0) / res.Cleared)
	}
	left, err := sw.Left(ctx, fleetPrefix)
	if err != nil {
		return res, fmt.Errorf("fleet: counting the markers left: %w", err)
	}
	res.MinLeft = left[0]
	for _, n := range left {
		res.MinLeft = min(res.MinLeft, n)
	}
	if res.MinLeft == 0 {
		return res, fmt.Errorf("fleet: a shard ran out of markers in the window (left %v): raise the backlog above %d", left, cfg.Backlog)
	}
	return res, nil
}

// fleetWatch follows, from the replicas' Observers, which replica holds
// each shard's lease.
type fleetWatch struct {
	mu     sync.Mutex
	owners []int // by shard: the replica that took its lease last, -1 once given up
	moves  atomic.Int64
}

// balanced reports whether every shard is held, each of the replicas
// holding the even share rounded down or up.
func (w *fleetWatch) balanced(replicas int) bool {
	lo := len(w.owners) / replicas
	hi := (len(w.owners) + replicas - 1) / replicas
	held := 0
	for _, c := range w.counts(replicas) {
		if c < lo || c > hi {
			return false
		}
		held += c
	}
	return held == len(w.owners)
}

func (w *fleetWatch) counts(replicas int) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := make([]int, replicas)
	for _, o := range w.owners {
		if o >= 0 {
			c[o]++
		}
	}
	return c
}

// fleetReplicaWatch is one replica's Observer.
type fleetReplicaWatch struct {
	w       *fleetWatch
	replica int
}

func (fleetReplicaWatch) ObservePass(string, retention.Stats, error) {}
func (fleetReplicaWatch) ObserveLags(string, []time.Duration)        {}
func (fleetReplicaWatch) ObservePage(string, retention.Stats)        {}

func (o fleetReplicaWatch) ObserveLease(prefix string, e retention.LeaseEvent) {
	shard, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(prefix, fleetPrefix+"s"), "/"))
	if err != nil {
		return
	}
	o.w.mu.Lock()
	defer o.w.mu.Unlock()
	switch e {
	case retention.LeaseAcquired:
		o.w.owners[shard] = o.replica
		o.w.moves.Add(1)
	case retention.LeaseLost, retention.LeaseReleased:
		if o.w.owners[shard] == o.replica {
			o.w.owners[shard] = -1
		}
		o.w.moves.Add(1)
	}
}

// shardMarkers returns the bounds of the markers of shard i of prefix:
// its keys whose next byte is a digit (a marker's time), not the fleet's
// own keys beside them.
func shardMarkers(prefix string, i int) (lower, upper []byte) {
	p := retention.ShardPrefix(prefix, i)
	return []byte(p + "0"), []byte(p + ":")
}

// fleetWriter returns a Sharded for writers' MarkerKey: no lease, no clear
// ever called.
func fleetWriter(kv retention.KV, shards int) (*retention.Sharded, error) {
	return retention.NewSharded(kv, retention.Config{
		Prefix: fleetPrefix, Retention: Retention,
		Clear: func(context.Context, string) error { return errors.New("bench: the writer's Sharded does not sweep") },
	}, retention.ShardConfig{Shards: shards})
}

// fleetID is the id of the i-th entity of a backlog.
func fleetID(i int) string { return fmt.Sprintf("job-%08d", i) }

// LoadAvg returns the machine's load average over 1, 5 and 15 minutes, or
// "?".
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// load1 returns the machine's load average over 1 minute, or -1.
func load1() float64 {
	if v, err := strconv.ParseFloat(strings.Fields(LoadAvg() + " ?")[0], 64); err == nil {
		return v
	}
	return -1
}
