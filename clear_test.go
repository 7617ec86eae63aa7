package retention

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// TestClearGoexit: a Clear that calls runtime.Goexit, as t.FailNow or a
// failing require does inside it, counts as failed at every Concurrency;
// its marker stays, the other markers are cleared, and the pass returns.
func TestClearGoexit(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 2, 16} {
		t.Run(fmt.Sprint("concurrency", conc), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			var calls atomic.Int32
			s, clock := newSweep(t, kv, Config{Concurrency: conc, PageSize: 10, Clear: func(_ context.Context, id string) error {
				calls.Add(1)
				if id[0] == 'x' {
					runtime.Goexit()
				}
				return nil
			}})
			for i := range 100 {
				prefix := "a"
				if i%7 == 3 {
					prefix = "x"
				}
				mark(t, kv, "runs/", fmt.Sprintf("%s%03d", prefix, i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(context.Background())
			require.NoError(t, err)
			assert.Equal(t, int32(100), calls.Load(), "every Clear called once")
			assert.Equal(t, 14, st.Failed)
			assert.Equal(t, 86, st.Cleared)
			left := markerIDs(t, kv, "runs/")
			assert.Len(t, left, 14)
			for id := range left {
				assert.Equal(t, byte('x'), id[0], "only the markers whose Clear exited stay")
			}
		})
	}
}

// TestRunSurvivesGoexit: Run goes on after a Clear called runtime.Goexit.
func TestRunSurvivesGoexit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kv := NewMemKV()
		mark(t, kv, "runs/", "exits", time.Now().Add(-2*time.Hour))
		var log passLog
		s, err := New(kv, Config{Prefix: "runs/", Retention: time.Hour, OnPass: log.onPass,
			Clear: func(context.Context, string) error { runtime.Goexit(); return nil }})
		require.NoError(t, err)
		stop := runInBackground(t.Context(), s)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.GreaterOrEqual(t, log.len(), 3, "Run keeps passing")
		assert.Equal(t, 1, log.stat(0).Failed)
		assert.Equal(t, 1, kv.Len())
		require.ErrorIs(t, stop(), context.Canceled)
	})
}

// TestClearNeverEarly: an entity finished at any sub-millisecond time is
// cleared only once strictly more than Retention has passed since then.
func TestClearNeverEarly(t *testing.T) {
	t.Parallel()
	for _, frac := range []time.Duration{0, 1, 100 * time.Microsecond, 500 * time.Microsecond, 900 * time.Microsecond, 999_999} {
		t.Run(frac.String(), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			c := newClears()
			s, clock := newSweep(t, kv, Config{Clear: c.clear})
			finished := t0.Add(frac)
			mark(t, kv, "runs/", "a", finished)
			for step := -3 * time.Millisecond; step <= 3*time.Millisecond; step += 100 * time.Microsecond {
				now := finished.Add(time.Hour + step)
				clock.Set(now)
				_, err := s.Pass(context.Background())
				require.NoError(t, err)
				if c.count("a") > 0 {
					assert.Greater(t, now.Sub(finished), time.Hour, "cleared %v after it finished", now.Sub(finished))
					assert.LessOrEqual(t, now.Sub(finished), time.Hour+time.Millisecond+100*time.Microsecond, "and not much later")
					return
				}
			}
			t.Fatal("never cleared")
		})
	}
}

// errFirstCtx reports an error from Err once lost is set, before its Done
// channel closes: as a pass's context under a lease does between the
// lease's loss and the goroutine that cancels it (see leaseContext).
type errFirstCtx struct {
	context.Context
	done chan struct{}
	lost atomic.Bool
}

func (c *errFirstCtx) Done() <-chan struct{} { return c.done }

func (c *errFirstCtx) Err() error {
	if c.lost.Load() {
		return context.Canceled
	}
	return nil
}

