package pgkv

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
)

// A batch of markers to delete is nearly always a run of a page, so every
// key between its first and its last: then the statement that deletes it
// names the two ends, the number of distinct keys and a SHA-256 of them
// (each preceded by its length as 4 bytes, big-endian, as int4send writes
// it), instead of every key. The server computes the same digest over the
// rows of the range, in the statement's snapshot, and deletes the range
// only when both agree: otherwise the statement fails, its transaction
// undoes the deletion, and the caller sends the keys one by one (a key
// missing, a row of the range not in the list), so a row that is not one
// of the keys is never deleted. The statement's text then holds two keys and 32
// bytes, whatever the batch's size: the simple protocol, in which pgx
// writes the arguments into the text for the server to parse, costs little.

// keyRange is what a range statement needs of a batch of keys.
type keyRange struct {
	first, last []byte
	n           int    // distinct keys
	digest      []byte // SHA-256 of the distinct keys, length-prefixed
}

// notRangeToken starts the text whose failed cast aborts a range
// statement that found other rows than its keys; the error's message
// quotes it.
const notRangeToken = "pgkv: not the range:"

// rangeOf returns the keyRange of keys, and false when they are not in
// ascending order (duplicates next to each other are fine), or empty.
// The key-by-key form takes those.
func rangeOf(keys [][]byte) (keyRange, bool) {
	if len(keys) == 0 {
		return keyRange{}, false
	}
	h := sha256.New()
	var size [4]byte
	n := 0
	for i, k := range keys {
		if i > 0 {
			switch c := bytes.Compare(keys[i-1], k); {
			case c > 0:
				return keyRange{}, false
			case c == 0:
				continue
			}
		}
		binary.BigEndian.PutUint32(size[:], uint32(len(k)))
		h.Write(size[:])
		h.Write(k)
		n++
	}
	return keyRange{first: keys[0], last: keys[len(keys)-1], n: n, digest: h.Sum(nil)}, true
}

// args are the arguments of rangeCTEs, in order.
func (r keyRange) args() []any { return []any{r.first, r.last, r.n, r.digest} }

// rangeCTEs are the CTEs of a statement that deletes from table every row
// between the parameters first and last where guard (an SQL condition, or
// "") holds, in r, and says in n whether those rows were exactly the keys
// that count and digest describe (see keyRange): n.exact, and n.deleted. A
// statement that finds n.exact false must fail (notRange), so that its
// transaction undoes the deletion: one index scan does both the check and
// the delete. Only rows of the statement's snapshot that it deletes count,
// so a row another transaction deleted meanwhile makes it fail too.
//
// The digest takes the rows in the order the DELETE returns them, the
// order of the primary key's index scan that PostgreSQL chooses for a range
// of a batch's size; an ORDER BY in the aggregate would make that a
// contract, but its sort would cost more than the digest.
// Rows returned in another order (a plan that scans the heap) make the
// digests differ: the caller then sends the keys one by one, which is
// slower, never wrong.
func rangeCTEs(table, first, last, count, digest, guard string) string {
	if guard != "" {
		guard = " AND " + guard
	}
	return `r AS (DELETE FROM ` + table + ` WHERE key BETWEEN ` + first + `::bytea AND ` + last + `::bytea` + guard + ` RETURNING key),
n AS (SELECT count(*) AS deleted, coalesce(count(*) = ` + count + `::bigint
	AND sha256(string_agg(int4send(length(key)) || key, ''::bytea)) = ` + digest + `::bytea, false) AS exact FROM r)`
}

// notRange is the expression that fails a range statement: an integer
// cast of a text that names notRangeToken and is not constant, so that the
// planner cannot raise it while folding constants.
const notRange = `('` + notRangeToken + ` ' || deleted)::int`

// keysCTE is the CTE a of a statement that deletes the keys of the bytea
// array parameter keys from table, one lookup each, where guard (an SQL
// condition, or "") holds, returning a row per deleted key.
func keysCTE(table, keys, guard string) string {
	if guard != "" {
		guard = " AND " + guard
	}
	return `a AS (DELETE FROM ` + table + ` WHERE key = ANY(` + keys + `::bytea[])` + guard + ` RETURNING 1)`
}
