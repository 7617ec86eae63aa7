package sqlkv_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

// TestClearAfterScanSeesWritesSince: on SQLite a clear that follows a Scan
// on the same connection skips its read of the range only while nothing
// was written since; a marker deleted and a key written into the range
// meanwhile, which leave the range as many rows as the clear's keys, make
// it refuse (ErrMarkerGone) and change nothing, whichever connection wrote
// them and wherever the table lives.
func TestClearAfterScanSeesWritesSince(t *testing.T) {
	open := func(t *testing.T, path string, attach string) *sql.DB {
		db := openSQLite(t, path)
		db.SetMaxOpenConns(1) // one connection: the Scan's and the clear's
		if attach != "" {
			_, err := db.Exec("ATTACH DATABASE '" + attach + "' AS aux")
			require.NoError(t, err)
		}
		return db
	}
	for _, tc := range []struct {
		name   string
		other  bool // the writes come through another connection
		attach bool // the table lives in an attached database
	}{
		{"same connection", false, false},
		{"another connection", true, false},
		{"another connection, attached database", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			aux, table := "", "markers"
			if tc.attach {
				aux, table = filepath.Join(dir, "aux.db"), "aux.markers"
			}
			db := open(t, filepath.Join(dir, "main.db"), aux)
			writer := db
			if tc.other {
				writer = open(t, filepath.Join(dir, "main.db"), aux)
			}
			require.NoError(t, sqlkv.Migrate(ctx, db, sqlkv.SQLite, table))
			kv, err := sqlkv.New(db, sqlkv.SQLite, table)
			require.NoError(t, err)
			var cleared []string
			atomicKV, err := kv.WithClear(func(_ context.Context, _ *sql.Tx, ids []string) error {
				cleared = append(cleared, ids...)
				return nil
			})
			require.NoError(t, err)

			at := time.UnixMilli(1_700_000_000_000)
			var keys [][]byte
			var ids []string
			for i := range 5 {
				id := strconv.Itoa(i + 1)
				key, err := retention.MarkerKey("jobs/", at.Add(time.Duration(i)*time.Millisecond), id)
				require.NoError(t, err)
				_, err = db.Exec("INSERT INTO "+table+" (marker) VALUES (?)", key)
				require.NoError(t, err)
				keys, ids = append(keys, key), append(ids, id)
			}
			page, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
			require.NoError(t, err)
			require.Equal(t, keys, page)

			// As many rows as before: the range's count cannot tell.
			between, err := retention.MarkerKey("jobs/", at.Add(time.Millisecond), "2a")
			require.NoError(t, err)
			_, err = writer.Exec("DELETE FROM "+table+" WHERE marker = ?", keys[3])
			require.NoError(t, err)
			_, err = writer.Exec("INSERT INTO "+table+" (marker) VALUES (?)", between)
			require.NoError(t, err)

			err = atomicKV.ClearAndDelete(ctx, ids, keys)
			assert.ErrorIs(t, err, retention.ErrMarkerGone, "ClearAndDelete() = %v, want ErrMarkerGone", err)
			assert.Empty(t, cleared, "ids cleared")
			left, err := kv.Scan(ctx, []byte("jobs/"), []byte("jobs0"), 10)
			require.NoError(t, err)
			assert.Equal(t, [][]byte{keys[0], keys[1], between, keys[2], keys[4]}, left, "markers left")
		})
	}
}
