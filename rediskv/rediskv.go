// Package rediskv keeps retention markers in one Redis sorted set through
// go-redis v9, so that replicas of a service can sweep one shared store.
//
// Every marker is a member with score 0; members of equal score are ordered
// bytewise, so Scan is one ZRANGE ... BYLEX ... LIMIT (Redis 6.2 or later)
// and Delete one ZREM. Move, with which the sweep reschedules the markers
// of failed clears, is one script that replaces each marker only if it is
// still there. Write a marker with MarkTx inside the MULTI (or pipeline)
// that records the entity's terminal state (MarkKeyTx with the key of
// Sweep.MarkerKey for a sweep with its own id rule). KV.WithStateKeys and
// KV.WithClear make an AtomicKV, which deletes entities' state keys in the
// script that removes their markers; one made by WithStateKeys lets a
// sweep clear its expired markers by runs, one script call each.
//
// Replicas that share the set take turns with a Locker, whose leases fence
// the KV: a holder's writes run in scripts that check that the lease key
// still holds its token. A KV wrapped by one of your own (to log or trace
// its calls) keeps that fence when the wrapper has an Unwrap method (see
// retention.Fencer): every write method of KV and AtomicKV applies the
// fence the sweep puts on its context.
//
// # Redis Cluster
//
// One sorted set lives in one hash slot, so every marker of a sweep lives on
// one master. The keys that one MULTI or script names must hash to one
// slot, so a sweep's keys share the set's hash tag: with the set
// "{runs}:done", entity keys such as "{runs}:state:<id>" (written in the
// MULTI of MarkTx, and deleted by the scripts of WithStateKeys and
// WithClear) and the lease key of the Locker that fences it,
// "{runs}:lease" (its scripts read the lease key and write the set). On a
// *redis.ClusterClient, which redis.NewUniversalClient returns for a
// cluster, the KV checks this before it sends anything: WithStateKeys
// refuses a template off the set's slot, and a fenced write, or a clear
// whose KeysFunc names a key off the set's slot, returns ErrCrossSlot;
// go-redis refuses such a MULTI itself (redis.ErrCrossSlot).
//
// When one master is not enough for one sweep, shard it
// (retention.NewSharded) and give each shard its keys under a tag of its
// own: ShardTags gives n tags whose slots spread evenly over the 16384, and
// so over the masters of a cluster whose masters own equal runs of slots.
// ShardConfig.KV returns shard i's KV over a set under the i-th tag, and
// ShardConfig.Lease a Locker on a key under the same tag; docs/fleet.md
// shows the pattern.
//
// The caller owns the client and closes it; a KV never does.
package rediskv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
)

// KV is a retention.KV over one sorted set. It is safe for concurrent use.
// Create one with New.
type KV struct {
	rdb redis.Cmdable
	key string
}

var (
	_ retention.KV     = (*KV)(nil)
	_ retention.Putter = (*KV)(nil)
	_ retention.Mover  = (*KV)(nil)
)

// New returns a KV over the sorted set stored at key. rdb may be a
// *redis.Client, *redis.ClusterClient or *redis.Ring, or a
// redis.UniversalClient holding one; on a cluster, see the package
// documentation for the keys a sweep names together.
func New(rdb redis.Cmdable, key string) (*KV, error) {
	if rdb == nil {
		return nil, errors.New("rediskv: client must not be nil")
	}
	if key == "" {
		return nil, errors.New("rediskv: key must not be empty")
	}
	return &KV{rdb: rdb, key: key}, nil
}

// Scan implements retention.KV with ZRANGE key [start (end BYLEX LIMIT 0 limit.
func (k *KV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("rediskv: Scan limit must be at least 1, got %d", limit)
	}
	members, err := k.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key:   k.key,
		Start: "[" + string(start),
		Stop:  "(" + string(end),
		ByLex: true,
		Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, k.wrap(ctx, "scan", err)
	}
	return toKeys(members), nil
}

// toKeys returns members as keys in one buffer, each ending at its
// capacity, so that appending to one cannot overwrite the next: one
// allocation instead of one per key.
func toKeys(members []string) [][]byte {
	size := 0
	for _, m := range members {
		size += len(m)
	}
	buf := make([]byte, 0, size)
	keys := make([][]byte, len(members))
	for i, m := range members {
		at := len(buf)
		buf = append(buf, m...)
		keys[i] = buf[at:len(buf):len(buf)]
	}
	return keys
}

// Delete implements retention.KV with one ZREM for the batch. Under a
// fence on ctx (see retention.Fenced) it is the lease's fenced delete.
func (k *KV) Delete(ctx context.Context, keys ...[]byte) error {
	view, err := retention.Fenced(ctx, k)
	if err != nil {
		return err
	}
	if view != nil {
		return view.Delete(ctx, keys...)
	}
	return k.delete(ctx, keys)
}

func (k *KV) delete(ctx context.Context, keys [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	members := make([]any, len(keys))
	for i, key := range keys {
		members[i] = string(key)
	}
	return k.wrap(ctx, "delete", k.rdb.ZRem(ctx, k.key, members...).Err())
}

// Put adds a marker key on its own. Members carry no value, so value must
// be empty. It makes KV a retention.Putter. Under a fence on ctx (see
// retention.Fenced) it is the lease's fenced put.
func (k *KV) Put(ctx context.Context, key, value []byte) error {
	view, err := retention.Fenced(ctx, k)
	if err != nil {
		return err
	}
	if view != nil {
		return putThrough(ctx, view, key, value)
	}
	return k.put(ctx, key, value)
}

func (k *KV) put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkValue(key, value); err != nil {
		return err
	}
	return k.wrap(ctx, "put", k.rdb.ZAdd(ctx, k.key, member(key)).Err())
}

