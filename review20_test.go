package retention

// Adversarial review of the performance change 0713e5e..HEAD (idle guess,
// one recover per run of clears, cheap id hash and page probes, parseStamp
// and appendTimestamp fast paths, MemKV tail). A test marked FINDING fails
// on the code it was written against; the others pin an edge that held.

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// review20WrapErr is an ordinary wrapping error type. Its nil pointer is
// the classic typed-nil error: Error is nil-safe, Unwrap (as almost every
// wrapper writes it) dereferences the receiver.
type review20WrapErr struct{ err error }

func (e *review20WrapErr) Error() string {
	if e == nil {
		return "<nil wrapErr>"
	}
	return "wrap: " + e.err.Error()
}

func (e *review20WrapErr) Unwrap() error { return e.err }

func review20TypedNilClear(_ context.Context, id string) error {
	if id == "typednil" {
		var e *review20WrapErr
		return e // non-nil error interface holding a nil pointer
	}
	return nil
}

// FINDING (failures stay local). TestReview20TypedNilWrapperErrorIsLocal: a
// Clear that returns a typed-nil wrapper error makes errors.Is (in
// outcomeOf) call its Unwrap, which panics. Before c5bf8c8 that happened
// under clearOne's deferred recover, and the item was recorded failed
// (ErrClearPanicked) while the pass went on, exactly as
// TestPanickingErrorsAndValidators does for a typed nil without Unwrap.
// Now clearOne clears cur.item before outcomeOf/callFailed run
// (clear.go: `cur.item, cur.ctx = nil, nil` right after the call), so the
// run's deferred func does not recover: with Concurrency 1 the panic is
// re-raised on the caller of Pass (and Run, which has no recover, crashes
// the service); the marker blocks every later pass.
func TestReview20TypedNilWrapperErrorIsLocal(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	s, clock := newSweep(t, kv, Config{Clear: review20TypedNilClear})
	mark(t, kv, "runs/", "typednil", t0)
	mark(t, kv, "runs/", "fine", t0.Add(time.Millisecond))
	clock.Set(t0.Add(2 * time.Hour))
	var st Stats
	var err error
	var r any
	func() {
		defer func() { r = recover() }()
		st, err = s.Pass(context.Background())
	}()
	require.Nil(t, r, "Pass panicked on a Clear's typed-nil error")
	require.NoError(t, err)
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, map[string]int{"typednil": 1}, markerIDs(t, kv, "runs/"))
}

// FINDING (same root cause, worse). With Concurrency > 1 the same typed
// nil error panics on a worker goroutine, where nothing recovers: the
// whole process dies. Run in a child process so that the crash is seen.
func TestReview20TypedNilWrapperErrorWorkers(t *testing.T) {
	if os.Getenv("REVIEW20_CHILD") == "1" {
		kv := NewMemKV()
		s, clock := newSweep(t, kv, Config{Clear: review20TypedNilClear, Concurrency: 4})
		mark(t, kv, "runs/", "typednil", t0)
		mark(t, kv, "runs/", "fine", t0.Add(time.Millisecond))
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed)
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestReview20TypedNilWrapperErrorWorkers$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REVIEW20_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process crashed:\n%s", review20Head(out, 1500))
}

