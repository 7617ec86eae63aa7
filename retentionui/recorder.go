package retentionui

import (
	"sync"
	"time"

	"github.com/marksweep/retention"
)

// Recorder is a retention.Observer that remembers, per sweep, what the
// overview shows and a Sweep does not tell: its last pass (Stats, error and
// when it ended), the last lease event, and the lag of the last cleared
// entity. Set it as the sweeps' Config.Observer and as Options.Recorder.
//
// The zero value is ready to use, with the system clock and no further
// observer. Its methods hold a mutex only to copy a few fields, never
// across a store call, so a slow console never holds up a pass.
type Recorder struct {
	// Clock tells when a pass ended. Nil means retention.SystemClock.
	Clock retention.Clock

	// Next, when set, receives every call after the Recorder: a
	// retentionprom or retentionotel Observer, so that one sweep feeds
	// both. Nil means none.
	Next retention.Observer

	mu     sync.Mutex
	sweeps map[string]*record
}

// record is what a Recorder remembers of one sweep.
type record struct {
	passAt   time.Time
	pass     retention.Stats
	passErr  string
	passes   int
	lease    retention.LeaseEvent
	leaseAt  time.Time
	lag      time.Duration
	lagAt    time.Time
	hasLag   bool
	hasPass  bool
	hasLease bool
}

var _ retention.Observer = (*Recorder)(nil)

func (r *Recorder) now() time.Time {
	if r.Clock == nil {
		return retention.SystemClock.Now()
	}
	return r.Clock.Now()
}

// update runs f on prefix's record under the mutex.
func (r *Recorder) update(prefix string, f func(*record)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sweeps == nil {
		r.sweeps = make(map[string]*record)
	}
	rec := r.sweeps[prefix]
	if rec == nil {
		rec = &record{}
		r.sweeps[prefix] = rec
	}
	f(rec)
}

// get returns a copy of prefix's record, and false when there is none.
func (r *Recorder) get(prefix string) (record, bool) {
	if r == nil {
		return record{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.sweeps[prefix]
	if !ok {
		return record{}, false
	}
	return *rec, true
}

// ObservePass records the pass, then calls Next.
func (r *Recorder) ObservePass(prefix string, st retention.Stats, err error) {
	now := r.now()
	r.update(prefix, func(rec *record) {
		rec.passAt, rec.pass, rec.passErr, rec.hasPass = now, st, "", true
		rec.passes++
		if err != nil {
			rec.passErr = err.Error()
		}
	})
	if r.Next != nil {
		r.Next.ObservePass(prefix, st, err)
	}
}

// ObserveLags records the lag of the newest entity cleared, then calls
// Next.
func (r *Recorder) ObserveLags(prefix string, lags []time.Duration) {
	if len(lags) > 0 {
		now := r.now()
		// Lags come oldest first: the last is the entity closest to now.
		last := lags[len(lags)-1]
		r.update(prefix, func(rec *record) { rec.lag, rec.lagAt, rec.hasLag = last, now, true })
	}
	if r.Next != nil {
		r.Next.ObserveLags(prefix, lags)
	}
}

// ObservePage calls Next: the Recorder keeps passes, not pages.
func (r *Recorder) ObservePage(prefix string, page retention.Stats) {
	if r.Next != nil {
		r.Next.ObservePage(prefix, page)
	}
}

// ObserveLease records the event, then calls Next.
func (r *Recorder) ObserveLease(prefix string, event retention.LeaseEvent) {
	now := r.now()
	r.update(prefix, func(rec *record) { rec.lease, rec.leaseAt, rec.hasLease = event, now, true })
	if r.Next != nil {
		r.Next.ObserveLease(prefix, event)
	}
}
