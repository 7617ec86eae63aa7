// Package etcdkv keeps retention markers under a key prefix in etcd through
// the clientv3 API, so that replicas of a service can sweep one shared store.
//
// Delete batches the keys into transactions of at most Options.MaxTxnOps
// operations each, the server's per-transaction limit; Move, with which a
// sweep reschedules a failed marker, moves each key in a nested
// transaction that checks it exists. Write a marker by adding MarkOp's
// operation to the Txn that records the entity's terminal state
// (MarkKeyOp's, with the key of Sweep.MarkerKey, for a sweep with its own
// id rule). Replicas that share the keys take turns with a Locker, whose
// leases fence the KV: a holder's writes are transactions that apply only
// while its lock key still exists, also when they go through a KV of yours
// that wraps this one (see retention.Fenced).
//
// The caller owns the client and closes it; a KV never does.
//
// # Cost
//
// An etcd range request counts every key of its range, whatever its limit,
// so Scan reads its range as consecutive windows of marker time, each sized
// from the density of keys the KV has seen to hold about a page: an idle
// pass makes the server count about one key, and each page of a backlog
// about a page, however many markers wait. Two reads stay proportional to
// the keys: the first Scan of a prefix by a new KV, which counts its range
// once, and the index entries of deleted keys, which every request over
// them walks until a compaction: run etcd with
// --auto-compaction-retention when you sweep large backlogs. Ranges whose
// start has no digits after the part it shares with end (foreign keys under
// the prefix) are read in one request.
package etcdkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
)

// DefaultMaxTxnOps is etcd's default --max-txn-ops.
const DefaultMaxTxnOps = 128

// Options tune a KV. A nil *Options means the defaults.
type Options struct {
	// MaxTxnOps is the most deletes sent in one transaction, and two more
	// than the most keys Move moves in one; set it to the server's
	// --max-txn-ops. Zero means DefaultMaxTxnOps.
	MaxTxnOps int
}

// KV is a retention.KV over the keys of etcd under one namespace prefix. It
// is safe for concurrent use. Create one with New.
type KV struct {
	kv       clientv3.KV
	ns       string
	maxOps   int
	families families // where Scan's windows go: hints, never needed for correctness
}

var (
	_ retention.KV     = (*KV)(nil)
	_ retention.Putter = (*KV)(nil)
	_ retention.Mover  = (*KV)(nil)
)

// New returns a KV whose keys live in etcd under namespace, which must not
// be empty (e.g. "myservice/retention/"). kv is usually a *clientv3.Client.
func New(kv clientv3.KV, namespace string, opts *Options) (*KV, error) {
	if kv == nil {
		return nil, errors.New("etcdkv: client must not be nil")
	}
	if namespace == "" {
		// A namespace keeps every key non-empty and every range end clear of
		// etcd's "\x00 means to the end" convention.
		return nil, errors.New(`etcdkv: namespace must not be empty (use e.g. "myservice/retention/")`)
	}
	k := &KV{kv: kv, ns: namespace, maxOps: DefaultMaxTxnOps}
	if opts != nil && opts.MaxTxnOps != 0 {
		if opts.MaxTxnOps < 0 {
			return nil, fmt.Errorf("etcdkv: Options.MaxTxnOps must not be negative, got %d", opts.MaxTxnOps)
		}
		k.maxOps = opts.MaxTxnOps
	}
	return k, nil
}

// Scan implements retention.KV with ranged, keys-only Gets over consecutive
// windows of [start, end), each asking for the keys still missing, so that
// no request counts many more keys than the page holds (see the package
// doc). The windows are read at the revisions their requests see, which the
// KV contract allows: it asks for no snapshot.
func (k *KV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("etcdkv: Scan limit must be at least 1, got %d", limit)
	}
	if bytes.Compare(start, end) >= 0 {
		return nil, nil
	}
	t0, ok := stampStart(start, end)
	if !ok {
		keys, _, err := k.get(ctx, start, end, limit)
		return keys, err
	}
	prefix := start[:t0]
	fam := k.families.get(prefix)
	want := windowKeys(limit)
	var out [][]byte
	empty := 0
	for cursor := start; ; {
		w := nextWindow(cursor, end, t0, fam, want)
		if empty >= maxEmptyWindows {
			// Past the last key, or before a long gap: one request for the
			// rest beats stepping through empty windows to the range's end.
			w = window{end: end}
		}
		need := limit - len(out)
		keys, count, err := k.get(ctx, cursor, w.end, need)
		if err != nil {
			return nil, err
		}
		if w.width > 0 && count == 0 {
			empty++
		}
		learn(&fam, w, t0, keys, need, count)
		out = append(out, keys...)
		if len(out) == limit || bytes.Equal(w.end, end) {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cursor = w.end
	}
	switch lm := fam.landmark; {
	case len(out) > 0:
		fam.landmark = bytes.Clone(out[len(out)-1])
	case lm != nil && bytes.Compare(lm, start) >= 0 && bytes.Compare(lm, end) < 0:
		fam.landmark = nil // it is gone
	}
	k.families.set(prefix, fam)
	return out, nil
}

