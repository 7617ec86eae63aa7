package boltkv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/boltkv"
)

// finishJob records a job's outcome and its marker in one transaction:
// both commit or neither does.
func finishJob(db *bbolt.DB, kv *boltkv.KV, id string, outcome []byte, at time.Time) error {
	return db.Update(func(tx *bbolt.Tx) error {
		jobs, err := tx.CreateBucketIfNotExists([]byte("jobs"))
		if err != nil {
			return err
		}
		if err := jobs.Put([]byte(id), outcome); err != nil {
			return err
		}
		return kv.MarkTx(tx, "jobs/done/", id, at)
	})
}

// newJobSweep clears a job's state a day after it finished. A nil clock
// means the system clock.
func newJobSweep(db *bbolt.DB, kv *boltkv.KV, clock retention.Clock) (*retention.Sweep, error) {
	return retention.New(kv, retention.Config{
		Prefix:    "jobs/done/",
		Retention: 24 * time.Hour,
		Clock:     clock,
		Clear: func(ctx context.Context, id string) error {
			return db.Update(func(tx *bbolt.Tx) error {
				if jobs := tx.Bucket([]byte("jobs")); jobs != nil {
					return jobs.Delete([]byte(id)) // a missing key is not an error: idempotent
				}
				return nil
			})
		},
	})
}

// jobState returns a job's recorded outcome, or "" when it is gone.
func jobState(db *bbolt.DB, id string) (state string) {
	_ = db.View(func(tx *bbolt.Tx) error {
		if jobs := tx.Bucket([]byte("jobs")); jobs != nil {
			state = string(jobs.Get([]byte(id)))
		}
		return nil
	})
	return state
}

// A job service keeps its jobs and their markers in one bbolt file, and a
// sweep clears each job a day after it finished.
func Example() {
	dir, err := os.MkdirTemp("", "boltkv-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := bbolt.Open(filepath.Join(dir, "jobs.db"), 0o600, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	kv, err := boltkv.New(db, "markers") // creates the bucket
	if err != nil {
		fmt.Println(err)
		return
	}

	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	if err := finishJob(db, kv, "job-1", []byte("succeeded"), clock.Now()); err != nil {
		fmt.Println(err)
		return
	}
	sweep, err := newJobSweep(db, kv, clock)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, after := range []time.Duration{time.Hour, 24 * time.Hour} {
		clock.Advance(after)
		st, err := sweep.Pass(context.Background())
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: cleared %d, job-1 %q\n", clock.Now().Format("Jan 2 15:04"), st.Cleared, jobState(db, "job-1"))
	}
	// Output:
	// Nov 29 13:00: cleared 0, job-1 "succeeded"
	// Nov 30 13:00: cleared 1, job-1 ""
}

// orderNumber is a custom id rule: "order." and digits, which the default
// rule refuses for its '.'.
func orderNumber(id string) error {
	digits, ok := strings.CutPrefix(id, "order.")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("%q is not order.<digits>", id)
	}
	return nil
}

// finishOrder records an order's outcome and its marker in one
// transaction. The sweep's MarkerKey checks the id by the sweep's rule, and
// MarkKeyTx writes the key it returns.
func finishOrder(db *bbolt.DB, kv *boltkv.KV, sweep *retention.Sweep, id string, at time.Time) error {
	key, err := sweep.MarkerKey(at, id)
	if err != nil {
		return err
	}
	return db.Update(func(tx *bbolt.Tx) error {
		orders, err := tx.CreateBucketIfNotExists([]byte("orders"))
		if err != nil {
			return err
		}
		if err := orders.Put([]byte(id), []byte("shipped")); err != nil {
			return err
		}
		return kv.MarkKeyTx(tx, key)
	})
}

// A sweep whose ids follow their own rule (Config.ValidateID) writes its
// markers with MarkKeyTx: MarkTx checks ids by the default rule.
func ExampleKV_MarkKeyTx() {
	dir, err := os.MkdirTemp("", "boltkv-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := bbolt.Open(filepath.Join(dir, "orders.db"), 0o600, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	kv, err := boltkv.New(db, "markers")
	if err != nil {
		fmt.Println(err)
		return
	}
	clock := retention.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	sweep, err := retention.New(kv, retention.Config{
		Prefix:     "orders/done/",
		Retention:  time.Hour,
		Clock:      clock,
		ValidateID: orderNumber,
		Clear: func(ctx context.Context, id string) error {
			fmt.Println("clearing", id)
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	err = db.Update(func(tx *bbolt.Tx) error { return kv.MarkTx(tx, "orders/done/", "order.42", clock.Now()) })
	fmt.Println("MarkTx:", err)
	fmt.Println("finishOrder:", finishOrder(db, kv, sweep, "order.42", clock.Now()))

	clock.Advance(2 * time.Hour)
	st, err := sweep.Pass(context.Background())
	fmt.Println("cleared", st.Cleared, err)
	// Output:
	// MarkTx: retention: invalid marker id: byte 5 of "order.42" is '.', want one of A-Z a-z 0-9 _ -
	// finishOrder: <nil>
	// clearing order.42
	// cleared 1 <nil>
}
