package rediskv_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// blackhole is a TCP proxy to a Redis server that, once Cut, drops
// everything in both directions while keeping every connection open: a
// client behind it sees its commands time out, as across a partition.
type blackhole struct {
	ln    net.Listener
	to    string
	cut   atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
	once  sync.Once
}

// newBlackhole starts a proxy to addr, stopped when t ends.
func newBlackhole(t testing.TB, addr string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &blackhole{ln: ln, to: addr}
	b.wg.Go(b.accept)
	t.Cleanup(b.Close)
	return b
}

// Addr is the address clients dial instead of the server's.
func (b *blackhole) Addr() string { return b.ln.Addr().String() }

// Cut starts dropping every byte.
func (b *blackhole) Cut() { b.cut.Store(true) }

func (b *blackhole) accept() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", b.to)
		if err != nil {
			in.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, in, out)
		b.mu.Unlock()
		b.wg.Go(func() { b.pipe(out, in) })
		b.wg.Go(func() { b.pipe(in, out) })
	}
}

// pipe copies src to dst until either closes, dropping what it reads once
// the proxy is cut.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.cut.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

// Close stops the proxy and closes every connection through it, so that
// its clients' calls fail at once. It may be called more than once.
func (b *blackhole) Close() {
	b.once.Do(func() {
		b.ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
	})
	b.wg.Wait()
}
