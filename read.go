package retention

import (
	"context"
	"errors"
	"iter"
	"time"
)

// walk handles the pages of [from, end) and reports whether there were
// none: each a RunClearer's run (see clearRun), or else read and cleared
// by the sweep. The next page is read once this one is settled, after its
// last key, so markers that stay are not read again; reading it during
// the clears did not pay (BENCHMARKS.md).
func (s *Sweep) walk(ctx context.Context, p *passState, from, end []byte) (empty bool, err error) {
	empty = true
	var next *run // started before the last one was settled
	for {
		var n, limit int
		var last []byte
		r := next
		next = nil // settleRun settles it, and awaits the run it starts even on a panic
		if r == nil {
			r = s.startRun(ctx, p, from, end)
		}
		if r != nil {
			n, last, limit, next, err = s.settleRun(ctx, p, r, end, true)
		}
		if limit == 0 && err == nil {
			limit = s.pageSize
			var keys [][]byte
			keys, err = s.scan(ctx, p, from, end, limit)
			if err == nil && len(keys) > 0 {
				err = s.finishPage(ctx, p, keys, s.preparePage(p, keys))
			}
			if n = len(keys); n > 0 {
				last = keys[n-1]
			}
		}
		empty = empty && n == 0
		if err != nil || n < limit {
			if next != nil { // it may have cleared: settled, no other started
				r, next = next, nil
				_, _, _, _, _ = s.settleRun(ctx, p, r, end, false)
			}
			return empty, err
		}
		p.buf.after = append(append(p.buf.after[:0], last...), 0)
		from = p.buf.after
	}
}

// retryPass handles the due part of the retry range. Most passes find
// none, in one Scan of one key, which also tells when the next falls due.
func (s *Sweep) retryPass(ctx context.Context, p *passState) error {
	p.inRetry = true
	defer func() { p.inRetry = false }()
	// Due, like a marker, once strictly past: at < start, in whole ms.
	p.retryDueMs = p.start.UnixMilli()
	if time.UnixMilli(p.retryDueMs).Before(p.start) {
		p.retryDueMs++
	}
	first, err := s.scan(ctx, p, s.retryLower, s.retryUpper, 1)
	if err != nil || len(first) == 0 {
		return err
	}
	if k, _, err := parseRetryKey(s.prefix, retryInfix, first[0]); err == nil && k.at >= p.retryDueMs {
		s.noteRetry(p, time.UnixMilli(k.at))
		return nil
	}
	dueKey := appendTimestamp(append(p.buf.dueKey[:0], s.retryUpper[:len(s.retryUpper)-1]...), uint64(p.retryDueMs))
	p.buf.dueKey = dueKey
	// Something is due, or a key that is no retry marker comes first.
	if _, err := s.walk(ctx, p, p.resumeFrom(resumeRetry, s.retryLower), dueKey); err != nil {
		return err
	}
	at, found, err := s.nextRetry(ctx, p, dueKey)
	if found {
		s.noteRetry(p, time.UnixMilli(at))
	}
	return err
}

// nextRetry returns the retry time of the first key of the retry range
// from start that parses, reading one key when that is it.
func (s *Sweep) nextRetry(ctx context.Context, p *passState, start []byte) (at int64, found bool, err error) {
	for keys, err := range s.pages(ctx, p.kv, start, s.retryUpper, 1, p.countScan) {
		if err != nil {
			return 0, false, err
		}
		for _, key := range keys {
			if k, _, err := parseRetryKey(s.prefix, retryInfix, key); err == nil {
				return k.at, true, nil
			}
		}
	}
	return 0, false, nil
}

// pages reads [from, end) of kv a page at a time, the first page of first
// keys and the others of PageSize, each from just after the last key read,
// until a short page or an error; count, if not nil, counts each Scan.
func (s *Sweep) pages(ctx context.Context, kv KV, from, end []byte, first int, count func([][]byte)) iter.Seq2[[][]byte, error] {
	return func(yield func([][]byte, error) bool) {
		for limit := first; ; limit = s.pageSize {
			keys, err := s.scanKV(ctx, kv, from, end, limit)
			if count != nil {
				count(keys)
			}
			if !yield(keys, err) || err != nil || len(keys) < limit {
				return
			}
			from = keyAfter(keys[len(keys)-1])
		}
	}
}

// dueEnd returns the end of the range of markers due before cutoffMs.
func (s *Sweep) dueEnd(cutoffMs int64) []byte {
	return appendTimestamp(append([]byte(nil), s.prefix...), uint64(cutoffMs))
}

func keyAfter(key []byte) []byte {
	return append(append([]byte(nil), key...), 0)
}

// cutoffMillis returns the smallest whole millisecond not before cutoff: a
// marker of ts milliseconds is expired iff ts is below it.
func cutoffMillis(cutoff time.Time) int64 {
	switch {
	case cutoff.Before(epoch):
		return 0
	case cutoff.After(MaxMarkerTime):
		return maxMarkerMs + 1
	}
	ms := cutoff.UnixMilli()
	if time.UnixMilli(ms).Before(cutoff) {
		ms++
	}
	return ms
}

// peek reads the first marker past the expired range to set st.NextDue,
// one key when that is a marker; malformed keys before it are deleted. It
// reports whether the first key it read was a marker (or none was there).
func (s *Sweep) peek(ctx context.Context, p *passState) (clean bool, err error) {
	st := p.st
	clean = true
	for keys, err := range s.pages(ctx, p.kv, p.cutoffKey, s.upper, 1, p.countScan) {
		if err != nil {
			return false, err
		}
		var del [][]byte
		found := false
		for _, key := range keys {
			ms, isForeign, err := s.parseNext(key)
			switch {
			case isForeign:
				st.Foreign++
				p.notes.noteForeign(key)
				clean = false
				continue
			case err != nil:
				st.Malformed++
				p.notes.noteMalformed(err)
				del = append(del, key)
				clean = false
				continue
			}
			st.NextDue = earliest(st.NextDue, time.UnixMilli(ms).Add(s.retention))
			found = true
			break
		}
		if len(del) > 0 {
			if err := s.delete(ctx, p, del); err != nil {
				return false, err
			}
		}
		if found {
			return clean, nil
		}
	}
	return clean, nil
}

// parseNext parses a key read past the expired range. An id whose
// Config.ValidateID panicked is not known to be malformed: it counts as a
// marker.
func (s *Sweep) parseNext(key []byte) (ms int64, foreign bool, err error) {
	ms, id, foreign, err := parseKey(s.prefix, key)
	if err == nil {
		if err = s.checkIDBytes(key, id); errors.Is(err, errValidatePanicked) {
			err = nil
		}
	}
	return ms, foreign, err
}

// stillIdle reports, after a pass that found nothing expired, whether the
// range's first key is a marker not expired yet: then the pass reads that
// one key, where the expired range and the key past it take two Scans.
func (s *Sweep) stillIdle(ctx context.Context, p *passState) (bool, error) {
	if !s.idle {
		return false, nil
	}
	keys, err := s.scan(ctx, p, s.lower, s.upper, 1)
	if err != nil || len(keys) == 0 {
		return err == nil, err
	}
	ms, _, err := s.parseNext(keys[0])
	if err != nil || ms < p.cutoffMs {
		s.idle = false
		return false, nil
	}
	p.st.NextDue = time.UnixMilli(ms).Add(s.retention)
	return true, nil
}

// earliest returns the earlier of a and b, where the zero time means none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
