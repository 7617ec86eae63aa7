package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"
)

// RunClearer is a ClearDeleter that can also choose its batches: the store
// reads the markers, clears their entities and deletes them in one
// transaction, where a ClearDeleter is sent the keys a Scan read. Nothing
// crosses to the client but the keys deleted, so a pass costs one round
// trip a batch. pgkv.KV.WithClearSQL, rediskv.KV.WithStateKeys and
// sqlkv.KV.WithClear make one.
//
// A Sweep over a RunClearer, with Concurrency 1, no Config.ValidateID nor
// DryRun, calls ClearRun for its expired range, one call at a time (under
// a Config.Limiter, each once the budget granted its limit): the next as
// soon as one returns all it asked for, which the sweep then settles
// while the store clears the next. It reads the page and
// calls ClearAndDelete instead while an id waits in its memory (held, or
// in its retry delay) whose marker it read may still be in that range: it
// could not move the marker to the retry range (the Move failed, the pass
// was cut short, the store is no Mover) or the outcome of its clear is
// unknown; and for the rest of a range a run refused. An id whose marker
// moved to its held or retry key keeps no run off, however long its hold:
// a further marker of it (an id the writer marked twice) that a run takes
// goes to the store's clear with the run, which answers for the id again
// (keep returning Hold while an entity is held). A run whose reply is lost
// is not counted in Stats: the sweep cannot know which markers it took.
type RunClearer interface {
	ClearDeleter
	// ClearRun takes the first limit keys k with from <= k < end, or all
	// of them when fewer, and in one transaction clears the entities they
	// name and deletes them; it returns the keys it deleted, ascending. A
	// key's id follows prefix, TimestampWidth digits and a '/', as
	// MarkerKey writes it (a retry or parked key, which ParseMarkerKey
	// reads too, is no marker here).
	//
	// When a key of the run is not a marker whose id ValidateID accepts,
	// ClearRun changes nothing and returns an error matching
	// ErrMalformedMarker: the sweep then reads that part of the range
	// itself. A store that cannot clear runs (one made without the form
	// of clear they need) returns an error matching errors.ErrUnsupported,
	// and the Sweep calls it no more. Any other error is as from
	// ClearAndDelete: it changed nothing, unless it hides a commit; with
	// it ClearRun returns the keys of the run when it knows them, and the
	// sweep acts on the error as on a ClearAndDelete's of those keys (a
	// BatchError's ids get their answers, the others go again). With no
	// keys, the sweep reads the range itself.
	ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error)

	// RunStore returns the RunClearer itself. A wrapper that embeds one
	// inherits its ClearRun and RunStore, and RunStore then returns the
	// embedded store: the sweep takes runs only from a KV whose RunStore
	// returns a value of its own type, so that a wrapper (one that
	// rewrites keys, or checks what its ClearAndDelete is given) is read
	// page by page unless it declares both methods itself.
	RunStore() RunClearer
}

// RunCounter is a RunClearer whose runs can answer with less than their
// keys: how many markers the run deleted, its first marker's time and its
// last key, all the sweep needs of a run that cleared every marker it
// took; and each marker's time when the sweep observes each lag (an
// Observer is set). A store that deletes its runs by a range of an index
// then sends nothing back a row (sqlkv's AtomicTableKV without a
// ClearFunc: BENCHMARKS.md, "Your table is the marker").
//
// A Sweep that would call ClearRun calls CountRun instead, and counts N
// markers as Cleared: a RunCounter's run must not take two markers of one
// id. CountRun returns an error matching
// errors.ErrUnsupported when the store cannot count its runs (its clear
// needs the ids), having changed nothing, and the Sweep calls ClearRun at
// once and from then on.
type RunCounter interface {
	RunClearer
	// CountRun takes, clears and deletes a run as ClearRun does, with
	// the same errors, and returns what it took, with RunCount.Times
	// when times is set. With an error, only RunCount.Keys is read.
	CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (RunCount, error)
}

