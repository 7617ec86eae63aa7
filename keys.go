package retention

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// TimestampWidth is the number of decimal digits of a marker's timestamp: the
// width of the largest uint64, so that byte order of keys equals time order.
const TimestampWidth = 20

// MaxMarkerTime is the latest finish time a marker can record: the last
// millisecond of the year 9999. A later time is almost always seconds taken
// for milliseconds, as in time.Unix(ms, 0).
var MaxMarkerTime = time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC)

var (
	epoch       = time.UnixMilli(0)
	maxMarkerMs = MaxMarkerTime.UnixMilli()
)

// MaxIDLen is the longest id, in bytes, that ValidateID accepts.
const MaxIDLen = 128

// ValidateID reports whether id is a valid marker id under the default rule:
// 1 to MaxIDLen bytes, each one of A-Z, a-z, 0-9, '_' or '-', so that an id
// is safe to splice into the caller's own keys. The error matches
// ErrInvalidID and names the offending byte. See docs/clearing.md.
func ValidateID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: %d bytes long, at most %d allowed", ErrInvalidID, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if !idByte(id[i]) {
			return fmt.Errorf("%w: byte %d of %q is %q, want one of A-Z a-z 0-9 _ -", ErrInvalidID, i, id, id[i])
		}
	}
	return nil
}

func idByte(c byte) bool { return idBytes[c] }

// idBytes marks the bytes ValidateID accepts; a table beats the comparisons
// on the sweep's per-marker path.
var idBytes = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	return t
}()

// MarkerKey returns the marker key "<prefix><ts>/<id>" for an entity that
// finished at t: ts is t in Unix milliseconds, rounded up so that the
// marker never falls due early, padded to TimestampWidth digits. It refuses
// an id that fails ValidateID and a time before the Unix epoch or after
// MaxMarkerTime. Write the key, with an empty value, in the transaction
// that records the entity's terminal state.
func MarkerKey(prefix string, t time.Time, id string) ([]byte, error) {
	key, err := AppendMarkerKey(make([]byte, 0, len(prefix)+TimestampWidth+1+len(id)), prefix, t, id)
	if err != nil {
		return nil, err
	}
	return key, nil
}

// AppendMarkerKey appends the marker key of MarkerKey to dst and returns the
// extended slice. It does not allocate when dst has room for the key.
func AppendMarkerKey(dst []byte, prefix string, t time.Time, id string) ([]byte, error) {
	if err := ValidateID(id); err != nil {
		return dst, err
	}
	return appendKey(dst, prefix, t, id)
}

// appendKey is AppendMarkerKey for an id checked by the caller's rule.
func appendKey(dst []byte, prefix string, t time.Time, id string) ([]byte, error) {
	ms, err := markerMillis(t)
	if err != nil {
		return dst, err
	}
	dst = append(dst, prefix...)
	dst = appendTimestamp(dst, uint64(ms))
	dst = append(dst, '/')
	return append(dst, id...), nil
}

// markerMillis returns t in Unix milliseconds rounded up, or an error
// matching ErrInvalidTime when that is outside epoch..MaxMarkerTime.
func markerMillis(t time.Time) (int64, error) {
	if t.Before(epoch) {
		return 0, fmt.Errorf("%w: %s is before the Unix epoch", ErrInvalidTime, t.UTC().Format(time.RFC3339Nano))
	}
	if t.After(MaxMarkerTime) {
		return 0, fmt.Errorf("%w: %s is after %s; a time made from milliseconds with time.Unix(ms, 0) "+
			"instead of time.UnixMilli(ms) lands there", ErrInvalidTime, t.UTC().Format(time.RFC3339Nano), MaxMarkerTime.Format(time.RFC3339Nano))
	}
	ms := t.UnixMilli()
	if time.UnixMilli(ms).Before(t) {
		ms++ // MaxMarkerTime is a whole millisecond, so this stays within it
	}
	return ms, nil
}

func appendTimestamp(dst []byte, ms uint64) []byte {
	var buf [TimestampWidth]byte
	for i := TimestampWidth - 1; i >= 0; i-- {
		buf[i] = byte('0' + ms%10)
		ms /= 10
	}
	return append(dst, buf[:]...)
}

