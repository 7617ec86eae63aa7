package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/rediskv"
)

// Redis holds the keys of the Redis contenders, all under one namespace:
// a state key per entity (<ns>state:<id>) and the rediskv marker set
// (<ns>markers). Create it with NewRedis and remove the keys with Close.
type Redis struct {
	rdb     *redis.Client
	ns      string
	markers string
	kv      *rediskv.KV

	// Timing, when not nil, adds up the calls of the retention contenders.
	Timing *Timing
}

// NewRedis returns a Redis whose keys all start with ns. The client's
// PoolSize must allow the largest Concurrency of the contenders.
func NewRedis(rdb *redis.Client, ns string) (*Redis, error) {
	r := &Redis{rdb: rdb, ns: ns, markers: ns + "markers"}
	kv, err := rediskv.New(rdb, r.markers)
	if err != nil {
		return nil, err
	}
	r.kv = kv
	return r, nil
}

// Close deletes every key under the namespace.
func (r *Redis) Close(ctx context.Context) error {
	if err := r.rdb.Del(ctx, r.markers).Err(); err != nil {
		return err
	}
	return r.forStateKeys(ctx, func(keys []string) error { return r.rdb.Del(ctx, keys...).Err() })
}

func (r *Redis) stateKey(id string) string { return r.ns + "state:" + id }

