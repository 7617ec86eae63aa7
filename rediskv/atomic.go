package rediskv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
)

// KeysFunc returns the keys that hold the state of the entities ids: an
// AtomicKV deletes them with the ids' markers. It must not fail, and must
// name keys of the marker set's Redis (on Redis Cluster, of its hash slot:
// a clear that names a key of another slot returns ErrCrossSlot, having
// sent nothing). An id may come twice in one call, when it has several
// markers.
type KeysFunc func(ids []string) []string

// AtomicKV is a KV that clears entities itself, deleting their state keys
// in the script that removes their markers: a retention.ClearDeleter.
// Create one with KV.WithStateKeys or KV.WithClear, and give it to
// retention.New with neither Config.Clear nor Config.ClearBatch set.
//
// One made by WithStateKeys is also a retention.RunClearer: a sweep with
// Concurrency 1 (the default) and no Config.ValidateID, Limiter nor DryRun
// then clears its expired markers by runs, each one script call that reads the next
// markers from the set, checks them, deletes their entities' state keys
// and removes them, with no Scan of the range: see ClearRun. One made by
// WithClear names the state keys in Go, which a script cannot call, so
// the sweep reads each page and sends it back as ClearAndDelete batches.
//
// A script runs whole or not at all, and nothing else runs in between, so a
// crash can no longer leave an entity's keys deleted with its marker still
// there. The script first checks that every marker of the batch is still in
// the set, and changes nothing when one is gone (an error matching
// retention.ErrMarkerGone): a batch sent again after a timeout whose
// first call did commit, or one another replica cleared meanwhile, clears
// nothing a second time. A run reads its markers in its own script, so
// two runs never take one marker, and a run sent again takes the next.
// With a sweep that reschedules failed markers by moving them
// (retention.Mover, which KV is), each entity is then cleared exactly
// once, even with no lease. It applies to state held in keys of
// the same Redis (on Redis Cluster, of the same hash slot: give state keys
// the set's hash tag). State elsewhere cannot join the script: use
// Config.ClearBatch there. Under a rediskv Locker the script checks the
// lease key's token too, so a replica that lost its lease clears nothing.
//
// An error that Redis returns for ClearAndDelete (marker gone, lease lost,
// a refused script) means that nothing changed; the sweep keeps the
// batch's markers and tries their ids again. Only a call whose reply never
// came (a timeout, a lost connection) may have committed unheard, as
// retention.ClearDeleter says.
type AtomicKV struct {
	*KV
	keysOf    KeysFunc
	templates []template // nil: made by WithClear, no runs
	runArgs   []any      // the templates' parts, clearRunScript's last arguments
}

var (
	_ retention.RunClearer = (*AtomicKV)(nil)
	_ retention.Putter     = (*AtomicKV)(nil)
	_ retention.Mover      = (*AtomicKV)(nil)
)

// WithClear returns an AtomicKV over k's set whose ClearAndDelete deletes
// the keys keysOf names for each batch of ids, only if every marker of the
// batch is still in the set. It cannot clear runs; where the state keys
// of an id are fixed strings around it, WithStateKeys can.
func (k *KV) WithClear(keysOf KeysFunc) (*AtomicKV, error) {
	if keysOf == nil {
		return nil, errors.New("rediskv: WithClear: keysOf must not be nil")
	}
	return &AtomicKV{KV: k, keysOf: keysOf}, nil
}

