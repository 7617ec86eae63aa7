package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"math"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBatchSize is the number of ids a ClearBatch call gets when
// Config.BatchSize is zero: half of DefaultPageSize, so that a full page
// is two calls.
const DefaultBatchSize = DefaultPageSize / 2

// BatchError is what a Config.ClearBatch function returns to report ids
// one by one: it maps each id that was not cleared to its error. Ids of the
// batch that are not in it were cleared. An error wrapping ErrLiveAgain
// drops that id's marker without clearing, and Hold keeps that id past
// its retention, as they do from Clear. A
// ClearBatch may return it wrapped. A BatchError that names an id not in
// the batch fails the call as a whole, as any other error does: the ids it
// names are not the ones the sweep asked about, so what it says of the
// others cannot be trusted.
//
// From a ClearDeleter a BatchError means that the whole call was refused
// and changed nothing: the ids it names get their errors, and those it
// does not name, which were not cleared either, are sent again in a call
// of their own.
type BatchError map[string]error

func (e BatchError) Error() string {
	ids := make([]string, 0, len(e))
	for id := range e {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var b strings.Builder
	fmt.Fprintf(&b, "retention: %d ids of the batch not cleared", len(ids))
	for i, id := range ids {
		if i == maxExamples {
			b.WriteString("; ...")
			break
		}
		fmt.Fprintf(&b, "; %q: %v", id, e[id])
	}
	return b.String()
}

// clearBatches is clearAll for Config.ClearBatch: the page's pending items,
// oldest first, go in batches of BatchSize, at most Concurrency batches at
// a time. It returns how many ClearBatch calls it made.
//
// Without ClearBatch the pass's KV must be a ClearDeleter: each batch is
// then cleared and its markers deleted in one call.
func (s *Sweep) clearBatches(ctx context.Context, p *passState, keys [][]byte, items []item) (int, error) {
	var cd ClearDeleter
	if s.clearBatch == nil {
		var ok bool
		if cd, ok = p.kv.(ClearDeleter); !ok {
			// New checked the sweep's KV: only a fence can lose it.
			return 0, errors.New("retention: the lease's fenced view of the KV is no ClearDeleter: " +
				"it cannot clear and delete in one transaction, and the sweep will not do it in two")
		}
	}
	// An id that failed before, most likely a poison id, goes alone: in a
	// batch it would fail the batch and cost a bisection every time.
	var todo, alone []int
	for i := range items {
		if items[i].out == pending {
			if items[i].attempts > 0 || s.retries.failures(items[i].id) > 0 {
				alone = append(alone, i)
			} else {
				todo = append(todo, i)
			}
		}
	}
	b := &batching{s: s, p: p, ctx: ctx, kv: p.kv, items: items, keys: keys, atomic: cd, todo: todo, alone: alone}
	// Batches are cut as workers take them, at the size of the moment:
	// a slow call makes the batches after it smaller (Config.BatchTarget).
	workers := min(s.concurrency, (len(todo)+s.batchSize-1)/s.batchSize+len(alone))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				batch := b.take()
				if batch == nil {
					return
				}
				b.run(batch)
			}
		})
	}
	s.readAhead(ctx, p) // the next page, while the batches run
	wg.Wait()
	p.st.ScanCalls += int(b.scans.Load())
	p.st.Scanned += int(b.scanned.Load())
	if ferr := p.fenceErr.Load(); ferr != nil {
		return int(b.calls.Load()), *ferr
	}
	return int(b.calls.Load()), ctx.Err()
}

// callFailed counts, in the pass's Stats, a call of Clear, ClearBatch or a
// ClearDeleter that failed as a whole with err, by cause, and in the
// streak of calls that failed in a row.
func (p *passState) callFailed(err error) {
	p.streak.Add(1)
	p.failedCalls.Add(1)
	switch {
	case errors.Is(err, ErrClearPanicked) || errors.Is(err, errClearExited):
		p.panickedCalls.Add(1)
	case errors.Is(err, errClearTimedOut):
		p.timedOutCalls.Add(1)
	}
}

// batching is one page's batch clears in flight. Each item is written by
// the one worker that holds its batch.
type batching struct {
	s      *Sweep
	p      *passState
	ctx    context.Context
	kv     KV // the pass's KV, to read which markers are left
	items  []item
	keys   [][]byte     // the page's keys: keys[i] is items[i]'s
	atomic ClearDeleter // nil: ClearBatch, then the sweep deletes

	calls, scans, scanned atomic.Int64

	cut         sync.Mutex
	todo, alone []int // the batches not taken yet

	mu     sync.Mutex
	probed []probed // items tried alone in vain as probes
}

