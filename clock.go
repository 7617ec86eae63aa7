package retention

import (
	"sync"
	"time"
)

// Clock tells a Sweep the current time. Config.Clock left nil means
// SystemClock. Tests that drive Pass by hand use a ManualClock; tests of Run
// are best written with testing/synctest.
type Clock interface {
	Now() time.Time
}

// SystemClock is the Clock that reads the real (or, under testing/synctest,
// the bubble's) time.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that only moves when told to. It is safe for
// concurrent use. Create one with NewManualClock; the zero value reads as the
// zero time.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a ManualClock reading t.
func NewManualClock(t time.Time) *ManualClock {
	return &ManualClock{now: t}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, which may be earlier than its current time.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock forward by d (backward when d is negative) and
// returns the new time.
func (c *ManualClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
