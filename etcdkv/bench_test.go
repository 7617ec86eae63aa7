package etcdkv_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
)

var benchNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// countingKV is a clientv3.KV that records, for every ranged Get, the
// response's Count: the number of live keys the server counted in the
// requested range, which is what an etcd range request costs on the server
// (its index walk visits every one of them whatever the limit).
type countingKV struct {
	clientv3.KV
	mu     sync.Mutex
	counts []int64
}

func (c *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := c.KV.Get(ctx, key, opts...)
	if err == nil {
		c.mu.Lock()
		c.counts = append(c.counts, resp.Count)
		c.mu.Unlock()
	}
	return resp, err
}

// take returns the counts recorded since the last call and forgets them.
func (c *countingKV) take() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.counts
	c.counts = nil
	return out
}

// benchKV returns a KV over a fresh namespace through a countingKV, and a
// function that writes keys there in transactions.
func benchKV(tb testing.TB) (*etcdkv.KV, *countingKV, func(keys [][]byte)) {
	kv, ckv, put, _ := benchKVs(tb)
	return kv, ckv, put
}

// benchKVs is benchKV, and also returns a function that makes another KV,
// with nothing learned, over the same namespace.
func benchKVs(tb testing.TB) (*etcdkv.KV, *countingKV, func(keys [][]byte), func() *etcdkv.KV) {
	tb.Helper()
	cli := connect(tb)
	ns := freshNamespace(tb, cli)
	ckv := &countingKV{KV: cli}
	fresh := func() *etcdkv.KV {
		kv, err := etcdkv.New(ckv, ns, nil)
		if err != nil {
			tb.Fatal(err)
		}
		return kv
	}
	kv := fresh()
	put := func(keys [][]byte) {
		for len(keys) > 0 {
			n := min(len(keys), etcdkv.DefaultMaxTxnOps)
			ops := make([]clientv3.Op, n)
			for i, k := range keys[:n] {
				ops[i] = clientv3.OpPut(ns+string(k), "")
			}
			if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
				tb.Fatal(err)
			}
			keys = keys[n:]
		}
	}
	return kv, ckv, put, fresh
}

// markers returns n marker keys under prefix, a millisecond apart from start.
func markers(tb testing.TB, prefix string, n int, start time.Time) [][]byte {
	tb.Helper()
	keys := make([][]byte, n)
	for i := range keys {
		k, err := retention.MarkerKey(prefix, start.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("id-%d", i))
		if err != nil {
			tb.Fatal(err)
		}
		keys[i] = k
	}
	return keys
}

func sum(xs []int64) (s int64) {
	for _, x := range xs {
		s += x
	}
	return s
}