// take returns the next batch: up to the current batch size of the ids
// to batch, then the ids that go alone, one at a time; nil when none is
// left.
func (b *batching) take() []int {
	b.cut.Lock()
	defer b.cut.Unlock()
	if len(b.todo) > 0 {
		n := min(len(b.todo), int(b.s.curBatch.Load()))
		batch := b.todo[:n:n]
		b.todo = b.todo[n:]
		return batch
	}
	if len(b.alone) > 0 {
		batch := b.alone[:1:1]
		b.alone = b.alone[1:]
		return batch
	}
	return nil
}

// run clears the items at idx: one call, and where it fails as a whole,
// a bisection. During an outage (see bisect) a batch first tries some of
// its ids alone, one once the outage is confirmed: when they fail too, the
// rest is put off. An id that goes alone (it failed before) is always
// tried.
func (b *batching) run(idx []int) {
	if len(idx) > 1 && b.p.outageNow(len(idx)) {
		if !b.probe(idx, len(idx)) {
			b.fail(idx, errOutageSeen)
			return
		}
		if idx = b.pendingOf(idx); len(idx) == 0 {
			return
		}
	}
	err := b.try(idx)
	if err == nil || b.ctx.Err() != nil {
		return // cleared, or the pass is over and the items stay pending
	}
	b.p.callFailed(err)
	switch {
	case len(idx) == 1:
		it := &b.items[idx[0]]
		it.out, it.err = failed, err
	default:
		b.bisect(idx, err, idx)
	}
}

// pendingOf returns the items of idx still pending: not tried alone as
// probes.
func (b *batching) pendingOf(idx []int) []int {
	var out []int
	for _, i := range idx {
		if b.items[i].out == pending {
			out = append(out, i)
		}
	}
	return out
}

// probes is how many ids the sweep tries alone before it takes a streak
// of failed calls for an outage: one healthy id among them says the
// dependency is up. More than one, since a streak is most likely where
// poison ids are dense.
const probes = 3

// probe tries pending ids of the batch alone, from its end, which a
// bisection reaches last, until a call succeeds (the dependency answered:
// true) or the pass has tried enough ids alone in vain since its last
// success: then the outage is confirmed (false). Enough is one more once
// an outage was confirmed, else as many as the batch's outage budget of
// log2(size)+2 calls leaves, at most probes. Ids taken from the end, not
// from the half that just failed, are not the more likely to be poison.
// With no pending id left, nothing is decided: true.
func (b *batching) probe(batch []int, size int) bool {
	var need int64
	if b.p.confirmed.Load() {
		need = b.p.probeFails.Load() + 1 // one call: is it back?
	} else {
		need = int64(min(probes, max(1, int(math.Log2(float64(size)))+2-b.p.threshold(size))))
	}
	for j := len(batch) - 1; j >= 0; j-- {
		i := batch[j]
		if b.items[i].out != pending {
			continue
		}
		if b.p.probeFails.Load() >= need {
			b.confirm()
			return false
		}
		epoch := b.p.oks.Load()
		err := b.try([]int{i})
		if err == nil {
			return true
		}
		b.p.callFailed(err)
		if b.ctx.Err() != nil {
			return true // the pass is over: nothing to decide
		}
		b.p.probeFails.Add(1)
		it := &b.items[i]
		it.out, it.err = failed, err
		b.mu.Lock()
		b.probed = append(b.probed, probed{i: i, epoch: epoch})
		b.mu.Unlock()
	}
	if b.p.probeFails.Load() >= need {
		b.confirm()
		return false
	}
	return true
}

// probed is an item of the page tried alone as a probe, in vain, while the
// pass had seen epoch successes.
type probed struct {
	i     int
	epoch int64
}

// confirm records an outage: the items of the page probed in vain since
// the last success failed with the dependency, not by their own fault, so
// they are put off like the others (no attempt counted, not sent alone).
func (b *batching) confirm() {
	b.p.confirmed.Store(true)
	epoch := b.p.oks.Load()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pr := range b.probed {
		if it := &b.items[pr.i]; pr.epoch == epoch && it.out == failed {
			if !errors.As(it.err, new(*outageError)) {
				it.err = &outageError{n: 1, err: it.err}
			}
		}
	}
	b.probed = b.probed[:0]
}

// errOutageSeen is the error of ids put off: the calls before them failed.
var errOutageSeen = errors.New("retention: not tried: the clears before it all failed")