// TestClearsAskErrBeforeEach: a context's Err is read before every Clear,
// not only its Done channel, so that no Clear starts once Err reports the
// pass over.
func TestClearsAskErrBeforeEach(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			ctx := &errFirstCtx{Context: context.Background(), done: make(chan struct{})}
			var calls atomic.Int32
			s, clock := newSweep(t, mem, Config{Concurrency: concurrency, Clear: func(context.Context, string) error {
				calls.Add(1)
				ctx.lost.Store(true)
				return nil
			}})
			for i := range 20 {
				mark(t, mem, "runs/", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			_, err := s.Pass(ctx)
			require.ErrorIs(t, err, context.Canceled)
			assert.LessOrEqual(t, int(calls.Load()), concurrency, "Clears after Err reported the pass over")
			assert.Equal(t, 20, mem.Len(), "nothing deleted once Err reported the pass over")
		})
	}
}

// nilSafeWrapErr is an ordinary wrapping error type. Its nil pointer is
// the classic typed-nil error: Error is nil-safe, Unwrap (as almost every
// wrapper writes it) dereferences the receiver.
type nilSafeWrapErr struct{ err error }

func (e *nilSafeWrapErr) Error() string {
	if e == nil {
		return "<nil wrapErr>"
	}
	return "wrap: " + e.err.Error()
}

func (e *nilSafeWrapErr) Unwrap() error { return e.err }

// typedNilClear returns a typed-nil nilSafeWrapErr for the id
// "typednil", nil for the others.
func typedNilClear(_ context.Context, id string) error {
	if id == "typednil" {
		var e *nilSafeWrapErr
		return e // non-nil error interface holding a nil pointer
	}
	return nil
}

// TestTypedNilWrapperErrorFailsOnlyItsMarker: a Clear that returns a
// typed-nil wrapper error, whose Unwrap panics under errors.Is, fails its
// marker alone (recorded as panicked) while the pass goes on.
func TestTypedNilWrapperErrorFailsOnlyItsMarker(t *testing.T) {
	t.Parallel()
	kv := NewMemKV()
	s, clock := newSweep(t, kv, Config{Clear: typedNilClear})
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

// TestTypedNilWrapperErrorOnWorkersDoesNotCrash: with Concurrency > 1 the
// same typed-nil error is met on a worker goroutine and still fails its
// marker alone. It runs in a child process so that a crash is seen.
func TestTypedNilWrapperErrorOnWorkersDoesNotCrash(t *testing.T) {
	inChildProcess(t, func() {
		kv := NewMemKV()
		s, clock := newSweep(t, kv, Config{Clear: typedNilClear, Concurrency: 4})
		mark(t, kv, "runs/", "typednil", t0)
		mark(t, kv, "runs/", "fine", t0.Add(time.Millisecond))
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, st.Failed)
	})
}

