package pgkv

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/marksweep/retention"
)

// QueueHolds queues on b, from a ClearFunc, the statement that decides
// holds in the clear's own transaction: query, run with args, returns a
// row for each id of the call that is held, with two columns, the id
// (text) and the end of its hold (a timestamptz; NULL, or a time already
// past, means "ask again after Config.RetryDelay"). When it returns a row
// the transaction fails, changing nothing, and ClearAndDelete returns a
// retention.BatchError that maps each id it returned to a retention.Hold
// of its end (the latest, for an id returned twice). The sweep then moves
// those markers to their holds' ends and sends the other ids again in a
// call of their own, for which the ClearFunc queues its statements anew.
//
// query is one SELECT (a trailing semicolon is dropped), placed in a
// subquery; its placeholders are numbered from $1 as those of any queued
// statement. Queue it after a statement that locks the rows a hold is
// placed on (SELECT FROM jobs WHERE id = ANY($1) FOR UPDATE) and before
// the statements that clear, as the example does.
//
// At READ COMMITTED, PostgreSQL's default, each statement of the
// transaction reads the database as of its own start, so the query sees
// every hold committed before the rows were locked; a hold placed later,
// by a transaction that locks the entity's row too (a foreign key to it,
// an UPDATE of it), waits for the clear to end and then finds the entity
// gone, or there and not cleared. Holds a ClearFunc reads itself, in Go, are read before the
// transaction starts: one committed in between would be ignored.
//
// A call that meets a held id costs a transaction rolled back and a second
// call for the others, and the server logs the failed statement; the held
// marker then waits in the sweep's retry range until its hold's end, so a
// hold costs this once per end, not once per pass.
func QueueHolds(b *pgx.Batch, query string, args ...any) {
	query = strings.TrimRight(query, " \t\n\r\f\v;")
	// The failed cast of a text that is no constant aborts the transaction
	// with a message that quotes it (see castFailure). The ends are
	// clamped to what a marker can hold, NULL and -infinity to 1970 (past:
	// ask again soon), infinity to 9999, and go as Unix microseconds.
	b.Queue(`SELECT CASE WHEN count(*) = 0 THEN 0
	ELSE ('`+heldToken+` ' || json_agg(json_build_array(pgkv_h.held_id::text,
		floor(extract(epoch FROM least(greatest(pgkv_h.held_until::timestamptz, '1970-01-01 00:00:00+00'),
			'9999-12-31 23:59:59.999+00')) * 1000000)::bigint)))::int END
FROM (`+query+`
) AS pgkv_h (held_id, held_until)`, args...)
}

// heldToken starts the text whose failed cast aborts a clear's
// transaction that met held ids (see QueueHolds); a JSON array of [id,
// end in Unix microseconds] pairs follows it.
const heldToken = "pgkv: held:"

// holdsOf returns the BatchError of the holds that err, a failure of the
// statement of QueueHolds, reports.
func holdsOf(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	msg := pgErr.Message
	at := strings.Index(msg, `"`+heldToken)
	end := strings.LastIndexByte(msg, '"')
	if at < 0 || end <= at {
		return err
	}
	var pairs [][]json.RawMessage
	if jerr := json.Unmarshal([]byte(msg[at+1+len(heldToken):end]), &pairs); jerr != nil {
		return fmt.Errorf("pgkv: the holds of QueueHolds could not be read (%w): %w", jerr, err)
	}
	held := retention.BatchError{}
	ends := map[string]time.Time{}
	for _, p := range pairs {
		var id *string
		var us int64
		if len(p) != 2 || json.Unmarshal(p[0], &id) != nil || json.Unmarshal(p[1], &us) != nil {
			return fmt.Errorf("pgkv: the holds of QueueHolds could not be read (%s): %w", p, err)
		}
		if id == nil {
			return fmt.Errorf("pgkv: the query of QueueHolds returned a NULL id: %w", err)
		}
		until := time.UnixMicro(us)
		if prev, ok := ends[*id]; !ok || until.After(prev) {
			ends[*id] = until
			held[*id] = retention.Hold(until)
		}
	}
	if len(held) == 0 {
		return err
	}
	return held
}