// ParseMarkerKey splits a marker key written by MarkerKey into the time it
// records and its id, which aliases key. It also reads the keys of the
// sweep's retry and parked ranges, returning the entity's finish time they
// keep. Any other key is refused with an error matching ErrMalformedMarker
// that says which part is wrong. It does not allocate on success.
func ParseMarkerKey(prefix string, key []byte) (t time.Time, id []byte, err error) {
	ms, id, _, err := parseKey(prefix, key)
	if err != nil && len(key) > len(prefix) && string(key[:len(prefix)]) == prefix {
		if infix := key[len(prefix)]; infix == retryInfix || infix == parkedInfix {
			var k retryKey
			if k, _, err = parseRetryKey(prefix, infix, key); err == nil {
				ms, id = k.finished, k.id
			}
		}
	}
	if err != nil {
		return time.Time{}, nil, err
	}
	if err := validateIDBytes(id); err != nil {
		return time.Time{}, nil, malformed(key, "id", err)
	}
	return time.UnixMilli(ms), id, nil
}

// CheckMarkerKey returns nil when key is shaped like a marker of some sweep:
// a prefix New accepts, TimestampWidth digits no later than MaxMarkerTime,
// '/' and a non-empty id, whatever the id rule. Otherwise it returns an
// error matching ErrMalformedMarker: no sweep would ever clear such a key.
// The adapters' MarkKeyTx and MarkKeyOp check keys with it.
func CheckMarkerKey(key []byte) error {
	var late error
	for i := 1; i+TimestampWidth+1 < len(key); i++ {
		if idByte(key[i-1]) || key[i+TimestampWidth] != '/' {
			continue
		}
		_, _, foreign, err := parseKey(string(key[:i]), key)
		if err == nil {
			return nil
		}
		if !foreign && late == nil {
			late = err
		}
	}
	if late != nil {
		return late
	}
	return fmt.Errorf("%w %s: not <prefix><%d digits>/<id>", ErrMalformedMarker, strconv.Quote(string(key)), TimestampWidth)
}

// validateIDBytes is ValidateID with no string conversion on success.
func validateIDBytes(id []byte) error {
	if !validID(id) {
		return ValidateID(string(id)) // says what is wrong
	}
	return nil
}

// validID reports whether ValidateID accepts id; small enough to be
// inlined on the sweep's per-marker path.
func validID(id []byte) bool {
	for _, c := range id {
		if !idBytes[c] {
			return false
		}
	}
	return len(id) != 0 && len(id) <= MaxIDLen
}

// stampInPrefix returns where prefix holds TimestampWidth digits and '/'
// that a sweep of a shorter prefix would read as a marker's time (right
// after a byte no id holds) or a retry or parked key's (after r or p that
// follow one), or -1. Such a sweep would delete this prefix's markers as
// its own malformed ones: their ids hold a '/'.
func stampInPrefix(prefix string) int {
	for i := 1; i+TimestampWidth < len(prefix); i++ {
		if prefix[i+TimestampWidth] != '/' || !allDigits(prefix[i:i+TimestampWidth]) {
			continue
		}
		if outerEnd(prefix, i) > 0 {
			return i
		}
	}
	return -1
}

