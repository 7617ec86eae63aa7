package retention

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMarkerKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		at      time.Time
		id      string
		want    string
		wantErr error
	}{
		{"epoch", time.UnixMilli(0), "a", "runs/00000000000000000000/a", nil},
		{"ordinary", time.UnixMilli(1764000000123), "run-42_x", "runs/00000001764000000123/run-42_x", nil},
		{"sub-millisecond rounded up", time.UnixMilli(5).Add(time.Nanosecond), "a", "runs/00000000000000000006/a", nil},
		{"almost a millisecond rounded up", time.UnixMilli(5).Add(999_999 * time.Nanosecond), "a", "runs/00000000000000000006/a", nil},
		{"whole millisecond kept", time.UnixMilli(5), "a", "runs/00000000000000000005/a", nil},
		{"largest", MaxMarkerTime, "a", "runs/00000253402300799999/a", nil},
		{"past the largest by a nanosecond", MaxMarkerTime.Add(time.Nanosecond), "a", "", ErrInvalidTime},
		{"seconds taken for milliseconds", time.Unix(1764000000123, 0), "a", "", ErrInvalidTime},
		{"largest int64 millisecond", time.UnixMilli(1<<63 - 1), "a", "", ErrInvalidTime},
		{"max id length", time.UnixMilli(1), strings.Repeat("z", MaxIDLen), "runs/00000000000000000001/" + strings.Repeat("z", MaxIDLen), nil},
		{"before epoch", time.UnixMilli(-1), "a", "", ErrInvalidTime},
		{"just before epoch", time.Unix(0, -1), "a", "", ErrInvalidTime},
		{"empty id", time.UnixMilli(1), "", "", ErrInvalidID},
		{"id too long", time.UnixMilli(1), strings.Repeat("z", MaxIDLen+1), "", ErrInvalidID},
		{"id with slash", time.UnixMilli(1), "a/b", "", ErrInvalidID},
		{"id with space", time.UnixMilli(1), "a b", "", ErrInvalidID},
		{"id with dot", time.UnixMilli(1), "..", "", ErrInvalidID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := MarkerKey("runs/", tt.at, tt.id)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got), "MarkerKey() = %q, want %q", got, tt.want)
		})
	}
}

func TestParseMarkerKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		key     string
		wantMs  int64
		wantID  string
		wantErr error
		wantMsg string // part of the error message naming what is wrong
	}{
		{"valid", "runs/00000001764000000123/run-42", 1764000000123, "run-42", nil, ""},
		{"largest", "runs/00000253402300799999/a", 253402300799999, "a", nil, ""},
		{"just past the largest", "runs/00000253402300800000/a", 0, "", ErrMalformedMarker, "is after 9999-12-31"},
		{"largest int64", "runs/09223372036854775807/a", 0, "", ErrMalformedMarker, "is after 9999-12-31"},
		{"other prefix", "runs2/00000001764000000123/a", 0, "", ErrMalformedMarker, "prefix"},
		{"shorter prefix", "run", 0, "", ErrMalformedMarker, "prefix"},
		{"letter in timestamp", "runs/0000000176400000012x/a", 0, "", ErrMalformedMarker, "timestamp"},
		{"short timestamp", "runs/123/a", 0, "", ErrMalformedMarker, "timestamp"},
		{"timestamp ends key", "runs/0000000176400000012", 0, "", ErrMalformedMarker, "timestamp"},
		{"overflowing timestamp", "runs/18446744073709551615/a", 0, "", ErrMalformedMarker, "is after 9999-12-31"},
		{"all nines", "runs/99999999999999999999/a", 0, "", ErrMalformedMarker, "is after 9999-12-31"},
		{"missing slash", "runs/00000001764000000123a", 0, "", ErrMalformedMarker, "separator"},
		{"nothing after timestamp", "runs/00000001764000000123", 0, "", ErrMalformedMarker, "separator"},
		{"long timestamp", "runs/000000017640000001234/a", 0, "", ErrMalformedMarker, "separator"},
		{"empty id", "runs/00000001764000000123/", 0, "", ErrInvalidID, "empty"},
		{"bad id byte", "runs/00000001764000000123/a b", 0, "", ErrInvalidID, "byte 1"},
		{"id with slash", "runs/00000001764000000123/a/b", 0, "", ErrInvalidID, "byte 1"},
		{"id too long", "runs/00000001764000000123/" + strings.Repeat("a", MaxIDLen+1), 0, "", ErrInvalidID, "129 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			at, id, err := ParseMarkerKey("runs/", []byte(tt.key))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.ErrorIs(t, err, ErrMalformedMarker)
				assert.Contains(t, err.Error(), tt.wantMsg)
				assert.Contains(t, err.Error(), tt.key, "error should quote the key")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantMs, at.UnixMilli(), "ParseMarkerKey() ms = %d, want %d", at.UnixMilli(), tt.wantMs)
			assert.Equal(t, tt.wantID, string(id))
		})
	}
}

