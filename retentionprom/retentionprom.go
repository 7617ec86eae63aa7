// Package retentionprom exports the metrics of retention sweeps to
// Prometheus. A Collector is both a prometheus.Collector and a
// retention.Observer: set it as the Config.Observer of one sweep or of
// every sweep of a Group, register it, and Watch the sweeps whose backlog
// it should report; the example of New does all three.
//
// Every series is labelled by the sweep's prefix:
//
//	retention_markers_total{outcome}           counter: markers handled, by outcome (cleared, failed, retried, parked, deferred, malformed, foreign, live_again, duplicate, held, would_clear, gone)
//	retention_clear_calls_total                counter: calls of Clear, ClearBatch or a ClearDeleter
//	retention_clear_calls_failed_total{cause}  counter: those calls that failed as a whole, by cause (error, timeout, panic)
//	retention_budget_wait_seconds_total        counter: time clears waited for Config.Limiter, the delete budget
//	retention_batch_size                       gauge: the batch size at the end of the last pass (ClearBatch, ClearDeleter)
//	retention_passes_total{result}             counter: passes, by result (ok, error, canceled, lease_lost)
//	retention_pass_duration_seconds            histogram: how long passes take
//	retention_clear_lag_seconds                histogram: how long past due each entity was cleared
//	retention_backlog_age_seconds              gauge: how long past due the oldest uncleared marker is, retrying ones included
//	retention_backlog_markers                  gauge: due markers not yet cleared, counted up to Options.BacklogLimit
//	retention_retrying_markers                 gauge: markers whose clear failed, waiting to be tried again, counted up to Options.BacklogLimit
//	retention_retrying_age_seconds             gauge: how long past due the oldest retrying marker's entity is
//	retention_parked_markers                   gauge: markers parked after Config.MaxAttempts failed clears, counted up to Options.BacklogLimit
//	retention_held_markers                     gauge: markers waiting for a hold's end (retention.Hold), counted up to Options.BacklogLimit
//	retention_backlog_errors_total             counter: scrapes whose backlog read failed
//	retention_lease_held                       gauge: 1 while this replica holds the sweep's lease
//	retention_lease_events_total{event}        counter: lease acquired, held (by another), lost, released
package retentionprom

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/marksweep/retention"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrInvalidOptions is returned by New when an Options field is out of
// range; the message names the field.
var ErrInvalidOptions = errors.New("retentionprom: invalid options")

// DefaultLagBuckets are the upper bounds, in seconds, of the lag histogram
// when Options.LagBuckets is nil: from 10ms (an idle sweep clears within
// moments of a marker falling due) to a day.
var DefaultLagBuckets = []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400}

// DefaultDurationBuckets are the upper bounds, in seconds, of the pass
// duration histogram when Options.DurationBuckets is nil.
var DefaultDurationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// Defaults of Options fields.
const (
	DefaultBacklogLimit   = 1000
	DefaultBacklogTimeout = 5 * time.Second
)

// Options configures a Collector. Every field has a usable zero value.
type Options struct {
	// Namespace is the first part of every metric name. Empty means
	// "retention".
	Namespace string

	// LagBuckets and DurationBuckets are the histograms' upper bounds in
	// seconds, strictly increasing. Nil means DefaultLagBuckets and
	// DefaultDurationBuckets.
	LagBuckets      []float64
	DurationBuckets []float64

	// BacklogLimit caps the counts of retention_backlog_markers,
	// retention_retrying_markers, retention_parked_markers and
	// retention_held_markers, and so the keys a scrape reads per watched
	// sweep (see retention.Sweep.Backlog).
	// Zero means DefaultBacklogLimit; otherwise 1 to retention.MaxPageSize.
	BacklogLimit int

	// BacklogTimeout bounds the backlog reads of one scrape. Zero means
	// DefaultBacklogTimeout; it must not be negative.
	BacklogTimeout time.Duration
}

// The outcomes of retention_markers_total, in the order of outcomeCounts,
// all counted page by page (ObservePage).
var outcomes = [...]string{"cleared", "failed", "retried", "parked", "deferred", "malformed", "foreign", "live_again", "duplicate",
	"held", "would_clear", "gone"}

// outcomeCounts returns the counts of st by outcome, in the order of
// outcomes.
func outcomeCounts(st *retention.Stats) [len(outcomes)]int {
	return [...]int{st.Cleared, st.Failed, st.Retried, st.Parked, st.Deferred, st.Malformed, st.Foreign, st.LiveAgain, st.Duplicates,
		st.Held, st.WouldClear, st.Gone}
}

