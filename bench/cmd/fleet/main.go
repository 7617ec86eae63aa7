// Command fleet runs the sharded-fleet measure: a retention.Sharded sweep
// of 16 shards run by 1, 2 and 4 replicas over a backlog of expired
// markers, on PostgreSQL (every shard a prefix of one pgkv marker table,
// each shard's lease a pgkv.Locker row) and on a Redis Cluster of three
// masters (each shard's set and lease on the slot of its
// rediskv.ShardTags tag). Every replica runs in this process with a client
// and a Sharded of its own, under its own Config.Replica; its Clear waits
// 2 ms and does nothing else, so what it models is I/O, not CPU, and the
// two cores the replicas share are not what limits them until the
// sweeps' own work fills them.
//
// It measures, in rounds whose order of cells is rotated each round (the
// cells compared with each other one after the other):
//
//   - entities cleared a second at each number of replicas, each replica
//     with the same Config.Concurrency, and the median of the same-round
//     ratios to one replica; under two capacities of a replica: "replica"
//     (each replica's Clear first takes one of -concurrency slots of its
//     own, a client pool's worth of I/O: a replica has that many clears in
//     flight whatever the shards it holds) and "shard" (Config.Concurrency
//     alone, which a Sharded gives each shard: a replica holding k shards
//     has k × -concurrency in flight);
//   - with a fleet budget (Config.Limiter, -budget a second, by default
//     60% of the median rate of one replica of the first capacity, so
//     that the budget and not the replica sets the rate at 1 replica too),
//     the rate the fleet reached at 1 and at 4 replicas, against it;
//   - on the cluster, the bytes each master holds of the markers (MEMORY
//     USAGE of each shard's set, SAMPLES 0, summed per master, and the
//     masters' used_memory growth) against an even third, at 16 shards
//     and at -memory-shards.
//
// Each rate is counted between two instants: from two Heartbeats after
// every shard is held, each replica within one of the even share (the
// balancing warm-up left out), for -window. A cell fails if a shard ran
// out of markers in it. Run it through the test script, which starts the
// servers:
//
//	./scripts/test --exec ./scripts/bench fleet
//	./scripts/test --exec ./scripts/bench fleet -quick
//
// It reads RETENTION_POSTGRES_DSN and RETENTION_REDIS_CLUSTER.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention/bench"
)

// options are the command's flags.
type options struct {
	stores       []string
	replicas     []int
	capacities   []string
	shards       int
	concurrency  int
	clear        time.Duration
	window       time.Duration
	rounds       int
	budget       float64
	budgetShare  float64
	budgetReps   []int
	heartbeat    time.Duration
	ttl          time.Duration
	memShards    []int
	memMarkers   int
	pageSize     int
	backlogFloor int
}

