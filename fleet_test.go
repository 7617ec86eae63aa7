package retention

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fleetOf runs replicas of one sweep over kv under one lease, the first
// started first (so that it holds the lease), each with its Replica name.
type fleetOf struct {
	locker  *fakeLocker
	sweeps  []*Sweep
	cancels []context.CancelFunc
	wg      sync.WaitGroup
}

func startFleet(t *testing.T, kv KV, cfg Config, names ...string) *fleetOf {
	t.Helper()
	f := &fleetOf{locker: &fakeLocker{}}
	cfg.Lease = f.locker
	if cfg.Prefix == "" {
		cfg.Prefix = "runs/"
	}
	if cfg.Retention == 0 {
		cfg.Retention = time.Hour
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Clear == nil {
		cfg.Clear = func(context.Context, string) error { return nil }
	}
	for _, name := range names {
		c := cfg
		c.Replica = name
		s, err := New(kv, c)
		require.NoError(t, err)
		f.sweeps = append(f.sweeps, s)
		ctx, cancel := context.WithCancel(t.Context())
		f.cancels = append(f.cancels, cancel)
		f.wg.Go(func() { _ = s.Run(ctx) })
		synctest.Wait()
	}
	return f
}

func (f *fleetOf) stop(i int) {
	f.cancels[i]()
	synctest.Wait()
}

func (f *fleetOf) stopAll() {
	for _, c := range f.cancels {
		c()
	}
	f.wg.Wait()
}

func fleetOn(t *testing.T, s *Sweep) Fleet {
	t.Helper()
	fl, err := s.Fleet(t.Context())
	require.NoError(t, err)
	return fl
}

// TestFleetIsTheSameOnEveryReplica: the replica that does not sweep reads
// the same holder, lease start and passes as the one that does, from the
// store.
func TestFleetIsTheSameOnEveryReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		start := time.Now()
		for i := range 30 {
			mark(t, kv, "runs/", fmt.Sprintf("a%02d", i), start.Add(-2*time.Hour))
		}
		f := startFleet(t, kv, Config{}, "web-a", "web-b")
		defer f.stopAll()
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		a, b := fleetOn(t, f.sweeps[0]), fleetOn(t, f.sweeps[1])
		assert.Equal(t, "web-a", a.Replica)
		assert.Equal(t, "web-b", b.Replica)
		b.Replica = a.Replica
		assert.Equal(t, a, b, "both replicas read one record")
		assert.Equal(t, "web-a", a.Holder)
		assert.False(t, a.Released)
		assert.Equal(t, start.UnixMilli(), a.Since.UnixMilli())
		assert.Equal(t, DefaultWakePoll, a.WakePoll)
		require.Len(t, a.Minutes, 4, "a pass a minute: %v", a.Minutes)
		assert.Equal(t, 30, a.Minutes[0].Cleared)
		assert.Equal(t, time.Hour, a.Minutes[0].MaxLag)
		last, ok := a.LastPass()
		require.True(t, ok)
		assert.Equal(t, "web-a", last.Replica)
		assert.Equal(t, start.Add(3*time.Minute).UnixMilli(), last.LastAt.UnixMilli())
		assert.Equal(t, start.Add(4*time.Minute).UnixMilli(), a.NextPass.UnixMilli())
	})
}

// TestFleetNamesTheNewHolderAfterATakeover: when the holder stops, the
// record says it released the lease; once another replica takes it (within
// its WakePoll: it reads the free key), that one is the holder, and the
// hour's minutes hold the passes of both.
func TestFleetNamesTheNewHolderAfterATakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		f := startFleet(t, kv, Config{}, "web-a", "web-b")
		defer f.stopAll()
		time.Sleep(90*time.Second + 500*time.Millisecond) // between two of web-b's reads of the free key
		f.stop(0)
		fl := fleetOn(t, f.sweeps[1])
		assert.Equal(t, "web-a", fl.Holder)
		assert.True(t, fl.Released, "web-a released the lease as it stopped")
		time.Sleep(DefaultWakePoll)
		synctest.Wait()
		fl = fleetOn(t, f.sweeps[1])
		assert.Equal(t, "web-b", fl.Holder)
		assert.False(t, fl.Released)
		var by []string
		for _, m := range fl.Minutes {
			by = append(by, m.Replica)
		}
		assert.Contains(t, by, "web-a")
		assert.Contains(t, by, "web-b")
	})
}

