package rediskv_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/rediskv"
)

// proofLeaseKey is the lease key of the process proofs for the marker set
// key: the same hash tag, as on a cluster it must have.
func proofLeaseKey(markers string) string {
	return markers[:strings.IndexByte(markers, '}')+1] + ":lease"
}

// proofJobKey is the WithStateKeys template of the jobs of TestProcessesAtomic
// for the marker set key: the same hash tag.
func proofJobKey(markers string) string {
	return markers[:strings.IndexByte(markers, '}')+1] + ":job:<id>"
}

// connectReplica connects a replica process of TestProcesses: store is the
// marker set's key, or for TestProcessesAtomic "markers,atomic": then the
// replica clears with an AtomicKV of WithStateKeys, a RunClearer, that
// deletes each job's key (proofJobKey) in the script that removes its
// marker.
func connectReplica(_ context.Context, addr, store string, ttl time.Duration) (retention.KV, retention.Locker, func(), error) {
	markers, atomic := strings.CutSuffix(store, ",atomic")
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
	kv, err := rediskv.New(rdb, markers)
	if err != nil {
		rdb.Close()
		return nil, nil, nil, err
	}
	locker, err := rediskv.NewLocker(rdb, proofLeaseKey(markers), &rediskv.LockerOptions{TTL: ttl})
	if err != nil {
		rdb.Close()
		return nil, nil, nil, err
	}
	if !atomic {
		return kv, locker, func() { _ = rdb.Close() }, nil
	}
	akv, err := kv.WithStateKeys(proofJobKey(markers))
	if err != nil {
		rdb.Close()
		return nil, nil, nil, err
	}
	return akv, locker, func() { _ = rdb.Close() }, nil
}

// processEngine is the leasetest.Engine of the process proofs; with
// atomic, its replicas clear through a fenced AtomicKV, by runs.
func processEngine(t *testing.T, atomic bool) leasetest.Engine {
	admin := connect(t)
	markersOf := func(store string) string { return strings.TrimSuffix(store, ",atomic") }
	jobKey := func(markers, id string) string { return strings.Replace(proofJobKey(markers), "<id>", id, 1) }
	e := leasetest.Engine{
		Addr:    kvtest.ServerAddr(t, "RETENTION_REDIS_ADDR"),
		TTL:     1500 * time.Millisecond,
		Connect: connectReplica,
		Setup: func(t testing.TB, keys [][]byte) string {
			ctx := context.Background()
			markers := freshKey(t, admin)
			t.Cleanup(func() { admin.Del(context.Background(), proofLeaseKey(markers)) })
			members := make([]redis.Z, len(keys))
			for i, k := range keys {
				members[i] = redis.Z{Member: string(k)}
			}
			require.NoError(t, admin.ZAdd(ctx, markers, members...).Err())
			if !atomic {
				return markers
			}
			jobs := make([]string, len(keys))
			for i, k := range keys {
				_, id, err := retention.ParseMarkerKey("proof/", k)
				require.NoError(t, err)
				jobs[i] = jobKey(markers, string(id))
			}
			t.Cleanup(func() {
				for c := range slices.Chunk(jobs, 1000) {
					admin.Unlink(context.Background(), c...)
				}
			})
			for c := range slices.Chunk(jobs, 1000) {
				pairs := make([]any, 0, 2*len(c))
				for _, k := range c {
					pairs = append(pairs, k, "job")
				}
				require.NoError(t, admin.MSet(ctx, pairs...).Err())
			}
			return markers + ",atomic"
		},
		TakeAway: func(t testing.TB, store string) {
			require.NoError(t, admin.Del(context.Background(), proofLeaseKey(markersOf(store))).Err())
		},
		Remaining: func(ctx context.Context, store string) (int, error) {
			n, err := admin.ZCard(ctx, markersOf(store)).Result()
			return int(n), err
		},
	}
	if atomic {
		// A script that deletes a key records nothing: a second clear of a
		// job cannot be seen, and cannot happen unless its marker survived
		// the first. What can be seen is that each job went exactly when
		// its marker did; Duplicates checks it and reports none.
		e.Duplicates = func(ctx context.Context, store string) (int, error) {
			markers := markersOf(store)
			left, err := admin.ZRange(ctx, markers, 0, -1).Result()
			if err != nil {
				return 0, err
			}
			jobs := 0
			iter := admin.Scan(ctx, 0, strings.Replace(proofJobKey(markers), "<id>", "*", 1), 1000).Iterator()
			for iter.Next(ctx) {
				jobs++
			}
			if err := iter.Err(); err != nil {
				return 0, err
			}
			if jobs != len(left) {
				return 0, fmt.Errorf("%d markers but %d jobs left: a marker went without its job, or the reverse", len(left), jobs)
			}
			keys := make([]string, len(left))
			for i, m := range left {
				_, id, err := retention.ParseMarkerKey("proof/", []byte(m))
				if err != nil {
					return 0, err
				}
				keys[i] = jobKey(markers, string(id))
			}
			for c := range slices.Chunk(keys, 1000) {
				n, err := admin.Exists(ctx, c...).Result()
				if err != nil {
					return 0, err
				}
				if int(n) != len(c) {
					return 0, fmt.Errorf("%d of %d markers left have no job: it went without its marker", len(c)-int(n), len(c))
				}
			}
			return 0, nil
		}
		e.Runs = true
	}
	return e
}

func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	leasetest.RunProcesses(t, processEngine(t, false))
}

// TestProcessesAtomic runs the process proofs with replicas that clear
// through a fenced AtomicKV of WithStateKeys, by runs (ClearRun): each job
// goes exactly when its marker does, and no run of a holder that lost its
// lease deletes anything, even when the lease is taken away mid-pass, a
// holder's host crashes, or a holder freezes past its TTL in a run.
func TestProcessesAtomic(t *testing.T) {
	if testing.Short() {
		t.Skip("the process proofs take a while")
	}
	leasetest.RunProcesses(t, processEngine(t, true))
}
