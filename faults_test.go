package retention

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// This file holds fault injectors for tests that put a Sweep through an
// unreliable store and unreliable clears: faultKV wraps a MemKV, faultClear
// wraps a Clear. A test turns each fault on and off at runtime, and both
// draw from one seeded source whose seed the test logs.

// errInjected is the error an injected store or clear fault returns.
var errInjected = errors.New("injected fault")

// faultOp is a KV operation a fault can hit.
type faultOp int

const (
	opScan faultOp = iota
	opDelete
	opPut
	numFaultOps
)

func (o faultOp) String() string { return [...]string{"scan", "delete", "put"}[o] }

// storeFault is what goes wrong with one KV call.
type storeFault int

const (
	storeFine    storeFault = iota // no fault
	storeErr                       // fail at once, doing nothing
	storeSlow                      // wait up to faultKV.latency (or until ctx is done), then do the call
	storeHang                      // block until ctx is done, doing nothing
	storePartial                   // Delete only: delete a random subset of the keys, then fail
	storeLost                      // do the call, then fail: the reply is lost
	numStoreFaults
)

func (f storeFault) String() string {
	return [...]string{"fine", "error", "slow", "hang", "partial", "lost"}[f]
}

// faultRand is a seeded source shared by the injectors of one test. The
// schedule of goroutines still varies between runs; the seed makes the
// draws, not the interleaving, repeatable.
type faultRand struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func newFaultRand(t testing.TB, seed uint64) *faultRand {
	t.Helper()
	t.Logf("fault seed %d", seed)
	return &faultRand{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (r *faultRand) float() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.Float64()
}

func (r *faultRand) duration(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Duration(r.rng.Int64N(int64(d))) + 1
}

func (r *faultRand) perm(n int) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.Perm(n)
}

// pick returns the index of the fault that rates select, or 0 (no fault):
// rates[i] is the probability of fault i, and rates[0] is ignored.
func (r *faultRand) pick(rates []float64) int {
	x := r.float()
	for i := 1; i < len(rates); i++ {
		if x < rates[i] {
			return i
		}
		x -= rates[i]
	}
	return 0
}

// faultKV is a KV (and Putter) over a MemKV whose calls fail as the test
// says. With every rate zero, or the enabled switch off, it is a plain
// MemKV.
type faultKV struct {
	mem     *MemKV
	rnd     *faultRand
	latency time.Duration // longest storeSlow delay
	enabled atomic.Bool   // master switch: false turns every fault off

	mu    sync.Mutex
	rates [numFaultOps][numStoreFaults]float64

	calls    [numFaultOps]atomic.Int64
	injected [numFaultOps][numStoreFaults]atomic.Int64
}

var _ interface {
	KV
	Putter
} = (*faultKV)(nil)

func newFaultKV(mem *MemKV, rnd *faultRand, latency time.Duration) *faultKV {
	return &faultKV{mem: mem, rnd: rnd, latency: latency}
}

// set makes op fail with fault f at the given rate (0 to 1). The rates of
// one op must sum to at most 1.
func (f *faultKV) set(op faultOp, fault storeFault, rate float64) {
	if fault == storePartial && op != opDelete {
		panic("faultKV: partial faults are for Delete")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rates[op][fault] = rate
}

// reset sets every rate to zero.
func (f *faultKV) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rates = [numFaultOps][numStoreFaults]float64{}
}

// enable turns every fault on or off at once, keeping the rates.
func (f *faultKV) enable(on bool) { f.enabled.Store(on) }

func (f *faultKV) fault(op faultOp) storeFault {
	f.calls[op].Add(1)
	if !f.enabled.Load() {
		return storeFine
	}
	f.mu.Lock()
	rates := f.rates[op]
	f.mu.Unlock()
	fault := storeFault(f.rnd.pick(rates[:]))
	if fault != storeFine {
		f.injected[op][fault].Add(1)
	}
	return fault
}

// before plays the part of fault that comes before the call: it returns
// done when the call must not be made, with the call's error.
func (f *faultKV) before(ctx context.Context, op faultOp, fault storeFault) (done bool, err error) {
	switch fault {
	case storeErr:
		return true, fmt.Errorf("%s: %w", op, errInjected)
	case storeSlow:
		t := time.NewTimer(f.rnd.duration(f.latency))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-t.C:
		}
	case storeHang:
		<-ctx.Done()
		return true, ctx.Err()
	}
	return false, nil
}

