// Package retentionotel exports the metrics of retention sweeps through the
// OpenTelemetry metric API. An Observer is a retention.Observer: set it as
// the Config.Observer of one sweep or of every sweep of a Group, and Watch
// the sweeps whose backlog it should report. The library uses the API
// only; the application picks the SDK and exporter. The example of New
// shows it with the SDK's manual reader.
//
// The instruments, each with the attribute retention.prefix:
//
//	retention.markers             counter {marker}, by retention.outcome: markers handled (cleared, failed, retried, parked, deferred, malformed, foreign, live_again, duplicate, held, would_clear, gone)
//	retention.clear.calls         counter {call}: calls of Clear, ClearBatch or a ClearDeleter
//	retention.clear.calls.failed  counter {call}, by retention.cause: those calls that failed as a whole (error, timeout, panic)
//	retention.passes              counter {pass}, by retention.pass.result (ok, error, canceled, lease_lost)
//	retention.pass.duration       histogram s: how long passes take
//	retention.clear.lag           histogram s: how long past due each entity was cleared
//	retention.backlog.age         gauge s: how long past due the oldest uncleared marker is, retrying ones included
//	retention.backlog.markers     gauge {marker}: due markers not yet cleared, counted up to Options.BacklogLimit
//	retention.retrying.markers    gauge {marker}: markers whose clear failed, waiting to be tried again, counted up to Options.BacklogLimit
//	retention.retrying.age        gauge s: how long past due the oldest retrying marker's entity is
//	retention.parked.markers      gauge {marker}: markers parked after Config.MaxAttempts failed clears, counted up to Options.BacklogLimit
//	retention.held.markers        gauge {marker}: markers waiting for a hold's end (retention.Hold), counted up to Options.BacklogLimit
//	retention.backlog.errors      counter {error}: collections whose backlog read failed
//	retention.lease.held          gauge {lease}: 1 while this replica holds the sweep's lease
//	retention.lease.events        counter {event}, by retention.lease.event: acquired, held, lost, released
package retentionotel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/marksweep/retention"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the Observer's meter.
const ScopeName = "github.com/marksweep/retention/retentionotel"

// ErrInvalidOptions is returned by New when an Options field is out of
// range; the message names the field.
var ErrInvalidOptions = errors.New("retentionotel: invalid options")

// DefaultLagBuckets and DefaultDurationBuckets are the explicit bucket
// boundaries, in seconds, the histograms advise when Options leaves them
// nil. A View of the SDK can override them.
var (
	DefaultLagBuckets      = []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400}
	DefaultDurationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
)

// DefaultBacklogLimit is Options.BacklogLimit when zero.
const DefaultBacklogLimit = 1000

// Options configures an Observer. Every field has a usable zero value.
type Options struct {
	// MeterProvider provides the meter. Nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// LagBuckets and DurationBuckets advise the histograms' bucket
	// boundaries in seconds, strictly increasing. Nil means
	// DefaultLagBuckets and DefaultDurationBuckets.
	LagBuckets      []float64
	DurationBuckets []float64

	// BacklogLimit caps the counts of retention.backlog.markers,
	// retention.retrying.markers, retention.parked.markers and
	// retention.held.markers, and so the keys a collection reads per
	// watched sweep (see retention.Sweep.Backlog). Zero means
	// DefaultBacklogLimit; otherwise 1 to retention.MaxPageSize.
	BacklogLimit int
}

// The outcomes of retention.markers, in the order of outcomeCounts, all
// counted page by page (ObservePage).
var outcomes = [...]string{"cleared", "failed", "retried", "parked", "deferred", "malformed", "foreign", "live_again", "duplicate",
	"held", "would_clear", "gone"}

// outcomeCounts returns the counts of st by outcome, in the order of
// outcomes.
func outcomeCounts(st *retention.Stats) [len(outcomes)]int {
	return [...]int{st.Cleared, st.Failed, st.Retried, st.Parked, st.Deferred, st.Malformed, st.Foreign, st.LiveAgain, st.Duplicates,
		st.Held, st.WouldClear, st.Gone}
}

// The causes of retention.clear.calls.failed, in the order of causeCounts.
var causes = [...]string{"error", "timeout", "panic"}

// causeCounts returns the failed clear calls of st by cause, in the order
// of causes. Timed-out and panicked calls are counted among FailedCalls
// too: the rest failed with an error.
func causeCounts(st *retention.Stats) [len(causes)]int {
	return [...]int{max(st.FailedCalls-st.TimedOutCalls-st.PanickedCalls, 0), st.TimedOutCalls, st.PanickedCalls}
}

