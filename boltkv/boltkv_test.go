package boltkv_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.uber.org/goleak"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
	"github.com/marksweep/retention/kvtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func openDB(t testing.TB) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "test.db"), 0o600, &bbolt.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

func newStore(t testing.TB) kvtest.Store {
	db := openDB(t)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	return kvtest.Store{
		KV:  kv,
		Put: func(ctx context.Context, key []byte) error { return kv.Put(ctx, key, nil) },
		PutMany: func(_ context.Context, keys [][]byte) error {
			return db.Update(func(tx *bbolt.Tx) error {
				b := tx.Bucket([]byte("markers"))
				for _, k := range keys {
					if err := b.Put(k, nil); err != nil {
						return err
					}
				}
				return nil
			})
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
	db := openDB(t)
	tests := []struct {
		name    string
		db      *bbolt.DB
		bucket  string
		wantErr string
	}{
		{"valid", db, "markers", ""},
		{"existing bucket", db, "markers", ""},
		{"nil db", nil, "markers", "boltkv: db must not be nil"},
		{"empty bucket", db, "", "boltkv: bucket name must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := boltkv.New(tt.db, tt.bucket)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				assert.Nil(t, kv)
				return
			}
			require.NoError(t, err)
			assert.NotNil(t, kv)
		})
	}
}

func TestBucketDeleted(t *testing.T) {
	db := openDB(t)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte("markers")) }))
	ctx := context.Background()
	_, err = kv.Scan(ctx, []byte("a"), []byte("b"), 1)
	require.ErrorIs(t, err, boltkv.ErrNoBucket)
	require.ErrorIs(t, kv.Delete(ctx, []byte("a")), boltkv.ErrNoBucket)
	require.ErrorIs(t, kv.Put(ctx, []byte("a"), nil), boltkv.ErrNoBucket)
}

func TestClosedDB(t *testing.T) {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "c.db"), 0o600, nil)
	require.NoError(t, err)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = kv.Scan(context.Background(), []byte("a"), []byte("b"), 1)
	require.ErrorIs(t, err, bolterrors.ErrDatabaseNotOpen)
	assert.Contains(t, err.Error(), "boltkv: scan")
}

func TestMarkTxCommitsWithState(t *testing.T) {
	db := openDB(t)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	errAbort := errors.New("abort")

	// A transaction that fails after marking leaves neither state nor marker.
	err = db.Update(func(tx *bbolt.Tx) error {
		runs, err := tx.CreateBucketIfNotExists([]byte("runs"))
		require.NoError(t, err)
		require.NoError(t, runs.Put([]byte("r1"), []byte("done")))
		require.NoError(t, kv.MarkTx(tx, "runs/", "r1", now))
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	keys, err := kv.Scan(context.Background(), []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	assert.Empty(t, keys)

	err = db.Update(func(tx *bbolt.Tx) error { return kv.MarkTx(tx, "runs/", "", now) })
	require.ErrorIs(t, err, retention.ErrInvalidID)
	err = db.Update(func(tx *bbolt.Tx) error { return kv.MarkTx(tx, "runs/", "r1", time.Unix(now.UnixMilli(), 0)) })
	require.ErrorIs(t, err, retention.ErrInvalidTime, "seconds taken for milliseconds")
	err = db.Update(func(tx *bbolt.Tx) error { return kv.MarkTx(tx, "runs/", "r1", now) })
	require.NoError(t, err)
	keys, err = kv.Scan(context.Background(), []byte("runs/"), []byte("runs0"), 10)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	want, _ := retention.MarkerKey("runs/", now, "r1")
	assert.Equal(t, want, keys[0])
}

// TestEndToEnd keeps entity state and markers in one database: 10,000 runs
// finish at spread-out times, each marked in the transaction that records
// it, and a sweep clears exactly those past retention.
func TestEndToEnd(t *testing.T) {
	db := openDB(t)
	kv, err := boltkv.New(db, "markers")
	require.NoError(t, err)
	runs := []byte("runs")
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const n, retentionWindow = 10_000, 24 * time.Hour
	finished := func(i int) time.Time { return now.Add(-time.Duration(i) * 17 * time.Second) } // up to ~47h ago
	err = db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(runs)
		if err != nil {
			return err
		}
		for i := range n {
			id := fmt.Sprintf("run-%05d", i)
			if err := b.Put([]byte(id), []byte("outcome")); err != nil {
				return err
			}
			if err := kv.MarkTx(tx, "runs/done/", id, finished(i)); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)

	sweep, err := retention.New(kv, retention.Config{
		Prefix: "runs/done/", Retention: retentionWindow, Clock: retention.NewManualClock(now),
		Clear: func(_ context.Context, id string) error {
			return db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(runs).Delete([]byte(id)) })
		},
	})
	require.NoError(t, err)
	st, err := sweep.Pass(context.Background())
	require.NoError(t, err)

	wantCleared := 0
	err = db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(runs)
		for i := range n {
			expired := now.Sub(finished(i)) > retentionWindow
			if expired {
				wantCleared++
			}
			got := b.Get([]byte(fmt.Sprintf("run-%05d", i)))
			assert.Equal(t, expired, got == nil, "run-%05d (finished %v ago): state present = %v", i, now.Sub(finished(i)), got != nil)
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, wantCleared, st.Cleared)
	assert.Greater(t, wantCleared, 4000)
	assert.Less(t, wantCleared, n)
	left, err := kv.Scan(context.Background(), []byte("runs/done/"), []byte("runs/done0"), n)
	require.NoError(t, err)
	assert.Len(t, left, n-wantCleared)
}
