package retention

// Adversarial review of issue 15 (branch review15). Each test states the
// guarantee it checks; a failing test is a finding.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// putOnlyMem is a Putter that is no Mover: the sweep reschedules with Put
// then Delete and dedupes over the whole pass.
type putOnlyMem struct{ m *MemKV }

func (p putOnlyMem) Scan(ctx context.Context, s, e []byte, n int) ([][]byte, error) {
	return p.m.Scan(ctx, s, e, n)
}
func (p putOnlyMem) Delete(ctx context.Context, keys ...[]byte) error {
	return p.m.Delete(ctx, keys...)
}
func (p putOnlyMem) Put(ctx context.Context, k, v []byte) error { return p.m.Put(ctx, k, v) }

// TestReviewPutOnlyClockStepBackLosesClear: README "Failures stay local"
// and "Clear, then delete": a marker goes only once its Clear succeeded.
// On a Put-only store, a clock that steps back (more than RetryDelay) during
// a pass makes the rescheduled key land further on in the expired range; a
// later page of the same pass meets it, the whole-pass dedupe takes it for a
// duplicate of the id met on the first page and deletes it. Both markers are
// gone and Clear never succeeded.
func TestReviewPutOnlyClockStepBackLosesClear(t *testing.T) {
	mem := NewMemKV()
	kv := putOnlyMem{mem}
	const prefix = "runs/"
	var clock *ManualClock
	stepped := false
	var mu sync.Mutex
	okClears := map[string]int{}
	s, c := newSweep(t, kv, Config{
		Prefix:   prefix,
		PageSize: 1,
		Clear: func(_ context.Context, id string) error {
			mu.Lock()
			defer mu.Unlock()
			if id == "a" {
				if !stepped {
					stepped = true
					clock.Advance(-150 * time.Minute) // NTP steps the clock back
				}
				return errBoom
			}
			okClears[id]++
			return nil
		},
	})
	clock = c
	mark(t, mem, prefix, "a", t0.Add(-5*time.Hour))
	mark(t, mem, prefix, "b", t0.Add(-4*time.Hour))
	mark(t, mem, prefix, "c", t0.Add(-3*time.Hour+30*time.Minute))
	mark(t, mem, prefix, "d", t0.Add(-2*time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	t.Logf("stats: %+v", st)
	ids := markerIDs(t, mem, prefix)
	assert.Equal(t, 1, ids["a"], "a's Clear never succeeded: one marker of it must stay (markers: %v, stats %+v)", ids, st)
}

// TestReviewMoverClockStepBackKeepsMarker: the same on a Mover holds (the
// moved key is deferred by the retry kept in memory).
func TestReviewMoverClockStepBackKeepsMarker(t *testing.T) {
	mem := NewMemKV()
	const prefix = "runs/"
	var clock *ManualClock
	stepped := false
	s, c := newSweep(t, mem, Config{
		Prefix:   prefix,
		PageSize: 1,
		Clear: func(_ context.Context, id string) error {
			if id == "a" {
				if !stepped {
					stepped = true
					clock.Advance(-150 * time.Minute)
				}
				return errBoom
			}
			return nil
		},
	})
	clock = c
	mark(t, mem, prefix, "a", t0.Add(-5*time.Hour))
	mark(t, mem, prefix, "b", t0.Add(-4*time.Hour))
	mark(t, mem, prefix, "c", t0.Add(-3*time.Hour+30*time.Minute))
	mark(t, mem, prefix, "d", t0.Add(-2*time.Hour))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, markerIDs(t, mem, prefix)["a"])
}

// atomMem is a ClearDeleter and Mover over a MemKV: ClearAndDelete commits
// only if every key exists, clearing the ids (counted) with their markers.
type atomMem struct {
	*MemKV
	mu      sync.Mutex
	cleared map[string]int
	// before runs before a call; a non-nil error is returned without
	// committing anything.
	before func(ids []string, keys [][]byte) error
	delErr func() error
}

func newAtomMem() *atomMem { return &atomMem{MemKV: NewMemKV(), cleared: map[string]int{}} }

func (a *atomMem) Delete(ctx context.Context, keys ...[]byte) error {
	a.mu.Lock()
	fail := a.delErr
	a.mu.Unlock()
	if fail != nil {
		if err := fail(); err != nil {
			return err
		}
	}
	return a.MemKV.Delete(ctx, keys...)
}

func (a *atomMem) commit(ids []string, keys [][]byte) error {
	for _, k := range keys {
		if _, ok, _ := a.MemKV.Get(context.Background(), k); !ok {
			return ErrMarkerGone
		}
	}
	_ = a.MemKV.Delete(context.Background(), keys...)
	for _, id := range ids {
		a.cleared[id]++
	}
	return nil
}

func (a *atomMem) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.before != nil {
		if err := a.before(ids, keys); err != nil {
			return err
		}
	}
	return a.commit(ids, keys)
}

