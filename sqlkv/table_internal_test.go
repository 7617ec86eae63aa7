package sqlkv

import (
	"bytes"
	"testing"
)

// FuzzTablePosOf: the position posOf finds for any key is the least key a
// row can have at or after it, so that a range read by rows' positions
// skips none and takes none outside the range.
func FuzzTablePosOf(f *testing.F) {
	const prefix = "jobs/"
	t := &TableKV{prefix: prefix, shadow: prefix + "~"}
	for _, seed := range []string{
		"", "jobs/", "jobs0", "jobs/0", "jobs/00000001700000000000", "jobs/00000001700000000000/",
		"jobs/00000001700000000000/00000000000000000042", "jobs/00000001700000000000/00000000000000000042\x00",
		"jobs/00000001700000000000/99999999999999999999", "jobs/99999999999999999999", "jobs/:", "jobs/r0",
		"jobs/00000001700000000000/9223372036854775807\x00", "jobs/2", "jobs/000000017000000000009",
	} {
		f.Add([]byte(seed))
	}
	last := t.rowKey(nil, maxViewMs, 1<<63-1)
	f.Fuzz(func(tt *testing.T, key []byte) {
		p := t.posOf(key)
		if p.inf {
			if bytes.Compare(last, key) >= 0 {
				tt.Fatalf("posOf(%q) is past every key, but the last key a row can have, %q, is not before it", key, last)
			}
			return
		}
		if p.ms < 0 || p.ms > maxViewMs || p.id < 0 {
			tt.Fatalf("posOf(%q) = %+v, no key a row can have", key, p)
		}
		at := t.rowKey(nil, p.ms, p.id)
		if bytes.Compare(at, key) < 0 {
			tt.Fatalf("posOf(%q) = %q, before it", key, at)
		}
		if ms, id, ok := t.parseRowKey(at); !ok || ms != p.ms || id != p.id {
			tt.Fatalf("parseRowKey(%q) = %d, %d, %v, want %d, %d", at, ms, id, ok, p.ms, p.id)
		}
		prev := viewPos{ms: p.ms, id: p.id - 1}
		if p.id == 0 {
			if p.ms == 0 {
				return
			}
			prev = viewPos{ms: p.ms - 1, id: 1<<63 - 1}
		}
		if before := t.rowKey(nil, prev.ms, prev.id); bytes.Compare(before, key) >= 0 {
			tt.Fatalf("posOf(%q) = %q, but %q, a key a row can have before it, is not before the key", key, at, before)
		}
	})
}
