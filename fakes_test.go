package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeKV is the store of the core's tests: the keys in a MemKV, call
// counters, fault hooks, and switches for what the store can do. Give the
// sweep f.store(), which is a Mover when canMove, a Putter only when
// canPut, and read-only otherwise (storeKind.fake sets them for a kind of
// the table); tests read and write the keys through the embedded MemKV.
type fakeKV struct {
	*MemKV
	canPut, canMove bool

	scans, keys, deletes, deleted, puts, moves atomic.Int64
	inScan                                     atomic.Int32 // Scans in progress

	mu sync.Mutex
	// onScan, onDelete and onMove run before the call they are named
	// after, numbered from 1: a non-nil error fails the call unapplied.
	// A hook may also block, sleep or panic, as a store does.
	onScan, onDelete, onMove func(ctx context.Context, call int64) error
}

// newFakeKV returns a fakeKV over mem (a new MemKV if nil) that can Put
// and Move.
func newFakeKV(mem *MemKV) *fakeKV {
	if mem == nil {
		mem = NewMemKV()
	}
	return &fakeKV{MemKV: mem, canPut: true, canMove: true}
}

// store returns the view of f the sweep is given, as canPut and canMove say.
func (f *fakeKV) store() KV {
	switch {
	case f.canMove:
		return f
	case f.canPut:
		return putOnlyKV{f, f}
	default:
		return readOnlyKV{f}
	}
}

func (f *fakeKV) hook(h *func(context.Context, int64) error) func(context.Context, int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *h
}

func (f *fakeKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	n := f.scans.Add(1)
	f.inScan.Add(1)
	defer f.inScan.Add(-1)
	if h := f.hook(&f.onScan); h != nil {
		if err := h(ctx, n); err != nil {
			return nil, err
		}
	}
	keys, err := f.MemKV.Scan(ctx, start, end, limit)
	f.keys.Add(int64(len(keys)))
	return keys, err
}

func (f *fakeKV) Delete(ctx context.Context, keys ...[]byte) error {
	n := f.deletes.Add(1)
	if h := f.hook(&f.onDelete); h != nil {
		if err := h(ctx, n); err != nil {
			return err
		}
	}
	f.deleted.Add(int64(len(keys)))
	return f.MemKV.Delete(ctx, keys...)
}

func (f *fakeKV) Put(ctx context.Context, key, value []byte) error {
	f.puts.Add(1)
	return f.MemKV.Put(ctx, key, value)
}

func (f *fakeKV) Move(ctx context.Context, from, to [][]byte) error {
	n := f.moves.Add(1)
	if h := f.hook(&f.onMove); h != nil {
		if err := h(ctx, n); err != nil {
			return err
		}
	}
	return f.MemKV.Move(ctx, from, to)
}

// setHooks replaces the fault hooks while the sweep may be calling.
func (f *fakeKV) setHooks(scan, del, move func(context.Context, int64) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onScan, f.onDelete, f.onMove = scan, del, move
}

func (f *fakeKV) reset() {
	for _, c := range []*atomic.Int64{&f.scans, &f.keys, &f.deletes, &f.deleted, &f.puts, &f.moves} {
		c.Store(0)
	}
}

// failWith returns a hook that fails every call with err.
func failWith(err error) func(context.Context, int64) error {
	return func(context.Context, int64) error { return err }
}

// failCall returns a hook that fails call number n with err.
func failCall(n int64, err error) func(context.Context, int64) error {
	return func(_ context.Context, call int64) error {
		if call == n {
			return err
		}
		return nil
	}
}

// hangUntilDone is a hook that waits for the call's context to end.
func hangUntilDone(ctx context.Context, _ int64) error {
	<-ctx.Done()
	return ctx.Err()
}

// hangWhile returns a hook that, while hang is set, waits for the call's
// context to end, as a store that stopped answering does.
func hangWhile(hang *atomic.Bool) func(context.Context, int64) error {
	return func(ctx context.Context, _ int64) error {
		if hang.Load() {
			return hangUntilDone(ctx, 0)
		}
		return nil
	}
}

