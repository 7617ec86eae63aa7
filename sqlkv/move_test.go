package sqlkv_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// TestFencedMoveIsWhole: a fenced Move whose lease expires while it runs
// (a trigger on the marker table expires the lease row at the Move's
// first write) either moves every pair whole or, refused, moves nothing:
// never a from key left beside its to key, nor some pairs moved and
// others not, with the call reporting success. On MySQL and SQLite a Move
// is two statements, an UPDATE then a DELETE of the pairs whose to key
// existed, in one transaction; on every dialect a Move of more pairs than
// one statement carries is several statements in one transaction.
func TestFencedMoveIsWhole(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		t.Run("onto a key that exists", func(t *testing.T) {
			from := [][]byte{[]byte("a/from1"), []byte("a/from2")}
			to := [][]byte{[]byte("b/to1"), []byte("b/to2")}
			moveUnderExpiringLease(t, dl, from, to, to[1:]) // to2's pair needs the DELETE
		})
		t.Run("more pairs than a statement carries", func(t *testing.T) {
			var from, to [][]byte
			for i := range 3000 {
				from = append(from, fmt.Appendf(nil, "a/%05d", i))
				to = append(to, fmt.Appendf(nil, "b/%05d", i))
			}
			moveUnderExpiringLease(t, dl, from, to, nil)
		})
	})
}

// moveUnderExpiringLease writes the from keys and the keys of existing,
// then Moves from to to under a lease that a trigger expires at the
// Move's first write, and requires the table to show the whole Move, or,
// when it was refused, none of it.
func moveUnderExpiringLease(t *testing.T, dl dialect, from, to, existing [][]byte) {
	db := dl.open(t, "")
	ctx := context.Background()
	markers, leases := freshTable(t, db, dl.d), freshLeaseTable(t, db, dl.d)
	kv, err := sqlkv.New(db, dl.d, markers)
	require.NoError(t, err)
	locker, err := sqlkv.NewLocker(kv, "mover", &sqlkv.LockerOptions{TTL: time.Minute, Table: leases})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	fenced, ok := lease.(retention.Fencer).Fence(kv)
	require.True(t, ok)

	trigger := markers + "_expire"
	var create []string
	switch dl.d {
	case sqlkv.MySQL:
		create = []string{"CREATE TRIGGER " + trigger + " AFTER UPDATE ON " + markers +
			" FOR EACH ROW UPDATE " + leases + " SET expires_at = UTC_TIMESTAMP(6) WHERE name = 'mover'"}
	case sqlkv.SQLite:
		create = []string{"CREATE TRIGGER " + trigger + " AFTER UPDATE ON " + markers +
			" BEGIN UPDATE " + leases + " SET expires_at = CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) WHERE name = 'mover'; END"}
	case sqlkv.PostgreSQL:
		create = []string{
			"CREATE FUNCTION " + trigger + "() RETURNS trigger AS $$ BEGIN UPDATE " + leases +
				" SET expires_at = clock_timestamp() WHERE name = 'mover'; RETURN NULL; END $$ LANGUAGE plpgsql",
			"CREATE TRIGGER " + trigger + " AFTER DELETE ON " + markers + " FOR EACH ROW EXECUTE FUNCTION " + trigger + "()",
		}
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP FUNCTION IF EXISTS "+trigger+" CASCADE") })
	}
	for _, s := range create {
		_, err := db.ExecContext(ctx, s)
		require.NoError(t, err)
	}

	before := slices.Concat(from, existing)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, insertRows(ctx, tx, dl.d, "INSERT INTO "+markers+" (marker) VALUES ", "(?)", anyOf(before)))
	require.NoError(t, tx.Commit())
	slices.SortFunc(before, bytes.Compare)
	after := slices.Clone(to)
	slices.SortFunc(after, bytes.Compare)

	err = fenced.(retention.Mover).Move(ctx, from, to)
	keys, scanErr := kv.Scan(ctx, []byte("a"), []byte("c"), len(before)+len(to)+1)
	require.NoError(t, scanErr)
	if err != nil {
		require.ErrorIs(t, err, retention.ErrLeaseLost)
		assert.Equal(t, byPrefix(before), byPrefix(keys), "a refused Move changed the table")
		assert.True(t, slices.EqualFunc(before, keys, bytes.Equal), "a refused Move changed the table")
		return
	}
	assert.Equal(t, byPrefix(after), byPrefix(keys), "Move reported success but did not move every pair whole")
	assert.True(t, slices.EqualFunc(after, keys, bytes.Equal), "Move reported success but did not move every pair whole")
}

// byPrefix counts keys by what precedes their '/', for a failure's message.
func byPrefix(keys [][]byte) map[string]int {
	n := map[string]int{}
	for _, k := range keys {
		p, _, _ := bytes.Cut(k, []byte("/"))
		n[string(p)]++
	}
	return n
}
