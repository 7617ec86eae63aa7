package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/marksweep/retention"
)

// Timing adds up the time a retention contender spends in each kind of
// call: KV.Scan, KV.Delete and Clear, ClearBatch or ClearAndDelete (which
// deletes the markers too). Set it on a PG or
// Redis to break a run down; with Concurrency above 1 clear calls overlap
// and their sum exceeds the wall time. Its zero value is ready to use and
// it is safe for concurrent use.
type Timing struct {
	scan, del, clear                atomic.Int64 // nanoseconds
	scanCalls, delCalls, clearCalls atomic.Int64
}

// String reports every sum and count.
func (t *Timing) String() string {
	f := func(d, n *atomic.Int64) string {
		ns := d.Load()
		calls := max(n.Load(), 1)
		return fmt.Sprintf("%v in %d calls (%v each)", time.Duration(ns).Round(time.Millisecond), n.Load(), time.Duration(ns/calls).Round(time.Microsecond))
	}
	return fmt.Sprintf("scan %s; delete markers %s; clear %s",
		f(&t.scan, &t.scanCalls), f(&t.del, &t.delCalls), f(&t.clear, &t.clearCalls))
}

// kv wraps kv so that its Scan and Delete calls are timed, and its
// ClearAndDelete and ClearRun calls, counted as clears, when it is a
// retention.ClearDeleter or RunClearer; a nil t returns kv unchanged.
func (t *Timing) kv(kv retention.KV) retention.KV {
	if t == nil {
		return kv
	}
	cd, ok := kv.(retention.ClearDeleter)
	if !ok {
		return timedKV{kv, t}
	}
	tcd := timedClearDeleter{timedKV{kv, t}, cd}
	if rc, ok := kv.(retention.RunClearer); ok {
		return timedRuns{tcd, rc}
	}
	return tcd
}

// clearFn wraps a Clear function; a nil t returns it unchanged.
func (t *Timing) clearFn(f func(context.Context, string) error) func(context.Context, string) error {
	if t == nil {
		return f
	}
	return func(ctx context.Context, id string) error {
		defer t.add(&t.clear, &t.clearCalls, time.Now())
		return f(ctx, id)
	}
}

// batchFn wraps a ClearBatch function; a nil t returns it unchanged.
func (t *Timing) batchFn(f func(context.Context, []string) error) func(context.Context, []string) error {
	if t == nil {
		return f
	}
	return func(ctx context.Context, ids []string) error {
		defer t.add(&t.clear, &t.clearCalls, time.Now())
		return f(ctx, ids)
	}
}

func (t *Timing) add(sum, calls *atomic.Int64, start time.Time) {
	sum.Add(int64(time.Since(start)))
	calls.Add(1)
}

type timedKV struct {
	retention.KV
	t *Timing
}

func (k timedKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	defer k.t.add(&k.t.scan, &k.t.scanCalls, time.Now())
	return k.KV.Scan(ctx, start, end, limit)
}

func (k timedKV) Delete(ctx context.Context, keys ...[]byte) error {
	defer k.t.add(&k.t.del, &k.t.delCalls, time.Now())
	return k.KV.Delete(ctx, keys...)
}

type timedClearDeleter struct {
	timedKV
	cd retention.ClearDeleter
}

// timedRuns is a timedClearDeleter whose runs are timed too.
type timedRuns struct {
	timedClearDeleter
	rc retention.RunClearer
}

func (k timedRuns) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	defer k.t.add(&k.t.clear, &k.t.clearCalls, time.Now())
	return k.rc.ClearRun(ctx, prefix, from, end, limit)
}

// RunStore implements retention.RunClearer.
func (k timedRuns) RunStore() retention.RunClearer { return k }

func (k timedClearDeleter) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	defer k.t.add(&k.t.clear, &k.t.clearCalls, time.Now())
	return k.cd.ClearAndDelete(ctx, ids, keys)
}
