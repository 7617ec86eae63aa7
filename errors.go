package retention

import "errors"

// ErrInvalidConfig is returned by New when a Config field is out of range.
// The message names the field and the value that was refused.
var ErrInvalidConfig = errors.New("retention: invalid config")

// ErrMalformedMarker is returned when a key is not a well-formed marker.
// The message says which part is wrong.
var ErrMalformedMarker = errors.New("retention: malformed marker")

// ErrInvalidID is returned when a marker id fails validation, either by
// ValidateID or by a Config.ValidateID function. Parse errors caused by a bad
// id match both ErrInvalidID and ErrMalformedMarker.
var ErrInvalidID = errors.New("retention: invalid marker id")

// ErrInvalidTime is returned when a marker would be written for a time
// before the Unix epoch or after MaxMarkerTime.
var ErrInvalidTime = errors.New("retention: invalid marker time")

// ErrLiveAgain is returned, wrapped or not, by a Config.Clear function to
// say that the entity is live again: the sweep deletes the marker without
// clearing and counts it in Stats.LiveAgain.
var ErrLiveAgain = errors.New("retention: entity is live again")

// ErrHeld is matched by the error Hold returns: errors.Is(err, ErrHeld)
// tells a hold from a failure.
var ErrHeld = errors.New("retention: entity is held")

// ErrClearPanicked is returned (wrapped, and counted in Stats.Failed) when a
// Config.Clear function panics. The sweep recovers, keeps the marker and logs
// the panic value with its stack.
var ErrClearPanicked = errors.New("retention: clear panicked")

// ErrLeaseHeld is returned by Locker.TryAcquire when another replica holds
// the lease.
var ErrLeaseHeld = errors.New("retention: lease held by another replica")

// ErrLeaseLost is the error (wrapped, next to context.Canceled) that
// Config.OnPass and Observer.ObservePass see for a pass cut short because
// the lease was lost; LeasedPass returns it for such a pass. A fenced write
// refused by the store (see Fencer) matches it too.
var ErrLeaseLost = errors.New("retention: lease lost")

// ErrNotConfigured is returned by the methods of a Sweep, Group or Sharded
// that was not made by New, NewGroup or NewSharded, such as a zero value.
var ErrNotConfigured = errors.New("retention: not configured")

// ErrRunning is returned by Run when the Sweep (or one of a Group's sweeps
// or a Sharded's shards) is already being run by another Run, of the
// Sweep, of a Group or of a Sharded.
var ErrRunning = errors.New("retention: already running")

// ErrMarkerGone is returned by a ClearDeleter's ClearAndDelete when a
// marker it was to delete no longer exists: it changed nothing.
var ErrMarkerGone = errors.New("retention: marker gone")

// ErrUnfenced is returned by Run and LeasedPass when the lease is a Fencer
// that cannot fence the sweep's KV, unless Config.AllowUnfenced is set, and
// by a store write made under a fence it cannot apply (see Fenced).
var ErrUnfenced = errors.New("retention: the lease cannot fence the store")
