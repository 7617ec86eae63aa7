package sqlkv

import (
	"fmt"
	"strconv"
	"strings"
)

// Dialect is the SQL dialect of the database behind a *sql.DB: MySQL,
// SQLite or PostgreSQL. The package cannot tell it from the driver, so it
// is chosen explicitly; the zero value is no dialect and is refused.
type Dialect int

const (
	// MySQL is MySQL 8 and MariaDB 10.6 or later, with InnoDB tables, for
	// example through github.com/go-sql-driver/mysql. Keys are VARBINARY,
	// compared bytewise, at most MaxKeyLen bytes; placeholders are ?; a
	// fenced write locks the lease row with LOCK IN SHARE MODE.
	MySQL Dialect = iota + 1

	// SQLite is SQLite 3.35 or later (for RETURNING), for example through
	// modernc.org/sqlite or github.com/mattn/go-sqlite3. Keys are BLOBs of a
	// WITHOUT ROWID table, compared with memcmp; placeholders are ?. Open
	// the database with a busy timeout (modernc.org/sqlite:
	// _pragma=busy_timeout(10000)), or concurrent writers fail at once with
	// SQLITE_BUSY, and with transactions that take the write lock as they
	// begin (_txlock=immediate): a clear reads its markers, then deletes
	// them, and a deferred transaction that another connection wrote under
	// since its read fails rather than wait. WAL mode lets Scan read while
	// a sweep writes.
	SQLite

	// PostgreSQL is PostgreSQL 13 or later through database/sql, for example
	// with github.com/jackc/pgx/v5/stdlib or github.com/lib/pq. Keys are
	// bytea; placeholders are $1, $2, ... Code on pgx itself is better
	// served by the pgkv module, whose writes each go out as one message
	// (and whose Tables gives this package's table store over a pgx pool).
	PostgreSQL
)

// MaxKeyLen is the longest key the MySQL dialect stores: the marker column
// is VARBINARY(1024), within InnoDB's 3072-byte limit on a key. A longer
// key is refused before it is sent. The other dialects have no limit of
// their own.
const MaxKeyLen = 1024

// MaxMarkerKeyLen is the longest marker key MarkTx, MarkKeyTx and Put write on
// MySQL: 34 bytes short of MaxKeyLen, room for the longest key the sweep
// may move the marker to, its retry key (the marker's prefix, id and
// finish time, plus an infix, the time it falls due, up to two letters of
// kind and up to nine digits of attempts). A longer marker would fit the column but
// could never be rescheduled or parked, so it is refused when written,
// with ErrKeyTooLong.
const MaxMarkerKeyLen = MaxKeyLen - retryKeyOverhead

// retryKeyOverhead is how much longer than a marker key its longest retry
// key is: 'r', 20 digits and '/' for the due time, the kind's letters
// (d, h or dh), nine digits of attempts and '/'. A parked key is at most
// 12 bytes longer than a marker.
const retryKeyOverhead = 1 + 20 + 1 + 2 + 9 + 1