// The causes of retention_clear_calls_failed_total, in the order of
// causeCounts.
var causes = [...]string{"error", "timeout", "panic"}

// causeCounts returns the failed clear calls of st by cause, in the order
// of causes. Timed-out and panicked calls are counted among FailedCalls
// too: the rest failed with an error.
func causeCounts(st *retention.Stats) [len(causes)]int {
	return [...]int{max(st.FailedCalls-st.TimedOutCalls-st.PanickedCalls, 0), st.TimedOutCalls, st.PanickedCalls}
}

// The results of retention_passes_total.
var results = [...]string{"ok", "error", "canceled", "lease_lost"}

var leaseEvents = [...]retention.LeaseEvent{retention.LeaseAcquired, retention.LeaseHeld, retention.LeaseLost, retention.LeaseReleased}

// Collector collects the metrics of the sweeps it observes. Create one with
// New; it is safe for concurrent use. Its zero value is not usable. Use one
// Collector for every sweep of a process, grouped or not (its series are
// labelled by prefix): a second Collector of the same Namespace is refused
// by the registry as a duplicate.
type Collector struct {
	opts Options

	markers, clearCalls, clearCallsFailed, passes, passDuration, lag                       *prometheus.Desc
	budgetWait, batchSize                                                                  *prometheus.Desc
	backlogAge, backlogMarkers, retryingMarkers, retryingAge, parkedMarkers, backlogErrors *prometheus.Desc
	heldMarkers                                                                            *prometheus.Desc
	leaseHeld, leaseEvents                                                                 *prometheus.Desc

	mu      sync.Mutex
	series  map[string]*series // by prefix
	watched []*retention.Sweep
}

// series is what a Collector keeps for one prefix.
type series struct {
	markers       [len(outcomes)]uint64
	clearCalls    uint64
	failedCalls   [len(causes)]uint64
	budgetWait    float64 // seconds
	batchSize     int     // 0: never a batch clear
	passes        [len(results)]uint64
	duration, lag histogram
	backlogErrors uint64
	leaseKnown    bool // a lease event was seen: the sweep has a lease
	leaseHeld     bool
	leaseEvents   [len(leaseEvents)]uint64
}

// histogram counts observations per bucket (not cumulative; the last one
// is +Inf) and their sum in seconds.
type histogram struct {
	counts []uint64
	sum    float64
}

