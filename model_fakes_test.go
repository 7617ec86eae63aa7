package retention

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"
)

// This file holds the world's side of the model test (model_test.go): the
// store a process sees, and the clear functions. Each call takes the
// world's lock, may crash the process or draw a fault, checks what it is
// asked against the model, and records what it did in the trace.

// modelKV is the store of one process. Its methods are KV's; putKV, moveKV
// and the atomic kinds below add Put, Move and ClearAndDelete.
type modelKV struct {
	w   *modelWorld
	inc *modelProcess
}

type (
	modelRO       struct{ *modelKV }
	modelPut      struct{ modelRO }
	modelMove     struct{ modelPut }
	modelROAtomic struct{ modelRO }
	modelPutAtom  struct{ modelPut }
	modelMoveAtom struct{ modelMove }
	modelRORun    struct{ modelROAtomic }
	modelPutRun   struct{ modelPutAtom }
	modelMoveRun  struct{ modelMoveAtom }
	// The RunCounters.
	modelROCount   struct{ modelRORun }
	modelPutCount  struct{ modelPutRun }
	modelMoveCount struct{ modelMoveRun }
)

func (k modelROCount) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (RunCount, error) {
	return k.countRun(ctx, prefix, from, end, limit, times)
}

// RunStore implements RunClearer.
func (k modelROCount) RunStore() RunClearer { return k }
func (k modelPutCount) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (RunCount, error) {
	return k.countRun(ctx, prefix, from, end, limit, times)
}

// RunStore implements RunClearer.
func (k modelPutCount) RunStore() RunClearer { return k }
func (k modelMoveCount) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (RunCount, error) {
	return k.countRun(ctx, prefix, from, end, limit, times)
}

// RunStore implements RunClearer.
func (k modelMoveCount) RunStore() RunClearer { return k }

func (k modelRORun) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return k.clearRun(ctx, prefix, from, end, limit)
}

// RunStore implements RunClearer.
func (k modelRORun) RunStore() RunClearer { return k }
func (k modelPutRun) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return k.clearRun(ctx, prefix, from, end, limit)
}

// RunStore implements RunClearer.
func (k modelPutRun) RunStore() RunClearer { return k }
func (k modelMoveRun) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	return k.clearRun(ctx, prefix, from, end, limit)
}

// RunStore implements RunClearer.
func (k modelMoveRun) RunStore() RunClearer { return k }

func (k modelPut) Put(ctx context.Context, key, value []byte) error { return k.put(ctx, key, value) }
func (k modelMove) Move(ctx context.Context, from, to [][]byte) error {
	return k.move(ctx, from, to)
}
func (k modelROAtomic) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return k.clearAndDelete(ctx, ids, keys, false)
}
func (k modelPutAtom) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return k.clearAndDelete(ctx, ids, keys, false)
}
func (k modelMoveAtom) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return k.clearAndDelete(ctx, ids, keys, false)
}

// kvFor returns the store as process inc sees it.
func (w *modelWorld) kvFor(inc *modelProcess) KV {
	ro := modelRO{&modelKV{w: w, inc: inc}}
	put := modelPut{ro}
	move := modelMove{put}
	switch {
	case w.cfg.mode != modelAtomic && w.cfg.store == modelMover:
		return move
	case w.cfg.mode != modelAtomic && w.cfg.store == modelPutter:
		return put
	case w.cfg.mode != modelAtomic:
		return ro
	case w.cfg.store == modelMover && w.cfg.counts:
		return modelMoveCount{modelMoveRun{modelMoveAtom{move}}}
	case w.cfg.store == modelPutter && w.cfg.counts:
		return modelPutCount{modelPutRun{modelPutAtom{put}}}
	case w.cfg.counts:
		return modelROCount{modelRORun{modelROAtomic{ro}}}
	case w.cfg.store == modelMover && w.cfg.runs:
		return modelMoveRun{modelMoveAtom{move}}
	case w.cfg.store == modelMover:
		return modelMoveAtom{move}
	case w.cfg.store == modelPutter && w.cfg.runs:
		return modelPutRun{modelPutAtom{put}}
	case w.cfg.store == modelPutter:
		return modelPutAtom{put}
	case w.cfg.runs:
		return modelRORun{modelROAtomic{ro}}
	}
	return modelROAtomic{ro}
}