// TestFleetRecordsFailedPasses: a pass that fails is written at once, with
// its error.
func TestFleetRecordsFailedPasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := newFakeKV(nil)
		var fail atomic.Bool
		kv.setHooks(func(ctx context.Context, _ int64) error {
			if fail.Load() {
				return errors.New("store down")
			}
			return nil
		}, nil, nil)
		f := startFleet(t, kv, Config{}, "web-a")
		defer f.stopAll()
		fail.Store(true)
		mark(t, kv.MemKV, "runs/", "x", time.Now().Add(-2*time.Hour))
		require.NoError(t, f.sweeps[0].Wake(t.Context()))
		synctest.Wait()
		fail.Store(false)
		fl := fleetOn(t, f.sweeps[0])
		last, ok := fl.LastPass()
		require.True(t, ok)
		assert.Equal(t, 1, last.Errors)
		assert.Contains(t, last.LastErr, "store down")
	})
}

// TestFleetKeysAreNoMarkers: the record and the wake key lie under the
// prefix, outside the ranges a sweep reads: no pass counts them, neither
// this sweep's nor that of a prefix that continues it with '#'.
func TestFleetKeysAreNoMarkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		f := startFleet(t, kv, Config{}, "web-a", "web-b")
		defer f.stopAll()
		require.NoError(t, f.sweeps[1].Wake(t.Context())) // a wake key, read within a second
		mark(t, kv, "runs/", "x", time.Now().Add(-2*time.Hour))
		time.Sleep(time.Minute)
		synctest.Wait()
		require.NotEmpty(t, keysUnder(t, kv, "runs/#h"), "the record is in the store")
		for _, prefix := range []string{"runs/", "runs/#"} {
			s, err := New(kv, Config{Prefix: prefix, Retention: time.Millisecond, Clear: func(context.Context, string) error { return errBoom }})
			require.NoError(t, err)
			st, err := s.Pass(t.Context())
			require.NoError(t, err)
			assert.Zero(t, st.Foreign+st.Malformed+st.Failed, "%s: %+v", prefix, st)
			b, err := s.Backlog(t.Context(), 100)
			require.NoError(t, err)
			assert.Zero(t, b, prefix)
		}
	})
}

// TestFleetKeepsAnHour: over two hours of passes the record holds the last
// hour's minutes, and the store no more keys than that.
func TestFleetKeepsAnHour(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		f := startFleet(t, kv, Config{}, "web-a")
		defer f.stopAll()
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		fl := fleetOn(t, f.sweeps[0])
		assert.Len(t, fl.Minutes, 61)
		assert.LessOrEqual(t, len(keysUnder(t, kv, "runs/#h")), 62)
	})
}

// TestFleetRecordCost: an idle pass of the holder writes its record once,
// a Put in a new minute, and reads nothing more: two Scans still. Under
// passes every 50ms the record is written about once a second.
func TestFleetRecordCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := newFakeKV(nil)
		f := startFleet(t, kv, Config{WakePoll: -1}, "web-a")
		defer f.stopAll()
		scans, puts, moves := kv.scans.Load(), kv.puts.Load(), kv.moves.Load()
		time.Sleep(10*time.Minute + time.Millisecond)
		synctest.Wait()
		assert.EqualValues(t, 20, kv.scans.Load()-scans, "ten idle passes, two Scans each")
		assert.EqualValues(t, 10, kv.puts.Load()-puts+kv.moves.Load()-moves, "one write per idle pass")
	})
	synctest.Test(t, func(t *testing.T) {
		kv := newFakeKV(nil)
		var n atomic.Int64
		f := startFleet(t, kv, Config{WakePoll: -1, Retention: time.Millisecond, Clear: func(context.Context, string) error {
			n.Add(1)
			return nil
		}}, "web-a")
		defer f.stopAll()
		start := time.Now()
		for i := range 200 { // a marker due every 50ms for 10s: a pass each
			mark(t, kv.MemKV, "runs/", fmt.Sprintf("m%03d", i), start.Add(time.Duration(i+1)*50*time.Millisecond))
		}
		require.NoError(t, f.sweeps[0].Wake(t.Context())) // learn the first due time
		synctest.Wait()
		puts, moves := kv.puts.Load(), kv.moves.Load()
		time.Sleep(10*time.Second + 100*time.Millisecond)
		synctest.Wait()
		writes := kv.puts.Load() - puts + kv.moves.Load() - moves
		t.Logf("%d cleared in 10s, %d writes of the record", n.Load(), writes)
		assert.EqualValues(t, 200, n.Load())
		assert.LessOrEqual(t, writes, int64(12))
	})
}

