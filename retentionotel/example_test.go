package retentionotel_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionotel"
)

// A sweep reports through an Observer; here the SDK's manual reader
// collects what an exporter would send. Options{} uses
// otel.GetMeterProvider() instead.
func ExampleNew() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	o, err := retentionotel.New(retentionotel.Options{MeterProvider: mp})
	if err != nil {
		fmt.Println(err)
		return
	}

	kv := retention.NewMemKV()
	for _, id := range []string{"run-1", "run-2"} {
		_ = retention.Mark(ctx, kv, "runs/done/", id, time.Now().Add(-30*24*time.Hour))
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Clear:     func(context.Context, string) error { return nil },
		Observer:  o,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	o.Watch(sweep) // report its backlog at each collection
	show := func() {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			fmt.Println(err)
			return
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "retention.backlog.markers" {
					fmt.Println(m.Name, g.DataPoints[0].Value)
				}
			}
		}
	}
	show()
	if _, err := sweep.Pass(ctx); err != nil {
		fmt.Println(err)
		return
	}
	show()
	// Output:
	// retention.backlog.markers 2
	// retention.backlog.markers 0
}