// get is one ranged, keys-only Get of up to limit keys in [start, end). It
// returns the keys without the namespace, and the response's Count: the
// keys the server counted in the range.
func (k *KV) get(ctx context.Context, start, end []byte, limit int) ([][]byte, int64, error) {
	resp, err := k.kv.Get(ctx, k.ns+string(start),
		clientv3.WithRange(k.ns+string(end)),
		clientv3.WithLimit(int64(limit)),
		clientv3.WithKeysOnly(),
		// clientv3 sends this as the default order, which keeps the limit; an
		// explicit sort would make a 3.4 server read the whole range.
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, wrap(ctx, "scan", err)
	}
	keys := make([][]byte, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = bytes.Clone(kv.Key[len(k.ns):])
	}
	return keys, resp.Count, nil
}

// Delete implements retention.KV: the keys go in transactions of at most
// MaxTxnOps deletes. A failure can leave earlier transactions applied.
// Under a Locker's lease carried by ctx (see retention.Fenced), the
// transactions are fenced by it.
func (k *KV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if view, err := k.fenced(ctx); err != nil || view != nil {
		if err != nil {
			return err
		}
		return view.Delete(ctx, keys...)
	}
	return k.deleteIf(ctx, nil, keys)
}

// deleteIf deletes keys in transactions of at most MaxTxnOps deletes, each
// fenced by fence when it is not nil.
func (k *KV) deleteIf(ctx context.Context, fence *fencedKV, keys [][]byte) error {
	ops := make([]clientv3.Op, 0, min(len(keys), k.maxOps))
	for len(keys) > 0 {
		n := min(len(keys), k.maxOps)
		ops = ops[:0]
		for _, key := range keys[:n] {
			ops = append(ops, clientv3.OpDelete(k.ns+string(key)))
		}
		if err := k.commit(ctx, fence, fmt.Sprintf("delete %d keys", n), ops); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

// Put writes key with value under the namespace. It makes KV a
// retention.Putter. Under a Locker's lease carried by ctx (see
// retention.Fenced), the write is fenced by it.
func (k *KV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if view, err := k.fenced(ctx); err != nil || view != nil {
		if err != nil {
			return err
		}
		p, ok := view.(retention.Putter)
		if !ok {
			return unfencedOp(view, "Put")
		}
		return p.Put(ctx, key, value)
	}
	return k.commit(ctx, nil, "put", []clientv3.Op{clientv3.OpPut(k.ns+string(key), string(value))})
}

// Move implements retention.Mover. Each pair is a nested transaction that
// deletes from[i] and writes to[i] only if from[i] exists (its create
// revision is not 0), and up to MaxTxnOps-2 pairs go in one transaction
// (etcd counts a nested transaction's operations against what its parent
// left of the limit); a call with more pairs, or with a key in two pairs,
// takes several, each applied whole, and a failure can leave earlier ones
// applied. It needs etcd 3.3 or later (nested transactions) and a
// MaxTxnOps of at least 3. Under a Locker's lease carried by ctx (see
// retention.Fenced), every transaction is fenced by it.
func (k *KV) Move(ctx context.Context, from, to [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(from) != len(to) {
		return fmt.Errorf("etcdkv: Move of %d keys to %d keys", len(from), len(to))
	}
	if view, err := k.fenced(ctx); err != nil || view != nil {
		if err != nil {
			return err
		}
		m, ok := view.(retention.Mover)
		if !ok {
			return unfencedOp(view, "Move")
		}
		return m.Move(ctx, from, to)
	}
	return k.moveIf(ctx, nil, from, to)
}

// moveIf moves the pairs in transactions of at most MaxTxnOps pairs, each
// fenced by fence when it is not nil. etcd refuses a transaction that
// writes one key twice, so a pair that shares a key with an earlier pair
// of the batch starts the next one: the pairs then apply in order, as one
// after the other would.
func (k *KV) moveIf(ctx context.Context, fence *fencedKV, from, to [][]byte) error {
	// etcd lets a nested transaction hold only what the outer branch left
	// of MaxTxnOps: a pair takes 2, so one transaction holds MaxTxnOps-2.
	perTxn := max(k.maxOps-2, 1)
	ops := make([]clientv3.Op, 0, min(len(from), perTxn))
	batch := make(map[string]bool, 2*cap(ops))
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		err := k.commit(ctx, fence, fmt.Sprintf("move %d keys", len(ops)), ops)
		ops = ops[:0]
		clear(batch)
		return err
	}
	for i := range from {
		f, t := k.ns+string(from[i]), k.ns+string(to[i])
		if len(ops) == perTxn || batch[f] || batch[t] {
			if err := flush(); err != nil {
				return err
			}
		}
		batch[f], batch[t] = true, true
		exists := clientv3.Compare(clientv3.CreateRevision(f), ">", 0)
		if f == t {
			ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{exists}, []clientv3.Op{clientv3.OpPut(t, "")}, nil))
			continue
		}
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{exists}, []clientv3.Op{clientv3.OpDelete(f), clientv3.OpPut(t, "")}, nil))
	}
	return flush()
}