// TestReviewAtomicDupKeptAfterOtherReplicaCleared: README table, "several
// replicas without a lease: exactly once: a second call finds its markers
// gone and changes nothing", and "One marker, one clear" (a marker written
// twice is cleared once, and every marker of the id goes). Replica B's page
// holds both markers k1, k2 of id x; replica A (whose page held only k1)
// commits x with k1 first. B's call fails with ErrMarkerGone; B reads which
// markers are left, sees k1 gone and takes x for cleared, but keeps k2,
// "deleted in the same transaction" although it was not. The next pass
// clears x a second time with k2.
func TestReviewAtomicDupKeptAfterOtherReplicaCleared(t *testing.T) {
	kv := newAtomMem()
	const prefix = "runs/"
	k1 := mark(t, kv.MemKV, prefix, "x", t0.Add(-3*time.Hour))
	k2 := mark(t, kv.MemKV, prefix, "x", t0.Add(-2*time.Hour))
	first := true
	kv.before = func(ids []string, keys [][]byte) error {
		if first {
			first = false
			// Replica A's commit of x with its one marker k1.
			require.NoError(t, kv.commit([]string{"x"}, [][]byte{k1}))
		}
		return nil
	}
	s, _ := newSweep(t, kv, Config{Prefix: prefix})
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	t.Logf("pass 1: %+v, k2 left: %v", st, has(t, kv.MemKV, k2))
	_, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, kv.cleared["x"], "x must be cleared exactly once across the replicas")
	assert.False(t, has(t, kv.MemKV, k2), "every marker of x goes once x is cleared")
}

// TestReviewAtomicDupSurvivesMoveThenFailedDelete: README "One marker, one
// clear" (when the id's clear fails, its first marker stays for all of
// them) and the atomic column's "exactly once". x has two markers on one
// page (written twice); its atomic clear fails; settle moves k1 to its
// retry time and then deletes k2, in two calls. When the Delete fails (or
// the process crashes between the two), k2 stays in the expired range and
// k1' sits in the future: after a restart the next pass clears x with k2,
// and once k1' falls due x is cleared again.
func TestReviewAtomicDupSurvivesMoveThenFailedDelete(t *testing.T) {
	kv := newAtomMem()
	const prefix = "runs/"
	mark(t, kv.MemKV, prefix, "x", t0.Add(-3*time.Hour))
	mark(t, kv.MemKV, prefix, "x", t0.Add(-2*time.Hour))
	kv.before = func(ids []string, keys [][]byte) error {
		return BatchError{"x": errBoom}
	}
	kv.delErr = func() error { return errors.New("store down (or SIGKILL)") }
	s, clock := newSweep(t, kv, Config{Prefix: prefix})
	_, err := s.Pass(context.Background())
	// Fixed: the duplicate moves onto the first's new key in the same Move,
	// so the pass makes no Delete for the failing Delete to hit.
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"x": 1}, markerIDs(t, kv, prefix), "one marker of x after the reschedule")
	t.Logf("after pass 1: %v", markerIDs(t, kv, prefix))

	// Restart: a new Sweep, the faults gone.
	kv.mu.Lock()
	kv.before, kv.delErr = nil, nil
	kv.mu.Unlock()
	s2, err := New(kv, Config{Prefix: prefix, Retention: time.Hour, Clock: clock})
	require.NoError(t, err)
	_, err = s2.Pass(context.Background())
	require.NoError(t, err)
	clock.Advance(time.Hour)
	_, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, kv.cleared["x"], "x cleared exactly once on the atomic path (markers now: %v)", markerIDs(t, kv, prefix))
}

// fenceMem is an adapter whose writes apply a fence carried on ctx
// (retention.Fenced), as pgkv, rediskv and etcdkv do.
type fenceMem struct {
	*MemKV
	mu            sync.Mutex
	fenced, plain int
}