// New returns a Collector configured by opts. The error matches
// ErrInvalidOptions.
func New(opts Options) (*Collector, error) {
	if opts.Namespace == "" {
		opts.Namespace = "retention"
	}
	if opts.LagBuckets == nil {
		opts.LagBuckets = DefaultLagBuckets
	}
	if opts.DurationBuckets == nil {
		opts.DurationBuckets = DefaultDurationBuckets
	}
	if opts.BacklogLimit == 0 {
		opts.BacklogLimit = DefaultBacklogLimit
	}
	if opts.BacklogTimeout == 0 {
		opts.BacklogTimeout = DefaultBacklogTimeout
	}
	if err := checkBuckets("LagBuckets", opts.LagBuckets); err != nil {
		return nil, err
	}
	if err := checkBuckets("DurationBuckets", opts.DurationBuckets); err != nil {
		return nil, err
	}
	switch {
	case opts.BacklogLimit < 1 || opts.BacklogLimit > retention.MaxPageSize:
		return nil, fmt.Errorf("%w: Options.BacklogLimit must be 0 (default %d) or 1 to %d, got %d",
			ErrInvalidOptions, DefaultBacklogLimit, retention.MaxPageSize, opts.BacklogLimit)
	case opts.BacklogTimeout < 0:
		return nil, fmt.Errorf("%w: Options.BacklogTimeout must not be negative, got %v", ErrInvalidOptions, opts.BacklogTimeout)
	}
	opts.LagBuckets = append([]float64(nil), opts.LagBuckets...)
	opts.DurationBuckets = append([]float64(nil), opts.DurationBuckets...)
	name := func(n string) string { return prometheus.BuildFQName(opts.Namespace, "", n) }
	prefix := []string{"prefix"}
	return &Collector{
		opts: opts,
		markers: prometheus.NewDesc(name("markers_total"),
			"Markers a sweep handled, by outcome: cleared, failed (Clear failed; the marker stays), retried (put off until its retry delay is over), "+
				"parked (failed Config.MaxAttempts times; never cleared until requeued), "+
				"deferred (skipped in its retry delay, counted at every pass), malformed (deleted without Clear), "+
				"foreign (keys under the prefix that are not markers, seen again at every pass), live_again, duplicate (further markers of an id met earlier in the pass), "+
				"held (Clear returned retention.Hold: kept until the hold's end, no failure), would_clear (a dry run would have cleared it; counted at every dry pass), gone (found deleted after a call whose outcome was lost: this replica's call or another's cleared it; not in cleared).",
			[]string{"prefix", "outcome"}, nil),
		clearCalls: prometheus.NewDesc(name("clear_calls_total"),
			"Calls of Clear, ClearBatch or a ClearDeleter.", prefix, nil),
		clearCallsFailed: prometheus.NewDesc(name("clear_calls_failed_total"),
			"Calls of Clear, ClearBatch or a ClearDeleter that failed as a whole, also those whose ids a bisection then cleared apart, "+
				"by cause: error, timeout (ran past ClearTimeout), panic.",
			[]string{"prefix", "cause"}, nil),
		budgetWait: prometheus.NewDesc(name("budget_wait_seconds_total"),
			"Time clears waited for Config.Limiter, the delete budget, added over calls: not lag the sweep can make up.", prefix, nil),
		batchSize: prometheus.NewDesc(name("batch_size"),
			"The batch size of ClearBatch or ClearDeleter calls at the end of the last pass (Config.BatchTarget shrinks it after slow calls).", prefix, nil),
		passes: prometheus.NewDesc(name("passes_total"),
			"Passes a sweep made, by result: ok, error (the store failed), canceled (shutdown), lease_lost.",
			[]string{"prefix", "result"}, nil),
		passDuration: prometheus.NewDesc(name("pass_duration_seconds"),
			"How long passes took.", prefix, nil),
		lag: prometheus.NewDesc(name("clear_lag_seconds"),
			"How long past due (its marker time plus the retention) each cleared entity's marker was deleted.", prefix, nil),
		backlogAge: prometheus.NewDesc(name("backlog_age_seconds"),
			"How long past due the oldest marker not yet cleared is, a retrying one included (from its entity's due time, not its retry time), "+
				"read at scrape time; 0 when the sweep is caught up.", prefix, nil),
		backlogMarkers: prometheus.NewDesc(name("backlog_markers"),
			fmt.Sprintf("Due markers not yet cleared, read at scrape time, counted up to %d.", opts.BacklogLimit), prefix, nil),
		retryingMarkers: prometheus.NewDesc(name("retrying_markers"),
			fmt.Sprintf("Markers whose clear failed, waiting to be tried again, read at scrape time, counted up to %d.", opts.BacklogLimit), prefix, nil),
		retryingAge: prometheus.NewDesc(name("retrying_age_seconds"),
			"How long past due the oldest retrying marker's entity is, read at scrape time; 0 when none is retrying.", prefix, nil),
		parkedMarkers: prometheus.NewDesc(name("parked_markers"),
			fmt.Sprintf("Markers parked after Config.MaxAttempts failed clears, never cleared until requeued, read at scrape time, counted up to %d.", opts.BacklogLimit), prefix, nil),
		heldMarkers: prometheus.NewDesc(name("held_markers"),
			fmt.Sprintf("Markers waiting for a hold's end (retention.Hold), not late, read at scrape time, counted up to %d.", opts.BacklogLimit), prefix, nil),
		backlogErrors: prometheus.NewDesc(name("backlog_errors_total"),
			"Scrapes whose read of the backlog failed; the backlog gauges are then missing.", prefix, nil),
		leaseHeld: prometheus.NewDesc(name("lease_held"),
			"1 while this replica holds the sweep's lease, else 0; absent for a sweep without a lease.", prefix, nil),
		leaseEvents: prometheus.NewDesc(name("lease_events_total"),
			"Lease events: acquired, held (found held by another replica), lost, released.",
			[]string{"prefix", "event"}, nil),
		series: map[string]*series{},
	}, nil
}

func checkBuckets(field string, b []float64) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: Options.%s must not be empty", ErrInvalidOptions, field)
	}
	for i := 1; i < len(b); i++ {
		if !(b[i] > b[i-1]) {
			return fmt.Errorf("%w: Options.%s must increase strictly, got %v then %v", ErrInvalidOptions, field, b[i-1], b[i])
		}
	}
	return nil
}

// Watch makes the Collector report the backlog of the sweeps (gauges
// retention_backlog_age_seconds, retention_backlog_markers,
// retention_retrying_markers, retention_retrying_age_seconds,
// retention_parked_markers and retention_held_markers), read with retention.Sweep.Backlog at every
// scrape: at most a few Scan calls of up to Options.BacklogLimit keys per
// sweep and range. A sweep watched again is read
// once. Sweeps of one prefix (over different stores) share its series: the
// counters add up, and the gauges show the oldest ages and the sums
// of the counts, or are missing when a read failed.
func (c *Collector) Watch(sweeps ...*retention.Sweep) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sweeps {
		if !slices.Contains(c.watched, s) {
			c.watched = append(c.watched, s)
		}
		c.get(s.Prefix())
	}
}

