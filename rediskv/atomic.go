package rediskv

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
)

// KeysFunc returns the keys that hold the state of the entities ids: an
// AtomicKV deletes them with the ids' markers. It must not fail, and must
// name keys of the marker set's Redis (on Redis Cluster, of its hash slot).
// An id may come twice in one call, when it has several markers.
type KeysFunc func(ids []string) []string

// AtomicKV is a KV that clears entities itself, deleting their state keys
// in the script that removes their markers: a retention.ClearDeleter.
// Create one with KV.WithClear, and give it to retention.New with neither
// Config.Clear nor Config.ClearBatch set.
//
// A script runs whole or not at all, and nothing else runs in between, so a
// crash can no longer leave an entity's keys deleted with its marker still
// there. The script first checks that every marker of the batch is still in
// the set, and changes nothing when one is gone (an error matching
// retention.ErrMarkerGone): a batch sent again after a timeout whose
// first call did commit, or one another replica cleared meanwhile, clears
// nothing a second time. With a sweep that reschedules failed markers by
// moving them (retention.Mover, which KV is), each entity is then cleared
// exactly once, even with no lease. It applies to state held in keys of
// the same Redis (on Redis Cluster, of the same hash slot: give state keys
// the set's hash tag). State elsewhere cannot join the script: use
// Config.ClearBatch there. Under a rediskv Locker the script checks the
// lease key's token too, so a replica that lost its lease clears nothing.
//
// An error that Redis returns for ClearAndDelete (marker gone, lease lost,
// a refused script) means that nothing changed; the sweep keeps the
// batch's markers and tries their ids again. Only a call whose reply never
// came (a timeout, a lost connection) may have committed unheard, as
// retention.ClearDeleter says.
type AtomicKV struct {
	*KV
	keysOf KeysFunc
}

var (
	_ retention.ClearDeleter = (*AtomicKV)(nil)
	_ retention.Putter       = (*AtomicKV)(nil)
	_ retention.Mover        = (*AtomicKV)(nil)
)

// WithClear returns an AtomicKV over k's set whose ClearAndDelete deletes
// the keys keysOf names for each batch of ids, only if every marker of the
// batch is still in the set.
func (k *KV) WithClear(keysOf KeysFunc) (*AtomicKV, error) {
	if keysOf == nil {
		return nil, errors.New("rediskv: WithClear: keysOf must not be nil")
	}
	return &AtomicKV{KV: k, keysOf: keysOf}, nil
}

// Delete is KV.Delete; under a fence on ctx it asks the fence for a view
// of the AtomicKV, the KV the sweep was given.
func (a *AtomicKV) Delete(ctx context.Context, keys ...[]byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		return view.Delete(ctx, keys...)
	}
	return a.delete(ctx, keys)
}

// Put is KV.Put; under a fence on ctx it asks the fence for a view of the
// AtomicKV.
func (a *AtomicKV) Put(ctx context.Context, key, value []byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		return putThrough(ctx, view, key, value)
	}
	return a.put(ctx, key, value)
}

// Move is KV.Move; under a fence on ctx it asks the fence for a view of
// the AtomicKV.
func (a *AtomicKV) Move(ctx context.Context, from, to [][]byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		return moveThrough(ctx, view, from, to)
	}
	_, err = a.move(ctx, "", "", from, to)
	return err
}

// clearScript checks that every member ARGV[2..] is in the set KEYS[2],
// then deletes KEYS[3..] and removes the members; with a token in ARGV[1]
// (a fence), only while the lease key KEYS[1] holds it. It returns the
// number of members removed, -1 when the fence refused and -2-i when
// ARGV[2+i] is missing, having done nothing in either case. Without a
// token, KEYS[1] repeats the set, so every key stays in the set's slot.
// Every check comes before the first write: Redis does not roll back a
// script that fails part way.
var clearScript = redis.NewScript(`if ARGV[1] ~= "" and redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
for i = 2, #ARGV, ` + fmt.Sprint(unpackChunk) + ` do
	local scores = redis.call("zmscore", KEYS[2], unpack(ARGV, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #ARGV)))
	for j = 1, #scores do
		if not scores[j] then
			return -1 - (i - 2 + j)
		end
	end
end
for i = 3, #KEYS, ` + fmt.Sprint(unpackChunk) + ` do
	redis.call("unlink", unpack(KEYS, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #KEYS)))
end
local n = 0
for i = 2, #ARGV, ` + fmt.Sprint(unpackChunk) + ` do
	n = n + redis.call("zrem", KEYS[2], unpack(ARGV, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #ARGV)))
end
return n`)

