package kvtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/kvtest"
)

func TestCustomIDRule(t *testing.T) {
	kvtest.CustomIDRule(t, memIDRule(newMemOrders("")))
}

// Each broken adapter gets one write wrong; CustomIDRule must fail on it,
// with the message given.
var brokenIDRule = map[string]string{
	"marks outside the transaction":        "markers after refused and abandoned writes",
	"accepts any key":                      `the key-taking write of "" = <nil>`,
	"default write takes the sweep's rule": `the default-rule write of "order.42" = <nil>`,
	"commits no state":                     `Shipped("order.42") after Finish`,
}

func TestBrokenIDRuleAdaptersAreCaught(t *testing.T) {
	if os.Getenv("KVTEST_BROKEN_IDRULE") != "" {
		t.Skip("in the child process")
	}
	for name, catch := range brokenIDRule {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := runChild("TestBrokenIDRuleChild", "KVTEST_BROKEN_IDRULE", name)
			require.Error(t, err, "CustomIDRule passed an adapter that %s:\n%s", name, out)
			require.Contains(t, string(out), "--- FAIL: TestBrokenIDRuleChild", "output:\n%s", out)
			require.Contains(t, string(out), catch, "output:\n%s", out)
		})
	}
}

func TestBrokenIDRuleChild(t *testing.T) {
	name := os.Getenv("KVTEST_BROKEN_IDRULE")
	if name == "" {
		t.Skip("run by TestBrokenIDRuleAdaptersAreCaught")
	}
	kvtest.CustomIDRule(t, memIDRule(newMemOrders(name)))
}

var errAbandon = errors.New("abandoned")

// memOrders keeps orders' states beside a MemKV of markers. A transaction
// (update) buffers its writes and applies them only if its function
// returns nil. breaks names one of brokenIDRule, or is empty.
type memOrders struct {
	breaks string
	kv     *retention.MemKV
	mu     sync.Mutex
	states map[string]string
}

type memTx struct {
	ctx    context.Context
	states map[string]string
	keys   [][]byte
}

func newMemOrders(breaks string) *memOrders {
	return &memOrders{breaks: breaks, kv: retention.NewMemKV(), states: map[string]string{}}
}

func (o *memOrders) update(ctx context.Context, fn func(tx *memTx) error) error {
	tx := &memTx{ctx: ctx, states: map[string]string{}}
	if err := fn(tx); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for id, s := range tx.states {
		if o.breaks != "commits no state" {
			o.states[id] = s
		}
	}
	for _, key := range tx.keys {
		if err := o.kv.Put(ctx, key, nil); err != nil {
			return err
		}
	}
	return nil
}

// markTx is the default-rule write, like an adapter's MarkTx.
func (o *memOrders) markTx(tx *memTx, prefix, id string, at time.Time) error {
	if o.breaks == "default write takes the sweep's rule" {
		return o.markKeyTx(tx, fmt.Appendf(nil, "%s%020d/%s", prefix, at.UnixMilli(), id))
	}
	key, err := retention.MarkerKey(prefix, at, id)
	if err != nil {
		return err
	}
	return o.markKeyTx(tx, key)
}

// markKeyTx is the key-taking write, like an adapter's MarkKeyTx.
func (o *memOrders) markKeyTx(tx *memTx, key []byte) error {
	if o.breaks != "accepts any key" {
		if err := retention.CheckMarkerKey(key); err != nil {
			return fmt.Errorf("memOrders: %w", err)
		}
	}
	if o.breaks == "marks outside the transaction" {
		return o.kv.Put(tx.ctx, key, nil)
	}
	tx.keys = append(tx.keys, slices.Clone(key))
	return nil
}

func (o *memOrders) state(id string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.states[id]
}

func (o *memOrders) clear(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.states, id)
}
