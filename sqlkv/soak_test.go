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
// lost reply: the write happened). After every pass the database
// must show every job present with exactly one marker and every marker
// with its job (no marker deleted before its entity's clear committed), no
// id cleared by two committed transactions and no unexpired job touched;
// clean passes must then clear every expired job.
func TestFaultSoak(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fault soak")
	}
	forEach(t, func(t *testing.T, dl dialect) {
		for _, seed := range []uint64{1, 2, 3} {
			t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
				t.Parallel()
				soak(t, dl, seed, 3)
			})
		}
		// Concurrency 1: the sweep clears in runs while no id whose marker
		// is in the range waits in its memory, and reads pages while one does.
		for _, seed := range []uint64{4, 5, 6, 7} {
			t.Run(fmt.Sprint("runs/seed", seed), func(t *testing.T) {
				t.Parallel()
				soak(t, dl, seed, 1)
			})
		}
	})
}

func soak(t *testing.T, dl dialect, seed uint64, concurrency int) {
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
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for i := range soakExpired + soakUnexpired {
		id, at, exp := fmt.Sprintf("x%05d", i), now.Add(-2*time.Hour+time.Duration(i)*time.Millisecond), 1
		if i >= soakExpired {
			id, at, exp = fmt.Sprintf("u%05d", i), now.Add(time.Duration(i)*time.Millisecond), 0
		}
		_, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+jobs+" VALUES (?, ?)"), id, exp)
		require.NoError(t, err)
		require.NoError(t, kv.MarkTx(ctx, tx, "soak/", id, at))
	}
	require.NoError(t, tx.Commit())

	var mu sync.Mutex
	rng := mrand.New(mrand.NewPCG(seed, seed))
	faults := true
	// In runs, batches of 10 and faults at half the rate: a fault leaves an
	// id in the sweep's memory, and the sweep takes no run until it is
	// cleared, so that few runs would meet a fault otherwise.
	batch, spread := 50, 1.0
	if concurrency == 1 {
		batch, spread = 10, 2
	}
	roll := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		if !faults {
			return 1
		}
		return spread * rng.Float64()
	}
	akv, err := kv.WithClear(func(ctx context.Context, tx *sql.Tx, ids []string) error {
		var raw [8]byte
		_, _ = rand.Read(raw[:])
		token := hex.EncodeToString(raw[:])
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, q(dl.d, "DELETE FROM "+jobs+" WHERE id = ?"), id); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q(dl.d, "INSERT INTO "+cleared+" VALUES (?, ?)"), id, token); err != nil {
				return err
			}
		}
		switch r := roll(); {
		case r < 0.08:
			return errInjected
		case r < 0.12:
			panic("injected panic")
		case r < 0.16:
			<-ctx.Done() // hangs past ClearTimeout
			return ctx.Err()
		}
		return nil
	})
	require.NoError(t, err)
	clock := retention.NewManualClock(now)
	fkv := &faultKV{akv: akv, roll: roll}
	s, err := retention.New(fkv, retention.Config{
		Prefix: "soak/", Retention: time.Hour, Clock: clock,
		PageSize: 200, BatchSize: batch, Concurrency: concurrency,
		ClearTimeout: 200 * time.Millisecond, RetryDelay: time.Second, MaxRetryDelay: time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	check := func(when string) soakState {
		st := soakCheck(t, db, markers, jobs, cleared)
		require.Zero(t, st.lost, "%s: jobs without a marker", when)
		require.Zero(t, st.orphans, "%s: markers without a job", when)
		require.Zero(t, st.dupMarkers, "%s: ids with several markers", when)
		require.Zero(t, st.doubleCleared, "%s: ids cleared twice", when)
		require.Zero(t, st.unexpiredTouched, "%s: unexpired jobs touched", when)
		return st
	}
	failedPasses := 0
	for pass := range soakPasses {
		if _, err := s.Pass(ctx); err != nil {
			failedPasses++
		}
		clock.Advance(2 * time.Second)
		check(fmt.Sprintf("after faulty pass %d", pass))
	}
	mu.Lock()
	faults = false
	mu.Unlock()
	for range 20 {
		st, err := s.Pass(ctx)
		require.NoError(t, err)
		clock.Advance(2 * time.Second)
		if st.Cleared == 0 && st.Failed == 0 && st.Retried == 0 {
			break
		}
	}
	final := check("after the clean passes")
	runs := fkv.runs.Load()
	t.Logf("seed %d: %d of %d faulty passes failed, %d runs (%d failed); then %s", seed, failedPasses, soakPasses, runs, fkv.failedRuns.Load(), final)
	if concurrency == 1 {
		assert.Positive(t, runs, "runs")
	} else {
		assert.Zero(t, runs, "runs with Concurrency %d", concurrency)
	}
	assert.Zero(t, final.expiredLeft, "expired jobs left")
	assert.Equal(t, soakExpired, final.clearedIDs, "expired ids cleared")
}

// faultKV forwards to an AtomicKV; roll decides, per call, to fail before
// the call (nothing happened) or after it (the reply was lost). It counts
// the runs it is asked for, and those that failed.
type faultKV struct {
	akv              *sqlkv.AtomicKV
	roll             func() float64
	runs, failedRuns atomic.Int64
}

func (f *faultKV) Unwrap() retention.KV { return f.akv }

// around runs call unless the roll fails it first, and may then lose its
// reply.
func (f *faultKV) around(call func() error) error {
	switch r := f.roll(); {
	case r < 0.05:
		return fmt.Errorf("before the call: %w", errInjected)
	case r < 0.10:
		if err := call(); err != nil {
			return err
		}
		return fmt.Errorf("reply lost: %w", errInjected)
	}
	return call()
}

func (f *faultKV) Scan(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	var keys [][]byte
	err := f.around(func() (err error) {
		keys, err = f.akv.Scan(ctx, start, end, limit)
		return err
	})
	return keys, err
}

func (f *faultKV) Delete(ctx context.Context, keys ...[]byte) error {
	return f.around(func() error { return f.akv.Delete(ctx, keys...) })
}

func (f *faultKV) Put(ctx context.Context, key, value []byte) error {
	return f.around(func() error { return f.akv.Put(ctx, key, value) })
}

func (f *faultKV) Move(ctx context.Context, from, to [][]byte) error {
	return f.around(func() error { return f.akv.Move(ctx, from, to) })
}

func (f *faultKV) ClearAndDelete(ctx context.Context, ids []string, keys [][]byte) error {
	return f.around(func() error { return f.akv.ClearAndDelete(ctx, ids, keys) })
}

func (f *faultKV) ClearRun(ctx context.Context, prefix string, from, end []byte, limit int) ([][]byte, error) {
	f.runs.Add(1)
	var keys [][]byte
	err := f.around(func() (err error) {
		keys, err = f.akv.ClearRun(ctx, prefix, from, end, limit)
		return err
	})
	if err != nil {
		f.failedRuns.Add(1)
		return nil, err
	}
	return keys, nil
}

// RunStore implements retention.RunClearer.
func (f *faultKV) RunStore() retention.RunClearer { return f }

// soakState is what the tables show after a pass.
type soakState struct {
	expiredLeft, clearedIDs                  int
	lost, orphans, dupMarkers, doubleCleared int
	unexpiredTouched                         int
}

func (s soakState) String() string {
	return fmt.Sprintf("%d expired left, %d ids cleared, no violation", s.expiredLeft, s.clearedIDs)
}

func soakCheck(t testing.TB, db *sql.DB, markers, jobs, cleared string) soakState {
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
	var st soakState
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
