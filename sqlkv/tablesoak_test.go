package sqlkv_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention/sqlkv"
)

// TestTableFaultSoak is TestFaultSoak over an AtomicTableKV: a jobs
// table whose done rows are the markers, several of them a millisecond,
// beside running jobs and others the filter leaves out. Clears fail,
// panic or hang; the store's calls fail before or after they reach the
// database, hang until StoreTimeout, or delete or move some of their
// keys and fail. After every pass: every expired job left has exactly one
// marker (its row, or a side key that shadows it), no side key or shadow
// is without its job, no id was cleared by two committed transactions,
// and no unexpired, running or filtered job was touched; clean passes
// then clear every expired job.
func TestTableFaultSoak(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fault soak")
	}
	soakEach(t, func(t testing.TB, dl dialect, faults *soakFaults) soakStore { return tableSoak(t, dl, faults, true) })
	forEach(t, func(t *testing.T, dl dialect) {
		for _, seed := range []uint64{8, 9} {
			t.Run(fmt.Sprint("counted/seed", seed), func(t *testing.T) {
				t.Parallel()
				soak(t, seed, 1, func(f *soakFaults) soakStore {
					st := tableSoak(t, dl, f, false)
					st.observe = seed == 9 // its runs asked for their times
					return st
				})
			})
		}
	})
}

// tableSoakOthers is how many jobs of a table soak run, and how many
// finished long ago in a state the filter leaves out: none is a marker.
const tableSoakOthers = 100

// tableSoak is a soak's store over a jobs table: soakExpired expired and
// soakUnexpired unexpired done jobs, three a millisecond, and
// tableSoakOthers running and cancelled ones; withClear, the ClearFunc
// records each clear with its transaction's token, and otherwise there
// is none: the rows are the whole state, and runs are counted. On
// PostgreSQL the finish time is a timestamptz, elsewhere Unix
// milliseconds.
func tableSoak(t testing.TB, dl dialect, faults *soakFaults, withClear bool) soakStore {
	db := dl.open(t, "")
	db.SetMaxOpenConns(8)
	ctx := context.Background()
	side := freshTable(t, db, dl.d)
	jobs, cleared := side+"_jobs", side+"_cleared"
	finished, unit := "finished BIGINT NULL", sqlkv.UnixMilli
	if dl.d == sqlkv.PostgreSQL {
		finished, unit = "finished timestamptz NULL", sqlkv.Timestamp
	}
	for _, s := range []string{
		"CREATE TABLE " + jobs + " (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, " + finished + ")",
		"CREATE INDEX " + jobs + "_finished ON " + jobs + " (finished, id)",
		"CREATE TABLE " + cleared + " (id BIGINT NOT NULL, tx VARCHAR(20) NOT NULL)",
	} {
		_, err := db.ExecContext(ctx, s)
		require.NoError(t, err, s)
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs)
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+cleared)
	})
	timeArg := func(at time.Time) any {
		if unit == sqlkv.Timestamp {
			return at
		}
		return at.UnixMilli()
	}
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for i := range soakExpired + soakUnexpired + 2*tableSoakOthers {
		state, at := "done", timeArg(soakNow.Add(-2*time.Hour+time.Duration(i/3)*time.Millisecond))
		switch {
		case i >= soakExpired+soakUnexpired+tableSoakOthers:
			state = "cancelled"
		case i >= soakExpired+soakUnexpired:
			state, at = "running", nil
		case i >= soakExpired:
			at = timeArg(soakNow.Add(time.Duration(i) * time.Millisecond))
		}
		_, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" (id, state, finished) VALUES (?, ?, ?)"), i+1, state, at)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())

	kv, err := sqlkv.New(db, dl.d, side)
	require.NoError(t, err)
	table, err := sqlkv.NewTable(ctx, kv, sqlkv.Table{Name: jobs, ID: "id", Time: "finished", TimeUnit: unit,
		Filter: "state = 'done'", Prefix: "soak/"})
	require.NoError(t, err)
	clearIDs := func(ctx context.Context, tx *sql.Tx, ids []string) error {
		token := txToken()
		for _, id := range ids {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+cleared+" (id, tx) VALUES (?, ?)"), n, token); err != nil {
				return err
			}
		}
		return faults.clear(ctx)
	}
	if !withClear {
		clearIDs = nil
	}
	akv := table.WithClear(clearIDs)
	c := jobsCheck{db: db, d: dl.d, jobs: jobs, side: side, cleared: cleared, prefix: "soak/",
		cutoff: timeArg(soakNow.Add(-time.Hour)), untouched: soakUnexpired + 2*tableSoakOthers}
	return soakStore{kv: akv, prefix: "soak/", expired: soakExpired, check: c.check, counted: !withClear}
}
