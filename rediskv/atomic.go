package rediskv

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
)

// KeysFunc returns the keys that hold the state of the entities ids: an
// AtomicKV deletes them with the ids' markers.
type KeysFunc func(ids []string) []string

// AtomicKV is a KV that clears entities itself, deleting their state keys
// in the script that removes their markers: a retention.ClearDeleter.
// Create one with KV.WithClear, and give it to retention.New with neither
// Config.Clear nor Config.ClearBatch set.
//
// A script runs whole or not at all, and nothing else runs in between, so a
// crash can no longer leave an entity's keys deleted with its marker still
// there: each entity is cleared exactly once, with no lease. It applies to
// state held in keys of the same Redis (on Redis Cluster, of the same hash
// slot: give state keys the set's hash tag). State elsewhere cannot join
// the script: use Config.ClearBatch there. Under a rediskv Locker the
// script checks the lease key's token too, so a replica that lost its lease
// clears nothing.
type AtomicKV struct {
	*KV
	keysOf KeysFunc
}

var _ retention.ClearDeleter = (*AtomicKV)(nil)

// WithClear returns an AtomicKV over k's set whose ClearAndDelete deletes
// the keys keysOf names for each batch of ids.
func (k *KV) WithClear(keysOf KeysFunc) (*AtomicKV, error) {
	if keysOf == nil {
		return nil, errors.New("rediskv: WithClear: keysOf must not be nil")
	}
	return &AtomicKV{KV: k, keysOf: keysOf}, nil
}

// clearScript deletes KEYS[3..] and removes ARGV[2..] from the set KEYS[2];
// with a token in ARGV[1] (a fence), only while the lease key KEYS[1] holds
// it, returning -1, having done nothing, when it does not. Without one,
// KEYS[1] repeats the set, so every key stays in the set's slot.
var clearScript = redis.NewScript(`if ARGV[1] ~= "" and redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
for i = 3, #KEYS, ` + fmt.Sprint(unpackChunk) + ` do
	redis.call("unlink", unpack(KEYS, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #KEYS)))
end
local n = 0
for i = 2, #ARGV, ` + fmt.Sprint(unpackChunk) + ` do
	n = n + redis.call("zrem", KEYS[2], unpack(ARGV, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #ARGV)))
end
return n`)

// ClearAndDelete implements retention.ClearDeleter with one script call:
// the entities' keys and the markers go together.
func (a *AtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	_, err := a.run(ctx, a.key, "", ids, keys)
	return err
}

// run calls clearScript, fenced by lease and token when lease is not empty,
// and reports whether the fence let it through.
func (a *AtomicKV) run(ctx context.Context, lease, token string, ids []string, keys [][]byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	state := a.keysOf(ids)
	scriptKeys := make([]string, 0, 2+len(state))
	scriptKeys = append(scriptKeys, lease, a.key)
	scriptKeys = append(scriptKeys, state...)
	args := make([]any, 1, 1+len(keys))
	args[0] = token
	for _, k := range keys {
		args = append(args, string(k))
	}
	n, err := clearScript.Run(ctx, a.rdb, scriptKeys, args...).Int64()
	if err != nil {
		return false, a.wrap(ctx, "clear and delete", err)
	}
	return n >= 0, nil
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
	ok, err := f.atomic.run(ctx, f.lease.l.key, f.lease.token, ids, keys)
	if err != nil {
		return err
	}
	if !ok {
		f.lease.markLost()
		return f.refused("clear and delete")
	}
	return nil
}
