package retention

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Locker hands out the lease that lets one replica of a fleet sweep a shared
// store at a time. A lease must expire by itself when its holder dies, so
// that a crashed replica blocks sweeping for at most the lease's TTL. Set
// it as Config.Lease or GroupConfig.Lease. See docs/fleet.md.
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
	// held for certain (expired, taken, its session ended, or released),
	// as soon as the implementation learns of it, and by its own timer
	// before the TTL could run out. Only a Fencer makes sure that no
	// marker is deleted after the lease passed on.
	Lost() <-chan struct{}

	// Release gives the lease up, if still held, so another replica can
	// take it at once, and frees what the lease used. It is safe to call
	// after the lease was lost, and more than once.
	Release(ctx context.Context) error
}

// Fencer is implemented by a Lease whose store can fence writes: refuse
// them, in the same operation that would make them, once the lease is no
// longer held by this holder, so that a holder slow to notice its loss
// cannot delete a marker after another replica took the lease. Run routes
// the marker writes of a pass through it. See docs/fleet.md.
type Fencer interface {
	// Fence returns a view of kv whose writes (Delete, Put, Move,
	// ClearAndDelete and ClearRun, as far as kv has them; a view that
	// embeds a RunClearer declares RunStore, see RunClearer) take effect
	// only while this
	// lease is held, checked by the store in the same operation. A write
	// the fence refuses changes nothing and returns an error matching
	// ErrLeaseLost, and Lost is closed by then. Scan reads kv unchanged.
	// ok is false when the lease cannot fence kv.
	Fence(kv KV) (fenced KV, ok bool)
}

// unwrapper is a KV that wraps another: the lease's fence travels to it on
// the context of its writes (docs/adapters.md, "Wrappers and the fence").
type unwrapper interface {
	Unwrap() KV
}

// fenceKey is the context key of the fence a write must apply.
type fenceKey struct{}

// fenceMark is the fence on the context of one write: Fenced counts the
// adapters that found it, to find out a wrapper that drops the context.
type fenceMark struct {
	f    Fencer
	seen atomic.Int32
}

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
// fenced by the lease whose fence ctx carries, nil when ctx carries none,
// and an error matching ErrUnfenced when the fence cannot fence kv: the
// write must then fail. An adapter whose leases fence it calls Fenced
// first in each of its write methods, even one given nothing to write, and
// writes through the view it returns, which must not call back into those
// methods. See docs/adapters.md, "Wrappers and the fence".
func Fenced(ctx context.Context, kv KV) (KV, error) {
	m, ok := ctx.Value(fenceKey{}).(*fenceMark)
	if !ok {
		return nil, nil
	}
	m.seen.Add(1)
	view, ok := m.f.Fence(kv)
	if !ok || view == nil {
		return nil, fmt.Errorf("%w: a write to a %T under a lease of %T", ErrUnfenced, kv, m.f)
	}
	return view, nil
}

// fenceFor returns how a pass over kv under the lease f writes: through a
// fenced view of kv, or through a wrapper with the fence on the writes'
// context (onCtx); else ok is false. A Fence with no view cannot fence.
func fenceFor(f Fencer, kv KV) (view KV, onCtx, ok bool) {
	if v, ok := f.Fence(kv); ok && v != nil {
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
		if v, ok := f.Fence(inner); ok && v != nil {
			return kv, true, true
		}
	}
	return nil, false, false
}

// maxUnwrap bounds the chain of wrappers fenceFor looks through: a wrapper
// whose Unwrap returns itself must not hang Run.
const maxUnwrap = 32
