package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// GroupConfig configures a Group. Every field has a usable zero value.
type GroupConfig struct {
	// Lease, when set, makes Run pass the group's sweeps only while this
	// replica holds it; see Config.Lease. Nil means no lease.
	Lease Locker

	// Logger receives the loop's own messages (lease changes, failed
	// passes). Each sweep logs its markers through its own Config.Logger.
	// Nil means slog.Default().
	Logger *slog.Logger

	// Jitter and StartJitter work as in Config, for the group's loop.
	Jitter      float64
	StartJitter time.Duration
}

// Group runs several sweeps, such as runs and batches under two prefixes,
// from one loop with one lease. Create one with NewGroup; most callers want
// Run. The zero value is not usable: its methods return an error matching
// ErrNotConfigured.
type Group struct {
	loop loop
}

// NewGroup returns a Group of the given sweeps. It refuses prefixes that
// are equal or overlap (one continues the other with a digit, as "runs/"
// and "runs/2024/"), a sweep with its own Config.Lease, and a nil Sweep or
// one not made by New, with an error matching ErrInvalidConfig.
func NewGroup(cfg GroupConfig, sweeps ...*Sweep) (*Group, error) {
	if len(sweeps) == 0 {
		return nil, invalidConfig("a Group needs at least one Sweep")
	}
	if err := checkJitter("GroupConfig", cfg.Jitter, cfg.StartJitter); err != nil {
		return nil, err
	}
	for i, s := range sweeps {
		if s == nil {
			return nil, invalidConfig("sweep %d is nil", i)
		}
		if s.configured("") != nil {
			return nil, invalidConfig("sweep %d was not made by retention.New (a zero value?)", i)
		}
		if s.lease != nil {
			return nil, invalidConfig("the sweep of prefix %q has its own Config.Lease; set GroupConfig.Lease instead", s.prefix)
		}
		for _, o := range sweeps[:i] {
			if s.prefix == o.prefix || inScanRange(s.prefix, o.prefix) || inScanRange(o.prefix, s.prefix) {
				return nil, invalidConfig("prefixes %q and %q overlap: the markers of one lie where the other "+
					"sweeps, so it would read them at every pass (as foreign keys)", o.prefix, s.prefix)
			}
		}
	}
	return &Group{loop: loop{
		members:     append([]*Sweep(nil), sweeps...),
		locker:      cfg.Lease,
		log:         cmp.Or(cfg.Logger, slog.Default()),
		jitter:      cfg.Jitter,
		startJitter: cfg.StartJitter,
	}}, nil
}

// inScanRange reports whether the keys under long lie in the range a sweep
// of short scans: short followed by a digit.
func inScanRange(long, short string) bool {
	return len(long) > len(short) && strings.HasPrefix(long, short) && long[len(short)] >= '0' && long[len(short)] <= '9'
}

// Pass passes every sweep of the group once, in order, without the lease,
// as Sweep.Pass does, and returns their Stats in the same order. A failing
// sweep does not stop the others; the error joins every failure.
func (g *Group) Pass(ctx context.Context) ([]Stats, error) {
	if err := g.configured("Pass"); err != nil {
		return nil, err
	}
	stats := make([]Stats, len(g.loop.members))
	var errs []error
	for i, s := range g.loop.members {
		st, err := s.Pass(ctx)
		stats[i] = st
		if err != nil {
			if ctx.Err() != nil {
				return stats, ctx.Err()
			}
			errs = append(errs, fmt.Errorf("prefix %q: %w", s.prefix, err))
		}
	}
	return stats, errors.Join(errs...)
}

// Run passes every sweep of the group in turn until ctx is done, then
// returns ctx.Err(), as Sweep.Run does for one sweep, with the group's
// lease and jitter, waking for the first of the sweeps' next markers. While
// one of its sweeps is run by another Run, it returns an error matching
// ErrRunning at once.
func (g *Group) Run(ctx context.Context) error {
	if err := g.configured("Run"); err != nil {
		return err
	}
	return g.loop.runExclusive(ctx)
}
