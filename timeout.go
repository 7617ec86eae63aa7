package retention

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Store calls go through these three, which give each call its own deadline
// (Config.StoreTimeout), count it and name it in errors.

func (s *Sweep) scan(ctx context.Context, p *passState, start, end []byte, limit int) ([][]byte, error) {
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	p.st.ScanCalls++
	keys, err := p.kv.Scan(cctx, start, end, limit)
	if err != nil {
		return nil, s.storeErr(ctx, cctx, "scan markers", err)
	}
	p.st.Scanned += len(keys)
	return keys, nil
}

func (s *Sweep) delete(ctx context.Context, p *passState, keys [][]byte) error {
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	p.st.DeleteCalls++
	if err := p.kv.Delete(cctx, keys...); err != nil {
		return s.storeErr(ctx, cctx, fmt.Sprintf("delete %d markers", len(keys)), err)
	}
	return nil
}

func (s *Sweep) put(ctx context.Context, p *passState, key []byte) error {
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	p.st.PutCalls++
	if err := p.putter.Put(cctx, key, nil); err != nil {
		return s.storeErr(ctx, cctx, "reschedule marker", err)
	}
	return nil
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