// get returns the series of prefix, creating it. c.mu is held.
func (c *Collector) get(prefix string) *series {
	s := c.series[prefix]
	if s == nil {
		s = &series{
			duration: histogram{counts: make([]uint64, len(c.opts.DurationBuckets)+1)},
			lag:      histogram{counts: make([]uint64, len(c.opts.LagBuckets)+1)},
		}
		c.series[prefix] = s
	}
	return s
}

// ObservePass implements retention.Observer. It counts the pass, its
// duration; its markers and calls were counted page by page
// (ObservePage).
func (c *Collector) ObservePass(prefix string, st retention.Stats, err error) {
	result := passResult(err)
	d := st.Duration.Seconds()
	i := sort.SearchFloat64s(c.opts.DurationBuckets, d)
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(prefix)
	s.passes[result]++
	s.batchSize = st.BatchSize
	s.duration.counts[i]++
	s.duration.sum += d
}

// ObservePage implements retention.Observer. It counts a page's markers by
// outcome and its clear
// calls, so that the counters advance with the lag histogram: a scrape in
// the middle of a pass sees as many cleared markers as lags.
func (c *Collector) ObservePage(prefix string, page retention.Stats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(prefix)
	counts := outcomeCounts(&page)
	for i, n := range counts {
		s.markers[i] += uint64(n)
	}
	s.clearCalls += uint64(page.ClearCalls)
	s.budgetWait += page.BudgetWait.Seconds()
	for i, n := range causeCounts(&page) {
		s.failedCalls[i] += uint64(n)
	}
}

// passResult is the index in results of a pass that ended with err. A
// cancelled pass ends with its context's error itself; a store call that
// ran out of StoreTimeout wraps a DeadlineExceeded of its own, and is an
// error.
func passResult(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, retention.ErrLeaseLost):
		return 3
	case err == context.Canceled || err == context.DeadlineExceeded: // ctx.Err() itself, not wrapped
		return 2
	}
	return 1
}

