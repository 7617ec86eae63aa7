package retention

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewValidation(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	clear := func(context.Context, string) error { return nil }
	valid := Config{Prefix: "runs/", Retention: time.Hour, Clear: clear}
	tests := []struct {
		name    string
		kv      KV
		modify  func(*Config)
		wantMsg string // empty: New must succeed
	}{
		{"valid", kv, func(*Config) {}, ""},
		{"all optional fields set", kv, func(c *Config) {
			c.PageSize, c.Concurrency, c.Interval = MaxPageSize, MaxConcurrency, time.Second
			c.Jitter, c.StartJitter, c.Lease = 1, time.Minute, &fakeLocker{}
		}, ""},
		{"retention of 1ms", kv, func(c *Config) { c.Retention = time.Millisecond }, ""},
		{"nil kv", nil, func(*Config) {}, "kv must not be nil"},
		{"empty prefix", kv, func(c *Config) { c.Prefix = "" }, "Config.Prefix must not be empty"},
		{"nil clear", kv, func(c *Config) { c.Clear = nil }, "Config.Clear or Config.ClearBatch must be set (or kv must be a ClearDeleter)"},
		{"batch clear instead", kv, func(c *Config) {
			c.Clear, c.ClearBatch, c.BatchSize = nil, func(context.Context, []string) error { return nil }, MaxPageSize
		}, ""},
		{"both clears", kv, func(c *Config) { c.ClearBatch = func(context.Context, []string) error { return nil } }, "set one of Config.Clear and Config.ClearBatch, not both"},
		{"batch size without batch clear", kv, func(c *Config) { c.BatchSize = 10 }, "Config.BatchSize is set but Config.Clear clears one id at a time"},
		{"batch size above page size", kv, func(c *Config) {
			c.Clear, c.ClearBatch, c.BatchSize, c.PageSize = nil, func(context.Context, []string) error { return nil }, 500, 256
		}, "Config.BatchSize (500) is larger than Config.PageSize (256): a batch is cut from one page"},
		{"clear deleter with neither clear", atomicOver(kv), func(c *Config) { c.Clear = nil }, ""},
		{"clear deleter and a clear", atomicOver(kv), func(c *Config) {}, "kv is a ClearDeleter"},
		{"negative batch size", kv, func(c *Config) {
			c.Clear, c.ClearBatch, c.BatchSize = nil, func(context.Context, []string) error { return nil }, -1
		}, "Config.BatchSize must be 0 (default 128) or 1 to 65536, got -1"},
		{"zero retention", kv, func(c *Config) { c.Retention = 0 }, "Config.Retention must be at least 1ms, got 0s"},
		{"sub-ms retention", kv, func(c *Config) { c.Retention = 999 * time.Microsecond }, "Config.Retention must be at least 1ms, got 999µs"},
		{"negative retention", kv, func(c *Config) { c.Retention = -time.Hour }, "Config.Retention must be at least 1ms, got -1h0m0s"},
		{"negative page size", kv, func(c *Config) { c.PageSize = -1 }, "Config.PageSize must be 0 (default 256) or 1 to 65536, got -1"},
		{"huge page size", kv, func(c *Config) { c.PageSize = MaxPageSize + 1 }, "Config.PageSize"},
		{"negative concurrency", kv, func(c *Config) { c.Concurrency = -2 }, "Config.Concurrency must be 0 (default 1) or 1 to 1024, got -2"},
		{"huge concurrency", kv, func(c *Config) { c.Concurrency = MaxConcurrency + 1 }, "Config.Concurrency"},
		{"negative interval", kv, func(c *Config) { c.Interval = -time.Second }, "Config.Interval must not be negative, got -1s"},
		{"negative jitter", kv, func(c *Config) { c.Jitter = -0.1 }, "Config.Jitter must be between 0 and 1, got -0.1"},
		{"jitter above 1", kv, func(c *Config) { c.Jitter = 1.01 }, "Config.Jitter must be between 0 and 1, got 1.01"},
		{"NaN jitter", kv, func(c *Config) { c.Jitter = math.NaN() }, "Config.Jitter must be between 0 and 1, got NaN"},
		{"negative start jitter", kv, func(c *Config) { c.StartJitter = -time.Second }, "Config.StartJitter must not be negative, got -1s"},
		{"prefix ending in a letter", kv, func(c *Config) { c.Prefix = "job" }, `Config.Prefix "job" ends in 'b'`},
		{"prefix ending in a digit", kv, func(c *Config) { c.Prefix = "runs1" }, "end it with a separator"},
		{"prefix ending in an underscore", kv, func(c *Config) { c.Prefix = "runs_" }, "ends in '_'"},
		{"prefix ending in a dash", kv, func(c *Config) { c.Prefix = "runs-" }, "ends in '-'"},
		{"prefix ending in a colon", kv, func(c *Config) { c.Prefix = "runs:" }, ""},
		{"prefix ending in a dot", kv, func(c *Config) { c.Prefix = "runs." }, ""},
		{"prefix nested where a marker's time stands", kv, func(c *Config) { c.Prefix = "t/00000000000000012345/" },
			`Config.Prefix "t/00000000000000012345/" holds "00000000000000012345/", 20 digits and '/' where a marker's time stands: a sweep of prefix "t/"`},
		{"prefix nested where a retry key's time stands", kv, func(c *Config) { c.Prefix = "t/r00000000000000012345/x/" },
			`a sweep of prefix "t/" would read`},
		{"prefix nested where a parked key's time stands", kv, func(c *Config) { c.Prefix = "t:p00000000000000012345/" },
			`a sweep of prefix "t:" would read`},
		{"prefix with 20 digits and another separator", kv, func(c *Config) { c.Prefix = "t/00000000000000012345:" }, ""},
		{"prefix with 19 digits and '/'", kv, func(c *Config) { c.Prefix = "t/0000000000000012345/" }, ""},
		{"prefix with 21 digits and '/'", kv, func(c *Config) { c.Prefix = "t/000000000000000012345/" }, ""},
		{"prefix with 20 digits after an id byte", kv, func(c *Config) { c.Prefix = "tenant00000000000000012345/" }, ""},
		{"timeouts and retries set", kv, func(c *Config) {
			c.ClearTimeout, c.StoreTimeout, c.RetryDelay, c.MaxRetryDelay = time.Second, -1, time.Millisecond, time.Hour
		}, ""},
		{"sub-ms retry delay", kv, func(c *Config) { c.RetryDelay = time.Microsecond }, "Config.RetryDelay must be 0 (default 1s) or at least 1ms, got 1µs"},
		{"negative retry delay", kv, func(c *Config) { c.RetryDelay = -time.Second }, "Config.RetryDelay must be 0"},
		{"negative max retry delay", kv, func(c *Config) { c.MaxRetryDelay = -time.Second }, "Config.MaxRetryDelay must be 0"},
		{"retry delay above max", kv, func(c *Config) { c.RetryDelay, c.MaxRetryDelay = time.Hour, time.Minute }, "Config.RetryDelay (1h0m0s) must not exceed Config.MaxRetryDelay (1m0s)"},
		{"retry delay above default max", kv, func(c *Config) { c.RetryDelay = time.Hour }, "set Config.MaxRetryDelay too"},
		{"max retry delay below default first", kv, func(c *Config) { c.MaxRetryDelay = 10 * time.Millisecond }, "set Config.RetryDelay too"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid
			tt.modify(&cfg)
			s, err := New(tt.kv, cfg)
			if tt.wantMsg == "" {
				require.NoError(t, err)
				require.NotNil(t, s)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.True(t, strings.HasPrefix(err.Error(), "retention: "), "New() error = %q, want the package name first", err)
			assert.Nil(t, s)
		})
	}
}

