// Every call of the sweep to its store goes through here: each under a
// deadline of its own (Config.StoreTimeout), counted in the pass's Stats,
// and named in its error.

package retention

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// scan is a Scan of the pass's KV under StoreTimeout, counted in its Stats.
func (s *Sweep) scan(ctx context.Context, p *passState, start, end []byte, limit int) ([][]byte, error) {
	keys, err := s.scanKV(ctx, p.kv, start, end, limit)
	p.countScan(keys)
	return keys, err
}

func (p *passState) countScan(keys [][]byte) {
	p.st.ScanCalls++
	p.st.Scanned += len(keys)
}

// scanKV is scan without the counting, outside a pass or on a worker.
func (s *Sweep) scanKV(ctx context.Context, kv KV, start, end []byte, limit int) ([][]byte, error) {
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	keys, err := kv.Scan(cctx, start, end, limit)
	if err != nil {
		return nil, s.storeErr(ctx, cctx, "scan markers", err)
	}
	return keys, nil
}

// delete deletes keys from the pass's KV, but nothing in a dry run.
func (s *Sweep) delete(ctx context.Context, p *passState, keys [][]byte) error {
	if s.dryRun {
		return nil
	}
	wctx, mark := p.writeCtx(ctx)
	cctx, cancel := withTimeout(wctx, s.storeTimeout)
	defer cancel()
	p.st.DeleteCalls++
	if err := p.kv.Delete(cctx, keys...); err != nil {
		return s.storeErr(ctx, cctx, fmt.Sprintf("delete %d markers", len(keys)), err)
	}
	return checkFenced(mark, p.kv, "Delete")
}

func (s *Sweep) move(ctx context.Context, p *passState, from, to [][]byte) error {
	wctx, mark := p.writeCtx(ctx)
	cctx, cancel := withTimeout(wctx, s.storeTimeout)
	defer cancel()
	p.st.PutCalls++
	if err := p.mover.Move(cctx, from, to); err != nil {
		return s.storeErr(ctx, cctx, fmt.Sprintf("reschedule %d markers", len(from)), err)
	}
	return checkFenced(mark, p.kv, "Move")
}

// writeCtx is the context of a write of the pass, carrying the lease's
// fence for a wrapper (see Fencer), and the mark that tells if it applied.
func (p *passState) writeCtx(ctx context.Context) (context.Context, *fenceMark) {
	if p.fence == nil {
		return ctx, nil
	}
	return withFence(ctx, p.fence)
}

// withTimeout is context.WithTimeout, or ctx itself when d is not positive.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// storeErr wraps the error of a store call made under cctx, a child of ctx:
// ctx's own error when ctx ended the call, a timeout naming StoreTimeout
// when cctx did, else the store's error.
func (s *Sweep) storeErr(ctx, cctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return ctxErr
	}
	if ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("retention: %s: no answer within StoreTimeout (%v): %w", what, s.storeTimeout, err)
	}
	return fmt.Errorf("retention: %s: %w", what, err)
}
