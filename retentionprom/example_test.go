package retentionprom_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/retentionprom"
	"github.com/prometheus/client_golang/prometheus"
)

func ExampleCollector() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	clock := retention.NewManualClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	for _, id := range []string{"a", "b", "c"} {
		_ = retention.Mark(ctx, kv, "runs/done/", id, clock.Now())
	}

	metrics, _ := retentionprom.New(retentionprom.Options{})
	sweep, _ := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: time.Hour,
		Clock:     clock,
		Clear:     func(context.Context, string) error { return nil },
		Observer:  metrics,
		Logger:    slog.New(slog.DiscardHandler),
	})
	metrics.Watch(sweep)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics) // serve it with promhttp.HandlerFor(reg, ...)

	show := func() {
		families, _ := reg.Gather()
		for _, f := range families {
			for _, m := range f.GetMetric() {
				switch f.GetName() {
				case "retention_backlog_age_seconds":
					fmt.Printf("%s %v\n", f.GetName(), m.GetGauge().GetValue())
				case "retention_clear_lag_seconds":
					fmt.Printf("%s count %d, sum %v\n", f.GetName(), m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum())
				}
			}
		}
	}
	clock.Advance(time.Hour + 90*time.Second) // due 90s ago
	show()
	_, _ = sweep.Pass(ctx)
	show()
	// Output:
	// retention_backlog_age_seconds 90
	// retention_clear_lag_seconds count 0, sum 0
	// retention_backlog_age_seconds 0
	// retention_clear_lag_seconds count 3, sum 270
}

// sweepWithMetrics makes a sweep that reports to Prometheus through reg
// (prometheus.DefaultRegisterer in most services).
func sweepWithMetrics(reg prometheus.Registerer, kv retention.KV, clearRun func(context.Context, string) error) (*retention.Sweep, error) {
	metrics, err := retentionprom.New(retentionprom.Options{})
	if err != nil {
		return nil, err
	}
	sweep, err := retention.New(kv, retention.Config{Prefix: "runs/done/", Retention: 7 * 24 * time.Hour, Clear: clearRun, Observer: metrics})
	if err != nil {
		return nil, err
	}
	metrics.Watch(sweep)      // report its backlog, read at each scrape
	reg.MustRegister(metrics) // then serve reg at /metrics: promhttp.HandlerFor, or promhttp.Handler() for the default registry
	return sweep, nil
}

// The metrics of a sweep with two markers due and none cleared yet.
func ExampleNew() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	for _, id := range []string{"run-1", "run-2"} {
		_ = retention.Mark(ctx, kv, "runs/done/", id, time.Now().Add(-30*24*time.Hour))
	}
	reg := prometheus.NewRegistry()
	if _, err := sweepWithMetrics(reg, kv, func(context.Context, string) error { return nil }); err != nil {
		fmt.Println(err)
		return
	}
	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range families {
		if f.GetName() == "retention_backlog_markers" {
			for _, m := range f.GetMetric() {
				fmt.Println(f.GetName(), m.GetLabel()[0].GetValue(), m.GetGauge().GetValue())
			}
		}
	}
	// Output:
	// retention_backlog_markers runs/done/ 2
}
