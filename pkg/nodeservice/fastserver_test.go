package nodeservice_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/nodeservice"
)

// failingListener fails its first Accepts with err, as a listener of a process
// out of descriptors does, then accepts.
type failingListener struct {
	net.Listener
	fails atomic.Int32
	err   error
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: l.err}
	}
	return l.Listener.Accept()
}

// serveFailing serves a method that answers at once on the compact endpoint of
// socket, through a listener whose first fails Accepts fail with err.
func serveFailing(t *testing.T, socket string, fails int32, err error) <-chan error {
	t.Helper()
	lis, lerr := net.Listen("unix", ipamwire.FastSocketPath(socket))
	if lerr != nil {
		t.Fatal(lerr)
	}
	s := nodeservice.NewFastServer(logr.Discard())
	s.Register(&grpc.ServiceDesc{ServiceName: "test.Echo", Methods: []grpc.MethodDesc{{MethodName: "Ping",
		Handler: func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
			return &nodev1.IsAllocatedResponse{}, nil
		}}}}, struct{}{})
	fl := &failingListener{Listener: lis, err: err}
	fl.fails.Store(fails)
	served := make(chan error, 1)
	go func() { served <- s.Serve(fl) }()
	t.Cleanup(func() { s.Stop(time.Second) })
	return served
}

// TestAcceptRetriesWhenOutOfDescriptors: accepting fails with EMFILE three
// times; the endpoint waits, serves the connection that waited meanwhile, and
// keeps serving. Another error ends Serve with it.
func TestAcceptRetriesWhenOutOfDescriptors(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "daemon.sock")
	served := serveFailing(t, socket, 3, os.NewSyscallError("accept4", syscall.EMFILE))
	for range 2 {
		c, err := ipamwire.Dial("unix://"+socket, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Invoke(t.Context(), "/test.Echo/Ping", nil); err != nil {
			t.Fatalf("a call after failed accepts: %v", err)
		}
		_ = c.Close()
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) after accepts that failed for want of descriptors", err)
	default:
	}

	socket = filepath.Join(t.TempDir(), "daemon.sock")
	served = serveFailing(t, socket, 1, errors.New("listener broken"))
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "listener broken") {
			t.Errorf("Serve returned %v, want the listener's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Serve goes on after an error that is not for want of a resource")
	}
}

// TestHangupCancelsTheRequest: a plugin that gives up at its own timeout closes
// the connection; the request it sent must see its context end (as a gRPC
// request does when its client goes), not run on for the endpoint's 30 s and
// commit for no one. A request whose client waits runs to its end, and the
// connection serves the next one.
func TestHangupCancelsTheRequest(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "daemon.sock")
	lis, err := net.Listen("unix", ipamwire.FastSocketPath(socket))
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 4)
	s := nodeservice.NewFastServer(logr.Discard())
	s.Register(&grpc.ServiceDesc{ServiceName: "test.Slow", Methods: []grpc.MethodDesc{{MethodName: "Wait",
		Handler: func(_ any, ctx context.Context, _ func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			select {
			case <-ctx.Done():
				ended <- ctx.Err()
				return nil, ctx.Err()
			case <-time.After(300 * time.Millisecond):
				ended <- nil
				return &nodev1.IsAllocatedResponse{}, nil
			}
		}}}}, struct{}{})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(time.Second) })

	c, err := ipamwire.Dial("unix://"+socket, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := c.Invoke(t.Context(), "/test.Slow/Wait", nil); err != nil {
			t.Fatalf("call %d with its client waiting: %v", i, err)
		}
		if err := <-ended; err != nil {
			t.Fatalf("call %d ended with %v while its client waited", i, err)
		}
	}
	_ = c.Close()

	// A client that gives up after 50 ms.
	raw, err := net.Dial("unix", ipamwire.FastSocketPath(socket))
	if err != nil {
		t.Fatal(err)
	}
	frame, err := ipamwire.AppendRequest(nil, "/test.Slow/Wait", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Write(frame); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	_ = raw.Close()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the request of a client that hung up ended with %v, want its context canceled", err)
	}
}

// Stop while connections keep arriving: a connection accepted as Stop begins
// is closed, not served, and Stop never races the accept loop's bookkeeping
// (it panicked with "WaitGroup is reused before previous Wait has returned"
// when a connection was added while Stop waited for the others).
func TestStopWhileConnectionsArrive(t *testing.T) {
	dir := t.TempDir()
	for i := range 100 {
		socket := filepath.Join(dir, "s"+strings.Repeat("x", i%3)+string(rune('a'+i%26))+".sock")
		lis, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		s := nodeservice.NewFastServer(logr.Discard())
		served := make(chan error, 1)
		go func() { served <- s.Serve(lis) }()
		stop := make(chan struct{})
		var dialers atomic.Int32
		for range 4 {
			dialers.Add(1)
			go func() {
				defer dialers.Add(-1)
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.Dial("unix", socket)
					if err != nil {
						continue
					}
					_ = c.Close()
				}
			}()
		}
		time.Sleep(time.Duration(i%5) * time.Millisecond)
		s.Stop(time.Second)
		close(stop)
		if err := <-served; err != nil {
			t.Fatalf("round %d: Serve returned %v after Stop", i, err)
		}
		for dialers.Load() > 0 {
			time.Sleep(time.Millisecond)
		}
		_ = os.Remove(socket)
	}
}
