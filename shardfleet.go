package retention

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// How the replicas of a sharded sweep share its shards out (Sharded.Run):
// each writes a key of its own every Heartbeat, <prefix>#m<fields>, whose
// fields (base64url, as the fleet's record's) are its name, its Heartbeat,
// a number that changes with every write, and the shards it holds; it
// reads the others' keys, counts as live those whose key changed within
// three of their Heartbeats, and from that alone decides which shards to
// try and which to give up. No replica leads; the leases decide who
// sweeps a shard, the keys only who tries. Clocks are not compared: a
// replica measures how long a key stayed the same in its own Heartbeats.
const (
	memberKind = 'm' // beside the fleet's other kinds, in wake.go

	memberVersion = 1
	// memberLive is how many of its Heartbeats a replica's key may stay
	// the same before the others take it for gone; memberStale how many
	// before any replica deletes the key.
	memberLive  = 3
	memberStale = 30
	// memberPages bounds the Scans of one read of the keys.
	memberPages = 16
)

// memberRange returns the bounds of the members' keys under prefix.
func memberRange(prefix string) (lower, upper []byte) {
	lower = append([]byte(prefix), fleetInfix, memberKind)
	return lower, append(lower[:len(lower)-1:len(lower)-1], memberKind+1)
}

// member is what one replica's key says.
type member struct {
	name      string
	heartbeat time.Duration
	run, beat uint64 // the Run that wrote it (random), and its write's number
	failing   bool   // its last tries of leases failed in the store
	held      []byte // a bit per shard it holds
}

func (m *member) holds(i int) bool { return i/8 < len(m.held) && m.held[i/8]&(1<<(i%8)) != 0 }

func (m *member) count() int {
	n := 0
	for _, b := range m.held {
		for ; b != 0; b &= b - 1 {
			n++
		}
	}
	return n
}

func appendMemberKey(dst []byte, prefix string, m *member) []byte {
	dst = append(append(dst, prefix...), fleetInfix, memberKind)
	b := []byte{memberVersion}
	b = appendFleetString(b, m.name)
	b = binary.AppendUvarint(b, uint64(m.heartbeat.Milliseconds()))
	b = binary.AppendUvarint(b, m.run)
	b = binary.AppendUvarint(b, m.beat)
	b = binary.AppendUvarint(b, uint64(boolInt(m.failing)))
	b = binary.AppendUvarint(b, uint64(len(m.held)))
	b = append(b, m.held...)
	return base64.RawURLEncoding.AppendEncode(dst, b)
}

var errMemberKey = errors.New("not a member's key")

func parseMemberKey(prefix string, key []byte) (m member, err error) {
	head := len(prefix) + 2
	if len(key) <= head || !bytes.HasPrefix(key, []byte(prefix)) || key[len(prefix)] != fleetInfix || key[len(prefix)+1] != memberKind {
		return m, errMemberKey
	}
	b, err := base64.RawURLEncoding.DecodeString(string(key[head:]))
	if err != nil || len(b) == 0 || b[0] != memberVersion {
		return m, errMemberKey
	}
	d := fleetDecoder{b: b[1:]}
	m.name = d.string()
	m.heartbeat = d.ms()
	m.run, m.beat = d.uint(), d.uint()
	m.failing = d.int() == 1
	n := d.int()
	if d.bad || n != len(d.b) || m.name == "" || m.heartbeat <= 0 {
		return member{}, errMemberKey
	}
	m.held = d.b
	return m, nil
}

// balancer is the state of one Run of a Sharded with leases.
type balancer struct {
	s     *Sharded
	order []int // the shards in this replica's order of preference
	runs  []*holder
	ctx   context.Context // the holders' context, cancelled when Run ends
	stop  context.CancelFunc
	wg    sync.WaitGroup

	me        member
	key       []byte   // this replica's key as last written, nil if none
	stored    bool     // the last read of the keys found it
	unsure    [][]byte // keys whose write failed since the last read: a lost reply may have left them in the store
	tick      int64
	firstRead int64            // the tick of the first read of the keys, 0 before it
	seen      map[string]int64 // the keys of the last read, and the tick each was first read at
	failing   bool
	twinSeen  bool // another Run under this replica's name was found
}

// holder is one shard this replica holds, swept on a goroutine of its own.
type holder struct {
	release   chan struct{} // closed to give the shard up after the page under way
	releasing bool
	done      chan struct{} // closed when the goroutine ends; then err and panic are set
	err       error
	panicked  *caughtPanic
}