func TestMarkerKeyOrderIsTimeOrder(t *testing.T) {
	t.Parallel()
	times := []int64{0, 1, 9, 10, 99, 100, 1764000000000, 1764000000001, 1<<47 + 3, MaxMarkerTime.UnixMilli()}
	for i := 1; i < len(times); i++ {
		a, err := MarkerKey("p/", time.UnixMilli(times[i-1]), "zzz")
		require.NoError(t, err)
		b, err := MarkerKey("p/", time.UnixMilli(times[i]), "A")
		require.NoError(t, err)
		assert.Negative(t, bytes.Compare(a, b), "key(%d) should sort before key(%d)", times[i-1], times[i])
	}
}

func TestAppendMarkerKeyAllocations(t *testing.T) {
	buf := make([]byte, 0, 64)
	at := time.UnixMilli(1764000000123)
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = AppendMarkerKey(buf[:0], "runs/", at, "run-42")
	})
	assert.Zero(t, allocs, "AppendMarkerKey allocs = %v, want 0", allocs)
	key, _ := AppendMarkerKey(nil, "runs/", at, "run-42")
	allocs = testing.AllocsPerRun(100, func() {
		_, _, _ = ParseMarkerKey("runs/", key)
	})
	assert.Zero(t, allocs, "ParseMarkerKey allocs = %v, want 0", allocs)
}

func TestAppendMarkerKeyKeepsDstOnError(t *testing.T) {
	t.Parallel()
	dst := []byte("keep")
	got, err := AppendMarkerKey(dst, "runs/", time.UnixMilli(1), "")
	require.ErrorIs(t, err, ErrInvalidID)
	assert.Equal(t, "keep", string(got))
}

func TestCheckMarkerKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key  string
		want string // "" for a marker-shaped key, else a part of the error
	}{
		{"runs/00000001764000000123/run-42", ""},
		{"orders/done/00000001764000000123/order.42", ""}, // an id of another rule
		{"a:b/00000001764000000123/x/y", ""},
		{"runs/2024/00000001764000000123/x", ""}, // a prefix with digits in it
		{"", "not <prefix><20 digits>/<id>"},
		{"hello", "not <prefix><20 digits>/<id>"},
		{"runs/done/abc", "not <prefix><20 digits>/<id>"},
		{"runs/00000001764000000123/", "not <prefix><20 digits>/<id>"},      // empty id
		{"00000001764000000123/run-42", "not <prefix><20 digits>/<id>"},     // no prefix
		{"runs00000001764000000123/run-42", "not <prefix><20 digits>/<id>"}, // a prefix New refuses
		{"runs/0000000176400000012/run-42", "not <prefix><20 digits>/<id>"},
		{"runs/99999999999999999999/run-42", "after 9999-12-31"},
	}
	for _, tt := range tests {
		err := CheckMarkerKey([]byte(tt.key))
		if tt.want == "" {
			assert.NoError(t, err, "CheckMarkerKey(%q)", tt.key)
			continue
		}
		if assert.ErrorIs(t, err, ErrMalformedMarker, "CheckMarkerKey(%q)", tt.key) {
			assert.Contains(t, err.Error(), tt.want, "CheckMarkerKey(%q)", tt.key)
		}
	}
}

