package pgkv_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/marksweep/retention"
	"github.com/marksweep/retention/pgkv"
)

// cutProxy forwards PostgreSQL connections and reads the frontend
// messages on their way. Once armed, it cuts the traffic in the middle of
// the first transaction that runs a statement holding needle (never in a
// PREPARE, nor in an EXECUTE on a connection that prepared nothing): in the
// extended protocol right after the Execute of that statement (before the
// batch's Sync), in the simple protocol in the middle of the Query message,
// just after needle. From then on it passes nothing on any connection, in
// either direction, and closes nothing: the holder's host vanished.
type cutProxy struct {
	ln     net.Listener
	target string
	needle []byte

	mu     sync.Mutex
	conns  []net.Conn
	armed  bool
	forget bool // see forgetPrepared

	words  []string // the first word of each Query message, in order
	closed bool
	cut    chan struct{}
	wg     sync.WaitGroup
}

func newCutProxy(t testing.TB, target, needle string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, target: target, needle: []byte(needle), cut: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

// proxied returns the configuration of a pool whose connections go
// through a new cutProxy to the test server, and the proxy.
func proxied(t testing.TB, needle string) (*pgxpool.Config, *cutProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(kvtestDSN(t))
	require.NoError(t, err)
	proxy := newCutProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), needle)
	host, port, err := net.SplitHostPort(proxy.addr())
	require.NoError(t, err)
	p, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	return cfg, proxy
}

func (p *cutProxy) arm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = true
}

// forgetPrepared makes the proxy drop every statement a connection has
// prepared before each EXECUTE it passes on, as a pooler that gives each
// transaction another server connection can.
func (p *cutProxy) forgetPrepared() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forget = true
}

func (p *cutProxy) forgets() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forget
}

// saw records the first word of a Query message's text.
func (p *cutProxy) saw(query []byte) {
	word, _, _ := bytes.Cut(query, []byte(" "))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.words = append(p.words, string(word))
}

// queries returns the first word of each Query message passed so far.
func (p *cutProxy) queries() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.words)
}

func (p *cutProxy) isArmed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.armed
}

func (p *cutProxy) cutNow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.cut:
	default:
		close(p.cut)
	}
}

func (p *cutProxy) isCut() bool {
	select {
	case <-p.cut:
		return true
	default:
		return false
	}
}

func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// close closes every connection: the server sees the holder's sessions
// end and rolls back what they left open.
func (p *cutProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

func (p *cutProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			client.Close()
			return
		}
		if p.isCut() {
			p.wg.Go(func() { _, _ = io.Copy(io.Discard, client) }) // held open, never answered
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(server) {
			server.Close()
			client.Close()
			return
		}
		p.wg.Go(func() { p.frontend(client, server) })
		p.wg.Go(func() { p.backend(server, client) })
	}
}