// WithStateKeys returns an AtomicKV over k's set that deletes, for each id
// it clears, the keys the templates name: each template is a key in which
// "<id>" stands for the id, once, such as "{runs}:state:<id>" and
// "{runs}:log:<id>". Templates, unlike WithClear's KeysFunc, can be
// applied inside Redis, so this AtomicKV is a retention.RunClearer too
// (see ClearRun); its ClearAndDelete deletes the same keys.
//
// Runs save the sweep a Scan a batch but move work onto Redis's one
// thread: the script checks each member and builds its keys, which a
// page's batch has the client do. In same-run comparisons Redis spent
// 2.5–2.9 µs an entity on runs of 1,000 against 1.9–2.1 µs on pages of
// 1,000 through WithClear, at the same rate or a little lower
// (BENCHMARKS.md): where the application shares Redis, prefer WithClear.
//
// It refuses templates that could delete what they must not: one without
// "<id>" or with it twice, one given twice, one that names the marker set
// itself for some id, and two that can name one key for two ids, as
// "job:<id>" and "job:<id>-log" both name "job:a-log" (end the id with a
// byte no id holds, such as ':'). On Redis Cluster (or a Ring) every key
// a template names must hash to the set's slot whatever the id: give the
// template the set's hash tag, outside "<id>".
func (k *KV) WithStateKeys(templates ...string) (*AtomicKV, error) {
	if len(templates) == 0 {
		return nil, errors.New(`rediskv: WithStateKeys: no template: give at least one key with "<id>" in it, such as "{runs}:state:<id>"`)
	}
	a := &AtomicKV{KV: k, templates: make([]template, len(templates))}
	for i, raw := range templates {
		t, err := k.parseTemplate(raw)
		if err != nil {
			return nil, fmt.Errorf("rediskv: WithStateKeys: template %q %w", raw, err)
		}
		for j, u := range a.templates[:i] {
			if err := t.overlaps(u); err != nil {
				return nil, fmt.Errorf("rediskv: WithStateKeys: templates %q and %q %w", templates[j], raw, err)
			}
		}
		a.templates[i] = t
		a.runArgs = append(a.runArgs, t.before, t.after)
	}
	a.keysOf = a.stateKeys
	return a, nil
}

// idPlaceholder stands for the id in a WithStateKeys template. Not {id}:
// braces make a Redis Cluster hash tag.
const idPlaceholder = "<id>"

// template is a WithStateKeys template: the key of an id is before, the
// id, after.
type template struct{ before, after string }

func (t template) key(id string) string { return t.before + id + t.after }

// parseTemplate splits raw at its "<id>" and checks it against k's set; its
// error completes "template %q ...".
func (k *KV) parseTemplate(raw string) (template, error) {
	before, after, ok := strings.Cut(raw, idPlaceholder)
	switch {
	case !ok:
		return template{}, errors.New(`holds no "<id>": the key must name the id, as in "{runs}:state:<id>"`)
	case strings.Contains(after, idPlaceholder):
		return template{}, fmt.Errorf(`holds "<id>" %d times, want it once`, strings.Count(raw, idPlaceholder))
	}
	t := template{before, after}
	if id, ok := t.names(k.key); ok {
		return template{}, fmt.Errorf("names the marker set %q itself, for the id %q", k.key, id)
	}
	if clustered(k.rdb) {
		if hashPart(t.key("a")) != hashPart(t.key("b")) {
			return template{}, fmt.Errorf("hashes to a slot that depends on the id: give it the marker set %q's hash tag, outside %q", k.key, idPlaceholder)
		}
		if !sameSlot(k.rdb, t.key("a"), k.key) {
			return template{}, fmt.Errorf("hashes to slot %d, the marker set %q to slot %d: give them one hash tag", Slot(t.key("a")), k.key, Slot(k.key))
		}
	}
	return t, nil
}

// names returns the id for which t names key, if some id ValidateID
// accepts does.
func (t template) names(key string) (string, bool) {
	if len(key) <= len(t.before)+len(t.after) || !strings.HasPrefix(key, t.before) || !strings.HasSuffix(key, t.after) {
		return "", false
	}
	id := key[len(t.before) : len(key)-len(t.after)]
	return id, retention.ValidateID(id) == nil
}

// overlaps returns an error, completing "templates %q and %q ...", when u
// (the earlier) and t name one key for two ids. u(y) = t(x) needs the
// shorter of the parts before "<id>" to start the longer, and the shorter
// of the parts after it to end the longer; y then holds what the longer
// adds, and x is y with it taken off and the other's put on. The y tried,
// one letter with what must be added, is the shortest, so if it is too
// long for an id every other is too.
func (t template) overlaps(u template) error {
	if t == u {
		return errors.New("are the same: give each once")
	}
	for _, c := range []string{"a", "b"} { // "a" alone makes x = y when both add "a"
		y := c
		if len(u.before) < len(t.before) && strings.HasPrefix(t.before, u.before) {
			y = t.before[len(u.before):] + y
		}
		if len(u.after) < len(t.after) && strings.HasSuffix(t.after, u.after) {
			y += t.after[:len(t.after)-len(u.after)]
		}
		if retention.ValidateID(y) != nil {
			return nil
		}
		key := u.key(y)
		if x, ok := t.names(key); ok && x != y {
			return fmt.Errorf("both name %q, for the ids %q and %q: end the id with a byte no id holds, such as ':'", key, y, x)
		}
	}
	return nil
}

