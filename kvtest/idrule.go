package kvtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marksweep/retention"
)

// IDRuleHarness connects CustomIDRule to one adapter over a fresh, empty
// store. CustomIDRule finishes the orders "order.42" and "order.7" and
// tries "order-42"; an adapter whose writes update existing rows creates
// those first. Every field must be set: CustomIDRule fails at once on a
// harness with a nil field.
type IDRuleHarness struct {
	// KV is the adapter's KV, which holds the markers.
	KV retention.KV

	// MarkDefault writes the marker of id under prefix with the adapter's
	// default-rule write (MarkTx, or MarkOp in a Txn), in a transaction of
	// its own.
	MarkDefault func(ctx context.Context, prefix, id string, at time.Time) error

	// Finish records the order id as finished at at: its state and, in the
	// same transaction, the key sweep.MarkerKey returns for it, written
	// with the adapter's key-taking write (MarkKeyTx or MarkKeyOp). Make it
	// the function the adapter's examples show (finishOrder), so that the
	// test runs that code. It returns the error of MarkerKey when the
	// sweep's rule refuses id.
	Finish func(ctx context.Context, sweep *retention.Sweep, id string, at time.Time) error

	// Abandon writes the state of order id and, with the key-taking write,
	// key in one transaction, as Finish does, and then abandons that
	// transaction: a rollback, a discarded MULTI, a Txn whose condition
	// fails. It returns nil once it abandoned the transaction, and the
	// key-taking write's error when that write refused key.
	Abandon func(ctx context.Context, id string, key []byte) error

	// Shipped reports whether the order id has the state that Finish
	// writes.
	Shipped func(ctx context.Context, id string) (bool, error)

	// Clear removes the state of the order id; the sweep calls it.
	Clear func(ctx context.Context, id string) error
}

// CustomIDRule checks, end to end against an adapter's store, that a sweep
// whose Config.ValidateID accepts ids the default rule refuses works with
// the adapter's transactions: the default-rule write refuses "order.42"
// with retention.ErrInvalidID, and so does the sweep an id its rule
// refuses; the key-taking write refuses an empty key, a key not shaped
// like a marker and a marker without an id with
// retention.ErrMalformedMarker; an abandoned transaction leaves neither
// state nor marker; a committed one writes the state and exactly the
// sweep's marker key; and a Pass clears nothing before the retention ran
// out and, after it, exactly the order that is due, its state and its
// marker, with no marker taken for malformed.
func CustomIDRule(t *testing.T, h IDRuleHarness) {
	if h.KV == nil || h.MarkDefault == nil || h.Finish == nil || h.Abandon == nil || h.Shipped == nil || h.Clear == nil {
		t.Fatal("kvtest: CustomIDRule needs every field of IDRuleHarness")
	}
	ctx := ctxFor(t)
	const prefix = "orders/done/"
	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	start := clock.Now()
	var mu sync.Mutex
	var cleared []string
	sweep, err := retention.New(h.KV, retention.Config{
		Prefix: prefix, Retention: time.Hour, Clock: clock, ValidateID: orderNumber,
		Clear: func(ctx context.Context, id string) error {
			mu.Lock()
			cleared = append(cleared, id)
			mu.Unlock()
			return h.Clear(ctx, id)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	markers := func() []string {
		t.Helper()
		return scan(t, Store{KV: h.KV}, prefix, "orders/done0", 10)
	}
	shipped := func(id string, want bool, when string) {
		t.Helper()
		got, err := h.Shipped(ctx, id)
		if err != nil {
			t.Fatalf("Shipped(%q) error = %v", id, err)
		}
		if got != want {
			t.Errorf("Shipped(%q) %s = %v, want %v", id, when, got, want)
		}
	}
	markerKey := func(at time.Time, id string) []byte {
		t.Helper()
		key, err := sweep.MarkerKey(at, id)
		if err != nil {
			t.Fatalf("Sweep.MarkerKey(%q) error = %v", id, err)
		}
		return key
	}

	if err := h.MarkDefault(ctx, prefix, "order.42", start); !errors.Is(err, retention.ErrInvalidID) {
		t.Errorf("the default-rule write of \"order.42\" = %v, want ErrInvalidID", err)
	}
	if err := h.Finish(ctx, sweep, "order-42", start); !errors.Is(err, retention.ErrInvalidID) {
		t.Errorf("Finish(\"order-42\"), which the sweep's rule refuses, = %v, want ErrInvalidID", err)
	}
	// An empty key, a key that is not a marker (which the sweep would
	// leave as foreign for ever) and a marker without an id are refused.
	for _, bad := range []string{"", prefix + "order.42", prefix + "00000001764000000000/"} {
		if err := h.Abandon(ctx, "order.7", []byte(bad)); !errors.Is(err, retention.ErrMalformedMarker) {
			t.Errorf("the key-taking write of %q = %v, want ErrMalformedMarker", bad, err)
		}
	}
	if err := h.Abandon(ctx, "order.7", markerKey(start, "order.7")); err != nil {
		t.Fatalf("Abandon(\"order.7\") error = %v", err)
	}
	want(t, "markers after refused and abandoned writes", markers(), nil)
	shipped("order.7", false, "after its transaction was abandoned")

	key42 := markerKey(start, "order.42")
	if err := h.Finish(ctx, sweep, "order.42", start); err != nil {
		t.Fatalf("Finish(\"order.42\") error = %v", err)
	}
	want(t, "markers after Finish(\"order.42\")", markers(), []string{string(key42)})
	shipped("order.42", true, "after Finish, which commits it with its marker")
	// order.7 falls due half an hour after order.42: the second Pass must
	// leave it alone.
	later := start.Add(30 * time.Minute)
	key7 := markerKey(later, "order.7")
	if err := h.Finish(ctx, sweep, "order.7", later); err != nil {
		t.Fatalf("Finish(\"order.7\") error = %v", err)
	}
	want(t, "markers after Finish(\"order.7\")", markers(), []string{string(key42), string(key7)})

	st, err := sweep.Pass(ctx)
	if err != nil {
		t.Fatalf("Pass() error = %v", err)
	}
	if st.Cleared != 0 {
		t.Errorf("Pass() before the retention ran out cleared %d, want 0", st.Cleared)
	}
	shipped("order.42", true, "after a Pass before the retention ran out")

	clock.Advance(time.Hour + time.Millisecond)
	if st, err = sweep.Pass(ctx); err != nil {
		t.Fatalf("Pass() error = %v", err)
	}
	if st.Cleared != 1 || st.Malformed != 0 {
		t.Errorf("Pass() = %+v, want 1 cleared and none malformed", st)
	}
	mu.Lock()
	want(t, "ids cleared", cleared, []string{"order.42"})
	mu.Unlock()
	shipped("order.42", false, "after the Pass")
	shipped("order.7", true, "after the Pass, before it is due")
	want(t, "markers after the Pass", markers(), []string{string(key7)})
}

// orderNumber is CustomIDRule's id rule: "order." and digits. The default
// rule refuses the '.'.
func orderNumber(id string) error {
	digits, ok := strings.CutPrefix(id, "order.")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("%q is not order.<digits>", id)
	}
	return nil
}
