package pgkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/marksweep/retention"
)

var (
	_ retention.RunClearer = (*AtomicKV)(nil)
	_ retention.RunClearer = (*fencedAtomicKV)(nil)
)

// ClearRun implements retention.RunClearer for an AtomicKV made by
// WithClearSQL, in one simple-protocol Query message, so one round trip
// (two the first time on a connection, see AtomicKV) and one transaction:
// a statement takes the first limit keys of
// [from, end) in the table's order, deletes them, and fails, changing
// nothing, unless every one is a marker of prefix whose id
// retention.ValidateID accepts; it returns the keys and hands their ids to
// the statement of WithClearSQL (one of its CTEs, or the statement after
// it). A message cut off on its way runs nothing. ClearRun returns an
// error matching retention.ErrMalformedMarker for a run that holds a key
// that is no such marker, and one matching errors.ErrUnsupported, before
// any round trip, for an AtomicKV made by WithClear. When ctx carries a
// lease's fence (retention.Fenced), the run's statement checks the lease
// too.
//
// The sweep sets limit to its Config.BatchSize (or less, while
// Config.BatchTarget halves it): 10,000 costs the server least per entity
// (BENCHMARKS.md).
func (a *AtomicKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	if a.runClear == "" {
		return nil, fmt.Errorf("pgkv: clear run in %s: an AtomicKV made by WithClear clears in Go, page by page (WithClearSQL clears runs): %w", a.table, errors.ErrUnsupported)
	}
	view, err := retention.Fenced(ctx, a)
	switch {
	case err != nil:
		return nil, err
	case view != nil:
		f, ok := view.(*fencedAtomicKV)
		if !ok {
			return nil, fmt.Errorf("pgkv: the fenced view of an AtomicKV is a %T, not a RunClearer", view)
		}
		return f.ClearRun(ctx, prefix, from, end, limit)
	}
	return a.clearRun(ctx, a.runSQL, nil, nil, prefix, from, end, limit)
}

// RunStore implements retention.RunClearer.
func (a *AtomicKV) RunStore() retention.RunClearer { return a }

func (f *fencedAtomicKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	a := f.atomic
	if a.runClear == "" {
		return a.ClearRun(ctx, prefix, from, end, limit) // unsupported
	}
	p := f.lease
	if p.isLost() {
		return nil, p.refused("clear run in " + a.table)
	}
	return a.clearRun(ctx, f.runSQL, f.statements.lead, p, prefix, from, end, limit)
}

// RunStore implements retention.RunClearer.
func (f *fencedAtomicKV) RunStore() retention.RunClearer { return f }

// notRunToken starts the text whose failed cast aborts a run statement
// that met a key that is no marker.
const notRunToken = "pgkv: not a run of markers:"

// markerRange returns where the markers of prefix lie: every key from lo
// on, before hi, whose timestamp is at most retention.MaxMarkerTime. A
// key of another prefix, or past that time, is outside.
func markerRange(prefix string) (lo, hi []byte) {
	lo = []byte(prefix)
	hi = fmt.Appendf([]byte(prefix), "%0*d0", retention.TimestampWidth, retention.MaxMarkerTime.UnixMilli())
	return lo, hi
}

