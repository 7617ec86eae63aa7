package retentionprom_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkPassWithCollector measures a pass clearing 100,000 markers on
// MemKV without an observer and with a registered Collector, alternating
// the two in one run. Run it with -benchtime 50x or more: observed/plain is
// the ratio of their costs, median-observed/plain the median of the pairs'.
func BenchmarkPassWithCollector(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	c, err := retentionprom.New(retentionprom.Options{})
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	run := func(obs retention.Observer) time.Duration {
		kv := retention.NewMemKV()
		for i := range n {
			if err := retention.Mark(ctx, kv, "runs/", fmt.Sprintf("m%d", i), t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
				b.Fatal(err)
			}
		}
		s, err := retention.New(kv, retention.Config{Prefix: "runs/", Retention: time.Hour, Logger: quiet, Observer: obs,
			Clock: retention.NewManualClock(t0.Add(24 * time.Hour)), Clear: func(context.Context, string) error { return nil }})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		start := time.Now()
		st, err := s.Pass(ctx)
		d := time.Since(start)
		if err != nil || st.Cleared != n {
			b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, n)
		}
		return d
	}
	var plain, observed time.Duration
	var ratios []float64
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		var p, o time.Duration
		if i%2 == 0 {
			p, o = run(nil), run(c)
		} else {
			o, p = run(c), run(nil)
		}
		plain, observed = plain+p, observed+o
		ratios = append(ratios, float64(o)/float64(p))
	}
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "retention_clear_lag_seconds" {
			if got := f.GetMetric()[0].GetHistogram().GetSampleCount(); got != uint64(n*b.N) {
				b.Fatalf("lag histogram count = %d, want %d", got, n*b.N)
			}
		}
	}
	slices.Sort(ratios)
	markers := float64(n) * float64(b.N)
	b.ReportMetric(float64(plain)/markers, "plain-ns/marker")
	b.ReportMetric(float64(observed)/markers, "observed-ns/marker")
	b.ReportMetric(float64(observed)/float64(plain), "observed/plain")
	b.ReportMetric(ratios[len(ratios)/2], "median-observed/plain")
}
