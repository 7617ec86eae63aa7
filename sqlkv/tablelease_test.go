package sqlkv_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/leasetest"
	"github.com/marksweep/retention/sqlkv"
)

// TestTableFleetSweepsAsOne runs the fleet proofs over a TableKV on each
// dialect: replicas sweep the rows of one jobs table as its markers under
// a sqlkv.Locker's lease, which fences their deletes of rows and their
// puts and moves of side keys. With the lease every expired job is
// cleared exactly once; a dead holder is replaced; one that lost its
// lease deletes no row; a fenced Delete, Put or Move of the old holder is
// refused, changing nothing. As TestFleet, one fleet at a time, on a
// machine whose every core is busy.
func TestTableFleetSweepsAsOne(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet proofs take a while")
	}
	loadCPU(t)
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) { leasetest.Run(t, dl.tableHarness) })
	}
}

// tableHarness is the fleet harness over a jobs table whose finished rows
// are the markers, with its side table and an outputs table: a job's row
// is its state, and goes with its marker; Clear deletes its output.
func (dl dialect) tableHarness(t testing.TB) leasetest.Harness {
	path := ""
	if dl.d == sqlkv.SQLite {
		path = t.TempDir() + "/fleet.db"
	}
	admin := dl.open(t, path)
	side := freshTable(t, admin, dl.d)
	jobs, outputs := side+"_jobs", side+"_outputs"
	finished, unit := "finished BIGINT NULL", sqlkv.UnixMilli
	if dl.d == sqlkv.PostgreSQL {
		finished, unit = "finished timestamptz NULL", sqlkv.Timestamp
	}
	ctx := context.Background()
	for _, s := range []string{
		"CREATE TABLE " + jobs + " (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, " + finished + ")",
		"CREATE INDEX " + jobs + "_finished ON " + jobs + " (finished, id)",
		"CREATE TABLE " + outputs + " (job_id BIGINT PRIMARY KEY)",
	} {
		_, err := admin.ExecContext(ctx, s)
		require.NoError(t, err, s)
	}
	t.Cleanup(func() {
		for _, tb := range []string{jobs, outputs} {
			_, _ = admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb)
		}
	})
	lease := dl.fleetLease(t, admin, "lease-"+side)
	table := sqlkv.Table{Name: jobs, ID: "id", Time: "finished", TimeUnit: unit, Filter: "state = 'done'", Prefix: leasetest.Prefix}

	return leasetest.Harness{
		TTL: lease.ttl,
		NewReplica: func(t testing.TB) leasetest.Replica {
			db := dl.open(t, path)
			db.SetMaxOpenConns(4)
			kv, err := sqlkv.New(db, dl.d, side)
			require.NoError(t, err)
			tkv, err := sqlkv.NewTable(context.Background(), kv, table)
			require.NoError(t, err)
			return leasetest.Replica{
				KV:     tkv,
				Locker: lease.locker(t, kv, db),
				Clear: func(ctx context.Context, id string) error {
					n, err := jobID(id)
					if err != nil {
						return err
					}
					_, err = db.ExecContext(ctx, q(dl.d, "DELETE FROM "+outputs+" WHERE job_id = ?"), n)
					return err
				},
				Kill: func() { _ = db.Close() },
			}
		},
		Finish: func(ctx context.Context, prefix string, ids []string, at time.Time) error {
			if prefix != table.Prefix {
				return fmt.Errorf("the jobs table's markers are under %q, not %q", table.Prefix, prefix)
			}
			// The column holds the key's millisecond: the time rounded up,
			// as retention.MarkerKey rounds it.
			var fin any = at.Add(time.Millisecond - 1).UnixMilli()
			if unit == sqlkv.Timestamp {
				fin = at
			}
			nums := make([]any, len(ids))
			jobRows := make([]any, 0, 2*len(ids))
			for i, id := range ids {
				n, err := jobID(id)
				if err != nil {
					return err
				}
				nums[i] = n
				jobRows = append(jobRows, n, fin)
			}
			tx, err := admin.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			for len(jobRows) > 0 {
				part := jobRows[:min(1000, len(jobRows))]
				jobRows = jobRows[len(part):]
				values := strings.Repeat(", (?, 'done', ?)", len(part)/2)[2:]
				if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" (id, state, finished) VALUES "+values), part...); err != nil {
					return err
				}
			}
			if err := insertRows(ctx, tx, dl.d, "INSERT INTO "+outputs+" (job_id) VALUES ", "(?)", nums); err != nil {
				return err
			}
			return tx.Commit()
		},
		Present: func(ctx context.Context, ids []string) (map[string]bool, error) {
			return presentIDs(ctx, admin, dl.d, jobs, "id", ids, func(id string) (any, error) { return jobID(id) })
		},
		Expire: lease.expire,
	}
}

// jobID returns the row id of a marker's id: its 20 digits.
func jobID(id string) (int64, error) {
	if len(id) != retention.TimestampWidth {
		return 0, fmt.Errorf("id %q is not a row's: 20 digits", id)
	}
	return strconv.ParseInt(id, 10, 64)
}
