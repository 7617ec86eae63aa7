package retentionotel_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
)

// BenchmarkPassWithObserver measures a pass clearing 100,000 markers on
// MemKV without an observer and with an Observer on the SDK, alternating
// the two in one run (-benchtime 50x or more). The metric API has no bulk
// record, so each lag is one Record: this costs more than retentionprom.
//
// The sub-benchmarks differ in the SDK's exemplar filter, the application's
// choice: trace_based (the SDK's default) offers every measurement to the
// exemplar reservoir, after looking for a sampled span in its context;
// always_off (sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter), or
// OTEL_METRICS_EXEMPLAR_FILTER=always_off) skips that.
func BenchmarkPassWithObserver(b *testing.B) {
	for _, f := range []struct {
		name   string
		filter exemplar.Filter
	}{{"exemplars=trace_based", exemplar.TraceBasedFilter}, {"exemplars=always_off", exemplar.AlwaysOffFilter}} {
		b.Run(f.name, func(b *testing.B) { benchmarkPassWithObserver(b, f.filter) })
	}
}

func benchmarkPassWithObserver(b *testing.B, filter exemplar.Filter) {
	const n = 100_000
	ctx := context.Background()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()), sdkmetric.WithExemplarFilter(filter))
	defer func() { _ = mp.Shutdown(ctx) }()
	o, err := retentionotel.New(retentionotel.Options{MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
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
		var p, o2 time.Duration
		if i%2 == 0 {
			p, o2 = run(nil), run(o)
		} else {
			o2, p = run(o), run(nil)
		}
		plain, observed = plain+p, observed+o2
		ratios = append(ratios, float64(o2)/float64(p))
	}
	slices.Sort(ratios)
	markers := float64(n) * float64(b.N)
	b.ReportMetric(float64(plain)/markers, "plain-ns/marker")
	b.ReportMetric(float64(observed)/markers, "observed-ns/marker")
	b.ReportMetric(float64(observed)/float64(plain), "observed/plain")
	b.ReportMetric(ratios[len(ratios)/2], "median-observed/plain")
}