// templateNames returns an error when a template names key, which is
// what, for some id: a clear of that id would delete it.
func (a *AtomicKV) templateNames(key, what string) error {
	for _, t := range a.templates {
		if id, ok := t.names(key); ok {
			return fmt.Errorf("rediskv: state key template %q names %s %q, for the id %q: a clear of that id would delete it",
				t.before+idPlaceholder+t.after, what, key, id)
		}
	}
	return nil
}

// stateKeys is the KeysFunc of an AtomicKV made by WithStateKeys.
func (a *AtomicKV) stateKeys(ids []string) []string {
	keys := make([]string, 0, len(ids)*len(a.templates))
	for _, id := range ids {
		for _, t := range a.templates {
			keys = append(keys, t.key(id))
		}
	}
	return keys
}

// Delete is KV.Delete; under a fence on ctx it asks the fence for a view
// of the AtomicKV, the KV the sweep was given.
func (a *AtomicKV) Delete(ctx context.Context, keys ...[]byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		return view.Delete(ctx, keys...)
	}
	return a.delete(ctx, keys)
}

// Put is KV.Put; under a fence on ctx it asks the fence for a view of the
// AtomicKV.
func (a *AtomicKV) Put(ctx context.Context, key, value []byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		return putThrough(ctx, view, key, value)
	}
	return a.put(ctx, key, value)
}

// Move is KV.Move; under a fence on ctx it asks the fence for a view of
// the AtomicKV.
func (a *AtomicKV) Move(ctx context.Context, from, to [][]byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		return moveThrough(ctx, view, from, to)
	}
	_, err = a.move(ctx, "", "", from, to)
	return err
}

// clearScript checks that every member ARGV[2..] is in the set KEYS[2],
// then deletes KEYS[3..] and removes the members; with a token in ARGV[1]
// (a fence), only while the lease key KEYS[1] holds it. It returns the
// number of members removed, -1 when the fence refused and -2-i when
// ARGV[2+i] is missing, having done nothing in either case. Without a
// token, KEYS[1] repeats the set, so every key stays in the set's slot.
// Every check comes before the first write: Redis does not roll back a
// script that fails part way.
var clearScript = redis.NewScript(`if ARGV[1] ~= "" and redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
for i = 2, #ARGV, ` + fmt.Sprint(unpackChunk) + ` do
	local scores = redis.call("zmscore", KEYS[2], unpack(ARGV, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #ARGV)))
	for j = 1, #scores do
		if not scores[j] then
			return -1 - (i - 2 + j)
		end
	end
end
for i = 3, #KEYS, ` + fmt.Sprint(unpackChunk) + ` do
	redis.call("unlink", unpack(KEYS, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #KEYS)))
end
local n = 0
for i = 2, #ARGV, ` + fmt.Sprint(unpackChunk) + ` do
	n = n + redis.call("zrem", KEYS[2], unpack(ARGV, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #ARGV)))
end
return n`)

// clearRangeScript is clearScript for a batch whose markers are a run of
// the set: ARGV[2] and ARGV[3] are its first and last marker, ARGV[4] their
// number and ARGV[5] the markers joined by newlines. It deletes the state
// keys and the range only when the set's members from the first to the
// last are exactly those markers, and returns -2, having done nothing,
// when they are not (a marker gone, a member of the range not in the
// batch): the caller then sends clearScript, which says which. A batch
// then costs Redis one argument per marker, not two, and one ZREMRANGEBYLEX
// instead of a lookup per marker for ZMSCORE and again for ZREM. The
// markers hold no newline (the caller sends clearScript otherwise), and
// the joined members must be the joined markers, so their count of
// newlines says that no member holds one either: equal texts mean equal
// lists.
var clearRangeScript = redis.NewScript(`if ARGV[1] ~= "" and redis.call("get", KEYS[1]) ~= ARGV[1] then
	return -1
end
local n = tonumber(ARGV[4])
local members = redis.call("zrange", KEYS[2], "[" .. ARGV[2], "[" .. ARGV[3], "BYLEX", "LIMIT", 0, n + 1)
if #members ~= n or table.concat(members, "\n") ~= ARGV[5] then
	return -2
end
for i = 3, #KEYS, ` + fmt.Sprint(unpackChunk) + ` do
	redis.call("unlink", unpack(KEYS, i, math.min(i + ` + fmt.Sprint(unpackChunk-1) + `, #KEYS)))
end
return redis.call("zremrangebylex", KEYS[2], "[" .. ARGV[2], "[" .. ARGV[3])`)