func (f *fenceMem) Delete(ctx context.Context, keys ...[]byte) error {
	view, err := Fenced(ctx, f)
	if err != nil {
		return err
	}
	if view != nil {
		return view.Delete(ctx, keys...)
	}
	f.mu.Lock()
	f.plain++
	f.mu.Unlock()
	return f.MemKV.Delete(ctx, keys...)
}

type fenceMemView struct{ f *fenceMem }

func (v fenceMemView) Scan(ctx context.Context, s, e []byte, n int) ([][]byte, error) {
	return v.f.MemKV.Scan(ctx, s, e, n)
}
func (v fenceMemView) Delete(ctx context.Context, keys ...[]byte) error {
	v.f.mu.Lock()
	v.f.fenced++
	v.f.mu.Unlock()
	return v.f.MemKV.Delete(ctx, keys...)
}

type fenceLease struct{ lost chan struct{} }

func (l *fenceLease) Lost() <-chan struct{}         { return l.lost }
func (l *fenceLease) Release(context.Context) error { return nil }
func (l *fenceLease) Fence(kv KV) (KV, bool) {
	if f, ok := kv.(*fenceMem); ok {
		return fenceMemView{f}, true
	}
	return nil, false
}

type fenceLocker struct{}

func (fenceLocker) TryAcquire(context.Context) (Lease, error) {
	return &fenceLease{lost: make(chan struct{})}, nil
}

// dropCtxKV is a logging wrapper with Unwrap whose Delete does not pass
// the call's context on (it uses its own, as code that adds a timeout from
// context.Background() does).
type dropCtxKV struct{ inner *fenceMem }

func (d dropCtxKV) Scan(ctx context.Context, s, e []byte, n int) ([][]byte, error) {
	return d.inner.Scan(ctx, s, e, n)
}
func (d dropCtxKV) Delete(_ context.Context, keys ...[]byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return d.inner.Delete(ctx, keys...)
}
func (d dropCtxKV) Unwrap() KV { return d.inner }

// TestReviewWrapperDroppingCtxIsUnfenced: issue 15 asks that an unfencable
// store be a hard error for Run under a Fencer lease unless the user opts
// out; README: "Under a lease that fences, Run and LeasedPass refuse a KV
// they cannot fence". A wrapper with Unwrap that does not pass ctx on
// writes unfenced, and LeasedPass neither refuses nor says so.
func TestReviewWrapperDroppingCtxIsUnfenced(t *testing.T) {
	inner := &fenceMem{MemKV: NewMemKV()}
	mark(t, inner.MemKV, "runs/", "a", t0.Add(-2*time.Hour))
	s, _ := newSweep(t, dropCtxKV{inner}, Config{Lease: fenceLocker{}, Clear: func(context.Context, string) error { return nil }})
	st, err := s.LeasedPass(context.Background())
	t.Logf("LeasedPass: %+v, %v; fenced deletes %d, unfenced %d", st, err, inner.fenced, inner.plain)
	if err == nil {
		assert.Zero(t, inner.plain, "a delete went out unfenced under a fencing lease, and LeasedPass returned nil")
	} else {
		assert.ErrorIs(t, err, ErrUnfenced)
	}
}

type selfUnwrap struct{ *MemKV }

func (s selfUnwrap) Unwrap() KV { return s }

type nilUnwrap struct{ *MemKV }

func (nilUnwrap) Unwrap() KV { return nil }

type nested struct{ KV }

func (n nested) Unwrap() KV { return n.KV }

// TestReviewUnwrapEdges (held): Unwrap returning itself or nil is refused
// with ErrUnfenced, not a hang; nested wrappers over a fenceable KV are
// fenced through the context.
func TestReviewUnwrapEdges(t *testing.T) {
	for _, kv := range []KV{selfUnwrap{NewMemKV()}, nilUnwrap{NewMemKV()}} {
		s, _ := newSweep(t, kv, Config{Lease: fenceLocker{}, Clear: func(context.Context, string) error { return nil }})
		_, err := s.LeasedPass(context.Background())
		assert.ErrorIs(t, err, ErrUnfenced, "%T", kv)
	}
	inner := &fenceMem{MemKV: NewMemKV()}
	mark(t, inner.MemKV, "runs/", "a", t0.Add(-2*time.Hour))
	s, _ := newSweep(t, nested{nested{inner}}, Config{Lease: fenceLocker{}, Clear: func(context.Context, string) error { return nil }})
	_, err := s.LeasedPass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, inner.fenced, "the probe of the fence and the pass's delete")
	assert.Zero(t, inner.plain)
}