// runStatement returns the message that clears a run of a's table (see
// ClearRun): the statement that picks and deletes the run, then a's clear
// statement. It takes lead arguments ($1 on), then the run's: lo and hi,
// the part of [from, end) where markers of the prefix can lie (see
// markerRange); limit; where the timestamp starts in a key (the prefix's
// length + 1); and from and end, which tell whether a key outside lo and
// hi would be in the run. leases, when not "", is the lease table: the
// lead arguments are then a lease's name, holder and fence, and the run
// is deleted only when that lease row is found, and locked (see
// fenceAtomic).
//
// The run is every key from lo up to its limit-th (found by an
// index-only scan), deleted as one range. Its keys go back to the client
// joined by commas in one text, and its ids to the clear statement (see
// WithClearSQL). Each key goes without the
// bytes it shares with the others, which go once, first: those of the
// first and last keys of the run in the statement's snapshot, up to the
// end of the timestamp, which every key between them shares (markers are
// inserted and deleted, never updated in place, so the deletion meets no
// other key). The bytes the server sends cost it more than the rest of
// the reply (BENCHMARKS.md).
//
// A marker's suffix is TimestampWidth digits, '/' and an id of the
// default rule, which holds no comma: one regular expression over the
// joined suffixes, and their count, check every key; escape encoding
// turns a byte outside ASCII, a NUL or a backslash into text the
// expression refuses.
func (a *AtomicKV) runStatement(leases string, lead int) runMessage {
	arg := func(i int) string { return "$" + strconv.Itoa(lead+i) }
	lo, hi, limit, at, from, end := arg(1)+"::bytea", arg(2)+"::bytea", arg(3)+"::bigint", arg(4)+"::int", arg(5)+"::bytea", arg(6)+"::bytea"
	stampEnd := at + " + " + strconv.Itoa(retention.TimestampWidth-1) // where the timestamp ends
	var with, first, guard, held string
	if a.lockTimeout != "" {
		// Not a SET LOCAL statement before this one, whose empty result
		// pgx would return instead of this one's: a one-time filter that
		// sets it before anything is locked, for the rest of the
		// transaction, as SET LOCAL would.
		with = "pgkv_t AS MATERIALIZED (SELECT set_config('lock_timeout', '" + a.lockTimeout + "', true) AS v),\n"
		first = "(SELECT v FROM pgkv_t) IS NOT NULL"
		guard = " AND " + first
	}
	if leases != "" {
		with += "pgkv_l AS MATERIALIZED (" + fenceQuery(leases, first) + "),\n"
		held = "EXISTS (SELECT 1 FROM pgkv_l)"
		guard += " AND " + held
	}
	// The clear statement: a CTE of this one, whose ids come from the
	// outcome (pgkv_o), so that it sees none before the run is checked
	// (PostgreSQL runs a CTE no query refers to once the query is done, a
	// way the documentation does not promise); or a statement after this
	// one, which reads the ids from a setting this one makes.
	var ids, clear, set, after string
	if a.runInline {
		clear = ",\npgkv_clear AS (" + a.runClear + ")"
	} else {
		ids = `,
	coalesce(encode(string_agg(substr(key, (SELECT id_at FROM pgkv_c)), ','::bytea), 'escape'), '') AS ids`
		set = ` AND set_config('` + runIDsSetting + `', ids, true) IS NOT NULL`
		after = "\n;\n" + a.runClear
	}
	inRange := `key >= ` + lo + ` AND key < ` + hi
	id := `[-0-9A-Za-z_]{1,` + strconv.Itoa(retention.MaxIDLen) + `}`
	suffix := `'[0-9]{' || (` + stampEnd + ` - cp) || '}/` + id + `'`
	ok := `NOT EXISTS (SELECT 1 FROM ` + a.table + ` WHERE key >= ` + from + ` AND key < ` + lo + `)
	AND (n = ` + limit + ` OR NOT EXISTS (SELECT 1 FROM ` + a.table + ` WHERE key >= ` + hi + ` AND key < ` + end + `))
	AND (n = 0 OR cp >= ` + at + ` - 1 AND common ~ '^[0-9]*$'
		AND keys ~ ('^' || ` + suffix + ` || '(,' || ` + suffix + ` || ')*$')
		AND octet_length(keys) - octet_length(replace(keys, ',', '')) = n - 1)`
	stmt := `WITH ` + with + `pgkv_b AS MATERIALIZED (SELECT
	(SELECT key FROM ` + a.table + ` WHERE ` + inRange + ` ORDER BY key LIMIT 1) AS first,
	coalesce((SELECT key FROM ` + a.table + ` WHERE ` + inRange + ` ORDER BY key OFFSET ` + limit + ` - 1 LIMIT 1),
		(SELECT key FROM ` + a.table + ` WHERE ` + inRange + ` ORDER BY key DESC LIMIT 1)) AS last),
pgkv_c AS MATERIALIZED (SELECT first, last, least(` + stampEnd + `, (SELECT coalesce(max(i), 0)
	FROM generate_series(1, least(length(first), length(last))) AS i WHERE substr(first, 1, i) = substr(last, 1, i))) AS cp,
	` + stampEnd + ` + 2 AS id_at
	FROM pgkv_b),
pgkv_m AS (DELETE FROM ` + a.table + ` WHERE ` + inRange + ` AND key <= (SELECT last FROM pgkv_c)` + guard + `
	RETURNING key),
pgkv_r AS (SELECT count(*) AS n, (SELECT cp FROM pgkv_c) AS cp,
	(SELECT encode(substr(first, ` + at + `, greatest(cp - ` + at + ` + 1, 0)), 'escape') FROM pgkv_c) AS common,
	coalesce(encode(string_agg(substr(key, (SELECT cp FROM pgkv_c) + 1), ','::bytea), 'escape'), '') AS keys` + ids + `
	FROM pgkv_m),
pgkv_o AS MATERIALIZED (SELECT ` + outcomeOf(held, ok, "true", `('`+notRunToken+` ' || n || ' keys from ' || `+lo+`)::int`, "::bool") + ` AS ok
	FROM pgkv_r)` + clear + `
SELECT CASE WHEN n = 0 THEN '' ELSE common || ',' || keys END
FROM pgkv_r, pgkv_o WHERE ok` + set
	return runMessage{newPrepared(stmt, lead+6), after}
}

