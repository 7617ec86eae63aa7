package kvtest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/marksweep/retention"
)

// mover returns the store's KV as a retention.Mover, or skips the test when
// it is not one: the Move behaviours check an optional ability.
func mover(t *testing.T, s Store) retention.Mover {
	t.Helper()
	m, ok := s.KV.(retention.Mover)
	if !ok {
		t.Skipf("the KV (%T) is not a retention.Mover", s.KV)
	}
	return m
}

func move(t *testing.T, m retention.Mover, from, to []string) {
	t.Helper()
	if err := m.Move(ctxFor(t), bytesOf(from), bytesOf(to)); err != nil {
		if len(from) > 4 {
			t.Fatalf("Move(%d keys from %q, to %q) error = %v", len(from), from[0], to[0], err)
		}
		t.Fatalf("Move(%q, %q) error = %v", from, to, err)
	}
}

func bytesOf(keys []string) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// testMovePresent moves present keys, one and then many in one call (more
// than an etcd transaction holds by default), and requires that Scan sees
// each at its new key and no longer at its old one.
func testMovePresent(t *testing.T, s Store) {
	m := mover(t, s)
	put(t, s, "mv/a", "mv/z")
	move(t, m, []string{"mv/a"}, []string{"mv/b"})
	want(t, "keys after Move(mv/a to mv/b)", scan(t, s, "mv/", "mv0", 10), []string{"mv/b", "mv/z"})

	// Moving to a key that exists already leaves one key there.
	move(t, m, []string{"mv/b"}, []string{"mv/z"})
	want(t, "keys after Move(mv/b to the existing mv/z)", scan(t, s, "mv/", "mv0", 10), []string{"mv/z"})

	const n = 300
	var from, to []string
	for i := range n {
		from = append(from, fmt.Sprintf("many/a%03d", i))
		to = append(to, fmt.Sprintf("many/b%03d", i))
	}
	put(t, s, from...)
	move(t, m, from, to)
	want(t, fmt.Sprintf("keys after one Move of %d pairs", n), scanAll(t, s, "many/", "many0", 128), to)
}

// testMoveMissing requires that a pair whose from key is missing writes
// nothing, while the other pairs of the call are moved.
func testMoveMissing(t *testing.T, s Store) {
	m := mover(t, s)
	put(t, s, "ms/a", "ms/c")
	move(t, m, []string{"ms/a", "ms/missing", "ms/c"}, []string{"ms/a2", "ms/missing2", "ms/c2"})
	want(t, "keys after a Move with a missing from", scan(t, s, "ms/", "ms0", 10), []string{"ms/a2", "ms/c2"})

	// A Move sent twice (its reply lost, say) moves nothing the second time.
	move(t, m, []string{"ms/a"}, []string{"ms/a3"})
	want(t, "keys after moving a key that was moved already", scan(t, s, "ms/", "ms0", 10), []string{"ms/a2", "ms/c2"})
	move(t, m, nil, nil)
	want(t, "keys after an empty Move", scan(t, s, "ms/", "ms0", 10), []string{"ms/a2", "ms/c2"})
}

// testMoveWhole races Moves of one key to different targets: only the
// first may find it, so each round ends with exactly one key. A store that
// checks for the key and then writes in separate steps lets both through
// and leaves two, as a sweep rescheduling one marker from two replicas
// would.
func testMoveWhole(t *testing.T, s Store) {
	m := mover(t, s)
	const rounds, racers = 30, 3
	ctx := ctxFor(t)
	for r := range rounds {
		from := fmt.Sprintf("mw/%02d/from", r)
		put(t, s, from)
		var wg sync.WaitGroup
		errs := make([]error, racers)
		for i := range racers {
			wg.Go(func() {
				to := fmt.Sprintf("mw/%02d/to%d", r, i)
				errs[i] = m.Move(ctx, [][]byte{[]byte(from)}, [][]byte{[]byte(to)})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Move by racer %d error = %v", r, i, err)
			}
		}
		prefix := fmt.Sprintf("mw/%02d/", r)
		got := scan(t, s, prefix, prefix+"\xff", 10)
		if len(got) != 1 || got[0] == from {
			t.Fatalf("round %d: keys after %d racing Moves of %s = %q, want exactly one moved key", r, racers, from, got)
		}
	}
}

// testMoveLengths requires that a Move whose from and to differ in length
// is refused with an error, and that it moves nothing; and that a Move
// with a cancelled context returns an error.
func testMoveLengths(t *testing.T, s Store) {
	m := mover(t, s)
	put(t, s, "ml/a", "ml/b")
	if err := m.Move(ctxFor(t), bytesOf([]string{"ml/a", "ml/b"}), bytesOf([]string{"ml/c"})); err == nil {
		t.Error("Move of 2 keys to 1 key = nil error, want an error")
	}
	if err := m.Move(ctxFor(t), bytesOf([]string{"ml/a"}), bytesOf([]string{"ml/c", "ml/d"})); err == nil {
		t.Error("Move of 1 key to 2 keys = nil error, want an error")
	}
	want(t, "keys after refused Moves", scan(t, s, "ml/", "ml0", 10), []string{"ml/a", "ml/b"})

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Move(ctx, bytesOf([]string{"ml/a"}), bytesOf([]string{"ml/c"})); err == nil {
		t.Error("Move with a cancelled context = nil error, want an error")
	}
}
