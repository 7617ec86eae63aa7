package sqlkv_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
	"github.com/marksweep/retention/sqlkv"
)

// TestClearAndDelete: one call clears and deletes in one transaction; a
// call whose marker is gone, or whose ClearFunc refuses, changes nothing;
// keys may outnumber ids.
func TestClearAndDelete(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		db := dl.open(t, "")
		ctx := context.Background()
		markers := freshTable(t, db, dl.d)
		jobs := markers + "_jobs"
		_, err := db.ExecContext(ctx, "CREATE TABLE "+jobs+" (id VARCHAR(20) PRIMARY KEY)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs) })
		kv, err := sqlkv.New(db, dl.d, markers)
		require.NoError(t, err)
		refuse := errors.New("refused")
		var fail bool
		akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
			for _, id := range ids {
				if _, err := tx.ExecContext(ctx, q(dl.d, "DELETE FROM "+jobs+" WHERE id = ?"), id); err != nil {
					return err
				}
			}
			if fail {
				return refuse
			}
			return nil
		})
		require.NoError(t, err)
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		key := func(id string, d time.Duration) []byte {
			k, err := retention.MarkerKey("jobs/", at.Add(d), id)
			require.NoError(t, err)
			return k
		}
		for _, id := range []string{"a", "b", "c"} {
			_, err := db.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" VALUES (?)"), id)
			require.NoError(t, err)
		}
		a1, a2, b, c := key("a", 0), key("a", time.Second), key("b", 2*time.Second), key("c", 3*time.Second)
		for _, k := range [][]byte{a1, a2, b, c} {
			require.NoError(t, kv.Put(ctx, k, nil))
		}
		count := func(table string) int {
			var n int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n))
			return n
		}

		fail = true
		require.ErrorIs(t, akv.ClearAndDelete(ctx, []string{"b"}, [][]byte{b}), refuse)
		assert.Equal(t, 4, count(markers), "a refused call deletes no marker")
		assert.Equal(t, 3, count(jobs), "a refused call clears nothing")
		fail = false

		require.NoError(t, akv.ClearAndDelete(ctx, []string{"a"}, [][]byte{a1, a2}), "two markers of one id")
		assert.Equal(t, 2, count(markers))
		assert.Equal(t, 2, count(jobs))

		err = akv.ClearAndDelete(ctx, []string{"a", "b"}, [][]byte{a2, b})
		require.ErrorIs(t, err, retention.ErrMarkerGone, "a call sent again")
		assert.Equal(t, 2, count(markers), "a call with a gone marker deletes nothing")
		assert.Equal(t, 2, count(jobs), "a call with a gone marker clears nothing")

		require.NoError(t, akv.ClearAndDelete(ctx, []string{"b", "c"}, [][]byte{b, c}))
		assert.Zero(t, count(markers))
		assert.Zero(t, count(jobs))
	})
}

func TestWithClear(t *testing.T) {
	kv, err := sqlkv.New(openSQLite(t, ""), sqlkv.SQLite, "markers")
	require.NoError(t, err)
	_, err = kv.WithClear(nil)
	require.EqualError(t, err, "sqlkv: WithClear: clear must not be nil")
}

func TestNew(t *testing.T) {
	db := openSQLite(t, "")
	tests := []struct {
		name    string
		db      *sql.DB
		d       sqlkv.Dialect
		table   string
		wantErr error
		msg     string
	}{
		{"ok", db, sqlkv.SQLite, "markers", nil, ""},
		{"schema", db, sqlkv.MySQL, "app.markers", nil, ""},
		{"nil db", nil, sqlkv.SQLite, "markers", nil, "sqlkv: db must not be nil"},
		{"zero dialect", db, 0, "markers", sqlkv.ErrInvalidDialect, "sqlkv: invalid dialect: 0 (use sqlkv.MySQL, sqlkv.SQLite or sqlkv.PostgreSQL)"},
		{"empty table", db, sqlkv.SQLite, "", sqlkv.ErrInvalidTable, `sqlkv: invalid table name "": empty name or schema`},
		{"long MySQL name", db, sqlkv.MySQL, string(make([]byte, 65)), sqlkv.ErrInvalidTable, ""},
		{"NUL", db, sqlkv.PostgreSQL, "mark\x00ers", sqlkv.ErrInvalidTable, `sqlkv: invalid table name "mark\x00ers": holds a NUL byte`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv, err := sqlkv.New(tt.db, tt.d, tt.table)
			if tt.wantErr == nil && tt.msg == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.d, kv.Dialect())
				return
			}
			require.Error(t, err)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			}
			if tt.msg != "" {
				require.EqualError(t, err, tt.msg)
			}
		})
	}
}