func TestNewDefaults(t *testing.T) {
	t.Parallel()
	clear := func(context.Context, string) error { return nil }
	tests := []struct {
		retention, interval, wantInterval time.Duration
	}{
		{time.Hour, 0, time.Minute},
		{10 * time.Second, 0, 10 * time.Second},
		{time.Hour, 5 * time.Second, 5 * time.Second},
		{time.Second, time.Hour, time.Hour},
	}
	for _, tt := range tests {
		s, err := New(NewMemKV(), Config{Prefix: "p/", Retention: tt.retention, Interval: tt.interval, Clear: clear})
		require.NoError(t, err)
		assert.Equal(t, tt.wantInterval, s.interval, "interval for Retention %v, Interval %v", tt.retention, tt.interval)
		assert.Equal(t, DefaultPageSize, s.pageSize)
		assert.Equal(t, 1, s.concurrency)
		assert.Equal(t, SystemClock, s.clock)
	}
}

func TestPassStrictCutoff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		age       time.Duration // how old the marker is when the pass starts
		wantClear bool
	}{
		{"exactly retention old is kept", time.Hour, false},
		{"younger is kept", time.Hour - time.Millisecond, false},
		{"1ns past retention is cleared", time.Hour + time.Nanosecond, true},
		{"1ms past retention is cleared", time.Hour + time.Millisecond, true},
		{"a day old is cleared", 24 * time.Hour, true},
		{"from the future is kept", -time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, kv, Config{Retention: time.Hour, Clear: c.clear})
			key := mark(t, kv, "runs/", "r1", t0)
			clock.Set(t0.Add(tt.age))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			if tt.wantClear {
				assert.Equal(t, 1, st.Cleared, "Pass().Cleared = %d, want 1", st.Cleared)
				assert.False(t, has(t, kv, key), "marker should be deleted")
				assert.Equal(t, 1, c.count("r1"))
				assert.Equal(t, tt.age-time.Hour, st.MaxLag.Truncate(time.Nanosecond), "Pass().MaxLag")
				assert.True(t, st.NextDue.IsZero(), "Pass().NextDue = %v, want zero", st.NextDue)
			} else {
				assert.Zero(t, st.Cleared, "Pass().Cleared = %d, want 0", st.Cleared)
				assert.True(t, has(t, kv, key), "marker should stay")
				assert.Zero(t, c.count("r1"))
				assert.Equal(t, t0.Add(time.Hour), st.NextDue, "Pass().NextDue")
			}
		})
	}
}

