package leasetest_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/leasetest"
)

// memHarness is what an adapter's test passes to leasetest.Run: it sets up
// a fresh store and returns a Harness over it. Here the markers live in a
// MemKV that stands for the shared store, and memLocker (in this package's
// tests) is an in-memory lease with a TTL; an adapter connects each replica
// to its engine with a client of its own, and uses its own Locker.
func memHarness(testing.TB) leasetest.Harness {
	kv := retention.NewMemKV()
	leases := &memLeases{}
	const ttl = time.Second
	return leasetest.Harness{
		TTL: ttl,
		NewReplica: func(testing.TB) leasetest.Replica {
			killed := &atomic.Bool{}
			return leasetest.Replica{
				KV:     &memStore{MemKV: kv},
				Locker: &memLocker{m: leases, kv: kv, ttl: ttl, killed: killed},
				Clear: func(context.Context, string) error {
					return nil
				},
				Kill: func() { killed.Store(true) },
			}
		},
		Finish: func(ctx context.Context, prefix string, ids []string, at time.Time) error {
			for _, id := range ids {
				if err := retention.Mark(ctx, kv, prefix, id, at); err != nil {
					return err
				}
			}
			return nil
		},
		Present: func(ctx context.Context, ids []string) (map[string]bool, error) {
			// State is gone once its marker is: Clear is a no-op here, so
			// the markers themselves stand for the state.
			present := map[string]bool{}
			keys, err := kv.Scan(ctx, []byte("fleet/"), []byte("fleet0"), 1<<30)
			if err != nil {
				return nil, err
			}
			for _, k := range keys {
				if strings.HasPrefix(string(k), "fleet/#") {
					continue // the fleet's record and wake key, not markers (docs/fleet.md)
				}
				_, id, err := retention.ParseMarkerKey("fleet/", k)
				if err != nil {
					return nil, fmt.Errorf("stray key %q: %w", k, err)
				}
				present[string(id)] = true
			}
			return present, nil
		},
		Expire: func(testing.TB) { leases.expire() },
	}
}

// An adapter's test file runs the fleet proofs with its harness:
// TestFleet below is what it declares (this package's TestInMemory runs it
// with memHarness).
func ExampleRun() {
	TestFleet := func(t *testing.T) { leasetest.Run(t, memHarness) }
	_ = TestFleet
}
