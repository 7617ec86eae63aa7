package retention

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Fleet is what the replicas of a fleet share about a sweep through its
// store: who sweeps it, since when, and the passes of the last hour. Any
// replica reads it with Sweep.Fleet; the replica that holds the lease
// writes it, when its Config.Replica is set (docs/fleet.md, "The fleet
// view"). The zero value means no record: no such replica has passed yet.
type Fleet struct {
	// Replica is this Sweep's Config.Replica.
	Replica string

	// Holder is the replica the newest record is of: the one that holds
	// the lease, unless Released says it gave it up (or lost it) after its
	// last pass. Since is when it took the lease.
	Holder   string
	Since    time.Time
	Released bool

	// NextPass is when Holder meant to pass next, unless woken; zero when
	// not known (a LeasedPass). WakePoll is how often it reads the wake
	// key between passes: a Wake or Requeue reaches it within that. Zero
	// means it reads none.
	NextPass time.Time
	WakePoll time.Duration

	// Minutes are the passes of the last hour by the minute they ended
	// in, oldest first, and Holder's last minute when it is older.
	Minutes []FleetMinute
}

// LastPass returns the fleet's last pass on record: the last minute's, and
// false when there is none.
func (f Fleet) LastPass() (FleetMinute, bool) {
	if len(f.Minutes) == 0 {
		return FleetMinute{}, false
	}
	return f.Minutes[len(f.Minutes)-1], true
}

// FleetMinute is one minute of a fleet's passes.
type FleetMinute struct {
	Start   time.Time     // when the minute began
	Passes  int           // passes that ended in it
	Errors  int           // of them, the passes that failed
	Cleared int           // entities they cleared
	Failed  int           // their clears that failed
	MaxLag  time.Duration // how overdue the most overdue entity they cleared was: the backlog's age as a pass began

	// Replica made the minute's last pass, which ended at LastAt. Last
	// holds its Cleared, Failed, Retried, Parked, Held, Malformed,
	// LiveAgain, Gone, Scanned, Duration and MaxLag; LastErr its error,
	// cut to 120 bytes, "" when it succeeded.
	Replica string
	LastAt  time.Time
	Last    Stats
	LastErr string
}

// fleetRecord is one key of the fleet's history: one replica's passes of
// one minute under one lease.
type fleetRecord struct {
	FleetMinute
	since    time.Time
	next     time.Time
	wakePoll time.Duration
	released bool
}

const (
	fleetVersion = 1
	maxFleetErr  = 120
	fleetHour    = time.Hour
	// fleetWriteGap is how often, at most, the holder writes its record
	// while it passes more often: a pass followed by a longer wait, or a
	// failed one, is written at once.
	fleetWriteGap = time.Second
	// fleetReadPages bounds the Scans of one read of the history: a minute
	// holds one record per holder, so an hour holds a few dozen.
	fleetReadPages = 4
	fleetPage      = 256
	// fleetReread is how often the holder reads the history again, to
	// delete what other holders left past the hour.
	fleetReread = 30 * time.Minute
)

// historyRange returns the bounds of s's history keys.
func (s *Sweep) historyRange() (lower, upper []byte) {
	lower = append([]byte(s.prefix), fleetInfix, historyKind)
	return lower, append(lower[:len(lower)-1:len(lower)-1], historyKind+1)
}

// appendFleetKey appends the key of r: the history infix, its minute and
// its fields, in the id bytes of base64url so that no sweep reads it as a
// marker.
func appendFleetKey(dst []byte, prefix string, r *fleetRecord) []byte {
	dst = append(append(dst, prefix...), fleetInfix, historyKind)
	dst = append(appendTimestamp(dst, uint64(max(r.Start.UnixMilli(), 0))), '-')
	var b []byte
	b = append(b, fleetVersion)
	b = appendFleetString(b, r.Replica)
	for _, v := range []int64{
		r.since.UnixMilli(), int64(r.Passes), int64(r.Errors), int64(r.Cleared), int64(r.Failed), r.MaxLag.Milliseconds(),
		r.LastAt.UnixMilli(), int64(r.Last.Cleared), int64(r.Last.Failed), int64(r.Last.Retried), int64(r.Last.Parked),
		int64(r.Last.Held), int64(r.Last.Malformed), int64(r.Last.LiveAgain), int64(r.Last.Gone), int64(r.Last.Scanned),
		r.Last.Duration.Milliseconds(), r.Last.MaxLag.Milliseconds(), timeMs(r.next), r.wakePoll.Milliseconds(), boolInt(r.released),
	} {
		b = binary.AppendUvarint(b, uint64(max(v, 0)))
	}
	b = appendFleetString(b, r.LastErr)
	return base64.RawURLEncoding.AppendEncode(dst, b)
}

