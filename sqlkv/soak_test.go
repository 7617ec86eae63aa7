package sqlkv_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/sqlkv"
)

const (
	soakExpired   = 1500
	soakUnexpired = 150
	soakPasses    = 40 // passes with faults, then clean passes until done
)

// errInjected is the error of an injected fault.
var errInjected = errors.New("injected fault")

// TestFaultSoak sweeps jobs through an AtomicKV on each dialect, several
// seeds each, with Concurrency 3 and, clearing in runs (ClearRun), 1,
// while clears fail, panic or hang past Config.ClearTimeout, and the
// store's calls fail either before they reach the database or after (a
// lost reply: the write happened), hang until Config.StoreTimeout ends
// them, or delete or move some of their keys and fail. After every pass
// the database must show every job present with exactly one marker and
// every marker with its job (no marker deleted before its entity's clear
// committed), no id cleared by two committed transactions and no
// unexpired job touched; clean passes must then clear every expired job.
func TestFaultSoak(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fault soak")
	}
	soakEach(t, markerSoak)
}

// soakEach soaks the store that build makes on each dialect: seeds 1 to
// 3 with Concurrency 3, and 4 to 7 with Concurrency 1, which clears in
// runs while no id whose marker is in the range waits in the sweep's
// memory, and reads pages while one does.
func soakEach(t *testing.T, build func(t testing.TB, dl dialect, faults *soakFaults) soakStore) {
	forEach(t, func(t *testing.T, dl dialect) {
		for _, seed := range []uint64{1, 2, 3} {
			t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
				t.Parallel()
				soak(t, seed, 3, func(f *soakFaults) soakStore { return build(t, dl, f) })
			})
		}
		for _, seed := range []uint64{4, 5, 6, 7} {
			t.Run(fmt.Sprint("runs/seed", seed), func(t *testing.T) {
				t.Parallel()
				soak(t, seed, 1, func(f *soakFaults) soakStore { return build(t, dl, f) })
			})
		}
	})
}

// soakStore is what a soak sweeps: an atomic store whose ClearFunc ends
// with faults.clear, the prefix of its markers, and the check of what its
// database shows.
type soakStore struct {
	kv      atomicStore
	prefix  string
	expired int // expired jobs
	check   func(t testing.TB) crashState
	// counted: no ClearFunc, so no log of the ids cleared; the rows'
	// deletions are the clears, and runs are counted (RunCounter).
	counted bool
	// observe sets an Observer: counted runs are asked for their times.
	observe bool
}

// markerSoak is a soak's store of jobs with a marker each in a marker
// table: soakExpired expired and soakUnexpired unexpired ones.
func markerSoak(t testing.TB, dl dialect, faults *soakFaults) soakStore {
	db := dl.open(t, "")
	db.SetMaxOpenConns(8)
	ctx := context.Background()
	markers := freshTable(t, db, dl.d)
	jobs, cleared := markers+"_jobs", markers+"_cleared"
	for _, s := range []string{
		"CREATE TABLE " + jobs + " (id VARCHAR(20) PRIMARY KEY, expired INTEGER NOT NULL)",
		"CREATE TABLE " + cleared + " (id VARCHAR(20) NOT NULL, tx VARCHAR(20) NOT NULL)",
	} {
		_, err := db.ExecContext(ctx, s)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs)
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+cleared)
	})
	kv, err := sqlkv.New(db, dl.d, markers)
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for i := range soakExpired + soakUnexpired {
		id, at, exp := fmt.Sprintf("x%05d", i), soakNow.Add(-2*time.Hour+time.Duration(i)*time.Millisecond), 1
		if i >= soakExpired {
			id, at, exp = fmt.Sprintf("u%05d", i), soakNow.Add(time.Duration(i)*time.Millisecond), 0
		}
		_, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" VALUES (?, ?)"), id, exp)
		require.NoError(t, err)
		require.NoError(t, kv.MarkTx(ctx, tx, "soak/", id, at))
	}
	require.NoError(t, tx.Commit())

	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		token := txToken()
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, q(dl.d, "DELETE FROM "+jobs+" WHERE id = ?"), id); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+cleared+" VALUES (?, ?)"), id, token); err != nil {
				return err
			}
		}
		return faults.clear(ctx)
	})
	require.NoError(t, err)
	return soakStore{kv: akv, prefix: "soak/", expired: soakExpired,
		check: func(t testing.TB) crashState { return soakCheck(t, db, markers, jobs, cleared) }}
}