func review20Head(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

// FINDING (cost, minor). TestReview20IdleGuessWithPanickingValidator: peek
// counts a marker whose Config.ValidateID panics as a marker ("not known
// to be malformed"), so the pass sets s.idle; stillIdle then refuses the
// same key because checkIDBytes returns errValidatePanicked (sweep.go
// stillIdle: `s.checkIDBytes(keys[0], id) != nil`), and falls back. Every
// idle pass of such a sweep costs 4 Scan calls, one more than before the
// change and two more than README's "an idle pass costs two Scan calls",
// and calls the panicking validator twice. stillIdle should treat
// errValidatePanicked as peek does (or peek report it as not clean).
func TestReview20IdleGuessWithPanickingValidator(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	calls := 0
	s, _ := newSweep(t, kv, Config{
		Clear: func(context.Context, string) error { return nil },
		ValidateID: func(id string) error {
			calls++
			if id == "crashes" {
				panic("validator bug")
			}
			return nil
		}})
	mark(t, kv, "runs/", "crashes", t0.Add(time.Minute)) // not expired
	mark(t, kv, "runs/", "later", t0.Add(2*time.Minute))
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	for range 3 {
		calls = 0
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		assert.Equal(t, t0.Add(time.Minute+time.Hour), st.NextDue)
		assert.LessOrEqual(t, st.ScanCalls, 3, "an idle pass after an idle pass")
		assert.LessOrEqual(t, calls, 1, "validator calls in an idle pass")
	}
}

// TestReview20IdleGuessSeesEverything: after idle passes, whatever lands
// before the first marker (an out-of-order marker, a requeued or foreign
// or malformed key, an expiry at the exact millisecond, a clock stepped
// back and forward, a due retry) is handled as the usual path would.
func TestReview20IdleGuessSeesEverything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := NewMemKV()
	c := newClears()
	s, clock := newSweep(t, kv, Config{Clear: c.clear, RetryDelay: time.Second})
	idle := func() Stats {
		t.Helper()
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		return st
	}
	mark(t, kv, "runs/", "b", t0.Add(10*time.Minute))
	idle()
	st := idle()
	require.Equal(t, 2, st.ScanCalls, "the idle guess is in use")
	require.Equal(t, t0.Add(10*time.Minute+time.Hour), st.NextDue)

	// Exactly Retention old: kept; one ms later: cleared.
	clock.Set(t0.Add(10*time.Minute + time.Hour))
	st = idle()
	assert.Zero(t, st.Cleared)
	assert.Equal(t, 2, st.ScanCalls)
	clock.Advance(time.Millisecond)
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, c.count("b"))

	// Idle again; a marker written out of order, expired at once.
	mark(t, kv, "runs/", "z", t0.Add(20*time.Hour))
	idle()
	require.Equal(t, 2, idle().ScanCalls)
	mark(t, kv, "runs/", "old", t0)
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, c.count("old"))

	// A foreign key before the markers: counted, never idle over it.
	idle()
	require.Equal(t, 2, idle().ScanCalls)
	require.NoError(t, kv.Put(ctx, []byte("runs/0-foreign"), nil))
	st = idle()
	assert.Equal(t, 1, st.Foreign)
	st = idle()
	assert.Equal(t, 1, st.Foreign)
	require.NoError(t, kv.Delete(ctx, []byte("runs/0-foreign")))
	idle()
	require.Equal(t, 2, idle().ScanCalls)

	// A malformed key (time past 9999) after the markers is never met; one
	// that is the first key (a bad id, not expired) is deleted.
	bad := []byte("runs/00000000000000000001/bad id")
	require.NoError(t, kv.Put(ctx, bad, nil))
	st = idle()
	assert.Equal(t, 1, st.Malformed)
	assert.False(t, has(t, kv, bad))

	// Clock stepped back a day, then forward: nothing early, nothing missed.
	idle()
	clock.Set(clock.Now().Add(-24 * time.Hour))
	st = idle()
	assert.Zero(t, st.Cleared)
	clock.Set(t0.Add(21*time.Hour + time.Millisecond))
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 1, c.count("z"))

	// A failed clear moves to the retry range; idle passes still try it.
	mark(t, kv, "runs/", "later", clock.Now().Add(time.Hour))
	mark(t, kv, "runs/", "flaky", t0)
	c.set("flaky", errBoom)
	st = idle()
	assert.Equal(t, 1, st.Failed)
	c.set("flaky", nil)
	idle()
	st = idle()
	require.Equal(t, 2, st.ScanCalls, "idle, with a retry pending")
	clock.Advance(2 * time.Second)
	st = idle()
	assert.Equal(t, 1, st.Cleared)
	assert.Equal(t, 2, c.count("flaky"))
	assert.Equal(t, map[string]int{"later": 1}, markerIDs(t, kv, "runs/"))
}