func appendFleetString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func timeMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

var errFleetKey = errors.New("not a fleet record")

// parseFleetKey reads a key appendFleetKey wrote.
func parseFleetKey(prefix string, key []byte) (r fleetRecord, err error) {
	head := len(prefix) + 2
	if len(key) < head+TimestampWidth+1 || !bytes.HasPrefix(key, []byte(prefix)) || key[len(prefix)] != fleetInfix ||
		key[len(prefix)+1] != historyKind || key[head+TimestampWidth] != '-' {
		return r, errFleetKey
	}
	minute, ok := parseStamp(key[head : head+TimestampWidth])
	if !ok || minute > uint64(maxMarkerMs) {
		return r, errFleetKey
	}
	b, err := base64.RawURLEncoding.DecodeString(string(key[head+TimestampWidth+1:]))
	if err != nil || len(b) == 0 || b[0] != fleetVersion {
		return r, errFleetKey
	}
	d := fleetDecoder{b: b[1:]}
	r.Start = time.UnixMilli(int64(minute))
	r.Replica = d.string()
	r.since = d.time()
	r.Passes, r.Errors, r.Cleared, r.Failed = d.int(), d.int(), d.int(), d.int()
	r.MaxLag = d.ms()
	r.LastAt = d.time()
	l := &r.Last
	l.Cleared, l.Failed, l.Retried, l.Parked, l.Held, l.Malformed, l.LiveAgain, l.Gone, l.Scanned =
		d.int(), d.int(), d.int(), d.int(), d.int(), d.int(), d.int(), d.int(), d.int()
	l.Duration, l.MaxLag = d.ms(), d.ms()
	r.next, r.wakePoll, r.released = d.time(), d.ms(), d.int() == 1
	r.LastErr = d.string()
	if d.bad {
		return fleetRecord{}, errFleetKey
	}
	return r, nil
}

// fleetDecoder reads the fields of a record; bad says one was cut short.
type fleetDecoder struct {
	b   []byte
	bad bool
}

func (d *fleetDecoder) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > 1<<62 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *fleetDecoder) int() int { return int(d.uint()) }

func (d *fleetDecoder) ms() time.Duration { return time.Duration(d.uint()) * time.Millisecond }

func (d *fleetDecoder) time() time.Time {
	if v := d.uint(); v != 0 {
		return time.UnixMilli(int64(v))
	}
	return time.Time{}
}