// soakNow is the time of a soak's manual clock as it starts.
var soakNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// txToken returns a token of its own for a clear's transaction: the
// cleared tables record it with each id, so that two transactions that
// cleared one id show.
func txToken() string {
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	return hex.EncodeToString(raw[:])
}

// soakFaults draws the faults of a soak from its seed, while they are
// on: one source for the store's calls and the clears.
type soakFaults struct {
	mu  sync.Mutex
	rng *mrand.Rand
	off bool
	// spread spreads the draws over [0, spread): each fault happens at
	// 1/spread of its rate.
	spread float64
}

// roll returns a draw in [0, spread), or 1 (no fault) once the faults
// are off.
func (f *soakFaults) roll() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return 1
	}
	return f.spread * f.rng.Float64()
}

// stop turns the faults off.
func (f *soakFaults) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.off = true
}

// clear is the end of a ClearFunc, after its statements: it fails, panics
// or hangs until ctx is done (past ClearTimeout), or returns nil.
func (f *soakFaults) clear(ctx context.Context) error {
	switch r := f.roll(); {
	case r < 0.08:
		return errInjected
	case r < 0.12:
		panic("injected panic")
	case r < 0.16:
		<-ctx.Done() // hangs past ClearTimeout
		return ctx.Err()
	}
	return nil
}

// soak sweeps the store that newStore makes, with the faults of seed,
// for soakPasses passes, checking the store after each, then without
// faults until a pass has nothing left to do.
func soak(t *testing.T, seed uint64, concurrency int, newStore func(*soakFaults) soakStore) {
	// In runs, batches of 10 and faults at half the rate: a fault leaves an
	// id in the sweep's memory, and the sweep takes no run until it is
	// cleared, so that few runs would meet a fault otherwise.
	batch, faults := 50, &soakFaults{rng: mrand.New(mrand.NewPCG(seed, seed)), spread: 1}
	if concurrency == 1 {
		batch, faults.spread = 10, 2
	}
	st := newStore(faults)
	ctx := context.Background()
	clock := retention.NewManualClock(soakNow)
	fkv := &faultKV{akv: st.kv, faults: faults}
	cfg := retention.Config{
		Prefix: st.prefix, Retention: time.Hour, Clock: clock,
		PageSize: 200, BatchSize: batch, Concurrency: concurrency,
		// A hung store call ends with StoreTimeout.
		ClearTimeout: 200 * time.Millisecond, StoreTimeout: time.Second,
		RetryDelay: time.Second, MaxRetryDelay: time.Second,
		Logger: slog.New(slog.DiscardHandler),
	}
	lags := &lagCounter{}
	if st.observe {
		cfg.Observer = lags
		defer func() { assert.Positive(t, lags.n.Load(), "lags observed") }()
	}
	s, err := retention.New(fkv, cfg)
	require.NoError(t, err)
	check := func(when string) crashState {
		state := st.check(t)
		require.Zero(t, state.lost, "%s: jobs without a marker", when)
		require.Zero(t, state.orphans, "%s: markers without a job", when)
		require.Zero(t, state.dupMarkers, "%s: ids with several markers", when)
		require.Zero(t, state.doubleCleared, "%s: ids cleared twice", when)
		require.Zero(t, state.unexpiredTouched, "%s: unexpired jobs touched", when)
		return state
	}
	failedPasses := 0
	for pass := range soakPasses {
		if _, err := s.Pass(ctx); err != nil {
			failedPasses++
		}
		clock.Advance(2 * time.Second)
		check(fmt.Sprintf("after faulty pass %d", pass))
	}
	faults.stop()
	// A store call of a clean pass may still outlast StoreTimeout on a
	// busy machine: one more ambiguous failure, and no other may happen.
	done, timeouts := false, 0
	for range 30 {
		ps, err := s.Pass(ctx)
		clock.Advance(2 * time.Second)
		if errors.Is(err, context.DeadlineExceeded) {
			timeouts++
			continue
		}
		require.NoError(t, err)
		if ps.Cleared == 0 && ps.Failed == 0 && ps.Retried == 0 {
			done = true
			break
		}
	}
	final := check("after the clean passes")
	runs := fkv.runs.Load()
	t.Logf("seed %d: %d of %d faulty passes failed, %d runs (%d failed, %d counted), %s; %d clean passes timed out; then %s",
		seed, failedPasses, soakPasses, runs, fkv.failedRuns.Load(), fkv.counts.Load(), fkv.report(), timeouts, final)
	require.True(t, done, "no clean pass was left with nothing to do")
	if concurrency == 1 {
		assert.Positive(t, runs, "runs")
	} else {
		assert.Zero(t, runs, "runs with Concurrency %d", concurrency)
	}
	assert.Zero(t, final.expiredLeft, "expired jobs left")
	if st.counted {
		assert.Positive(t, fkv.counts.Load(), "counted runs")
		return
	}
	assert.Zero(t, fkv.counts.Load(), "counted runs of a store with a ClearFunc")
	assert.Equal(t, st.expired, final.clearedIDs, "expired ids cleared")
}

