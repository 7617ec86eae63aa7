package pgkv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// BenchmarkPassAtomic is a pass of an atomic sweep (a pgkv.AtomicKV whose
// ClearFunc deletes the batch's jobs) over 100,000 expired jobs and their
// markers, with the default batch and page sizes. It reports ns/entity,
// the figure to weigh the core's own cost against (see BENCHMARKS.md).
func BenchmarkPassAtomic(b *testing.B) {
	const n = 100_000
	pool := connect(b)
	ctx := context.Background()
	table := freshTable(b, pool)
	jobs := table + "_jobs"
	if _, err := pool.Exec(ctx, "CREATE TABLE "+jobs+" (id text COLLATE \"C\" PRIMARY KEY, state text)"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs) })
	kv, err := pgkv.New(pool, table)
	if err != nil {
		b.Fatal(err)
	}
	akv, err := kv.WithClear(func(_ context.Context, batch *pgx.Batch, ids []string) error {
		batch.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	s, err := retention.New(akv, retention.Config{Prefix: "runs/", Retention: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	ids := make([]string, n)
	keys := make([][]byte, n)
	for i := range n {
		ids[i] = fmt.Sprintf("job-%07d", i)
		if keys[i], err = retention.MarkerKey("runs/", old.Add(time.Duration(i)*time.Microsecond), ids[i]); err != nil {
			b.Fatal(err)
		}
	}
	var entityNs float64
	for b.Loop() {
		b.StopTimer()
		if _, err := pool.Exec(ctx, "INSERT INTO "+jobs+" SELECT unnest($1::text[]), 'done'", ids); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+" SELECT unnest($1::bytea[])", keys); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+jobs+", "+table); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		st, err := s.Pass(ctx)
		if err != nil || st.Cleared != n {
			b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, n)
		}
		entityNs += float64(time.Since(start).Nanoseconds()) / n
	}
	b.ReportMetric(entityNs/float64(b.N), "ns/entity")
}
