package sqlkv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
)

// delete deletes keys where g holds and returns how many rows went. Keys
// in ascending order that are every row from the first to the last (a
// page's markers, the common case) go with one range delete on PostgreSQL
// and SQLite, whose statement itself checks that the range holds those
// keys and no other; any other list, and every list on MySQL, goes as
// DELETE ... WHERE marker IN (...), 5,000 keys a statement.
func (k *KV) delete(ctx context.Context, db execer, keys [][]byte, g *guard) (int64, error) {
	if k.dialect != MySQL && len(keys) > 1 && ascending(keys) {
		n, exact, err := k.deleteRange(ctx, db, keys, g)
		if err != nil || exact {
			return n, err
		}
	}
	var deleted int64
	for part := range chunks(keys, k.dialect.maxKeys()) {
		c, gargs := g.cond(len(part))
		q := "DELETE FROM " + k.table + " WHERE marker IN (" + k.dialect.phs(1, len(part)) + ")" + and(c)
		n, err := exec(ctx, k.dialect, db, q, append(anys(part), gargs...))
		if err != nil {
			return deleted, wrap(ctx, "delete from "+k.table, err)
		}
		deleted += n
	}
	return deleted, nil
}

// ascending reports whether keys are in strictly ascending byte order.
func ascending(keys [][]byte) bool {
	for i := 1; i < len(keys); i++ {
		if bytes.Compare(keys[i-1], keys[i]) >= 0 {
			return false
		}
	}
	return true
}

// deleteRange deletes the rows from the first key to the last, in one
// statement that deletes nothing unless those rows are exactly keys:
// their count and a digest of them (PostgreSQL: a SHA-256 of each key
// after its 4-byte length; SQLite: the keys in hex, comma-separated),
// computed by the database in the statement's snapshot, must match the
// ones computed here. exact reports whether they did; deleted is then how
// many rows went, fewer than len(keys) when some went meanwhile or g did
// not hold.
func (k *KV) deleteRange(ctx context.Context, db execer, keys [][]byte, g *guard) (deleted int64, exact bool, err error) {
	first, last := keys[0], keys[len(keys)-1]
	var q string
	var args []any
	switch k.dialect {
	case PostgreSQL:
		h := sha256.New()
		var n [4]byte
		for _, key := range keys {
			binary.BigEndian.PutUint32(n[:], uint32(len(key)))
			h.Write(n[:])
			h.Write(key)
		}
		args = []any{first, last, int64(len(keys)), h.Sum(nil)}
		c, gargs := g.cond(len(args))
		args = append(args, gargs...)
		q = "WITH s AS (SELECT count(*) = $3::bigint AND sha256(coalesce(string_agg(int4send(length(marker)) || marker, ''::bytea ORDER BY marker), ''::bytea)) = $4::bytea AS exact" +
			" FROM " + k.table + " WHERE marker BETWEEN $1::bytea AND $2::bytea),\n" +
			"r AS (DELETE FROM " + k.table + " WHERE marker BETWEEN $1::bytea AND $2::bytea AND (SELECT exact FROM s)" + and(c) + " RETURNING 1)\n" +
			"SELECT (SELECT exact FROM s), (SELECT count(*) FROM r)"
	case SQLite:
		var digest strings.Builder
		digest.Grow(len(keys) * (2*len(first) + 1))
		for i, key := range keys {
			if i > 0 {
				digest.WriteByte(',')
			}
			digest.WriteString(strings.ToUpper(hex.EncodeToString(key)))
		}
		args = []any{first, last, int64(len(keys)), digest.String()}
		c, gargs := g.cond(len(args))
		args = append(args, gargs...)
		// The subqueries are not correlated: SQLite evaluates them once,
		// before the first row goes. group_concat follows the order of
		// the index the inner SELECT reads.
		inRange := " FROM " + k.table + " WHERE marker BETWEEN ?1 AND ?2"
		exactSQL := "(SELECT count(*)" + inRange + ") = ?3 AND (SELECT group_concat(h, ',') FROM (SELECT hex(marker) AS h" + inRange + " ORDER BY marker)) = ?4"
		q = "DELETE FROM " + k.table + " WHERE marker BETWEEN ?1 AND ?2 AND " + exactSQL + and(renumber(c, len(args)-len(gargs)))
		n, err := exec(ctx, k.dialect, db, q, args)
		if err != nil {
			return 0, false, wrap(ctx, "delete from "+k.table, err)
		}
		if n > 0 {
			return n, true, nil
		}
		// Nothing went: tell a mismatch from a refused guard or keys gone.
		q = "SELECT " + exactSQL
		args = args[:4]
		var ok bool
		if err := queryRow(ctx, k.dialect, db, q, args, &ok); err != nil {
			return 0, false, wrap(ctx, "delete from "+k.table, err)
		}
		return 0, ok, nil
	}
	if err := queryRow(ctx, k.dialect, db, q, args, &exact, &deleted); err != nil {
		return 0, false, wrap(ctx, "delete from "+k.table, err)
	}
	return deleted, exact, nil
}

// renumber makes the ? placeholders of an SQLite condition numbered ones
// from first+1, so that they follow the statement's ?1 to ?first.
func renumber(c string, first int) string {
	if c == "" {
		return ""
	}
	var b strings.Builder
	n := first
	for i := 0; i < len(c); i++ {
		if c[i] == '?' {
			n++
			b.WriteString("?" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(c[i])
	}
	return b.String()
}
