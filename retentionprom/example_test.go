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
