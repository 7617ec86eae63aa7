package retention

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Locker hands out the lease that lets one replica of a fleet sweep a shared
// store at a time. Implementations build on their engine's own primitive
// (an advisory lock, a key with a TTL, a session lease) and must make a
// lease expire by itself when its holder dies, so that a crashed or
// partitioned replica blocks sweeping for at most the lease's TTL.
//
// Set it as Config.Lease or GroupConfig.Lease; Run then calls TryAcquire
// before a pass whenever it does not hold the lease.
type Locker interface {
	// TryAcquire takes the lease if nobody holds it, without waiting. It
	// returns an error matching ErrLeaseHeld when another holder has it.
	TryAcquire(ctx context.Context) (Lease, error)
}

// Lease is a lease held by this replica. The implementation keeps it alive
// (renewing it, keeping its session or connection open) until Release or
// until it is lost.
type Lease interface {
	// Lost returns a channel that is closed once the lease is no longer
	// held for certain: it expired, was taken or revoked from outside, its
	// session or connection ended, or Release was called. A holder must
	// consider the lease gone when the channel is closed. Implementations
	// close it as soon as they learn of the loss, and by their own timer
	// before the lease's TTL could run out; but a lease taken from outside,
	// or a holder frozen past its TTL, learns of it late. Only a Fencer
	// makes sure that no marker is deleted after the lease passed on.
	Lost() <-chan struct{}

	// Release gives the lease up, if still held, so another replica can
	// take it at once, and frees what the lease used. It is safe to call
	// after the lease was lost, and more than once.
	Release(ctx context.Context) error
}

// Fencer is implemented by a Lease whose store can fence writes: refuse
// them, in the same operation that would make them, once the lease is no
// longer held by this holder. Lost alone is a timer in the client; a fence
// is checked by the store, so a holder that was frozen, partitioned or slow
// to notice its loss cannot delete a marker after another replica took the
// lease. Run detects it and routes the marker writes of a pass through it.
type Fencer interface {
	// Fence returns a view of kv whose writes (Delete, Put, Move and
	// ClearAndDelete, as far as kv has them) take effect only while this
	// lease is held, checked by the store in the same operation. A write
	// the fence refuses changes nothing and returns an error matching
	// ErrLeaseLost, and Lost is closed by then. Scan reads kv unchanged.
	// ok is false when the lease cannot fence kv (a store of another
	// engine, or a wrapper).
	Fence(kv KV) (fenced KV, ok bool)
}

// A KV that wraps another (to log, trace or count its calls) keeps the
// lease's fence when it has an Unwrap method returning the KV it wraps,
// and passes each call's context on to it:
//
//	func (w *loggingKV) Unwrap() retention.KV { return w.inner }
//
// When the lease cannot fence the wrapper itself, Run looks through Unwrap
// (again and again, for wrappers of wrappers) for a KV the lease can
// fence. The pass then calls the wrapper as usual, and its writes carry
// the fence in their context, where the adapter finds it with Fenced and
// applies it. Without such a KV in the chain, Run under a Fencer refuses
// to sweep (ErrUnfenced) unless Config.AllowUnfenced is set.

// unwrapper is a KV that wraps another.
type unwrapper interface {
	Unwrap() KV
}

// fenceKey is the context key of the fence a write must apply.
type fenceKey struct{}

// fenceMark is the fence on the context of one write: Fenced counts the
// adapters that found it, so that a wrapper that does not pass the
// context on is found out.
type fenceMark struct {
	f    Fencer
	seen atomic.Int32
}

// withFence returns ctx carrying f for the writes made under it, and the
// mark that tells whether an adapter found it.
func withFence(ctx context.Context, f Fencer) (context.Context, *fenceMark) {
	m := &fenceMark{f: f}
	return context.WithValue(ctx, fenceKey{}, m), m
}

// checkFenced returns an error matching ErrUnfenced when a write made
// through kv under the mark m never reached an adapter that applied it.
func checkFenced(m *fenceMark, kv KV, op string) error {
	if m == nil || m.seen.Load() > 0 {
		return nil
	}
	return fmt.Errorf("%w: %s through a %T reached no adapter that applied the lease's fence: "+
		"a wrapper must pass each call's context on to the KV it wraps (see Fencer)", ErrUnfenced, op, kv)
}

// Fenced is for implementers of KV and Fencer. It returns the view of kv
// fenced by the lease whose fence ctx carries, when ctx carries one: Run
// puts it on the context of every write of a pass over a wrapped KV (see
// Fencer). An adapter whose leases fence it calls Fenced first in each of
// its write methods (Delete, Put, Move, ClearAndDelete), even one given
// nothing to write, and, when it returns a view, writes through the view
// instead, which must not call back into those methods. Run checks that
// each write reached Fenced: before a pass it sends an empty Delete
// through the wrapper, and a write that did not reach it fails the pass
// with ErrUnfenced. It returns nil and no error when ctx carries
// no fence, and an error matching ErrUnfenced when the fence cannot fence
// kv: the write must then fail rather than go out unfenced.
func Fenced(ctx context.Context, kv KV) (KV, error) {
	m, ok := ctx.Value(fenceKey{}).(*fenceMark)
	if !ok {
		return nil, nil
	}
	m.seen.Add(1)
	view, ok := m.f.Fence(kv)
	if !ok {
		return nil, fmt.Errorf("%w: a write to a %T under a lease of %T", ErrUnfenced, kv, m.f)
	}
	return view, nil
}

// fenceFor returns how a pass over kv under the lease f writes: through a
// fenced view of kv (view), or through kv with the fence on the writes'
// context (onCtx), for a wrapper over a KV the lease can fence. ok is
// false when neither is possible.
func fenceFor(f Fencer, kv KV) (view KV, onCtx, ok bool) {
	if v, ok := f.Fence(kv); ok {
		return v, false, true
	}
	inner := kv
	for range maxUnwrap {
		u, isWrapper := inner.(unwrapper)
		if !isWrapper {
			return nil, false, false
		}
		if inner = u.Unwrap(); inner == nil {
			return nil, false, false
		}
		if _, ok := f.Fence(inner); ok {
			return kv, true, true
		}
	}
	return nil, false, false
}

// maxUnwrap bounds the chain of wrappers fenceFor looks through: a wrapper
// whose Unwrap returns itself must not hang Run.
const maxUnwrap = 32
