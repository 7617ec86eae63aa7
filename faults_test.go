package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
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
// wraps a Clear or a ClearBatch, and faultAtomic is a ClearDeleter over a
// faultKV whose ClearAndDelete fails as a faultClear draws. A test turns
// each fault on and off at runtime, and all draw from one seeded source
// whose seed the test logs.

// errInjected is the error an injected store or clear fault returns.
var errInjected = errors.New("injected fault")

// faultOp is a KV operation a fault can hit.
type faultOp int

const (
	opScan faultOp = iota
	opDelete
	opPut
	opMove
	numFaultOps
)

func (o faultOp) String() string { return [...]string{"scan", "delete", "put", "move"}[o] }

// storeFault is what goes wrong with one KV call.
type storeFault int

const (
	storeFine    storeFault = iota // no fault
	storeErr                       // fail at once, doing nothing
	storeSlow                      // wait up to faultKV.latency (or until ctx is done), then do the call
	storeHang                      // block until ctx is done, doing nothing
	storePartial                   // Delete and Move only: delete (move) a random subset of the keys (pairs), then fail
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

// faultKV is a KV, Putter and Mover over a MemKV whose calls fail as the
// test says. With every rate zero, or the enabled switch off, it is a plain
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
	Mover
} = (*faultKV)(nil)

func newFaultKV(mem *MemKV, rnd *faultRand, latency time.Duration) *faultKV {
	return &faultKV{mem: mem, rnd: rnd, latency: latency}
}