// backend passes the server's replies until the cut, and drops them after.
func (p *cutProxy) backend(server, client net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && !p.isCut() {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// frontend passes the client's messages one by one, cutting where the
// proxy is told to.
func (p *cutProxy) frontend(client, server net.Conn) {
	r := bufio.NewReader(client)
	send := func(b []byte) bool {
		if p.isCut() {
			return true // dropped
		}
		_, err := server.Write(b)
		return err == nil
	}
	// Untyped start-up messages: an SSL or GSS request is followed by
	// another one.
	for {
		msg, err := readMessage(r, false)
		if err != nil || !send(msg) {
			return
		}
		if code := binary.BigEndian.Uint32(msg[4:8]); code != 80877103 && code != 80877104 {
			break
		}
	}
	statements := map[string][]byte{} // prepared statement name -> its SQL
	fenced := false                   // the statement bound last holds needle
	prepared := false                 // the connection sent a PREPARE
	for {
		msg, err := readMessage(r, true)
		if err != nil {
			return
		}
		body := msg[5:]
		armed := p.isArmed() && !p.isCut()
		switch msg[0] {
		case 'P': // Parse: statement name, query, ...
			name, rest, _ := bytes.Cut(body, []byte{0})
			query, _, _ := bytes.Cut(rest, []byte{0})
			statements[string(name)] = query
		case 'B': // Bind: portal name, statement name, ...
			_, rest, _ := bytes.Cut(body, []byte{0})
			name, _, _ := bytes.Cut(rest, []byte{0})
			fenced = bytes.Contains(statements[string(name)], p.needle)
		case 'Q': // Query: the whole transaction in one message
			p.saw(body)
			execute := bytes.HasPrefix(body, []byte("EXECUTE "))
			if bytes.HasPrefix(body, []byte("PREPARE ")) {
				// Runs nothing: a cut here would prove nothing.
				prepared, armed = true, false
			}
			if execute && !prepared {
				armed = false // an EXECUTE that fails before anything runs
			}
			if p.forgets() && execute {
				body = append([]byte("DEALLOCATE ALL;\n"), body...)
				msg = binary.BigEndian.AppendUint32([]byte{'Q'}, uint32(4+len(body)))
				msg = append(msg, body...)
			}
			if i := bytes.Index(body, p.needle); armed && i >= 0 {
				send(msg[:5+i+len(p.needle)])
				p.cutNow()
				continue
			}
		}
		if !send(msg) {
			return
		}
		if armed && msg[0] == 'E' && fenced {
			p.cutNow() // the Sync that would end the transaction never arrives
		}
	}
}

// readMessage reads one frontend message: a type byte (when typed), an
// int32 length that counts itself, and the body.
func readMessage(r *bufio.Reader, typed bool) ([]byte, error) {
	head := 4
	if typed {
		head = 5
	}
	msg := make([]byte, head)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4:]))
	if n < 4 || n > 1<<30 {
		return nil, io.ErrUnexpectedEOF
	}
	msg = append(msg, make([]byte, n-4)...)
	_, err := io.ReadFull(r, msg[head:])
	return msg, err
}

// TestHalfSentClearFreesLease: a holder whose host vanishes in the middle
// of a fenced atomic clear (after the server got the lease check, before
// the transaction could end) blocks the fleet for one TTL, not until TCP
// gives up: another replica takes the lease within the TTL and a margin,
// and the half-sent clear changed nothing.
func TestHalfSentClearFreesLease(t *testing.T) {
	halfSentFreesLease(t, "clear", false, nil, clearDeletingJobs, sendClear)
}

// TestHalfSentPreparedClearFreesLease: the same for a clear whose marker
// statement the holder's connection has prepared, cut in the EXECUTE of
// it.
func TestHalfSentPreparedClearFreesLease(t *testing.T) {
	halfSentFreesLease(t, "prepared clear", true, func(ctx context.Context, view retention.KV) error {
		err := view.(retention.ClearDeleter).ClearAndDelete(ctx, []string{"none"}, [][]byte{[]byte("jobs/done/none")})
		if !errors.Is(err, retention.ErrMarkerGone) {
			return fmt.Errorf("the clear of a marker that is not there: %w, want ErrMarkerGone", err)
		}
		return nil
	}, clearDeletingJobs, sendClear)
}

func clearDeletingJobs(kv *pgkv.KV, jobs string) (*pgkv.AtomicKV, error) {
	return kv.WithClear(func(_ context.Context, b *pgx.Batch, ids []string) error {
		b.Queue("DELETE FROM "+jobs+" WHERE id = ANY($1)", ids)
		return nil
	})
}

func sendClear(ctx context.Context, view retention.KV, ids []string, keys [][]byte) error {
	return view.(retention.ClearDeleter).ClearAndDelete(ctx, ids, keys)
}