// faultKV forwards to an atomic store; its faults decide, per call, to
// fail before the call (nothing happened) or after it (the reply was
// lost), to hang until ctx is done, or, for a Delete or a Move, to delete
// or move some of the keys and fail. It counts the runs it is asked for,
// those that failed, and the faults.
type faultKV struct {
	akv                        atomicStore
	faults                     *soakFaults
	runs, failedRuns, counts   atomic.Int64
	hangs, partials, lostCalls atomic.Int64
}

func (f *faultKV) Unwrap() retention.KV { return f.akv }

// around runs call unless the roll fails it first or hangs it, and may
// then lose its reply.
func (f *faultKV) around(ctx context.Context, call func() error) error {
	switch r := f.faults.roll(); {
	case r < 0.05:
		return fmt.Errorf("before the call: %w", errInjected)
	case r < 0.10:
		if err := call(); err != nil {
			return err
		}
		f.lostCalls.Add(1)
		return fmt.Errorf("reply lost: %w", errInjected)
	case r < 0.11:
		f.hangs.Add(1)
		<-ctx.Done()
		return fmt.Errorf("hung: %w", ctx.Err())
	}
	return call()
}

// some returns a random part of n items, by index, when the roll picks a
// partial write of them.
func (f *faultKV) some(n int) ([]int, bool) {
	if n < 2 || f.faults.roll() >= 0.1 {
		return nil, false
	}
	f.partials.Add(1)
	var part []int
	for i := range n {
		if f.faults.roll() < f.faults.spread/2 {
			part = append(part, i)
		}
	}
	return part, true
}

func (f *faultKV) report() string {
	return fmt.Sprintf("%d hung calls, %d partial, %d lost replies", f.hangs.Load(), f.partials.Load(), f.lostCalls.Load())
}

func (f *faultKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	var keys [][]byte
	err := f.around(ctx, func() (err error) {
		keys, err = f.akv.Scan(ctx, start, end, limit)
		return err
	})
	return keys, err
}

func (f *faultKV) Delete(ctx context.Context, keys ...[]byte) error {
	if part, ok := f.some(len(keys)); ok {
		var some [][]byte
		for _, i := range part {
			some = append(some, keys[i])
		}
		if err := f.akv.Delete(ctx, some...); err != nil {
			return err
		}
		return fmt.Errorf("delete: %d of %d keys deleted: %w", len(some), len(keys), errInjected)
	}
	return f.around(ctx, func() error { return f.akv.Delete(ctx, keys...) })
}

func (f *faultKV) Put(ctx context.Context, key, value []byte) error {
	return f.around(ctx, func() error { return f.akv.Put(ctx, key, value) })
}