// String returns the dialect's name.
func (d Dialect) String() string {
	switch d {
	case MySQL:
		return "MySQL"
	case SQLite:
		return "SQLite"
	case PostgreSQL:
		return "PostgreSQL"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// check returns an error unless d is one of the package's dialects.
func (d Dialect) check() error {
	if d < MySQL || d > PostgreSQL {
		return fmt.Errorf("%w: %d (use sqlkv.MySQL, sqlkv.SQLite or sqlkv.PostgreSQL)", ErrInvalidDialect, int(d))
	}
	return nil
}

// maxParams is how many placeholders one statement may carry: 65,535 for
// MySQL's prepared statements and PostgreSQL's protocol, 32,766 for SQLite
// since 3.32 (SQLITE_MAX_VARIABLE_NUMBER). A batch of more keys is split
// into statements of at most maxKeys keys.
func (d Dialect) maxParams() int {
	if d == SQLite {
		return 32766
	}
	return 65535
}

// maxKeys is how many keys one statement carries: few enough that the
// statement text stays small, with room left for the lease's parameters.
func (d Dialect) maxKeys() int { return min(d.maxParams()-8, 5000) }

// ph returns the i-th placeholder (from 1).
func (d Dialect) ph(i int) string {
	if d == PostgreSQL {
		return "$" + strconv.Itoa(i)
	}
	return "?"
}

// phs returns n placeholders from the first-th, comma-separated; a bytea
// cast follows each on PostgreSQL, where a bare parameter may be taken for
// text.
func (d Dialect) phs(first, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(d.ph(first + i))
		if d == PostgreSQL {
			b.WriteString("::bytea")
		}
	}
	return b.String()
}

// quoteTable validates and quotes a table name, "table" or
// "schema.table" ("database.table" on MySQL). Each part is quoted as an
// identifier, so any character but NUL is safe.
func (d Dialect) quoteTable(table string) (string, error) {
	if err := d.check(); err != nil {
		return "", err
	}
	limit := map[Dialect]int{MySQL: 64, PostgreSQL: 63, SQLite: 1 << 20}[d]
	parts := strings.SplitN(table, ".", 2)
	quoted := make([]string, len(parts))
	for i, p := range parts {
		switch {
		case p == "":
			return "", fmt.Errorf("%w %q: empty name or schema", ErrInvalidTable, table)
		case len(p) > limit:
			return "", fmt.Errorf("%w %q: %q is longer than %s's %d-byte identifiers", ErrInvalidTable, table, p, d, limit)
		case strings.IndexByte(p, 0) >= 0:
			return "", fmt.Errorf("%w %q: holds a NUL byte", ErrInvalidTable, table)
		}
		if d == MySQL {
			quoted[i] = "`" + strings.ReplaceAll(p, "`", "``") + "`"
		} else {
			quoted[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
		}
	}
	return strings.Join(quoted, "."), nil
}

// createMarkers is the statement that creates the marker table.
func (d Dialect) createMarkers(table string) string {
	switch d {
	case MySQL:
		return "CREATE TABLE IF NOT EXISTS " + table + " (marker VARBINARY(" + strconv.Itoa(MaxKeyLen) + ") NOT NULL PRIMARY KEY) ENGINE=InnoDB"
	case SQLite:
		return "CREATE TABLE IF NOT EXISTS " + table + " (marker BLOB NOT NULL PRIMARY KEY) WITHOUT ROWID"
	}
	return "CREATE TABLE IF NOT EXISTS " + table + " (marker bytea PRIMARY KEY) WITH (" + postgresTableOptions + ")"
}

// postgresTableOptions are pgkv's MarkerTableOptions: a sweep deletes
// markers oldest first, so their dead index entries sit where every later
// pass scans until a vacuum removes them; vacuum once 2,000 rows are dead,
// unthrottled (see the pgkv package documentation).
const postgresTableOptions = "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000, autovacuum_vacuum_cost_delay = 0"

// insertIgnore returns the statement that inserts the key of the
// placeholder ph where cond (an SQL condition, or "") holds, and leaves an
// existing key as it is.
func (d Dialect) insertIgnore(table, cond string) string {
	where := ""
	if cond != "" {
		where = " WHERE " + cond
	}
	switch d {
	case MySQL:
		// Not INSERT IGNORE, which would also turn errors into warnings.
		return "INSERT INTO " + table + " (marker) SELECT ? FROM DUAL" + where + " ON DUPLICATE KEY UPDATE marker = marker"
	case SQLite:
		return "INSERT OR IGNORE INTO " + table + " (marker) SELECT ?" + where
	}
	return "INSERT INTO " + table + " (marker) SELECT $1::bytea" + where + " ON CONFLICT DO NOTHING"
}

// Lease table, per dialect: the expiry is a time of the server's clock.
func (d Dialect) createLeases(table string) string {
	switch d {
	case MySQL:
		return "CREATE TABLE IF NOT EXISTS " + table + ` (
	name VARCHAR(255) NOT NULL PRIMARY KEY,
	holder VARCHAR(255) NOT NULL,
	fence BIGINT NOT NULL,
	expires_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`
	case SQLite:
		return "CREATE TABLE IF NOT EXISTS " + table + ` (
	name TEXT NOT NULL PRIMARY KEY,
	holder TEXT NOT NULL,
	fence INTEGER NOT NULL,
	expires_at INTEGER NOT NULL -- microseconds since the Unix epoch
)`
	}
	return "CREATE TABLE IF NOT EXISTS " + table + ` (
	name text PRIMARY KEY,
	holder text NOT NULL,
	fence bigint NOT NULL,
	expires_at timestamptz NOT NULL
)`
}

// now is the server's current time, in the type of expires_at. MySQL's
// UTC_TIMESTAMP is the statement's start, which a lock wait does not move:
// that is safe, since the statement starts after the client sent it.
func (d Dialect) now() string {
	switch d {
	case MySQL:
		return "UTC_TIMESTAMP(6)"
	case SQLite:
		return "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
	}
	return "clock_timestamp()"
}

// later is the server's time plus the microseconds of the placeholder ph.
func (d Dialect) later(ph string) string {
	switch d {
	case MySQL:
		return "UTC_TIMESTAMP(6) + INTERVAL " + ph + " MICROSECOND"
	case SQLite:
		return "(" + d.now() + " + " + ph + ")"
	}
	return "clock_timestamp() + " + ph + "::bigint * interval '1 microsecond'"
}

// lockShare ends a SELECT that must lock the rows it reads until the end of
// the transaction, so that a takeover waits for it. SQLite needs none: one
// writer at a time.
func (d Dialect) lockShare() string {
	switch d {
	case MySQL:
		return " LOCK IN SHARE MODE"
	case PostgreSQL:
		return " FOR SHARE"
	}
	return ""
}