// balance is Sharded.Run with leases.
func (s *Sharded) balance(ctx context.Context) error {
	n := len(s.shards)
	b := &balancer{s: s, runs: make([]*holder, n), seen: map[string]int64{}}
	b.ctx, b.stop = context.WithCancel(ctx)
	first := ShardOf(s.replica, n) // replicas that start together try different shards first
	for i := range n {
		b.order = append(b.order, (first+i)%n)
	}
	b.me = member{name: s.replica, heartbeat: s.heartbeat, run: rand.Uint64N(1 << 62), held: make([]byte, (n+7)/8)}
	s.sweeping.Store(0)
	s.setBudget()
	defer b.end(ctx)

	if s.startJit > 0 {
		if err := sleep(ctx, rand.N(s.startJit)); err != nil {
			return err
		}
	}
	t := time.NewTicker(s.heartbeat)
	defer t.Stop()
	for {
		if err := b.round(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// end gives every shard up, deletes this replica's key, and leaves the
// budget whole for Pass.
func (b *balancer) end(ctx context.Context) {
	b.stop()
	b.wg.Wait()
	if b.key != nil || len(b.unsure) > 0 {
		// A write cut short by Run's end may have reached the store.
		keys := b.unsure
		if b.key != nil {
			keys = append(keys, b.key)
		}
		cctx, cancel := withTimeout(context.WithoutCancel(ctx), b.s.storeTime)
		if err := b.s.kv.Delete(cctx, keys...); err != nil {
			b.s.log.Warn("retention: delete this replica's key", "error", err)
		}
		cancel()
	}
	b.s.sweeping.Store(int64(len(b.s.shards)))
	b.s.setBudget()
}

// round is one Heartbeat: it writes this replica's key, reads the others',
// and takes or gives up shards, from the second round on.
func (b *balancer) round(ctx context.Context) error {
	b.tick++
	if err := b.reap(); err != nil {
		return err
	}
	b.s.setBudget() // Config.Limiter's changes too
	b.write(ctx)
	others, err := b.read(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		b.s.log.Warn("retention: read the replicas' keys: shards neither taken nor given up", "error", err)
		return nil
	}
	if b.tick == 1 {
		// Replicas that start together see each other at their next
		// round: a replica that took every shard now would hold them
		// until the pages under way are over, long under a budget.
		return ctx.Err()
	}
	if b.decide(ctx, others) {
		b.write(ctx) // the others see the shards taken at their next read
	}
	return ctx.Err()
}

// reap forgets the holders that ended: given up, lost, or failed. A holder
// that panicked panics Run, as Sweep.Run lets a panic of OnPass or the
// Observer through; one that failed otherwise (ErrUnfenced) ends Run.
func (b *balancer) reap() error {
	for i, h := range b.runs {
		if h == nil {
			continue
		}
		select {
		case <-h.done:
		default:
			continue
		}
		b.runs[i] = nil
		b.me.held[i/8] &^= 1 << (i % 8)
		switch {
		case h.panicked != nil:
			// Raised again on Run's goroutine, where the stack is lost.
			b.s.log.Error("retention: a panic on a shard's goroutine", "panic", h.panicked.value, "stack", string(h.panicked.stack))
			panic(h.panicked.value)
		case h.err != nil && !errors.Is(h.err, context.Canceled) && !errors.Is(h.err, context.DeadlineExceeded):
			return h.err
		}
	}
	return nil
}

// write writes this replica's key anew: a Move of the last one while it is
// in the store, else a Put. A store that fails is logged; the next round
// writes again.
func (b *balancer) write(ctx context.Context) {
	b.me.beat++
	b.me.failing = b.failing
	key := appendMemberKey(nil, b.s.prefix, &b.me)
	cctx, cancel := withTimeout(ctx, b.s.storeTime)
	defer cancel()
	var err error
	if b.key != nil && b.stored {
		err = b.s.kv.(Mover).Move(cctx, [][]byte{b.key}, [][]byte{key}) // NewSharded checked it is a Mover
	} else {
		err = b.s.kv.(Putter).Put(cctx, key, nil)
	}
	if err != nil {
		b.unsure = append(b.unsure, key)
		if ctx.Err() == nil {
			b.s.log.Warn("retention: write this replica's key", "error", err)
		}
		return
	}
	if b.key != nil && !b.stored {
		// Put: the last key, if it is there after all, goes.
		if err := b.s.kv.Delete(cctx, b.key); err != nil && ctx.Err() == nil {
			b.s.log.Debug("retention: delete this replica's last key", "error", err)
		}
	}
	b.key, b.stored = key, true
}

// read reads the replicas' keys and returns the live others' (one per
// name, the newest), deleting those gone for memberStale Heartbeats.
func (b *balancer) read(ctx context.Context) ([]member, error) {
	from, end := memberRange(b.s.prefix)
	var keys [][]byte
	for range memberPages {
		cctx, cancel := withTimeout(ctx, b.s.storeTime)
		page, err := b.s.kv.Scan(cctx, from, end, fleetPage)
		cancel()
		if err != nil {
			return nil, err
		}
		keys = append(keys, page...)
		if len(page) < fleetPage {
			break
		}
		from = keyAfter(page[len(page)-1])
	}
	if b.firstRead == 0 {
		b.firstRead = b.tick
	}
	seen := make(map[string]int64, len(keys))
	newest := map[string]member{}
	firstOf := map[string]int64{}
	var stale, mine [][]byte
	b.stored = false
	for _, k := range keys {
		if bytes.Equal(k, b.key) {
			b.stored = true
			continue
		}
		m, err := parseMemberKey(b.s.prefix, k)
		if err != nil {
			continue // not a member's key: never deleted
		}
		if m.name == b.me.name && m.run == b.me.run {
			// A write of this Run whose reply was lost.
			stale = append(stale, k)
			mine = append(mine, k)
			continue
		}
		first, ok := b.seen[string(k)]
		if !ok {
			first = b.tick
		}
		if m.name == b.me.name && b.firstRead == b.tick {
			// An earlier Run's, whose end could not delete it (or a
			// process killed): the others would count it for memberLive
			// Heartbeats more.
			stale = append(stale, k)
			continue
		}
		seen[string(k)] = first
		// Unchanged for so long: in this replica's Heartbeats.
		still := time.Duration(b.tick-first) * b.s.heartbeat
		if still >= memberStale*m.heartbeat {
			stale = append(stale, k)
			continue
		}
		if m.name == b.me.name && m.run != b.me.run && first > b.firstRead && !b.twinSeen {
			// Written since this Run's first read, so not by an earlier
			// Run: the others count the two as one replica, and a third
			// may never get its share.
			b.twinSeen = true
			b.s.log.Error("retention: another replica runs under this Config.Replica: give each replica a name of its own", "replica", b.me.name)
		}
		if m.name == b.me.name || still >= memberLive*m.heartbeat {
			continue // this replica's own from an earlier Run, or one gone
		}
		if f, ok := firstOf[m.name]; !ok || first > f {
			newest[m.name], firstOf[m.name] = m, first
		}
	}
	b.seen = seen
	b.unsure = mine // read since: the others are not in the store
	if len(stale) > 0 {
		cctx, cancel := withTimeout(ctx, b.s.storeTime)
		if err := b.s.kv.Delete(cctx, stale...); err != nil && ctx.Err() == nil {
			b.s.log.Debug("retention: delete the keys of replicas gone", "error", err)
		}
		cancel()
	}
	others := make([]member, 0, len(newest))
	for _, m := range newest {
		others = append(others, m)
	}
	return others, nil
}

// decide takes and gives up shards by what the live others hold, and
// reports whether it took one. Of the shards over the live replicas, each
// replica's share is lo (rounded down) or hi (rounded up), and the
// replicas end up holding lo or hi each:
//
//   - it gives up the shards above hi while another holds fewer than hi,
//     or one above lo while another holds fewer than lo, each after the
//     page under way (see shardObserver);
//   - it tries the shards no live replica holds up to lo, then up to hi
//     once no other holds fewer than lo (a replica that gave one up does
//     not take another's), and, when no other holds fewer than hi (a
//     replica gone that its view still counts, say), whatever it holds,
//     so that no shard stays unswept.
func (b *balancer) decide(ctx context.Context, others []member) bool {
	n := len(b.s.shards)
	live := 1 + len(others)
	lo, hi := n/live, (n+live-1)/live
	claimed := make([]bool, n)
	poorest := n + 1 // the fewest a live other that can take shards holds
	for i := range others {
		m := &others[i]
		for s := range n {
			claimed[s] = claimed[s] || m.holds(s)
		}
		if !m.failing {
			poorest = min(poorest, m.count())
		}
	}
	mine := 0
	for _, h := range b.runs {
		if h != nil && !h.releasing {
			mine++
		}
	}
	give := 0
	switch {
	case mine > hi && poorest < hi:
		give = mine - hi
	case mine > lo && poorest < lo:
		give = 1
	}
	if give > 0 {
		b.s.log.Info("retention: giving up shards after the page under way", "give", give, "held", mine, "share", hi, "replicas", live)
		for k := n - 1; k >= 0 && give > 0; k-- {
			if h := b.runs[b.order[k]]; h != nil && !h.releasing {
				h.releasing = true
				close(h.release)
				give--
			}
		}
		return false
	}
	took, tried, failed := 0, 0, 0
	for _, i := range b.order {
		if !(mine < lo || mine < hi && poorest >= lo || poorest >= hi) || ctx.Err() != nil {
			break
		}
		if b.failing && tried > 0 {
			break // the store failed every try of the last round: one try a round until it answers
		}
		if b.runs[i] != nil || claimed[i] {
			continue
		}
		tried++
		switch err := b.take(ctx, i); {
		case err == nil:
			took++
			mine++
		case !errors.Is(err, ErrLeaseHeld) && ctx.Err() == nil:
			failed++
			if failed == 1 {
				b.s.log.Warn("retention: acquire a shard's lease", "shard", i, "error", err)
			}
		}
	}
	b.failing = tried > 0 && failed == tried
	if took > 0 {
		b.s.log.Info("retention: took shards", "took", took, "held", mine, "share", hi, "replicas", live)
	}
	return took > 0
}

// take tries shard i's lease, and sweeps the shard on a goroutine of its
// own once it has it.
func (b *balancer) take(ctx context.Context, i int) error {
	l := b.s.loops[i]
	var lease Lease
	if err := l.acquire(ctx, &lease); err != nil {
		return err
	}
	l.clearFree(ctx) // a key saying it was free is stale now
	h := &holder{release: make(chan struct{}), done: make(chan struct{})}
	b.runs[i] = h
	b.me.held[i/8] |= 1 << (i % 8)
	b.s.sweeping.Add(1)
	b.s.setBudget()
	b.wg.Go(func() {
		defer close(h.done)
		defer func() {
			if r := recover(); r != nil {
				h.panicked = &caughtPanic{value: r, stack: debug.Stack()}
			}
			b.s.sweeping.Add(-1)
			b.s.setBudget()
		}()
		h.err = hold(b.ctx, l, b.s.observers[i], lease, h.release)
	})
	return nil
}

// hold sweeps a shard under lease as Sweep.Run does, from a first pass at
// once, until ctx is done, the lease is lost, or release is closed, and
// gives the lease up. A pass under way when release is closed stops after
// the page under way (see shardObserver).
func hold(ctx context.Context, l *loop, obs *shardObserver, lease Lease, release <-chan struct{}) error {
	pctx, cut := context.WithCancel(ctx)
	defer cut()
	obs.cut.Store(&passCut{release: release, cancel: cut})
	defer obs.cut.Store(nil)
	defer func() {
		if lease != nil {
			l.giveUp(ctx, lease, false)
		}
	}()
	failures := 0
	for {
		select {
		case <-release:
			return nil
		default:
		}
		wait, err := l.round(pctx, &lease, &failures)
		switch {
		case err != nil && ctx.Err() == nil && pctx.Err() != nil:
			return nil // cut short after a page: given up
		case err != nil || lease == nil:
			return err // ctx done, ErrUnfenced, or the lease lost (round gave it up)
		}
		if err := pause(ctx, l, wait, lease, release); err != nil {
			return err
		}
		if isLost(lease) {
			l.giveUp(ctx, lease, true)
			lease = nil
			return nil
		}
	}
}

// shardObserver is the Observer of a shard's Sweep under a Sharded's Run
// with leases: it passes every call on to Config.Observer, and after each
// page cuts the pass short once the shard is to be given up. The page's
// clears are settled by then and the next page is not read yet, so a shard
// changes hands in the middle of a pass over a deep backlog with no
// entity cleared twice, where it would wait for the pass's end.
type shardObserver struct {
	inner Observer // nil: none
	cut   atomic.Pointer[passCut]
}

// passCut is how a shard's holder is cut short: release closed, cancel.
type passCut struct {
	release <-chan struct{}
	cancel  context.CancelFunc
}

func (o *shardObserver) ObservePass(prefix string, st Stats, err error) {
	if o.inner != nil {
		o.inner.ObservePass(prefix, st, err)
	}
}

func (o *shardObserver) ObserveLags(prefix string, lags []time.Duration) {
	if o.inner != nil {
		o.inner.ObserveLags(prefix, lags)
	}
}

func (o *shardObserver) ObservePage(prefix string, page Stats) {
	if o.inner != nil {
		o.inner.ObservePage(prefix, page)
	}
	if c := o.cut.Load(); c != nil {
		select {
		case <-c.release:
			c.cancel()
		default:
		}
	}
}

func (o *shardObserver) ObserveLease(prefix string, e LeaseEvent) {
	if o.inner != nil {
		o.inner.ObserveLease(prefix, e)
	}
}

// pause is the loop's sleep between passes, cut short by release or the
// loss of the lease: a shard lost is not held up to an Interval longer.
func pause(ctx context.Context, l *loop, d time.Duration, lease Lease, release <-chan struct{}) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-release:
		case <-lease.Lost():
		case <-sctx.Done():
		}
		cancel()
	}()
	_ = l.sleep(sctx, d, lease)
	return ctx.Err()
}
