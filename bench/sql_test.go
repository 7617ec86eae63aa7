package bench_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/marksweep/retention/bench"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/sqlkv"
)

// TestSQLContendersClearEverything runs every database/sql contender on a
// small backlog, with a batch size that does not divide it, so that a
// floor or a sweep that stops early or leaves a row fails.
func TestSQLContendersClearEverything(t *testing.T) {
	for _, tc := range []struct {
		name   string
		d      sqlkv.Dialect
		driver string
		dsn    func(t *testing.T) string
	}{
		{"SQLite", sqlkv.SQLite, "sqlite", func(t *testing.T) string {
			return bench.SQLiteDSN(filepath.Join(t.TempDir(), "bench.db"))
		}},
		{"MySQL", sqlkv.MySQL, "mysql", func(t *testing.T) string { return kvtest.ServerAddr(t, "RETENTION_MYSQL_DSN") }},
		{"PostgreSQL", sqlkv.PostgreSQL, "pgx", func(t *testing.T) string { return kvtest.ServerAddr(t, "RETENTION_POSTGRES_DSN") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db, err := sql.Open(tc.driver, tc.dsn(t))
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, db.Close()) })
			s, err := bench.NewSQL(ctx, db, tc.d, fmt.Sprintf("bench_test_%d", rand.Uint32()), 64)
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, s.Close(context.Background())) })
			s.Timing = &bench.Timing{}

			for _, c := range s.Contenders() {
				rate, err := bench.Once(ctx, c, smallBacklog)
				require.NoError(t, err, c.Name)
				assert.Positive(t, rate, c.Name)
			}
			assert.Contains(t, s.Timing.String(), "scan")
		})
	}
}

// TestSQLCheckSeesWhatIsLeft checks that Check fails while a job or a
// marker is left, so that a broken contender cannot report a rate.
func TestSQLCheckSeesWhatIsLeft(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", bench.SQLiteDSN(filepath.Join(t.TempDir(), "bench.db")))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, db.Close()) })
	s, err := bench.NewSQL(ctx, db, sqlkv.SQLite, "check", 10)
	require.NoError(t, err)
	require.NoError(t, s.Setup(ctx, 25))
	require.ErrorContains(t, s.Check(ctx), "25 rows left")
	_, err = db.ExecContext(ctx, `DELETE FROM check_jobs`)
	require.NoError(t, err)
	err = s.Check(ctx)
	require.ErrorContains(t, err, `"check_markers": 25 rows left`)
	assert.NotContains(t, err.Error(), "check_jobs")
}