// outerEnd returns the length of the shorter prefix whose sweep reads the
// digits at i of prefix as a time, or 0 when no sweep would.
func outerEnd(prefix string, i int) int {
	switch {
	case !idByte(prefix[i-1]):
		return i
	case (prefix[i-1] == retryInfix || prefix[i-1] == parkedInfix) && i >= 2 && !idByte(prefix[i-2]):
		return i - 1
	}
	return 0
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseKey checks a marker key: prefix, TimestampWidth digits, '/', and a
// non-empty id; the id rule is left to the caller. On failure, foreign says
// whether the key is not even marker-shaped (the sweep leaves it alone)
// rather than a marker whose time is out of range (deleted as malformed).
func parseKey(prefix string, key []byte) (ms int64, id []byte, foreign bool, err error) {
	// Most keys are markers: parseBadKey says what is wrong with the others.
	if n := len(prefix); len(key) > n+TimestampWidth+1 && key[n+TimestampWidth] == '/' && string(key[:n]) == prefix {
		if v, ok := parseStamp(key[n : n+TimestampWidth]); ok && v <= uint64(maxMarkerMs) {
			return int64(v), key[n+TimestampWidth+1:], false, nil
		}
	}
	return parseBadKey(prefix, key)
}

// parseBadKey is parseKey's slow path, which says what is wrong.
func parseBadKey(prefix string, key []byte) (ms int64, id []byte, foreign bool, err error) {
	if len(key) < len(prefix) || string(key[:len(prefix)]) != prefix {
		return 0, nil, true, malformed(key, "prefix", fmt.Errorf("does not start with %q", prefix))
	}
	rest := key[len(prefix):]
	for i := range TimestampWidth {
		if i == len(rest) {
			return 0, nil, true, malformed(key, "timestamp", fmt.Errorf("%d digits, want %d", i, TimestampWidth))
		}
		if c := rest[i]; c < '0' || c > '9' {
			return 0, nil, true, malformed(key, "timestamp", fmt.Errorf("byte %d is %q, want a digit", i, c))
		}
	}
	v, _ := parseStamp(rest[:TimestampWidth])
	if len(rest) == TimestampWidth || rest[TimestampWidth] != '/' {
		return 0, nil, true, malformed(key, "separator", fmt.Errorf("want '/' after the %d-digit timestamp", TimestampWidth))
	}
	id = rest[TimestampWidth+1:]
	if len(id) == 0 {
		return 0, nil, true, malformed(key, "id", fmt.Errorf("%w: empty", ErrInvalidID))
	}
	if v > uint64(maxMarkerMs) {
		return 0, nil, false, malformed(key, "timestamp", fmt.Errorf("%s is after %s (milliseconds)", rest[:TimestampWidth], MaxMarkerTime.Format(time.RFC3339Nano)))
	}
	return int64(v), id, false, nil
}

// parse8 reads 8 ASCII digits at once: it checks them and folds them into
// their value in three multiplications instead of eight dependent steps.
func parse8(b []byte) (uint64, bool) {
	x := binary.LittleEndian.Uint64(b)
	const zeros, highNibbles = 0x3030303030303030, 0xF0F0F0F0F0F0F0F0
	// Every byte must be 0x30-0x3F, and stay below 0x40 when 6 is added
	// (no carry crosses bytes once the first test holds): '0' to '9'.
	if x&highNibbles != zeros || (x+0x0606060606060606)&highNibbles != zeros {
		return 0, false
	}
	x -= zeros // the first digit is the lowest byte
	x = (x * 10) + (x >> 8)
	x = ((x & 0x000000FF000000FF) * (100 + 1_000_000<<32)) + (((x >> 16) & 0x000000FF000000FF) * (1 + 10_000<<32))
	return x >> 32, true
}

func malformed(key []byte, part string, cause error) error {
	return fmt.Errorf("%w %s: %s %w", ErrMalformedMarker, strconv.Quote(string(key)), part, cause)
}

// The retry range (failed, held and deadline markers) and the parked range
// (Config.MaxAttempts) lie under the prefix, outside the markers' range (the
// prefix and a digit), and keep the entity's finish time (or its deadline,
// d) and its failed attempts across restarts. h marks a held key.
//
//	<prefix>r<at, ms:020>/<finished or deadline, ms:020>/[d][h]<attempts>/<id>
//	<prefix>p<finished or deadline, ms:020>/[d]<attempts>/<id>
//
// See docs/clearing.md and docs/policies.md.
const (
	retryInfix  = 'r'
	parkedInfix = 'p'
)

// infixRange returns the bounds of the keys of prefix, infix and a digit.
func infixRange(prefix string, infix byte) (lower, upper []byte) {
	return append([]byte(prefix), infix, '0'), append([]byte(prefix), infix, '9'+1)
}

// maxAttempts bounds the attempts a key records: nine digits.
const maxAttempts = 999_999_999

// retryKey is a parsed key of the retry or parked range.
type retryKey struct {
	at       int64 // retry range: when it falls due; parked range: finished
	finished int64 // the entity's finish time, Unix ms
	attempts int
	kind     byte // keyDeadline and keyHeld, set as the letters before the attempts say
	id       []byte
}

// The kinds of retry-range key, flags of retryKey.kind and item.kind that
// the letters d and h before the attempts mark.
const (
	keyDeadline = 1 << iota // d: a deadline of its own in place of the finish time
	keyHeld                 // h: held until its retry time (retry range only)
)

// state tells what k, a key of the retry range, stands for at now: held or
// waiting for its deadline, then due once that time came; or retrying
// until a clear settles it. Sweep.Pending and Sweep.Backlog go by it alone.
func (k retryKey) state(now time.Time) MarkerState {
	switch {
	case k.kind&keyHeld == 0 && (k.kind&keyDeadline == 0 || k.at != k.finished):
		return StateRetrying
	case time.UnixMilli(k.at).After(now):
		if k.kind&keyHeld != 0 {
			return StateHeld
		}
		return stateWaiting
	}
	return StateDue
}

// appendRetryKey appends the retry-range key of id of kind, due again at atMs.
func appendRetryKey(dst []byte, prefix string, kind byte, atMs, finishedMs int64, attempts int, id string) []byte {
	dst = append(append(dst, prefix...), retryInfix)
	dst = append(appendTimestamp(dst, uint64(atMs)), '/')
	return appendAttemptsID(appendTimestamp(dst, uint64(finishedMs)), kind, attempts, id)
}

// appendParkedKey appends the parked-range key of id; it is never held.
func appendParkedKey(dst []byte, prefix string, kind byte, finishedMs int64, attempts int, id string) []byte {
	dst = append(append(dst, prefix...), parkedInfix)
	return appendAttemptsID(appendTimestamp(dst, uint64(finishedMs)), kind&keyDeadline, attempts, id)
}

// appendAttemptsID appends '/', the kind's letters, the attempts, '/' and id.
func appendAttemptsID(dst []byte, kind byte, attempts int, id string) []byte {
	dst = append(dst, '/')
	if kind&keyDeadline != 0 {
		dst = append(dst, 'd')
	}
	if kind&keyHeld != 0 {
		dst = append(dst, 'h')
	}
	dst = append(strconv.AppendInt(dst, int64(min(attempts, maxAttempts)), 10), '/')
	return append(dst, id...)
}

// parseRetryKey parses a key of the retry or the parked range (infix);
// foreign and err mean what they do for parseKey.
func parseRetryKey(prefix string, infix byte, key []byte) (k retryKey, foreign bool, err error) {
	if len(key) <= len(prefix) || string(key[:len(prefix)]) != prefix || key[len(prefix)] != infix {
		return k, true, malformed(key, "prefix", fmt.Errorf("does not start with %q", prefix+string(infix)))
	}
	rest := key[len(prefix)+1:]
	stamps := []*int64{&k.at, &k.finished}
	if infix == parkedInfix {
		stamps = stamps[1:]
		defer func() { k.at = k.finished }()
	}
	for _, stamp := range stamps {
		var v uint64
		ok := len(rest) > TimestampWidth && rest[TimestampWidth] == '/'
		if ok {
			v, ok = parseStamp(rest[:TimestampWidth])
		}
		if !ok {
			return k, true, malformed(key, "timestamp", fmt.Errorf("want %d digits and '/'", TimestampWidth))
		}
		if v > uint64(maxMarkerMs) {
			return k, false, malformed(key, "timestamp", fmt.Errorf("%s is after %s (milliseconds)", rest[:TimestampWidth], MaxMarkerTime.Format(time.RFC3339Nano)))
		}
		*stamp, rest = int64(v), rest[TimestampWidth+1:]
	}
	if len(rest) > 0 && rest[0] == 'd' {
		k.kind, rest = k.kind|keyDeadline, rest[1:]
	}
	if len(rest) > 0 && rest[0] == 'h' && infix == retryInfix {
		k.kind, rest = k.kind|keyHeld, rest[1:]
	}
	n := 0
	for n < len(rest) && n < 10 && '0' <= rest[n] && rest[n] <= '9' {
		k.attempts = k.attempts*10 + int(rest[n]-'0')
		n++
	}
	if n == 0 || n > 9 || n == len(rest) || rest[n] != '/' {
		return k, true, malformed(key, "attempts", errors.New("want 1 to 9 digits and '/'"))
	}
	if k.id = rest[n+1:]; len(k.id) == 0 {
		return k, true, malformed(key, "id", fmt.Errorf("%w: empty", ErrInvalidID))
	}
	return k, false, nil
}

// parseStamp reads TimestampWidth digits. A value past any marker time
// comes back as one, rather than wrapped.
func parseStamp(b []byte) (uint64, bool) {
	if binary.LittleEndian.Uint32(b) == 0x30303030 {
		// Every time up to MaxMarkerTime has 5 leading zeros: two blocks
		// of 8 digits hold the rest.
		hi, ok1 := parse8(b[4:12])
		lo, ok2 := parse8(b[12:20])
		return hi*100_000_000 + lo, ok1 && ok2
	}
	hi, ok1 := parse8(b[0:8])
	mid, ok2 := parse8(b[8:16])
	var lo uint64
	ok3 := true
	for _, c := range b[16:TimestampWidth] {
		d := c - '0' // a non-digit wraps past 9
		ok3 = ok3 && d <= 9
		lo = lo*10 + uint64(d)
	}
	if !ok1 || !ok2 || !ok3 {
		return 0, false
	}
	if hi > uint64(maxMarkerMs)/1_000_000_000_000 {
		return uint64(maxMarkerMs) + 1, true // hi·10¹² could wrap
	}
	return hi*1_000_000_000_000 + mid*10_000 + lo, true
}