// RunCount is what a RunCounter's run took.
type RunCount struct {
	// N is how many markers the run deleted.
	N int
	// First is the time of the run's first marker, the Unix milliseconds
	// its key carries: the oldest, whose lag is the run's.
	First int64
	// Last is the run's last key; nil when it took none.
	Last []byte
	// Times holds, when CountRun was asked for times, the time of each
	// marker the run deleted, ascending with the keys: N of them, the
	// first First, the last Last's. Otherwise it may be nil.
	Times []int64
	// Keys, with CountRun's error, are the keys ClearRun would return
	// with it (see ClearRun): the sweep acts on the error as on
	// ClearRun's. Nil when the store does not know them.
	Keys [][]byte
}

// run is a ClearRun (or a CountRun) in flight.
type run struct {
	rc          RunClearer
	counted     bool // CountRun: its reply is count, not keys
	uncountable bool // CountRun said errors.ErrUnsupported, and ClearRun went
	from        []byte
	limit       int
	mark        *fenceMark
	call        guardedCall
	keys        [][]byte      // the reply, once call is done
	count       RunCount      // CountRun's reply
	took        time.Duration // how long the store took, for adapt
	doneAt      time.Time     // when the store answered, for the lags of a count
	clockPanic  *caughtPanic  // the Clock's, read after the run
}

// startRun asks the store for the next run of [from, end) when it is a
// RunClearer and nothing needs the run's ids in memory first, or returns
// nil: the sweep then reads the page itself.
func (s *Sweep) startRun(ctx context.Context, p *passState, from, end []byte) *run {
	rc, ok := p.kv.(RunClearer)
	if !ok || !s.runs || s.noRuns || p.inRetry || ctx.Err() != nil || s.retries.runsWait(s.clock.Now()) ||
		reflect.TypeOf(rc.RunStore()) != reflect.TypeOf(p.kv) {
		return nil
	}
	r := &run{rc: rc, from: from, limit: int(s.curBatch.Load())}
	rcount, counts := rc.(RunCounter)
	r.counted = counts && !s.noCount
	wctx, mark := p.writeCtx(ctx)
	r.mark = mark
	start := s.clock.Now()
	r.call = s.goGuarded(wctx, func(ctx context.Context) (err error) {
		if s.limiter != nil {
			// A run is charged its limit before it goes: the store picks
			// its keys. The last of a range, short, spends what it asked.
			if err := s.waitBudget(ctx, p, r.limit); err != nil {
				return err
			}
			start = s.clock.Now() // the store's time, for adapt, not the budget's
		}
		if r.counted {
			r.count, err = rcount.CountRun(ctx, s.prefix, from, end, r.limit, s.obs != nil)
			if errors.Is(err, errors.ErrUnsupported) {
				r.counted, r.uncountable = false, true // ClearRun at once
			}
		}
		if !r.counted {
			r.keys, err = rc.ClearRun(ctx, s.prefix, from, end, r.limit)
		}
		func() {
			defer func() {
				if v := recover(); v != nil {
					r.clockPanic = &caughtPanic{value: v}
				}
			}()
			r.doneAt = s.clock.Now()
			r.took = r.doneAt.Sub(start)
		}()
		return err
	})
	return r
}