// fenced returns the view of k fenced by the lease ctx carries, or nil
// when ctx carries none. A view of this package's leases writes through
// k's unexported methods, never back through Delete, Put or Move.
func (k *KV) fenced(ctx context.Context) (retention.KV, error) {
	view, err := retention.Fenced(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("etcdkv: %w", err)
	}
	return view, nil
}

// unfencedOp is the error of a write the fence's view cannot make.
func unfencedOp(view retention.KV, op string) error {
	return fmt.Errorf("etcdkv: the fenced view (%T) has no %s: %w", view, op, retention.ErrUnfenced)
}

// commit sends ops in one transaction: fenced by the lease of fence when
// it is not nil, else unconditionally.
func (k *KV) commit(ctx context.Context, fence *fencedKV, op string, ops []clientv3.Op) error {
	if fence != nil {
		return fence.commit(ctx, op, ops)
	}
	if _, err := k.kv.Txn(ctx).Then(ops...).Commit(); err != nil {
		return wrap(ctx, op, err)
	}
	return nil
}

// MarkOp returns the operation that writes the marker of id, finished at t,
// under prefix: add it to the Then branch of the Txn that records the
// entity's terminal state, and the marker commits with it. It refuses what
// retention.MarkerKey refuses. For a sweep with its own Config.ValidateID,
// use MarkKeyOp with the key of Sweep.MarkerKey.
func (k *KV) MarkOp(prefix, id string, t time.Time) (clientv3.Op, error) {
	key, err := retention.MarkerKey(prefix, t, id)
	if err != nil {
		return clientv3.Op{}, err
	}
	return k.MarkKeyOp(key)
}

// MarkKeyOp returns the operation that writes the marker key under the KV's
// namespace, like MarkOp. Take key from Sweep.MarkerKey, which checks the id
// by the sweep's own rule (Config.ValidateID), or from retention.MarkerKey.
// A key that is not shaped like a marker (retention.CheckMarkerKey: the
// sweep would never delete it) is refused with an error matching
// retention.ErrMalformedMarker.
func (k *KV) MarkKeyOp(key []byte) (clientv3.Op, error) {
	if err := retention.CheckMarkerKey(key); err != nil {
		return clientv3.Op{}, fmt.Errorf("etcdkv: MarkKeyOp: %w", err)
	}
	return clientv3.OpPut(k.ns+string(key), ""), nil
}

func wrap(ctx context.Context, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%w)", ctxErr, err)
	}
	return fmt.Errorf("etcdkv: %s: %w", op, err)
}
