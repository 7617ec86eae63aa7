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
	// consider the lease gone when the channel is closed; implementations
	// close it before the lease could have passed to another replica.
	Lost() <-chan struct{}

	// Release gives the lease up, if still held, so another replica can
	// take it at once, and frees what the lease used. It is safe to call
	// after the lease was lost, and more than once.
	Release(ctx context.Context) error
}