// TestReview20MemKVAgainstModel: Put, Delete and Move of the first, last
// and only keys keep the tail right; every Scan and Get (the seek fast
// paths: before the first key, past the last, on either) agrees with a
// sorted model. Zero MemKV included.
func TestReview20MemKVAgainstModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		var m *MemKV
		if seed%2 == 0 {
			m = &MemKV{}
		} else {
			m = NewMemKV()
		}
		model := map[string]bool{}
		key := func() []byte { return []byte{byte('a' + r.IntN(6)), byte('a' + r.IntN(3))} }
		sorted := func() []string {
			var ks []string
			for k := range model {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			return ks
		}
		for step := range 400 {
			switch r.IntN(5) {
			case 0, 1:
				k := key()
				require.NoError(t, m.Put(ctx, k, nil))
				model[string(k)] = true
			case 2:
				ks := sorted()
				var k []byte
				switch {
				case len(ks) > 0 && r.IntN(2) == 0:
					k = []byte(ks[0])
				case len(ks) > 0 && r.IntN(2) == 0:
					k = []byte(ks[len(ks)-1])
				default:
					k = key()
				}
				require.NoError(t, m.Delete(ctx, k))
				delete(model, string(k))
			case 3:
				ks := sorted()
				if len(ks) == 0 {
					continue
				}
				from := []byte(ks[len(ks)-1])
				if r.IntN(2) == 0 {
					from = []byte(ks[0])
				}
				to := key()
				if r.IntN(3) == 0 {
					to = append([]byte("z"), to...) // past every key
				} else if r.IntN(2) == 0 {
					to = append([]byte("0"), to...) // before every key
				}
				require.NoError(t, m.Move(ctx, [][]byte{from}, [][]byte{to}))
				delete(model, string(from))
				model[string(to)] = true
			case 4:
			}
			ks := sorted()
			require.Equal(t, len(ks), m.Len(), "seed %d step %d", seed, step)
			for _, start := range [][]byte{nil, []byte("0"), []byte("a"), key(), []byte("zz"), []byte("zzz"), []byte("{")} {
				for _, limit := range []int{1, 3, 100} {
					got, err := m.Scan(ctx, start, []byte("~"), limit)
					require.NoError(t, err)
					var want []string
					for _, k := range ks {
						if k >= string(start) && len(want) < limit {
							want = append(want, k)
						}
					}
					var gs []string
					for _, g := range got {
						gs = append(gs, string(g))
					}
					require.Equal(t, want, gs, "seed %d step %d start %q limit %d", seed, step, start, limit)
				}
				_, ok, err := m.Get(ctx, start)
				require.NoError(t, err)
				require.Equal(t, model[string(start)], ok)
			}
			if len(ks) > 0 {
				require.Equal(t, ks[len(ks)-1], string(m.tail.key), "tail, seed %d step %d", seed, step)
			} else {
				require.Nil(t, m.tail)
			}
		}
	}
}

// TestReview20ParseStampAgainstStrconv: the 4-leading-zeros fast path and
// the slow path agree with strconv on digits, reject a non-digit in any
// position (0x2F, 0x3A, high bytes), and values >= 1e16 or past
// MaxMarkerTime never come back as a valid marker time.
func TestReview20ParseStampAgainstStrconv(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	check := func(b []byte) {
		t.Helper()
		got, ok := parseStamp(b)
		v, err := strconv.ParseUint(string(b), 10, 64)
		allDigits := true
		for _, c := range b {
			allDigits = allDigits && c >= '0' && c <= '9'
		}
		require.Equal(t, allDigits, ok, "%q", b)
		if !ok {
			return
		}
		if err == nil && v <= uint64(maxMarkerMs) {
			require.Equal(t, v, got, "%q", b)
		} else {
			require.Greater(t, got, uint64(maxMarkerMs), "%q", b)
		}
	}
	edges := []uint64{0, 1, 9, 99999999, 100000000, 9999999999999999, 1e16, 1e16 + 1, uint64(maxMarkerMs), uint64(maxMarkerMs) + 1,
		253402300799999, 1e19, 18446744073709551615}
	for _, v := range edges {
		check([]byte(fmt.Sprintf("%020d", v)))
	}
	check([]byte("99999999999999999999"))
	for range 200000 {
		var v uint64
		switch r.IntN(3) {
		case 0:
			v = r.Uint64N(uint64(maxMarkerMs) * 2)
		case 1:
			v = r.Uint64N(1e17)
		default:
			v = r.Uint64()
		}
		b := []byte(fmt.Sprintf("%020d", v))
		if r.IntN(2) == 0 {
			b[r.IntN(20)] = []byte{'/', ':', 0x00, 0xff, 'a', '0' + 10, 0x39 + 0x80, 0x30 - 6}[r.IntN(8)]
		}
		check(b)
		var buf []byte
		require.Equal(t, fmt.Sprintf("%020d", v), string(appendTimestamp(buf, v)))
	}
}

