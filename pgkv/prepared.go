package pgkv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// prepared is a statement in the forms it goes in (see KV.onPrepared): its
// text, which the server parses and plans every time; the PREPARE that
// has the server keep it parsed and planned for a connection; and the
// EXECUTE of it. name is the prepared statement's.
type prepared struct {
	name, text, prepare, execute string
}

// newPrepared returns the forms of stmt, which takes nargs arguments. The
// prepared statement is named after stmt's text, so every statement that
// reads the same gets the same name, and no two others do.
func newPrepared(stmt string, nargs int) prepared {
	sum := sha256.Sum256([]byte(stmt))
	name := "pgkv_" + hex.EncodeToString(sum[:12])
	params := make([]string, nargs)
	for i := range params {
		params[i] = "$" + strconv.Itoa(i+1)
	}
	return prepared{
		name:    name,
		text:    stmt,
		prepare: "PREPARE " + name + " AS " + stmt,
		execute: "EXECUTE " + name + "(" + strings.Join(params, ", ") + ")",
	}
}

// maxPrepared is the most statements pgkv prepares on one connection:
// the server keeps each one's plans for the connection's life (a run's
// statement about 224 KB, a table's batch statements about 64 KB more), so
// a service that sweeps many tables would grow every connection without
// bound. Further statements go as text on that connection.
var maxPrepared = 32

// preparedOn returns the set of the statements pgkv prepared on conn, kept
// in the connection's CustomData for as long as the connection lives.
func preparedOn(conn *pgxpool.Conn) map[string]bool {
	data := conn.Conn().PgConn().CustomData()
	made, _ := data["pgkv.prepared"].(map[string]bool)
	if made == nil {
		made = map[string]bool{}
		data["pgkv.prepared"] = made
	}
	return made
}

// onPrepared calls send with a DB and the form of p to send over it. Over
// a pool: one of its connections and p's EXECUTE, after preparing p there
// unless the connection remembers doing so (preparedOn) and again if the
// server forgot (DISCARD ALL); p's text once the connection holds
// maxPrepared statements. Over a connection or a
// transaction, whose state it cannot know: p's text, as from then on
// over a pool whose connections lose what they prepared between two
// messages (a pooler in front of the server, PgBouncer in transaction
// mode). send must send its statement in the simple protocol, where
// PREPARE goes too: a message cut off on its way runs nothing, and one
// whose EXECUTE names no prepared statement fails before anything in it
// ran.
func (k *KV) onPrepared(ctx context.Context, p prepared, send func(db DB, stmt string) error) error {
	pool, ok := k.db.(*pgxpool.Pool)
	if !ok || k.unprepared.Load() {
		return send(k.db, p.text)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	made := preparedOn(conn)
	if made[p.name] {
		if err = send(conn, p.execute); !forgotten(err, p.name) {
			return err
		}
		delete(made, p.name)
	}
	if len(made) >= maxPrepared {
		return send(conn, p.text)
	}
	_, err = conn.Exec(ctx, p.prepare, pgx.QueryExecModeSimpleProtocol)
	if err != nil && !hasCode(err, "42P05") { // duplicate_prepared_statement
		return err
	}
	made[p.name] = true
	if err = send(conn, p.execute); !forgotten(err, p.name) {
		return err
	}
	// Prepared, or found prepared, and gone by the next message.
	delete(made, p.name)
	k.unprepared.Store(true)
	return send(conn, p.text)
}

// forgotten reports whether err says that the server has no prepared
// statement name (invalid_sql_statement_name, naming it), rather than
// that a statement of the caller's in the same message failed so.
func forgotten(err error, name string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "26000" && strings.Contains(pgErr.Message, `"`+name+`"`)
}
