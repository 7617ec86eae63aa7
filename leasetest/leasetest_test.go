package leasetest_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/leasetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// memLeases is an in-memory lease with a TTL, kept the way a Redis key is:
// a holder's token and an expiry time.
type memLeases struct {
	mu      sync.Mutex
	token   string
	expires time.Time
}

func (m *memLeases) expire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.token = ""
}

// memStore is the harness's KV: a MemKV whose writes apply a fence their
// context carries (retention.Fenced), as an adapter's do, so that a KV
// wrapped around it is fenced too. ignoresCtxFence makes it forget to.
type memStore struct {
	*retention.MemKV
	ignoresCtxFence bool
}

// fenced returns the view to write through instead, if ctx carries a fence.
func (s *memStore) fenced(ctx context.Context) (retention.KV, error) {
	if s.ignoresCtxFence {
		return nil, nil
	}
	return retention.Fenced(ctx, s)
}

func (s *memStore) Delete(ctx context.Context, keys ...[]byte) error {
	if view, err := s.fenced(ctx); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.Delete(ctx, keys...)
	}
	return s.MemKV.Delete(ctx, keys...)
}

func (s *memStore) Put(ctx context.Context, key, value []byte) error {
	if view, err := s.fenced(ctx); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.(retention.Putter).Put(ctx, key, value)
	}
	return s.MemKV.Put(ctx, key, value)
}

func (s *memStore) Move(ctx context.Context, from, to [][]byte) error {
	if view, err := s.fenced(ctx); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.(retention.Mover).Move(ctx, from, to)
	}
	return s.MemKV.Move(ctx, from, to)
}

// memLocker is one replica's view of memLeases; killed stops its renewals.
type memLocker struct {
	m      *memLeases
	kv     *retention.MemKV // the store its leases fence, inside a memStore
	ttl    time.Duration
	killed *atomic.Bool
}

func (l *memLocker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	now := time.Now()
	if l.m.token != "" && now.Before(l.m.expires) {
		return nil, retention.ErrLeaseHeld
	}
	l.m.token, l.m.expires = rand.Text(), now.Add(l.ttl)
	lease := &memLease{l: l, token: l.m.token, lost: make(chan struct{}), stop: make(chan struct{})}
	lease.wg.Go(func() { lease.renew(now.Add(l.ttl)) })
	return lease, nil
}

type memLease struct {
	l        *memLocker
	token    string
	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func (e *memLease) Lost() <-chan struct{} { return e.lost }

func (e *memLease) markLost() { e.lostOnce.Do(func() { close(e.lost) }) }

// Fence fences the MemKV of its harness: memLeases' mutex stands for the
// store's atomicity, held across the check and the write.
func (e *memLease) Fence(kv retention.KV) (retention.KV, bool) {
	if m, ok := kv.(*memStore); !ok || m.MemKV != e.l.kv {
		return nil, false
	}
	return memFenced{e}, true
}

type memFenced struct{ e *memLease }

func (f memFenced) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return f.e.l.kv.Scan(ctx, start, end, limit)
}

func (f memFenced) Delete(ctx context.Context, keys ...[]byte) error {
	return f.write(func() error { return f.e.l.kv.Delete(ctx, keys...) })
}

func (f memFenced) Put(ctx context.Context, key, value []byte) error {
	return f.write(func() error { return f.e.l.kv.Put(ctx, key, value) })
}

func (f memFenced) Move(ctx context.Context, from, to [][]byte) error {
	return f.write(func() error { return f.e.l.kv.Move(ctx, from, to) })
}

func (f memFenced) write(do func() error) error {
	m := f.e.l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.token != f.e.token || !time.Now().Before(m.expires) {
		f.e.markLost()
		return fmt.Errorf("memFenced: %w", retention.ErrLeaseLost)
	}
	return do()
}

func (e *memLease) renew(validUntil time.Time) {
	defer e.markLost()
	tick := time.NewTicker(e.l.ttl / 3)
	defer tick.Stop()
	deadline := time.NewTimer(time.Until(validUntil))
	defer deadline.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
		if e.l.killed.Load() {
			continue // a dead process renews nothing; the deadline ends it
		}
		e.l.m.mu.Lock()
		mine := e.l.m.token == e.token
		if mine {
			now := time.Now()
			e.l.m.expires = now.Add(e.l.ttl)
			deadline.Reset(e.l.ttl)
		}
		e.l.m.mu.Unlock()
		if !mine {
			return
		}
	}
}