// halfSentFreesLease cuts a fenced call of what (a clear or a run) off
// after the server got the lease check, and checks that another replica
// takes the lease within the TTL and a margin and that the call changed
// nothing. send makes the call through the fenced view of the AtomicKV
// that atomicOf makes of the holder's KV over the jobs table. That KV is
// over a pool when prepared, and the cut falls in the EXECUTE of the
// statement prepared (warm, when not nil, calls the view once before the
// proxy is armed); else over a DB that is no pool, which sends the text.
func halfSentFreesLease(t *testing.T, what string, prepared bool, warm func(ctx context.Context, view retention.KV) error,
	atomicOf func(kv *pgkv.KV, jobs string) (*pgkv.AtomicKV, error),
	send func(ctx context.Context, view retention.KV, ids []string, keys [][]byte) error) {
	admin := connect(t)
	markers := freshTable(t, admin)
	jobs, _ := jobsTable(t, admin, markers)
	leases := freshLeaseTable(t, admin)
	ctx := context.Background()

	needle := "FOR SHARE"
	if prepared {
		needle = "EXECUTE pgkv_"
	}
	cfg, proxy := proxied(t, needle)
	cfg.MaxConns = 4
	holderPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)

	// The holder must keep its lease through the setup below, which a
	// loaded machine (every core busy, the race detector) stretches to
	// seconds: lost there, the fenced send returns ErrLeaseLost without a
	// round trip and the proof checks nothing. 3s leaves a renewal 2.7s,
	// as the other lease tests do; the takeover waits for about a TTL.
	const ttl = 3 * time.Second
	opts := &pgkv.LockerOptions{TTL: ttl, Table: leases}
	holderLocker, err := pgkv.NewLocker(holderPool, "halfsent", opts)
	require.NoError(t, err)
	lease, err := holderLocker.TryAcquire(ctx)
	require.NoError(t, err)

	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)
	ids := finishJobs(t, admin, writer, jobs, 10, time.Now().Add(-2*time.Hour))
	keys, err := writer.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 100)
	require.NoError(t, err)
	var holderDB pgkv.DB = holderPool
	if !prepared {
		holderDB = struct{ pgkv.DB }{holderPool}
	}
	holderKV, err := pgkv.New(holderDB, markers)
	require.NoError(t, err)
	akv, err := atomicOf(holderKV, jobs)
	require.NoError(t, err)
	view, ok := lease.(retention.Fencer).Fence(akv)
	require.True(t, ok)
	if warm != nil {
		require.NoError(t, warm(ctx, view))
	}

	proxy.arm()
	clearDone := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		clearDone <- send(cctx, view, ids, keys)
	}()
	select {
	case <-proxy.cut:
	case err := <-clearDone:
		t.Fatalf("the %s returned before it reached the lease check: %v", what, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the %s never reached the lease check", what)
	}
	cutAt := time.Now()

	other, err := pgkv.NewLocker(admin, "halfsent", opts)
	require.NoError(t, err)
	deadline := cutAt.Add(ttl + time.Second)
	var taken retention.Lease
	attempts := 0
	for taken == nil && time.Now().Before(deadline) {
		attempts++
		actx, cancel := context.WithDeadline(ctx, deadline)
		taken, err = other.TryAcquire(actx)
		cancel()
		if err != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
	took := time.Since(cutAt)
	t.Logf("takeover after %v (%d attempts, TTL %v); last error: %v", took.Round(time.Millisecond), attempts, ttl, err)
	require.NotNil(t, taken, "no takeover within TTL + 1s of the cut: the half-sent %s holds the lease row", what)
	assert.Equal(t, 10, count(t, admin, jobs), "the half-sent %s cleared nothing", what)
	assert.Equal(t, 10, count(t, admin, markers), "nor deleted a marker")
	require.NoError(t, taken.Release(ctx))

	proxy.close()
	<-clearDone
	_ = lease.Release(ctx)
	holderPool.Close()
}

// TestHalfSentUnfencedMoveStrandsNoMarker: a replica without a lease
// reschedules failed markers with KV.Move. If its host vanishes after the
// server got part of the statement, the server runs nothing and holds no
// marker row: another replica's atomic clear of those markers goes
// through, rather than wait for rows an open transaction holds until TCP
// gives up (hours). Both as text and prepared (cut in the EXECUTE).
func TestHalfSentUnfencedMoveStrandsNoMarker(t *testing.T) {
	for _, prepared := range []bool{false, true} {
		t.Run(fmt.Sprintf("prepared=%v", prepared), func(t *testing.T) { testHalfSentUnfencedMove(t, prepared) })
	}
}

func testHalfSentUnfencedMove(t *testing.T, prepared bool) {
	admin := connect(t)
	markers := freshTable(t, admin)
	jobs, _ := jobsTable(t, admin, markers)
	ctx := context.Background()
	replicaA, proxy := vanishingReplica(t, markers, "unnest(", prepared, func(kv *pgkv.KV) error {
		return kv.Move(ctx, [][]byte{[]byte("jobs/done/none")}, [][]byte{[]byte("jobs/done/nonex")})
	})

	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)
	ids := finishJobs(t, admin, writer, jobs, 4, time.Now().Add(-2*time.Hour))
	keys, err := writer.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 100)
	require.NoError(t, err)
	require.Len(t, keys, 4)

	// Replica A reschedules the first two markers (their clear failed) and
	// vanishes mid-statement.
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
	akv, err := writer.WithClear(deleteJobs(jobs))
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

