package boltkv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
)

// BenchmarkPassBolt is a pass over a bbolt file of 100,000 expired markers
// (10,000 with a transaction per entity),
// each beside its entity's key, cleared as a service would: a ClearBatch
// that deletes a batch's entity keys in one transaction, and a Clear that
// deletes one entity key per transaction. It reports ns/entity, the figure
// to weigh the core's own cost against (see BENCHMARKS.md).
func BenchmarkPassBolt(b *testing.B) {
	for _, tc := range []struct {
		name  string
		n     int
		batch bool
	}{
		{"ClearBatch", 100_000, true},
		{"Clear", 10_000, false}, // a transaction per entity: 100 times the cost
	} {
		b.Run(tc.name, func(b *testing.B) {
			db := openDB(b)
			kv, err := boltkv.New(db, "markers")
			if err != nil {
				b.Fatal(err)
			}
			entities := []byte("entities")
			del := func(tx *bbolt.Tx, id string) error { return tx.Bucket(entities).Delete([]byte("job/" + id)) }
			cfg := retention.Config{Prefix: "runs/", Retention: time.Hour}
			if tc.batch {
				cfg.BatchSize = 500
				cfg.PageSize = 1000
				cfg.ClearBatch = func(_ context.Context, ids []string) error {
					return db.Update(func(tx *bbolt.Tx) error {
						for _, id := range ids {
							if err := del(tx, id); err != nil {
								return err
							}
						}
						return nil
					})
				}
			} else {
				cfg.Clear = func(_ context.Context, id string) error {
					return db.Update(func(tx *bbolt.Tx) error { return del(tx, id) })
				}
			}
			s, err := retention.New(kv, cfg)
			if err != nil {
				b.Fatal(err)
			}
			old := time.Now().Add(-2 * time.Hour)
			var entityNs float64
			for b.Loop() {
				b.StopTimer()
				err := db.Update(func(tx *bbolt.Tx) error {
					eb, err := tx.CreateBucketIfNotExists(entities)
					if err != nil {
						return err
					}
					for i := range tc.n {
						id := fmt.Sprintf("job-%07d", i)
						if err := eb.Put([]byte("job/"+id), []byte("state")); err != nil {
							return err
						}
						if err := kv.MarkTx(tx, "runs/", id, old.Add(time.Duration(i)*time.Microsecond)); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				st, err := s.Pass(context.Background())
				if err != nil || st.Cleared != tc.n {
					b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, tc.n)
				}
				entityNs += float64(time.Since(start).Nanoseconds()) / float64(tc.n)
			}
			b.ReportMetric(entityNs/float64(b.N), "ns/entity")
		})
	}
}
