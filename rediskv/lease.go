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
// lease lost once the TTL has run out since its last successful renewal was
// sent, which is no later than Redis expires the key. Create one with
// NewLocker.
type Locker struct {
	rdb redis.Cmdable
	key string
	ttl time.Duration
}

var _ retention.Locker = (*Locker)(nil)

// NewLocker returns a Locker for the lease stored at key, expiring ttl after
// its holder stops renewing it.
func NewLocker(rdb redis.Cmdable, key string, ttl time.Duration) (*Locker, error) {
	switch {
	case rdb == nil:
		return nil, errors.New("rediskv: client must not be nil")
	case key == "":
		return nil, errors.New("rediskv: lease key must not be empty")
	case ttl < MinLeaseTTL:
		return nil, fmt.Errorf("rediskv: lease TTL must be at least %v, got %v", MinLeaseTTL, ttl)
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
	lease.wg.Go(func() { lease.keepAlive(sent.Add(l.ttl)) })
	return lease, nil
}

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

// keepAlive renews the lease every third of its TTL. validUntil is when the
// key expires at the latest if no renewal gets through: the lease counts as
// lost from then on, or at once when the key no longer holds the token.
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
		// A renewal may not outlast the lease it renews.
		ctx, cancel := context.WithDeadline(context.Background(), validUntil)
		sent := time.Now()
		n, err := renewScript.Run(ctx, r.l.rdb, []string{r.l.key}, r.token, r.l.ttl.Milliseconds()).Int()
		cancel()
		switch {
		case err == nil && n == 1:
			validUntil = sent.Add(r.l.ttl)
			expiry.Reset(time.Until(validUntil))
		case err == nil:
			return // the key expired or belongs to another holder
		}
		// On an error, try again at the next tick until validUntil.
	}
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
