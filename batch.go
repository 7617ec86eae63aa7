package retention

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBatchSize is the number of ids a ClearBatch call gets when
// Config.BatchSize is zero.
const DefaultBatchSize = 100

// BatchError is what a Config.ClearBatch function returns to report ids
// one by one: it maps each id that was not cleared to its error. Ids of the
// batch that are not in it were cleared. An error wrapping ErrLiveAgain
// drops that id's marker without clearing, as it does from Clear. A
// ClearBatch may return it wrapped.
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
	var todo []int
	for i := range items {
		if items[i].out == pending {
			todo = append(todo, i)
		}
	}
	var batches [][]int
	for len(todo) > 0 {
		n := min(len(todo), s.batchSize)
		batches, todo = append(batches, todo[:n:n]), todo[n:]
	}
	b := &batching{s: s, ctx: ctx, items: items, keys: keys, atomic: cd}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(s.concurrency, len(batches)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(batches) {
					return
				}
				if err := b.try(batches[i]); err != nil {
					b.bisect(batches[i], err)
				}
			}
		})
	}
	wg.Wait()
	return int(b.calls.Load()), ctx.Err()
}

// batching is one page's batch clears in flight. Each item is written by
// the one worker that holds its batch.
type batching struct {
	s      *Sweep
	ctx    context.Context
	items  []item
	keys   [][]byte     // the page's keys: keys[i] is items[i]'s
	atomic ClearDeleter // nil: ClearBatch, then the sweep deletes
	calls  atomic.Int64
}

// try calls ClearBatch for the items at idx and records what it learns: all
// cleared on nil, each id's outcome from a BatchError, all live again on
// ErrLiveAgain. It returns any other error, which says nothing of any one
// id; the items then stay pending.
func (b *batching) try(idx []int) error {
	ids := make([]string, len(idx))
	for j, i := range idx {
		ids[j] = b.items[i].id
	}
	b.calls.Add(1)
	var err error
	done := cleared
	if b.atomic != nil {
		keys := make([][]byte, len(idx))
		for j, i := range idx {
			keys[j] = b.keys[i]
		}
		err, done = b.s.callAtomic(b.ctx, b.atomic, ids, keys), clearedGone
	} else {
		err = b.s.callBatch(b.ctx, ids)
	}
	var perID BatchError
	switch {
	case err == nil:
		for _, i := range idx {
			b.items[i].out = done
		}
	case errors.As(err, &perID):
		for _, i := range idx {
			it := &b.items[i]
			switch e, ok := perID[it.id]; {
			case !ok:
				it.out = cleared
			case errors.Is(e, ErrLiveAgain):
				it.out = liveAgain
			default:
				it.out, it.err = failed, e
			}
		}
	case errors.Is(err, ErrLiveAgain):
		for _, i := range idx {
			b.items[i].out = liveAgain
		}
	default:
		return err
	}
	return nil
}

// bisect finds the ids at fault in a batch whose call failed as a whole
// with err: it tries each half, and splits further the one half that
// failed, down to single ids, so one id that always fails costs about
// 2·log2(batch) calls and keeps no other id from being cleared. Where both
// halves fail the fault is likely not any one id (a dependency is down):
// every id of both halves is recorded as failed, to be retried after its
// delay, rather than calling the dependency once per id.
func (b *batching) bisect(idx []int, err error) {
	if b.ctx.Err() != nil {
		return // the pass is over; the items stay pending
	}
	if len(idx) == 1 {
		it := &b.items[idx[0]]
		it.out, it.err = failed, err
		return
	}
	h := len(idx) / 2
	errL := b.try(idx[:h])
	errR := b.try(idx[h:])
	switch {
	case errL != nil && errR != nil:
		b.fail(idx[:h], errL)
		b.fail(idx[h:], errR)
	case errL != nil:
		b.bisect(idx[:h], errL)
	case errR != nil:
		b.bisect(idx[h:], errR)
	}
}

// fail records the items at idx as failed with err, unless the pass is over.
func (b *batching) fail(idx []int, err error) {
	if b.ctx.Err() != nil {
		return
	}
	for _, i := range idx {
		it := &b.items[i]
		it.out, it.err = failed, fmt.Errorf("retention: batch of %d failed as a whole: %w", len(idx), err)
	}
}

// callBatch runs ClearBatch under ClearTimeout on a goroutine of its own,
// so that a panic or a runtime.Goexit in it becomes an error of the call.
func (s *Sweep) callBatch(ctx context.Context, ids []string) error {
	return s.guarded(ctx, func(ctx context.Context) error { return s.clearBatch(ctx, ids) })
}

// callAtomic runs a ClearDeleter's ClearAndDelete as callBatch runs
// ClearBatch; its own clear may panic too.
func (s *Sweep) callAtomic(ctx context.Context, kv ClearDeleter, ids []string, keys [][]byte) error {
	return s.guarded(ctx, func(ctx context.Context) error { return kv.ClearAndDelete(ctx, ids, keys) })
}

// guarded runs call under ClearTimeout on a goroutine of its own, turning
// a panic or a runtime.Goexit into an error.
func (s *Sweep) guarded(ctx context.Context, call func(context.Context) error) error {
	cctx, cancel := withTimeout(ctx, s.clearTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		returned := false
		defer func() {
			if returned {
				return
			}
			if r := recover(); r != nil {
				done <- panicked(r)
				return
			}
			done <- errClearExited
		}()
		err := call(cctx)
		returned = true
		done <- err
	}()
	err := <-done
	if err != nil {
		if _, perr := errorPanics(err); perr != nil {
			err = perr
		}
	}
	if err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) && !errors.As(err, new(BatchError)) {
		err = fmt.Errorf("retention: clear of a batch timed out after ClearTimeout (%v): %w", s.clearTimeout, err)
	}
	return err
}

// countGone counts, in a page the pass leaves without settling it, the
// markers a ClearDeleter cleared and deleted with their entities.
func (s *Sweep) countGone(p *passState, items []item) {
	oldest := int64(-1)
	for i := range items {
		if it := &items[i]; it.out == clearedGone {
			p.st.Cleared++
			s.retries.forget(it.id)
			if oldest < 0 {
				oldest = it.ms
			}
		}
	}
	if oldest < 0 {
		return
	}
	p.st.MaxLag = max(p.st.MaxLag, p.cutoff.Sub(time.UnixMilli(oldest)))
	if s.obs != nil {
		s.observeLags(items, true)
	}
}
