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