func FuzzParseMarkerKey(f *testing.F) {
	f.Add("runs/", []byte("runs/00000001764000000123/run-42"), int64(0), "a")
	f.Add("runs/", []byte("runs/123/a"), int64(1764000000123), "run-42")
	f.Add("p", []byte("p18446744073709551615/x"), int64(1<<63-1), strings.Repeat("z", MaxIDLen))
	f.Add("", []byte("00000000000000000000/"), int64(-1), "")
	f.Fuzz(func(t *testing.T, prefix string, key []byte, ms int64, id string) {
		// Parsing arbitrary bytes never panics, and what it accepts
		// re-encodes to the very same key.
		if at, gotID, err := ParseMarkerKey(prefix, key); err == nil && isDigit(key[len(prefix)]) {
			again, err := MarkerKey(prefix, at, string(gotID))
			require.NoError(t, err)
			require.Equal(t, key, again)
			// A marker of a prefix New takes is shaped like one.
			if prefix != "" && !idByte(prefix[len(prefix)-1]) {
				require.NoError(t, CheckMarkerKey(key), "CheckMarkerKey(%q)", key)
			}
		}
		if err := CheckMarkerKey(key); err != nil {
			require.ErrorIs(t, err, ErrMalformedMarker)
		}
		// Every valid (time, id) round-trips.
		at := time.UnixMilli(ms)
		k, err := MarkerKey(prefix, at, id)
		if ms < 0 || ms > MaxMarkerTime.UnixMilli() || ValidateID(id) != nil {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		gotAt, gotID, err := ParseMarkerKey(prefix, k)
		require.NoError(t, err)
		require.Equal(t, ms, gotAt.UnixMilli())
		require.Equal(t, id, string(gotID))
	})
}

func BenchmarkAppendMarkerKey(b *testing.B) {
	buf := make([]byte, 0, 64)
	at := time.UnixMilli(1764000000123)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendMarkerKey(buf[:0], "runs/", at, "run-42")
	}
}

func BenchmarkParseMarkerKey(b *testing.B) {
	key, _ := MarkerKey("runs/", time.UnixMilli(1764000000123), "run-42")
	b.ReportAllocs()
	for b.Loop() {
		_, _, _ = ParseMarkerKey("runs/", key)
	}
}

func TestParse8(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	cases := []string{"00000000", "99999999", "12345678", "00000001", "10000000", "09223372"}
	for range 10000 {
		cases = append(cases, fmt.Sprintf("%08d", rng.IntN(100_000_000)))
	}
	for _, c := range cases {
		got, ok := parse8([]byte(c))
		want, _ := strconv.ParseUint(c, 10, 64)
		require.True(t, ok, "parse8(%q) refused", c)
		require.Equal(t, want, got, "parse8(%q)", c)
	}
	for _, bad := range []string{"0000000/", ":0000000", "1234a678", "1234 678", "\x00\x00\x00\x00\x00\x00\x00\x00", "\xff2345678", "0000000\xb0"} {
		_, ok := parse8([]byte(bad))
		assert.False(t, ok, "parse8(%q) accepted", bad)
	}
}