// TestReview20DedupeRandom: ids of 1 to 40 bytes, some one byte apart,
// each written 1 to 3 times on one page (Mover: page table) or across
// pages (Put-only: the pass's table): every id cleared exactly once, every
// marker gone, Duplicates = markers - ids.
func TestReview20DedupeRandom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, wide := range []bool{false} {
		for seed := range uint64(6) {
			r := rand.New(rand.NewPCG(seed, 11))
			mem := NewMemKV()
			var kv KV = mem
			pageSize := 5000
			c := newClears()
			s, clock := newSweep(t, kv, Config{Clear: c.clear, PageSize: pageSize})
			ids := map[string]int{}
			for len(ids) < 300 {
				n := 1 + r.IntN(40)
				id := make([]byte, n)
				for i := range id {
					id[i] = "abAB01_-"[r.IntN(8)]
				}
				for _, v := range [][]byte{id, bytes.Clone(id)} {
					if len(ids) > 0 && r.IntN(2) == 0 {
						v[r.IntN(n)] ^= 1 // a neighbour one bit off, when still an id byte
						if ValidateID(string(v)) != nil {
							continue
						}
					}
					for range 1 + r.IntN(3) {
						mark(t, mem, "runs/", string(v), t0.Add(time.Duration(r.IntN(1000))*time.Millisecond))
					}
					ids[string(v)]++
				}
			}
			// Two marks may have hit one key: count what is there.
			left := markerIDs(t, mem, "runs/")
			markers := 0
			for _, n := range left {
				markers += n
			}
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(ctx)
			require.NoError(t, err)
			assert.Empty(t, markerIDs(t, mem, "runs/"), "wide=%v seed %d", wide, seed)
			assert.Equal(t, len(left), st.Cleared, "wide=%v seed %d", wide, seed)
			assert.Equal(t, markers-len(left), st.Duplicates, "wide=%v seed %d", wide, seed)
			for id := range left {
				assert.Equal(t, 1, c.count(id), "wide=%v seed %d id %q", wide, seed, id)
			}
		}
	}
}

// TestReview20PanicsAndGoexitsInARun: clears that panic, call Goexit,
// fail and succeed, mixed on one page and over pages, inline and on
// workers, under ClearTimeout: each recorded once, the run goes on, the
// contexts they consulted end with their call, and no worker is lost or
// left (goleak in TestMain).
func TestReview20PanicsAndGoexitsInARun(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 3} {
		for _, page := range []int{2, 100} {
			t.Run(fmt.Sprintf("c%d-p%d", conc, page), func(t *testing.T) {
				t.Parallel()
				kv := NewMemKV()
				var mu = make(chan struct{}, 1)
				ctxs := map[string]context.Context{}
				calls := map[string]int{}
				clear := func(ctx context.Context, id string) error {
					_ = ctx.Err() // consult it
					mu <- struct{}{}
					ctxs[id] = ctx
					calls[id]++
					<-mu
					switch id[0] {
					case 'p':
						panic("clear bug " + id)
					case 'g':
						runtime.Goexit()
					case 'f':
						return errBoom
					}
					return nil
				}
				s, clock := newSweep(t, kv, Config{Clear: clear, Concurrency: conc, PageSize: page, ClearTimeout: time.Minute})
				ids := []string{"ok1", "p1", "g1", "f1", "ok2", "p2", "p3", "g2", "g3", "ok3", "f2", "ok4"}
				for i, id := range ids {
					mark(t, kv, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
				}
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				assert.Equal(t, 4, st.Cleared)
				assert.Equal(t, 8, st.Failed)
				assert.Equal(t, 8, st.FailedCalls)
				assert.Equal(t, 6, st.PanickedCalls)
				assert.Equal(t, 12, st.ClearCalls)
				assert.Equal(t, map[string]int{"p1": 1, "g1": 1, "f1": 1, "p2": 1, "p3": 1, "g2": 1, "g3": 1, "f2": 1}, review20RetryIDs(t, kv))
				for _, id := range ids {
					assert.Equal(t, 1, calls[id], id)
					select {
					case <-ctxs[id].Done():
					default:
						t.Errorf("the ctx of %s's Clear is not done after the pass", id)
					}
				}
			})
		}
	}
}

// review20RetryIDs counts the ids of the retry range under "runs/".
func review20RetryIDs(t *testing.T, kv *MemKV) map[string]int {
	t.Helper()
	keys, err := kv.Scan(context.Background(), []byte("runs/r"), []byte("runs/s"), 1<<20)
	require.NoError(t, err)
	ids := map[string]int{}
	for _, k := range keys {
		rk, _, err := parseRetryKey("runs/", retryInfix, k)
		require.NoError(t, err)
		ids[string(rk.id)]++
	}
	return ids
}