// ok records a call that succeeded (for some ids at least): the
// dependency is up.
func (p *passState) ok() {
	p.oks.Add(1)
	p.streak.Store(0)
	p.probeFails.Store(0)
	p.confirmed.Store(false)
}

// threshold is the streak of failed calls in a row after which, in a batch
// of size ids, the sweep suspects an outage and probes: log2(size)-2, at
// least 2, so that the streak and the probes stay within log2(size)+2
// calls.
func (p *passState) threshold(size int) int {
	return max(2, bits.Len(uint(size))-2)
}

// outageNow reports whether the calls of the pass have failed so often in
// a row that the dependency may be down, for a batch of size ids.
func (p *passState) outageNow(size int) bool {
	return p.streak.Load() >= int64(p.threshold(size))
}

// idsOf returns the ids of the items at idx.
func (b *batching) idsOf(idx []int) []string {
	ids := make([]string, len(idx))
	for j, i := range idx {
		ids[j] = b.items[i].id
	}
	return ids
}

// try calls ClearBatch (or the ClearDeleter) for the items at idx and
// records what it learns: all cleared on nil, each id's outcome from a
// BatchError, all live again on ErrLiveAgain. It returns any other error,
// which says nothing of any one id; the items then stay pending.
func (b *batching) try(idx []int) error {
	if b.atomic != nil {
		return b.tryAtomic(idx)
	}
	if err := b.s.waitBudget(b.ctx, b.p, len(idx)); err != nil {
		return err
	}
	b.calls.Add(1)
	start := b.s.clock.Now()
	err := b.s.callBatch(b.ctx, b.idsOf(idx))
	b.s.adapt(len(idx), b.s.clock.Now().Sub(start), err)
	var perID BatchError
	switch {
	case err == nil:
		b.p.ok()
		for _, i := range idx {
			b.items[i].out = cleared
		}
	case errors.As(err, &perID):
		if err := b.named(perID, idx); err != nil {
			return err
		}
		b.p.ok() // it answered for each id
		for _, i := range idx {
			it := &b.items[i]
			if e, ok := perID[it.id]; !ok {
				it.out = cleared
			} else {
				it.out, it.err = entryOutcome(e), e
			}
		}
	case wholeCall(err):
		b.p.ok()
		for _, i := range idx {
			b.items[i].out, b.items[i].err = outcomeOf(err), err
		}
	default:
		return err
	}
	return nil
}

// entryOutcome is the outcome of an id a BatchError names with e: live
// again, held or failed (a nil entry too: it names the id, not its clear).
func entryOutcome(e error) outcome {
	if out := outcomeOf(e); out != cleared {
		return out
	}
	return failed
}

// wholeCall reports whether err, returned by a whole ClearBatch or
// ClearDeleter call, answers for each of its ids alike: all live again,
// or all held.
func wholeCall(err error) bool {
	out := outcomeOf(err)
	return out == liveAgain || out == held
}

// named checks that every id a BatchError names is one of the batch's:
// ids of a batch are distinct (a pass dedupes them), so it counts them.
func (b *batching) named(perID BatchError, idx []int) error {
	n := 0
	for _, i := range idx {
		if _, ok := perID[b.items[i].id]; ok {
			n++
		}
	}
	if n == len(perID) {
		return nil
	}
	for id := range perID {
		if !slices.ContainsFunc(idx, func(i int) bool { return b.items[i].id == id }) {
			return fmt.Errorf("retention: a BatchError names %q, which is not in the batch of %d: %w", id, len(idx), perID)
		}
	}
	return nil
}