// markerShaped is the marker rule written plainly: the prefix, exactly 20
// ASCII digits, '/', and at least one byte.
func markerShaped(prefix string, key []byte) bool {
	rest, ok := bytes.CutPrefix(key, []byte(prefix))
	if !ok || len(rest) < TimestampWidth+2 || rest[TimestampWidth] != '/' {
		return false
	}
	for _, c := range rest[:TimestampWidth] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// FuzzClassifyKey checks the sweep's sorting of keys into markers,
// malformed markers (deleted) and foreign keys (never touched) against the
// rule written plainly: nothing that is not marker-shaped may ever be
// classed as deletable.
func FuzzClassifyKey(f *testing.F) {
	for _, k := range []string{"runs/00000001764000000123/a", "runs/0042/state", "runs/00000001764000000123/", "runs/99999999999999999999/a",
		"runs/00000253402300800000/x", "runs/0000000176400000012x/a", "runs/000000017640000001234/a", "runs/00000001764000000123/a b",
		"runs/0000x001764000000123/a", "runs/000000017640000001:3/a", "runs/00010001764000000123/a", "runs/00002533402300800000/a"} {
		f.Add("runs/", []byte(k))
	}
	f.Add("", []byte("00000001764000000123/a"))
	f.Add("12345678", []byte("1234567800000001764000000123/a"))
	f.Add("123456789", []byte("12345678900000001764000000123/a"))
	f.Add("runs/", []byte("runs/"))
	f.Fuzz(func(t *testing.T, prefix string, key []byte) {
		ms, id, foreign, err := parseKey(prefix, key)
		shaped := markerShaped(prefix, key)
		require.Equal(t, !shaped, foreign, "key %q: foreign = %v, err = %v", key, foreign, err)
		if !shaped {
			require.Error(t, err)
			return
		}
		digits := string(key[len(prefix) : len(prefix)+TimestampWidth])
		v, perr := strconv.ParseUint(digits, 10, 64)
		inRange := perr == nil && v <= uint64(MaxMarkerTime.UnixMilli())
		require.Equal(t, inRange, err == nil, "key %q: err = %v", key, err)
		if err == nil {
			require.Equal(t, int64(v), ms)
			require.Equal(t, key[len(prefix)+TimestampWidth+1:], id)
		}
	})
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// FuzzParseRetryKey: parsing a key of the retry or parked range never
// panics, what it accepts re-encodes to the same key, and every key the
// sweep writes parses back to what it was written with.
func FuzzParseRetryKey(f *testing.F) {
	f.Add("runs/", []byte("runs/r00000001764000000123/00000001764000000000/3/run-42"), int64(1764000000123), int64(1764000000000), 3, "a", true)
	f.Add("runs/", []byte("runs/p00000001764000000000/12/x"), int64(0), int64(1), 1, "b", false)
	f.Add("p/", []byte("p/r99999999999999999999/00000000000000000000/1/x"), int64(-1), int64(0), 0, "", true)
	f.Add("runs/", []byte("runs/r00000001764000000123/00000001764000000000/h2/run-42"), int64(1764000000123), int64(1764000000000), -1, "a", true)
	f.Add("runs/", []byte("runs/p00000001764000000000/d3/run-42"), int64(1764000000123), int64(1764000000000), -2, "a", false)
	f.Add("runs/", []byte("runs/r00000001764000000123/00000001764000000000/dh1/run-42"), int64(1764000000123), int64(1764000000000), -3, "a", true)
	f.Fuzz(func(t *testing.T, prefix string, key []byte, at, finished int64, attempts int, id string, retry bool) {
		infix := byte(parkedInfix)
		if retry {
			infix = retryInfix
		}
		if k, _, err := parseRetryKey(prefix, infix, key); err == nil {
			require.LessOrEqual(t, k.finished, maxMarkerMs)
			require.NotEmpty(t, k.id)
			var again []byte
			if retry {
				again = appendRetryKey(nil, prefix, k.kind, k.at, k.finished, k.attempts, string(k.id))
			} else {
				require.Zero(t, k.kind&keyHeld, "a held key in the parked range")
				again = appendParkedKey(nil, prefix, k.kind, k.finished, k.attempts, string(k.id))
			}
			// Attempts may be spelt with leading zeros; the rest is exact.
			if k2, _, err := parseRetryKey(prefix, infix, again); assert.NoError(t, err) {
				require.Equal(t, k, k2)
			}
			if _, gotID, err := ParseMarkerKey(prefix, key); err == nil {
				require.Equal(t, k.id, gotID)
			}
		}
		// Attempts of -1 stand for a held key (retry range), -2 for a
		// deadline key, -3 for a held deadline key (retry range), with
		// attempts 0.
		var kind byte
		switch attempts {
		case -1:
			if retry {
				kind, attempts = keyHeld, 0
			}
		case -2:
			kind, attempts = keyDeadline, 0
		case -3:
			if retry {
				kind, attempts = keyDeadline|keyHeld, 0
			}
		}
		if at < 0 || at > maxMarkerMs || finished < 0 || finished > maxMarkerMs || attempts < 0 || attempts > maxAttempts || id == "" {
			return
		}
		var key2 []byte
		if retry {
			key2 = appendRetryKey(nil, prefix, kind, at, finished, attempts, id)
		} else {
			key2 = appendParkedKey(nil, prefix, kind, finished, attempts, id)
			at = finished
		}
		k, foreign, err := parseRetryKey(prefix, infix, key2)
		require.NoError(t, err, "%q", key2)
		require.False(t, foreign)
		require.Equal(t, retryKey{at: at, finished: finished, attempts: attempts, kind: kind, id: []byte(id)}, k)
	})
}

func TestAppendTimestamp(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	cases := []uint64{0, 1, 9, 10, 99, 100, 9999, 10000, 99_999_999, 100_000_000, 1764000000123, uint64(MaxMarkerTime.UnixMilli()), 1e16 - 1, 1e16, 99_999_999_999_999_999, math.MaxUint64}
	for range 10000 {
		cases = append(cases, rng.Uint64()>>rng.IntN(64))
	}
	for _, v := range cases {
		got := string(appendTimestamp([]byte("p"), v))
		assert.Equal(t, fmt.Sprintf("p%020d", v), got, "appendTimestamp(%d)", v)
	}
}

// TestParseStampMatchesStrconv: the 4-leading-zeros fast path and the
// slow path agree with strconv on digits, reject a non-digit in any
// position (0x2F, 0x3A, high bytes), and values >= 1e16 or past
// MaxMarkerTime never come back as a valid marker time.
func TestParseStampMatchesStrconv(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	check := func(b []byte) {
		t.Helper()
		got, ok := parseStamp(b)
		v, err := strconv.ParseUint(string(b), 10, 64)
		allDigits := true
		for _, c := range b {
			allDigits = allDigits && c >= '0' && c <= '9'
		}
		require.Equal(t, allDigits, ok, "%q", b)
		if !ok {
			return
		}
		if err == nil && v <= uint64(maxMarkerMs) {
			require.Equal(t, v, got, "%q", b)
		} else {
			require.Greater(t, got, uint64(maxMarkerMs), "%q", b)
		}
	}
	edges := []uint64{0, 1, 9, 99999999, 100000000, 9999999999999999, 1e16, 1e16 + 1, uint64(maxMarkerMs), uint64(maxMarkerMs) + 1,
		253402300799999, 1e19, 18446744073709551615}
	for _, v := range edges {
		check([]byte(fmt.Sprintf("%020d", v)))
	}
	check([]byte("99999999999999999999"))
	for range 20000 { // the fuzzers (FuzzParseMarkerKey, FuzzClassifyKey) search further in CI
		var v uint64
		switch r.IntN(3) {
		case 0:
			v = r.Uint64N(uint64(maxMarkerMs) * 2)
		case 1:
			v = r.Uint64N(1e17)
		default:
			v = r.Uint64()
		}
		b := []byte(fmt.Sprintf("%020d", v))
		if r.IntN(2) == 0 {
			b[r.IntN(20)] = []byte{'/', ':', 0x00, 0xff, 'a', '0' + 10, 0x39 + 0x80, 0x30 - 6}[r.IntN(8)]
		}
		check(b)
		var buf []byte
		require.Equal(t, fmt.Sprintf("%020d", v), string(appendTimestamp(buf, v)))
	}
}

// TestOldMarkersStillParse: markers of v0.1.0 (<prefix><ts>/<id>) are
// cleared as before, and a retry key is foreign to a sweep of v0.1.0's
// key rules: it lies outside the range a pass of that version reads.
func TestOldMarkersStillParse(t *testing.T) {
	t.Parallel()
	key := appendRetryKey(nil, "runs/", 0, t0.UnixMilli(), t0.UnixMilli(), 1, "x")
	assert.False(t, string(key) >= "runs/0" && string(key) < "runs/:", "%q is outside the marker range", key)
	_, _, foreign, err := parseKey("runs/", key)
	assert.True(t, foreign)
	require.Error(t, err)
}
