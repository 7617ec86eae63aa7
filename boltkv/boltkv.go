// Package boltkv keeps retention markers in a bucket of a bbolt database:
// the embedded, persistent store for a service that runs as one process.
//
// The caller opens and closes the *bbolt.DB; a KV never closes it. Write a
// marker with MarkTx inside the bbolt transaction that records the entity's
// terminal state, so both commit or neither does; a sweep with its own id
// rule (Config.ValidateID) writes the key of Sweep.MarkerKey with MarkKeyTx.
package boltkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
)

// ErrNoBucket is returned when the KV's bucket does not exist, for example
// because it was deleted after New created it.
var ErrNoBucket = errors.New("boltkv: bucket not found")

// KV is a retention.KV over one bbolt bucket that holds only marker keys.
// It is safe for concurrent use. Create one with New.
type KV struct {
	db     *bbolt.DB
	bucket []byte
}

var (
	_ retention.KV     = (*KV)(nil)
	_ retention.Putter = (*KV)(nil)
	_ retention.Mover  = (*KV)(nil)
)

// New returns a KV over the named top-level bucket of db, creating the
// bucket if it does not exist.
func New(db *bbolt.DB, bucket string) (*KV, error) {
	if db == nil {
		return nil, errors.New("boltkv: db must not be nil")
	}
	if bucket == "" {
		return nil, errors.New("boltkv: bucket name must not be empty")
	}
	k := &KV{db: db, bucket: []byte(bucket)}
	err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(k.bucket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("boltkv: create bucket %q: %w", bucket, err)
	}
	return k, nil
}

// Scan implements retention.KV with a cursor in a read transaction. Keys are
// copied out: bbolt's own are valid only inside the transaction.
func (k *KV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("boltkv: Scan limit must be at least 1, got %d", limit)
	}
	var keys [][]byte
	err := k.db.View(func(tx *bbolt.Tx) error {
		b, err := k.bucketOf(tx)
		if err != nil {
			return err
		}
		c := b.Cursor()
		for key, _ := c.Seek(start); key != nil && len(keys) < limit && bytes.Compare(key, end) < 0; key, _ = c.Next() {
			keys = append(keys, bytes.Clone(key))
		}
		return nil
	})
	if err != nil {
		return nil, k.wrap("scan", err)
	}
	return keys, nil
}

// Delete implements retention.KV: every key goes in one write transaction.
func (k *KV) Delete(ctx context.Context, keys ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := k.db.Update(func(tx *bbolt.Tx) error {
		b, err := k.bucketOf(tx)
		if err != nil {
			return err
		}
		for _, key := range keys {
			if err := b.Delete(key); err != nil {
				return err
			}
		}
		return nil
	})
	return k.wrap("delete", err)
}

// Put writes key with value in its own write transaction. It makes KV a
// retention.Putter: retention.Mark uses it.
func (k *KV) Put(ctx context.Context, key, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return k.wrap("put", k.db.Update(func(tx *bbolt.Tx) error {
		b, err := k.bucketOf(tx)
		if err != nil {
			return err
		}
		return b.Put(key, value)
	}))
}

// Move implements retention.Mover: every pair is moved in one write
// transaction, so all of them commit or none does. A pair whose from key
// is missing (deleted by another process sharing the file) writes nothing.
// A Sweep reschedules the markers of failed Clears with it, so a crash
// never leaves a marker at both its old key and its new one.
func (k *KV) Move(ctx context.Context, from, to [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(from) != len(to) {
		return fmt.Errorf("boltkv: Move of %d keys to %d keys", len(from), len(to))
	}
	return k.wrap("move", k.db.Update(func(tx *bbolt.Tx) error {
		b, err := k.bucketOf(tx)
		if err != nil {
			return err
		}
		for i, key := range from {
			// Get cannot tell a missing key from one with an empty value,
			// which is what markers have: seek for the key itself.
			if found, _ := b.Cursor().Seek(key); !bytes.Equal(found, key) {
				continue
			}
			if err := b.Delete(key); err != nil {
				return err
			}
			if err := b.Put(to[i], []byte{}); err != nil {
				return err
			}
		}
		return nil
	}))
}

// MarkTx writes the marker of id, finished at t, under prefix, inside the
// caller's writable transaction tx. It refuses what retention.MarkerKey
// refuses, and writes nothing then. For a sweep with its own
// Config.ValidateID, use MarkKeyTx with the key of Sweep.MarkerKey.
func (k *KV) MarkTx(tx *bbolt.Tx, prefix, id string, t time.Time) error {
	key, err := retention.MarkerKey(prefix, t, id)
	if err != nil {
		return err
	}
	return k.MarkKeyTx(tx, key)
}

// MarkKeyTx writes the marker key inside the caller's writable transaction
// tx. Take key from Sweep.MarkerKey, which checks the id by the sweep's own
// rule (Config.ValidateID), or from retention.MarkerKey. A key that is not
// shaped like a marker (retention.CheckMarkerKey: the sweep would never
// delete it) is refused with an error matching retention.ErrMalformedMarker.
func (k *KV) MarkKeyTx(tx *bbolt.Tx, key []byte) error {
	if err := retention.CheckMarkerKey(key); err != nil {
		return fmt.Errorf("boltkv: MarkKeyTx: %w", err)
	}
	b, err := k.bucketOf(tx)
	if err != nil {
		return err
	}
	return k.wrap("mark", b.Put(key, []byte{}))
}

// bucketOf returns the KV's bucket in tx, or ErrNoBucket.
func (k *KV) bucketOf(tx *bbolt.Tx) (*bbolt.Bucket, error) {
	b := tx.Bucket(k.bucket)
	if b == nil {
		return nil, ErrNoBucket
	}
	return b, nil
}

func (k *KV) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("boltkv: %s in bucket %q: %w", op, k.bucket, err)
}