// TestNoTable: every dialect reports a missing table as ErrNoTable.
func TestNoTable(t *testing.T) {
	forEach(t, func(t *testing.T, dl dialect) {
		kv, err := sqlkv.New(dl.open(t, ""), dl.d, "no_such_table_at_all")
		require.NoError(t, err)
		ctx := context.Background()
		_, err = kv.Scan(ctx, []byte("a"), []byte("b"), 1)
		require.ErrorIs(t, err, sqlkv.ErrNoTable)
		require.ErrorIs(t, kv.Delete(ctx, []byte("a")), sqlkv.ErrNoTable)
	})
}

// TestMySQLKeyTooLong: a key the VARBINARY column cannot hold is refused
// before it is sent, not truncated.
func TestMySQLKeyTooLong(t *testing.T) {
	db := openMySQL(t, "")
	kv, err := sqlkv.New(db, sqlkv.MySQL, freshTable(t, db, sqlkv.MySQL))
	require.NoError(t, err)
	long := make([]byte, sqlkv.MaxKeyLen+1)
	require.ErrorIs(t, kv.Put(context.Background(), long, nil), sqlkv.ErrKeyTooLong)
	require.NoError(t, kv.Put(context.Background(), long[:sqlkv.MaxKeyLen], nil))
}

// TestCustomIDRule runs kvtest.CustomIDRule, writing markers with
// MarkKeyTx in the transaction that ships the order.
func TestCustomIDRule(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, dl dialect) {
		db := dl.open(t, "")
		ctx := context.Background()
		kv, err := sqlkv.New(db, dl.d, freshTable(t, db, dl.d))
		require.NoError(t, err)
		orders := "orders_" + dl.name
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+orders)
		_, err = db.ExecContext(ctx, "CREATE TABLE "+orders+" (id VARCHAR(50) PRIMARY KEY, state VARCHAR(20) NOT NULL)")
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, "INSERT INTO "+orders+" VALUES ('order.42', 'open'), ('order.7', 'open')")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+orders) })
		ship := func(ctx context.Context, id string, mark func(*sql.Tx) error, commit bool) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, q(dl.d, "UPDATE "+orders+" SET state = 'shipped' WHERE id = ?"), id); err != nil {
				return err
			}
			if err := mark(tx); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		}
		kvtest.CustomIDRule(t, kvtest.IDRuleHarness{
			KV: kv,
			MarkDefault: func(ctx context.Context, prefix, id string, at time.Time) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				if err := kv.MarkTx(ctx, tx, prefix, id, at); err != nil {
					return err
				}
				return tx.Commit()
			},
			Finish: func(ctx context.Context, sweep *retention.Sweep, id string, at time.Time) error {
				key, err := sweep.MarkerKey(at, id)
				if err != nil {
					return err
				}
				return ship(ctx, id, func(tx *sql.Tx) error { return kv.MarkKeyTx(ctx, tx, key) }, true)
			},
			Abandon: func(ctx context.Context, id string, key []byte) error {
				return ship(ctx, id, func(tx *sql.Tx) error { return kv.MarkKeyTx(ctx, tx, key) }, false)
			},
			Shipped: func(ctx context.Context, id string) (bool, error) {
				var state string
				err := db.QueryRowContext(ctx, q(dl.d, "SELECT state FROM "+orders+" WHERE id = ?"), id).Scan(&state)
				if errors.Is(err, sql.ErrNoRows) {
					return false, nil
				}
				return state == "shipped", err
			},
			Clear: func(ctx context.Context, id string) error {
				_, err := db.ExecContext(ctx, q(dl.d, "DELETE FROM "+orders+" WHERE id = ?"), id)
				return err
			},
		})
	})
}