// atomicKV is fakeKV's ClearDeleter: entities live in a map, and a
// ClearAndDelete removes entities and markers under one lock, or neither.
// Its commit deletes the markers in the MemKV itself, as a store's own
// transaction does, past fakeKV's Delete hook and counters.
type atomicKV struct {
	*fakeKV
	mu       sync.Mutex
	entities map[string]bool
	cleared  map[string]int
	poison   map[string]bool
	calls    int

	// before runs before call number call (from 1) commits, without the
	// lock: a non-nil error is the call's, and nothing is committed.
	before func(ctx context.Context, call int, ids []string, keys [][]byte) error
	// after runs once the call is done, and returns the call's error.
	after func(call int, err error) error
}

// atomicOver returns an atomicKV, a Mover, over mem (a new MemKV if nil).
func atomicOver(mem *MemKV) *atomicKV {
	return &atomicKV{fakeKV: newFakeKV(mem), entities: map[string]bool{}, cleared: map[string]int{}, poison: map[string]bool{}}
}

func (a *atomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	a.mu.Lock()
	a.calls++
	call, before, after := a.calls, a.before, a.after
	a.mu.Unlock()
	var err error
	if before != nil {
		err = before(ctx, call, ids, keys)
	}
	if err == nil {
		err = a.commit(ctx, ids, keys)
	}
	if after != nil {
		err = after(call, err)
	}
	return err
}

// commit clears ids and deletes keys, the markers of ids under "runs/", if
// none of ids is poison and every key is there; else it changes nothing.
func (a *atomicKV) commit(ctx context.Context, ids []string, keys [][]byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	want := map[string]bool{}
	for _, id := range ids {
		if a.poison[id] {
			return fmt.Errorf("constraint violated by %s", id)
		}
		want[id] = true
	}
	for _, key := range keys {
		_, gotID, err := ParseMarkerKey("runs/", key)
		if err != nil || !want[string(gotID)] {
			return fmt.Errorf("key %q is not the marker of an id of the batch", key)
		}
		if _, ok, _ := a.MemKV.Get(ctx, key); !ok {
			return fmt.Errorf("%w: %q", ErrMarkerGone, key)
		}
	}
	for _, id := range ids {
		delete(a.entities, id)
		a.cleared[id]++
	}
	return a.MemKV.Delete(ctx, keys...)
}

// cancelAfterFirstCommit makes a's first call cancel the pass once it
// committed, as a SIGTERM landing just after a commit does.
func cancelAfterFirstCommit(a *atomicKV, cancel context.CancelFunc) *atomicKV {
	a.after = func(call int, err error) error {
		if call == 1 {
			cancel()
		}
		return err
	}
	return a
}

// errLostReply is the error of a ClearAndDelete whose reply was lost, or
// whose timeout fired as it committed: it may or may not have committed.
var errLostReply = fmt.Errorf("read reply: %w", context.DeadlineExceeded)

// refuse returns a before hook that refuses a call holding an id answers
// names with a BatchError of their answers, committing nothing, as the
// ClearDeleter contract says a failed call does.
func refuse(answers map[string]error) func(context.Context, int, []string, [][]byte) error {
	return func(_ context.Context, _ int, ids []string, _ [][]byte) error {
		perID := BatchError{}
		for _, id := range ids {
			if err, ok := answers[id]; ok {
				perID[id] = err
			}
		}
		if len(perID) > 0 {
			return perID
		}
		return nil
	}
}

// loseReplies makes every ClearAndDelete of a fail with errLostReply,
// having committed when commit is set, without committing otherwise; once
// a call has failed, every Scan fails with scanErr when it is not nil.
func loseReplies(a *atomicKV, commit bool, scanErr error) *atomicKV {
	var failed atomic.Bool
	if !commit {
		a.before = func(context.Context, int, []string, [][]byte) error {
			failed.Store(true)
			return errLostReply
		}
	}
	a.after = func(_ int, err error) error {
		if commit && err != nil {
			return err
		}
		failed.Store(true)
		return errLostReply
	}
	a.onScan = func(context.Context, int64) error {
		if scanErr != nil && failed.Load() {
			return scanErr
		}
		return nil
	}
	return a
}

