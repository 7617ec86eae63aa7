package sqlkv_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
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

// reviewEnd is the key of millisecond ms under tablePrefix, with no id:
// the end of a sweep's expired range.
func reviewEnd(ms int64) []byte {
	return fmt.Appendf(nil, "%s%020d", tablePrefix, ms)
}

// TestTableReviewFilterWithOr checks that a filter of two conditions
// joined by OR binds inside its parentheses everywhere: a row that passes
// the filter's second condition but is unexpired, running or outside the
// read's range is no marker to any read or write.
func TestTableReviewFilterWithOr(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		kv, err := sqlkv.NewTable(ctx, j.side, sqlkv.Table{Name: j.name, ID: "id", Time: "finished",
			TimeUnit: j.unit, Filter: "state = 'done' OR state = 'failed'", Prefix: tablePrefix})
		require.NoError(t, err)
		a := kv.WithClear(nil)
		base := time.UnixMilli(1_700_000_000_000)
		expiry := base.Add(time.Hour)
		j.finish(t, 1, "done", base)
		j.finish(t, 2, "failed", base.Add(time.Millisecond))
		j.finish(t, 3, "cancelled", base)                      // filtered out
		j.finish(t, 4, "failed", base)                         // then running: NULL time
		j.finish(t, 5, "failed", expiry.Add(time.Minute))      // unexpired
		j.finish(t, 6, "failed", base.Add(2*time.Millisecond)) // shadowed by a Move
		_, err = j.db.ExecContext(ctx, q(dl.d, "UPDATE "+j.name+" SET finished = NULL WHERE id = ?"), 4)
		require.NoError(t, err)
		retry := fmt.Appendf(nil, "%sr%020d/%020d/1/%020d", tablePrefix, expiry.UnixMilli()+1000, base.Add(2*time.Millisecond).UnixMilli(), 6)
		require.NoError(t, a.Move(ctx, [][]byte{rowKey(t, base.Add(2*time.Millisecond), 6)}, [][]byte{retry}))

		end := reviewEnd(expiry.UnixMilli())
		keys, err := a.Scan(ctx, []byte(tablePrefix), end, 100)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, base, 1)), string(rowKey(t, base.Add(time.Millisecond), 2))}, keyStrings(keys))

		// Keys of the rows that are no markers delete nothing.
		require.NoError(t, a.Delete(ctx, rowKey(t, base, 3), rowKey(t, base, 4), rowKey(t, base, 5)))
		err = a.ClearAndDelete(ctx, []string{fmt.Sprintf("%020d", 3)}, [][]byte{rowKey(t, base, 3)})
		require.ErrorIs(t, err, retention.ErrMarkerGone)

		// A run of the expired range takes rows 1 and 2 only.
		keys, err = a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), end, 100)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, base, 1)), string(rowKey(t, base.Add(time.Millisecond), 2))}, keyStrings(keys))
		jobs, _ := j.ids(t)
		assert.Equal(t, map[int64]bool{3: true, 4: true, 5: true, 6: true}, jobs)

		// A run of a range of the future takes the unexpired row only.
		keys, err = a.ClearRun(ctx, tablePrefix, end, []byte(tablePrefix+":"), 100)
		require.NoError(t, err)
		assert.Equal(t, []string{string(rowKey(t, expiry.Add(time.Minute), 5))}, keyStrings(keys))
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true, 4: true, 6: true}, jobs)

		// The retry key of row 6 deletes its row; row 4's never-finished
		// state stays.
		require.NoError(t, a.Delete(ctx, retry))
		jobs, _ = j.ids(t)
		assert.Equal(t, map[int64]bool{3: true, 4: true}, jobs)
	})
}

