package retention

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A nil Config.Logger means slog.Default(): keep the failures that
	// tests provoke out of their output. TestDefaultLogger checks it.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	goleak.VerifyTestMain(m)
}

// t0 is the manual clock's start in tests: late 2026.
var t0 = time.UnixMilli(1795000000000)

// readOnlyKV hides the Put and Move of the KV it wraps: the sweep then
// keeps retry delays and holds in memory.
type readOnlyKV struct{ KV }

// putOnlyKV is a KV that can Put but not Move: the sweep keeps delays and
// holds in memory, as on a read-only store; Put serves Mark alone.
type putOnlyKV struct {
	KV
	Putter
}

// storeKind is a kind of store the sweep takes a different path through.
type storeKind struct {
	name string
	wrap func(*MemKV) KV
	// writes: the sweep moves failed and held markers in the store (a
	// Mover); otherwise it keeps their delays and holds in memory.
	writes bool
	puts   bool // a Putter
}

// fake returns a fakeKV over mem whose store() is of this kind.
func (k storeKind) fake(mem *MemKV) *fakeKV {
	return &fakeKV{MemKV: mem, canPut: k.puts, canMove: k.writes}
}

// storeKinds are the kinds of store every test that iterates over kinds
// runs on: a Mover, a Putter that is no Mover, and a read-only store.
var storeKinds = []storeKind{
	{"Mover", func(m *MemKV) KV { return m }, true, true},
	{"Putter", func(m *MemKV) KV { return putOnlyKV{m, m} }, false, true},
	{"read-only", func(m *MemKV) KV { return readOnlyKV{m} }, false, false},
}

// writingKinds are the store kinds on which retries and holds are written
// to the store and promised to survive a restart.
var writingKinds = func() []storeKind {
	var out []storeKind
	for _, k := range storeKinds {
		if k.writes {
			out = append(out, k)
		}
	}
	return out
}()

// markerIDs returns how many markers each id has under prefix.
func markerIDs(t testing.TB, kv KV, prefix string) map[string]int {
	t.Helper()
	keys, err := kv.Scan(context.Background(), []byte(prefix), []byte(prefix+"\xff"), 1<<30)
	require.NoError(t, err)
	ids := map[string]int{}
	for _, k := range keys {
		_, id, err := ParseMarkerKey(prefix, k)
		require.NoError(t, err, "key %q", k)
		ids[string(id)]++
	}
	return ids
}

// clears records Clear calls and can be told how to answer per id.
type clears struct {
	mu     sync.Mutex
	calls  map[string]int
	order  []string
	answer map[string]error
}

func newClears() *clears {
	return &clears{calls: map[string]int{}, answer: map[string]error{}}
}

func (c *clears) clear(_ context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[id]++
	c.order = append(c.order, id)
	return c.answer[id]
}

func (c *clears) set(id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answer[id] = err
}

func (c *clears) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[id]
}

func (c *clears) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.order)
}

var errBoom = errors.New("boom")

// mark writes the marker of id finished at t into kv.
func mark(t testing.TB, kv *MemKV, prefix, id string, at time.Time) []byte {
	t.Helper()
	key, err := MarkerKey(prefix, at, id)
	require.NoError(t, err)
	require.NoError(t, kv.Put(context.Background(), key, nil))
	return key
}

// has reports whether kv holds key.
func has(t testing.TB, kv *MemKV, key []byte) bool {
	t.Helper()
	_, ok, err := kv.Get(context.Background(), key)
	require.NoError(t, err)
	return ok
}

// newSweep builds a Sweep with a manual clock at t0, filling in what cfg
// leaves out.
func newSweep(t testing.TB, kv KV, cfg Config) (*Sweep, *ManualClock) {
	t.Helper()
	clock := NewManualClock(t0)
	if cfg.Clock == nil {
		cfg.Clock = clock
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "runs/"
	}
	if cfg.Retention == 0 {
		cfg.Retention = time.Hour
	}
	s, err := New(kv, cfg)
	require.NoError(t, err)
	return s, clock
}

// keysUnder returns the store's keys under prefix.
func keysUnder(t testing.TB, kv KV, prefix string) []string {
	t.Helper()
	keys, err := kv.Scan(context.Background(), []byte(prefix), []byte(prefix+"\xff"), 1<<20)
	require.NoError(t, err)
	var out []string
	for _, k := range keys {
		out = append(out, string(k))
	}
	return out
}
