package sqlkv_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// TestTableTwoSweepersWithoutALeaseClearEachRowOnce runs two sweepers' runs and pages over
// one AtomicTableKV, with no lease, while rows finish: every row is
// cleared exactly once, by the transaction that deletes it.
func TestTableTwoSweepersWithoutALeaseClearEachRowOnce(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		audit := j.name + "_audit"
		_, err := j.db.ExecContext(ctx, "CREATE TABLE "+audit+" (id BIGINT NOT NULL)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = j.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+audit) })
		kv := j.kv(t)
		a := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
			for _, id := range ids {
				n, err := strconv.ParseInt(id, 10, 64)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+audit+" (id) VALUES (?)"), n); err != nil {
					return err
				}
			}
			return nil
		})
		base := time.UnixMilli(1_700_000_000_000)
		const total = 300
		at := func(id int64) time.Time {
			// Three rows a millisecond, later ids first in it.
			d := time.Duration(id/3) * time.Millisecond
			if j.unit == sqlkv.Timestamp {
				d -= time.Duration(id%3) * 200 * time.Microsecond
			}
			return base.Add(d)
		}
		for id := int64(0); id < total/2; id++ {
			j.finish(t, id, "done", at(id))
		}
		end := []byte(tablePrefix + ":")
		var wg sync.WaitGroup
		done := make(chan struct{})
		wg.Add(1)
		go func() { // rows finish meanwhile
			defer wg.Done()
			for id := int64(total / 2); id < total; id++ {
				_, err := j.db.ExecContext(ctx, q(dl.d, "INSERT INTO "+j.name+" (id, state, finished) VALUES (?, 'done', ?)"), id, j.timeArg(at(id)))
				assert.NoError(t, err)
			}
		}()
		var calls, failed sync.Map
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-done:
						return
					default:
					}
					var err error
					if (i+w)%3 == 0 { // a page read and cleared
						var keys [][]byte
						keys, err = a.Scan(ctx, []byte(tablePrefix), end, 5)
						if err == nil && len(keys) > 0 {
							ids := make([]string, len(keys))
							for k, key := range keys {
								_, id, _ := retention.ParseMarkerKey(tablePrefix, key)
								ids[k] = string(id)
							}
							err = a.ClearAndDelete(ctx, ids, keys)
						}
					} else {
						_, err = a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), end, 1+(i%7))
					}
					calls.Store(i, true)
					if err != nil && !errors.Is(err, retention.ErrMarkerGone) {
						failed.Store(err.Error(), true)
					}
				}
			}()
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			var n, inserted int
			require.NoError(t, j.db.QueryRowContext(ctx, "SELECT count(*) FROM "+j.name).Scan(&n))
			require.NoError(t, j.db.QueryRowContext(ctx, "SELECT count(*) FROM "+audit).Scan(&inserted))
			if n == 0 && inserted >= total || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(done)
		wg.Wait()
		failed.Range(func(k, _ any) bool { t.Logf("a call failed: %v", k); return true })
		rows, err := j.db.QueryContext(ctx, "SELECT id, count(*) FROM "+audit+" GROUP BY id")
		require.NoError(t, err)
		defer rows.Close()
		cleared := map[int64]int{}
		for rows.Next() {
			var id int64
			var c int
			require.NoError(t, rows.Scan(&id, &c))
			cleared[id] = c
		}
		require.NoError(t, rows.Err())
		var twice []int64
		for id, c := range cleared {
			if c != 1 {
				twice = append(twice, id)
			}
		}
		slices.Sort(twice)
		assert.Empty(t, twice, "ids cleared more than once")
		assert.Len(t, cleared, total, "ids cleared")
		jobs, _ := j.ids(t)
		assert.Empty(t, jobs, "rows left")
	})
}