// FuzzParseFleetKey: a record reads back as written, and no key makes the
// parser panic.
func FuzzParseFleetKey(f *testing.F) {
	r := fleetRecord{FleetMinute: FleetMinute{Start: time.UnixMilli(1_700_000_040_000), Passes: 3, Errors: 1, Cleared: 10,
		Failed: 2, MaxLag: time.Second, Replica: "web-a", LastAt: time.UnixMilli(1_700_000_050_000), LastErr: "boom",
		Last: Stats{Cleared: 4, Scanned: 9, Duration: time.Millisecond}}, since: time.UnixMilli(1_600_000_000_000),
		next: time.UnixMilli(1_700_000_060_000), wakePoll: time.Second}
	key := appendFleetKey(nil, "runs/", &r)
	f.Add(key)
	f.Add([]byte("runs/#h00000000000000000000-"))
	f.Fuzz(func(t *testing.T, key []byte) {
		got, err := parseFleetKey("runs/", key)
		if err != nil {
			return
		}
		again, err := parseFleetKey("runs/", appendFleetKey(nil, "runs/", &got))
		require.NoError(t, err)
		require.Equal(t, got.Replica, again.Replica)
		require.Equal(t, got.Passes, again.Passes)
	})
	got, err := parseFleetKey("runs/", key)
	require.NoError(f, err)
	require.Equal(f, r, got)
}

// TestNewChecksReplicaAndWakePoll: New refuses a Replica too long or not
// printable, a Replica over a KV that cannot Put and Move, and a WakePoll
// below 1ms, naming the field.
func TestNewChecksReplicaAndWakePoll(t *testing.T) {
	clear := func(context.Context, string) error { return nil }
	for _, tt := range []struct {
		name string
		kv   KV
		cfg  Config
		want string
	}{
		{"long replica", NewMemKV(), Config{Replica: string(make([]byte, MaxReplicaLen+1))}, "Config.Replica"},
		{"control byte", NewMemKV(), Config{Replica: "web\n1"}, "Config.Replica"},
		{"read-only store", readOnlyKV{NewMemKV()}, Config{Replica: "web-1"}, "Putter and a Mover"},
		{"tiny wake poll", NewMemKV(), Config{WakePoll: time.Microsecond}, "Config.WakePoll"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Prefix, tt.cfg.Retention, tt.cfg.Clear = "runs/", time.Hour, clear
			_, err := New(tt.kv, tt.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	_, err := New(NewMemKV(), Config{Prefix: "runs/", Retention: time.Hour, Clear: clear, Replica: "web-7d9f-x2k", WakePoll: -1})
	assert.NoError(t, err)
}

// TestFleetOfAGroup: the sweeps of a Group under its lease each keep their
// record, and a Wake of either, from another replica, wakes the group's Run.
func TestFleetOfAGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		locker := &fakeLocker{}
		var cleared atomic.Int64
		mk := func(prefix, replica string) *Sweep {
			s, err := New(kv, Config{Prefix: prefix, Retention: time.Hour, Interval: time.Minute, Replica: replica,
				Clear: func(context.Context, string) error { cleared.Add(1); return nil }})
			require.NoError(t, err)
			return s
		}
		runs, batches := mk("runs/", "web-a"), mk("batches/", "web-a")
		g, err := NewGroup(GroupConfig{Lease: locker}, runs, batches)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		synctest.Wait()
		for _, s := range []*Sweep{runs, batches} {
			assert.Equal(t, "web-a", fleetOn(t, s).Holder, s.Prefix())
		}
		other := mk("batches/", "web-b") // the same sweep on a replica that does not sweep
		mark(t, kv, "batches/", "b1", time.Now().Add(-2*time.Hour))
		start := time.Now()
		require.NoError(t, other.Wake(t.Context()))
		for cleared.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		assert.LessOrEqual(t, time.Since(start), DefaultWakePoll+20*time.Millisecond)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.True(t, fleetOn(t, other).Released)
	})
}
