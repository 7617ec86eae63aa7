package leasetest

import (
	"net"
	"sync"
	"testing"
)

// proxy forwards TCP connections to a server until blackhole is called;
// from then on it passes nothing in either direction and closes nothing,
// the way a host that vanished from the network looks to the server.
type proxy struct {
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

func newProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, hole: make(chan struct{}), done: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.hole:
	default:
		close(p.hole)
	}
}

func (p *proxy) holed() bool {
	select {
	case <-p.hole:
		return true
	default:
		return false
	}
}

// track remembers c to close it with the proxy; false when the proxy is
// closed already.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *proxy) accept() {
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
func (p *proxy) pipe(dst, src net.Conn) {
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

func (p *proxy) close() {
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
