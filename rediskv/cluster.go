package rediskv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrCrossSlot is returned when keys that one script must name together
// hash to different Redis Cluster slots (or Ring shards), and nothing is
// sent then: the marker set and the lease key of a fenced KV, or the
// marker set and a state key that WithClear's KeysFunc names. Give them
// one hash tag, e.g. "{runs}:done", "{runs}:lease" and "{runs}:state:<id>";
// ShardTags makes tags for several sweeps. A CROSSSLOT reply of Redis
// matches it too: a client of your own that wraps a *redis.ClusterClient
// hides from the KV that it is one, and the check falls to the server.
var ErrCrossSlot = errors.New("rediskv: keys of one script hash to different slots")

// numSlots is the number of hash slots of a Redis Cluster.
const numSlots = 16384

// Slot returns the Redis Cluster hash slot of key, as CLUSTER KEYSLOT does:
// the CRC16 (XMODEM) of its hash tag, the content of its first {...} when
// that is not empty, else of the whole key, modulo 16384. Keys of one slot
// live on one master, and one script or MULTI may name them together.
func Slot(key string) int { return int(crc16(0, hashPart(key)) % numSlots) }

// hashPart is the part of a key Redis Cluster hashes: the content of the
// first {...} when it is not empty, else the whole key.
func hashPart(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			return key[open+1 : open+1+n]
		}
	}
	return key
}

// crcTable is CRC16-XMODEM (polynomial 0x1021) a byte at a time.
var crcTable = func() (table [256]uint16) {
	for b := range table {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		table[b] = crc
	}
	return table
}()

// crc16 continues crc, the CRC16 of what came before, over s.
func crc16[S string | []byte](crc uint16, s S) uint16 {
	for i := range len(s) {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

// clustered reports whether rdb spreads keys over slots or shards: a
// *redis.ClusterClient (which redis.NewUniversalClient and
// redis.NewFailoverClusterClient return for a cluster) or a *redis.Ring.
func clustered(rdb redis.Cmdable) bool {
	switch rdb.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return true
	}
	return false
}

// sameSlot reports whether a script may name both keys on rdb: always on a
// single server; on a cluster when they hash to one slot; on a ring when
// they share what the ring hashes (the hash tag, or the whole key).
func sameSlot(rdb redis.Cmdable, a, b string) bool {
	switch rdb.(type) {
	case *redis.ClusterClient:
		return Slot(a) == Slot(b)
	case *redis.Ring:
		return hashPart(a) == hashPart(b)
	default:
		return true
	}
}

// checkSlots returns an error matching ErrCrossSlot, naming the first of
// keys that a script cannot name beside the marker set on k's client.
func (k *KV) checkSlots(keys []string) error {
	if !clustered(k.rdb) {
		return nil
	}
	for _, key := range keys {
		if !sameSlot(k.rdb, key, k.key) {
			return fmt.Errorf("%w: marker set %q (slot %d), state key %q (slot %d): give the state keys the set's hash tag",
				ErrCrossSlot, k.key, Slot(k.key), key, Slot(key))
		}
	}
	return nil
}

// isCrossSlot reports whether err is Redis's refusal of a command whose
// keys hash to different slots.
func isCrossSlot(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "CROSSSLOT")
}

// maxTagSuffix bounds ShardTags' search: every slot is the slot of some
// base-36 suffix of four digits after any prefix (TestShardTagsReach;
// three digits reach 16243 slots).
const maxTagSuffix = 36 * 36 * 36 * 36

// ShardTags returns n hash tags for n sweeps that share a Redis Cluster,
// "{name:0:...}" to "{name:<n-1>:...}", each hashing to its own slot: the
// i-th to the middle slot of the i-th of n equal parts of the 16384. Give
// each sweep's keys its tag, tag+":done" for the marker set, tag+":lease"
// for its Locker and tag+":state:<id>" for its entities, so that each sweep
// can clear atomically and be fenced on its slot while the sweeps spread
// over the masters. On a cluster whose masters own equal runs of slots, as
// redis-cli --cluster create assigns them, n tags land evenly over the
// masters, within one, and up to one a master when n is at most their
// number. A sweep writes each marker under one tag: an id whose state one
// sweep keeps stays with that sweep.
//
// The tags depend on name and n alone, never on the cluster: every writer
// and every replica, started before or after a resharding, computes the
// same ones, so no marker is left on a key that no sweep reads. After a
// resharding they stay on their slots, wherever the slots went:
// ClusterClient.MasterForKey says which master serves one now. name must
// not be empty nor hold '{' or '}'; n is 1 to 16384.
func ShardTags(name string, n int) ([]string, error) {
	switch {
	case name == "" || strings.ContainsAny(name, "{}"):
		return nil, fmt.Errorf("rediskv: ShardTags: name %q must not be empty nor hold '{' or '}'", name)
	case n < 1 || n > numSlots:
		return nil, fmt.Errorf("rediskv: ShardTags: n must be 1 to %d, got %d", numSlots, n)
	}
	tags := make([]string, n)
	var suffix []byte
	for i := range tags {
		target := uint16((2*i + 1) * numSlots / (2 * n))
		prefix := name + ":" + strconv.Itoa(i) + ":"
		crc := crc16(0, prefix)
		for k := range maxTagSuffix {
			suffix = strconv.AppendInt(suffix[:0], int64(k), 36)
			if crc16(crc, suffix)%numSlots == target {
				tags[i] = "{" + prefix + string(suffix) + "}"
				break
			}
		}
		if tags[i] == "" {
			return nil, fmt.Errorf("rediskv: ShardTags: no tag %q and four base-36 digits hashes to slot %d", prefix, target)
		}
	}
	return tags, nil
}
