package kvtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
)

// memStore is a kvtest.Factory: every call returns a fresh, empty store.
// An adapter connects to its engine here, on a table, key or namespace of
// the test's own, and removes it with t.Cleanup.
func memStore(t testing.TB) kvtest.Store {
	kv := retention.NewMemKV()
	return kvtest.Store{
		KV:  kv,
		Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) },
	}
}

// An adapter's test file runs the suite, and the benchmark, with its
// factory: TestConformance and BenchmarkSweep below are what it declares
// (this package's own tests run them with memStore).
func ExampleRun() {
	TestConformance := func(t *testing.T) { kvtest.Run(t, memStore) }
	BenchmarkSweep := func(b *testing.B) { kvtest.Benchmark(b, memStore) }
	_, _ = TestConformance, BenchmarkSweep
}

// memIDRule is what an adapter's test passes to kvtest.CustomIDRule. Here
// orders and markers live in memOrders (in this package's tests), whose
// transactions keep their writes until they commit; an adapter writes in
// its engine's transactions with MarkTx and MarkKeyTx (MarkOp and MarkKeyOp
// in an etcd Txn), and its Finish is the finishOrder of its examples.
func memIDRule(o *memOrders) kvtest.IDRuleHarness {
	return kvtest.IDRuleHarness{
		KV: o.kv,
		MarkDefault: func(ctx context.Context, prefix, id string, at time.Time) error {
			return o.update(ctx, func(tx *memTx) error { return o.markTx(tx, prefix, id, at) })
		},
		Finish: func(ctx context.Context, sweep *retention.Sweep, id string, at time.Time) error {
			key, err := sweep.MarkerKey(at, id)
			if err != nil {
				return err
			}
			return o.update(ctx, func(tx *memTx) error {
				tx.states[id] = "shipped"
				return o.markKeyTx(tx, key)
			})
		},
		Abandon: func(ctx context.Context, id string, key []byte) error {
			err := o.update(ctx, func(tx *memTx) error {
				tx.states[id] = "shipped"
				if err := o.markKeyTx(tx, key); err != nil {
					return err
				}
				return errAbandon
			})
			if errors.Is(err, errAbandon) {
				return nil
			}
			return err
		},
		Shipped: func(ctx context.Context, id string) (bool, error) { return o.state(id) == "shipped", nil },
		Clear:   func(ctx context.Context, id string) error { o.clear(id); return nil },
	}
}

// An adapter's test file checks that a sweep with its own id rule works
// with the adapter's transactions: TestCustomIDRule below is what it
// declares (this package's own tests run it with memIDRule).
func ExampleCustomIDRule() {
	TestCustomIDRule := func(t *testing.T) { kvtest.CustomIDRule(t, memIDRule(newMemOrders(""))) }
	_ = TestCustomIDRule
}