func TestPassAcrossPages(t *testing.T) {
	t.Parallel()
	// Scans: the pages, the page after the last full one (or the peek),
	// and the retry range's first key.
	tests := []struct {
		pageSize, expired, unexpired int
		wantScans, wantDeletes       int
	}{
		{pageSize: 2, expired: 10, unexpired: 3, wantScans: 10/2 + 1 + 1 + 1, wantDeletes: 5},
		{pageSize: 2, expired: 11, unexpired: 0, wantScans: 11/2 + 1 + 1 + 1, wantDeletes: 6},
		{pageSize: 256, expired: 1000, unexpired: 5, wantScans: 1000/256 + 1 + 1 + 1, wantDeletes: 4},
		{pageSize: 256, expired: 512, unexpired: 1, wantScans: 512/256 + 1 + 1 + 1, wantDeletes: 2},
		{pageSize: 1, expired: 3, unexpired: 1, wantScans: 3 + 1 + 1 + 1, wantDeletes: 3},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("page%d_expired%d", tt.pageSize, tt.expired), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			kv := &fakeKV{canPut: true, MemKV: mem}
			c := newClears()
			s, _ := newSweep(t, kv.store(), Config{PageSize: tt.pageSize, Clear: c.clear})
			for i := range tt.expired {
				mark(t, mem, "runs/", fmt.Sprintf("old%04d", i), t0.Add(-2*time.Hour+time.Duration(i)*time.Millisecond))
			}
			for i := range tt.unexpired {
				mark(t, mem, "runs/", fmt.Sprintf("new%04d", i), t0.Add(-time.Duration(i)*time.Minute))
			}
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.expired, st.Cleared, "Pass().Cleared")
			assert.Equal(t, tt.expired, c.total(), "clear calls")
			assert.Equal(t, tt.unexpired, mem.Len(), "markers left")
			assert.Equal(t, tt.wantScans, st.ScanCalls, "Pass().ScanCalls")
			assert.Equal(t, int64(tt.wantScans), kv.scans.Load(), "Scan calls seen by the KV")
			assert.Equal(t, tt.wantDeletes, st.DeleteCalls, "Pass().DeleteCalls")
			assert.Equal(t, int64(tt.wantDeletes), kv.deletes.Load(), "Delete calls seen by the KV")
			// Oldest first.
			for i := 1; i < len(c.order); i++ {
				assert.Less(t, c.order[i-1], c.order[i], "clears out of order")
			}
			if tt.unexpired > 0 {
				assert.Equal(t, t0.Add(-time.Duration(tt.unexpired-1)*time.Minute).Add(time.Hour), st.NextDue)
			}
		})
	}
}

func TestPassClearFailure(t *testing.T) {
	t.Parallel()
	for _, pageSize := range []int{1, 2, 256} {
		t.Run(fmt.Sprint("page", pageSize), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, kv, Config{PageSize: pageSize, Clear: c.clear})
			keys := map[string][]byte{}
			for i, id := range []string{"a", "b", "c", "d", "e"} {
				keys[id] = mark(t, kv, "runs/", id, t0.Add(time.Duration(i)*time.Second))
			}
			c.set("b", errBoom)
			clock.Set(t0.Add(2 * time.Hour))

			st, err := s.Pass(context.Background())
			require.NoError(t, err, "a failing clear is not a pass failure")
			assert.Equal(t, 4, st.Cleared)
			assert.Equal(t, 1, st.Failed)
			assert.Equal(t, 1, st.Retried)
			assert.False(t, has(t, kv, keys["b"]), "the failed marker is rescheduled")
			assert.Equal(t, map[string]int{"b": 1}, markerIDs(t, kv, "runs/"), "the failed marker stays")
			for _, id := range []string{"a", "c", "d", "e"} {
				assert.Equal(t, 1, c.count(id), "clears of %s", id)
			}
			due := st.NextDue
			assert.False(t, due.Before(clock.Now().Add(time.Second)), "retried after RetryDelay, not before: due %v", due)
			assert.False(t, due.After(clock.Now().Add(1200*time.Millisecond)), "jitter adds at most a fifth: due %v", due)

			// Until its delay is over, passes do not even read it.
			clock.Set(due)
			st, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Zero(t, st.Cleared+st.Failed)
			assert.Equal(t, 1, c.count("b"))

			// Once it is over, the next pass retries the failed one, and only it.
			c.set("b", nil)
			clock.Set(due.Add(time.Millisecond)) // like any marker's: the first pass after it
			st, err = s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, st.Cleared)
			assert.Zero(t, st.Failed)
			assert.Zero(t, kv.Len())
			assert.Equal(t, 2, c.count("b"))
			assert.Equal(t, 1, c.count("a"))
		})
	}
}