// TestTableReviewOddRows checks rows no key can name: a negative id, no
// finish time, a finish time before 1970 or past retention.MaxMarkerTime.
// No read returns them and no run deletes them; the extreme ids and the
// first and last millisecond a key can carry are markers.
func TestTableReviewOddRows(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		a := j.atomic(t)
		first, last := time.UnixMilli(0), retention.MaxMarkerTime
		j.finish(t, 0, "done", first)
		j.finish(t, math.MaxInt64, "done", last)
		j.finish(t, 7, "done", time.UnixMilli(1_700_000_000_000))
		// No markers:
		j.finish(t, -1, "done", time.UnixMilli(1_700_000_000_000))
		j.finish(t, 8, "running", time.Time{})
		j.finish(t, 9, "done", time.UnixMilli(-5))
		j.finish(t, 10, "done", last.Add(time.Millisecond))
		want := []string{string(rowKey(t, first, 0)), string(rowKey(t, time.UnixMilli(1_700_000_000_000), 7)), string(rowKey(t, last, math.MaxInt64))}
		for _, page := range []int{1, 2, 100} {
			var got []string
			from := []byte(tablePrefix)
			for {
				keys, err := a.Scan(ctx, from, []byte(tablePrefix+"\xff"), page)
				require.NoError(t, err)
				got = append(got, keyStrings(keys)...)
				if len(keys) < page {
					break
				}
				from = append(keys[len(keys)-1], 0)
			}
			assert.Equal(t, want, got, "pages of %d", page)
		}
		keys, err := a.ClearRun(ctx, tablePrefix, []byte(tablePrefix), []byte(tablePrefix+"\xff"), 100)
		require.NoError(t, err)
		assert.Equal(t, want, keyStrings(keys))
		jobs, arts := j.ids(t)
		assert.Equal(t, map[int64]bool{-1: true, 8: true, 9: true, 10: true}, jobs)
		assert.Equal(t, map[int64]bool{-1: true, 8: true, 9: true, 10: true}, arts)
	})
}

// TestTableReviewSubMillisecondRuns pages through, and runs over, rows of
// a few milliseconds whose times fall anywhere in them and whose ids are
// in no order of time, on PostgreSQL's timestamptz: every page and every
// run is exactly the next keys in key order.
func TestTableReviewSubMillisecondRuns(t *testing.T) {
	dl := dialects[2]
	require.Equal(t, sqlkv.PostgreSQL, dl.d)
	t.Parallel()
	j := newJobsTable(t, dl, true)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	base := time.UnixMilli(1_700_000_000_000)
	var want []string
	ids := map[int64]bool{}
	tx, err := j.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for len(ids) < 400 {
		id := rng.Int64N(1000)
		if ids[id] {
			continue
		}
		ids[id] = true
		// 4 milliseconds; some rows on a millisecond's boundary.
		at := base.Add(time.Duration(rng.IntN(4000)) * time.Microsecond)
		if rng.IntN(5) == 0 {
			at = at.Truncate(time.Millisecond)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+j.name+" (id, state, finished) VALUES ($1, 'done', $2)", id, at)
		require.NoError(t, err)
		want = append(want, string(rowKey(t, at, id)))
	}
	require.NoError(t, tx.Commit())
	sortStrings(want)
	a := j.atomic(t)
	for _, page := range []int{1, 3, 17, 64} {
		var got []string
		from := []byte(tablePrefix)
		for {
			keys, err := a.Scan(ctx, from, []byte(tablePrefix+"\xff"), page)
			require.NoError(t, err)
			got = append(got, keyStrings(keys)...)
			if len(keys) < page {
				break
			}
			from = append(keys[len(keys)-1], 0)
		}
		require.Equal(t, want, got, "pages of %d", page)
	}
	// A range that ends inside the third millisecond takes its keys only.
	end := reviewEnd(base.UnixMilli() + 2)
	n := 0
	for n < len(want) && want[n] < string(end) {
		n++
	}
	var got []string
	from := []byte(tablePrefix)
	for i := 0; ; i++ {
		limit := []int{1, 5, 13, 2, 40}[i%5]
		keys, err := a.ClearRun(ctx, tablePrefix, from, end, limit)
		require.NoError(t, err)
		require.Equal(t, want[len(got):min(len(got)+limit, n)], keyStrings(keys), "run %d of %d", i, limit)
		got = append(got, keyStrings(keys)...)
		if len(keys) < limit {
			break
		}
		from = append(keys[len(keys)-1], 0)
	}
	assert.Equal(t, want[:n], got)
	var left int
	require.NoError(t, j.db.QueryRowContext(ctx, "SELECT count(*) FROM "+j.name).Scan(&left))
	assert.Equal(t, len(want)-n, left)
}