// joinedRange returns the markers joined by newlines, and false when there
// are none, they are not strictly ascending or one holds a newline.
func joinedRange(keys [][]byte) ([]byte, bool) {
	for i, k := range keys {
		if i > 0 && bytes.Compare(keys[i-1], k) >= 0 || bytes.IndexByte(k, '\n') >= 0 {
			return nil, false
		}
	}
	return bytes.Join(keys, []byte{'\n'}), len(keys) > 0
}

// ClearAndDelete implements retention.ClearDeleter with one script call:
// the entities' keys and the markers go together, only if every marker in
// keys is still in the set. When one is gone it changes nothing and
// returns an error matching retention.ErrMarkerGone. Under a fence on ctx
// (see retention.Fenced) it is the lease's fenced clear.
func (a *AtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return err
	}
	if view != nil {
		cd, ok := view.(retention.ClearDeleter)
		if !ok {
			return fmt.Errorf("rediskv: clear and delete: the fenced view (%T) cannot clear: %w", view, retention.ErrUnfenced)
		}
		return cd.ClearAndDelete(ctx, ids, keys)
	}
	_, err = a.run(ctx, "", "", ids, keys)
	return err
}

// errFenceRefused is run's error when the lease key no longer holds the
// token: the fenced view turns it into its own error.
var errFenceRefused = errors.New("rediskv: fence refused")

// run calls clearRangeScript, or clearScript when the markers are not a
// run of the set, fenced by lease and token when token is not
// empty. It returns errFenceRefused when the fence refused, and an error
// matching retention.ErrMarkerGone when a marker is gone.
func (a *AtomicKV) run(ctx context.Context, lease, token string, ids []string, keys [][]byte) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if token == "" {
		lease = a.key
	}
	state := a.keysOf(ids)
	if err := a.checkSlots(state); err != nil {
		return 0, fmt.Errorf("rediskv: clear and delete, nothing sent: %w", err)
	}
	scriptKeys := make([]string, 0, 2+len(state))
	scriptKeys = append(scriptKeys, lease, a.key)
	scriptKeys = append(scriptKeys, state...)
	n := int64(-2)
	var err error
	if joined, ok := joinedRange(keys); ok {
		n, err = clearRangeScript.Run(ctx, a.rdb, scriptKeys, token, keys[0], keys[len(keys)-1], len(keys), joined).Int64()
	}
	if err == nil && n == -2 {
		args := make([]any, 1, 1+len(keys))
		args[0] = token
		for _, k := range keys {
			args = append(args, k)
		}
		n, err = clearScript.Run(ctx, a.rdb, scriptKeys, args...).Int64()
	}
	switch {
	case err != nil:
		return 0, a.wrap(ctx, "clear and delete", err)
	case n == -1:
		return 0, errFenceRefused
	case n < -1:
		return 0, fmt.Errorf("rediskv: clear and delete %q: marker %q is not in the set, nothing changed: %w",
			a.key, keys[-n-2], retention.ErrMarkerGone)
	}
	return n, nil
}

// ClearRun implements retention.RunClearer with one script call: the
// script reads the first limit members of [from, end) from the set,
// checks that each is a marker, prefix, retention.TimestampWidth digits
// (a time up to retention.MaxMarkerTime), '/' and an id
// retention.ValidateID accepts, then deletes the keys the templates name
// for their ids (once an id) and removes the members, and returns them,
// ascending. When a member is not such a marker it changes nothing and
// returns an error matching retention.ErrMalformedMarker that names it.
// An AtomicKV made by WithClear cannot clear runs: it returns an error
// matching errors.ErrUnsupported, having sent nothing. Under a fence on
// ctx (see retention.Fenced) it is the lease's fenced run, whose script
// first checks the lease key's token.
//
// Redis runs nothing else while the script runs, so Config.BatchSize, a
// run's limit, sets both how much a call clears and how long Redis pauses
// for it (BENCHMARKS.md says what runs of 100 to 4,000 cost). The script names the state keys
// itself, from the ids it read, which Redis allows of keys in the slot of
// those it is given: hence the templates' hash tag on Redis Cluster.
func (a *AtomicKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	view, err := retention.Fenced(ctx, a)
	if err != nil {
		return nil, err
	}
	if view != nil {
		rc, ok := view.(retention.RunClearer)
		if !ok {
			return nil, fmt.Errorf("rediskv: clear run: the fenced view (%T) cannot clear runs: %w", view, retention.ErrUnfenced)
		}
		return rc.ClearRun(ctx, prefix, from, end, limit)
	}
	return a.clearRun(ctx, "", "", prefix, from, end, limit)
}

