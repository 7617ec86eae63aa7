package retention

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ParkedMarker is a marker parked after Config.MaxAttempts failed clears:
// see Sweep.Parked.
type ParkedMarker struct {
	ID       string
	Finished time.Time // when the entity finished; it fell due Retention later
	Attempts int       // failed clears in a row before it was parked
}

// Parked lists up to limit (1 to MaxPageSize) markers the sweep parked
// after Config.MaxAttempts failed clears, oldest first, for an admin page
// or a CLI. Fix what makes their clears fail, then put them back with
// Requeue.
func (s *Sweep) Parked(ctx context.Context, limit int) ([]ParkedMarker, error) {
	if err := s.configured("Parked"); err != nil {
		return nil, err
	}
	if limit < 1 || limit > MaxPageSize {
		return nil, fmt.Errorf("retention: Parked's limit must be 1 to %d, got %d", MaxPageSize, limit)
	}
	var out []ParkedMarker
	err := s.eachParked(ctx, func(key []byte, k retryKey) (bool, error) {
		out = append(out, ParkedMarker{ID: string(k.id), Finished: time.UnixMilli(k.finished), Attempts: k.attempts})
		return len(out) < limit, nil
	})
	return out, err
}

// Requeue puts the parked markers of ids back (see Parked): each moves to
// the retry range, due at once with no failed attempt counted, and the
// next pass clears it. It returns how many it put back; an id with no
// parked marker is not an error. It reads the whole parked range, a page
// at a time.
func (s *Sweep) Requeue(ctx context.Context, ids ...string) (int, error) {
	if err := s.configured("Requeue"); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, errors.New("retention: Requeue needs the ids of the parked markers to put back")
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	mover, _ := s.kv.(Mover)
	putter, _ := s.kv.(Putter)
	if mover == nil && putter == nil {
		return 0, fmt.Errorf("retention: Requeue: the KV (%T) can neither Move nor Put", s.kv)
	}
	var from, to [][]byte
	// Due for the next pass: strictly before now.
	nowMs := max(s.clock.Now().UnixMilli()-1, 0)
	err := s.eachParked(ctx, func(key []byte, k retryKey) (bool, error) {
		if want[string(k.id)] {
			from = append(from, key)
			to = append(to, appendRetryKey(nil, s.prefix, k.kind, nowMs, k.finished, 0, string(k.id)))
		}
		return true, nil
	})
	if err != nil || len(from) == 0 {
		return 0, err
	}
	cctx, cancel := withTimeout(ctx, s.storeTimeout)
	defer cancel()
	if mover != nil {
		if err := mover.Move(cctx, from, to); err != nil {
			return 0, s.storeErr(ctx, cctx, "requeue parked markers", err)
		}
		return len(from), nil
	}
	for i := range from {
		if err := putter.Put(cctx, to[i], nil); err != nil {
			return i, s.storeErr(ctx, cctx, "requeue a parked marker", err)
		}
		if err := s.kv.Delete(cctx, from[i]); err != nil {
			return i, s.storeErr(ctx, cctx, "requeue a parked marker", err)
		}
	}
	return len(from), nil
}

// eachParked calls f for each well-formed key of the parked range, in
// order, until f returns false or an error.
func (s *Sweep) eachParked(ctx context.Context, f func(key []byte, k retryKey) (bool, error)) error {
	from, end := infixRange(s.prefix, parkedInfix)
	for {
		keys, err := s.scanKV(ctx, s.kv, from, end, s.pageSize)
		if err != nil {
			return err
		}
		for _, key := range keys {
			k, isForeign, err := parseRetryKey(s.prefix, parkedInfix, key)
			if isForeign || err != nil || s.checkIDBytes(key, k.id) != nil {
				continue
			}
			if more, err := f(key, k); !more || err != nil {
				return err
			}
		}
		if len(keys) < s.pageSize {
			return nil
		}
		from = keyAfter(keys[len(keys)-1])
	}
}
