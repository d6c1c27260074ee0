package casq_test

// tcpProxy forwards TCP connections to a broker, so that a test can cut the
// network between an SDK and a real casq serve: drop closes every open
// connection (both sides, as a broken link does), block makes new
// connections fail until unblock.

import (
	"io"
	"net"
	"sync"
	"testing"
)

type tcpProxy struct {
	addr   string
	target string
	lis    net.Listener

	mu      sync.Mutex
	conns   map[net.Conn]bool
	blocked bool
	opened  int
}

// startProxy listens on a loopback port and forwards to target until the
// test ends.
func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{addr: lis.Addr().String(), target: target, lis: lis, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() {
		_ = lis.Close()
		p.drop()
	})
	return p
}

func (p *tcpProxy) serve() {
	for {
		in, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		blocked := p.blocked
		p.mu.Unlock()
		if blocked {
			_ = in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = true, true
		p.opened++
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(out, in)
		go pipe(in, out)
	}
}

// drop closes every connection open through the proxy.
func (p *tcpProxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// block drops every connection and refuses new ones until unblock.
func (p *tcpProxy) block() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
	p.drop()
}

func (p *tcpProxy) unblock() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

// connections is how many connections the proxy has forwarded.
func (p *tcpProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.opened
}
