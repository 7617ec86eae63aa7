package retention_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/marksweep/retention"
)

// localLocker is a lease for the sweeps of one process. Fleets use their
// store's: pgkv.NewLocker, rediskv.NewLocker, etcdkv.NewLocker or
// sqlkv.NewLocker, whose leases expire by themselves when a holder dies
// and fence its marker deletes.
type localLocker struct {
	mu   sync.Mutex
	held bool
}

type localLease struct {
	l    *localLocker
	once sync.Once
	lost chan struct{}
}

func (l *localLocker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held {
		return nil, retention.ErrLeaseHeld
	}
	l.held = true
	return &localLease{l: l, lost: make(chan struct{})}, nil
}

func (le *localLease) Lost() <-chan struct{} { return le.lost }

func (le *localLease) Release(context.Context) error {
	le.once.Do(func() {
		le.l.mu.Lock()
		le.l.held = false
		le.l.mu.Unlock()
		close(le.lost)
	})
	return nil
}

// newLeasedSweep is one replica's sweep: under Run (or LeasedPass) it
// sweeps only while it holds the lease.
func newLeasedSweep(kv retention.KV, lease retention.Locker, clock retention.Clock) (*retention.Sweep, error) {
	return retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 24 * time.Hour,
		Clock:     clock,
		Clear:     deleteRun,
		Lease:     lease,
		Jitter:    0.2, // replicas that start together do not wake together
	})
}

func ExampleSweep_LeasedPass() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := retention.NewManualClock(now)
	_ = retention.Mark(ctx, kv, "runs/done/", "run-1", now.Add(-48*time.Hour))

	locker := &localLocker{}
	replica, err := newLeasedSweep(kv, locker, clock)
	if err != nil {
		fmt.Println(err)
		return
	}
	other, _ := locker.TryAcquire(ctx) // another replica holds the lease
	_, err = replica.LeasedPass(ctx)
	fmt.Println(errors.Is(err, retention.ErrLeaseHeld))

	_ = other.Release(ctx)
	st, err := replica.LeasedPass(ctx) // takes the lease, passes, releases it
	fmt.Println("cleared", st.Cleared, err)
	// Output:
	// true
	// cleared 1 <nil>
}