// Move implements retention.Mover with one script for the whole call: for
// each pair whose from[i] is in the set, to[i] is added and from[i]
// removed. Each pair is whole even when the call fails part way (Redis
// does not roll a script back), because to[i] goes in before from[i] goes.
// Under a fence on ctx (see retention.Fenced) it is the lease's fenced
// move.
func (k *KV) Move(ctx context.Context, from, to [][]byte) error {
	view, err := retention.Fenced(ctx, k)
	if err != nil {
		return err
	}
	if view != nil {
		return moveThrough(ctx, view, from, to)
	}
	_, err = k.move(ctx, "", "", from, to)
	return err
}

// moveScript moves the pairs ARGV[2], ARGV[3]; ARGV[4], ARGV[5]; ... within
// the set KEYS[2] and returns how many it moved; with a token in ARGV[1] (a
// fence), only while the lease key KEYS[1] holds it, returning -1, having
// done nothing, when it does not. Without one, KEYS[1] repeats the set.
// Commands with one pair each keep every call clear of unpack's limit.
var moveScript = redis.NewScript(`if ARGV[1] ~= "" and redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
local n = 0
for i = 2, #ARGV - 1, 2 do
	local from, to = ARGV[i], ARGV[i + 1]
	if redis.call("zscore", KEYS[2], from) then
		if from ~= to then
			redis.call("zadd", KEYS[2], 0, to)
			redis.call("zrem", KEYS[2], from)
		end
		n = n + 1
	end
end
return n`)

// move runs moveScript, fenced by lease and token when token is not
// empty. It returns the script's count: -1 when the fence refused.
func (k *KV) move(ctx context.Context, lease, token string, from, to [][]byte) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(from) != len(to) {
		return 0, fmt.Errorf("rediskv: Move of %d keys to %d keys", len(from), len(to))
	}
	if len(from) == 0 {
		return 0, nil
	}
	if token == "" {
		lease = k.key
	}
	args := make([]any, 1, 1+2*len(from))
	args[0] = token
	for i := range from {
		args = append(args, string(from[i]), string(to[i]))
	}
	n, err := moveScript.Run(ctx, k.rdb, []string{lease, k.key}, args...).Int64()
	if err != nil {
		return 0, k.wrap(ctx, "move", err)
	}
	return n, nil
}

// putThrough and moveThrough write through the view a fence returned.
func putThrough(ctx context.Context, view retention.KV, key, value []byte) error {
	p, ok := view.(retention.Putter)
	if !ok {
		return fmt.Errorf("rediskv: put: the fenced view (%T) cannot put: %w", view, retention.ErrUnfenced)
	}
	return p.Put(ctx, key, value)
}

func moveThrough(ctx context.Context, view retention.KV, from, to [][]byte) error {
	m, ok := view.(retention.Mover)
	if !ok {
		return fmt.Errorf("rediskv: move: the fenced view (%T) cannot move: %w", view, retention.ErrUnfenced)
	}
	return m.Move(ctx, from, to)
}

// checkValue refuses a value: the set's members are keys alone.
func checkValue(key, value []byte) error {
	if len(value) != 0 {
		return fmt.Errorf("rediskv: Put of %q with a %d-byte value: the sorted set stores keys only", key, len(value))
	}
	return nil
}

// MarkTx queues the marker of id, finished at t, under prefix on pipe: pass
// the redis.Pipeliner of the TxPipelined call (a MULTI) that records the
// entity's terminal state, and the marker is written with it. It refuses
// what retention.MarkerKey refuses, and queues nothing then; the write's own
// outcome is reported by the pipeline's Exec. For a sweep with its own
// Config.ValidateID, use MarkKeyTx with the key of Sweep.MarkerKey.
func (k *KV) MarkTx(ctx context.Context, pipe redis.Pipeliner, prefix, id string, t time.Time) error {
	key, err := retention.MarkerKey(prefix, t, id)
	if err != nil {
		return err
	}
	return k.MarkKeyTx(ctx, pipe, key)
}

// MarkKeyTx queues the marker key on pipe, like MarkTx. Take key from
// Sweep.MarkerKey, which checks the id by the sweep's own rule
// (Config.ValidateID), or from retention.MarkerKey. A key that is not shaped
// like a marker (retention.CheckMarkerKey: the sweep would never delete it)
// is refused with an error matching retention.ErrMalformedMarker, and
// nothing is queued then.
func (k *KV) MarkKeyTx(ctx context.Context, pipe redis.Pipeliner, key []byte) error {
	if err := retention.CheckMarkerKey(key); err != nil {
		return fmt.Errorf("rediskv: MarkKeyTx: %w", err)
	}
	pipe.ZAdd(ctx, k.key, member(key))
	return nil
}

// member is a marker as a set member: score 0, so that members sort bytewise.
func member(key []byte) redis.Z {
	return redis.Z{Score: 0, Member: string(key)}
}

func (k *KV) wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%w)", ctxErr, err)
	}
	if isCrossSlot(err) {
		err = fmt.Errorf("%w: %w", ErrCrossSlot, err)
	}
	return fmt.Errorf("rediskv: %s %q: %w", op, k.key, err)
}