var results = [...]string{"ok", "error", "canceled", "lease_lost"}

// Observer records the metrics of the sweeps it observes. Create one with
// New; it is safe for concurrent use. Its zero value is not usable.
type Observer struct {
	limit int

	markers, clearCalls, failedCalls, passes, leaseEvents, backlogErrors metric.Int64Counter
	duration, lag                                                        metric.Float64Histogram
	budgetWait                                                           metric.Float64Counter
	batchSize                                                            metric.Int64Gauge
	backlogAge, retryingAge                                              metric.Float64ObservableGauge
	backlogMarkers, retryingMarkers, parkedMarkers, heldMarkers          metric.Int64ObservableGauge
	leaseHeld                                                            metric.Int64ObservableGauge

	mu       sync.Mutex
	byPrefix map[string]*attrs
	watched  []*retention.Sweep
}

// attrs holds the measurement options of one prefix, made once so that
// recording allocates nothing.
type attrs struct {
	prefix    metric.MeasurementOption
	outcome   [len(outcomes)]metric.MeasurementOption
	cause     [len(causes)]metric.MeasurementOption
	result    [len(results)]metric.MeasurementOption
	event     map[retention.LeaseEvent]metric.MeasurementOption
	record    []metric.RecordOption // prefix, for the histograms
	leaseSeen bool                  // the sweep has a lease
	leaseHeld bool
}

