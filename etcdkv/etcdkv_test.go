package etcdkv_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/leasetest"
)

func TestMain(m *testing.M) {
	leasetest.ReplicaMain(connectReplica) // returns unless this process is a replica of TestProcesses
	goleak.VerifyTestMain(m)
}

func connect(t testing.TB) *clientv3.Client {
	t.Helper()
	addr := kvtest.ServerAddr(t, "RETENTION_ETCD_ENDPOINTS")
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(addr, ","), DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cli.Close()) })
	return cli
}

var nsSeq atomic.Int64

// freshNamespace returns a namespace whose keys are deleted when t ends.
func freshNamespace(t testing.TB, cli *clientv3.Client) string {
	ns := fmt.Sprintf("test-%d-%d/", os.Getpid(), nsSeq.Add(1))
	t.Cleanup(func() {
		_, err := cli.Delete(context.Background(), ns, clientv3.WithPrefix())
		assert.NoError(t, err)
	})
	return ns
}

func newStore(t testing.TB) kvtest.Store {
	cli := connect(t)
	ns := freshNamespace(t, cli)
	kv, err := etcdkv.New(cli, ns, nil)
	require.NoError(t, err)
	return kvtest.Store{
		KV:  kv,
		Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) },
		PutMany: func(ctx context.Context, keys [][]byte) error {
			for len(keys) > 0 {
				n := min(len(keys), etcdkv.DefaultMaxTxnOps)
				ops := make([]clientv3.Op, n)
				for i, k := range keys[:n] {
					ops[i] = clientv3.OpPut(ns+string(k), "")
				}
				if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					return err
				}
				keys = keys[n:]
			}
			return nil
		},
	}
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, newStore)
}

func BenchmarkSweep(b *testing.B) {
	kvtest.Benchmark(b, newStore)
}

func TestNew(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	require.NoError(t, err)
	defer cli.Close()
	tests := []struct {
		name    string
		kv      clientv3.KV
		ns      string
		opts    *etcdkv.Options
		wantErr string
	}{
		{"valid", cli, "svc/", nil, ""},
		{"max ops set", cli, "svc/", &etcdkv.Options{MaxTxnOps: 1000}, ""},
		{"nil client", nil, "svc/", nil, "etcdkv: client must not be nil"},
		{"empty namespace", cli, "", nil, "etcdkv: namespace must not be empty"},
		{"negative max ops", cli, "svc/", &etcdkv.Options{MaxTxnOps: -1}, "etcdkv: Options.MaxTxnOps must not be negative, got -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := etcdkv.New(tt.kv, tt.ns, tt.opts)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.Nil(t, kv)
				return
			}
			require.NoError(t, err)
		})
	}
}

func TestDeleteRespectsTxnLimit(t *testing.T) {
	cli := connect(t)
	ns := freshNamespace(t, cli)
	ctx := context.Background()
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k%04d", i)
	}
	put := func(kv *etcdkv.KV) {
		for _, k := range keys {
			require.NoError(t, kv.Put(ctx, k, nil))
		}
	}

	// Above the server's limit of 128 operations, a transaction is refused.
	tooBig, err := etcdkv.New(cli, ns, &etcdkv.Options{MaxTxnOps: 1000})
	require.NoError(t, err)
	put(tooBig)
	err = tooBig.Delete(ctx, keys...)
	require.ErrorContains(t, err, "too many operations")
	assert.ErrorContains(t, err, "etcdkv: delete 1000 keys")

	kv, err := etcdkv.New(cli, ns, nil)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, keys...))
	left, err := kv.Scan(ctx, []byte("k"), []byte("l"), 10)
	require.NoError(t, err)
	assert.Empty(t, left)
}

func TestMarkOpCommitsWithState(t *testing.T) {
	cli := connect(t)
	ns := freshNamespace(t, cli)
	kv, err := etcdkv.New(cli, ns, nil)
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	state := ns + "state/r1"

	// A transaction whose condition fails applies neither write.
	op, err := kv.MarkOp("runs/", "r1", now)
	require.NoError(t, err)
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(state), ">", 0)).
		Then(clientv3.OpPut(state, "succeeded"), op).
		Commit()
	require.NoError(t, err)
	require.False(t, resp.Succeeded)
	keys, err := kv.Scan(ctx, []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	assert.Empty(t, keys)

	_, err = kv.MarkOp("runs/", "r1", time.Unix(now.UnixMilli(), 0))
	require.ErrorIs(t, err, retention.ErrInvalidTime, "seconds taken for milliseconds")
	_, err = kv.MarkOp("runs/", "has space", now)
	require.ErrorIs(t, err, retention.ErrInvalidID)

	_, err = cli.Txn(ctx).Then(clientv3.OpPut(state, "succeeded"), op).Commit()
	require.NoError(t, err)
	keys, err = kv.Scan(ctx, []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	want, err := retention.MarkerKey("runs/", now, "r1")
	require.NoError(t, err)
	assert.Equal(t, [][]byte{want}, keys)
}

// TestEndToEnd keeps runs and markers in one etcd: 10,000 runs finish at
// spread-out times, each marked in the Txn that records its outcome, and a
// sweep clears exactly those past retention.
func TestEndToEnd(t *testing.T) {
	cli := connect(t)
	ns := freshNamespace(t, cli)
	kv, err := etcdkv.New(cli, ns, nil)
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const n, window = 10_000, 24 * time.Hour
	finished := func(i int) time.Time { return now.Add(-time.Duration(i) * 17 * time.Second) }
	stateKey := func(id string) string { return ns + "state/" + id }
	for first := 0; first < n; first += 50 {
		var ops []clientv3.Op
		for i := first; i < first+50; i++ {
			id := fmt.Sprintf("run-%05d", i)
			mark, err := kv.MarkOp("runs/done/", id, finished(i))
			require.NoError(t, err)
			ops = append(ops, clientv3.OpPut(stateKey(id), "succeeded"), mark)
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		require.NoError(t, err)
	}

	sweep, err := retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: window, Clock: retention.NewManualClock(now), Concurrency: 8,
		Clear: func(ctx context.Context, id string) error {
			_, err := cli.Delete(ctx, stateKey(id))
			return err
		},
	})
	require.NoError(t, err)
	st, err := sweep.Pass(ctx)
	require.NoError(t, err)

	resp, err := cli.Get(ctx, ns+"state/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	present := map[string]bool{}
	for _, kv := range resp.Kvs {
		present[string(kv.Key)] = true
	}
	wantCleared := 0
	for i := range n {
		expired := now.Sub(finished(i)) > window
		if expired {
			wantCleared++
		}
		id := fmt.Sprintf("run-%05d", i)
		assert.Equal(t, !expired, present[stateKey(id)], "%s finished %v ago", id, now.Sub(finished(i)))
	}
	assert.Equal(t, wantCleared, st.Cleared)
	markers, err := cli.Get(ctx, ns+"runs/done/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.Equal(t, int64(n-wantCleared), markers.Count)
}