// TestTableReviewTwoAtomicSweepers runs two sweepers' runs and pages over
// one AtomicTableKV, with no lease, while rows finish: every row is
// cleared exactly once, by the transaction that deletes it.
func TestTableReviewTwoAtomicSweepers(t *testing.T) {
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

// TestTableReviewRunsAgainstMoves runs an AtomicTableKV's runs while
// another client moves the rows' markers to retry keys and back, and a
// third clears the retry keys, with no lease: each row is cleared once.
func TestTableReviewRunsAgainstMoves(t *testing.T) {
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

// TestTableReviewScanWindows reads windows [start, end) of every shape (a
// row's key, a key cut short, a key with a byte past '9' or below '0', the
// prefix's neighbours) over rows of sub-millisecond times on PostgreSQL,
// and of whole milliseconds elsewhere: each page is the window's first
// keys, and a run of the window takes exactly them.
func TestTableReviewScanWindows(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		j := newJobsTable(t, dl, true)
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(3, uint64(len(dl.name))))
		base := time.UnixMilli(1_700_000_000_000)
		var want []string
		ids := map[int64]bool{}
		for len(ids) < 40 {
			id := rng.Int64N(60)
			if rng.IntN(10) == 0 {
				id = math.MaxInt64 - rng.Int64N(3)
			}
			if ids[id] {
				continue
			}
			ids[id] = true
			at := base.Add(time.Duration(rng.IntN(5)) * time.Millisecond)
			if j.unit == sqlkv.Timestamp {
				at = base.Add(time.Duration(rng.IntN(5000)) * time.Microsecond)
			}
			j.finish(t, id, "done", at)
			want = append(want, string(rowKey(t, at, id)))
		}
		sortStrings(want)
		a := j.atomic(t)
		bound := func() []byte {
			k := []byte(want[rng.IntN(len(want))])
			switch rng.IntN(6) {
			case 0:
				return k
			case 1:
				return k[:len(tablePrefix)+rng.IntN(len(k)-len(tablePrefix))]
			case 2:
				i := len(tablePrefix) + rng.IntN(len(k)-len(tablePrefix))
				return append(k[:i:i], []byte{'/', ':', '\xff', '0' - 1, '9' + 1}[rng.IntN(5)])
			case 3:
				return append(k, 0)
			case 4:
				return []byte(tablePrefix)
			}
			return []byte(tablePrefix + ":")
		}
		for range 150 {
			start, end := bound(), bound()
			var in []string
			for _, k := range want {
				if k >= string(start) && k < string(end) {
					in = append(in, k)
				}
			}
			limit := 1 + rng.IntN(8)
			keys, err := a.Scan(ctx, start, end, limit)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprint(in[:min(limit, len(in))]), fmt.Sprint(keyStrings(keys)), "Scan(%q, %q, %d)", start, end, limit)
		}
		// Runs of random windows, rolled back by their clear: each would
		// clear the ids of the window's first keys, ascending.
		stop := errors.New("roll back")
		var cleared []string
		b := j.kv(t).WithClear(func(_ context.Context, _ *sql.Tx, ids []string) error {
			cleared = ids
			return stop
		})
		for range 60 {
			start, end := bound(), bound()
			var in []string
			for _, k := range want {
				if k >= string(start) && k < string(end) {
					in = append(in, k[len(k)-20:])
				}
			}
			limit := 1 + rng.IntN(8)
			cleared = nil
			keys, err := b.ClearRun(ctx, tablePrefix, start, end, limit)
			require.Empty(t, keys)
			if len(in) == 0 {
				require.NoError(t, err, "ClearRun(%q, %q, %d)", start, end, limit)
				continue
			}
			require.ErrorIs(t, err, stop, "ClearRun(%q, %q, %d)", start, end, limit)
			require.Equal(t, in[:min(limit, len(in))], cleared, "ClearRun(%q, %q, %d)", start, end, limit)
		}
		jobs, _ := j.ids(t)
		assert.Len(t, jobs, len(want), "rows left after runs rolled back")
	})
}