// TestReview20DuplicatesInBatchModes: the page's duplicate check, now run
// in parsePage, still merges the markers of one id for ClearBatch and a
// ClearDeleter, also when the id waits in memory (a failed first clear).
func TestReview20DuplicatesInBatchModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("ClearBatch", func(t *testing.T) {
		t.Parallel()
		kv := NewMemKV()
		seen := map[string]int{}
		s, clock := newSweep(t, kv, Config{ClearBatch: func(_ context.Context, ids []string) error {
			for _, id := range ids {
				seen[id]++
			}
			return nil
		}, BatchSize: 3})
		for i, id := range []string{"a", "b", "a", "c", "b", "a", "d"} {
			mark(t, kv, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}, seen)
		assert.Equal(t, 4, st.Cleared)
		assert.Equal(t, 3, st.Duplicates)
		assert.Empty(t, markerIDs(t, kv, "runs/"))
	})
	t.Run("ClearDeleter", func(t *testing.T) {
		t.Parallel()
		kv := newAtomMem()
		s, clock := newSweep(t, kv, Config{})
		for i, id := range []string{"a", "b", "a", "c", "b", "a", "d"} {
			mark(t, kv.MemKV, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}, kv.cleared)
		assert.Equal(t, 4, st.Cleared)
		assert.Equal(t, 3, st.Duplicates)
		assert.Empty(t, markerIDs(t, kv.MemKV, "runs/"))
	})
	t.Run("waiting in memory", func(t *testing.T) {
		t.Parallel()
		mem := NewMemKV()
		kv := readOnlyKV{mem}
		c := newClears()
		c.set("a", errBoom)
		s, clock := newSweep(t, kv, Config{Clear: c.clear})
		mark(t, mem, "runs/", "a", t0)
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed)
		// Two more markers of a while it waits: the first stays for all,
		// the others go as its duplicates; none is cleared.
		mark(t, mem, "runs/", "a", t0.Add(time.Millisecond))
		mark(t, mem, "runs/", "a", t0.Add(2*time.Millisecond))
		st, err = s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, c.count("a"))
		assert.Equal(t, 1, st.Deferred)
		assert.Equal(t, 2, st.Duplicates)
		assert.Equal(t, 1, markerIDs(t, mem, "runs/")["a"])
		c.set("a", nil)
		clock.Advance(time.Hour)
		st, err = s.Pass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, c.count("a"))
		assert.Equal(t, 1, st.Cleared)
		assert.Empty(t, markerIDs(t, mem, "runs/"))
	})
}

// TestReview20TypedNilWrapperErrorFromClearBatch: a ClearBatch whose error
// is a typed nil with an Unwrap method fails its call, on workers too; it
// neither panics out of Pass nor kills the process.
func TestReview20TypedNilWrapperErrorFromClearBatch(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 3} {
		kv := NewMemKV()
		s, clock := newSweep(t, kv, Config{Concurrency: concurrency, BatchSize: 2, ClearBatch: func(context.Context, []string) error {
			var e *review20WrapErr
			return e
		}})
		for i := range 6 {
			mark(t, kv, "runs/", "typednil"+itoa(i), t0.Add(time.Duration(i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err, "Concurrency %d", concurrency)
		assert.Zero(t, st.Cleared, "Concurrency %d", concurrency)
		assert.Equal(t, 6, st.Failed, "Concurrency %d", concurrency)
		assert.Len(t, markerIDs(t, kv, "runs/"), 6, "Concurrency %d: every marker stays", concurrency)
	}
}

// TestPageOfNoItems: a page whose first key is a marker not expired (only
// a KV that breaks Scan's end bound returns one) has no items; it is no
// page whose items were all cleared, and the marker stays. Found by review
// of the settle fast path, which read the first item of such a page.
func TestPageOfNoItems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		expired int // markers before the unexpired one: a full page of 2 and then the page of none
		cfg     Config
	}{
		{name: "Clear, the first page", expired: 0},
		{name: "Clear, after a full page", expired: 2},
		{name: "ClearBatch with workers", expired: 2, cfg: Config{ClearBatch: func(context.Context, []string) error { return nil }, Concurrency: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			cfg := tt.cfg
			cfg.PageSize = 2
			if cfg.ClearBatch == nil {
				cfg.Clear = newClears().clear
			}
			s, clock := newSweep(t, endIgnoringKV{mem}, cfg)
			for i := range tt.expired {
				mark(t, mem, "runs/", fmt.Sprintf("m%d", i), clock.Now().Add(-2*time.Hour))
			}
			young := mark(t, mem, "runs/", "young", clock.Now())
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.expired, st.Cleared)
			assert.True(t, has(t, mem, young), "the marker not expired stays")
			assert.Equal(t, 1, mem.Len())
		})
	}
}