// BenchmarkIdlePass times a Pass with nothing expired while n markers wait,
// the oldest an hour past the cutoff (the shape of kvtest's idle benchmark).
// The first pass of a KV is reported apart (first-pass-µs) since it may
// have to look for the markers; keys-counted/op is the sum of the Count of
// every range response, the keys etcd's index walk counted for the pass;
// empty-get-µs is what one request over an empty range costs the server
// then (see emptyGet).
func BenchmarkIdlePass(b *testing.B) {
	for _, size := range []struct{ n, others int }{{1_000, 0}, {10_000, 0}, {100_000, 0}, {1_000, 99_000}} {
		name := fmt.Sprintf("markers=%d", size.n)
		if size.others > 0 {
			// A control: as many keys in the store as at 100,000
			// markers, but outside the sweep's ranges.
			name += fmt.Sprintf("/others=%d", size.others)
		}
		b.Run(name, func(b *testing.B) {
			kv, ckv, put := benchKV(b)
			put(markers(b, "bench/", size.n, benchNow))
			put(markers(b, "other/", size.others, benchNow))
			settle(b, ckv.KV.(*clientv3.Client))
			sw, err := retention.New(kv, retention.Config{
				Prefix: "bench/", Retention: time.Hour,
				Clock: retention.NewManualClock(benchNow),
				Clear: func(context.Context, string) error { return nil },
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			t0 := time.Now()
			if _, err := sw.Pass(ctx); err != nil {
				b.Fatal(err)
			}
			first, firstKeys := time.Since(t0), sum(ckv.take())
			floor := emptyGet(b, ckv.KV)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				st, err := sw.Pass(ctx)
				if err != nil || st.Cleared != 0 {
					b.Fatalf("Pass() = %+v, %v; want nothing cleared", st, err)
				}
			}
			b.StopTimer()
			counts := ckv.take()
			// After ResetTimer, which drops metrics reported before it.
			b.ReportMetric(float64(first.Microseconds()), "first-pass-µs")
			b.ReportMetric(float64(firstKeys), "first-pass-keys-counted")
			b.ReportMetric(float64(floor.Nanoseconds())/1e3, "empty-get-µs")
			b.ReportMetric(float64(len(counts))/float64(b.N), "requests/op")
			b.ReportMetric(float64(sum(counts))/float64(b.N), "keys-counted/op")
		})
	}
}

// settle lets the server shed the read buffer the fill grew: etcd 3.4 and
// 3.5 copy the backend's read buffer, at the largest size a batch of writes
// gave it (up to --backend-batch-limit entries), on every read, whatever
// its range, and it shrinks only after a backend commit that writes no key,
// such as a lease grant's. It does not undo everything a fill of 100,000
// keys leaves (empty-get-µs still rises with it on this machine).
func settle(b *testing.B, cli *clientv3.Client) {
	b.Helper()
	if _, err := cli.Grant(context.Background(), 5); err != nil {
		b.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the 100ms backend batch interval
}

// emptyGet returns the mean time of a ranged Get of an empty range outside
// every namespace: the server's floor for one request at the time. On etcd
// 3.4 and 3.5 it rises after a burst of writes, because every read copies
// the backend's read buffer at its grown size (fixed in 3.6 by
// etcd-io/etcd@b05d75ab0), whatever the range.
func emptyGet(b *testing.B, kv clientv3.KV) time.Duration {
	const n = 50
	t0 := time.Now()
	for range n {
		if _, err := kv.Get(context.Background(), "~empty", clientv3.WithRange("~empty~"), clientv3.WithLimit(1)); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(t0) / n
}

// timedKV times every Scan of the KV it wraps.
type timedKV struct {
	retention.KV
	mu    sync.Mutex
	scans []time.Duration
}

func (t *timedKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	t0 := time.Now()
	keys, err := t.KV.Scan(ctx, start, end, limit)
	d := time.Since(t0)
	t.mu.Lock()
	t.scans = append(t.scans, d)
	t.mu.Unlock()
	return keys, err
}

// BenchmarkDrain times one Pass clearing 100,000 expired markers a
// millisecond apart, 256 to a page, with a no-op Clear, and reports the
// Scan time of the first page (scan-µs-first), the mean of the next ten,
// the middle ten and the last ten pages (scan-µs-start, -mid, -end), the
// keys etcd counted for the first range request (first-keys-counted) and
// the most for any later one (max-keys-counted-after): with a Scan in
// O(keys in range) the first pages cost far more than the last.
func BenchmarkDrain(b *testing.B) {
	const n, page = 100_000, 256
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		kv, ckv, put := benchKV(b)
		put(markers(b, "bench/", n, benchNow.Add(-2*time.Hour)))
		tkv := &timedKV{KV: kv}
		sw, err := retention.New(tkv, retention.Config{
			Prefix: "bench/", Retention: time.Hour, PageSize: page,
			Clock: retention.NewManualClock(benchNow),
			Clear: func(context.Context, string) error { return nil },
		})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		st, err := sw.Pass(context.Background())
		b.StopTimer()
		if err != nil || st.Cleared != n {
			b.Fatalf("Pass() = %+v, %v; want %d cleared", st, err, n)
		}
		pages := tkv.scans[:len(tkv.scans)-1] // the last Scan is the peek
		mean := func(ds []time.Duration) float64 {
			var s time.Duration
			for _, d := range ds {
				s += d
			}
			return float64(s.Microseconds()) / float64(len(ds))
		}
		mid := len(pages) / 2
		b.ReportMetric(float64(pages[0].Microseconds()), "scan-µs-first")
		b.ReportMetric(mean(pages[1:11]), "scan-µs-start")
		b.ReportMetric(mean(pages[mid-5:mid+5]), "scan-µs-mid")
		b.ReportMetric(mean(pages[len(pages)-10:]), "scan-µs-end")
		b.ReportMetric(float64(len(pages)), "pages")
		counts := ckv.take()
		var most int64
		for _, c := range counts[1:] {
			most = max(most, c)
		}
		b.ReportMetric(float64(counts[0]), "first-keys-counted")
		b.ReportMetric(float64(most), "max-keys-counted-after")
		b.ReportMetric(float64(len(counts)), "requests")
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*(n/page+1)), "µs/page")
}
