package retentionui

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/marksweep/retention"
)

// DefaultLimit is the number of markers a list shows, and counts, when
// Options.Limit is zero.
const DefaultLimit = 100

// Options configures a Handler. Only Sweeps is required.
type Options struct {
	// Sweeps are the sweeps the console shows, in this order, told apart
	// by their prefixes, which must differ. At least one.
	Sweeps []*retention.Sweep

	// Details tells, by prefix, what a Sweep does not tell about itself.
	// A sweep without one shows its retention as not given, and its
	// look-up searches the due and parked lists only. Nil means none.
	Details map[string]Detail

	// Recorder, when it is also the sweeps' Config.Observer, gives the
	// overview each sweep's last pass, lease and lag. Nil means those are
	// shown as not known.
	Recorder *Recorder

	// ReadOnly hides every action (Requeue, Release) and refuses every
	// POST with 403. False, the default, lets whoever reaches the handler
	// requeue and release: mount it behind your authentication.
	ReadOnly bool

	// Limit bounds what one request reads: the markers a list shows and
	// the counts of the overview (Sweep.Backlog's and Sweep.Pending's limit,
	// which read at most four Scan calls of Limit+1 keys per range), and
	// a tenth of the keys a look-up reads. Past it a count is shown as "at
	// least" and a list as cut off. Zero means DefaultLimit; otherwise 1
	// to retention.MaxPageSize/10.
	Limit int

	// Timeout bounds the store reads and writes of one request; past it
	// the page shows the error. Zero means 10 seconds; a negative value
	// means no limit but the request's own.
	Timeout time.Duration

	// Behind is how long past due the oldest due marker may be before the
	// overview says the sweep is behind. Zero means one minute.
	Behind time.Duration

	// Clock tells the time the pages show ages from. Nil means
	// retention.SystemClock.
	Clock retention.Clock
}

// Detail is what the console knows of a sweep beyond the Sweep itself.
type Detail struct {
	// Retention is the sweep's Config.Retention: shown on the overview,
	// and with KV, it tells a look-up when a marker not yet due falls
	// due. Zero means not given.
	Retention time.Duration

	// KV is the store the sweep reads (the one given to retention.New).
	// With it, a look-up also reads the markers not yet due, oldest
	// first, up to ten times Options.Limit keys. Nil means a look-up
	// searches the due and parked lists only.
	KV retention.KV
}

// validate checks o and fills in its defaults.
func (o *Options) validate() error {
	if len(o.Sweeps) == 0 {
		return fmt.Errorf("%w: Options.Sweeps is empty", ErrInvalidOptions)
	}
	seen := make(map[string]bool, len(o.Sweeps))
	for i, s := range o.Sweeps {
		if s == nil {
			return fmt.Errorf("%w: Options.Sweeps[%d] is nil", ErrInvalidOptions, i)
		}
		// A cancelled context makes Backlog read nothing: it only says
		// whether the Sweep was made by retention.New.
		if _, err := s.Backlog(cancelled, 1); errors.Is(err, retention.ErrNotConfigured) {
			return fmt.Errorf("%w: Options.Sweeps[%d] was not made by retention.New", ErrInvalidOptions, i)
		}
		if seen[s.Prefix()] {
			return fmt.Errorf("%w: Options.Sweeps has two sweeps of prefix %q", ErrInvalidOptions, s.Prefix())
		}
		seen[s.Prefix()] = true
	}
	for prefix, d := range o.Details {
		if !seen[prefix] {
			return fmt.Errorf("%w: Options.Details names prefix %q, of no sweep in Options.Sweeps", ErrInvalidOptions, prefix)
		}
		if d.Retention < 0 {
			return fmt.Errorf("%w: Options.Details[%q].Retention is negative (%v)", ErrInvalidOptions, prefix, d.Retention)
		}
	}
	switch {
	case o.Limit == 0:
		o.Limit = DefaultLimit
	case o.Limit < 1 || o.Limit > retention.MaxPageSize/10:
		return fmt.Errorf("%w: Options.Limit must be 1 to %d, got %d", ErrInvalidOptions, retention.MaxPageSize/10, o.Limit)
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	switch {
	case o.Behind == 0:
		o.Behind = time.Minute
	case o.Behind < 0:
		return fmt.Errorf("%w: Options.Behind is negative (%v)", ErrInvalidOptions, o.Behind)
	}
	if o.Clock == nil {
		o.Clock = retention.SystemClock
	}
	return nil
}

// cancelled is a context that is done from the start.
var cancelled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