// runMessage is the message of a run (see runStatement): its statement,
// then what follows it, "" or the clear statement.
type runMessage struct {
	stmt  prepared
	after string
}

// clearRun sends the run's message m (see runStatement), with the lead
// arguments lead, as one simple-protocol query, and returns the keys of
// the run. lease, when not nil, is the lease m checks.
func (a *AtomicKV) clearRun(ctx context.Context, m runMessage, lead []any, lease *pgLease, prefix string, from, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("pgkv: ClearRun limit must be at least 1, got %d", limit)
	}
	// pgx sends a nil []byte as NULL, which no key is >= or <: a nil from
	// or end is the empty key, as for Scan.
	if from == nil {
		from = []byte{}
	}
	if end == nil {
		end = []byte{}
	}
	mlo, mhi := markerRange(prefix)
	lo, hi := from, end
	if bytes.Compare(lo, mlo) < 0 {
		lo = mlo
	}
	if bytes.Compare(hi, mhi) > 0 {
		hi = mhi
	}
	args := append(append([]any{pgx.QueryExecModeSimpleProtocol}, lead...), lo, hi, limit, len(prefix)+1, from, end)
	op := "clear run in " + a.table
	var keys [][]byte
	err := a.onPrepared(ctx, m.stmt, func(db DB, stmt string) (err error) {
		keys, err = readRun(ctx, db, stmt+m.after, args, prefix)
		return err
	})
	switch {
	case err == nil:
		return keys, nil
	case lease != nil && castFailure(err, leaseLostToken):
		lease.markLost()
		return nil, lease.refused(op)
	case castFailure(err, notRunToken):
		return nil, fmt.Errorf("pgkv: %s: %w: a key of [%q, %q) is no marker of %q with an id of the default rule", op, retention.ErrMalformedMarker, from, end, prefix)
	}
	return nil, wrap(ctx, op, err)
}

// readRun sends sql with args over db and returns the keys of the run it
// returns.
func readRun(ctx context.Context, db DB, sql string, args []any, prefix string) ([][]byte, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys [][]byte
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) != 1 || vals[0] == nil || rows.FieldDescriptions()[0].Format != pgx.TextFormatCode {
			return nil, fmt.Errorf("the run statement returned %d columns or a NULL or a binary value", len(vals))
		}
		keys = splitRun(prefix, vals[0])
	}
	rows.Close()
	return keys, rows.Err()
}

// splitRun returns the keys of a run from the text the run statement
// returned: the bytes the keys share after prefix, then each key's
// others, all joined by commas (see runStatement). The keys share one
// buffer; each ends at its capacity. They come in the order the deletion
// met them, which is the index's; they are sorted if not.
func splitRun(prefix string, text []byte) [][]byte {
	common, rest, ok := bytes.Cut(text, []byte{','})
	if !ok {
		return nil
	}
	n := bytes.Count(rest, []byte{','}) + 1
	head := append([]byte(prefix), common...)
	buf := make([]byte, n*len(head)+len(rest)-(n-1))
	keys := make([][]byte, n)
	at := 0
	for i := range keys {
		end := bytes.IndexByte(rest, ',')
		if end < 0 {
			end = len(rest)
		}
		k := copy(buf[at:], head)
		k += copy(buf[at+k:], rest[:end])
		keys[i] = buf[at : at+k : at+k]
		at += k
		rest = rest[min(end+1, len(rest)):]
	}
	if !slices.IsSortedFunc(keys, bytes.Compare) {
		slices.SortFunc(keys, bytes.Compare)
	}
	return keys
}