func (f *faultKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	fault := f.fault(opScan)
	if done, err := f.before(ctx, opScan, fault); done {
		return nil, err
	}
	keys, err := f.mem.Scan(ctx, start, end, limit)
	if err == nil && fault == storeLost {
		return nil, fmt.Errorf("scan reply lost: %w", errInjected)
	}
	return keys, err
}

func (f *faultKV) Delete(ctx context.Context, keys ...[]byte) error {
	fault := f.fault(opDelete)
	if done, err := f.before(ctx, opDelete, fault); done {
		return err
	}
	if fault == storePartial {
		var some [][]byte
		for _, k := range keys {
			if f.rnd.float() < 0.5 {
				some = append(some, k)
			}
		}
		if err := f.mem.Delete(ctx, some...); err != nil {
			return err
		}
		return fmt.Errorf("delete: %d of %d keys deleted: %w", len(some), len(keys), errInjected)
	}
	err := f.mem.Delete(ctx, keys...)
	if err == nil && fault == storeLost {
		return fmt.Errorf("delete reply lost: %w", errInjected)
	}
	return err
}

func (f *faultKV) Put(ctx context.Context, key, value []byte) error {
	fault := f.fault(opPut)
	if done, err := f.before(ctx, opPut, fault); done {
		return err
	}
	err := f.mem.Put(ctx, key, value)
	if err == nil && fault == storeLost {
		return fmt.Errorf("put reply lost: %w", errInjected)
	}
	return err
}

// report describes the calls and the faults injected so far.
func (f *faultKV) report() string {
	var b strings.Builder
	for op := range numFaultOps {
		fmt.Fprintf(&b, "%s: %d calls", op, f.calls[op].Load())
		for fault := storeErr; fault < numStoreFaults; fault++ {
			if n := f.injected[op][fault].Load(); n > 0 {
				fmt.Fprintf(&b, ", %s %d", fault, n)
			}
		}
		b.WriteString("; ")
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// clearFault is how one Clear call goes.
type clearFault int

const (
	clearFine   clearFault = iota // call the real clear
	clearErr                      // return an error
	clearPanic                    // panic
	clearHang                     // block until ctx is done, return ctx.Err()
	clearStall                    // ignore ctx: block for up to faultClear.stall, then call the real clear
	clearGoexit                   // call runtime.Goexit
	numClearFaults
)

func (f clearFault) String() string {
	return [...]string{"fine", "error", "panic", "hang", "stall", "goexit"}[f]
}

// faultClear wraps a Clear function with injected faults. Its clear method
// is the Config.Clear.
type faultClear struct {
	next    func(ctx context.Context, id string) error
	rnd     *faultRand
	stall   time.Duration // longest clearStall
	enabled atomic.Bool

	mu    sync.Mutex
	rates [numClearFaults]float64

	// running counts the calls that have not ended, however they end. A
	// stalled clear can outlive its pass; a test waits for it before it
	// checks for leaked goroutines.
	running sync.WaitGroup
	calls   [numClearFaults]atomic.Int64
}

func newFaultClear(next func(context.Context, string) error, rnd *faultRand, stall time.Duration) *faultClear {
	return &faultClear{next: next, rnd: rnd, stall: stall}
}

// set makes a Clear call end with fault f at the given rate.
func (c *faultClear) set(f clearFault, rate float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rates[f] = rate
}

// reset sets every rate to zero.
func (c *faultClear) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rates = [numClearFaults]float64{}
}

// enable turns every fault on or off at once, keeping the rates.
func (c *faultClear) enable(on bool) { c.enabled.Store(on) }

func (c *faultClear) clear(ctx context.Context, id string) error {
	c.running.Add(1)
	defer c.running.Done()
	fault := clearFine
	if c.enabled.Load() {
		c.mu.Lock()
		rates := c.rates
		c.mu.Unlock()
		fault = clearFault(c.rnd.pick(rates[:]))
	}
	c.calls[fault].Add(1)
	switch fault {
	case clearErr:
		return fmt.Errorf("clear %s: %w", id, errInjected)
	case clearPanic:
		panic(fmt.Sprintf("injected panic clearing %s", id))
	case clearHang:
		<-ctx.Done()
		return ctx.Err()
	case clearStall:
		time.Sleep(c.rnd.duration(c.stall))
	case clearGoexit:
		runtime.Goexit()
	}
	return c.next(ctx, id)
}

// report describes the Clear calls so far by how they went.
func (c *faultClear) report() string {
	var b strings.Builder
	for f := range numClearFaults {
		if f > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", f, c.calls[f].Load())
	}
	return b.String()
}