// set makes op fail with fault f at the given rate (0 to 1). The rates of
// one op must sum to at most 1.
func (f *faultKV) set(op faultOp, fault storeFault, rate float64) {
	if fault == storePartial && op != opDelete && op != opMove {
		panic("faultKV: partial faults are for Delete and Move")
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

// Move moves as MemKV.Move does. A partial fault moves a random subset of
// the pairs, each whole (MemKV.Move is atomic per pair), then fails; a lost
// one moves them all, then fails.
func (f *faultKV) Move(ctx context.Context, from, to [][]byte) error {
	fault := f.fault(opMove)
	if done, err := f.before(ctx, opMove, fault); done {
		return err
	}
	if fault == storePartial {
		var someFrom, someTo [][]byte
		for i := range from {
			if f.rnd.float() < 0.5 {
				someFrom, someTo = append(someFrom, from[i]), append(someTo, to[i])
			}
		}
		if err := f.mem.Move(ctx, someFrom, someTo); err != nil {
			return err
		}
		return fmt.Errorf("move: %d of %d pairs moved: %w", len(someFrom), len(from), errInjected)
	}
	err := f.mem.Move(ctx, from, to)
	if err == nil && fault == storeLost {
		return fmt.Errorf("move reply lost: %w", errInjected)
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

// clearFault is how one call of a Clear, a ClearBatch or a ClearDeleter's
// ClearAndDelete goes. "The clear" is the real one: faultClear.next for
// each id, or faultAtomic's commit.
type clearFault int

const (
	clearFine    clearFault = iota // do the clear
	clearErr                       // return an error, doing nothing
	clearPanic                     // panic; a ClearAndDelete commits first half the time
	clearHang                      // block until ctx is done, return ctx.Err(), doing nothing
	clearStall                     // ignore ctx: block for up to faultClear.stall, then do the clear
	clearGoexit                    // call runtime.Goexit
	clearLost                      // do the clear, then return an error: the reply is lost
	clearLate                      // block until ctx is done, then do the clear all the same and return ctx.Err()
	clearNamed                     // a BatchError naming some ids (ClearBatch: the others are cleared; ClearAndDelete: nothing is); Clear: an error
	clearPartial                   // ClearBatch: clear some ids, then return an error; Clear: as lost; ClearAndDelete: as error
	numClearFaults
)

func (f clearFault) String() string {
	return [...]string{"fine", "error", "panic", "hang", "stall", "goexit", "lost", "late", "named", "partial"}[f]
}

// faultClear injects faults into clears. Its clear method is a Config.Clear
// and its clearBatch method a Config.ClearBatch; faultAtomic draws its
// faults from one.
type faultClear struct {
	next    func(ctx context.Context, id string) error // the real clear of one id
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

// set makes a call end with fault f at the given rate.
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

// draw picks how a call goes, and counts it.
func (c *faultClear) draw() clearFault {
	fault := clearFine
	if c.enabled.Load() {
		c.mu.Lock()
		rates := c.rates
		c.mu.Unlock()
		fault = clearFault(c.rnd.pick(rates[:]))
	}
	c.calls[fault].Add(1)
	return fault
}

func (c *faultClear) clear(ctx context.Context, id string) error {
	c.running.Add(1)
	defer c.running.Done()
	switch c.draw() {
	case clearErr, clearNamed:
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
	case clearLost, clearPartial:
		if err := c.next(ctx, id); err != nil {
			return err
		}
		return fmt.Errorf("clear %s: reply lost: %w", id, errInjected)
	case clearLate:
		<-ctx.Done()
		if err := c.next(ctx, id); err != nil {
			return err
		}
		return ctx.Err()
	}
	return c.next(ctx, id)
}

// clearBatch is a ClearBatch that clears each id with next.
func (c *faultClear) clearBatch(ctx context.Context, ids []string) error {
	c.running.Add(1)
	defer c.running.Done()
	// held collects the ids next holds (see Hold): the call reports them
	// in a BatchError, as a ClearBatch whose store holds some ids would.
	held := BatchError{}
	one := func(id string) error {
		err := c.next(ctx, id)
		if errors.Is(err, ErrHeld) {
			held[id] = err
			return nil
		}
		return err
	}
	withHolds := func(err error) error {
		if err != nil || len(held) == 0 {
			return err
		}
		return held
	}
	all := func() error {
		for _, id := range ids {
			if err := one(id); err != nil {
				return err
			}
		}
		return withHolds(nil)
	}
	switch c.draw() {
	case clearErr:
		return fmt.Errorf("clear batch of %d: %w", len(ids), errInjected)
	case clearPanic:
		panic(fmt.Sprintf("injected panic clearing a batch of %d", len(ids)))
	case clearHang:
		<-ctx.Done()
		return ctx.Err()
	case clearStall:
		time.Sleep(c.rnd.duration(c.stall))
	case clearGoexit:
		runtime.Goexit()
	case clearLost:
		if err := all(); err != nil {
			return err
		}
		return fmt.Errorf("clear batch of %d: reply lost: %w", len(ids), errInjected)
	case clearLate:
		<-ctx.Done()
		if err := all(); err != nil {
			return err
		}
		return ctx.Err()
	case clearPartial:
		n := 0
		for _, id := range ids {
			if c.rnd.float() < 0.5 {
				if err := one(id); err != nil {
					return err
				}
				n++
			}
		}
		return fmt.Errorf("clear batch: %d of %d cleared: %w", n, len(ids), errInjected)
	case clearNamed:
		perID := c.named(ids)
		for _, id := range ids {
			if _, ok := perID[id]; !ok {
				if err := one(id); err != nil {
					return err
				}
			}
		}
		maps.Copy(perID, held)
		if c.rnd.float() < 0.5 {
			return fmt.Errorf("clear batch: %w", perID) // a ClearBatch may wrap it
		}
		return perID
	}
	return all()
}

// named returns a BatchError naming a random non-empty subset of ids, and
// now and then an id that is not one of them, which fails the call as a
// whole.
func (c *faultClear) named(ids []string) BatchError {
	perID := BatchError{}
	for _, i := range c.rnd.perm(len(ids))[:1+int(c.rnd.float()*float64(len(ids)))] {
		perID[ids[i]] = fmt.Errorf("clear %s: %w", ids[i], errInjected)
	}
	if c.rnd.float() < 0.1 {
		perID["not-in-the-batch"] = fmt.Errorf("clear not-in-the-batch: %w", errInjected)
	}
	return perID
}

// report describes the calls so far by how they went.
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

// faultAtomic is a ClearDeleter, and a Mover, over a faultKV: its
// ClearAndDelete commits under the MemKV's lock, only if every key exists
// (else an error matching ErrMarkerGone, changing nothing), by deleting the
// keys and calling commit; faults drawn from c come first. Scan, Delete,
// Put and Move are the faultKV's.
type faultAtomic struct {
	*faultKV
	c *faultClear // draws the faults of ClearAndDelete; its next is not used
	// commit clears the entities of ids, whose markers keys were just
	// deleted; it runs with the MemKV's lock held.
	commit func(ids []string, keys [][]byte)
	// refuse, when set, may refuse the transaction before it changes
	// anything (a BatchError holding some ids, say).
	refuse func(ids []string) error
}

var _ interface {
	ClearDeleter
	Mover
} = (*faultAtomic)(nil)

func (a *faultAtomic) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	a.c.running.Add(1)
	defer a.c.running.Done()
	switch a.c.draw() {
	case clearErr, clearPartial:
		return fmt.Errorf("clear and delete %d: %w", len(ids), errInjected)
	case clearNamed:
		return a.c.named(ids) // changing nothing, whatever it names
	case clearPanic:
		if a.c.rnd.float() < 0.5 {
			if err := a.apply(ids, keys); err != nil {
				return err
			}
		}
		panic(fmt.Sprintf("injected panic clearing and deleting %d", len(ids)))
	case clearHang:
		<-ctx.Done()
		return ctx.Err()
	case clearStall:
		time.Sleep(a.c.rnd.duration(a.c.stall))
		return a.apply(ids, keys)
	case clearGoexit:
		runtime.Goexit()
	case clearLost:
		if err := a.apply(ids, keys); err != nil {
			return err
		}
		return fmt.Errorf("clear and delete %d: reply lost: %w", len(ids), errInjected)
	case clearLate:
		<-ctx.Done()
		if err := a.apply(ids, keys); err != nil {
			return err
		}
		return fmt.Errorf("clear and delete %d: committed, but the reply came too late: %w", len(ids), ctx.Err())
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return a.apply(ids, keys)
}

// apply is the transaction of ClearAndDelete.
func (a *faultAtomic) apply(ids []string, keys [][]byte) error {
	m := a.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.refuse != nil {
		if err := a.refuse(ids); err != nil {
			return err
		}
	}
	for _, key := range keys {
		if x := m.seek(key, nil); x == nil || !bytes.Equal(x.key, key) {
			return fmt.Errorf("clear and delete %d: %q: %w", len(ids), key, ErrMarkerGone)
		}
	}
	for _, key := range keys {
		m.deleteLocked(key)
	}
	a.commit(ids, keys)
	return nil
}