// Store faults.
const (
	sErr     = 1 + iota // fail, doing nothing
	sHang               // block until ctx is done (StoreTimeout), doing nothing
	sLost               // do it, then fail: the reply is lost
	sPartial            // Delete and Move: do some of it, then fail
)

func (k *modelKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	w := k.w
	w.mu.Lock()
	desc := fmt.Sprintf("%s..%s/%d", w.short(start), w.short(end), limit)
	d, err := w.enter(k.inc, "scan", desc, 3)
	if err != nil {
		w.mu.Unlock()
		return nil, err
	}
	switch d.fault {
	case sErr:
		w.tracef("scan %s -> error", desc)
		w.mu.Unlock()
		return nil, fmt.Errorf("scan: %w", errInjected)
	case sHang:
		w.tracef("scan %s -> hangs", desc)
		w.mu.Unlock()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	defer w.mu.Unlock()
	keys, err := w.mem.Scan(ctx, start, end, limit)
	switch {
	case err != nil:
		return nil, err
	case d.crashAfter:
		w.tracef("scan %s -> CRASH after it", desc)
		return nil, errCrashed
	case d.fault == sLost:
		w.tracef("scan %s -> reply lost", desc)
		return nil, fmt.Errorf("scan reply lost: %w", errInjected)
	}
	w.tracef("scan %s -> %s", desc, w.shortAll(keys))
	if w.pass != nil {
		seen := map[string]bool{}
		for _, k := range keys {
			if _, id, ok := markerIDOf(k); ok {
				if seen[id] {
					w.pass.together[id] = true
				}
				seen[id] = true
			}
		}
	}
	return keys, nil
}

func (k *modelKV) Delete(ctx context.Context, keys ...[]byte) error {
	w := k.w
	w.mu.Lock()
	desc := w.shortAll(keys)
	d, err := w.enter(k.inc, "delete", desc, 4)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	switch d.fault {
	case sErr:
		w.tracef("delete %s -> error", desc)
		w.mu.Unlock()
		return fmt.Errorf("delete: %w", errInjected)
	case sHang:
		w.tracef("delete %s -> hangs", desc)
		w.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	defer w.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	some := keys
	if d.fault == sPartial && !d.crashAfter {
		some = nil
		for _, key := range keys {
			if d.rng.IntN(2) == 0 {
				some = append(some, key)
			}
		}
	}
	var ret error
	switch {
	case d.crashAfter:
		w.tracef("delete %s -> done, CRASH after it", desc)
		ret = errCrashed
	case d.fault == sPartial:
		w.tracef("delete %s -> only %s deleted, error", desc, w.shortAll(some))
		ret = fmt.Errorf("delete: %d of %d keys deleted: %w", len(some), len(keys), errInjected)
	case d.fault == sLost:
		w.tracef("delete %s -> done, reply lost", desc)
		ret = fmt.Errorf("delete reply lost: %w", errInjected)
	default:
		w.tracef("delete %s", desc)
	}
	w.checkRemove("delete", keys)
	_ = w.mem.Delete(context.Background(), some...)
	w.checkDeleted(some)
	w.check("delete")
	return ret
}

func (k *modelKV) put(ctx context.Context, key, value []byte) error {
	w := k.w
	w.mu.Lock()
	desc := w.short(key)
	d, err := w.enter(k.inc, "put", desc, 3)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	switch d.fault {
	case sErr:
		w.tracef("put %s -> error", desc)
		w.mu.Unlock()
		return fmt.Errorf("put: %w", errInjected)
	case sHang:
		w.tracef("put %s -> hangs", desc)
		w.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	defer w.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, id, ok := markerIDOf(key); !ok || w.entities[id] == nil {
		w.violate("bad write", string(key), "put of %s, not a marker of an entity", w.short(key))
	}
	_ = w.mem.Put(context.Background(), key, value)
	w.check("put")
	switch {
	case d.crashAfter:
		w.tracef("put %s -> done, CRASH after it", desc)
		return errCrashed
	case d.fault == sLost:
		w.tracef("put %s -> done, reply lost", desc)
		return fmt.Errorf("put reply lost: %w", errInjected)
	}
	w.tracef("put %s", desc)
	return nil
}

func (k *modelKV) move(ctx context.Context, from, to [][]byte) error {
	w := k.w
	w.mu.Lock()
	var pairs []string
	for i := range from {
		pairs = append(pairs, w.short(from[i])+"->"+w.short(to[i]))
	}
	desc := "[" + strings.Join(pairs, " ") + "]"
	d, err := w.enter(k.inc, "move", desc, 4)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	switch d.fault {
	case sErr:
		w.tracef("move %s -> error", desc)
		w.mu.Unlock()
		return fmt.Errorf("move: %w", errInjected)
	case sHang:
		w.tracef("move %s -> hangs", desc)
		w.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	defer w.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(from) != len(to) {
		w.violate("bad write", "", "move of %d keys to %d", len(from), len(to))
		return errors.New("model: move of unequal lengths")
	}
	w.checkRemove("move", from)
	moved := 0
	for i := range from {
		_, fid, ok1 := markerIDOf(from[i])
		_, tid, ok2 := markerIDOf(to[i])
		if !ok1 || !ok2 || fid != tid {
			w.violate("bad write", fid, "move of %s to %s", w.short(from[i]), w.short(to[i]))
			continue
		}
		if d.fault == sPartial && !d.crashAfter && d.rng.IntN(2) == 0 {
			continue
		}
		if w.has(from[i]) {
			_ = w.mem.Delete(context.Background(), from[i])
			_ = w.mem.Put(context.Background(), to[i], nil)
			moved++
		}
	}
	w.check("move")
	switch {
	case d.crashAfter:
		w.tracef("move %s -> done, CRASH after it", desc)
		return errCrashed
	case d.fault == sPartial:
		w.tracef("move %s -> %d moved, error", desc, moved)
		return fmt.Errorf("move: %d of %d moved: %w", moved, len(from), errInjected)
	case d.fault == sLost:
		w.tracef("move %s -> done, reply lost", desc)
		return fmt.Errorf("move reply lost: %w", errInjected)
	}
	w.tracef("move %s (%d moved)", desc, moved)
	return nil
}

// Clear faults (Config.Clear).
const (
	cErr       = 1 + iota // fail, clearing nothing
	cErrAfter             // clear, then fail
	cPanic                // panic, clearing nothing
	cGoexit               // runtime.Goexit, clearing nothing
	cHang                 // wait for ctx (ClearTimeout), clearing nothing
	cHangAfter            // clear, then wait for ctx
	numCFaults = cHangAfter
)

// clear is Config.Clear of process inc.
func (w *modelWorld) clear(inc *modelProcess, ctx context.Context, id string) error {
	w.mu.Lock()
	d, err := w.enter(inc, "clear", id, numCFaults)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	w.checkIDs("Clear", []string{id})
	w.checkHold(inc, "Clear", id)
	e := w.entities[id]
	if e == nil {
		w.mu.Unlock()
		return errors.New("model: no such entity")
	}
	held := e.heldAt(w.clock.Now())
	var ef *modelEffect
	switch d.fault {
	case 0, cErrAfter, cHangAfter:
		if !e.live && !held {
			ef = w.clearEffect(id, "Clear")
		}
	}
	// done settles the call, with w.mu held.
	done := func(err error, what string) error {
		if ef != nil {
			ef.state = cond2(err == nil, acked, unacked)
		}
		switch {
		case err == nil:
			w.ack(id, false)
		case errors.Is(err, ErrLiveAgain):
			w.ack(id, true)
		case errors.Is(err, ErrHeld):
			w.held(inc, id)
		}
		w.tracef("Clear(%s) -> %s", id, what)
		return err
	}
	defer w.mu.Unlock()
	switch {
	case d.crashAfter:
		return done(errCrashed, cond(ef != nil, "cleared, CRASH after it", "CRASH after it"))
	case d.fault == 0 && held:
		return done(fmt.Errorf("%s: %w", id, Hold(e.holdUntil)), "held")
	case d.fault == 0 && e.live:
		return done(fmt.Errorf("%s: %w", id, ErrLiveAgain), "live again")
	case d.fault == 0:
		return done(nil, "cleared")
	case d.fault == cErr:
		return done(fmt.Errorf("clear %s: %w", id, errInjected), "error")
	case d.fault == cErrAfter:
		return done(fmt.Errorf("clear %s: %w", id, errInjected), cond(ef != nil, "cleared, then error", "error"))
	case d.fault == cPanic:
		done(errors.New("panic"), "panics")
		panic("model: clear " + id + " panics")
	case d.fault == cGoexit:
		done(errors.New("goexit"), "runtime.Goexit")
		runtime.Goexit() // the deferred Unlock runs
	}
	w.tracef("Clear(%s) -> %s, waits for ctx", id, cond(ef != nil, "cleared", "nothing"))
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	return done(ctx.Err(), "ctx done: "+ctx.Err().Error())
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func cond2[T any](c bool, a, b T) T {
	if c {
		return a
	}
	return b
}

// ClearBatch and ClearAndDelete faults.
const (
	bBatchErr   = 1 + iota // a BatchError naming some ids (and maybe ids not in the batch)
	bBatchErr2             // the same, twice as likely
	bErr                   // fail as a whole, clearing nothing
	bErrPartial            // ClearBatch: clear some, then fail as a whole; ClearDeleter: commit, then fail (lost reply)
	bPanic                 // panic, clearing nothing
	bGoexit                // runtime.Goexit, clearing nothing
	bHang                  // wait for ctx, clearing nothing
	bHangAfter             // clear (commit) all, then wait for ctx
	numBFaults  = bHangAfter
)

// distinct returns ids without repeats, in order.
func distinct(ids []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// batchError draws the BatchError of a call of ids: a random part of the
// ids that are not live fail (for a ClearDeleter, none need to), every
// live one is live again, and now and then ids not in the batch are named.
func (w *modelWorld) batchError(d modelDraw, ids []string, atomic bool) BatchError {
	be := BatchError{}
	var plain []string
	for _, id := range ids {
		switch e := w.entities[id]; {
		case e != nil && e.heldAt(w.clock.Now()):
			be[id] = fmt.Errorf("%s: %w", id, Hold(e.holdUntil))
		case e != nil && e.live:
			be[id] = fmt.Errorf("%s: %w", id, ErrLiveAgain)
		default:
			plain = append(plain, id)
		}
	}
	for _, id := range plain {
		if d.rng.IntN(2) == 0 {
			be[id] = fmt.Errorf("clear %s: %w", id, errInjected)
		}
	}
	if len(be) == 0 && len(plain) > 0 && (!atomic || d.rng.IntN(2) == 0) {
		id := plain[d.rng.IntN(len(plain))]
		be[id] = fmt.Errorf("clear %s: %w", id, errInjected)
	}
	if d.rng.IntN(4) == 0 {
		be["zz-not-in-batch"] = errInjected
	}
	if d.rng.IntN(4) == 0 {
		// An id of another batch, perhaps one in flight.
		all := slices.Sorted(maps.Keys(w.entities))
		if id := all[d.rng.IntN(len(all))]; !slices.Contains(ids, id) {
			be[id] = fmt.Errorf("other %s: %w", id, ErrLiveAgain)
		}
	}
	return be
}

// namesOnly reports whether every id be names is one of ids.
func namesOnly(be BatchError, ids []string) bool {
	for id := range be {
		if !slices.Contains(ids, id) {
			return false
		}
	}
	return true
}

func describeBE(be BatchError, ids []string) string {
	var s []string
	for _, id := range slices.Sorted(maps.Keys(be)) {
		tag := "err"
		switch {
		case errors.Is(be[id], ErrLiveAgain):
			tag = "live"
		case errors.Is(be[id], ErrHeld):
			tag = "held"
		}
		if !slices.Contains(ids, id) {
			tag += ",not in batch"
		}
		s = append(s, id+":"+tag)
	}
	return "BatchError{" + strings.Join(s, " ") + "}"
}

// clearBatch is Config.ClearBatch of process inc. Whatever it returns is
// true: ids a BatchError does not name were cleared.
func (w *modelWorld) clearBatch(inc *modelProcess, ctx context.Context, ids []string) error {
	w.mu.Lock()
	desc := "[" + strings.Join(ids, " ") + "]"
	d, err := w.enter(inc, "batch", desc, numBFaults)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	w.checkIDs("ClearBatch", distinct(ids))
	uniq := distinct(ids)
	var live, held, plain []string
	for _, id := range uniq {
		w.checkHold(inc, "ClearBatch", id)
		switch e := w.entities[id]; {
		case e != nil && e.heldAt(w.clock.Now()):
			held = append(held, id)
		case e != nil && e.live:
			live = append(live, id)
		case e != nil:
			plain = append(plain, id)
		}
	}
	effects := map[string]*modelEffect{}
	clear := func(id string) {
		if effects[id] == nil {
			effects[id] = w.clearEffect(id, "ClearBatch")
		}
	}
	var ret error
	what := ""
	fault := d.fault
	if d.crashAfter {
		fault = 0
	}
	switch fault {
	case 0:
		switch {
		case len(live) == len(uniq) && d.rng.IntN(2) == 0:
			ret, what = fmt.Errorf("batch: %w", ErrLiveAgain), "all live again"
		case len(held) == len(uniq) && d.rng.IntN(2) == 0:
			// One hold for all: until the last of their ends.
			var until time.Time
			for _, id := range held {
				until = maxTime(until, w.entities[id].holdUntil)
			}
			ret, what = fmt.Errorf("batch: %w", Hold(until)), "all held"
		case len(live)+len(held) > 0:
			be := BatchError{}
			for _, id := range live {
				be[id] = fmt.Errorf("%s: %w", id, ErrLiveAgain)
			}
			for _, id := range held {
				be[id] = fmt.Errorf("%s: %w", id, Hold(w.entities[id].holdUntil))
			}
			ret, what = be, describeBE(be, uniq)
		default:
			what = "cleared"
		}
		for _, id := range plain {
			clear(id)
		}
	case bBatchErr, bBatchErr2:
		be := w.batchError(d, uniq, false)
		for _, id := range plain {
			if be[id] == nil || d.rng.IntN(3) == 0 { // a failed id may be cleared all the same
				clear(id)
			}
		}
		ret, what = be, describeBE(be, uniq)
		if d.rng.IntN(2) == 0 {
			ret = fmt.Errorf("wrapped: %w", be)
		}
	case bErr:
		ret, what = fmt.Errorf("batch: %w", errInjected), "error"
	case bErrPartial:
		for _, id := range plain {
			if d.rng.IntN(2) == 0 {
				clear(id)
			}
		}
		ret, what = fmt.Errorf("batch: %w", errInjected), "some cleared, then error"
	}
	done := func(err error, what string) error {
		var be BatchError
		// A BatchError naming an id not in the batch fails the call as a
		// whole: the sweep takes nothing it says of the batch's ids.
		isBE := errors.As(err, &be) && namesOnly(be, uniq)
		for _, id := range uniq {
			var idErr error
			switch {
			case err == nil:
			case isBE:
				idErr = be[id]
			default:
				idErr = err
			}
			if ef := effects[id]; ef != nil {
				ef.state = cond2(idErr == nil, acked, unacked)
			}
			switch {
			case idErr == nil:
				w.ack(id, false)
			case errors.Is(idErr, ErrLiveAgain):
				w.ack(id, true)
			case errors.Is(idErr, ErrHeld):
				w.held(inc, id)
			}
		}
		w.tracef("ClearBatch%s -> %s", desc, what)
		return err
	}
	defer w.mu.Unlock()
	switch {
	case d.crashAfter:
		return done(errCrashed, "done ("+what+"), CRASH after it")
	case fault == 0 || fault == bBatchErr || fault == bBatchErr2 || fault == bErr || fault == bErrPartial:
		return done(ret, what)
	case fault == bPanic:
		done(errors.New("panic"), "panics")
		panic("model: ClearBatch panics")
	case fault == bGoexit:
		done(errors.New("goexit"), "runtime.Goexit")
		runtime.Goexit() // the deferred Unlock runs
	case fault == bHangAfter:
		for _, id := range plain {
			clear(id)
		}
	}
	w.tracef("ClearBatch%s -> %s, waits for ctx", desc, cond(len(effects) > 0, "cleared", "nothing"))
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	return done(ctx.Err(), "ctx done: "+ctx.Err().Error())
}

// clearRun is the RunClearer: it reads the run, refuses it when a key is
// no marker of prefix, and commits it as clearAndDelete does, with every
// fault and check of that call; a key gone in between makes the commit
// refuse, changing nothing, as a store's transaction would. It returns
// the run's keys with its error, but for a lost reply.
func (k *modelKV) clearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	w := k.w
	w.mu.Lock()
	if prefix != modelPrefix {
		w.violate("bad ClearRun", "", "prefix %q, want %q", prefix, modelPrefix)
	}
	keys, _ := w.mem.Scan(ctx, from, end, limit)
	w.mu.Unlock()
	var ids []string
	for _, key := range keys {
		_, id, err := ParseMarkerKey(prefix, key)
		if err != nil {
			return nil, err
		}
		ids = append(ids, string(id))
	}
	if len(keys) == 0 {
		return nil, nil
	}
	err := k.clearAndDelete(ctx, ids, keys, true)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return nil, err // the reply was lost: no keys with it
	}
	return keys, err
}

// countRun is the RunCounter: it refuses a run that would take two
// markers of one id, changing nothing, and takes the others as clearRun
// does, answering with their count, or with its error and the keys
// clearRun returns with it.
func (k *modelKV) countRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (RunCount, error) {
	w := k.w
	w.mu.Lock()
	keys, _ := w.mem.Scan(ctx, from, end, limit)
	w.mu.Unlock()
	seen := map[string]bool{}
	for _, key := range keys {
		if _, id, err := ParseMarkerKey(prefix, key); err == nil {
			if seen[string(id)] {
				return RunCount{}, fmt.Errorf("%w: two markers of %s in the run", ErrMalformedMarker, id)
			}
			seen[string(id)] = true
		}
	}
	keys, err := k.clearRun(ctx, prefix, from, end, limit)
	if err != nil {
		return RunCount{Keys: keys}, err
	}
	return countOfKeys(prefix, keys, times), nil
}

// clearAndDelete is the ClearDeleter: it clears the entities of ids and
// deletes keys under the world's lock, or does neither. It commits only
// if every key exists (else ErrMarkerGone), and never with a live id in
// the batch: the clear in its transaction would find the entity live and
// refuse the whole call with a BatchError. run says ClearRun calls it
// with the keys of a run.
func (k *modelKV) clearAndDelete(ctx context.Context, ids []string, keys [][]byte, run bool) error {
	w := k.w
	w.mu.Lock()
	desc := "[" + strings.Join(ids, " ") + "] " + w.shortAll(keys)
	d, err := w.enter(k.inc, "ClearAndDelete", desc, numBFaults)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	uniq := distinct(ids)
	w.checkIDs("ClearAndDelete", uniq)
	// The contract: keys ascending, each the marker of an id of the call,
	// every id with a key, every key expired when the pass started.
	has := map[string]bool{}
	for i, key := range keys {
		_, id, ok := markerIDOf(key)
		switch {
		case !ok || !slices.Contains(uniq, id):
			w.violate("bad ClearAndDelete", id, "key %s is no marker of the call's ids %v", w.short(key), uniq)
		case i > 0 && string(keys[i-1]) >= string(key):
			w.violate("bad ClearAndDelete", id, "keys not ascending: %s", w.shortAll(keys))
		}
		has[id] = true
	}
	for _, id := range uniq {
		if !has[id] {
			w.violate("bad ClearAndDelete", id, "no key of %s among %s", id, w.shortAll(keys))
		}
	}
	w.checkRemove("ClearAndDelete", keys)
	var live, held []string
	for _, id := range uniq {
		if run {
			w.checkRunHold(k.inc, id, keys)
		} else {
			w.checkHold(k.inc, "ClearAndDelete", id)
		}
		switch e := w.entities[id]; {
		case e != nil && e.heldAt(w.clock.Now()):
			held = append(held, id)
		case e != nil && e.live:
			live = append(live, id)
		}
	}
	var efs []*modelEffect
	var what string
	// commit clears and deletes, or finds a key gone and does nothing.
	commit := func() error {
		if len(live) > 0 && len(live) == len(uniq) && d.rng.IntN(3) == 0 {
			what = "all live again, nothing committed"
			return fmt.Errorf("transaction: %w", ErrLiveAgain)
		}
		if len(live)+len(held) > 0 {
			be := BatchError{}
			for _, id := range live {
				be[id] = fmt.Errorf("%s: %w", id, ErrLiveAgain)
			}
			for _, id := range held {
				be[id] = fmt.Errorf("%s: %w", id, Hold(w.entities[id].holdUntil))
			}
			if w.faults && d.rng.IntN(2) == 0 {
				// A faulty BatchError on top (once faults stop, none: one
				// naming ids not in the batch fails the call as a whole).
				for id, err := range w.batchError(d, uniq, true) {
					be[id] = err
				}
			}
			what = describeBE(be, uniq) + ", nothing committed"
			return be
		}
		for _, key := range keys {
			if !w.has(key) {
				what = "marker " + w.short(key) + " gone, nothing committed"
				return fmt.Errorf("model: %w", ErrMarkerGone)
			}
		}
		_ = w.mem.Delete(context.Background(), keys...)
		m := w.markers()
		for _, id := range uniq {
			efs = append(efs, w.commitEffect(id, len(m[id])))
		}
		w.check("ClearAndDelete")
		what = "committed"
		return nil
	}
	fault := d.fault
	if d.crashAfter {
		fault = 0
	}
	var ret error
	switch fault {
	case 0:
		ret = commit()
	case bBatchErr, bBatchErr2:
		be := w.batchError(d, uniq, true)
		ret, what = be, describeBE(be, uniq)+", nothing committed"
		if d.rng.IntN(2) == 0 {
			ret = fmt.Errorf("wrapped: %w", be)
		}
	case bErr:
		ret, what = fmt.Errorf("transaction: %w", errInjected), "error, nothing committed"
	case bErrPartial:
		// The commit happened; its reply did not arrive.
		if ret = commit(); ret == nil {
			ret, what = fmt.Errorf("commit: %w", context.DeadlineExceeded), "committed, reply lost (DeadlineExceeded)"
		}
	}
	done := func(err error, what string) error {
		var be BatchError
		switch {
		case errors.As(err, &be) && !namesOnly(be, uniq):
			// Refused as a whole, with nothing said of any id.
		case errors.As(err, &be):
			for id, e := range be {
				switch {
				case !slices.Contains(uniq, id):
				case errors.Is(e, ErrLiveAgain):
					w.ack(id, true)
				case errors.Is(e, ErrHeld):
					w.held(k.inc, id, keys...)
				}
			}
		case errors.Is(err, ErrLiveAgain):
			for _, id := range uniq {
				w.ack(id, true)
			}
		}
		for i, ef := range efs {
			ef.state = cond2(err == nil, acked, unacked)
			if err == nil {
				w.ack(uniq[i], false)
			}
		}
		w.tracef("ClearAndDelete%s -> %s", desc, what)
		return err
	}
	defer w.mu.Unlock()
	switch {
	case d.crashAfter:
		return done(errCrashed, what+", CRASH after it")
	case fault == 0 || fault == bBatchErr || fault == bBatchErr2 || fault == bErr || fault == bErrPartial:
		return done(ret, what)
	case fault == bPanic:
		done(errors.New("panic"), "panics, nothing committed")
		panic("model: ClearAndDelete panics")
	case fault == bGoexit:
		done(errors.New("goexit"), "runtime.Goexit, nothing committed")
		runtime.Goexit() // the deferred Unlock runs
	case fault == bHangAfter:
		if err := commit(); err != nil {
			return done(err, what)
		}
	}
	w.tracef("ClearAndDelete%s -> %s, waits for ctx", desc, cond(len(efs) > 0, "committed", "nothing"))
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	return done(ctx.Err(), "ctx done: "+ctx.Err().Error())
}