// TestTableRunsAgainstMovesClearEachRowOnce runs an AtomicTableKV's runs while
// another client moves the rows' markers to retry keys and back, and a
// third clears the retry keys, with no lease: each row is cleared once.
func TestTableRunsAgainstMovesClearEachRowOnce(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		audit := j.name + "_audit"
		_, err := j.db.ExecContext(ctx, "CREATE TABLE "+audit+" (id BIGINT NOT NULL)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = j.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+audit) })
		a := j.kv(t).WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
			for _, id := range ids {
				n, err := strconv.ParseInt(id, 10, 64)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+audit+" (id) VALUES (?)"), n); err != nil {
					return err
				}
			}
			return nil
		})
		base := time.UnixMilli(1_700_000_000_000)
		const total = 200
		for id := int64(0); id < total; id++ {
			j.finish(t, id, "done", base.Add(time.Duration(id/4)*time.Millisecond))
		}
		end := []byte(tablePrefix + ":")
		retryLo, retryHi := []byte(tablePrefix+"r"), []byte(tablePrefix+"s")
		idOf := func(key []byte) string {
			_, id, _ := retention.ParseMarkerKey(tablePrefix, key)
			return string(id)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var errs sync.Map
		loop := func(f func(i int) error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if err := f(i); err != nil && !errors.Is(err, retention.ErrMarkerGone) {
						errs.Store(err.Error(), true)
					}
				}
			}()
		}
		// Moves: a page's markers to retry keys, and retry keys back.
		loop(func(i int) error {
			if i%2 == 0 {
				keys, err := a.Scan(ctx, []byte(tablePrefix), end, 3)
				if err != nil || len(keys) == 0 {
					return err
				}
				to := make([][]byte, len(keys))
				for k, key := range keys {
					at, _, _ := retention.ParseMarkerKey(tablePrefix, key)
					to[k] = fmt.Appendf(nil, "%sr%020d/%020d/1/%s", tablePrefix, 0, at.UnixMilli(), idOf(key))
				}
				return a.Move(ctx, keys, to)
			}
			keys, err := a.Scan(ctx, retryLo, retryHi, 2)
			if err != nil || len(keys) == 0 {
				return err
			}
			to := make([][]byte, len(keys))
			for k, key := range keys {
				at, _, _ := retention.ParseMarkerKey(tablePrefix, key)
				to[k] = rowKey(t, at, must(strconv.ParseInt(idOf(key), 10, 64)))
			}
			return a.Move(ctx, keys, to)
		})
		clearRetries := func(int) error {
			keys, err := a.Scan(ctx, retryLo, retryHi, 4)
			if err != nil || len(keys) == 0 {
				return err
			}
			ids := make([]string, len(keys))
			for k, key := range keys {
				ids[k] = idOf(key)
			}
			err = a.ClearAndDelete(ctx, ids, keys)
			var be retention.BatchError
			if errors.As(err, &be) {
				return nil // live again: not here
			}
			return err
		}
		loop(clearRetries)
		loop(func(i int) error {
			_, err := a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), end, 1+i%5)
			return err
		})
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			var n int
			require.NoError(t, j.db.QueryRowContext(ctx, "SELECT count(*) FROM "+j.name).Scan(&n))
			if n == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		errs.Range(func(k, _ any) bool { t.Logf("a call failed: %v", k); return true })
		rows, err := j.db.QueryContext(ctx, "SELECT id, count(*) FROM "+audit+" GROUP BY id")
		require.NoError(t, err)
		defer rows.Close()
		cleared := map[int64]int{}
		for rows.Next() {
			var id int64
			var c int
			require.NoError(t, rows.Scan(&id, &c))
			cleared[id] = c
		}
		require.NoError(t, rows.Err())
		var twice []int64
		for id, c := range cleared {
			if c != 1 {
				twice = append(twice, id)
			}
		}
		slices.Sort(twice)
		assert.Empty(t, twice, "ids cleared more than once")
		assert.Len(t, cleared, total, "ids cleared")
		jobs, _ := j.ids(t)
		assert.Empty(t, jobs, "rows left")
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestTableLiveAgainOfAFinishedRowFailsTheID: a ClearFunc that says an
// entity is live again, for one id of a BatchError or for the whole call,
// while its row is still finished (its marker) would have the sweep drop
// that marker: the row would go with nothing cleared. The id fails
// instead, in runs and in batches, on every dialect: each job left keeps
// its artifact, each job gone went with it, and the live-again job stays.
func TestTableLiveAgainOfAFinishedRowFailsTheID(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		for _, tc := range []struct {
			name        string
			concurrency int
			answer      error
		}{
			{"an id, runs", 1, retention.BatchError{fmt.Sprintf("%020d", 3): retention.ErrLiveAgain}},
			{"an id, batches", 2, retention.BatchError{fmt.Sprintf("%020d", 3): retention.ErrLiveAgain}},
			{"the whole call, batches", 2, fmt.Errorf("job 3 runs again: %w", retention.ErrLiveAgain)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				j := newJobsTable(t, dl, true)
				old := time.Now().Add(-2 * time.Hour)
				for id := int64(1); id <= 8; id++ {
					j.finish(t, id, "done", old.Add(time.Duration(id)*time.Second))
				}
				akv := j.kv(t).WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
					if slices.Contains(ids, fmt.Sprintf("%020d", 3)) {
						return tc.answer
					}
					return j.deleteArtifacts(ctx, tx, ids)
				})
				s, err := retention.New(akv, retention.Config{Prefix: tablePrefix, Retention: time.Hour,
					BatchSize: 4, PageSize: 4, Concurrency: tc.concurrency, MaxAttempts: 1})
				require.NoError(t, err)
				st, err := s.Pass(context.Background())
				require.NoError(t, err)
				assert.Zero(t, st.LiveAgain, "ids taken as live again")
				assert.Equal(t, 1, st.Parked, "the live-again id fails, and with MaxAttempts 1 is parked")
				jobs, artifacts := j.ids(t)
				assert.True(t, jobs[3], "the live-again job stays")
				assert.Equal(t, jobs, artifacts, "jobs left and the jobs of the artifacts left")
				assert.Len(t, jobs, 1, "the other jobs went")
			})
		}
	})
}