func TestPassDeleteFailure(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := &fakeKV{canPut: true, MemKV: mem, onDelete: func(_ context.Context, call int64) error {
		if call == 1 {
			return errBoom
		}
		return nil
	}}
	c := newClears()
	s, clock := newSweep(t, kv.store(), Config{Clear: c.clear})
	mark(t, mem, "runs/", "a", t0)
	mark(t, mem, "runs/", "b", t0)
	clock.Set(t0.Add(2 * time.Hour))

	st, err := s.Pass(context.Background())
	require.ErrorIs(t, err, errBoom)
	assert.Contains(t, err.Error(), "retention: delete 2 markers")
	assert.Equal(t, 2, st.Cleared)
	assert.Equal(t, 2, mem.Len(), "markers stay when their delete fails")

	// Nothing is lost: the next pass clears both again and deletes them.
	st, err = s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, st.Cleared)
	assert.Zero(t, mem.Len())
	assert.Equal(t, 2, c.count("a"))
	assert.Equal(t, 2, c.count("b"))
}

func TestPassScanFailure(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := &fakeKV{canPut: true, MemKV: mem, onScan: failWith(errBoom)}
	c := newClears()
	s, clock := newSweep(t, kv.store(), Config{Clear: c.clear})
	mark(t, mem, "runs/", "a", t0)
	clock.Set(t0.Add(2 * time.Hour))
	_, err := s.Pass(context.Background())
	require.ErrorIs(t, err, errBoom)
	assert.Contains(t, err.Error(), "retention: scan markers")
	assert.Zero(t, c.total())
	assert.Equal(t, 1, mem.Len())
}

func TestPassMalformedAndNeighbours(t *testing.T) {
	t.Parallel()
	type want int
	const (
		deleted     want = iota // a malformed marker: deleted without Clear
		foreignKept             // under the prefix but not marker-shaped: counted, kept
		outsideKept             // outside the marker space: not even read
	)
	tests := []struct {
		name string
		key  string
		want want
	}{
		{"empty id", "runs/00000000000000000001/", foreignKept},
		{"invalid id characters", "runs/00000000000000000001/a b", deleted},
		{"id with slash", "runs/00000000000000000001/a/b", deleted},
		{"unexpired marker with invalid id", "runs/00000253402300799999/a$", deleted},
		{"timestamp overflowing int64", "runs/99999999999999999999/a", deleted},
		{"timestamp after the year 9999", "runs/00000253402300800000/a", deleted},
		{"letter in timestamp", "runs/0000000000000000000x/a", foreignKept},
		{"short timestamp inside the expired range", "runs/0000/a", foreignKept},
		{"short timestamp past the expired range", "runs/123/a", foreignKept},
		{"data key of a short id", "runs/123", foreignKept},
		{"data key under a numeric id", "runs/0042/state", foreignKept},
		{"missing slash", "runs/00000000000000000001a", foreignKept},
		{"21 digits", "runs/000000000000000000012/a", foreignKept},
		{"nothing after timestamp", "runs/00000000000000000001", foreignKept},
		{"neighbouring prefix runs2/", "runs2/00000000000000000001/a", outsideKept},
		{"shorter prefix run", "run", outsideKept},
		{"sibling run/", "run/00000000000000000001/a", outsideKept},
		{"the bare prefix", "runs/", outsideKept},
		{"non-digit after prefix", "runs/x0000000000000000001/a", outsideKept},
		{"byte below digits after prefix", "runs/-0000000000000000001/a", outsideKept},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			c := newClears()
			var logs bytes.Buffer
			s, clock := newSweep(t, kv, Config{Clear: c.clear, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, kv.Put(context.Background(), []byte(tt.key), nil))
			for range 3 {
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				assert.Zero(t, c.total(), "clear must not be called for %q", tt.key)
				assert.Zero(t, st.Cleared)
				assert.True(t, st.NextDue.IsZero())
				switch tt.want {
				case deleted:
					assert.Equal(t, 1, st.Malformed, "Pass().Malformed")
					assert.Zero(t, kv.Len(), "malformed marker should be deleted")
					assert.Contains(t, logs.String(), "level=WARN")
					assert.Contains(t, logs.String(), "malformed marker")
					return // gone: later passes have nothing to say
				case foreignKept:
					assert.Zero(t, st.Malformed)
					assert.Equal(t, 1, st.Foreign)
					assert.Equal(t, 1, kv.Len(), "a foreign key must stay")
					assert.Contains(t, logs.String(), "not markers; left alone")
					assert.Contains(t, logs.String(), strconv.Quote(strconv.Quote(tt.key)), "the log names the key")
				case outsideKept:
					assert.Zero(t, st.Malformed)
					assert.Zero(t, st.Foreign)
					assert.Equal(t, 1, kv.Len(), "key outside the marker space must stay")
					assert.Empty(t, logs.String())
				}
				clock.Advance(1000 * time.Hour) // whatever its time, it stays
			}
		})
	}
}

func TestPassMalformedPastCutoffThenValid(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	c := newClears()
	s, _ := newSweep(t, kv, Config{Clear: c.clear})
	future := t0.Add(time.Minute)
	bad, err := MarkerKey("runs/", future, "x")
	require.NoError(t, err)
	bad = append(bad, '!') // same timestamp, an id with a refused byte
	require.NoError(t, kv.Put(context.Background(), bad, nil))
	good := mark(t, kv, "runs/", "y", future.Add(time.Millisecond))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Malformed)
	assert.True(t, has(t, kv, good))
	assert.Equal(t, future.Add(time.Millisecond+time.Hour), st.NextDue)
}