// settleRun waits for r, a run of [.., end), and settles it as a page
// whose keys went in one ClearAndDelete: what a failed run answered for
// its ids is acted on as that call's answer would be, and the rest go
// again in calls of their own. It returns the run's keys and limit, or a
// limit of 0 when the sweep is to read the page itself. When the run took
// all it was asked for and ahead is set, the next run is started before
// this one is settled, and returned: the store works while the sweep
// counts (BENCHMARKS.md, "Runs").
func (s *Sweep) settleRun(ctx context.Context, p *passState, r *run, end []byte, ahead bool) (n int, last []byte, limit int, next *run, err error) {
	err = s.await(ctx, r.call)
	if r.clockPanic != nil {
		panic(r.clockPanic.value)
	}
	if r.uncountable {
		s.noCount = true
	}
	if r.counted && (err == nil || r.count.Keys == nil) {
		return s.settleCount(ctx, p, r, end, ahead, err)
	}
	if r.counted {
		r.keys = r.count.Keys // a failed run's, settled as ClearRun's
	}
	keys, limit := r.keys, r.limit
	if errors.Is(err, errors.ErrUnsupported) {
		s.noRuns = true
		return 0, nil, 0, nil, nil
	}
	s.adapt(len(keys), r.took, err)
	p.st.ClearCalls++
	if errors.Is(err, ErrMalformedMarker) {
		return 0, nil, 0, nil, nil // refused, changing nothing: the page sorts the keys out
	}
	if bad := badRun(keys, r.from, end, limit); bad != "" {
		return 0, nil, limit, nil, s.brokenRun(r, bad)
	}
	ferr := checkFenced(r.mark, p.kv, "ClearRun")
	if len(keys) == 0 {
		limit, err = emptyRun(ctx, p, limit, err, ferr)
		return 0, nil, limit, nil, err
	}
	settled := false
	if ahead && err == nil && ferr == nil && len(keys) == limit {
		next = s.startRun(ctx, p, keyAfter(keys[len(keys)-1]), end)
		if next != nil {
			defer func() {
				if !settled { // a panic or runtime.Goexit: waited for, not settled
					_ = s.await(ctx, next.call)
				}
			}()
		}
	}
	// The keys between the first and the last are checked while the store
	// clears the next run: 10,000 comparisons would keep it waiting.
	if bad := outOfOrder(keys); bad != "" {
		settled = true // the caller settles next
		return 0, nil, limit, next, s.brokenRun(r, bad)
	}
	// Not preparePage: the store took the run whatever waits in memory; a
	// failed run's ids that wait are deferred before the rest go again.
	items := s.parsePage(p, keys)
	b := s.batching(ctx, p, keys, items, r.rc)
	var idx []int // in key order, as a ClearAndDelete's keys must be: not todo then alone
	for i := range items {
		if items[i].out == pending {
			idx = append(idx, i)
		}
	}
	if aerr := b.answer(idx, b.keysOf(idx), err, ferr); aerr != nil {
		b.failed(b.notWaiting(b.pendingOf(idx)), aerr)
	}
	calls, err := b.end()
	err = s.afterClears(ctx, p, keys, items, calls, err)
	settled = true
	return len(keys), keys[len(keys)-1], limit, next, err
}

// emptyRun settles a run that took no key, or whose keys are unknown,
// and answered err (ferr: it went out unfenced). It returns the limit the
// walk goes on with, 0 to read the page itself, and the pass's error.
func emptyRun(ctx context.Context, p *passState, limit int, err, ferr error) (int, error) {
	switch {
	case ferr != nil:
		return limit, ferr
	case err == nil: // the range is empty
		return limit, nil
	case ctx.Err() != nil:
		return limit, ctx.Err()
	case errors.Is(err, ErrLeaseLost):
		return limit, err
	}
	p.callFailed(err)
	p.foldCalls()
	return 0, nil
}

// settleCount settles r, a CountRun of [.., end) that answered err, as
// settleRun does a ClearRun whose keys were all cleared: a failed run's
// keys are unknown, so the sweep reads that part of the range itself.
func (s *Sweep) settleCount(ctx context.Context, p *passState, r *run, end []byte, ahead bool, err error) (n int, last []byte, limit int, next *run, _ error) {
	c, limit := r.count, r.limit
	if err != nil {
		c = RunCount{} // not read: the sweep reads that part of the range
	}
	n = c.N
	s.adapt(n, r.took, err)
	p.st.ClearCalls++
	if errors.Is(err, ErrMalformedMarker) {
		return 0, nil, 0, nil, nil // refused, changing nothing: the page sorts the keys out
	}
	if bad := s.badCount(c, r.from, end, limit, s.obs != nil); bad != "" {
		return 0, nil, limit, nil, s.brokenRun(r, bad)
	}
	ferr := checkFenced(r.mark, p.kv, "CountRun")
	if n == 0 {
		limit, err = emptyRun(ctx, p, limit, err, ferr)
		return 0, nil, limit, nil, err
	}
	if ahead && ferr == nil && n == limit {
		next = s.startRun(ctx, p, keyAfter(c.Last), end)
	}
	// What it did stands, unfenced or not; an unfenced one fails the pass.
	if ferr == nil {
		p.ok()
	}
	p.st.Cleared += n
	p.st.MaxLag = max(p.st.MaxLag, p.cutoff.Sub(time.UnixMilli(c.First)))
	if s.obs != nil {
		s.observeTimes(c.Times, r.doneAt)
		s.observePage(p)
	}
	return n, c.Last, limit, next, ferr
}

