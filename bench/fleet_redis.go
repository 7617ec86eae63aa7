package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/rediskv"
)

// ClusterFleet is the sharded-fleet measure's Redis Cluster store, the
// layout of rediskv's newClusterSweep example: shard i's markers in the
// set <tag>:done and its lease in <tag>:lease, tag the i-th of
// rediskv.ShardTags(name, shards), so that each shard lives on the master
// of its tag's slot; the replicas' keys in a set of their own,
// {<name>}:replicas. Each replica gets a cluster client of its own.
// Create it with NewClusterFleet.
type ClusterFleet struct {
	admin *redis.ClusterClient
	addrs []string
	ttl   time.Duration
}

// NewClusterFleet returns the store on the cluster of addrs; admin, a
// client of it, writes the backlogs and deletes them. ttl is the leases'.
func NewClusterFleet(admin *redis.ClusterClient, addrs []string, ttl time.Duration) *ClusterFleet {
	return &ClusterFleet{admin: admin, addrs: addrs, ttl: ttl}
}

// Name implements FleetStore.
func (*ClusterFleet) Name() string { return "Redis Cluster" }

// Open implements FleetStore: a name of its own, so tags of its own.
func (c *ClusterFleet) Open(_ context.Context, shards int) (FleetSweep, error) {
	name := fmt.Sprintf("bench-fleet-%d-%d", os.Getpid(), rand.Uint32())
	tags, err := rediskv.ShardTags(name, shards)
	if err != nil {
		return nil, err
	}
	return &clusterFleetSweep{c: c, name: name, tags: tags}, nil
}

type clusterFleetSweep struct {
	c    *ClusterFleet
	name string
	tags []string
}

// Fill implements FleetSweep: ZADDs of a thousand members, pipelined.
func (s *clusterFleetSweep) Fill(ctx context.Context, prefix string, n int, at time.Time) error {
	kv, err := rediskv.New(s.c.admin, "{"+s.name+"}:replicas")
	if err != nil {
		return err
	}
	writer, err := fleetWriter(kv, len(s.tags))
	if err != nil {
		return err
	}
	byShard := make([][]redis.Z, len(s.tags))
	for i := range n {
		id := fleetID(i)
		key, err := writer.MarkerKey(at.Add(time.Duration(i)*time.Microsecond), id)
		if err != nil {
			return err
		}
		sh := writer.Shard(id)
		byShard[sh] = append(byShard[sh], redis.Z{Score: 0, Member: string(key)})
	}
	_, err = s.c.admin.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh, zs := range byShard {
			for chunk := range slices.Chunk(zs, 1000) {
				p.ZAdd(ctx, s.tags[sh]+":done", chunk...)
			}
		}
		return nil
	})
	return err
}

// Replica implements FleetSweep.
func (s *clusterFleetSweep) Replica(_ context.Context, cfg retention.Config, sc retention.ShardConfig) (*retention.Sharded, func(), error) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.c.addrs})
	replicas, err := rediskv.New(rdb, "{"+s.name+"}:replicas")
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	sc.KV = func(shard int, _ string) (retention.KV, error) {
		return rediskv.New(rdb, s.tags[shard]+":done")
	}
	sc.Lease = func(shard int, _ string) (retention.Locker, error) {
		return rediskv.NewLocker(rdb, s.tags[shard]+":lease", &rediskv.LockerOptions{TTL: s.c.ttl})
	}
	sh, err := retention.NewSharded(replicas, cfg, sc)
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return sh, func() { _ = rdb.Close() }, nil
}

// Left implements FleetSweep with a ZLEXCOUNT per shard.
func (s *clusterFleetSweep) Left(ctx context.Context, prefix string) ([]int, error) {
	left := make([]int, len(s.tags))
	for i, tag := range s.tags {
		lo, hi := shardMarkers(prefix, i)
		n, err := s.c.admin.ZLexCount(ctx, tag+":done", "["+string(lo), "("+string(hi)).Result()
		if err != nil {
			return nil, err
		}
		left[i] = int(n)
	}
	return left, nil
}

