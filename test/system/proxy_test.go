package system

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// apiProxy forwards TCP to the API server. The components under test reach the API
// server only through it, so that stopping it stands for the API server going away
// (connections refused, open ones cut) while the test itself keeps reading the
// real state directly.
type apiProxy struct {
	target string
	addr   string

	mu    sync.Mutex
	lis   net.Listener
	conns map[net.Conn]struct{}
}

func newAPIProxy(t *testing.T, target string) *apiProxy {
	t.Helper()
	p := &apiProxy{target: target, addr: "127.0.0.1:0", conns: map[net.Conn]struct{}{}}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	return p
}

// start listens (again, on the same port once it is known) and forwards.
func (p *apiProxy) start() error {
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.lis, p.addr = lis, lis.Addr().String()
	p.mu.Unlock()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return nil
}

func (p *apiProxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.lis == nil { // stopped meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			_ = err // a cut connection: nothing to report
		}
		_ = dst.Close()
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// stop refuses new connections and cuts the open ones.
func (p *apiProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		_ = p.lis.Close()
		p.lis = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *apiProxy) up() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lis != nil
}

// lockedWriter serialises writes from a process's stdout and stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.w)
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The components log through their own processes; controller-runtime in the test
// process (envtest's clients) has nothing to say that the test needs.
func init() { ctrllog.SetLogger(logr.Discard()) }
