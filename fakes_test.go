package retention

import (
	"context"
	"sync"
	"sync/atomic"
)

// fakeKV is the store of the core's tests: the keys in a MemKV, call
// counters, fault hooks, and switches for what the store can do. Give the
// sweep f.store(), which is a Mover when canMove, a Putter only when
// canPut, and read-only otherwise; tests read and write the keys through
// the embedded MemKV.
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
