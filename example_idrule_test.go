package retention_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/marksweep/retention"
)

// orderNumber is an id rule of its own: "order." and digits. The default
// rule (ValidateID) refuses the '.'.
func orderNumber(id string) error {
	digits, ok := strings.CutPrefix(id, "order.")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("%q is not order.<digits>", id)
	}
	return nil
}

// newOrderSweep sweeps markers whose ids follow orderNumber. Write them
// with the sweep's MarkerKey or Mark, which check ids by the sweep's rule;
// the package-level MarkerKey and Mark, and the adapters' MarkTx and
// MarkOp, know only the default rule.
func newOrderSweep(kv retention.KV, clock retention.Clock, clearOrder func(context.Context, string) error) (*retention.Sweep, error) {
	return retention.New(kv, retention.Config{
		Prefix:     "orders/done/",
		Retention:  30 * 24 * time.Hour,
		Clock:      clock,
		ValidateID: orderNumber,
		Clear:      clearOrder,
	})
}

// A sweep with its own id rule (Config.ValidateID) writes and clears
// markers that the default rule refuses.
func ExampleSweep_MarkerKey() {
	ctx := context.Background()
	kv := retention.NewMemKV()
	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	sweep, err := newOrderSweep(kv, clock, func(ctx context.Context, id string) error {
		fmt.Println("clearing", id)
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	_, err = retention.MarkerKey("orders/done/", clock.Now(), "order.42")
	fmt.Println("MarkerKey:", err)
	key, err := sweep.MarkerKey(clock.Now(), "order.42")
	fmt.Printf("Sweep.MarkerKey: %s %v\n", key, err)
	_, err = sweep.MarkerKey(clock.Now(), "order-42")
	fmt.Println("Sweep.MarkerKey:", err)

	// Sweep.Mark writes the key on its own; in a transaction of an adapter,
	// write sweep.MarkerKey's key with its MarkKeyTx or MarkKeyOp.
	if err := sweep.Mark(ctx, kv, "order.42", clock.Now()); err != nil {
		fmt.Println(err)
		return
	}
	clock.Advance(31 * 24 * time.Hour)
	st, err := sweep.Pass(ctx)
	fmt.Println("cleared", st.Cleared, err)
	// Output:
	// MarkerKey: retention: invalid marker id: byte 5 of "order.42" is '.', want one of A-Z a-z 0-9 _ -
	// Sweep.MarkerKey: orders/done/00000001795953600000/order.42 <nil>
	// Sweep.MarkerKey: retention: invalid marker id: "order-42" is not order.<digits>
	// clearing order.42
	// cleared 1 <nil>
}

func ExampleMarkerKey() {
	finished := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	key, err := retention.MarkerKey("runs/done/", finished, "run-1")
	fmt.Printf("%s %v\n", key, err)
	_, err = retention.MarkerKey("runs/done/", time.Unix(finished.UnixMilli(), 0), "run-1")
	fmt.Println(err != nil) // seconds taken for milliseconds: after the year 9999
	// Output:
	// runs/done/00000001795953600000/run-1 <nil>
	// true
}

func ExampleValidateID() {
	for _, id := range []string{"run-1", "Run_2", "", "order.42", strings.Repeat("x", retention.MaxIDLen+1)} {
		fmt.Printf("%.12q: %v\n", id, retention.ValidateID(id))
	}
	// Output:
	// "run-1": <nil>
	// "Run_2": <nil>
	// "": retention: invalid marker id: empty
	// "order.42": retention: invalid marker id: byte 5 of "order.42" is '.', want one of A-Z a-z 0-9 _ -
	// "xxxxxxxxxxxx": retention: invalid marker id: 129 bytes long, at most 128 allowed
}

func ExampleParseMarkerKey() {
	t, id, err := retention.ParseMarkerKey("runs/done/", []byte("runs/done/00000001795953600000/run-1"))
	fmt.Println(t.UTC(), string(id), err)
	// Output:
	// 2026-11-29 12:00:00 +0000 UTC run-1 <nil>
}

// The adapters' MarkKeyTx and MarkKeyOp check a key this way before they
// write it: a marker of any prefix and id rule passes, a key no sweep would
// ever delete does not.
func ExampleCheckMarkerKey() {
	for _, key := range []string{"orders/done/00000001795953600000/order.42", "orders/done/order.42"} {
		fmt.Println(retention.CheckMarkerKey([]byte(key)))
	}
	// Output:
	// <nil>
	// retention: malformed marker "orders/done/order.42": not <prefix><20 digits>/<id>
}
