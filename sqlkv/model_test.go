package sqlkv_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// TestModel drives a sqlkv KV and its AtomicKV with random operations —
// Put, Delete, Move (pairs whose source is there or not, some moving onto
// a key that exists; no key in two pairs of a call), Scan of random ranges
// and limits, ClearAndDelete of batches whose markers are all there, or
// some gone, and ClearRun of random ranges and limits — on each dialect,
// and checks every answer and the whole table against a model written
// plainly: a MemKV for the markers and a set for the entities. A
// ClearAndDelete commits (entities and markers together) only when every
// key is there, else it returns ErrMarkerGone having changed nothing. A
// ClearRun takes what a Scan of its range and limit would return, and
// commits only when each of those keys is a marker (markerKey), else it
// returns ErrMalformedMarker having changed nothing.
func TestModel(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
				t.Parallel()
				runModel(t, dl, seed)
			})
		}
	})
}

// markerKey is what a ClearRun of prefix "m/" takes for a marker: the
// prefix, 20 digits, '/' and an id of the default rule.
var markerKey = regexp.MustCompile(`^m/[0-9]{20}/[A-Za-z0-9_-]{1,128}$`)

func runModel(t *testing.T, dl dialect, seed uint64) {
	ctx := context.Background()
	db := dl.open(t, "")
	markers := freshTable(t, db, dl.d)
	jobs := markers + "_jobs"
	_, err := db.ExecContext(ctx, "CREATE TABLE "+jobs+" (id VARCHAR(20) PRIMARY KEY)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs) })
	kv, err := sqlkv.New(db, dl.d, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, q(dl.d, "DELETE FROM "+jobs+" WHERE id = ?"), id); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)

	r := rand.New(rand.NewPCG(seed, 0x73716c6b76))
	model := retention.NewMemKV()
	entities := map[string]bool{}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = fmt.Sprintf("e%02d", i)
	}
	// The keys the operations pick from: markers of the ids at a few
	// times, a retry-range key, and keys near the range's ends.
	var pool [][]byte
	for _, id := range ids {
		for _, d := range []time.Duration{0, time.Second, time.Hour} {
			k, err := retention.MarkerKey("m/", at.Add(d+time.Duration(r.IntN(1000))*time.Millisecond), id)
			require.NoError(t, err)
			pool = append(pool, k)
		}
	}
	pool = append(pool, []byte("m/r00000000000000000001/00000000000000000001/1/e00"), []byte("m/"), []byte("m/\xff"))
	pick := func() []byte { return pool[r.IntN(len(pool))] }
	idOf := func(k []byte) string { return string(k[bytes.LastIndexByte(k, '/')+1:]) }

	var trace []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d, after %s:\n"+format, append([]any{seed, strings.Join(trace, "\n")}, args...)...)
	}
	for step := range 300 {
		switch op := r.IntN(12); {
		case op < 3: // Put
			k := pick()
			trace = append(trace, fmt.Sprintf("%d put %q", step, k))
			require.NoError(t, kv.Put(ctx, k, nil))
			require.NoError(t, model.Put(ctx, k, nil))
			if id := idOf(k); !entities[id] && len(id) == 3 {
				entities[id] = true
				_, err := db.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" VALUES (?)"), id)
				require.NoError(t, err)
			}
		case op < 4: // Delete
			keys := [][]byte{pick(), pick()}
			trace = append(trace, fmt.Sprintf("%d delete %q", step, keys))
			require.NoError(t, kv.Delete(ctx, keys...))
			require.NoError(t, model.Delete(ctx, keys...))
		case op < 6: // Move
			n := 1 + r.IntN(3)
			var from, to [][]byte
			for range n {
				f, k := pick(), pick()
				// Distinct keys: the contract does not order a chain of
				// pairs (one's target another's source), nor the sweep
				// send one.
				used := func(k []byte) bool {
					return slices.ContainsFunc(from, func(x []byte) bool { return bytes.Equal(x, k) }) ||
						slices.ContainsFunc(to, func(x []byte) bool { return bytes.Equal(x, k) })
				}
				if bytes.Equal(f, k) || used(f) || used(k) {
					continue
				}
				from, to = append(from, f), append(to, k)
			}
			if len(from) == 0 {
				continue
			}
			trace = append(trace, fmt.Sprintf("%d move %q -> %q", step, from, to))
			require.NoError(t, kv.Move(ctx, from, to))
			require.NoError(t, model.Move(ctx, from, to))
		case op < 8: // Scan
			a, b := pick(), pick()
			if bytes.Compare(a, b) > 0 {
				a, b = b, a
			}
			limit := 1 + r.IntN(8)
			got, err := kv.Scan(ctx, a, b, limit)
			require.NoError(t, err)
			want, err := model.Scan(ctx, a, b, limit)
			require.NoError(t, err)
			if !slices.EqualFunc(got, want, bytes.Equal) {
				fail("Scan(%q, %q, %d) = %q, want %q", a, b, limit, got, want)
			}
		case op >= 10: // ClearRun of a random range and limit
			a, b := pick(), pick()
			if bytes.Compare(a, b) > 0 {
				a, b = b, a
			}
			limit := 1 + r.IntN(8)
			trace = append(trace, fmt.Sprintf("%d run [%q, %q) %d", step, a, b, limit))
			got, err := akv.ClearRun(ctx, "m/", a, b, limit)
			want, merr := model.Scan(ctx, a, b, limit)
			require.NoError(t, merr)
			var runIDs []string
			malformed := false
			for _, k := range want {
				if !markerKey.Match(k) {
					malformed = true
				} else if id := idOf(k); !slices.Contains(runIDs, id) {
					runIDs = append(runIDs, id)
				}
			}
			switch {
			case malformed && !errors.Is(err, retention.ErrMalformedMarker):
				fail("ClearRun of %q = %q, %v, want ErrMalformedMarker", want, got, err)
			case malformed:
			case err != nil || !slices.EqualFunc(got, want, bytes.Equal):
				fail("ClearRun = %q, %v, want %q", got, err, want)
			default:
				require.NoError(t, model.Delete(ctx, want...))
				for _, id := range runIDs {
					delete(entities, id)
				}
			}
		default: // ClearAndDelete of a batch of ids and keys, some maybe gone
			all, err := model.Scan(ctx, []byte("m/0"), []byte("m/:"), 1<<20)
			require.NoError(t, err)
			var keys [][]byte
			batch := map[string]bool{}
			for _, k := range all {
				if r.IntN(3) == 0 {
					keys, batch[idOf(k)] = append(keys, k), true
				}
			}
			if r.IntN(4) == 0 { // a stale key, deleted already (or not)
				if k := pick(); bytes.HasPrefix(k, []byte("m/0")) {
					keys, batch[idOf(k)] = append(keys, k), true
				}
			}
			if len(keys) == 0 {
				continue
			}
			// Every key of a batch id goes with it, as the sweep sends them.
			for _, k := range all {
				if batch[idOf(k)] && !slices.ContainsFunc(keys, func(x []byte) bool { return bytes.Equal(x, k) }) {
					keys = append(keys, k)
				}
			}
			slices.SortFunc(keys, bytes.Compare)
			keys = slices.CompactFunc(keys, bytes.Equal)
			batchIDs := slices.Sorted(func(yield func(string) bool) {
				for id := range batch {
					if !yield(id) {
						return
					}
				}
			})
			trace = append(trace, fmt.Sprintf("%d clear %v %q", step, batchIDs, keys))
			err = akv.ClearAndDelete(ctx, batchIDs, keys)
			gone := false
			for _, k := range keys {
				if _, ok, _ := model.Get(ctx, k); !ok {
					gone = true
				}
			}
			switch {
			case gone && !errors.Is(err, retention.ErrMarkerGone):
				fail("ClearAndDelete with a key gone = %v, want ErrMarkerGone", err)
			case !gone && err != nil:
				fail("ClearAndDelete = %v, want nil", err)
			case !gone:
				require.NoError(t, model.Delete(ctx, keys...))
				for _, id := range batchIDs {
					delete(entities, id)
				}
			}
		}
		// The whole table and the entities, now and then and at the end.
		if step%25 == 0 || step == 299 {
			got, err := kv.Scan(ctx, nil, []byte("\xff"), 1<<20)
			require.NoError(t, err)
			want, err := model.Scan(ctx, nil, []byte("\xff"), 1<<20)
			require.NoError(t, err)
			if !slices.EqualFunc(got, want, bytes.Equal) {
				fail("the table holds %q, want %q", got, want)
			}
			rows, err := db.QueryContext(ctx, "SELECT id FROM "+jobs+" ORDER BY id")
			require.NoError(t, err)
			var left []string
			for rows.Next() {
				var id string
				require.NoError(t, rows.Scan(&id))
				left = append(left, id)
			}
			require.NoError(t, rows.Err())
			require.NoError(t, rows.Close())
			var wantLeft []string
			for id, ok := range entities {
				if ok {
					wantLeft = append(wantLeft, id)
				}
			}
			slices.Sort(wantLeft)
			if !slices.Equal(left, wantLeft) {
				fail("entities left %v, want %v", left, wantLeft)
			}
		}
	}
}