// inChildProcess runs body in a child process running the test t alone,
// and fails t when that process crashed: a crash, not a failed assertion,
// is what a test of a panic that must not kill the process can see.
func inChildProcess(t *testing.T, body func()) {
	if os.Getenv("RETENTION_TEST_CHILD") == "1" {
		body()
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RETENTION_TEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process crashed:\n%s", firstBytes(out, 1500))
}

// firstBytes returns at most the first n bytes of b.
func firstBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

// TestPanicsAndGoexitsEachRecordedOnce: clears that panic, call Goexit,
// fail and succeed, mixed on one page and over pages, inline and on
// workers, under ClearTimeout: each recorded once, the run goes on, the
// contexts they consulted end with their call, and no worker is lost or
// left (goleak in TestMain).
func TestPanicsAndGoexitsEachRecordedOnce(t *testing.T) {
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
				assert.Equal(t, map[string]int{"p1": 1, "g1": 1, "f1": 1, "p2": 1, "p3": 1, "g2": 1, "g3": 1, "f2": 1}, retryIDs(t, kv))
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

// retryIDs counts the ids of the retry range under "runs/".
func retryIDs(t testing.TB, kv *MemKV) map[string]int {
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

// TestKeptIDsStay: ids that Clear keeps are plain strings: they stay as
// they were through later pages and passes.
func TestKeptIDsStay(t *testing.T) {
	t.Parallel()
	mem := NewMemKV()
	var kept []string
	s, clock := newSweep(t, mem, Config{PageSize: 100, Clear: func(_ context.Context, id string) error {
		kept = append(kept, id)
		return nil
	}})
	want := func(pass, i int) string { return fmt.Sprintf("p%d-%s-%d", pass, strings.Repeat("x", i%40), i) }
	const n = 2000 // some 80 KB of ids a pass: more than a block
	for pass := range 3 {
		for i := range n {
			mark(t, mem, "runs/", want(pass, i), t0.Add(time.Duration(pass*n+i)*time.Millisecond))
		}
		clock.Set(t0.Add(2 * time.Hour))
		st, err := s.Pass(context.Background())
		require.NoError(t, err)
		require.Equal(t, n, st.Cleared)
	}
	require.Len(t, kept, 3*n)
	for pass := range 3 {
		for i := range n {
			require.Equal(t, want(pass, i), kept[pass*n+i], "id %d of pass %d", i, pass)
		}
	}
}

// TestGoexitOnPassGoroutineCountsEachMarkerOnce: a Clear that calls
// runtime.Goexit on the pass's own goroutine makes the pass settle its
// page and read its ranges again; the markers of earlier pages that stay
// (a failed clear on a store that is no Mover, a foreign key) are counted
// once in the pass's Stats, as without the Goexit, and every Clear is
// called once.
func TestGoexitOnPassGoroutineCountsEachMarkerOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		for _, conc := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/concurrency=%d", kind.name, conc), func(t *testing.T) {
				t.Parallel()
				mem := NewMemKV()
				// A foreign key first, then a page per marker: with one
				// marker a page, the pass's goroutine makes every Clear.
				require.NoError(t, mem.Put(t.Context(), []byte("runs/0000000179"), nil))
				ids := []string{"f0", "a1", "g2", "a3", "a4"}
				for i, id := range ids {
					mark(t, mem, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
				}
				c := newClears()
				c.set("f0", errBoom)
				clear := func(ctx context.Context, id string) error {
					err := c.clear(ctx, id)
					if id == "g2" {
						runtime.Goexit()
					}
					return err
				}
				s, clock := newSweep(t, kind.wrap(mem), Config{Clear: clear, Concurrency: conc, PageSize: 1})
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(t.Context())
				require.NoError(t, err)
				for _, id := range ids {
					assert.Equal(t, 1, c.count(id), "Clear calls of %s", id)
				}
				assert.Equal(t, 3, st.Cleared)
				assert.Equal(t, 2, st.Failed)
				assert.Equal(t, 5, st.ClearCalls)
				assert.Zero(t, st.Deferred, "a marker that failed in this pass is not also deferred by it")
				assert.Equal(t, 1, st.Foreign, "the foreign key counted once")
				assert.Len(t, keysUnder(t, mem, "runs/"), 3, "the foreign key and the markers of f0 and g2 stay")
			})
		}
	}
}

// TestGoexitingClearCalledOncePerPass: a Clear that calls runtime.Goexit
// on the pass's own goroutine, under a real clock on a store slower than
// the retry delay and that is no Mover, is called once in the pass, and so
// is the Clear of a marker that failed on an earlier page: the pass ends
// rather than reading its ranges again and again.
func TestGoexitingClearCalledOncePerPass(t *testing.T) {
	for _, conc := range []int{1, 4} {
		t.Run(fmt.Sprint("concurrency=", conc), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				kv := newFakeKV(nil)
				kv.canMove, kv.canPut = false, false
				kv.onScan = func(context.Context, int64) error {
					time.Sleep(2 * time.Second) // longer than RetryDelay (1s)
					return nil
				}
				mark(t, kv.MemKV, "runs/", "f0", time.Now().Add(-2*time.Hour))
				mark(t, kv.MemKV, "runs/", "g1", time.Now().Add(-2*time.Hour+time.Millisecond))
				mark(t, kv.MemKV, "runs/", "a2", time.Now().Add(-2*time.Hour+2*time.Millisecond))
				c := newClears()
				c.set("f0", errBoom)
				s, err := New(kv.store(), Config{Prefix: "runs/", Retention: time.Hour, PageSize: 1, Concurrency: conc,
					RetryDelay: time.Second, MaxRetryDelay: time.Second, Clear: func(ctx context.Context, id string) error {
						err := c.clear(ctx, id)
						if id == "g1" && c.count(id) < 20 { // bounded: the test must end
							runtime.Goexit()
						}
						return err
					}})
				require.NoError(t, err)
				st, err := s.Pass(t.Context())
				require.NoError(t, err)
				assert.Equal(t, 1, c.count("g1"), "Clear calls of the marker whose Clear called Goexit, in one pass")
				assert.Equal(t, 1, c.count("f0"), "Clear calls of a marker that failed on an earlier page, in one pass")
				assert.Equal(t, 1, c.count("a2"))
				assert.Equal(t, 1, st.Cleared)
				assert.Equal(t, 2, st.Failed)
				t.Logf("ScanCalls %d, Duration %v", st.ScanCalls, st.Duration)
			})
		})
	}
}