func main() {
	var o options
	stores := flag.String("stores", "pg,cluster", "comma-separated stores: pg (PostgreSQL), cluster (Redis Cluster)")
	replicas := flag.String("replicas", "1,2,4", "comma-separated numbers of replicas; the first is the ratios' base")
	capacities := flag.String("capacity", "replica,shard", "comma-separated capacities of a replica: replica (-concurrency clears in flight a replica), shard (Config.Concurrency a shard)")
	flag.IntVar(&o.shards, "shards", 16, "ShardConfig.Shards")
	flag.IntVar(&o.concurrency, "concurrency", 4, "Config.Concurrency of every replica, and with -capacity replica its clears in flight")
	flag.DurationVar(&o.clear, "clear", 2*time.Millisecond, "how long Clear waits")
	flag.DurationVar(&o.window, "window", 5*time.Second, "the measured window of each cell")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of every cell")
	flag.Float64Var(&o.budget, "budget", 0, "the fleet budget, entities a second; 0: -budget-share of one replica's median rate")
	flag.Float64Var(&o.budgetShare, "budget-share", 0.6, "with -budget 0, the budget as a share of one replica's median rate under the first -capacity")
	budgetReps := flag.String("budget-replicas", "1,4", "comma-separated numbers of replicas under the budget; empty: no budget cells")
	flag.DurationVar(&o.heartbeat, "heartbeat", 250*time.Millisecond, "ShardConfig.Heartbeat")
	flag.DurationVar(&o.ttl, "ttl", 3*time.Second, "the shards' leases' TTL")
	memShards := flag.String("memory-shards", "16,24,48", "comma-separated numbers of shards whose markers' memory is read on the cluster; empty: none")
	flag.IntVar(&o.memMarkers, "memory-markers", 48_000, "markers written for each memory reading")
	flag.IntVar(&o.pageSize, "page", 0, "Config.PageSize; 0: the default")
	flag.IntVar(&o.backlogFloor, "backlog", 20_000, "the fewest markers a cell writes; more when its rate needs them")
	quick := flag.Bool("quick", false, "unless set otherwise: one round, windows of 3s, the memory at 16 shards only (about 2 minutes)")
	flag.Parse()
	log.SetFlags(0)
	if *quick { // short of what the command line sets
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rounds"] {
			o.rounds = 1
		}
		if !set["window"] {
			o.window = 3 * time.Second
		}
		if !set["memory-shards"] {
			*memShards = "16"
		}
	}
	var err error
	o.stores = strings.Split(*stores, ",")
	o.capacities = strings.Split(*capacities, ",")
	if o.replicas, err = ints(*replicas); err != nil {
		log.Fatalf("-replicas: %v", err)
	}
	if o.budgetReps, err = ints(*budgetReps); err != nil {
		log.Fatalf("-budget-replicas: %v", err)
	}
	if o.memShards, err = ints(*memShards); err != nil {
		log.Fatalf("-memory-shards: %v", err)
	}
	for _, c := range o.capacities {
		if c != "replica" && c != "shard" {
			log.Fatalf("-capacity: %q is neither replica nor shard", c)
		}
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// cell is one configuration the rounds repeat.
type cell struct {
	capacity string // replica or shard; "" under a budget
	replicas int
	budget   float64
}

// inFlight is the most clears the cell's fleet has in flight at once.
func (c cell) inFlight(o options) int {
	if c.capacity == "replica" {
		return o.concurrency * c.replicas
	}
	return o.concurrency * o.shards
}

// label names a cell's run as a benchmark would be named:
// Fleet/PostgreSQL/capacity=replica/replicas=4/round=2.
func (c cell) label(store string, round int) string {
	kind := "capacity=" + c.capacity
	if c.budget > 0 {
		kind = fmt.Sprintf("budget=%.0f", c.budget)
	}
	return fmt.Sprintf("Fleet/%s/%s/replicas=%d/round=%d", strings.ReplaceAll(store, " ", ""), kind, c.replicas, round)
}

// results are a store's figures: by cell, one per round.
type results struct {
	store  string
	cells  []cell
	rates  map[cell][]float64
	sleeps map[cell][]time.Duration
	loads  []float64
	memory map[int][]bench.MasterMemory // by shards
	budget float64
}

func run(o options) error {
	ctx := context.Background()
	fmt.Printf("%d CPUs, %s, load %s. Sharded sweeps of %d shards, Clear waits %v (time.Sleep, nothing else), Config.Concurrency %d, "+
		"Heartbeat %v, lease TTL %v, Retention %v, markers only; every replica in this process with a client of its own; "+
		"each rate counted over %v from two Heartbeats after every shard is held, each replica within one of even; %d rounds, cells rotated.\n\n",
		runtime.NumCPU(), runtime.Version(), bench.LoadAvg(), o.shards, o.clear, o.concurrency, o.heartbeat, o.ttl, bench.Retention,
		o.window, o.rounds)
	var all []*results
	for _, name := range o.stores {
		store, closeStore, err := openStore(ctx, name, o.ttl)
		if err != nil {
			return err
		}
		res, err := measure(ctx, o, store)
		if err == nil && name == "cluster" {
			res.memory = map[int][]bench.MasterMemory{}
			for _, n := range o.memShards {
				m, merr := bench.ClusterMarkerMemory(ctx, store.(*bench.ClusterFleet), n, o.memMarkers)
				if merr != nil {
					err = fmt.Errorf("memory at %d shards: %w", n, merr)
					break
				}
				res.memory[n] = m
				log.Printf("%s, %d shards: %s", store.Name(), n, memoryLine(m))
			}
		}
		closeStore()
		if err != nil {
			return fmt.Errorf("%s: %w", store.Name(), err)
		}
		all = append(all, res)
	}
	report(o, all)
	return nil
}

func openStore(ctx context.Context, name string, ttl time.Duration) (bench.FleetStore, func(), error) {
	switch name {
	case "pg":
		dsn := os.Getenv("RETENTION_POSTGRES_DSN")
		if dsn == "" {
			return nil, nil, fmt.Errorf("RETENTION_POSTGRES_DSN is not set: run through ./scripts/test --exec ./scripts/bench fleet")
		}
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, nil, err
		}
		var version string
		if err := pool.QueryRow(ctx, `SELECT current_setting('server_version') || ', fsync ' || current_setting('fsync')`).Scan(&version); err != nil {
			pool.Close()
			return nil, nil, err
		}
		log.Printf("PostgreSQL %s", version)
		return bench.NewPGFleet(pool, dsn, ttl), pool.Close, nil
	case "cluster":
		addrs := os.Getenv("RETENTION_REDIS_CLUSTER")
		if addrs == "" {
			return nil, nil, fmt.Errorf("RETENTION_REDIS_CLUSTER is not set: run through ./scripts/test --exec ./scripts/bench fleet")
		}
		list := strings.Split(addrs, ",")
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: list})
		info, err := rdb.InfoMap(ctx, "server").Result()
		if err != nil {
			_ = rdb.Close()
			return nil, nil, err
		}
		log.Printf("Redis %s, a cluster of %s", info["Server"]["redis_version"], addrs)
		return bench.NewClusterFleet(rdb, list, ttl), func() { _ = rdb.Close() }, nil
	}
	return nil, nil, fmt.Errorf("-stores: %q is neither pg nor cluster", name)
}

