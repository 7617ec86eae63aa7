package pgkv_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// wrapKV is a user's wrapper over a pgkv store: it embeds nothing, forwards
// every call, and counts the writes that went through after the lease was
// taken from its sweep.
type wrapKV struct {
	inner  retention.KV
	stolen *atomic.Bool

	tried, committed atomic.Int64 // writes after the theft
}

func (w *wrapKV) Unwrap() retention.KV { return w.inner }

func (w *wrapKV) note(err error) error {
	if w.stolen.Load() {
		w.tried.Add(1)
		if err == nil {
			w.committed.Add(1)
		}
	}
	return err
}

func (w *wrapKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	return w.inner.Scan(ctx, start, end, limit)
}

func (w *wrapKV) Delete(ctx context.Context, keys ...[]byte) error {
	return w.note(w.inner.Delete(ctx, keys...))
}

func (w *wrapKV) Put(ctx context.Context, key, value []byte) error {
	return w.note(w.inner.(retention.Putter).Put(ctx, key, value))
}

func (w *wrapKV) Move(ctx context.Context, from, to [][]byte) error {
	return w.note(w.inner.(retention.Mover).Move(ctx, from, to))
}

// wrapAtomicKV wraps an AtomicKV the same way.
type wrapAtomicKV struct{ *wrapKV }

func (w wrapAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return w.note(w.inner.(retention.ClearDeleter).ClearAndDelete(ctx, ids, keys))
}

// TestWrapperFenced: Run under a pgkv Locker over a wrapper of a pgkv
// store puts the lease's fence on the context of the wrapper's writes,
// and the store applies it: once the lease is taken from the holder behind
// its back, none of the holder's writes through the wrapper commits.
func TestWrapperFenced(t *testing.T) {
	for _, atomicClear := range []bool{false, true} {
		name := "KV"
		if atomicClear {
			name = "AtomicKV"
		}
		t.Run(name, func(t *testing.T) {
			pool := connect(t)
			markers := freshTable(t, pool)
			jobs, _ := jobsTable(t, pool, markers)
			leases := freshLeaseTable(t, pool)
			ctx := context.Background()
			kv, err := pgkv.New(pool, markers)
			require.NoError(t, err)
			finishJobs(t, pool, kv, jobs, 5, time.Now().Add(-2*time.Hour))

			var stolen atomic.Bool
			inClear, proceed := make(chan struct{}), make(chan struct{})
			var once sync.Once
			// The first clear waits while the lease is taken away; j00003
			// fails, so that its marker is rescheduled.
			hold := func(ids []string) error {
				once.Do(func() { close(inClear); <-proceed })
				for _, id := range ids {
					if id == "j00003" {
						return retention.BatchError{id: errors.New("poison")}
					}
				}
				return nil
			}
			w := &wrapKV{inner: kv, stolen: &stolen}
			var store retention.KV = w
			cfg := retention.Config{Prefix: "jobs/done/", Retention: time.Hour, BatchSize: 10,
				Logger: slog.New(slog.DiscardHandler)}
			if atomicClear {
				akv, err := kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
					if err := hold(ids); err != nil {
						return err
					}
					b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
					return nil
				})
				require.NoError(t, err)
				w.inner = akv
				store = wrapAtomicKV{w}
			} else {
				cfg.ClearBatch = func(ctx context.Context, ids []string) error {
					if err := hold(ids); err != nil {
						return err
					}
					_, err := pool.Exec(ctx, "DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
					return err
				}
			}
			// A long TTL: the holder's renewals (every third of it) do not
			// notice the theft before its writes go out.
			locker, err := pgkv.NewLocker(pool, "wrapped", &pgkv.LockerOptions{TTL: 30 * time.Second, Table: leases})
			require.NoError(t, err)
			cfg.Lease = locker
			passErrs := make(chan error, 16)
			cfg.OnPass = func(_ retention.Stats, err error) {
				select {
				case passErrs <- err:
				default:
				}
			}
			s, err := retention.New(store, cfg)
			require.NoError(t, err)

			runCtx, cancel := context.WithCancel(ctx)
			runDone := make(chan error, 1)
			go func() { runDone <- s.Run(runCtx) }()
			select {
			case <-inClear:
			case err := <-runDone:
				t.Fatalf("Run returned before clearing: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the sweep never cleared")
			}
			_, err = pool.Exec(ctx, "UPDATE "+leases+" SET holder = 'thief', fence = fence + 1, expires_at = clock_timestamp() + interval '1 hour'")
			require.NoError(t, err)
			stolen.Store(true)
			close(proceed)

			var passErr error
			select {
			case passErr = <-passErrs:
			case <-time.After(10 * time.Second):
				t.Fatal("the pass never ended")
			}
			cancel()
			require.ErrorIs(t, <-runDone, context.Canceled)

			t.Logf("pass after the theft: %v; writes tried %d, committed %d", passErr, w.tried.Load(), w.committed.Load())
			assert.ErrorIs(t, passErr, retention.ErrLeaseLost)
			assert.Positive(t, w.tried.Load(), "the holder wrote through the wrapper after the theft")
			assert.Zero(t, w.committed.Load(), "no write of the old holder committed after the theft")
			assert.Equal(t, 5, count(t, pool, markers), "every marker stays")
			if atomicClear {
				assert.Equal(t, 5, count(t, pool, jobs), "and every entity an atomic clear would have cleared")
			}
		})
	}
}
