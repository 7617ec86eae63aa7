package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBatchSize is the number of ids a ClearBatch call gets when
// Config.BatchSize is zero: half of DefaultPageSize, so that a full page
// is two calls.
const DefaultBatchSize = DefaultPageSize / 2

// BatchError is what a Config.ClearBatch function returns, wrapped or not,
// to report ids one by one: it maps each id that was not cleared to its
// error, and the ids of the batch it does not name were cleared. An entry
// wrapping ErrLiveAgain, or a Hold, acts as it does from Clear. A
// BatchError that names an id not in the batch fails the whole call.
//
// From a ClearDeleter a BatchError means that the call changed nothing:
// the ids it names get their errors, and the others are sent again in a
// call of their own. See docs/clearing.md.
type BatchError map[string]error

func (e BatchError) Error() string {
	ids := slices.Sorted(maps.Keys(e))
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

// clearBatches is clearAll for ClearBatch or a ClearDeleter, at most
// Concurrency batches at a time. It returns how many calls it made.
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
	b := s.batching(ctx, p, keys, items, cd)
	// Batches are cut as workers take them, so that a slow call makes the
	// batches after it smaller (Config.BatchTarget).
	workers := min(s.concurrency, (len(b.todo)+s.batchSize-1)/s.batchSize+len(b.alone))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			defer p.catch(nil)
			for ctx.Err() == nil {
				batch := b.take()
				if batch == nil {
					return
				}
				b.run(batch)
			}
		})
	}
	wg.Wait()
	return b.end()
}

// batching returns the batches of a page's pending items. An id that
// failed before, most likely a poison id, goes alone: in a batch it would
// fail the batch and cost a bisection every time.
func (s *Sweep) batching(ctx context.Context, p *passState, keys [][]byte, items []item, cd ClearDeleter) *batching {
	todo, alone := make([]int, 0, len(items)), []int(nil)
	for i := range items {
		if items[i].out == pending {
			if items[i].attempts > 0 || s.retries.failures(items[i].id) > 0 {
				alone = append(alone, i)
			} else {
				todo = append(todo, i)
			}
		}
	}
	return &batching{s: s, p: p, ctx: ctx, kv: p.kv, items: items, keys: keys, atomic: cd, todo: todo, alone: alone}
}

// end folds what the page's calls counted into the pass, once they are
// done, and returns how many calls they were and the page's error.
func (b *batching) end() (int, error) {
	b.p.rethrow()
	b.p.st.ScanCalls += int(b.scans.Load())
	b.p.st.Scanned += int(b.scanned.Load())
	if ferr := b.p.fenceErr.Load(); ferr != nil {
		return int(b.calls.Load()), *ferr
	}
	return int(b.calls.Load()), b.ctx.Err()
}

// callFailed counts a call that failed as a whole, by cause and in the streak.
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
// to batch, then the ids that go alone; nil when none is left.
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

// run clears the items at idx in one call, bisecting when it fails. During
// an outage it probes first, and puts the batch off when the probes fail.
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
	b.failed(idx, b.try(idx))
}

// failed bisects the items at idx after a call of them that failed with
// err, unless it did not (nil) or the pass is over (they stay pending).
func (b *batching) failed(idx []int, err error) {
	if err == nil || b.ctx.Err() != nil {
		return
	}
	b.p.callFailed(err)
	b.bisect(idx, err, idx)
}

// pendingOf returns the items of idx not settled by probes.
func (b *batching) pendingOf(idx []int) []int {
	var out []int
	for _, i := range idx {
		if b.items[i].out == pending {
			out = append(out, i)
		}
	}
	return out
}

// probes is the most ids the sweep tries alone before it takes a streak
// of failed calls for an outage. More than one, since a streak is most
// likely where poison ids are dense.
const probes = 3

