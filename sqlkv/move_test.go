package sqlkv_test

import (
	"context"
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
// never a from key left beside its to key with the call reporting
// success. On MySQL and SQLite a Move is two statements, an UPDATE then a
// DELETE of the pairs whose to key existed, in one transaction.
func TestFencedMoveIsWhole(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
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

		from1, from2, to1, to2 := []byte("a/from1"), []byte("a/from2"), []byte("b/to1"), []byte("b/to2")
		for _, k := range [][]byte{from1, from2, to2} { // to2 exists: its pair needs the DELETE
			require.NoError(t, kv.Put(ctx, k, nil))
		}
		err = fenced.(retention.Mover).Move(ctx, [][]byte{from1, from2}, [][]byte{to1, to2})
		keys, scanErr := kv.Scan(ctx, []byte("a"), []byte("c"), 10)
		require.NoError(t, scanErr)
		if err != nil {
			require.ErrorIs(t, err, retention.ErrLeaseLost)
			assert.Equal(t, [][]byte{from1, from2, to2}, keys, "a refused Move changed the table")
			return
		}
		assert.Equal(t, [][]byte{to1, to2}, keys, "Move reported success but did not move every pair whole")
	})
}