func (f *faultKV) Move(ctx context.Context, from, to [][]byte) error {
	if part, ok := f.some(len(from)); ok {
		var someFrom, someTo [][]byte
		for _, i := range part {
			someFrom, someTo = append(someFrom, from[i]), append(someTo, to[i])
		}
		if err := f.akv.Move(ctx, someFrom, someTo); err != nil {
			return err
		}
		return fmt.Errorf("move: %d of %d pairs moved: %w", len(someFrom), len(from), errInjected)
	}
	return f.around(ctx, func() error { return f.akv.Move(ctx, from, to) })
}

func (f *faultKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return f.around(ctx, func() error { return f.akv.ClearAndDelete(ctx, ids, keys) })
}

func (f *faultKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	f.runs.Add(1)
	var keys [][]byte
	err := f.around(ctx, func() (err error) {
		keys, err = f.akv.ClearRun(ctx, prefix, from, end, limit)
		return err
	})
	if err != nil {
		f.failedRuns.Add(1)
		return nil, err
	}
	return keys, nil
}

// CountRun implements retention.RunCounter, for a store that is one.
func (f *faultKV) CountRun(ctx context.Context, prefix string, from, end []byte, limit int, times bool) (retention.RunCount, error) {
	rc, ok := f.akv.(retention.RunCounter)
	if !ok {
		return retention.RunCount{}, fmt.Errorf("a %T counts no runs: %w", f.akv, errors.ErrUnsupported)
	}
	f.runs.Add(1)
	var c retention.RunCount
	err := f.around(ctx, func() (err error) {
		c, err = rc.CountRun(ctx, prefix, from, end, limit, times)
		return err
	})
	if errors.Is(err, errors.ErrUnsupported) {
		f.runs.Add(-1)
		return c, err
	}
	if err != nil {
		f.failedRuns.Add(1)
		return retention.RunCount{}, err
	}
	f.counts.Add(1)
	return c, nil
}

// RunStore implements retention.RunClearer.
func (f *faultKV) RunStore() retention.RunClearer { return f }

// soakCheck reads a marker soak's tables in one snapshot.
func soakCheck(t testing.TB, db *sql.DB, markers, jobs, cleared string) crashState {
	t.Helper()
	ctx := context.Background()
	// One transaction, for one snapshot on the server dialects.
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil { // SQLite takes no isolation level: it is serializable
		tx, err = db.BeginTx(ctx, nil)
	}
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	read := func(query string, row func(*sql.Rows) error) {
		rows, err := tx.QueryContext(ctx, query)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			require.NoError(t, row(rows))
		}
		require.NoError(t, rows.Err())
	}
	marks := map[string]int{}
	read("SELECT marker FROM "+markers, func(r *sql.Rows) error {
		var key []byte
		if err := r.Scan(&key); err != nil {
			return err
		}
		s := string(key)
		for i := len(s) - 1; i >= 0; i-- {
			if s[i] == '/' {
				s = s[i+1:]
				break
			}
		}
		marks[s]++
		return nil
	})
	live := map[string]bool{}
	read("SELECT id, expired FROM "+jobs, func(r *sql.Rows) error {
		var id string
		var exp int
		err := r.Scan(&id, &exp)
		live[id] = exp == 1
		return err
	})
	txs := map[string]map[string]bool{}
	read("SELECT id, tx FROM "+cleared, func(r *sql.Rows) error {
		var id, tx string
		if err := r.Scan(&id, &tx); err != nil {
			return err
		}
		if txs[id] == nil {
			txs[id] = map[string]bool{}
		}
		txs[id][tx] = true
		return nil
	})
	var st crashState
	unexpired := 0
	for id, exp := range live {
		if exp {
			st.expiredLeft++
		} else if marks[id] == 1 {
			unexpired++
		}
		if marks[id] == 0 {
			st.lost++
		}
	}
	for id, n := range marks {
		if _, ok := live[id]; !ok {
			st.orphans++
		}
		if n > 1 {
			st.dupMarkers++
		}
	}
	st.clearedIDs = len(txs)
	for id, set := range txs {
		if len(set) > 1 {
			st.doubleCleared++
		}
		if id[0] == 'u' {
			st.unexpiredTouched++
		}
	}
	st.unexpiredTouched += soakUnexpired - unexpired
	return st
}