// RunStore implements retention.RunClearer.
func (a *AtomicKV) RunStore() retention.RunClearer { return a }

// errNoRuns is ClearRun's error for an AtomicKV made by WithClear.
var errNoRuns = fmt.Errorf("rediskv: clear run: this AtomicKV names state keys with a KeysFunc, Go code that a script "+
	"cannot call; make it with KV.WithStateKeys to clear runs: %w", errors.ErrUnsupported)

// maxStamp is the timestamp of retention.MaxMarkerTime without its
// leading zeros (zeros of them): it fits a Lua number (a double) exactly.
var (
	maxStamp = strconv.FormatInt(retention.MaxMarkerTime.UnixMilli(), 10)
	zeros    = retention.TimestampWidth - len(maxStamp)
)

// clearRunScript clears the run of at most ARGV[4] members of the set
// KEYS[2] in the lex range ARGV[2] to ARGV[3]. Each must be ARGV[5] (the
// prefix), the timestamp's digits (at most maxStamp), '/' and an id; else
// it returns {-2, member}, having done nothing. It unlinks ARGV[6] .. id
// .. ARGV[7], ARGV[8] .. id .. ARGV[9], ... for each id once, removes
// the members, and returns them joined by newlines: one string, which
// costs Redis and the client less than a reply of one string a member,
// and is split without doubt since no timestamp or id holds a newline.
// With a token in ARGV[1] (a fence), it does so only while the lease key
// KEYS[1] holds it, and returns {-1} otherwise; without one, KEYS[1]
// repeats the set.
//
// When both ends of the range start with the prefix, so does every member
// between them, and the members' own check is skipped. One pattern
// checks the rest, capturing where the digits end (Lua patterns have no
// counted repetition) and the id; %d is 0-9 in any locale, and the id's
// class compares bytes. Members that share a prefix and a width of digits
// sort by time, so the last alone is read as a number. Every check comes
// before the first write: Redis does not roll back a script that fails
// part way.
var clearRunScript = redis.NewScript(`if ARGV[1] ~= "" and redis.call("get", KEYS[1]) ~= ARGV[1] then
	return {-1}
end
local members = redis.call("zrange", KEYS[2], ARGV[2], ARGV[3], "BYLEX", "LIMIT", 0, tonumber(ARGV[4]))
if #members == 0 then
	return ""
end
local find, sub = string.find, string.sub
local prefix = ARGV[5]
local at = #prefix + 1
local idAt = at + ` + strconv.Itoa(retention.TimestampWidth+1) + `
local prefixed = sub(ARGV[2], 2, at) == prefix and sub(ARGV[3], 2, at) == prefix
local keys, seen, n, nargs = {}, {}, 0, #ARGV
for _, m in ipairs(members) do
	local _, _, slash, id = find(m, "^` + strings.Repeat("0", zeros) + `%d+()/([A-Za-z0-9_%-]+)$", at)
	if slash ~= idAt - 1 or #id > ` + strconv.Itoa(retention.MaxIDLen) + ` or not prefixed and sub(m, 1, at - 1) ~= prefix then
		return {-2, m}
	end
	if not seen[id] then
		seen[id] = true
		for t = 6, nargs, 2 do
			n = n + 1
			keys[n] = ARGV[t] .. id .. ARGV[t + 1]
		end
	end
end
local last = members[#members]
if tonumber(sub(last, at + ` + strconv.Itoa(zeros) + `, idAt - 2)) > ` + maxStamp + ` then
	return {-2, last}
end
for i = 1, n, ` + strconv.Itoa(unpackChunk) + ` do
	redis.call("unlink", unpack(keys, i, math.min(i + ` + strconv.Itoa(unpackChunk-1) + `, n)))
end
redis.call("zremrangebylex", KEYS[2], "[" .. members[1], "[" .. last)
return table.concat(members, "\n")`)

