package harness

import (
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// APIProxy passes TCP connections through to the API server while up; while down
// it cuts every open connection and closes each new one as soon as it is
// accepted, like an API server that cannot be reached. Components under test
// reach the API server through it; the test itself keeps its direct client.
type APIProxy struct {
	ln     net.Listener
	target string
	up     atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// NewAPIProxy starts a proxy to cfg's API server on a loopback port, up; it is
// stopped when the test ends.
func NewAPIProxy(tb testing.TB, cfg *rest.Config) *APIProxy {
	tb.Helper()
	target := cfg.Host
	if u, err := url.Parse(cfg.Host); err == nil && u.Host != "" {
		target = u.Host
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &APIProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.up.Store(true)
	go p.serve()
	tb.Cleanup(func() {
		_ = ln.Close()
		p.SetUp(false)
	})
	return p
}

// Target is the API server's host:port.
func (p *APIProxy) Target() string { return p.target }

// Addr is the proxy's host:port.
func (p *APIProxy) Addr() string { return p.ln.Addr().String() }

// Config is cfg reaching the API server through the proxy, with a short timeout.
func (p *APIProxy) Config(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Host = "https://" + p.Addr()
	c.Timeout = 2 * time.Second
	return c
}

// Up reports whether connections pass.
func (p *APIProxy) Up() bool { return p.up.Load() }

// SetUp lets connections through, or cuts every open one and refuses new ones.
func (p *APIProxy) SetUp(up bool) {
	p.up.Store(up)
	if up {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *APIProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.up.Load() {
			_ = c.Close()
			continue
		}
		go p.pipe(c)
	}
}

func (p *APIProxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}
