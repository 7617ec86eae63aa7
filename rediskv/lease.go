package rediskv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
)

// MinLeaseTTL is the shortest TTL a Locker accepts: renewals go out every
// third of it and must have time to make the round trip.
const MinLeaseTTL = 30 * time.Millisecond

// DefaultLeaseTTL is the TTL of a Locker's lease when LockerOptions.TTL is
// zero: a holder that dies, freezes or is cut off blocks sweeping for at
// most this long.
const DefaultLeaseTTL = 10 * time.Second

// LockerOptions tune a Locker. A nil *LockerOptions means the defaults.
type LockerOptions struct {
	// TTL is how long the lease key outlives a holder that stops renewing
	// it; the holder renews it every third of the TTL. A holder whose
	// renewals do not get through gives the lease up (closes Lost) a tenth
	// of the TTL before Redis can expire the key, counted from when the
	// last renewal that got through was sent: room for the round trip
	// that set the expiry and for the holder's and the server's clocks
	// running at different rates. Zero means DefaultLeaseTTL; otherwise at
	// least MinLeaseTTL.
	TTL time.Duration
}

// Scripts that act on the lease key only while it still holds this holder's
// token, so that a holder whose lease expired and passed to another can
// neither renew nor release the new holder's lease.
var (
	renewScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then
	return redis.call("pexpire", KEYS[1], ARGV[2])
end
return 0`)
	releaseScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then
	return redis.call("del", KEYS[1])
end
return 0`)
)

// Locker is a retention.Locker built on one Redis key: SET key token NX PX
// ttl takes the lease, a script renews it every third of the TTL while the
// key still holds the holder's random token, and another script deletes it
// on release under the same check. A holder that cannot renew considers the
// lease lost once nine tenths of the TTL have run out since its last
// successful renewal (or the SET) was sent: at least a tenth of the TTL
// before Redis can expire the key and another replica take it, so that
// its pass is cancelled while the lease is still its own. Create one with
// NewLocker.
//
// Its leases are retention.Fencers for a *KV and an *AtomicKV: a fenced
// Delete, Put, Move, ClearAndDelete or ClearRun is a script that writes
// only while the lease key still holds the holder's token, so that no
// write of an old holder takes effect after another took the key,
// whatever the old holder's clock or scheduling did.
type Locker struct {
	rdb redis.Cmdable
	key string
	ttl time.Duration
}

var _ retention.Locker = (*Locker)(nil)

// NewLocker returns a Locker for the lease stored at key.
func NewLocker(rdb redis.Cmdable, key string, opts *LockerOptions) (*Locker, error) {
	ttl := DefaultLeaseTTL
	if opts != nil && opts.TTL != 0 {
		ttl = opts.TTL
	}
	switch {
	case rdb == nil:
		return nil, errors.New("rediskv: client must not be nil")
	case key == "":
		return nil, errors.New("rediskv: lease key must not be empty")
	case ttl < MinLeaseTTL:
		return nil, fmt.Errorf("rediskv: LockerOptions.TTL must be at least %v, got %v", MinLeaseTTL, ttl)
	}
	return &Locker{rdb: rdb, key: key, ttl: ttl}, nil
}

// TryAcquire implements retention.Locker.
func (l *Locker) TryAcquire(ctx context.Context) (retention.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:]) // never fails
	token := hex.EncodeToString(raw[:])
	sent := time.Now()
	ok, err := l.rdb.SetNX(ctx, l.key, token, l.ttl).Result()
	if err != nil {
		return nil, fmt.Errorf("rediskv: acquire lease %q: %w", l.key, err)
	}
	if !ok {
		return nil, fmt.Errorf("rediskv: lease %q: %w", l.key, retention.ErrLeaseHeld)
	}
	lease := &redisLease{l: l, token: token, lost: make(chan struct{}), stop: make(chan struct{})}
	lease.wg.Go(func() { lease.keepAlive(sent.Add(l.ttl - l.safetyMargin())) })
	return lease, nil
}

// safetyMargin is how much earlier than Redis the holder gives its lease
// up. The key expires a TTL after Redis ran the SET or the renewal, which
// is after the holder sent it; the margin covers a clock of the holder
// that runs slower than the server's.
func (l *Locker) safetyMargin() time.Duration { return l.ttl / 10 }

type redisLease struct {
	l     *Locker
	token string

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func (r *redisLease) Lost() <-chan struct{} { return r.lost }

func (r *redisLease) markLost() { r.lostOnce.Do(func() { close(r.lost) }) }

// keepAlive renews the lease every third of its TTL. validUntil is the
// safety margin before the key can expire if no renewal gets through: the
// lease counts as lost from then on, or at once when the key no longer
// holds the token.
func (r *redisLease) keepAlive(validUntil time.Time) {
	defer r.markLost()
	tick := time.NewTicker(r.l.ttl / 3)
	defer tick.Stop()
	expiry := time.NewTimer(time.Until(validUntil))
	defer expiry.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-expiry.C:
			return
		case <-tick.C:
		}
		sent := time.Now()
		n, err, ok := r.renew(validUntil, expiry.C)
		switch {
		case !ok:
			return
		case err == nil && n == 1:
			validUntil = sent.Add(r.l.ttl - r.l.safetyMargin())
			expiry.Reset(time.Until(validUntil))
		case err == nil:
			return // the key expired or belongs to another holder
		}
		// On an error, try again at the next tick until validUntil.
	}
}

