package retention

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The sweep's own cost, counted rather than timed: allocations
// per page and per idle pass, and Scan calls per idle pass. The times are
// in BenchmarkPassOverhead, BenchmarkIdlePass and BenchmarkPassClear.

// preparedPages returns a pagesKV holding pages of DefaultPageSize expired
// markers.
func preparedPages(t testing.TB, pages int) *pagesKV {
	t.Helper()
	pk := &pagesKV{}
	for p := range pages {
		page := make([][]byte, DefaultPageSize)
		for i := range page {
			n := p*DefaultPageSize + i
			key, err := AppendMarkerKey(nil, "runs/", t0.Add(time.Duration(n)*time.Millisecond), "m"+itoa(n))
			require.NoError(t, err)
			page[i] = key
		}
		pk.pages = append(pk.pages, page)
	}
	return pk
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestPassAllocsPerPage: a pass allocates a few objects per page (the
// string of its ids, its clears' contexts and the header they share, the
// contexts of its Scan and Delete under StoreTimeout), none per marker,
// with ClearTimeout, retries and the dedupe table on.
func TestPassAllocsPerPage(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		concurrency int
		perPage     float64
	}{{1, 11.2}, {4, 11.2}} {
		allocs := func(pages int) float64 {
			pk := preparedPages(t, pages)
			s, clock := newSweep(t, pk, Config{Concurrency: tt.concurrency, Clear: func(context.Context, string) error { return nil }})
			clock.Set(t0.Add(24 * time.Hour))
			return testing.AllocsPerRun(5, func() {
				pk.next = 0
				st, err := s.Pass(ctx)
				require.NoError(t, err)
				require.Equal(t, pages*DefaultPageSize, st.Cleared)
			})
		}
		few, many := allocs(10), allocs(40)
		perPage := (many - few) / 30
		t.Logf("Concurrency %d: %v allocations for 10 pages, %v for 40: %.2f per page", tt.concurrency, few, many, perPage)
		assert.LessOrEqual(t, perPage, tt.perPage, "Concurrency %d: allocations per page (%v for 10 pages, %v for 40)", tt.concurrency, few, many)
		assert.LessOrEqual(t, few, 10*tt.perPage+20, "Concurrency %d: allocations of a pass of 10 pages", tt.concurrency)
	}
}

// TestIdlePassCost: a pass with nothing expired makes three Scan calls,
// two after a pass that found nothing expired either, reads one key, and
// allocates nothing beyond what MemKV returns (two objects for the key
// past the expired range) and its two reads' contexts under StoreTimeout
// (four objects each); it starts no goroutine.
func TestIdlePassCost(t *testing.T) {
	ctx := context.Background()
	mem := NewMemKV()
	kv := &fakeKV{canPut: true, MemKV: mem}
	for i := range 1000 {
		mark(t, mem, "runs/", "m"+itoa(i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	s, _ := newSweep(t, kv.store(), Config{Clear: func(context.Context, string) error { return nil }})
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, st.ScanCalls, "Scan calls: the expired range, the marker past it, the retry range's first key")
	assert.Equal(t, 1, st.Scanned)
	st, err = s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, st.ScanCalls, "Scan calls after an idle pass: the range's first key, the retry range's first key")
	assert.Equal(t, 1, st.Scanned)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := s.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%v allocations per idle pass", allocs)
	assert.LessOrEqual(t, allocs, 10.2, "allocations per idle pass")
}

// TestIdleGuess: a pass after one that found nothing expired reads the
// range's first key alone, and reads the range as usual when that key is
// expired, foreign or malformed; what it clears and reports is what it
// would without the guess.
func TestIdleGuess(t *testing.T) {
	t.Parallel()
	type pass struct {
		advance time.Duration // the clock moves on before the pass
		scans   int
		cleared int
		nextDue time.Time // zero: none
	}
	tests := []struct {
		name   string
		keys   []string // besides markers m0 at t0 and m1 at t0+1h
		empty  bool     // no markers at all
		passes []pass
	}{
		{name: "quiet", passes: []pass{
			{scans: 3, nextDue: t0.Add(time.Hour)},
			{scans: 2, nextDue: t0.Add(time.Hour)},
			{scans: 2, nextDue: t0.Add(time.Hour)},
		}},
		{name: "expires after an idle pass", passes: []pass{
			{scans: 3, nextDue: t0.Add(time.Hour)},
			{advance: time.Hour + time.Millisecond, scans: 1 + 1 + 1 + 1, cleared: 1, nextDue: t0.Add(2 * time.Hour)},
			{scans: 3, nextDue: t0.Add(2 * time.Hour)},
			{scans: 2, nextDue: t0.Add(2 * time.Hour)},
		}},
		{name: "empty", empty: true, passes: []pass{
			{scans: 3},
			{scans: 2},
		}},
		{name: "foreign key below the cutoff", keys: []string{"runs/0/x"}, passes: []pass{
			{scans: 3, nextDue: t0.Add(time.Hour)},
			{scans: 3, nextDue: t0.Add(time.Hour)},
		}},
		// The peek steps over the key and reads a page more.
		{name: "foreign key first past the cutoff", keys: []string{"runs/1/x"}, empty: true, passes: []pass{
			{scans: 4},
			{scans: 4},
		}},
		{name: "malformed key first past the cutoff", keys: []string{"runs/99999999999999999999/x"}, empty: true, passes: []pass{
			{scans: 4}, // deleted by the peek
			{scans: 3}, // no guess after a key that was no marker
			{scans: 2}, // nothing there now
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			if !tt.empty {
				mark(t, mem, "runs/", "m0", t0)
				mark(t, mem, "runs/", "m1", t0.Add(time.Hour))
			}
			for _, k := range tt.keys {
				require.NoError(t, mem.Put(context.Background(), []byte(k), nil))
			}
			s, clock := newSweep(t, mem, Config{Clear: func(context.Context, string) error { return nil }})
			for i, want := range tt.passes {
				clock.Advance(want.advance)
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, want.scans, st.ScanCalls, "pass %d: Pass().ScanCalls", i)
				assert.Equal(t, want.cleared, st.Cleared, "pass %d: Pass().Cleared", i)
				assert.True(t, want.nextDue.Equal(st.NextDue), "pass %d: Pass().NextDue = %v, want %v", i, st.NextDue, want.nextDue)
			}
		})
	}
}

// TestCallersDeadlineIsNoStoreTimeout: the lazy context of a store call
// ends at the caller's deadline as the caller's own, never as a
// StoreTimeout, whichever timer fires first.
func TestCallersDeadlineIsNoStoreTimeout(t *testing.T) {
	t.Parallel()
	for _, timeout := range []time.Duration{-1, time.Hour} {
		s, err := New((&fakeKV{MemKV: NewMemKV(), onScan: hangUntilDone}).store(), Config{Prefix: "x/", Retention: time.Hour, StoreTimeout: timeout,
			Clear: func(context.Context, string) error { return nil }})
		require.NoError(t, err)
		for range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			_, err := s.Pass(ctx)
			cancel()
			require.Equal(t, context.DeadlineExceeded, err, "StoreTimeout %v: Pass() = %v, want the caller's deadline", timeout, err)
		}
	}
}
