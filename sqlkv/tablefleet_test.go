package sqlkv_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// TestTableFleetRecordAndWakeKeepToTheSideTable: sweeps of a TableKV with
// Config.Replica keep the fleet's record and wake key in the side table,
// fenced by the lease; any replica reads the record, and no pass reads
// those keys as markers nor touches a row for them.
func TestTableFleetRecordAndWakeKeepToTheSideTable(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		ctx := context.Background()
		j := newJobsTable(t, dl, true)
		now := time.Now()
		j.finish(t, 1, "done", now.Add(-2*time.Hour))
		j.finish(t, 2, "done", now.Add(-time.Minute))
		leases := fmt.Sprintf("leases_%d_%d", os.Getpid(), tableSeq.Add(1))
		require.NoError(t, sqlkv.MigrateLeases(ctx, j.db, dl.d, leases))
		t.Cleanup(func() { _, _ = j.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+leases) })
		lock, err := sqlkv.NewLocker(j.side, "jobs", &sqlkv.LockerOptions{Table: leases})
		require.NoError(t, err)
		kv := j.atomic(t)
		replica := func(name string) *retention.Sweep {
			s, err := retention.New(kv, retention.Config{Prefix: tablePrefix, Retention: time.Hour, Lease: lock, Replica: name})
			require.NoError(t, err)
			return s
		}
		a, b := replica("web-a"), replica("web-b")
		st, err := a.LeasedPass(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Cleared)

		fl, err := b.Fleet(ctx)
		require.NoError(t, err)
		assert.Equal(t, "web-a", fl.Holder)
		assert.True(t, fl.Released, "LeasedPass gave the lease back")
		last, ok := fl.LastPass()
		require.True(t, ok)
		assert.Equal(t, 1, last.Cleared)
		assert.Equal(t, "web-a", last.Replica)

		require.NoError(t, b.Wake(ctx)) // no Run here: the wake key goes to the store
		st, err = b.LeasedPass(ctx)
		require.NoError(t, err)
		assert.Zero(t, st.Cleared+st.Foreign+st.Malformed+st.Failed, "%+v", st)
		bl, err := b.Backlog(ctx, 10)
		require.NoError(t, err)
		assert.Zero(t, bl)
		jobs, _ := j.ids(t)
		assert.Equal(t, map[int64]bool{2: true}, jobs, "the unexpired job stays")
		fl, err = a.Fleet(ctx)
		require.NoError(t, err)
		assert.Equal(t, "web-b", fl.Holder)
	})
}