// clearRangeScript is clearScript for a batch whose markers are a run of
// the set: ARGV[2] and ARGV[3] are its first and last marker, ARGV[4] their
// number and ARGV[5] the markers joined by newlines. It deletes the state
// keys and the range only when the set's members from the first to the
// last are exactly those markers, and returns -2, having done nothing,
// when they are not (a marker gone, a member of the range not in the
// batch): the caller then sends clearScript, which says which. A batch
// then costs Redis one argument per marker, not two, and one ZREMRANGEBYLEX
// instead of a lookup per marker for ZMSCORE and again for ZREM. The
// markers hold no newline (the caller sends clearScript otherwise), and
// the joined members must be the joined markers, so their count of
// newlines says that no member holds one either: equal texts mean equal
// lists.
var clearRangeScript = redis.NewScript(`if ARGV[1] ~= "" and redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
local n = tonumber(ARGV[4])
local members = redis.call("zrange", KEYS[2], "[" .. ARGV[2], "[" .. ARGV[3], "BYLEX", "LIMIT", 0, n + 1)
if #members ~= n or table.concat(members, "\n") ~= ARGV[5] then
	return -2
end
for i = 3, #KEYS, ` + fmt.Sprint(unpackChunk) + ` do
	redis.call("unlink", unpack(KEYS, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #KEYS)))
end
return redis.call("zremrangebylex", KEYS[2], "[" .. ARGV[2], "[" .. ARGV[3])`)

// joinedRange returns the markers joined by newlines, and false when there
// are none, they are not strictly ascending or one holds a newline.
func joinedRange(keys [][]byte) ([]byte, bool) {
	for i, k := range keys {
		if i > 0 && bytes.Compare(keys[i-1], k) >= 0 || bytes.IndexByte(k, '\n') >= 0 {
			return nil, false
		}
	}
	return bytes.Join(keys, []byte{'\n'}), len(keys) > 0
}

// ClearAndDelete implements retention.ClearDeleter with one script call:
// the entities' keys and the markers go together, only if every marker in
// keys is still in the set. When one is gone it changes nothing and
// returns an error matching retention.ErrMarkerGone. Under a fence on ctx
// (see retention.Fenced) it is the lease's fenced clear.
func (a *AtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		cd, ok := view.(retention.ClearDeleter)
		if !ok {
			return fmt.Errorf("rediskv: clear and delete: the fenced view (%T) cannot clear: %w", view, retention.ErrUnfenced)
		}
		return cd.ClearAndDelete(ctx, ids, keys)
	}
	_, err = a.run(ctx, "", "", ids, keys)
	return err
}

// errFenceRefused is run's error when the lease key no longer holds the
// token: the fenced view turns it into its own error.
var errFenceRefused = errors.New("rediskv: fence refused")

// run calls clearRangeScript, or clearScript when the markers are not a
// run of the set, fenced by lease and token when token is not
// empty. It returns errFenceRefused when the fence refused, and an error
// matching retention.ErrMarkerGone when a marker is gone.
func (a *AtomicKV) run(ctx context.Context, lease, token string, ids []string, keys [][]byte) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if token == "" {
		lease = a.key
	}
	state := a.keysOf(ids)
	scriptKeys := make([]string, 0, 2+len(state))
	scriptKeys = append(scriptKeys, lease, a.key)
	scriptKeys = append(scriptKeys, state...)
	n := int64(-2)
	var err error
	if joined, ok := joinedRange(keys); ok {
		n, err = clearRangeScript.Run(ctx, a.rdb, scriptKeys, token, keys[0], keys[len(keys)-1], len(keys), joined).Int64()
	}
	if err == nil && n == -2 {
		args := make([]any, 1, 1+len(keys))
		args[0] = token
		for _, k := range keys {
			args = append(args, k)
		}
		n, err = clearScript.Run(ctx, a.rdb, scriptKeys, args...).Int64()
	}
	switch {
	case err != nil:
		return 0, a.wrap(ctx, "clear and delete", err)
	case n == -1:
		return 0, errFenceRefused
	case n < -1:
		return 0, fmt.Errorf("rediskv: clear and delete %q: marker %q is not in the set, nothing changed: %w",
			a.key, keys[-n-2], retention.ErrMarkerGone)
	}
	return n, nil
}

// fencedAtomicKV is the view of an AtomicKV under a redisLease.
type fencedAtomicKV struct {
	*fencedKV
	atomic *AtomicKV
}

var _ retention.ClearDeleter = (*fencedAtomicKV)(nil)

func (f *fencedAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if f.err != nil {
		return fmt.Errorf("rediskv: fenced clear: %w", f.err)
	}
	if f.lease.isLost() {
		return f.refused("clear and delete")
	}
	_, err := f.atomic.run(ctx, f.lease.l.key, f.lease.token, ids, keys)
	if errors.Is(err, errFenceRefused) {
		f.lease.markLost()
		return f.refused("clear and delete")
	}
	return err
}