// forStateKeys calls f with every state key left, a SCAN page at a time.
func (r *Redis) forStateKeys(ctx context.Context, f func([]string) error) error {
	var cursor uint64
	for {
		keys, next, err := r.rdb.Scan(ctx, cursor, r.ns+"state:*", 10_000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := f(keys); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// Setup writes n expired entities: a state key each and its marker, as
// MarkTx would write them, pipelined a thousand at a time.
func (r *Redis) Setup(ctx context.Context, n int) error {
	if err := r.Close(ctx); err != nil {
		return err
	}
	base := finishedAt()
	for i := 0; i < n; {
		_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for end := min(i+1000, n); i < end; i++ {
				id := "j" + fmt.Sprintf("%09d", i+1)
				p.Set(ctx, r.stateKey(id), `{"kind":"bench","state":"completed","args":{"n":1}}`, 0)
				if err := r.kv.MarkTx(ctx, p, Prefix, id, base.Add(time.Duration(i+1)*time.Millisecond)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Check returns an error when a state key or a marker is left.
func (r *Redis) Check(ctx context.Context) error {
	left, err := r.rdb.ZCard(ctx, r.markers).Result()
	if err != nil {
		return err
	}
	states := 0
	if err := r.forStateKeys(ctx, func(keys []string) error { states += len(keys); return nil }); err != nil {
		return err
	}
	if left != 0 || states != 0 {
		return fmt.Errorf("%d markers and %d state keys left", left, states)
	}
	return nil
}

// expiredRange is the lex range of ZRANGE BYLEX holding every expired
// marker: markers sort by time, so every key below the cutoff's is expired.
func expiredRange() (lo, hi string) {
	return "[" + Prefix, "(" + string(expiredEnd()) + "/"
}

// Floor is the fastest way to delete the backlog knowing every id: one
// pipeline of variadic DELs of a thousand state keys, then one
// ZREMRANGEBYLEX of the expired markers.
func (r *Redis) Floor(n int) Contender {
	return Contender{
		Name:  "floor: pipelined DEL + one ZREMRANGEBYLEX",
		Setup: r.Setup,
		Clear: func(ctx context.Context) (int, error) {
			deleted := 0
			cmds, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				keys := make([]string, 0, 1000)
				for i := 1; i <= n; i++ {
					keys = append(keys, r.stateKey(fmt.Sprintf("j%09d", i)))
					if len(keys) == cap(keys) || i == n {
						p.Del(ctx, keys...)
						keys = make([]string, 0, 1000)
					}
				}
				lo, hi := expiredRange()
				p.ZRemRangeByLex(ctx, r.markers, lo, hi)
				return nil
			})
			if err != nil {
				return 0, err
			}
			for _, c := range cmds[:len(cmds)-1] {
				deleted += int(c.(*redis.IntCmd).Val())
			}
			return deleted, nil
		},
		Check: r.Check,
	}
}

// janitorScript takes up to ARGV[3] expired markers (the lex range ARGV[1]
// to ARGV[2]) of the set KEYS[1] and, one by one, deletes the entity's
// state key (ARGV[4] followed by the id, which starts at byte ARGV[5] of
// the member) and the marker. It returns how many it took. This is the
// shape of asynq's janitor script (ZRANGEBYSCORE ... LIMIT, then DEL and
// ZREM per task) over this benchmark's data.
var janitorScript = redis.NewScript(`
local members = redis.call("ZRANGE", KEYS[1], ARGV[1], ARGV[2], "BYLEX", "LIMIT", 0, tonumber(ARGV[3]))
local from = tonumber(ARGV[5])
for _, m in ipairs(members) do
	redis.call("DEL", ARGV[4] .. string.sub(m, from))
	redis.call("ZREM", KEYS[1], m)
end
return #members
`)

// JanitorBatch is how many tasks asynq's janitor deletes per script call.
const JanitorBatch = 100

// Janitor deletes the backlog the way asynq's janitor deletes expired
// completed tasks: a Lua script taking JanitorBatch at a time, called
// until it finds none.
func (r *Redis) Janitor() Contender {
	return Contender{
		Name:  "asynq-style janitor script (100 per call)",
		Setup: r.Setup,
		Clear: func(ctx context.Context) (int, error) {
			total := 0
			lo, hi := expiredRange()
			idAt := strconv.Itoa(len(Prefix) + 22) // Lua strings count from 1
			for {
				n, err := janitorScript.Run(ctx, r.rdb, []string{r.markers}, lo, hi, JanitorBatch, r.ns+"state:", idAt).Int()
				total += n
				if err != nil || n == 0 {
					return total, err
				}
			}
		},
		Check: r.Check,
	}
}

// Retention sweeps the backlog with one retention Pass. cfg gets Prefix,
// Retention and a silent Logger; set Clear or ClearBatch (ClearByID and
// ClearBatchByID here delete state keys), PageSize, BatchSize and
// Concurrency.
func (r *Redis) Retention(name string, cfg retention.Config) Contender {
	return r.retention(name, r.kv, cfg)
}

// Atomic sweeps the backlog with one retention Pass over a
// rediskv.AtomicKV: each batch's state keys and markers go in one script,
// so each entity is cleared exactly once. cfg is as for Retention, with
// neither Clear nor ClearBatch.
func (r *Redis) Atomic(name string, cfg retention.Config) Contender {
	kv, err := r.kv.WithClear(func(ids []string) []string {
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = r.stateKey(id)
		}
		return keys
	})
	if err != nil {
		// Only a nil function gets here; the contender reports it when run.
		return Contender{Name: name, Setup: func(context.Context, int) error { return err }}
	}
	return r.retention(name, kv, cfg)
}

// Runs sweeps the backlog with one retention Pass over a
// rediskv.AtomicKV made by WithStateKeys with the state keys' template:
// the sweep asks the store for runs of limit markers, each read, checked
// and cleared by one script call, with no Scan of the expired range.
func (r *Redis) Runs(limit int) Contender {
	name := fmt.Sprintf("rediskv.AtomicKV runs of %d", limit)
	kv, err := r.kv.WithStateKeys(r.ns + "state:<id>")
	if err != nil {
		return Contender{Name: name, Setup: func(context.Context, int) error { return err }}
	}
	return r.retention(name, kv, retention.Config{BatchSize: limit, PageSize: limit})
}

func (r *Redis) retention(name string, kv retention.KV, cfg retention.Config) Contender {
	return Contender{
		Name:  name,
		Setup: r.Setup,
		Clear: func(ctx context.Context) (int, error) {
			return sweep(ctx, r.Timing.kv(kv), cfg, r.Timing)
		},
		Check: r.Check,
	}
}

// ClearByID is a Config.Clear that deletes one state key: one round trip
// per id.
func (r *Redis) ClearByID(ctx context.Context, id string) error {
	return r.rdb.Del(ctx, r.stateKey(id)).Err()
}

// ClearBatchByID is a Config.ClearBatch that deletes the batch's state
// keys with one variadic DEL.
func (r *Redis) ClearBatchByID(ctx context.Context, ids []string) error {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = r.stateKey(id)
	}
	return r.rdb.Del(ctx, keys...).Err()
}

// AtomicBatches is the Atomic contender with batches of batch, pages of
// 1,000 and Concurrency conc.
func (r *Redis) AtomicBatches(batch, conc int) Contender {
	return r.Atomic(fmt.Sprintf("retention batched+atomic %d, page 1000, concurrency %d", batch, conc), retention.Config{
		BatchSize: batch, PageSize: 1000, Concurrency: conc,
	})
}

// Contenders returns every Redis contender for a backlog of n, the floor
// first and the janitor script second: the two baselines of the table.
func (r *Redis) Contenders(n int) []Contender {
	perID := func(conc int) Contender {
		return r.Retention(fmt.Sprintf("retention per-id, concurrency %d", conc), retention.Config{
			Clear: r.ClearByID, PageSize: 1000, Concurrency: conc,
		})
	}
	batched := func(batch, conc int) Contender {
		return r.Retention(fmt.Sprintf("retention batched %d, page 1000, concurrency %d", batch, conc), retention.Config{
			ClearBatch: r.ClearBatchByID, BatchSize: batch, PageSize: 1000, Concurrency: conc,
		})
	}
	return []Contender{
		r.Floor(n), r.Janitor(),
		perID(1), perID(16),
		batched(1000, 1), batched(1000, 4), batched(100, 4),
		r.AtomicBatches(1000, 1), r.AtomicBatches(100, 4),
		r.Atomic("retention batched+atomic 1000, page 4000, concurrency 2", retention.Config{BatchSize: 1000, PageSize: 4000, Concurrency: 2}),
		r.Atomic("retention batched+atomic 4000, page 4000, concurrency 1", retention.Config{BatchSize: 4000, PageSize: 4000, Concurrency: 1}),
		r.Runs(JanitorBatch), r.Runs(1000), r.Runs(4000),
	}
}
