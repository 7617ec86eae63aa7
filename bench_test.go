package retention

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// fill writes n markers "<prefix><t0+i ms>/m<i>" into a fresh MemKV.
func fill(b *testing.B, n int) *MemKV {
	b.Helper()
	kv := NewMemKV()
	refill(b, kv, n)
	return kv
}

// refill writes the markers of fill into kv.
func refill(b *testing.B, kv *MemKV, n int) {
	b.Helper()
	ctx := context.Background()
	buf := make([]byte, 0, 64)
	for i := range n {
		var err error
		buf, err = AppendMarkerKey(buf[:0], "runs/", t0.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("m%d", i))
		if err != nil {
			b.Fatal(err)
		}
		if err := kv.Put(ctx, buf, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIdlePass measures a pass with nothing expired: its cost must not
// grow with the number of markers waiting.
func BenchmarkIdlePass(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("markers=%d", n), func(b *testing.B) {
			kv := &fakeKV{canPut: true, MemKV: fill(b, n)}
			s, _ := newSweep(b, kv.store(), Config{Clear: func(context.Context, string) error { return nil }})
			ctx := context.Background()
			kv.reset()
			runtime.GC() // the fill's garbage is not the passes' to collect
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.Pass(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(kv.keys.Load())/float64(b.N), "keys/op")
			b.ReportMetric(float64(kv.scans.Load())/float64(b.N), "scans/op")
		})
	}
}

// BenchmarkPassClear measures a pass clearing 100,000 expired markers with a
// no-op Clear, against the floor: the same store emptied by a hand-written
// scan-and-delete loop with the same page size. ns/op is the pass alone;
// pass/floor is the ratio of the two (BENCHMARKS.md says what it may be).
// The timer runs during the passes only, so that b.N calibrates on them.
//
// One Sweep makes every pass, over one MemKV filled again each time, as a
// service's Sweep does: its buffers are grown by a first pass, not
// counted, and reused by the next. A Sweep made for each pass measured
// that growth instead (fresh memory to fault in: 4 to 8 ns a marker).
func BenchmarkPassClear(b *testing.B) {
	const n = 100_000
	for _, concurrency := range []int{1, 16} {
		b.Run(fmt.Sprintf("concurrency=%d", concurrency), func(b *testing.B) {
			ctx := context.Background()
			var passNs, floorNs time.Duration
			var passAllocs, floorAllocs uint64
			var ms runtime.MemStats
			measure := func(timed bool, f func()) (time.Duration, uint64) {
				runtime.GC() // both start from a collected heap
				runtime.ReadMemStats(&ms)
				before := ms.Mallocs
				if timed {
					b.StartTimer()
				}
				start := time.Now()
				f()
				d := time.Since(start)
				if timed {
					b.StopTimer()
				}
				runtime.ReadMemStats(&ms)
				return d, ms.Mallocs - before
			}
			passKV, floorKV := NewMemKV(), NewMemKV()
			s, clock := newSweep(b, passKV, Config{Concurrency: concurrency, Clear: func(context.Context, string) error { return nil }})
			clock.Set(t0.Add(24 * time.Hour))
			pass := func() {
				refill(b, passKV, n)
				d, a := measure(true, func() {
					st, err := s.Pass(ctx)
					if err != nil || st.Cleared != n {
						b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, n)
					}
				})
				passNs, passAllocs = passNs+d, passAllocs+a
			}
			floor := func() {
				kv := floorKV
				refill(b, kv, n)
				cutoff := appendTimestamp([]byte("runs/"), uint64(t0.Add(time.Hour).UnixMilli()))
				d, a := measure(false, func() {
					from := []byte("runs/0")
					for {
						keys, err := kv.Scan(ctx, from, cutoff, DefaultPageSize)
						if err != nil {
							b.Fatal(err)
						}
						if len(keys) > 0 {
							if err := kv.Delete(ctx, keys...); err != nil {
								b.Fatal(err)
							}
						}
						if len(keys) < DefaultPageSize {
							break
						}
						from = append(keys[len(keys)-1], 0)
					}
				})
				floorNs, floorAllocs = floorNs+d, floorAllocs+a
				if kv.Len() != 0 {
					b.Fatalf("floor left %d markers", kv.Len())
				}
			}
			b.StopTimer()
			refill(b, passKV, n) // the first pass, which grows the buffers, is not counted
			if _, err := s.Pass(ctx); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < b.N; i++ {
				// The two take turns, so that neither always runs on the
				// heap the other left.
				if i%2 == 0 {
					pass()
					floor()
				} else {
					floor()
					pass()
				}
			}
			markers := float64(n) * float64(b.N)
			b.ReportMetric(float64(passNs)/float64(b.N), "ns/op")
			b.ReportMetric(float64(passNs)/markers, "ns/marker")
			b.ReportMetric(float64(passAllocs)/markers, "allocs/marker")
			b.ReportMetric(float64(floorNs)/markers, "floor-ns/marker")
			b.ReportMetric(float64(floorAllocs)/markers, "floor-allocs/marker")
			b.ReportMetric(float64(passNs)/float64(floorNs), "pass/floor")
		})
	}
}

// pagesKV hands out prepared pages and deletes nothing: a store that costs
// (almost) nothing, so that a pass over it measures the sweep's own work.
type pagesKV struct {
	pages [][][]byte
	next  int
}

func (p *pagesKV) Scan(context.Context, []byte, []byte, int) ([][]byte, error) {
	if p.next >= len(p.pages) {
		return nil, nil
	}
	p.next++
	return p.pages[p.next-1], nil
}

func (p *pagesKV) Delete(context.Context, ...[]byte) error { return nil }

// BenchmarkPassOverhead measures the sweep's own cost per marker: parsing,
// validation, the Clear call and the bookkeeping, without a store.
func BenchmarkPassOverhead(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	mem := fill(b, n)
	pk := &pagesKV{}
	from := []byte("runs/0")
	for {
		keys, err := mem.Scan(ctx, from, []byte("runs:"), DefaultPageSize)
		if err != nil {
			b.Fatal(err)
		}
		pk.pages = append(pk.pages, keys)
		if len(keys) < DefaultPageSize {
			break
		}
		from = append(keys[len(keys)-1], 0)
	}
	s, clock := newSweep(b, pk, Config{Clear: func(context.Context, string) error { return nil }})
	clock.Set(t0.Add(24 * time.Hour))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		pk.next = 0
		st, err := s.Pass(ctx)
		if err != nil || st.Cleared != n {
			b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*b.N), "ns/marker")
}
