package pgkv_test

// Adversarial review of issue 15 (branch review15).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// TestReviewMoveOntoItself: retention.Mover says each from[i] is replaced
// by to[i]; MemKV, Redis, etcd and bbolt keep the key when to == from.
func TestReviewMoveOntoItself(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	require.NoError(t, kv.Put(ctx, []byte("a"), nil))
	require.NoError(t, kv.Move(ctx, bs("a"), bs("a")))
	assert.Equal(t, []string{"a"}, keysOf(t, kv), "a Move of a key onto itself must keep it")

	leases := freshLeaseTable(t, pool)
	locker, err := pgkv.NewLocker(pool, "self", &pgkv.LockerOptions{TTL: 5 * time.Second, Table: leases})
	require.NoError(t, err)
	lease, err := locker.TryAcquire(ctx)
	require.NoError(t, err)
	defer func() { _ = lease.Release(ctx) }()
	view, _ := lease.(retention.Fencer).Fence(kv)
	require.NoError(t, kv.Put(ctx, []byte("b"), nil))
	require.NoError(t, view.(retention.Mover).Move(ctx, bs("b"), bs("b")))
	assert.Contains(t, keysOf(t, kv), "b", "a fenced Move of a key onto itself must keep it")
}

// TestReviewAtomicTrickySQL: the ClearFunc's statements, joined into one
// simple-protocol query, with comments, dollar quotes, E” strings and
// NamedArgs, clear exactly the batch.
func TestReviewAtomicTrickySQL(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE TABLE "+jobs+"_log (id text, note text)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+jobs+"_log") })
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[]) -- $2 in a comment", ids)
		b.Queue("/* $1 /* nested $2 */ still $3 */ INSERT INTO "+jobs+"_log SELECT unnest($1::text[]), $$it's $1 $$ || E'\\' $2' || $tag$ $1 $tag$ || $2", ids, "x")
		b.Queue("INSERT INTO "+jobs+"_log SELECT unnest(@ids::text[]), @note", pgx.NamedArgs{"ids": ids, "note": "n'amed"})
		return nil
	})
	require.NoError(t, err)
	ids := finishJobs(t, pool, kv, jobs, 5, time.Now().Add(-2*time.Hour))
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, st.Cleared, "stats %+v", st)
	assert.Equal(t, 0, count(t, pool, jobs))
	assert.Equal(t, 10, count(t, pool, jobs+"_log"))
	var note string
	require.NoError(t, pool.QueryRow(ctx, "SELECT note FROM "+jobs+"_log WHERE note <> 'n''amed' LIMIT 1").Scan(&note))
	assert.Equal(t, "it's $1 ' $2 $1 x", note)
	_ = ids
}

// TestReviewAtomicBigBatch: one ClearAndDelete of many keys (one
// simple-protocol message; its markers go as a range).
func TestReviewAtomicBigBatch(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[])", ids)
		return nil
	})
	require.NoError(t, err)
	const n = 65536
	_, err = pool.Exec(ctx, fmt.Sprintf("INSERT INTO %s SELECT 'j' || lpad(g::text, 6, '0') FROM generate_series(0, %d) g", jobs, n-1))
	require.NoError(t, err)
	var keys [][]byte
	at := time.Now().Add(-2 * time.Hour)
	for i := range n {
		k, err := retention.MarkerKey("jobs/done/", at.Add(time.Duration(i)*time.Microsecond), fmt.Sprintf("j%06d", i))
		require.NoError(t, err)
		keys = append(keys, k)
	}
	_, err = pool.Exec(ctx, "INSERT INTO "+markers+" SELECT unnest($1::bytea[])", keys)
	require.NoError(t, err)
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, PageSize: n, BatchSize: n})
	require.NoError(t, err)
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, st.Cleared, "stats %+v", st)
	assert.Equal(t, 0, count(t, pool, jobs))
}

// TestReviewAtomicTrickyIDs: ids a custom ValidateID allows, sent through
// the simple protocol (client-side interpolation of a text[]), reach the
// ClearFunc's statement unchanged.
func TestReviewAtomicTrickyIDs(t *testing.T) {
	pool := connect(t)
	markers := freshTable(t, pool)
	jobs, _ := jobsTable(t, pool, markers)
	ctx := context.Background()
	kv, err := pgkv.New(pool, markers)
	require.NoError(t, err)
	akv, err := kv.WithClear(func(b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[])", ids)
		return nil
	})
	require.NoError(t, err)
	ids := []string{`a"b`, `c\d`, `NULL`, ` sp `, `{x}`, `a,b`, `é`, `'q'`, `$1`, `--c`, `e'\'`}
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour,
		ValidateID: func(string) error { return nil }})
	require.NoError(t, err)
	at := time.Now().Add(-2 * time.Hour)
	for _, id := range ids {
		_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (id) VALUES ($1)", id)
		require.NoError(t, err)
		key, err := s.MarkerKey(at, id)
		require.NoError(t, err)
		require.NoError(t, kv.Put(ctx, key, nil))
	}
	st, err := s.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, len(ids), st.Cleared, "stats %+v", st)
	assert.Equal(t, 0, count(t, pool, jobs), "every job deleted")
}

