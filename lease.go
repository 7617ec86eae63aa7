package retention

import "context"

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
	// Fence returns a view of kv whose Delete, and Put when kv is a Putter,
	// take effect only while this lease is held, checked by the store in
	// the same operation. A write the fence refuses changes nothing and
	// returns an error matching ErrLeaseLost, and Lost is closed by then.
	// Scan reads kv unchanged. ok is false when the lease cannot fence kv
	// (a store of another engine, or a wrapped one); Run then writes
	// through kv unfenced and relies on Lost alone.
	Fence(kv KV) (fenced KV, ok bool)
}
