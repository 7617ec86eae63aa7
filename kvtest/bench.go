package kvtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// Benchmark measures a Sweep over stores made by newStore:
//
//   - clear/page=P/concurrency=C: one Pass clearing BenchMarkers expired
//     markers with a no-op Clear, for page sizes 256 and 1024 and
//     concurrency 1 and 16, reported as markers/s;
//   - idle/markers=N: a Pass with nothing expired while 10,000 or 100,000
//     unexpired markers wait, reported per pass; with a store that scans a
//     range in O(log n + page) the two cost the same.
//
// A store whose KV is a retention.ClearDeleter clears as a Sweep over it
// would: with its own clear (Config.Clear stays nil), and by runs when it
// is a retention.RunClearer and the concurrency is 1. Each sub-benchmark
// gets a fresh store. Filling it is not timed.
func Benchmark(b *testing.B, newStore Factory) {
	for _, page := range []int{256, 1024} {
		for _, conc := range []int{1, 16} {
			b.Run(fmt.Sprintf("clear/page=%d/concurrency=%d", page, conc), func(b *testing.B) {
				benchClear(b, newStore(b), page, conc)
			})
		}
	}
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("idle/markers=%d", n), func(b *testing.B) { benchIdle(b, newStore(b), n) })
	}
}

// BenchMarkers is how many expired markers each timed Pass of Benchmark clears.
const BenchMarkers = 10_000

var benchNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func benchClear(b *testing.B, s Store, page, conc int) {
	ctx := context.Background()
	sw, err := retention.New(s.KV, benchConfig(s, retention.Config{PageSize: page, Concurrency: conc}))
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		fillMarkers(b, s, BenchMarkers, benchNow.Add(-2*time.Hour))
		b.StartTimer()
		st, err := sw.Pass(ctx)
		b.StopTimer()
		if err != nil || st.Cleared != BenchMarkers {
			b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, BenchMarkers)
		}
	}
	b.ReportMetric(float64(BenchMarkers)*float64(b.N)/b.Elapsed().Seconds(), "markers/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(BenchMarkers*b.N), "ns/marker")
}

func benchIdle(b *testing.B, s Store, n int) {
	ctx := context.Background()
	fillMarkers(b, s, n, benchNow)
	sw, err := retention.New(s.KV, benchConfig(s, retention.Config{}))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var scanned int
	for i := 0; i < b.N; i++ {
		st, err := sw.Pass(ctx)
		if err != nil || st.Cleared != 0 {
			b.Fatalf("Pass() = %+v, %v; want nothing cleared", st, err)
		}
		scanned += st.Scanned
	}
	b.ReportMetric(float64(scanned)/float64(b.N), "keys/op")
}

// benchConfig completes cfg for a Sweep of Benchmark over s: a no-op Clear,
// unless s's KV clears itself (a ClearDeleter).
func benchConfig(s Store, cfg retention.Config) retention.Config {
	cfg.Prefix, cfg.Retention, cfg.Clock = "bench/", time.Hour, retention.NewManualClock(benchNow)
	if _, ok := s.KV.(retention.ClearDeleter); !ok {
		cfg.Clear = func(context.Context, string) error { return nil }
	}
	return cfg
}

// fillMarkers writes n markers a millisecond apart from start.
func fillMarkers(b *testing.B, s Store, n int, start time.Time) {
	b.Helper()
	ctx := context.Background()
	keys := make([][]byte, 0, n)
	for i := range n {
		key, err := retention.MarkerKey("bench/", start.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("id-%d", i))
		if err != nil {
			b.Fatal(err)
		}
		keys = append(keys, key)
	}
	if s.PutMany != nil {
		for len(keys) > 0 {
			chunk := keys[:min(len(keys), 1000)]
			if err := s.PutMany(ctx, chunk); err != nil {
				b.Fatal(err)
			}
			keys = keys[len(chunk):]
		}
		return
	}
	for _, k := range keys {
		if err := s.Put(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
}