// newAtomicKV returns an atomicKV holding n markers finished at t0 (markN)
// and their entities, and the markers' ids.
func newAtomicKV(t testing.TB, n int) (*atomicKV, []string) {
	mem := NewMemKV()
	kv := atomicOver(mem)
	ids := markN(t, mem, n, t0)
	for _, id := range ids {
		kv.entities[id] = true
	}
	return kv, ids
}

// runKV is atomicKV as a RunClearer: ClearRun reads its run from the
// MemKV, refuses one holding a key that is no marker, and commits it as
// ClearAndDelete does (hooks and poison included), returning the run's
// keys with its error, and counts its calls.
type runKV struct {
	*atomicKV
	runs        atomic.Int64
	unsupported bool // ClearRun says it cannot clear runs
	keysLost    bool // a lost reply comes without the run's keys, as from one message sent whole
}

func runOver(mem *MemKV) *runKV { return &runKV{atomicKV: atomicOver(mem)} }

func (r *runKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	r.runs.Add(1)
	if r.unsupported {
		return nil, fmt.Errorf("no SQL to clear by: %w", errors.ErrUnsupported)
	}
	keys, err := r.MemKV.Scan(ctx, from, end, limit)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, key := range keys {
		_, id, err := ParseMarkerKey(prefix, key)
		if err != nil {
			return nil, err
		}
		if len(ids) == 0 || !slices.Contains(ids, string(id)) {
			ids = append(ids, string(id))
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	err = r.ClearAndDelete(ctx, ids, keys)
	if r.keysLost && errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	return keys, err
}

// RunStore implements RunClearer.
func (r *runKV) RunStore() RunClearer { return r }

// countKV is a runKV that counts its runs: CountRun clears a run as
// ClearRun does and answers with its count, reshaped when reshape is set;
// a run that would take two markers of one id is refused, changing
// nothing. With loseCount, a run that committed answers errLostReply.
type countKV struct {
	*runKV
	counts      atomic.Int64
	timesAsked  atomic.Int64 // CountRun calls asked for each marker's time
	uncountable bool         // CountRun says it cannot count its runs
	loseCount   bool
	reshape     func(RunCount) RunCount
}

func countOver(mem *MemKV) *countKV { return &countKV{runKV: runOver(mem)} }

func (c *countKV) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (RunCount, error) {
	c.counts.Add(1)
	if times {
		c.timesAsked.Add(1)
	}
	if c.uncountable {
		return RunCount{}, fmt.Errorf("the clear needs the ids: %w", errors.ErrUnsupported)
	}
	keys, err := c.MemKV.Scan(ctx, from, end, limit)
	if err != nil {
		return RunCount{}, err
	}
	seen := map[string]bool{}
	for _, key := range keys {
		if _, id, err := ParseMarkerKey(prefix, key); err == nil {
			if seen[string(id)] {
				return RunCount{}, fmt.Errorf("%w: two markers of %s", ErrMalformedMarker, id)
			}
			seen[string(id)] = true
		}
	}
	if keys, err = c.runKV.ClearRun(ctx, prefix, from, end, limit); err != nil {
		return RunCount{}, err
	}
	rc := countOfKeys(prefix, keys, times)
	if c.reshape != nil {
		rc = c.reshape(rc)
	}
	if c.loseCount && len(keys) > 0 {
		return RunCount{}, errLostReply
	}
	return rc, nil
}

// RunStore implements RunClearer.
func (c *countKV) RunStore() RunClearer { return c }

// countOfKeys is the RunCount of a run that deleted keys, markers of
// prefix in key order, with each key's time when times is set.
func countOfKeys(prefix string, keys [][]byte, times bool) RunCount {
	var c RunCount
	for i, key := range keys {
		at, _, _ := ParseMarkerKey(prefix, key)
		if i == 0 {
			c.First = at.UnixMilli()
		}
		if times {
			c.Times = append(c.Times, at.UnixMilli())
		}
		c.N, c.Last = i+1, key
	}
	return c
}
