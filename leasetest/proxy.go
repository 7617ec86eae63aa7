package leasetest

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a server until Blackhole is called;
// from then on it passes nothing in either direction and closes nothing,
// the way a host that vanished from the network looks to the server, and
// the server to the client. Connect one replica's client through it (to
// Addr) to cut that replica off while the others go on. RunProcesses gives
// each replica process one; an adapter's own tests may use it too. Create
// one with NewProxy.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	hole   chan struct{} // closed by blackhole
	done   chan struct{} // closed by close
	wg     sync.WaitGroup
	once   sync.Once
}

// NewProxy starts a Proxy to the server at target (host:port) on a free
// port of 127.0.0.1. It closes every connection when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, hole: make(chan struct{}), done: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Addr is the address (host:port) to connect to instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole stops the proxy passing data, on the connections it has and on
// those it accepts from now on, without closing any. It cannot be undone.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.hole:
	default:
		close(p.hole)
	}
}

func (p *Proxy) holed() bool {
	select {
	case <-p.hole:
		return true
	default:
		return false
	}
}

// track remembers c to close it with the proxy; false when the proxy is
// closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			client.Close()
			return
		}
		if p.holed() {
			continue // held open, never answered
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(server) {
			server.Close()
			return
		}
		p.wg.Go(func() { p.pipe(server, client) })
		p.wg.Go(func() { p.pipe(client, server) })
	}
}

// pipe copies src to dst until either ends, or stops passing data, without
// closing either, once the proxy is a black hole.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.holed() {
			<-p.done
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			src.Close()
			dst.Close()
			return
		}
	}
}

func (p *Proxy) close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		conns := p.conns
		p.mu.Unlock()
		close(p.done)
		p.ln.Close()
		for _, c := range conns {
			c.Close()
		}
		p.wg.Wait()
	})
}