// measure runs the rounds of every capacity and number of replicas, then
// those of the budget, on store.
func measure(ctx context.Context, o options, store bench.FleetStore) (*results, error) {
	res := &results{store: store.Name(), rates: map[cell][]float64{}, sleeps: map[cell][]time.Duration{}}
	var groups [][]cell
	for _, c := range o.capacities {
		var group []cell
		for _, r := range o.replicas {
			group = append(group, cell{capacity: c, replicas: r})
		}
		groups = append(groups, group)
		res.cells = append(res.cells, group...)
	}
	if err := rounds(ctx, o, store, groups, res); err != nil {
		return res, err
	}
	if len(o.budgetReps) == 0 {
		return res, nil
	}
	res.budget = o.budget
	if res.budget == 0 {
		base := cell{capacity: o.capacities[0], replicas: o.replicas[0]}
		res.budget = math.Round(o.budgetShare * median(res.rates[base]))
	}
	var bcells []cell
	for _, r := range o.budgetReps {
		bcells = append(bcells, cell{capacity: o.capacities[0], replicas: r, budget: res.budget})
	}
	if err := rounds(ctx, o, store, [][]cell{bcells}, res); err != nil {
		return res, err
	}
	res.cells = append(res.cells, bcells...)
	return res, nil
}

// rounds runs every cell once a round. The cells of a group, whose rates
// are compared with each other, run one after the other, so that the load
// of the machine, which moves, is much the same for them; round r starts
// with group r mod len(groups), and each group with its cell r mod its
// length, so that each runs early and late alike.
func rounds(ctx context.Context, o options, store bench.FleetStore, groups [][]cell, res *results) error {
	for r := range o.rounds {
		var cells []cell
		for g := range groups {
			group := groups[(r+g)%len(groups)]
			for k := range group {
				cells = append(cells, group[(r+k)%len(group)])
			}
		}
		for _, c := range cells {
			cfg := bench.Fleet{
				Replicas: c.replicas, Shards: o.shards, Concurrency: o.concurrency,
				ClearTime: o.clear, PageSize: o.pageSize, Window: o.window, Heartbeat: o.heartbeat, TTL: o.ttl,
			}
			if c.capacity == "replica" {
				cfg.Slots = o.concurrency
			}
			// What the cell could clear at most, over the warm-up and the
			// window, with room to spare.
			most := float64(c.inFlight(o)) / o.clear.Seconds()
			if c.budget > 0 {
				cfg.Budget = c.budget
				cfg.Burst = max(1, int(c.budget/20)) // 50 ms of it
				most = min(most, c.budget)
			}
			warm := 12*o.heartbeat + time.Second
			cfg.Backlog = max(o.backlogFloor, int(1.5*most*(o.window+warm).Seconds()))
			label := c.label(store.Name(), r+1)
			fr, err := bench.RunFleet(ctx, store, cfg, func(s string) { log.Printf("%s: %s", label, s) })
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			res.rates[c] = append(res.rates[c], fr.Rate)
			res.sleeps[c] = append(res.sleeps[c], fr.Sleep)
			res.loads = append(res.loads, fr.Load)
			// One line a cell, as go test -bench prints a benchmark with
			// its ReportMetric units.
			log.Printf("%s\t%d\t%.0f entities/s\t%.3f ms/clear\t%v held\t%d lease-moves\t%.2f s-to-balance\t%d min-left\t%.2f load",
				label, fr.Cleared, fr.Rate, float64(fr.Sleep)/1e6, fr.Held, fr.Moves, fr.Balanced.Seconds(), fr.MinLeft, fr.Load)
		}
	}
	return nil
}