func TestPassCustomValidateID(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	c := newClears()
	dotted := func(id string) error {
		if strings.Trim(id, "abcdefghijklmnopqrstuvwxyz.") != "" {
			return fmt.Errorf("%q has a byte other than a-z and '.'", id)
		}
		return nil
	}
	s, clock := newSweep(t, kv, Config{Clear: c.clear, ValidateID: dotted})

	key, err := s.MarkerKey(t0, "a.b")
	require.NoError(t, err)
	require.NoError(t, kv.Put(context.Background(), key, nil))
	_, err = s.MarkerKey(t0, "")
	require.ErrorIs(t, err, ErrInvalidID, "an empty id is refused whatever the validator says")
	_, err = s.MarkerKey(t0, "A")
	require.ErrorIs(t, err, ErrInvalidID)
	require.NoError(t, kv.Put(context.Background(), []byte("runs/00000000000000000001/"), nil))
	require.NoError(t, kv.Put(context.Background(), []byte("runs/00000000000000000001/B"), nil))

	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, st.Malformed, "the marker of id B")
	assert.Equal(t, 1, st.Foreign, "a marker-like key with no id is not a marker")
	assert.Equal(t, 1, c.count("a.b"))
	assert.Equal(t, 1, kv.Len())
}

func TestPassClearPanics(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	var logs bytes.Buffer
	var calls atomic.Int32
	s, clock := newSweep(t, kv, Config{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Clear: func(_ context.Context, id string) error {
			calls.Add(1)
			if id == "p" || id == "r" {
				panic("clear exploded")
			}
			return nil
		},
	})
	panicky := mark(t, kv, "runs/", "p", t0)
	mark(t, kv, "runs/", "q", t0.Add(time.Second))
	mark(t, kv, "runs/", "r", t0.Add(2*time.Second))
	mark(t, kv, "runs/", "s", t0.Add(3*time.Second))
	clock.Set(t0.Add(2 * time.Hour))

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, st.Failed)
	assert.Equal(t, 2, st.Cleared, "markers after a panicking one are still cleared")
	assert.Equal(t, int32(4), calls.Load())
	assert.False(t, has(t, kv, panicky), "the marker was rescheduled")
	assert.Equal(t, map[string]int{"p": 1, "r": 1}, markerIDs(t, kv, "runs/"), "the failed markers stay, rescheduled")
	assert.Contains(t, logs.String(), "clear exploded")
	assert.Contains(t, logs.String(), "level=ERROR")
	assert.Contains(t, logs.String(), "sweep_test.go", "the log should carry the stack")
}

func TestCallClearPanicError(t *testing.T) {
	t.Parallel()
	s, _ := newSweep(t, NewMemKV(), Config{Clear: func(context.Context, string) error { panic(errBoom) }})
	c := &clearing{s: s, p: &passState{st: &Stats{}}, ctx: context.Background(), items: []item{{id: "x", out: pending}}}
	for c.clearRun(false) {
	}
	it := &c.items[0]
	assert.Equal(t, failed, it.out)
	require.ErrorIs(t, it.err, ErrClearPanicked)
	assert.Contains(t, it.err.Error(), "boom")
}

func TestPassLiveAgain(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, kv, Config{Clear: c.clear})
	mark(t, kv, "runs/", "resumed", t0)
	mark(t, kv, "runs/", "done", t0)
	c.set("resumed", fmt.Errorf("run was restarted: %w", ErrLiveAgain))
	clock.Set(t0.Add(2 * time.Hour))

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.LiveAgain)
	assert.Equal(t, 1, st.Cleared)
	assert.Zero(t, st.Failed)
	assert.Zero(t, kv.Len(), "a live-again marker is dropped")
}

func TestPassCancelledMidPass(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprint("concurrency", concurrency), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			kv := &fakeKV{canPut: true, MemKV: mem}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			succeeded := map[string]bool{}
			s, clock := newSweep(t, kv.store(), Config{PageSize: 4, Concurrency: concurrency, Clear: func(ctx context.Context, id string) error {
				if id == "m0006" {
					cancel()
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				mu.Lock()
				succeeded[id] = true
				mu.Unlock()
				return nil
			}})
			keys := map[string][]byte{}
			for i := range 20 {
				id := fmt.Sprintf("m%04d", i)
				keys[id] = mark(t, mem, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))

			_, err := s.Pass(ctx)
			require.ErrorIs(t, err, context.Canceled)
			for id, key := range keys {
				if !has(t, mem, key) {
					assert.True(t, succeeded[id], "marker %s deleted though its clear did not succeed", id)
				}
			}
			assert.True(t, has(t, mem, keys["m0006"]))
			assert.Equal(t, int64(1), kv.deletes.Load(), "only the first page is deleted")
			assert.Equal(t, 16, mem.Len())
		})
	}
}

func TestPassCancelledBefore(t *testing.T) {
	t.Parallel()
	kv := &fakeKV{canPut: true, MemKV: NewMemKV()}
	s, _ := newSweep(t, kv.store(), Config{Clear: newClears().clear})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Pass(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, kv.scans.Load())
}

