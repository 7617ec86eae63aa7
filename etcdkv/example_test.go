package etcdkv_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/etcdkv"
)

// finishRun records a run's outcome and its marker in one Txn.
func finishRun(ctx context.Context, cli *clientv3.Client, kv *etcdkv.KV, id string, at time.Time) error {
	mark, err := kv.MarkOp("runs/done/", id, at)
	if err != nil {
		return err
	}
	_, err = cli.Txn(ctx).Then(clientv3.OpPut("myservice/runs/"+id, "succeeded"), mark).Commit()
	return err
}

// A service keeps runs and their markers in one etcd cluster; every replica
// runs the sweep.
func Example() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	kv, err := etcdkv.New(cli, "myservice/retention/", nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := finishRun(ctx, cli, kv, "run-1", time.Now()); err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Clear: func(ctx context.Context, id string) error {
			_, err := cli.Delete(ctx, "myservice/runs/"+id)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(ctx))
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

// finishOrder records an order's outcome and its marker in one Txn. The
// sweep's MarkerKey checks the id by the sweep's rule, and MarkKeyOp writes
// the key it returns.
func finishOrder(ctx context.Context, cli *clientv3.Client, kv *etcdkv.KV, sweep *retention.Sweep, id string, at time.Time) error {
	key, err := sweep.MarkerKey(at, id)
	if err != nil {
		return err
	}
	mark, err := kv.MarkKeyOp(key)
	if err != nil {
		return err
	}
	_, err = cli.Txn(ctx).Then(clientv3.OpPut("myservice/orders/"+id, "shipped"), mark).Commit()
	return err
}

// A sweep whose ids follow their own rule (Config.ValidateID) writes its
// markers with MarkKeyOp: MarkOp checks ids by the default rule.
func ExampleKV_MarkKeyOp() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	kv, err := etcdkv.New(cli, "myservice/retention/", nil)
	if err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:     "orders/done/",
		Retention:  30 * 24 * time.Hour,
		ValidateID: orderNumber,
		Clear: func(ctx context.Context, id string) error {
			_, err := cli.Delete(ctx, "myservice/orders/"+id)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := finishOrder(ctx, cli, kv, sweep, "order.42", time.Now()); err != nil {
		log.Fatal(err)
	}
}

// Replicas of a service share one namespace; the lease lets one of them
// sweep at a time, and fences its marker deletes.
func ExampleNewLocker() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	kv, err := etcdkv.New(cli, "myservice/retention/", nil)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := etcdkv.NewLocker(cli, "myservice/retention/lease", &etcdkv.LockerOptions{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	sweep, err := retention.New(kv, retention.Config{
		Prefix:    "runs/done/",
		Retention: 7 * 24 * time.Hour,
		Lease:     lease,
		Clear: func(ctx context.Context, id string) error {
			_, err := cli.Delete(ctx, "myservice/runs/"+id)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sweep.Run(context.Background()))
}