func (e *memLease) Release(context.Context) error {
	e.stopOnce.Do(func() { close(e.stop) })
	e.wg.Wait()
	if e.l.killed.Load() {
		return nil
	}
	e.l.m.mu.Lock()
	defer e.l.m.mu.Unlock()
	if e.l.m.token == e.token {
		e.l.m.token = ""
	}
	return nil
}

// TestInMemory runs the fleet proofs over MemKV and an in-memory lease, so
// the suite itself is exercised without servers.
func TestInMemory(t *testing.T) {
	leasetest.Run(t, memHarness)
}

// Broken lockers, and a broken store, that the proofs must catch, each
// with the subtest that fails.
var broken = map[string]struct {
	wrap    func(retention.Locker) retention.Locker
	catches string
	store   func(*memStore) // breaks the replica's store, when not nil
}{
	"grants everyone": {func(retention.Locker) retention.Locker { return grantsAll{} }, "LockerContract", nil},
	"never loses":     {func(l retention.Locker) retention.Locker { return neverLoses{l} }, "NoDeleteAfterLoss", nil},
	"fences by timer": {func(l retention.Locker) retention.Locker { return timerFence{l} }, "FencedWrites", nil},
	// A store that does not call retention.Fenced: a sweep over a KV
	// wrapped around it writes unfenced.
	"store ignores the fence on ctx": {func(l retention.Locker) retention.Locker { return l }, "FenceThroughWrapper",
		func(s *memStore) { s.ignoresCtxFence = true }},
}

// grantsAll hands a lease to every caller: no mutual exclusion.
type grantsAll struct{}

func (grantsAll) TryAcquire(context.Context) (retention.Lease, error) {
	return &freeLease{lost: make(chan struct{})}, nil
}

type freeLease struct {
	lost chan struct{}
	once sync.Once
}

func (f *freeLease) Lost() <-chan struct{} { return f.lost }

func (f *freeLease) Release(context.Context) error {
	f.once.Do(func() { close(f.lost) })
	return nil
}

// neverLoses hides the loss of the lease from its holder.
type neverLoses struct{ retention.Locker }

type blindLease struct{ retention.Lease }

func (n neverLoses) TryAcquire(ctx context.Context) (retention.Lease, error) {
	l, err := n.Locker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return blindLease{l}, nil
}

func (blindLease) Lost() <-chan struct{} { return make(chan struct{}) }

// timerFence offers a fence that the store never checks: it refuses writes
// only once the holder's Lost is closed, a timer in the client.
type timerFence struct{ retention.Locker }

type timerFenceLease struct{ retention.Lease }

type timerFenced struct {
	retention.KV
	lost <-chan struct{}
}

func (f timerFence) TryAcquire(ctx context.Context) (retention.Lease, error) {
	l, err := f.Locker.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return timerFenceLease{l}, nil
}

func (l timerFenceLease) Fence(kv retention.KV) (retention.KV, bool) {
	m, ok := kv.(*memStore)
	if !ok {
		return nil, false
	}
	return timerFenced{KV: m.MemKV, lost: l.Lost()}, true
}

func (f timerFenced) check() error {
	select {
	case <-f.lost:
		return retention.ErrLeaseLost
	default:
		return nil
	}
}

func (f timerFenced) Delete(ctx context.Context, keys ...[]byte) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.KV.Delete(ctx, keys...)
}

func (f timerFenced) Put(ctx context.Context, key, value []byte) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.KV.(retention.Putter).Put(ctx, key, value)
}

func TestBrokenLockersAreCaught(t *testing.T) {
	if os.Getenv("LEASETEST_BROKEN") != "" {
		t.Skip("in the child process")
	}
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenChild$/^"+b.catches+"$", "-test.v")
			cmd.Env = append(os.Environ(), "LEASETEST_BROKEN="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the proofs passed a locker that %s:\n%s", name, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestBrokenChild/"+b.catches) {
				t.Fatalf("want %s to fail; output:\n%s", b.catches, out)
			}
		})
	}
}

func TestBrokenChild(t *testing.T) {
	name := os.Getenv("LEASETEST_BROKEN")
	if name == "" {
		t.Skip("run by TestBrokenLockersAreCaught")
	}
	leasetest.Run(t, func(t testing.TB) leasetest.Harness {
		h := memHarness(t)
		newReplica := h.NewReplica
		h.NewReplica = func(t testing.TB) leasetest.Replica {
			r := newReplica(t)
			r.Locker = broken[name].wrap(r.Locker)
			if breakStore := broken[name].store; breakStore != nil {
				breakStore(r.KV.(*memStore))
			}
			return r
		}
		return h
	})
}