func TestPassConcurrentClears(t *testing.T) {
	t.Parallel()
	const n, limit = 2000, 16
	kv := NewMemKV()
	var inFlight, peak atomic.Int32
	c := newClears()
	s, clock := newSweep(t, kv, Config{PageSize: 64, Concurrency: limit, Clear: func(ctx context.Context, id string) error {
		now := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			p := peak.Load()
			if now <= p || peak.CompareAndSwap(p, now) {
				break
			}
		}
		if strings.HasSuffix(id, "7") {
			return errBoom
		}
		return c.clear(ctx, id)
	}})
	for i := range n {
		mark(t, kv, "runs/", fmt.Sprintf("c%05d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	clock.Set(t0.Add(2 * time.Hour))
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, n/10, st.Failed)
	assert.Equal(t, n-n/10, st.Cleared)
	assert.Equal(t, n/10, kv.Len(), "exactly the failed markers stay")
	assert.LessOrEqual(t, peak.Load(), int32(limit), "clears in flight exceeded Concurrency")
	for i := range n {
		id := fmt.Sprintf("c%05d", i)
		if !strings.HasSuffix(id, "7") {
			assert.Equal(t, 1, c.count(id), "clears of %s", id)
		}
	}
}

func TestPassesDoNotOverlap(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, kv, Config{PageSize: 3, Clear: c.clear})
	for i := range 300 {
		mark(t, kv, "runs/", fmt.Sprintf("o%04d", i), t0)
	}
	clock.Set(t0.Add(2 * time.Hour))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, err := s.Pass(context.Background())
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.Equal(t, 300, c.total(), "each marker cleared once across concurrent passes")
	assert.Zero(t, kv.Len())
}

func TestPassBrokenEndBoundDoesNotClearEarly(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	kv := endIgnoringKV{mem}
	c := newClears()
	s, _ := newSweep(t, kv, Config{Clear: c.clear})
	mark(t, mem, "runs/", "old", t0.Add(-2*time.Hour))
	young := mark(t, mem, "runs/", "young", t0)
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, c.count("old"))
	assert.Zero(t, c.count("young"), "a marker past the cutoff must not be cleared")
	assert.True(t, has(t, mem, young))
}

// endIgnoringKV breaks the KV contract by scanning past end.
type endIgnoringKV struct{ *MemKV }

func (k endIgnoringKV) Scan(ctx context.Context, start, _ []byte, limit int) ([][]byte, error) {
	return k.MemKV.Scan(ctx, start, []byte{0xFF}, limit)
}

func TestPassCounting(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 200,000 markers")
	}
	mem := NewMemKV()
	kv := &fakeKV{canPut: true, MemKV: mem}
	c := newClears()
	s, clock := newSweep(t, kv.store(), Config{Clear: c.clear})
	const idle = 200_000
	for i := range idle {
		mark(t, mem, "runs/", fmt.Sprintf("u%07d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}

	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.LessOrEqual(t, kv.scans.Load(), int64(3), "idle pass over %d markers: Scan calls (the expired range, the next marker, the retry range)", idle)
	assert.LessOrEqual(t, kv.keys.Load(), int64(1), "idle pass over %d markers: keys read", idle)
	assert.Zero(t, kv.deletes.Load())
	assert.Equal(t, t0.Add(time.Hour), st.NextDue)

	// Expire exactly n of them and sweep with page size p.
	const n, p = 10_000, 128
	kv.reset()
	s2, _ := newSweep(t, kv, Config{Clear: c.clear, PageSize: p, Clock: clock})
	clock.Set(t0.Add(time.Hour + n*time.Millisecond))
	st, err = s2.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, n, st.Cleared)
	wantPages := (n + p - 1) / p
	assert.LessOrEqual(t, kv.scans.Load(), int64(n/p+3), "Scan calls for %d expired markers, page %d", n, p)
	assert.GreaterOrEqual(t, kv.scans.Load(), int64(wantPages+1))
	assert.Equal(t, int64(wantPages), kv.deletes.Load(), "Delete calls")
	assert.Equal(t, int64(n+1), kv.keys.Load(), "keys read: the expired ones and one more")
	assert.Equal(t, idle-n, mem.Len())
}

// exitObserver calls runtime.Goexit in the ObservePage of its page-th
// call (from 1), or panics with value when that is set.
type exitObserver struct {
	recorder
	page  int32
	value any
	calls atomic.Int32
}

func (o *exitObserver) ObservePage(prefix string, page Stats) {
	o.recorder.ObservePage(prefix, page)
	if o.calls.Add(1) == o.page {
		if o.value != nil {
			panic(o.value)
		}
		runtime.Goexit()
	}
}

// passOnGoroutine calls s.Pass on a goroutine of its own and reports how
// it ended: returned, or with its panic's value, or by runtime.Goexit
// (neither).
func passOnGoroutine(s *Sweep) (returned bool, panicked any, err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { panicked = recover() }()
		_, err = s.Pass(context.Background())
		returned = true
	}()
	<-done
	return returned, panicked, err
}