// TestEveryClearOfEveryPageExits: pages whose every Clear calls
// runtime.Goexit, at every Concurrency and on every kind of store: the
// pass ends, each Clear is called once, every marker stays and counts as
// failed once, and the pass reads no page more than a bounded number of
// times.
func TestEveryClearOfEveryPageExits(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		for _, conc := range []int{1, 2, 8} {
			t.Run(fmt.Sprintf("%s/concurrency=%d", kind.name, conc), func(t *testing.T) {
				t.Parallel()
				mem := NewMemKV()
				const n = 40
				for i := range n {
					mark(t, mem, "runs/", fmt.Sprintf("g%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
				}
				c := newClears()
				kv := kind.fake(mem)
				s, clock := newSweep(t, kv.store(), Config{Concurrency: conc, PageSize: 4, Clear: func(ctx context.Context, id string) error {
					_ = c.clear(ctx, id)
					runtime.Goexit()
					return nil
				}})
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(t.Context())
				require.NoError(t, err)
				for i := range n {
					assert.Equal(t, 1, c.count(fmt.Sprintf("g%02d", i)))
				}
				assert.Equal(t, n, st.Failed)
				assert.Equal(t, n, st.ClearCalls)
				assert.Equal(t, n, st.FailedCalls)
				assert.Zero(t, st.Cleared)
				assert.Zero(t, st.Deferred, "no marker failed in this pass is deferred by it")
				assert.Len(t, markerIDs(t, mem, "runs/"), n)
				// 10 pages, the read after the last, the peek, the retry
				// range: 13 reads without a Goexit.
				t.Logf("ScanCalls %d", st.ScanCalls)
				assert.LessOrEqual(t, st.ScanCalls, 2*13, "Scan calls")
			})
		}
	}
}

// TestGoexitOnPassGoroutineWhenPassCancelled: a Clear on the pass's own
// goroutine that cancels the pass and calls runtime.Goexit: the pass
// returns ctx.Err(), deletes no marker of the page it was clearing (their
// clears are retried), and the next pass clears everything.
func TestGoexitOnPassGoroutineWhenPassCancelled(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 3} {
		t.Run(fmt.Sprint("concurrency=", conc), func(t *testing.T) {
			t.Parallel()
			kv := NewMemKV()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			c := newClears()
			s, clock := newSweep(t, kv, Config{Concurrency: conc, PageSize: 1, ClearTimeout: time.Minute, Clear: func(cctx context.Context, id string) error {
				_ = c.clear(cctx, id)
				if id == "g2" && c.count(id) == 1 {
					cancel()
					runtime.Goexit()
				}
				return nil
			}})
			for i, id := range []string{"a0", "a1", "g2", "a3"} {
				mark(t, kv, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Set(t0.Add(2 * time.Hour))
			st, err := s.Pass(ctx)
			require.ErrorIs(t, err, context.Canceled)
			assert.Equal(t, 2, st.Cleared)
			assert.Zero(t, c.count("a3"), "no Clear once the pass is cancelled")
			assert.Equal(t, map[string]int{"g2": 1, "a3": 1}, markerIDs(t, kv, "runs/"))
			clock.Advance(time.Hour)
			_, err = s.Pass(t.Context())
			require.NoError(t, err)
			assert.Zero(t, kv.Len())
		})
	}
}

// TestGoexitInRetryRangePage: a Clear on the pass's own goroutine that
// calls runtime.Goexit for a marker of the retry range (one that failed
// before and is due again): it fails again and waits for its next retry,
// every other marker of both ranges is cleared once, and the Stats count
// each marker once.
func TestGoexitInRetryRangePage(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 3} {
		for _, last := range []bool{false, true} {
			t.Run(fmt.Sprintf("concurrency=%d/last-page=%v", conc, last), func(t *testing.T) {
				t.Parallel()
				kv := NewMemKV()
				c := newClears()
				exit := false
				s, clock := newSweep(t, kv, Config{Concurrency: conc, PageSize: 2, Clear: func(ctx context.Context, id string) error {
					err := c.clear(ctx, id)
					if exit && id == "r1" {
						runtime.Goexit()
					}
					return err
				}})
				for _, id := range []string{"r0", "r1", "r2", "r3", "r4"} {
					c.set(id, errBoom)
				}
				for i, id := range []string{"r0", "r1", "r2", "r3", "r4"} {
					mark(t, kv, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
				}
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(t.Context())
				require.NoError(t, err)
				require.Equal(t, 5, st.Failed)
				require.Len(t, retryIDs(t, kv), 5)
				for _, id := range []string{"r0", "r1", "r2", "r3", "r4"} {
					c.set(id, nil)
				}
				if last {
					c.set("r0", errBoom) // the retry range's first page fails, r1 on... the first page still
				}
				exit = true
				// New expired markers too, and every retry due.
				for i := range 3 {
					mark(t, kv, "runs/", fmt.Sprintf("n%d", i), t0.Add(time.Hour+time.Duration(i)*time.Millisecond))
				}
				clock.Advance(2 * time.Hour)
				before := map[string]int{}
				for _, id := range []string{"r0", "r1", "r2", "r3", "r4", "n0", "n1", "n2"} {
					before[id] = c.count(id)
				}
				st, err = s.Pass(t.Context())
				require.NoError(t, err)
				for id, n := range before {
					assert.Equal(t, n+1, c.count(id), "Clear calls of %s in the pass", id)
				}
				wantFailed := 1
				if last {
					wantFailed = 2
				}
				assert.Equal(t, wantFailed, st.Failed)
				assert.Equal(t, 8-wantFailed, st.Cleared)
				assert.Zero(t, st.Deferred)
				assert.Len(t, retryIDs(t, kv), wantFailed)
				assert.Empty(t, markerIDs(t, kv, "runs/0"))
			})
		}
	}
}

// TestGoexitWithKeptContextAndLimiter: a Clear on the pass's own goroutine
// under ClearTimeout and a Limiter that keeps its context and calls
// runtime.Goexit: the context reads as done once the pass is over, whether
// the Clear consulted it before or not, and nothing is left running.
func TestGoexitWithKeptContextAndLimiter(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 4} {
		for _, consulted := range []bool{false, true} {
			t.Run(fmt.Sprintf("concurrency=%d/consulted=%v", conc, consulted), func(t *testing.T) {
				t.Parallel()
				kv := NewMemKV()
				var mu sync.Mutex
				kept := map[string]context.Context{}
				s, clock := newSweep(t, kv, Config{Concurrency: conc, PageSize: 3, ClearTimeout: time.Hour,
					Limiter: rate.NewLimiter(rate.Limit(10000), 1),
					Clear: func(ctx context.Context, id string) error {
						if consulted {
							_ = ctx.Err()
							_ = ctx.Done()
						}
						mu.Lock()
						kept[id] = ctx
						mu.Unlock()
						if id[0] == 'g' {
							runtime.Goexit()
						}
						return nil
					}})
				for i := range 10 {
					p := "a"
					if i%3 == 0 {
						p = "g"
					}
					mark(t, kv, "runs/", fmt.Sprintf("%s%d", p, i), t0.Add(time.Duration(i)*time.Millisecond))
				}
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(t.Context())
				require.NoError(t, err)
				assert.Equal(t, 4, st.Failed)
				assert.Equal(t, 6, st.Cleared)
				require.Len(t, kept, 10)
				for id, ctx := range kept {
					select {
					case <-ctx.Done():
					case <-time.After(5 * time.Second):
						t.Errorf("the kept context of %s is not done after the pass", id)
					}
					assert.Error(t, ctx.Err(), id)
				}
			})
		}
	}
}

// TestLeasedPassWithGoexitingClear: a LeasedPass over a fenced store,
// whose Clear calls runtime.Goexit on the pass's own goroutine, returns,
// releases the lease and has cleared the other markers.
func TestLeasedPassWithGoexitingClear(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 3} {
		t.Run(fmt.Sprint("concurrency=", conc), func(t *testing.T) {
			t.Parallel()
			mem := NewMemKV()
			locker := &fencingLocker{}
			rec := &recorder{}
			var log passLog
			c := newClears()
			s, clock := newSweep(t, mem, Config{Lease: locker, Observer: rec, OnPass: log.onPass, Concurrency: conc, PageSize: 2,
				Clear: func(ctx context.Context, id string) error {
					_ = c.clear(ctx, id)
					if id[0] == 'g' {
						runtime.Goexit()
					}
					return nil
				}})
			for i, id := range []string{"g0", "a1", "a2", "g3", "a4", "g5"} {
				mark(t, mem, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
			}
			clock.Advance(2 * time.Hour)
			st, err := s.LeasedPass(t.Context())
			require.NoError(t, err)
			assert.Equal(t, 3, st.Cleared)
			assert.Equal(t, 3, st.Failed)
			assert.Equal(t, 6, c.total())
			assert.False(t, locker.held(), "the lease is released")
			require.Equal(t, 1, log.len())
			assert.Equal(t, []string{"runs/ acquired", "runs/ released"}, rec.eventList())
			assert.Len(t, keysUnder(t, mem, "runs/"), 3, "the markers of g0, g3 and g5 stay")
		})
	}
}

// TestClearGoexitOnAnIDWithDuplicates: a Clear of an id with duplicates
// on its page that calls runtime.Goexit is settled as a failed clear (its
// markers kept, one retry key), as one that returns an error is; the page
// after it still finds its own duplicates.
func TestClearGoexitOnAnIDWithDuplicates(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"error", "Goexit"} {
		for _, conc := range []int{1, 3} {
			t.Run(fmt.Sprint(how, conc), func(t *testing.T) {
				t.Parallel()
				mem := NewMemKV()
				calls := newClears()
				clear := func(ctx context.Context, id string) error {
					_ = calls.clear(ctx, id)
					if id == "x" && calls.count("x") == 1 {
						if how == "Goexit" {
							runtime.Goexit()
						}
						return errBoom
					}
					return nil
				}
				s, clock := newSweep(t, mem, Config{Clear: clear, PageSize: 6, Concurrency: conc})
				for i, id := range []string{"x", "y", "x", "z", "x", "y", "y" /* page 2 from here */, "w", "y", "x"} {
					mark(t, mem, "runs/", id, t0.Add(time.Duration(i)*time.Millisecond))
				}
				clock.Set(t0.Add(2 * time.Hour))
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				t.Logf("%+v; left %v", st, keysUnder(t, mem, "runs/"))
				assert.Equal(t, 1, st.Failed)
				assert.Equal(t, 2, calls.count("y"), "y once a page")
				assert.Equal(t, 1, calls.count("z"))
				assert.Equal(t, 1, calls.count("w"))
				assert.Equal(t, 1+3, st.Duplicates, "page 1: y once and x's (with the failed first) twice; page 2: y once")
				// x's marker on page 2 waits for x's retry delay.
				assert.Equal(t, 1, calls.count("x"))
				assert.Equal(t, 1, st.Deferred)
			})
		}
	}
}