// probe tries pending ids of the batch alone, from its end (not the half
// that just failed, the likelier poison), until one succeeds (true) or
// enough failed to confirm an outage (false): one more once confirmed, else
// what the batch's budget of log2(size)+2 calls leaves, at most probes.
func (b *batching) probe(batch []int, size int) bool {
	var need int64
	if b.p.confirmed.Load() {
		need = b.p.probeFails.Load() + 1 // one call: is it back?
	} else {
		need = int64(min(probes, max(1, int(math.Log2(float64(size)))+2-b.p.threshold(size))))
	}
	for j := len(batch) - 1; j >= 0 && b.p.probeFails.Load() < need; j-- {
		i := batch[j]
		if b.items[i].out != pending {
			continue
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

// probed is an item probed in vain while the pass had seen epoch successes.
type probed struct {
	i     int
	epoch int64
}

// confirm records an outage: the items probed in vain since the last
// success are put off like the others, not failed by their own fault.
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

// ok records a call that answered for some ids at least: the dependency is up.
func (p *passState) ok() {
	p.oks.Add(1)
	p.streak.Store(0)
	p.probeFails.Store(0)
	p.confirmed.Store(false)
}

// threshold is the streak of failed calls at which a batch of size probes.
func (p *passState) threshold(size int) int {
	return max(2, bits.Len(uint(size))-2)
}

// outageNow reports whether the dependency may be down, for a batch of size.
func (p *passState) outageNow(size int) bool {
	return p.streak.Load() >= int64(p.threshold(size))
}

func (b *batching) idsOf(idx []int) []string {
	ids := make([]string, len(idx))
	for j, i := range idx {
		ids[j] = b.items[i].id
	}
	return ids
}

// try calls ClearBatch (or the ClearDeleter) for the items at idx and
// records each id's outcome, or returns an error and leaves them pending.
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
		b.set(idx, cleared, nil)
	case errors.As(err, &perID):
		rest, err := b.byID(perID, idx)
		b.set(rest, cleared, nil)
		return err
	case wholeCall(err):
		b.p.ok()
		b.set(idx, outcomeOf(err), err)
	default:
		return err
	}
	return nil
}

func (b *batching) set(idx []int, out outcome, err error) {
	for _, i := range idx {
		b.items[i].out, b.items[i].err = out, err
	}
}

// wholeCall reports whether err answers for each id of a call alike.
func wholeCall(err error) bool {
	out := outcomeOf(err)
	return out == liveAgain || out == held
}

// byID records the outcome of each item at idx that perID names, and
// returns the others; it fails, recording nothing, when perID names an id
// not in the batch (ids of a batch are distinct, so counting is enough).
func (b *batching) byID(perID BatchError, idx []int) (rest []int, err error) {
	var named []int
	for _, i := range idx {
		if _, ok := perID[b.items[i].id]; ok {
			named = append(named, i)
		} else {
			rest = append(rest, i)
		}
	}
	if len(named) != len(perID) {
		for id := range perID {
			if !slices.ContainsFunc(idx, func(i int) bool { return b.items[i].id == id }) {
				return nil, fmt.Errorf("retention: a BatchError names %q, which is not in the batch of %d: %w", id, len(idx), perID)
			}
		}
	}
	b.p.ok() // it answered for each id
	for _, i := range named {
		e := perID[b.items[i].id]
		b.items[i].out, b.items[i].err = outcomeOf(e), e
		if e == nil {
			b.items[i].out = failed // a nil entry names the id all the same
		}
	}
	return rest, nil
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
	return b.answer(idx, keys, err, checkFenced(mark, b.kv, "ClearAndDelete"))
}

// answer records the outcomes of the items at idx, whose markers are keys,
// from a ClearDeleter's call of them (ClearAndDelete or ClearRun) that
// returned err; ferr, when not nil, says the call went out unfenced. It
// returns an error when the call failed as a whole, leaving them pending.
func (b *batching) answer(idx []int, keys [][]byte, err, ferr error) error {
	if ferr != nil {
		// The call went out unfenced: what it did stands, but no other
		// write may follow it; the page fails with ferr.
		b.p.fenceErr.CompareAndSwap(nil, &ferr)
		if err == nil {
			b.set(idx, clearedGone, nil)
			for _, i := range idx {
				b.items[i].withDups = true
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
	case errors.As(err, &perID) && len(perID) == 0:
		return fmt.Errorf("retention: the ClearDeleter refused the batch with a BatchError that names no id: %w", err)
	case errors.As(err, &perID):
		// Nothing committed: the ids it does not name go again.
		rest, err := b.byID(perID, idx)
		if rest = b.notWaiting(rest); len(rest) > 0 {
			b.run(rest)
		}
		return err
	case wholeCall(err): // refused as a whole: nothing committed
		b.p.ok()
		b.set(idx, outcomeOf(err), err)
		return nil
	case errors.Is(err, ErrLeaseLost):
		return err
	}
	return b.unknown(idx, keys, err)
}

// cutShort marks gone the items of an atomic call cut short with the pass,
// when a read outside the pass's context can tell that it committed.
func (b *batching) cutShort(idx []int, keys [][]byte) {
	rctx, cancel := withTimeout(context.WithoutCancel(b.ctx), b.s.storeTimeout)
	defer cancel()
	if left, err := b.left(rctx, keys); err == nil {
		b.markGone(idx, left)
	}
}

// unknown settles the items at idx of an atomic call that failed with err,
// which it, or another replica's, may have committed: markers are deleted
// only with their entities, so one that is gone is an entity cleared.
func (b *batching) unknown(idx []int, keys [][]byte, err error) error {
	left, cerr := b.left(b.ctx, keys)
	if cerr != nil {
		b.p.callFailed(err)
		b.set(idx, unknown, fmt.Errorf("%w; and reading which markers are left failed: %w", err, cerr))
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
		if rest = b.notWaiting(rest); len(rest) > 0 {
			b.run(rest)
		}
	}
	return nil
}

// notWaiting defers the items of idx whose id waits in memory (see
// waiting), which a failed run's ids may, and returns the others.
func (b *batching) notWaiting(idx []int) []int {
	if len(b.s.retries.byID) == 0 {
		return idx
	}
	now := b.s.clock.Now()
	var out []int
	for _, i := range idx {
		if !b.s.waiting(b.p, &b.items[i], now) {
			out = append(out, i)
		}
	}
	return out
}

// markGone records as found gone, not as this replica's clears, the items
// with a marker missing from left, and returns the others.
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

// keysOf returns, ascending, the markers of the items at idx and of their
// duplicates on the page.
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

// left returns those of keys (ascending) still in the store.
func (b *batching) left(ctx context.Context, keys [][]byte) ([][]byte, error) {
	var found [][]byte
	if len(keys) == 0 {
		return nil, nil
	}
	count := func(page [][]byte) { b.scans.Add(1); b.scanned.Add(int64(len(page))) }
	for page, err := range b.s.pages(ctx, b.kv, keys[0], keyAfter(keys[len(keys)-1]), b.s.pageSize, count) {
		if err != nil {
			return nil, err
		}
		for _, k := range page {
			if _, ok := slices.BinarySearchFunc(keys, k, bytes.Compare); ok {
				found = append(found, k)
			}
		}
	}
	return found, nil
}

// bisect finds the ids at fault in a batch whose call failed as a whole
// with err, splitting each failing half down to single ids. Once an
// outage is suspected (outageNow), the next half is probed first, and put
// off when the probes fail. See docs/clearing.md, "When some clears fail".
func (b *batching) bisect(idx []int, err error, batch []int) {
	if b.ctx.Err() != nil {
		return // the pass is over; the items stay pending
	}
	// Probes may have cleared some since the call failed.
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

// fail puts off the pending items at idx in an outage, unless the pass is over.
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

// outageError is the error of an id put off untried in an outage.
type outageError struct {
	n   int // ids put off with it
	err error
}

func (e *outageError) Error() string {
	return fmt.Sprintf("retention: not tried alone: every clear of the pass failed (the dependency seems down); %d ids put off: %v", e.n, e.err)
}

func (e *outageError) Unwrap() error { return e.err }

// adapt resizes the batches after a call of n ids that took d (BatchTarget).
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

// answered reports whether a call that returned err answered for each id.
func answered(err error) bool {
	var perID BatchError
	return err == nil || wholeCall(err) || errors.As(err, &perID)
}
