package retentionui

import "errors"

// ErrInvalidOptions is returned by New when Options are not usable: no
// sweep, a nil or repeated sweep, a Limit out of range. The message names
// the field.
var ErrInvalidOptions = errors.New("retentionui: invalid options")

// The errors a request can meet, each answered with its HTTP status (see
// statusOf). They are not exported: a Go caller never receives them, a
// client reads the status and the JSON error.
var (
	errUnknownSweep = errors.New("retentionui: no sweep has this prefix")
	errInvalidID    = errors.New("retentionui: malformed id")
	errNotParked    = errors.New("retentionui: the id is not parked")
	errNotHeld      = errors.New("retentionui: the id is not held")
	errReadOnly     = errors.New("retentionui: the console is read-only")
	errCrossOrigin  = errors.New("retentionui: cross-origin request refused")
	errBadRequest   = errors.New("retentionui: bad request")
	errNotFound     = errors.New("retentionui: no such page")
	errMethod       = errors.New("retentionui: method not allowed")
)