// New returns an Observer whose instruments come from opts.MeterProvider.
// The error matches ErrInvalidOptions, or is the meter's.
func New(opts Options) (*Observer, error) {
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	lagBuckets, durBuckets := opts.LagBuckets, opts.DurationBuckets
	if lagBuckets == nil {
		lagBuckets = DefaultLagBuckets
	}
	if durBuckets == nil {
		durBuckets = DefaultDurationBuckets
	}
	for field, b := range map[string][]float64{"LagBuckets": lagBuckets, "DurationBuckets": durBuckets} {
		if len(b) == 0 {
			return nil, fmt.Errorf("%w: Options.%s must not be empty", ErrInvalidOptions, field)
		}
		for i := 1; i < len(b); i++ {
			if !(b[i] > b[i-1]) {
				return nil, fmt.Errorf("%w: Options.%s must increase strictly, got %v then %v", ErrInvalidOptions, field, b[i-1], b[i])
			}
		}
	}
	limit := opts.BacklogLimit
	if limit == 0 {
		limit = DefaultBacklogLimit
	}
	if limit < 1 || limit > retention.MaxPageSize {
		return nil, fmt.Errorf("%w: Options.BacklogLimit must be 0 (default %d) or 1 to %d, got %d",
			ErrInvalidOptions, DefaultBacklogLimit, retention.MaxPageSize, limit)
	}

	m := mp.Meter(ScopeName)
	o := &Observer{limit: limit, byPrefix: map[string]*attrs{}}
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, e := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = errors.Join(err, e)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, e := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		err = errors.Join(err, e)
		return h
	}
	o.markers = counter("retention.markers", "{marker}",
		"Markers a sweep handled, by outcome: cleared, failed, retried, parked (failed Config.MaxAttempts times; never cleared until requeued), "+
			"deferred (skipped in its retry delay, at every pass), malformed, foreign (seen again at every pass), live_again, duplicate, "+
			"held (Clear returned retention.Hold: kept until the hold's end, no failure), would_clear (a dry run would have cleared it; at every dry pass), gone (found deleted after a call whose outcome was lost: this replica's call or another's cleared it; not in cleared).")
	o.clearCalls = counter("retention.clear.calls", "{call}", "Calls of Clear, ClearBatch or a ClearDeleter.")
	o.failedCalls = counter("retention.clear.calls.failed", "{call}",
		"Calls of Clear, ClearBatch or a ClearDeleter that failed as a whole, also those whose ids a bisection then cleared apart, "+
			"by cause: error, timeout (ran past ClearTimeout), panic.")
	o.passes = counter("retention.passes", "{pass}", "Passes a sweep made, by result: ok, error, canceled, lease_lost.")
	var ferr error
	o.budgetWait, ferr = m.Float64Counter("retention.budget.wait", metric.WithUnit("s"),
		metric.WithDescription("Time clears waited for Config.Limiter, the delete budget, added over calls: not lag the sweep can make up."))
	err = errors.Join(err, ferr)
	o.batchSize, ferr = m.Int64Gauge("retention.batch.size", metric.WithUnit("{id}"),
		metric.WithDescription("The batch size of ClearBatch or ClearDeleter calls at the end of the last pass (Config.BatchTarget shrinks it after slow calls)."))
	err = errors.Join(err, ferr)
	o.leaseEvents = counter("retention.lease.events", "{event}", "Lease events: acquired, held (by another replica), lost, released.")
	o.backlogErrors = counter("retention.backlog.errors", "{error}", "Collections whose read of the backlog failed.")
	o.duration = histogram("retention.pass.duration", "How long passes took.", durBuckets)
	o.lag = histogram("retention.clear.lag", "How long past due (marker time plus retention) each cleared entity's marker was deleted.", lagBuckets)
	var e error
	o.backlogAge, e = m.Float64ObservableGauge("retention.backlog.age", metric.WithUnit("s"),
		metric.WithDescription("How long past due the oldest marker not yet cleared is, a retrying one included (from its entity's due time, "+
			"not its retry time); 0 when the sweep is caught up."))
	err = errors.Join(err, e)
	o.backlogMarkers, e = m.Int64ObservableGauge("retention.backlog.markers", metric.WithUnit("{marker}"),
		metric.WithDescription(fmt.Sprintf("Due markers not yet cleared, counted up to %d.", limit)))
	err = errors.Join(err, e)
	o.retryingMarkers, e = m.Int64ObservableGauge("retention.retrying.markers", metric.WithUnit("{marker}"),
		metric.WithDescription(fmt.Sprintf("Markers whose clear failed, waiting to be tried again, counted up to %d.", limit)))
	err = errors.Join(err, e)
	o.retryingAge, e = m.Float64ObservableGauge("retention.retrying.age", metric.WithUnit("s"),
		metric.WithDescription("How long past due the oldest retrying marker's entity is; 0 when none is retrying."))
	err = errors.Join(err, e)
	o.parkedMarkers, e = m.Int64ObservableGauge("retention.parked.markers", metric.WithUnit("{marker}"),
		metric.WithDescription(fmt.Sprintf("Markers parked after Config.MaxAttempts failed clears, never cleared until requeued, counted up to %d.", limit)))
	err = errors.Join(err, e)
	o.heldMarkers, e = m.Int64ObservableGauge("retention.held.markers", metric.WithUnit("{marker}"),
		metric.WithDescription(fmt.Sprintf("Markers waiting for a hold's end (retention.Hold), not late, counted up to %d.", limit)))
	err = errors.Join(err, e)
	o.leaseHeld, e = m.Int64ObservableGauge("retention.lease.held", metric.WithUnit("{lease}"),
		metric.WithDescription("1 while this replica holds the sweep's lease, else 0."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	if _, err := m.RegisterCallback(o.observe, o.backlogAge, o.backlogMarkers, o.retryingMarkers, o.retryingAge, o.parkedMarkers, o.heldMarkers, o.leaseHeld); err != nil {
		return nil, err
	}
	return o, nil
}

// Watch makes the Observer report the backlog of the sweeps
// (retention.backlog.age, retention.backlog.markers,
// retention.retrying.markers, retention.retrying.age,
// retention.parked.markers and retention.held.markers), read with
// retention.Sweep.Backlog at every collection, under the collection's
// context. A sweep watched again is read once. Sweeps of one prefix (over different stores) share its
// attributes: the counters add up, and the gauges show the oldest ages and
// the sums of the counts, or nothing when a read failed.
func (o *Observer) Watch(sweeps ...*retention.Sweep) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range sweeps {
		if !slices.Contains(o.watched, s) {
			o.watched = append(o.watched, s)
		}
		o.get(s.Prefix())
	}
}

// get returns the attributes of prefix, making them. o.mu is held.
func (o *Observer) get(prefix string) *attrs {
	a := o.byPrefix[prefix]
	if a != nil {
		return a
	}
	p := attribute.String("retention.prefix", prefix)
	set := attribute.NewSet(p)
	a = &attrs{prefix: metric.WithAttributeSet(set), event: map[retention.LeaseEvent]metric.MeasurementOption{}}
	a.record = []metric.RecordOption{metric.WithAttributeSet(set)}
	for i, v := range outcomes {
		a.outcome[i] = metric.WithAttributeSet(attribute.NewSet(p, attribute.String("retention.outcome", v)))
	}
	for i, v := range causes {
		a.cause[i] = metric.WithAttributeSet(attribute.NewSet(p, attribute.String("retention.cause", v)))
	}
	for i, v := range results {
		a.result[i] = metric.WithAttributeSet(attribute.NewSet(p, attribute.String("retention.pass.result", v)))
	}
	for _, e := range []retention.LeaseEvent{retention.LeaseAcquired, retention.LeaseHeld, retention.LeaseLost, retention.LeaseReleased} {
		a.event[e] = metric.WithAttributeSet(attribute.NewSet(p, attribute.String("retention.lease.event", e.String())))
	}
	o.byPrefix[prefix] = a
	return a
}