func (d *fleetDecoder) string() string {
	n := d.uint()
	if d.bad || n > uint64(len(d.b)) {
		d.bad = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// Fleet reads what the fleet's replicas share about the sweep (see Fleet):
// the Scan of the sweep's history keys, a few dozen, in one to four
// calls. It may run on any replica, while a pass does.
func (s *Sweep) Fleet(ctx context.Context) (Fleet, error) {
	f := Fleet{Replica: s.replica}
	if err := s.configured("Fleet"); err != nil {
		return f, err
	}
	if err := ctx.Err(); err != nil {
		return f, err
	}
	keys, err := s.readHistory(ctx)
	if err != nil {
		return f, err
	}
	var recs []fleetRecord
	for _, k := range keys {
		if r, err := parseFleetKey(s.prefix, k); err == nil {
			recs = append(recs, r)
		}
	}
	if len(recs) == 0 {
		return f, nil
	}
	// The holder is the one that took the lease last.
	top := recs[0]
	for _, r := range recs[1:] {
		if r.since.After(top.since) || r.since.Equal(top.since) && r.LastAt.After(top.LastAt) {
			top = r
		}
	}
	f.Holder, f.Since, f.Released, f.NextPass, f.WakePoll = top.Replica, top.since, top.released, top.next, top.wakePoll
	f.Minutes = mergeMinutes(recs, s.clock.Now().Add(-fleetHour), top.Start)
	return f, nil
}

// readHistory reads the keys of s's history.
func (s *Sweep) readHistory(ctx context.Context) ([][]byte, error) {
	from, end := s.historyRange()
	var out [][]byte
	for range fleetReadPages {
		keys, err := s.scanKV(ctx, s.kv, from, end, fleetPage)
		if err != nil {
			return nil, err
		}
		out = append(out, keys...)
		if len(keys) < fleetPage {
			break
		}
		from = keyAfter(keys[len(keys)-1])
	}
	return out, nil
}

// mergeMinutes adds up the records of each minute since from (and of
// keep), oldest first. Of the records of one replica's minute under one
// lease, the one with the most passes counts: a write whose answer was
// lost may leave an older one beside it.
func mergeMinutes(recs []fleetRecord, from, keep time.Time) []FleetMinute {
	type who struct {
		minute, since int64
		replica       string
	}
	best := map[who]fleetRecord{}
	for _, r := range recs {
		if r.Start.Before(from) && !r.Start.Equal(keep) {
			continue
		}
		k := who{r.Start.UnixMilli(), r.since.UnixMilli(), r.Replica}
		if b, ok := best[k]; !ok || r.Passes > b.Passes {
			best[k] = r
		}
	}
	byMinute := map[int64]*FleetMinute{}
	for _, r := range best {
		m := byMinute[r.Start.UnixMilli()]
		if m == nil {
			m = &FleetMinute{Start: r.Start}
			byMinute[r.Start.UnixMilli()] = m
		}
		m.Passes += r.Passes
		m.Errors += r.Errors
		m.Cleared += r.Cleared
		m.Failed += r.Failed
		m.MaxLag = max(m.MaxLag, r.MaxLag)
		if r.LastAt.After(m.LastAt) || m.Replica == "" {
			m.Replica, m.LastAt, m.Last, m.LastErr = r.Replica, r.LastAt, r.Last, r.LastErr
		}
	}
	out := make([]FleetMinute, 0, len(byMinute))
	for _, m := range byMinute {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b FleetMinute) int { return a.Start.Compare(b.Start) })
	return out
}

// fleetBook is the record the lease holder keeps of its passes: the
// minute it adds to, and the history keys it knows, to delete them past
// the hour. The loop that holds the lease writes it; mu guards it against
// a LeasedPass of the same Sweep.
type fleetBook struct {
	mu      sync.Mutex
	cur     fleetRecord
	curKey  []byte // cur's key in the store; nil while not written
	dirty   bool   // cur holds passes not written
	wroteAt time.Time
	known   [][]byte // the history keys in the store, as last read or written
	readAt  time.Time
}

// fleetWrite is how a record reaches the store: through the pass's KV,
// fenced as its writes are, or after the lease, through the sweep's own.
type fleetWrite struct {
	kv    KV
	fence Fencer
}

func (w fleetWrite) ctx(ctx context.Context) context.Context {
	if w.fence == nil {
		return ctx
	}
	c, _ := withFence(ctx, w.fence)
	return c
}

// recordPass adds a pass of the lease holder to its record, and writes the
// record unless it wrote one within fleetWriteGap and the next pass comes
// sooner (next is zero when not known: a LeasedPass, written at once).
func (s *Sweep) recordPass(ctx context.Context, w fleetWrite, since time.Time, st Stats, passErr error, next time.Time) {
	if s.replica == "" {
		return
	}
	b := &s.book
	b.mu.Lock()
	defer b.mu.Unlock()
	now := s.clock.Now()
	minute := now.Truncate(time.Minute)
	if !b.cur.since.Equal(since) || !b.cur.Start.Equal(minute) {
		if b.dirty && b.cur.since.Equal(since) {
			s.writeRecord(ctx, w, now) // the minute that ended
		}
		if !b.cur.since.Equal(since) {
			b.known, b.readAt = nil, time.Time{} // a new lease: read what others left
		}
		b.cur = fleetRecord{FleetMinute: FleetMinute{Start: minute, Replica: s.replica}, since: since}
		b.curKey = nil
	}
	r := &b.cur
	r.Passes++
	r.Cleared += st.Cleared
	r.Failed += st.Failed
	r.MaxLag = max(r.MaxLag, st.MaxLag)
	r.LastAt, r.Last, r.LastErr = now, st, ""
	if passErr != nil {
		r.Errors++
		r.LastErr = cut(passErr.Error(), maxFleetErr)
	}
	r.next, r.wakePoll, r.released = next, 0, false
	if s.wakePoll > 0 {
		r.wakePoll = s.wakePoll
	}
	b.dirty = true
	soon := !next.IsZero() && next.Sub(now) < fleetWriteGap
	if passErr == nil && soon && b.curKey != nil && now.Sub(b.wroteAt) < fleetWriteGap {
		return
	}
	s.writeRecord(ctx, w, now)
}

// recordRelease writes that the holder gave the lease up (or lost it),
// with the passes not written yet, through the sweep's own KV.
func (s *Sweep) recordRelease(ctx context.Context) {
	if s.replica == "" {
		return
	}
	b := &s.book
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur.since.IsZero() || b.cur.released {
		return
	}
	b.cur.released, b.cur.next = true, time.Time{}
	b.dirty = true
	s.writeRecord(ctx, fleetWrite{kv: s.kv}, s.clock.Now())
}

// writeRecord writes b.cur, replacing its last key, and deletes the
// history keys past the hour. A store that fails is logged: the record is
// written again after the next pass.
func (s *Sweep) writeRecord(ctx context.Context, w fleetWrite, now time.Time) {
	b := &s.book
	key := appendFleetKey(nil, s.prefix, &b.cur)
	if bytes.Equal(key, b.curKey) {
		b.dirty = false
		return
	}
	if b.readAt.IsZero() || now.Sub(b.readAt) >= fleetReread {
		keys, err := s.readHistory(ctx)
		if err != nil {
			s.log.Warn("retention: read the fleet's record", "error", err)
			return
		}
		b.known, b.readAt = keys, now
	}
	cctx, cancel := withTimeout(w.ctx(ctx), s.storeTimeout)
	defer cancel()
	var err error
	if mv, ok := w.kv.(Mover); ok && b.curKey != nil {
		err = mv.Move(cctx, [][]byte{b.curKey}, [][]byte{key})
	} else if p, ok := w.kv.(Putter); ok {
		err = p.Put(cctx, key, nil)
	} else {
		return
	}
	if err != nil {
		if !errors.Is(err, ErrLeaseLost) {
			s.log.Warn("retention: write the fleet's record", "error", err)
		}
		b.curKey = nil // write it anew: the reader keeps the one with the most passes
		return
	}
	b.known = slices.DeleteFunc(b.known, func(k []byte) bool { return bytes.Equal(k, b.curKey) })
	b.known = append(b.known, key)
	b.curKey, b.dirty, b.wroteAt = key, false, now
	var old [][]byte
	b.known = slices.DeleteFunc(b.known, func(k []byte) bool {
		r, err := parseFleetKey(s.prefix, k)
		if err != nil || now.Sub(r.Start) <= fleetHour+time.Minute {
			return false // not a record (never deleted), or one of the hour
		}
		old = append(old, k)
		return true
	})
	if len(old) > 0 {
		if err := w.kv.Delete(cctx, old...); err != nil && !errors.Is(err, ErrLeaseLost) {
			s.log.Warn("retention: delete the fleet's records past the hour", "error", err)
		}
	}
}

// cut returns s cut to n bytes, with an ellipsis when cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// String returns the minute as "15:04 web-1: 2 passes, cleared 10, failed 0".
func (m FleetMinute) String() string {
	return m.Start.UTC().Format("15:04") + " " + m.Replica + ": " + strconv.Itoa(m.Passes) + " passes, cleared " +
		strconv.Itoa(m.Cleared) + ", failed " + strconv.Itoa(m.Failed)
}