// ObserveLags implements retention.Observer. The lags of a page never
// increase along the slice, so each bucket's share is found by a binary
// search: the cost is per bucket, not per lag.
func (c *Collector) ObserveLags(prefix string, lags []time.Duration) {
	var sum float64 // ns; a Duration would overflow on a page of markers years past due
	sorted := true
	for i, l := range lags {
		sum += float64(l)
		if i > 0 && l > lags[i-1] {
			sorted = false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.get(prefix).lag
	h.sum += sum / float64(time.Second)
	bounds := c.opts.LagBuckets
	if !sorted { // not from a retention.Sweep, which promises the order
		for _, l := range lags {
			h.counts[sort.SearchFloat64s(bounds, l.Seconds())]++
		}
		return
	}
	rest := len(lags) // lags[:rest] are above the bounds seen so far
	for i, bound := range bounds {
		n := sort.Search(rest, func(j int) bool { return lags[j].Seconds() <= bound })
		h.counts[i] += uint64(rest - n)
		rest = n
	}
	h.counts[len(bounds)] += uint64(rest)
}

// ObserveLease implements retention.Observer.
func (c *Collector) ObserveLease(prefix string, e retention.LeaseEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(prefix)
	s.leaseKnown = true
	switch e {
	case retention.LeaseAcquired:
		s.leaseHeld = true
	case retention.LeaseLost, retention.LeaseReleased:
		s.leaseHeld = false
	}
	// LeaseHeld leaves the gauge: found held while this replica holds it,
	// it was this replica's own try (a LeasedPass during Run).
	for i, le := range leaseEvents {
		if le == e {
			s.leaseEvents[i]++
		}
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.markers, c.clearCalls, c.clearCallsFailed, c.budgetWait, c.batchSize, c.passes, c.passDuration, c.lag,
		c.backlogAge, c.backlogMarkers, c.retryingMarkers, c.retryingAge, c.parkedMarkers, c.heldMarkers, c.backlogErrors,
		c.leaseHeld, c.leaseEvents} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads the backlog of the
// watched sweeps, at once and outside the Collector's lock, each within
// Options.BacklogTimeout, then reports every series.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	watched := append([]*retention.Sweep(nil), c.watched...)
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.opts.BacklogTimeout)
	defer cancel()
	type backlog struct {
		age, retryingAge            time.Duration
		due, retrying, parked, held int
		failed                      bool
	}
	// Read at once, so that a store that does not answer leaves the
	// others their whole BacklogTimeout.
	reads := make([]struct {
		b   retention.Backlog
		err error
	}, len(watched))
	var wg sync.WaitGroup
	for i, s := range watched {
		wg.Go(func() { reads[i].b, reads[i].err = s.Backlog(ctx, c.opts.BacklogLimit) })
	}
	wg.Wait()
	var prefixes []string // in the order watched
	backlogs := map[string]*backlog{}
	for i, s := range watched {
		b := backlogs[s.Prefix()]
		if b == nil {
			b = &backlog{}
			backlogs[s.Prefix()] = b
			prefixes = append(prefixes, s.Prefix())
		}
		got, err := reads[i].b, reads[i].err
		if err != nil {
			b.failed = true
			continue
		}
		b.age, b.due = max(b.age, got.Age), b.due+got.Due
		b.retryingAge, b.retrying, b.parked = max(b.retryingAge, got.RetryingAge), b.retrying+got.Retrying, b.parked+got.Parked
		b.held += got.Held
	}
	for _, prefix := range prefixes {
		if b := backlogs[prefix]; !b.failed {
			ch <- prometheus.MustNewConstMetric(c.backlogAge, prometheus.GaugeValue, b.age.Seconds(), prefix)
			ch <- prometheus.MustNewConstMetric(c.backlogMarkers, prometheus.GaugeValue, float64(b.due), prefix)
			ch <- prometheus.MustNewConstMetric(c.retryingMarkers, prometheus.GaugeValue, float64(b.retrying), prefix)
			ch <- prometheus.MustNewConstMetric(c.retryingAge, prometheus.GaugeValue, b.retryingAge.Seconds(), prefix)
			ch <- prometheus.MustNewConstMetric(c.parkedMarkers, prometheus.GaugeValue, float64(b.parked), prefix)
			ch <- prometheus.MustNewConstMetric(c.heldMarkers, prometheus.GaugeValue, float64(b.held), prefix)
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	for _, prefix := range prefixes {
		if backlogs[prefix].failed {
			c.get(prefix).backlogErrors++
		}
	}
	for prefix, s := range c.series {
		for i, o := range outcomes {
			ch <- prometheus.MustNewConstMetric(c.markers, prometheus.CounterValue, float64(s.markers[i]), prefix, o)
		}
		ch <- prometheus.MustNewConstMetric(c.clearCalls, prometheus.CounterValue, float64(s.clearCalls), prefix)
		ch <- prometheus.MustNewConstMetric(c.budgetWait, prometheus.CounterValue, s.budgetWait, prefix)
		if s.batchSize > 0 {
			ch <- prometheus.MustNewConstMetric(c.batchSize, prometheus.GaugeValue, float64(s.batchSize), prefix)
		}
		for i, cause := range causes {
			ch <- prometheus.MustNewConstMetric(c.clearCallsFailed, prometheus.CounterValue, float64(s.failedCalls[i]), prefix, cause)
		}
		for i, r := range results {
			ch <- prometheus.MustNewConstMetric(c.passes, prometheus.CounterValue, float64(s.passes[i]), prefix, r)
		}
		ch <- s.duration.metric(c.passDuration, c.opts.DurationBuckets, prefix)
		ch <- s.lag.metric(c.lag, c.opts.LagBuckets, prefix)
		ch <- prometheus.MustNewConstMetric(c.backlogErrors, prometheus.CounterValue, float64(s.backlogErrors), prefix)
		if s.leaseKnown {
			held := 0.0
			if s.leaseHeld {
				held = 1
			}
			ch <- prometheus.MustNewConstMetric(c.leaseHeld, prometheus.GaugeValue, held, prefix)
			for i, e := range leaseEvents {
				ch <- prometheus.MustNewConstMetric(c.leaseEvents, prometheus.CounterValue, float64(s.leaseEvents[i]), prefix, e.String())
			}
		}
	}
}

// metric returns h as a constant Prometheus histogram, whose buckets are
// cumulative.
func (h *histogram) metric(desc *prometheus.Desc, bounds []float64, prefix string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(bounds))
	var n uint64
	for i, b := range bounds {
		n += h.counts[i]
		buckets[b] = n
	}
	n += h.counts[len(bounds)]
	return prometheus.MustNewConstHistogram(desc, n, h.sum, buckets, prefix)
}

var _ retention.Observer = (*Collector)(nil)
var _ prometheus.Collector = (*Collector)(nil)