func (o *Observer) attrs(prefix string) *attrs {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.get(prefix)
}

// ObservePass implements retention.Observer. It counts the pass, its
// duration; its markers and calls were counted page by page
// (ObservePage).
func (o *Observer) ObservePass(prefix string, st retention.Stats, err error) {
	a, ctx := o.attrs(prefix), context.Background()
	o.passes.Add(ctx, 1, a.result[passResult(err)])
	o.duration.Record(ctx, st.Duration.Seconds(), a.record...)
	if st.BatchSize > 0 {
		o.batchSize.Record(ctx, int64(st.BatchSize), a.record...)
	}
}

// ObservePage implements retention.Observer. It counts a page's markers by
// outcome and its clear
// calls, so that the counters advance with the lag histogram: a collection
// in the middle of a pass sees as many cleared markers as lags.
func (o *Observer) ObservePage(prefix string, page retention.Stats) {
	a, ctx := o.attrs(prefix), context.Background()
	counts := outcomeCounts(&page)
	for i, n := range counts {
		if n > 0 {
			o.markers.Add(ctx, int64(n), a.outcome[i])
		}
	}
	if page.ClearCalls > 0 {
		o.clearCalls.Add(ctx, int64(page.ClearCalls), a.prefix)
	}
	if page.BudgetWait > 0 {
		o.budgetWait.Add(ctx, page.BudgetWait.Seconds(), a.prefix)
	}
	for i, n := range causeCounts(&page) {
		if n > 0 {
			o.failedCalls.Add(ctx, int64(n), a.cause[i])
		}
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

// ObserveLags implements retention.Observer. The metric API has no bulk
// record: each lag is one Record, without allocation.
func (o *Observer) ObserveLags(prefix string, lags []time.Duration) {
	a, ctx := o.attrs(prefix), context.Background()
	for _, l := range lags {
		o.lag.Record(ctx, l.Seconds(), a.record...)
	}
}

// ObserveLease implements retention.Observer.
func (o *Observer) ObserveLease(prefix string, e retention.LeaseEvent) {
	o.mu.Lock()
	a := o.get(prefix)
	a.leaseSeen = true
	switch e {
	case retention.LeaseAcquired:
		a.leaseHeld = true
	case retention.LeaseLost, retention.LeaseReleased:
		a.leaseHeld = false
	}
	// LeaseHeld leaves the gauge: found held while this replica holds it,
	// it was this replica's own try (a LeasedPass during Run).
	opt, ok := a.event[e]
	o.mu.Unlock()
	if ok {
		o.leaseEvents.Add(context.Background(), 1, opt)
	}
}

// observe is the callback of the gauges: it reads the backlog of the
// watched sweeps and reports who holds the lease.
func (o *Observer) observe(ctx context.Context, obs metric.Observer) error {
	o.mu.Lock()
	watched := append([]*retention.Sweep(nil), o.watched...)
	o.mu.Unlock()
	type backlog struct {
		age, retryingAge            time.Duration
		due, retrying, parked, held int
		failed                      bool
	}
	// Read at once, so that a store that does not answer does not hold up
	// the others until the collection's deadline.
	reads := make([]struct {
		b   retention.Backlog
		err error
	}, len(watched))
	var wg sync.WaitGroup
	for i, s := range watched {
		wg.Go(func() { reads[i].b, reads[i].err = s.Backlog(ctx, o.limit) })
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
		a, b := o.attrs(prefix), backlogs[prefix]
		if b.failed {
			o.backlogErrors.Add(ctx, 1, a.prefix)
			continue
		}
		obs.ObserveFloat64(o.backlogAge, b.age.Seconds(), a.prefix)
		obs.ObserveInt64(o.backlogMarkers, int64(b.due), a.prefix)
		obs.ObserveInt64(o.retryingMarkers, int64(b.retrying), a.prefix)
		obs.ObserveFloat64(o.retryingAge, b.retryingAge.Seconds(), a.prefix)
		obs.ObserveInt64(o.parkedMarkers, int64(b.parked), a.prefix)
		obs.ObserveInt64(o.heldMarkers, int64(b.held), a.prefix)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range o.byPrefix {
		if a.leaseSeen {
			held := int64(0)
			if a.leaseHeld {
				held = 1
			}
			obs.ObserveInt64(o.leaseHeld, held, a.prefix)
		}
	}
	return nil
}

var _ retention.Observer = (*Observer)(nil)