// tryAtomic is try for a ClearDeleter, whose call either commits every id
// of the batch with its markers or changes nothing.
func (b *batching) tryAtomic(idx []int) error {
	keys := b.keysOf(idx)
	if err := b.s.waitBudget(b.ctx, b.p, len(idx)); err != nil {
		return err
	}
	b.calls.Add(1)
	wctx, mark := b.p.writeCtx(b.ctx)
	start := b.s.clock.Now()
	err := b.s.callAtomic(wctx, b.atomic, b.idsOf(idx), keys)
	b.s.adapt(len(idx), b.s.clock.Now().Sub(start), err)
	if ferr := checkFenced(mark, b.kv, "ClearAndDelete"); ferr != nil {
		// The call went out unfenced: what it did stands, but no other
		// write may follow it; the page fails with ferr.
		b.p.fenceErr.CompareAndSwap(nil, &ferr)
		if err == nil {
			for _, i := range idx {
				b.items[i].out = clearedGone
			}
		}
		return nil
	}
	var perID BatchError
	switch {
	case err == nil:
		b.p.ok()
		var at int64
		if b.s.obs != nil { // the clock is read for the lags only
			at = b.s.clock.Now().UnixNano()
		}
		for _, i := range idx {
			b.items[i].out, b.items[i].withDups, b.items[i].doneAt = clearedGone, true, at
		}
		return nil
	case b.ctx.Err() != nil:
		b.cutShort(idx, keys)
		return err
	case errors.As(err, &perID):
		if err := b.named(perID, idx); err != nil {
			return err
		}
		if len(perID) == 0 {
			return fmt.Errorf("retention: the ClearDeleter refused the batch with a BatchError that names no id: %w", err)
		}
		b.p.ok() // it answered for each id
		// Nothing was committed: the ids not named were not cleared.
		var rest []int
		for _, i := range idx {
			it := &b.items[i]
			if e, ok := perID[it.id]; !ok {
				rest = append(rest, i)
			} else {
				it.out, it.err = entryOutcome(e), e
			}
		}
		if len(rest) > 0 {
			b.run(rest)
		}
		return nil
	case wholeCall(err):
		// Refused as a whole: nothing was committed.
		b.p.ok()
		for _, i := range idx {
			b.items[i].out, b.items[i].err = outcomeOf(err), err
		}
		return nil
	case errors.Is(err, ErrLeaseLost):
		return err
	}
	return b.unknown(idx, keys, err)
}

// cutShort marks gone the items at idx of an atomic call that failed as
// the pass was cut short. Their markers stay for the next pass, whose calls
// commit only where they are still there; one that committed as the pass
// ended is counted, when a read outside the pass's context tells.
func (b *batching) cutShort(idx []int, keys [][]byte) {
	rctx, cancel := withTimeout(context.WithoutCancel(b.ctx), b.s.storeTimeout)
	defer cancel()
	if left, err := b.left(rctx, keys); err == nil {
		b.markGone(idx, left)
	}
}

// unknown settles the items at idx of an atomic call that failed with err,
// which may have committed (a timeout, a lost connection).
func (b *batching) unknown(idx []int, keys [][]byte, err error) error {
	// The call may have committed without the sweep hearing of it (a
	// timeout, a lost connection), or another replica's may have: the
	// markers left say which. Markers are deleted only with their
	// entities, so one that is gone is an entity cleared.
	left, cerr := b.left(b.ctx, keys)
	if cerr != nil {
		b.p.callFailed(err)
		for _, i := range idx {
			it := &b.items[i]
			it.out, it.err = unknown, fmt.Errorf("%w; and reading which markers are left failed: %w", err, cerr)
		}
		return nil
	}
	rest := b.markGone(idx, left)
	switch {
	case len(rest) == len(idx):
		return err // nothing committed: the call failed as a whole
	case len(rest) > 0:
		// Some committed (another replica's call, most likely): this one
		// failed all the same.
		b.p.callFailed(err)
		b.run(rest)
	}
	return nil
}

// markGone records as found gone the items at idx with a marker missing
// from left (the markers left, ascending), and returns the others. An id
// with a marker gone was cleared with it, by this call or by another
// replica's (with fewer of its markers, maybe): which, the store cannot
// tell, so it is not counted as this replica's clear. Its other markers
// are duplicates the sweep deletes.
func (b *batching) markGone(idx []int, left [][]byte) (rest []int) {
	isLeft := func(key []byte) bool {
		_, ok := slices.BinarySearchFunc(left, key, bytes.Compare)
		return ok
	}
	for _, i := range idx {
		gone := !isLeft(b.keys[i])
		for j := b.items[i].next; j != 0 && !gone; j = b.items[j-1].next {
			gone = !isLeft(b.keys[j-1])
		}
		if gone {
			b.items[i].out = foundGone
		} else {
			rest = append(rest, i)
		}
	}
	return rest
}

// keysOf returns the markers of the items at idx, ascending: each item's
// and those of its duplicates on the page.
func (b *batching) keysOf(idx []int) [][]byte {
	keys := make([][]byte, 0, len(idx))
	dups := false
	for _, i := range idx {
		keys = append(keys, b.keys[i])
		for j := b.items[i].next; j != 0; j = b.items[j-1].next {
			keys, dups = append(keys, b.keys[j-1]), true
		}
	}
	if dups {
		slices.SortFunc(keys, bytes.Compare)
	}
	return keys
}

