package kvtest_test

import (
	"context"
	"testing"

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