// Close implements FleetSweep.
func (s *clusterFleetSweep) Close(ctx context.Context) error {
	_, err := s.c.admin.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Unlink(ctx, "{"+s.name+"}:replicas")
		for _, tag := range s.tags {
			p.Unlink(ctx, tag+":done", tag+":lease")
		}
		return nil
	})
	return err
}

// MasterMemory is what one master of a Redis Cluster holds of a sharded
// sweep's markers.
type MasterMemory struct {
	Addr    string
	Shards  int   // the sweep's shards whose tag's slot it serves
	Markers int   // their markers (ZCARD)
	Bytes   int64 // their sets' MEMORY USAGE, every member sampled (SAMPLES 0)
	Used    int64 // its INFO used_memory after the markers were written less before
}

// ClusterMarkerMemory writes n markers of a sharded sweep of shards
// shards on the cluster of store, as Fill does for the fleet, reads what
// each master holds of them, and deletes them.
func ClusterMarkerMemory(ctx context.Context, store *ClusterFleet, shards, n int) ([]MasterMemory, error) {
	owners, err := clusterMasters(ctx, store.admin)
	if err != nil {
		return nil, err
	}
	before, err := usedMemory(ctx, store.admin)
	if err != nil {
		return nil, err
	}
	sw, err := store.Open(ctx, shards)
	if err != nil {
		return nil, err
	}
	s := sw.(*clusterFleetSweep)
	defer func() { _ = s.Close(context.WithoutCancel(ctx)) }()
	if err := s.Fill(ctx, fleetPrefix, n, time.Now().Add(-48*time.Hour)); err != nil {
		return nil, err
	}
	after, err := usedMemory(ctx, store.admin)
	if err != nil {
		return nil, err
	}
	per := map[string]*MasterMemory{}
	for addr := range before {
		per[addr] = &MasterMemory{Addr: addr, Used: after[addr] - before[addr]}
	}
	for _, tag := range s.tags {
		addr := owners[rediskv.Slot(tag)]
		m := per[addr]
		if m == nil {
			return nil, fmt.Errorf("slot %d of %s: its master %q is not among %v", rediskv.Slot(tag), tag, addr, before)
		}
		markers, err := store.admin.ZCard(ctx, tag+":done").Result()
		if err != nil {
			return nil, err
		}
		bytes, err := store.admin.MemoryUsage(ctx, tag+":done", 0).Result()
		if err != nil {
			return nil, err
		}
		m.Shards++
		m.Markers += int(markers)
		m.Bytes += bytes
	}
	out := make([]MasterMemory, 0, len(per))
	for _, m := range per {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b MasterMemory) int { return strings.Compare(a.Addr, b.Addr) })
	return out, nil
}

// clusterMasters returns the master that serves each slot, by CLUSTER
// SHARDS.
func clusterMasters(ctx context.Context, rdb *redis.ClusterClient) (map[int]string, error) {
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	owners := map[int]string{}
	for _, sh := range shards {
		for _, node := range sh.Nodes {
			if node.Role != "master" {
				continue
			}
			addr := net.JoinHostPort(node.IP, strconv.FormatInt(node.Port, 10))
			for _, r := range sh.Slots {
				for slot := r.Start; slot <= r.End; slot++ {
					owners[int(slot)] = addr
				}
			}
		}
	}
	return owners, nil
}

// usedMemory returns each master's INFO used_memory, once it has no
// object of an UNLINK left to free (lazyfree_pending_objects 0; 5 s at
// most): the sets of the cells before are freed in the background.
func usedMemory(ctx context.Context, rdb *redis.ClusterClient) (map[string]int64, error) {
	var mu sync.Mutex
	out := map[string]int64{}
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		for deadline := time.Now().Add(5 * time.Second); ; {
			info, err := m.InfoMap(ctx, "memory").Result()
			if err != nil {
				return err
			}
			fields := info["Memory"]
			if fields["lazyfree_pending_objects"] != "0" && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			n, err := strconv.ParseInt(fields["used_memory"], 10, 64)
			if err != nil {
				return fmt.Errorf("%s: used_memory: %w", m.Options().Addr, err)
			}
			mu.Lock()
			out[m.Options().Addr] = n
			mu.Unlock()
			return nil
		}
	})
	return out, err
}