// TestHalfSentUnfencedDeleteDoesNotStallTheSweep: the same with KV.Delete
// (a replica without a lease, Clear mode): a Delete cut off midway holds no
// row, so the other replica's Delete of the page does not wait for rows
// stranded by a vanished host, and its passes go past that page. Both as
// text and prepared (cut in the EXECUTE).
func TestHalfSentUnfencedDeleteDoesNotStallTheSweep(t *testing.T) {
	for _, prepared := range []bool{false, true} {
		t.Run(fmt.Sprintf("prepared=%v", prepared), func(t *testing.T) { testHalfSentUnfencedDelete(t, prepared) })
	}
}

func testHalfSentUnfencedDelete(t *testing.T, prepared bool) {
	admin := connect(t)
	markers := freshTable(t, admin)
	jobs, _ := jobsTable(t, admin, markers)
	ctx := context.Background()
	replicaA, proxy := vanishingReplica(t, markers, "DELETE FROM", prepared, func(kv *pgkv.KV) error {
		return kv.Delete(ctx, []byte("jobs/done/none"))
	})

	writer, err := pgkv.New(admin, markers)
	require.NoError(t, err)
	finishJobs(t, admin, writer, jobs, 4, time.Now().Add(-2*time.Hour))
	keys, err := writer.Scan(ctx, []byte("jobs/done/0"), []byte("jobs/done:"), 100)
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

// vanishingReplica returns a KV over markers whose connections go through
// a cutProxy, and the proxy, not armed. When prepared, the KV is over a
// pool, warm calls it once, and the proxy cuts the next EXECUTE; else it
// is over a DB that is no pool, which sends the text, cut after needle.
func vanishingReplica(t *testing.T, markers, needle string, prepared bool, warm func(kv *pgkv.KV) error) (*pgkv.KV, *cutProxy) {
	if prepared {
		needle = "EXECUTE pgkv_"
	}
	cfg, proxy := proxied(t, needle)
	vanishing, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		proxy.close() // first: a call the cut left waiting fails, and frees its connection
		vanishing.Close()
	})
	var db pgkv.DB = struct{ pgkv.DB }{vanishing}
	if prepared {
		db = vanishing
	}
	kv, err := pgkv.New(db, markers)
	require.NoError(t, err)
	if prepared {
		require.NoError(t, warm(kv))
	}
	return kv, proxy
}

// TestHalfSentRunFreesLease: the same for a fenced run of an AtomicKV
// made by WithClearSQL, whose message holds the lease check, the run and
// the clear: cut off after the lease check, it runs nothing and holds no
// lock, so another replica takes the lease within the TTL and a margin.
func TestHalfSentRunFreesLease(t *testing.T) {
	halfSentFreesLease(t, "run", false, nil, runDeletingJobs, sendRun)
}

// TestHalfSentPreparedRunFreesLease: the same for a run whose statement
// the holder's connection has prepared, cut in the EXECUTE of it.
func TestHalfSentPreparedRunFreesLease(t *testing.T) {
	halfSentFreesLease(t, "prepared run", true, func(ctx context.Context, view retention.KV) error {
		keys, err := view.(retention.RunClearer).ClearRun(ctx, "jobs/done/", []byte("jobs/done:"), []byte("jobs/done;"), 100)
		if len(keys) != 0 {
			return fmt.Errorf("the run of an empty range cleared %q", keys)
		}
		return err
	}, runDeletingJobs, sendRun)
}

func runDeletingJobs(kv *pgkv.KV, jobs string) (*pgkv.AtomicKV, error) {
	return kv.WithClearSQL(deleteJobsSQL(jobs))
}

func sendRun(ctx context.Context, view retention.KV, _ []string, _ [][]byte) error {
	_, err := view.(retention.RunClearer).ClearRun(ctx, "jobs/done/", []byte("jobs/done/0"), []byte("jobs/done:"), 100)
	return err
}