func report(o options, all []*results) {
	fmt.Println("| store | a replica's capacity | replicas | entities/s (median) | × 1 replica | of the bound | rounds | Clear's wait |")
	fmt.Println("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |")
	for _, res := range all {
		for _, c := range res.cells {
			if c.budget > 0 {
				continue
			}
			base := cell{capacity: c.capacity, replicas: o.replicas[0]}
			var ratios, ofBound []float64
			for i, r := range res.rates[c] {
				if i < len(res.rates[base]) && res.rates[base][i] > 0 {
					ratios = append(ratios, r/res.rates[base][i])
				}
				// The bound: clears in flight over the time each waited.
				if w := res.sleeps[c][i]; w > 0 {
					ofBound = append(ofBound, r*w.Seconds()/float64(c.inFlight(o)))
				}
			}
			capacity := fmt.Sprintf("%d clears in flight", o.concurrency)
			if c.capacity == "shard" {
				capacity = fmt.Sprintf("Concurrency %d a shard (%d in flight in all)", o.concurrency, o.concurrency*o.shards)
			}
			fmt.Printf("| %s | %s | %d | %s | %.2f× | %.1f%% | %s | %v |\n", res.store, capacity, c.replicas, commas(median(res.rates[c])),
				median(ratios), 100*median(ofBound), rateList(res.rates[c]), medianDuration(res.sleeps[c]).Round(time.Microsecond))
		}
	}
	fmt.Println()
	fmt.Println("× 1 replica: the median of the same-round ratios. Of the bound: the rate over clears in flight ÷ the mean time a Clear waited (2 ms as the timer kept it), median of the rounds.")
	fmt.Println()
	if len(o.budgetReps) > 0 {
		for _, res := range all {
			if res.budget > 0 && o.budget == 0 {
				base := cell{capacity: o.capacities[0], replicas: o.replicas[0]}
				fmt.Printf("%s: budget %s/s, %.0f%% of the median rate of %d replica (capacity a %s), %s/s.\n", res.store, commas(res.budget),
					100*o.budgetShare, base.replicas, base.capacity, commas(median(res.rates[base])))
			}
		}
		fmt.Println()
		fmt.Println("| store | fleet budget | replicas | entities/s (median) | vs budget (median) | rounds (vs budget) |")
		fmt.Println("| --- | ---: | ---: | ---: | ---: | --- |")
		for _, res := range all {
			for _, c := range res.cells {
				if c.budget == 0 {
					continue
				}
				var dev []string
				for _, r := range res.rates[c] {
					dev = append(dev, fmt.Sprintf("%+.1f%%", 100*(r/c.budget-1)))
				}
				m := median(res.rates[c])
				fmt.Printf("| %s | %s/s | %d | %s | %+.1f%% | %s |\n", res.store, commas(c.budget), c.replicas, commas(m),
					100*(m/c.budget-1), strings.Join(dev, ", "))
			}
		}
		fmt.Println()
	}
	for _, res := range all {
		if len(res.memory) == 0 {
			continue
		}
		fmt.Println("| shards | master | its shards | markers | MEMORY USAGE | vs even | used_memory growth | vs even |")
		fmt.Println("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, n := range slices.Sorted(maps.Keys(res.memory)) {
			ms := res.memory[n]
			var bytes, used int64
			for _, m := range ms {
				bytes += m.Bytes
				used += m.Used
			}
			for _, m := range ms {
				fmt.Printf("| %d | %s | %d | %s | %s | %+.1f%% | %s | %+.1f%% |\n", n, m.Addr, m.Shards, commas(float64(m.Markers)),
					commas(float64(m.Bytes)), 100*(float64(m.Bytes)*float64(len(ms))/float64(bytes)-1),
					commas(float64(m.Used)), 100*(float64(m.Used)*float64(len(ms))/float64(used)-1))
			}
		}
		fmt.Println()
	}
	var loads []float64
	for _, res := range all {
		loads = append(loads, res.loads...)
	}
	if len(loads) > 0 {
		fmt.Printf("Load (1 minute) at the windows' ends: %.2f to %.2f, median %.2f; now %s.\n",
			slices.Min(loads), slices.Max(loads), median(loads), bench.LoadAvg())
	}
}

// memoryLine is a progress line of what each master holds.
func memoryLine(ms []bench.MasterMemory) string {
	var bytes int64
	for _, m := range ms {
		bytes += m.Bytes
	}
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s %d shards %d markers %d bytes (%+.1f%% of even), used_memory +%d",
			m.Addr, m.Shards, m.Markers, m.Bytes, 100*(float64(m.Bytes)*float64(len(ms))/float64(bytes)-1), m.Used))
	}
	return strings.Join(parts, "; ")
}

func rateList(v []float64) string {
	s := make([]string, len(v))
	for i, r := range v {
		s[i] = commas(r)
	}
	return strings.Join(s, ", ")
}

// commas formats v rounded, with thousands separated: 12,345.
func commas(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDuration(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}