// TestReviewHalfSentUnfencedMoveStrandsMarkers: README, atomic clears
// "exactly once, without a lease" (several replicas, no lease). A replica
// without a lease reschedules failed markers with KV.Move, one statement in
// the extended protocol. If its host vanishes after the server got the
// Execute and before the Sync, the server keeps the implicit transaction
// open, holding the moved markers' rows, until TCP gives up (hours): every
// other replica's atomic clear of those markers waits for them, times out
// (ClearTimeout), reads them still there, bisects and fails. The issue asks
// that no lock be strandable by the network; the lease row is safe now,
// marker rows are not.
func TestReviewHalfSentUnfencedMoveStrandsMarkers(t *testing.T) {
	admin := connect(t)
	markers := freshTable(t, admin)
	jobs, _ := jobsTable(t, admin, markers)
	ctx := context.Background()

	cfg, err := pgxpool.ParseConfig(kvtestDSN(t))
	require.NoError(t, err)
	proxy := newCutProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), "unnest(")
	host, port, err := net.SplitHostPort(proxy.addr())
	require.NoError(t, err)
	p, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	vanishing, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer vanishing.Close()
	defer proxy.close()

	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)
	ids := finishJobs(t, admin, writer, jobs, 4, time.Now().Add(-2*time.Hour))
	keys, err := writer.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 100)
	require.NoError(t, err)
	require.Len(t, keys, 4)

	// Replica A reschedules the first two markers (their clear failed) and
	// vanishes mid-statement.
	replicaA, err := pgkv.New(vanishing, markers)
	require.NoError(t, err)
	proxy.arm()
	go func() {
		mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = replicaA.Move(mctx, keys[:2], [][]byte{append(bytes.Clone(keys[0]), 'x'), append(bytes.Clone(keys[1]), 'x')})
	}()
	select {
	case <-proxy.cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the Move never reached the server")
	}

	// Replica B sweeps with an atomic clear.
	akv, err := writer.WithClear(func(b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1::text[])", ids)
		return nil
	})
	require.NoError(t, err)
	s, err := retention.New(akv, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, ClearTimeout: 300 * time.Millisecond, StoreTimeout: time.Second, RetryDelay: time.Millisecond, MaxRetryDelay: time.Millisecond})
	require.NoError(t, err)
	var st retention.Stats
	for range 3 {
		st, err = s.Pass(ctx)
		t.Logf("replica B: %+v, %v", st, err)
		time.Sleep(5 * time.Millisecond)
	}
	left := count(t, admin, jobs)
	assert.Equal(t, 0, left, "replica B could not clear %d of the expired jobs (%v): their marker rows are locked by a half-sent statement of a vanished replica", left, ids[:2])
}

// TestReviewHalfSentUnfencedDeleteStallsSweep: the same with KV.Delete (a
// replica without a lease, Clear mode): the other replica's Delete of the
// page waits for the stranded rows, runs out of StoreTimeout and fails the
// pass at that page, every pass, so no marker after it is ever deleted
// until TCP gives up on the vanished host (and the page is cleared again
// at every pass).
func TestReviewHalfSentUnfencedDeleteStallsSweep(t *testing.T) {
	admin := connect(t)
	markers := freshTable(t, admin)
	jobs, _ := jobsTable(t, admin, markers)
	ctx := context.Background()

	cfg, err := pgxpool.ParseConfig(kvtestDSN(t))
	require.NoError(t, err)
	proxy := newCutProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), "DELETE FROM")
	host, port, err := net.SplitHostPort(proxy.addr())
	require.NoError(t, err)
	p, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	vanishing, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer vanishing.Close()
	defer proxy.close()

	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)
	finishJobs(t, admin, writer, jobs, 4, time.Now().Add(-2*time.Hour))
	keys, err := writer.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 100)
	require.NoError(t, err)

	replicaA, err := pgkv.New(vanishing, markers)
	require.NoError(t, err)
	proxy.arm()
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = replicaA.Delete(dctx, keys[0])
	}()
	select {
	case <-proxy.cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the Delete never reached the server")
	}
	clears := map[string]int{}
	s, err := retention.New(writer, retention.Config{Prefix: "jobs/done/", Retention: time.Hour, PageSize: 2, StoreTimeout: time.Second,
		Clear: func(_ context.Context, id string) error { clears[id]++; return nil }})
	require.NoError(t, err)
	for range 3 {
		st, err := s.Pass(ctx)
		t.Logf("replica B: cleared %d, deletes %d: %v", st.Cleared, st.DeleteCalls, err)
	}
	t.Logf("clears per id: %v", clears)
	// Fixed: the cut Delete was half a simple-protocol message, which the
	// server never ran, so it locked nothing and replica B swept them all.
	assert.Zero(t, count(t, admin, markers), "every marker is deleted: none is stranded")
	assert.Equal(t, map[string]int{"j00000": 1, "j00001": 1, "j00002": 1, "j00003": 1}, clears)
}