// left reads which of keys (ascending, all in the expired range) are
// still in the store, and returns them, ascending.
func (b *batching) left(ctx context.Context, keys [][]byte) ([][]byte, error) {
	var found [][]byte
	from, end := keys[0], keyAfter(keys[len(keys)-1])
	for {
		page, err := b.s.scanKV(ctx, b.kv, from, end, b.s.pageSize)
		b.scans.Add(1)
		b.scanned.Add(int64(len(page)))
		if err != nil {
			return nil, err
		}
		for _, k := range page {
			if _, ok := slices.BinarySearchFunc(keys, k, bytes.Compare); ok {
				found = append(found, k)
			}
		}
		if len(page) < b.s.pageSize {
			return found, nil
		}
		from = keyAfter(page[len(page)-1])
	}
}

// bisect finds the ids at fault in a batch whose call failed as a whole
// with err: it tries each half, and splits further each half that fails,
// down to single ids, so that each poison id costs about 2·log2(batch)
// calls and keeps no other id from being cleared, however many there are.
//
// That holds while the dependency shows it is up: some call succeeds every
// so often. Once the calls of the pass have failed log2(size) times in a
// row (size: the batch's), an outage is likely, and may have begun
// mid-pass: the bisection tries a few ids of the next half alone (see
// probe), and when they fail too the ids not tried yet wait out their
// retry delay rather than being called one by one. With poison ids in most
// halves the streak stays short, since a half without one succeeds, and
// the probe of a healthy id succeeds. In an outage a batch costs at most
// log2(size)+2 calls.
func (b *batching) bisect(idx []int, err error, batch []int) {
	if b.ctx.Err() != nil {
		return // the pass is over; the items stay pending
	}
	// Probes may have cleared some since the call failed: the culprit is
	// among the others.
	if idx = b.pendingOf(idx); len(idx) == 0 {
		return
	}
	if len(idx) == 1 {
		it := &b.items[idx[0]]
		it.out, it.err = failed, err
		return
	}
	h := len(idx) / 2
	for _, half := range [][]int{idx[:h], idx[h:]} {
		if half = b.pendingOf(half); len(half) == 0 {
			continue // cleared as probes
		}
		if b.p.outageNow(len(batch)) {
			if b.p.confirmed.Load() || !b.probe(batch, len(batch)) {
				b.fail(half, err) // the dependency seems down
				continue
			}
			if half = b.pendingOf(half); len(half) == 0 {
				continue
			}
		}
		if e := b.try(half); e != nil && b.ctx.Err() == nil {
			b.p.callFailed(e)
			b.bisect(half, e, batch)
		}
	}
}

// fail records the items at idx, not tried alone, as put off with err:
// every call of the pass failed, so the dependency seems down. Unless the
// pass is over.
func (b *batching) fail(idx []int, err error) {
	if b.ctx.Err() != nil {
		return
	}
	for _, i := range idx {
		if it := &b.items[i]; it.out == pending { // not a probe
			it.out, it.err = failed, &outageError{n: len(idx), err: err}
		}
	}
}

// outageError is the error of an id put off, not tried alone, because
// every call of its pass failed.
type outageError struct {
	n   int // ids put off with it
	err error
}

func (e *outageError) Error() string {
	return fmt.Sprintf("retention: not tried alone: every clear of the pass failed (the dependency seems down); %d ids put off: %v", e.n, e.err)
}

func (e *outageError) Unwrap() error { return e.err }

// adapt resizes the batches after a call of n ids that took d and ended
// with err (Config.BatchTarget): a call that ran long or timed out halves
// them, down to 1; a call of a full batch well under the target doubles
// them back, up to BatchSize.
func (s *Sweep) adapt(n int, d time.Duration, err error) {
	if s.batchTarget <= 0 {
		return
	}
	for {
		cur := s.curBatch.Load()
		next := cur
		switch {
		case d > s.batchTarget || errors.Is(err, errClearTimedOut):
			next = max(cur/2, 1)
		case answered(err) && d < s.batchTarget/4 && int64(n) >= cur:
			next = min(cur*2, int64(s.batchSize))
		}
		if next == cur || s.curBatch.CompareAndSwap(cur, next) {
			return
		}
	}
}

// answered reports whether a call that returned err answered for each of
// its ids (nil, a BatchError, all live again or all held): a call the
// store served, whatever it decided.
func answered(err error) bool {
	var perID BatchError
	return err == nil || wholeCall(err) || errors.As(err, &perID)
}