// clearRun runs clearRunScript, fenced by lease and token when token is
// not empty. It returns errFenceRefused when the fence refused.
func (a *AtomicKV) clearRun(ctx context.Context, lease, token, prefix string, from, end []byte, limit int) ([][]byte, error) {
	if a.templates == nil {
		return nil, errNoRuns
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("rediskv: ClearRun limit must be at least 1, got %d", limit)
	}
	if token == "" {
		lease = a.key
	}
	args := make([]any, 0, 5+len(a.runArgs))
	args = append(args, token, "["+string(from), "("+string(end), limit, prefix)
	args = append(args, a.runArgs...)
	reply, err := clearRunScript.Run(ctx, a.rdb, []string{lease, a.key}, args...).Result()
	if err != nil {
		return nil, a.wrap(ctx, "clear run", err)
	}
	switch r := reply.(type) {
	case string:
		return splitRun(prefix, r), nil
	case []any:
		if len(r) == 1 && r[0] == int64(-1) {
			return nil, errFenceRefused
		}
		if len(r) == 2 && r[0] == int64(-2) {
			if m, ok := r[1].(string); ok {
				return nil, a.notMarker(prefix, m)
			}
		}
	}
	return nil, fmt.Errorf("rediskv: clear run %q: the script replied %v", a.key, reply)
}

// splitRun returns the markers clearRunScript joined, in one buffer as
// Scan's keys are. Each starts with prefix, which may hold a newline, and
// ends at the first newline after its timestamp.
func splitRun(prefix, joined string) [][]byte {
	if joined == "" {
		return nil
	}
	buf := []byte(joined)
	keys := make([][]byte, 0, strings.Count(joined, "\n")+1)
	for at := 0; at < len(buf); {
		stamp := min(at+len(prefix), len(buf))
		end := len(buf)
		if n := bytes.IndexByte(buf[stamp:], '\n'); n >= 0 {
			end = stamp + n
		}
		keys = append(keys, buf[at:end:end])
		at = end + 1
	}
	return keys
}

// notMarker is the error of a run refused for member: the reason
// retention.ParseMarkerKey gives, or the form the script wants when
// ParseMarkerKey takes it (the keys of the retry and parked ranges).
func (a *AtomicKV) notMarker(prefix, member string) error {
	_, _, err := retention.ParseMarkerKey(prefix, []byte(member))
	if err == nil {
		err = fmt.Errorf("%w: %q is not %q, %d digits, '/' and an id", retention.ErrMalformedMarker, member, prefix, retention.TimestampWidth)
	}
	return fmt.Errorf("rediskv: clear run %q: refused for the member %q, nothing changed: %w", a.key, member, err)
}

// fencedAtomicKV is the view of an AtomicKV under a redisLease.
type fencedAtomicKV struct {
	*fencedKV
	atomic *AtomicKV
}

var _ retention.RunClearer = (*fencedAtomicKV)(nil)

func (f *fencedAtomicKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	if f.err != nil {
		return fmt.Errorf("rediskv: fenced clear: %w", f.err)
	}
	if f.lease.isLost() {
		return f.refused("clear and delete")
	}
	_, err := f.atomic.run(ctx, f.lease.l.key, f.lease.token, ids, keys)
	if errors.Is(err, errFenceRefused) {
		f.lease.markLost()
		return f.refused("clear and delete")
	}
	return err
}

func (f *fencedAtomicKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	if f.atomic.templates == nil {
		return nil, errNoRuns
	}
	if f.err != nil {
		return nil, fmt.Errorf("rediskv: fenced clear run: %w", f.err)
	}
	if f.lease.isLost() {
		return nil, f.refused("clear run")
	}
	keys, err := f.atomic.clearRun(ctx, f.lease.l.key, f.lease.token, prefix, from, end, limit)
	if errors.Is(err, errFenceRefused) {
		f.lease.markLost()
		return nil, f.refused("clear run")
	}
	return keys, err
}

// RunStore implements retention.RunClearer.
func (f *fencedAtomicKV) RunStore() retention.RunClearer { return f }
