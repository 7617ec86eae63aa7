package sqlkv

import "errors"

// ErrNoTable is returned when the marker table does not exist: run Migrate.
var ErrNoTable = errors.New("sqlkv: marker table does not exist (run Migrate)")

// ErrNoLeaseTable is returned by Locker.TryAcquire when the lease table
// does not exist: run MigrateLeases.
var ErrNoLeaseTable = errors.New("sqlkv: lease table does not exist (run MigrateLeases)")

// ErrInvalidTable is returned by New, Migrate, MigrateLeases and NewLocker
// for a table name that is empty, too long for the dialect or holds a NUL
// byte.
var ErrInvalidTable = errors.New("sqlkv: invalid table name")

// ErrInvalidDialect is returned for a Dialect that is not MySQL, SQLite or
// PostgreSQL, such as the zero value.
var ErrInvalidDialect = errors.New("sqlkv: invalid dialect")

// ErrKeyTooLong is returned by the writes of a KV of the MySQL dialect for
// a key longer than MaxKeyLen, and by MarkTx, MarkKeyTx and Put for a
// marker key longer than MaxMarkerKeyLen; nothing is written.
var ErrKeyTooLong = errors.New("sqlkv: key too long")