// TestGoexitOrPanicUnderPassReachesCaller: a store call or an Observer
// that calls runtime.Goexit or panics on the pass's own goroutine, before
// or after a Clear's runtime.Goexit made the pass settle its page and read
// its ranges again, ends the caller's goroutine the same way (the panic
// with its value); the pass's deferred work is done (ObservePass, the
// workers stopped) and the next pass runs and clears what is left.
func TestGoexitOrPanicUnderPassReachesCaller(t *testing.T) {
	t.Parallel()
	type fault struct {
		name   string
		set    func(kv *fakeKV, f func()) Observer // installs f where the fault is
		always bool
	}
	nth := func(n int64, f func()) func(context.Context, int64) error {
		return func(_ context.Context, call int64) error {
			if call == n {
				f()
			}
			return nil
		}
	}
	faults := []fault{
		{"scan", func(kv *fakeKV, f func()) Observer { kv.onScan = nth(3, f); return nil }, false},
		{"delete", func(kv *fakeKV, f func()) Observer { kv.onDelete = nth(2, f); return nil }, false},
		{"move", func(kv *fakeKV, f func()) Observer { kv.onMove = nth(1, f); return nil }, false},
	}
	for _, fl := range faults {
		for _, how := range []string{"goexit", "panic"} {
			for _, exitFirst := range []bool{false, true} {
				for _, conc := range []int{1, 4} {
					t.Run(fmt.Sprintf("%s/%s/clear-exited-first=%v/concurrency=%d", fl.name, how, exitFirst, conc), func(t *testing.T) {
						t.Parallel()
						kv := newFakeKV(nil)
						panicValue := fmt.Errorf("store bug %s", fl.name)
						f := func() {
							if how == "panic" {
								panic(panicValue)
							}
							runtime.Goexit()
						}
						fl.set(kv, f)
						rec := &recorder{}
						var exited atomic.Bool
						c := newClears()
						c.set("f03", errBoom)
						s, clock := newSweep(t, kv.store(), Config{Observer: rec, Concurrency: conc, PageSize: 2, Clear: func(ctx context.Context, id string) error {
							err := c.clear(ctx, id)
							if exitFirst && id == "a00" && exited.CompareAndSwap(false, true) {
								runtime.Goexit()
							}
							return err
						}})
						for i := range 9 {
							id := fmt.Sprintf("a%02d", i)
							if i == 3 {
								id = "f03"
							}
							mark(t, kv.MemKV, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
						}
						clock.Set(t0.Add(2 * time.Hour))
						returned, panicked, _ := passOnGoroutine(s)
						assert.False(t, returned, "the pass did not return")
						if how == "panic" {
							assert.Same(t, panicValue, panicked, "the panic reaches the caller with its value")
						} else {
							assert.Nil(t, panicked, "runtime.Goexit reaches the caller as such")
						}
						assert.Len(t, rec.passes, 1, "ObservePass saw the pass")
						kv.setHooks(nil, nil, nil)
						clock.Advance(time.Hour) // every retry due
						st, err := s.Pass(context.Background())
						require.NoError(t, err, "the next pass runs")
						c.set("f03", nil)
						clock.Advance(time.Hour)
						st2, err := s.Pass(context.Background())
						require.NoError(t, err)
						t.Logf("then: %d cleared, %d failed; %d cleared", st.Cleared, st.Failed, st2.Cleared)
						assert.Zero(t, kv.Len(), "everything cleared in the end")
					})
				}
			}
		}
	}
}

// TestObserverGoexitOrPanicOnPassGoroutineReachesCaller: an Observer that
// calls runtime.Goexit or panics in ObservePage on the pass's own
// goroutine ends the caller's goroutine alike; the sweep is not left busy.
func TestObserverGoexitOrPanicOnPassGoroutineReachesCaller(t *testing.T) {
	t.Parallel()
	for _, value := range []any{nil, "observer bug", errBoom} {
		for _, page := range []int32{1, 3} {
			for _, conc := range []int{1, 4} {
				t.Run(fmt.Sprintf("%v/page%d/concurrency=%d", value, page, conc), func(t *testing.T) {
					t.Parallel()
					kv := NewMemKV()
					obs := &exitObserver{page: page, value: value}
					c := newClears()
					s, clock := newSweep(t, kv, Config{Observer: obs, Concurrency: conc, PageSize: 2, Clear: c.clear})
					for i := range 9 {
						mark(t, kv, "runs/", fmt.Sprintf("a%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
					}
					clock.Set(t0.Add(2 * time.Hour))
					returned, panicked, _ := passOnGoroutine(s)
					assert.False(t, returned)
					assert.Equal(t, value, panicked)
					assert.Equal(t, 9-2*int(page), kv.Len(), "the pages the Observer saw are settled")
					st, err := s.Pass(context.Background())
					require.NoError(t, err, "the sweep is not left busy")
					assert.Equal(t, 9-2*int(page), st.Cleared)
					assert.Zero(t, kv.Len())
					assert.Equal(t, 9, c.total(), "each marker cleared once")
				})
			}
		}
	}
}

// TestGoexitInClearOfPassOnCallersGoroutine: a pass after an idle one runs
// on the caller's goroutine; a Clear of it that calls runtime.Goexit ends
// a worker, not the caller, and counts as failed.
func TestGoexitInClearOfPassOnCallersGoroutine(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 3} {
		t.Run(fmt.Sprint("concurrency=", conc), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, kv, Config{Concurrency: conc, PageSize: 2, Clear: func(ctx context.Context, id string) error {
				_ = c.clear(ctx, id)
				if id[0] == 'g' {
					runtime.Goexit()
				}
				return nil
			}})
			st, err := s.Pass(context.Background()) // nothing expired: idle
			require.NoError(t, err)
			require.Zero(t, st.ScanCalls-3)
			ids := []string{"g0", "a1", "a2", "g3", "g4", "a5", "a6"}
			for i, id := range ids {
				mark(t, kv, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			returned, panicked, err := passOnGoroutine(s)
			require.True(t, returned, "the caller's goroutine is not ended")
			require.Nil(t, panicked)
			require.NoError(t, err)
			assert.Equal(t, 7, c.total())
			assert.Equal(t, map[string]int{"g0": 1, "g3": 1, "g4": 1}, retryIDs(t, kv))
		})
	}
}

// TestConcurrentPassesWithGoexitingClears: passes called at once, whose
// Clears call runtime.Goexit on their own goroutines, never overlap, and
// each marker is cleared once.
func TestConcurrentPassesWithGoexitingClears(t *testing.T) {
	t.Parallel()
	kv := newFakeKV(nil)
	var overlap atomic.Int32
	kv.onScan = func(context.Context, int64) error {
		if kv.inScan.Load() > 1 {
			overlap.Add(1)
		}
		return nil
	}
	c := newClears()
	var active atomic.Int32
	s, clock := newSweep(t, kv.store(), Config{PageSize: 3, Concurrency: 2, Clear: func(ctx context.Context, id string) error {
		active.Add(1)
		defer active.Add(-1)
		_ = c.clear(ctx, id)
		if id[0] == 'g' && c.count(id) == 1 {
			runtime.Goexit()
		}
		return nil
	}})
	for i := range 300 {
		p := "o"
		if i%11 == 0 {
			p = "g"
		}
		mark(t, kv.MemKV, "runs/", fmt.Sprintf("%s%04d", p, i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	clock.Set(t0.Add(2 * time.Hour))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			returned, panicked, err := passOnGoroutine(s)
			assert.True(t, returned)
			assert.Nil(t, panicked)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.Zero(t, overlap.Load(), "passes overlapped")
	for i := range 300 {
		if i%11 != 0 {
			assert.Equal(t, 1, c.count(fmt.Sprintf("o%04d", i)))
		}
	}
	clock.Advance(time.Hour)
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Zero(t, kv.Len(), "everything cleared in the end")
}

// TestDryRunObserverPanicReachesCaller: a dry run's pass, which runs on a
// goroutine of its own, passes an Observer's panic to its caller with its
// value, and touches no marker.
func TestDryRunObserverPanicReachesCaller(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	obs := &exitObserver{page: 2, value: "observer bug"}
	c := newClears()
	s, clock := newSweep(t, kv, Config{DryRun: true, Observer: obs, PageSize: 2, Clear: c.clear})
	for i := range 5 {
		mark(t, kv, "runs/", fmt.Sprintf("a%d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	clock.Set(t0.Add(2 * time.Hour))
	returned, panicked, _ := passOnGoroutine(s)
	assert.False(t, returned)
	assert.Equal(t, "observer bug", panicked)
	assert.Equal(t, 5, kv.Len())
	assert.Zero(t, c.total())
	obs.page = 0
	st, err := s.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 5, st.WouldClear)
}

// TestSweepKeepsMarkersOfNestedPrefixes: prefixes that New accepts inside
// another sweep's range are never read as that sweep's markers, so a pass
// of the outer sweep deletes none of theirs, and the prefix that would be
// is refused.
func TestSweepKeepsMarkersOfNestedPrefixes(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	outerClears := newClears()
	outer, clock := newSweep(t, kv, Config{Prefix: "t/", Clear: outerClears.clear})
	old := t0.Add(-48 * time.Hour)
	own := mark(t, kv, "t/", "own", old)
	nested := []string{"t/00000000000000012345:", "t/0000000000000012345/", "t/000000000000000012345/", "t/12345/"}
	var theirs [][]byte
	for _, p := range nested {
		_, err := New(kv, Config{Prefix: p, Retention: time.Hour, Clear: outerClears.clear})
		require.NoError(t, err, "New() with prefix %q", p)
		theirs = append(theirs, mark(t, kv, p, "inner", old))
	}
	_, err := New(kv, Config{Prefix: "t/00000000000000012345/", Retention: time.Hour, Clear: outerClears.clear})
	require.ErrorIs(t, err, ErrInvalidConfig, "the prefix whose markers the sweep of t/ would delete")

	clock.Advance(time.Minute)
	st, err := outer.Pass(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared, "Pass() cleared %d, want only its own marker", st.Cleared)
	assert.Zero(t, st.Malformed, "Pass() deleted keys of other sweeps as malformed")
	assert.False(t, has(t, kv, own), "its own expired marker stays")
	for i, key := range theirs {
		assert.True(t, has(t, kv, key), "the marker of the sweep of %q was deleted", nested[i])
	}
	assert.Equal(t, 0, outerClears.count("inner"), "another sweep's id was cleared")
}