// renew runs the renewal script with a deadline of validUntil, since a
// renewal may not outlast the lease it renews. A client that does not
// honour a context's deadline (go-redis without ContextTimeoutEnabled
// waits out its ReadTimeout instead) must not hold Lost open past
// validUntil either: when expiry fires or Release is called first, renew
// closes Lost at once, waits for the call to end, and reports !ok.
func (r *redisLease) renew(validUntil time.Time, expiry <-chan time.Time) (n int, err error, ok bool) {
	ctx, cancel := context.WithDeadline(context.Background(), validUntil)
	defer cancel()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := renewScript.Run(ctx, r.l.rdb, []string{r.l.key}, r.token, r.l.ttl.Milliseconds()).Int()
		done <- result{n, err}
	}()
	select {
	case res := <-done:
		return res.n, res.err, true
	case <-expiry:
	case <-r.stop:
	}
	r.markLost()
	cancel()
	<-done
	return 0, nil, false
}

// Release stops renewing and deletes the key if it still holds this
// holder's token.
func (r *redisLease) Release(ctx context.Context) error {
	r.stopOnce.Do(func() { close(r.stop) })
	r.wg.Wait() // keepAlive has marked the lease lost on its way out
	if err := releaseScript.Run(ctx, r.l.rdb, []string{r.l.key}, r.token).Err(); err != nil {
		return fmt.Errorf("rediskv: release lease %q: %w", r.l.key, err)
	}
	return nil
}

// unpackChunk bounds the arguments a script passes to one command (ZREM,
// ZMSCORE, UNLINK): Lua's unpack fails beyond its C stack (8000 values in
// Redis).
const unpackChunk = 4000

// Scripts that write markers only while the lease key still holds the
// holder's token. They return -1 when it does not, and write nothing then.
var (
	fencedDeleteScript = redis.NewScript(`if redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
local n = 0
for i = 2, #ARGV, ` + fmt.Sprint(unpackChunk) + ` do
	n = n + redis.call("zrem", KEYS[2], unpack(ARGV, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #ARGV)))
end
return n`)
	fencedPutScript = redis.NewScript(`if redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
return redis.call("zadd", KEYS[2], 0, ARGV[2])`)
)

var _ retention.Fencer = (*redisLease)(nil)

// Fence implements retention.Fencer for a *KV and an *AtomicKV: the
// view's Delete, Put, Move, ClearAndDelete and ClearRun are scripts that
// check the lease key's token and write in the same atomic step, run
// through the KV's own client. On Redis Cluster (or a Ring) both keys must
// hash to one slot (shard): writes return ErrCrossSlot otherwise, rather
// than going out unfenced. The writes of an AtomicKV one of whose
// WithStateKeys templates names the lease key for some id fail too: a
// clear of that id would delete the lease.
func (r *redisLease) Fence(kv retention.KV) (retention.KV, bool) {
	switch k := kv.(type) {
	case *KV:
		return r.fenceKV(k), true
	case *AtomicKV:
		f := r.fenceKV(k.KV)
		if f.err == nil {
			f.err = k.templateNames(r.l.key, "the lease key")
		}
		return &fencedAtomicKV{fencedKV: f, atomic: k}, true
	}
	return nil, false
}

func (r *redisLease) fenceKV(k *KV) *fencedKV {
	f := &fencedKV{kv: k, lease: r}
	if !sameSlot(k.rdb, k.key, r.l.key) {
		f.err = fmt.Errorf("%w: marker set %q, lease key %q (give them one hash tag, e.g. {runs})", ErrCrossSlot, k.key, r.l.key)
	}
	return f
}

// fencedKV is a KV whose writes take effect only while its lease holds.
type fencedKV struct {
	kv    *KV
	lease *redisLease
	err   error // set when the keys cannot be fenced together
}

var (
	_ retention.KV     = (*fencedKV)(nil)
	_ retention.Putter = (*fencedKV)(nil)
	_ retention.Mover  = (*fencedKV)(nil)
)

func (f *fencedKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return f.kv.Scan(ctx, start, end, limit)
}

func (f *fencedKV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	args := make([]any, 1, 1+len(keys))
	args[0] = f.lease.token
	for _, key := range keys {
		args = append(args, string(key))
	}
	return f.run(ctx, "delete", fencedDeleteScript, args)
}

func (f *fencedKV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkValue(key, value); err != nil {
		return err
	}
	return f.run(ctx, "put", fencedPutScript, []any{f.lease.token, string(key)})
}

func (f *fencedKV) Move(ctx context.Context, from, to [][]byte) error {
	if f.err != nil {
		return fmt.Errorf("rediskv: fenced move: %w", f.err)
	}
	if f.lease.isLost() {
		return f.refused("move")
	}
	n, err := f.kv.move(ctx, f.lease.l.key, f.lease.token, from, to)
	if err != nil {
		return err
	}
	if n < 0 {
		f.lease.markLost()
		return f.refused("move")
	}
	return nil
}

func (f *fencedKV) run(ctx context.Context, op string, script *redis.Script, args []any) error {
	if f.err != nil {
		return fmt.Errorf("rediskv: fenced %s: %w", op, f.err)
	}
	if f.lease.isLost() {
		return f.refused(op)
	}
	n, err := script.Run(ctx, f.kv.rdb, []string{f.lease.l.key, f.kv.key}, args...).Int64()
	if err != nil {
		return f.kv.wrap(ctx, "fenced "+op, err)
	}
	if n < 0 {
		f.lease.markLost()
		return f.refused(op)
	}
	return nil
}

func (f *fencedKV) refused(op string) error {
	return fmt.Errorf("rediskv: %s %q refused: lease key %q no longer holds this holder's token: %w", op, f.kv.key, f.lease.l.key, retention.ErrLeaseLost)
}

func (r *redisLease) isLost() bool {
	select {
	case <-r.lost:
		return true
	default:
		return false
	}
}