// badCount says how what a CountRun returned breaks its contract, or "":
// a count below 0 or above the limit, a last key outside [from, end) or
// that is no marker, a first time after the last key's; and with times,
// not N of them, out of order, or not from First to the last key's.
func (s *Sweep) badCount(c RunCount, from, end []byte, limit int, times bool) string {
	n := c.N
	switch {
	case n < 0 || n > limit:
		return fmt.Sprintf("%d markers counted for a limit of %d", n, limit)
	case n == 0 && (c.Last != nil || len(c.Times) > 0):
		return fmt.Sprintf("a last key %q or times %v for no marker", c.Last, c.Times)
	case n == 0:
		return ""
	case bytes.Compare(c.Last, from) < 0 || bytes.Compare(c.Last, end) >= 0:
		return fmt.Sprintf("key %q returned outside [%q, %q)", c.Last, from, end)
	}
	lastMs, _, _, err := parseKey(s.prefix, c.Last)
	switch {
	case err != nil:
		return fmt.Sprintf("last key %q is no marker: %v", c.Last, err)
	case c.First > lastMs:
		return fmt.Sprintf("first time %d after the last key %q", c.First, c.Last)
	case !times && c.Times == nil:
		return ""
	case len(c.Times) != n:
		return fmt.Sprintf("%d times for %d markers", len(c.Times), n)
	case c.Times[0] != c.First || c.Times[n-1] != lastMs:
		return fmt.Sprintf("times from %d to %d where the first is %d and the last key %q", c.Times[0], c.Times[n-1], c.First, c.Last)
	}
	for i := 1; i < n; i++ {
		if c.Times[i] < c.Times[i-1] {
			return fmt.Sprintf("times returned out of order: %d after %d", c.Times[i], c.Times[i-1])
		}
	}
	return ""
}

// badRun says how the keys a ClearRun returned break its contract, or "":
// too many, or the first or the last outside [from, end). Keys in order
// (see outOfOrder) all lie between those two.
func badRun(keys [][]byte, from, end []byte, limit int) string {
	if len(keys) > limit {
		return fmt.Sprintf("%d keys returned for a limit of %d", len(keys), limit)
	}
	if n := len(keys); n > 0 {
		for _, key := range [][]byte{keys[0], keys[n-1]} {
			if bytes.Compare(key, from) < 0 || bytes.Compare(key, end) >= 0 {
				return fmt.Sprintf("key %q returned outside [%q, %q)", key, from, end)
			}
		}
	}
	return ""
}

// outOfOrder says which of the keys a ClearRun returned are not strictly
// ascending, or "".
func outOfOrder(keys [][]byte) string {
	for i := 1; i < len(keys); i++ {
		if bytes.Compare(keys[i-1], keys[i]) >= 0 {
			return fmt.Sprintf("keys returned out of order: %q after %q", keys[i], keys[i-1])
		}
	}
	return ""
}

// brokenRun stops runs after r broke the contract (bad says how): nothing
// the store said can be trusted, nor what it did.
func (s *Sweep) brokenRun(r *run, bad string) error {
	s.noRuns = true
	return fmt.Errorf("retention: ClearRun of a %T broke its contract: %s; the sweep reads pages from now on", r.rc, bad)
}
