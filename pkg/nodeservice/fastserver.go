package nodeservice

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hwipam/hwipam/pkg/ipamwire"
)

// FastServer serves the CNI plugin's compact endpoint (see ipamwire's framing):
// the gRPC services' own handlers, found by full method name in their service
// descriptions and run through the same interceptors (panic recovery, metrics,
// logging), without HTTP/2. A plugin that cannot reach it uses the gRPC socket.
type FastServer struct {
	methods     map[string]fastMethod
	interceptor grpc.UnaryServerInterceptor
	log         logr.Logger

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[net.Conn]bool
	lis     net.Listener
	wg      sync.WaitGroup
}

type fastMethod struct {
	impl    any
	handler func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error)
}

// fastIdleTimeout closes a connection that sends nothing for this long; a plugin
// sends its requests at once.
const fastIdleTimeout = 30 * time.Second

// callTimeout bounds one request's handling (a plugin waits 5 s by default).
const callTimeout = 30 * time.Second

// NewFastServer returns a server that runs every request through interceptors,
// in order, as grpc.ChainUnaryInterceptor does.
func NewFastServer(log logr.Logger, interceptors ...grpc.UnaryServerInterceptor) *FastServer {
	return &FastServer{methods: map[string]fastMethod{}, interceptor: chainUnary(interceptors), log: log,
		conns: map[net.Conn]bool{}}
}

// Register adds a service's unary methods, as grpc.Server.RegisterService does.
func (s *FastServer) Register(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = fastMethod{impl: impl, handler: m.Handler}
	}
}

// chainUnary runs interceptors in order around a handler, as
// grpc.ChainUnaryInterceptor does.
func chainUnary(interceptors []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		next := handler
		for i := len(interceptors) - 1; i >= 0; i-- {
			ic, h := interceptors[i], next
			next = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, h) }
		}
		return next(ctx, req)
	}
}

// Serve accepts connections until the listener is closed. When accepting fails
// for want of a resource (descriptors, buffers, memory), it waits and tries
// again, as grpc-go's server does: ipam-node stopping over it would fail the
// CNI calls of every pod on the node, not only those that find it short.
func (s *FastServer) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() { // stopped before it served
		s.mu.Unlock()
		_ = lis.Close()
		return nil
	}
	s.lis = lis
	s.mu.Unlock()
	var wait time.Duration
	for {
		conn, err := lis.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.closing.Load() {
				return nil
			}
			if !transientAcceptError(err) {
				return err
			}
			wait = min(max(2*wait, 5*time.Millisecond), time.Second)
			s.log.Info("compact endpoint: accepting a connection failed; trying again", "error", err.Error(), "in", wait.String())
			time.Sleep(wait)
			continue
		}
		wait = 0
		// Added under mu, where Stop sets closing: once Stop waits for the
		// connections, no other is added (the WaitGroup must not grow from
		// zero while it is waited for).
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			_ = conn.Close()
			return nil
		}
		s.conns[conn] = true
		s.wg.Go(func() {
			s.serveConn(conn)
			s.mu.Lock()
			delete(s.conns, conn)
			s.mu.Unlock()
		})
		s.mu.Unlock()
	}
}

// transientAcceptError: accepting failed for want of a resource that may come
// back (the kernel's and Go's own retries cover the others, such as a
// connection aborted before it was taken).
func transientAcceptError(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *FastServer) serveConn(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	var out []byte
	for !s.closing.Load() {
		_ = conn.SetReadDeadline(time.Now().Add(fastIdleTimeout))
		method, msg, err := ipamwire.ReadRequest(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.V(1).Info("compact endpoint: closing a connection", "error", err.Error())
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		stopWatch := watchHangup(conn, r, cancel)
		resp, err := s.call(ctx, method, msg)
		stopWatch()
		cancel()
		st, _ := status.FromError(err)
		if err != nil {
			out = ipamwire.AppendReply(out[:0], ipamwire.Code(st.Code()), []byte(st.Message()))
		} else {
			body, merr := proto.Marshal(resp.(proto.Message))
			if merr != nil {
				body = []byte(fmt.Sprintf("encoding the reply: %v", merr))
				out = ipamwire.AppendReply(out[:0], ipamwire.Internal, body)
			} else {
				out = ipamwire.AppendReply(out[:0], ipamwire.OK, body)
			}
		}
		_ = conn.SetWriteDeadline(time.Now().Add(fastIdleTimeout))
		if _, err := conn.Write(out); err != nil {
			return
		}
	}
}

// watchHangup cancels a request's context when its client hangs up (a plugin
// that gave up at its own timeout closes the connection), as a gRPC server's
// context ends with its stream: a request waiting (for the pools' blocks after a
// restart, for another operation on the interface) then gives up rather than
// committing, for no one, after the runtime has run its DEL. The returned func
// stops watching; r may be read again once it returns.
func watchHangup(conn net.Conn, r *bufio.Reader, cancel context.CancelFunc) (stop func()) {
	_ = conn.SetReadDeadline(time.Time{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A client sends its next request only after this one's reply: what
		// ends this wait is the client going away, or stop.
		if _, err := r.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			cancel()
		}
	}()
	return func() {
		_ = conn.SetReadDeadline(time.Now())
		<-done
	}
}

// call runs one request under ctx.
func (s *FastServer) call(ctx context.Context, method string, msg []byte) (any, error) {
	m, ok := s.methods[method]
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	dec := func(v any) error {
		if err := proto.Unmarshal(msg, v.(proto.Message)); err != nil {
			return status.Errorf(codes.Internal, "decoding the %s request: %v", method, err)
		}
		return nil
	}
	return m.handler(m.impl, ctx, dec, s.interceptor)
}

// Stop closes the listener, lets connections finish the request in hand for up
// to grace, then closes them. A Serve that starts after Stop returns at once.
func (s *FastServer) Stop(grace time.Duration) {
	s.mu.Lock()
	s.closing.Store(true)
	if s.lis != nil {
		_ = s.lis.Close()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		// Idle connections wait in a read: wake them so they see the listener closed.
		s.mu.Lock()
		for c := range s.conns {
			_ = c.SetReadDeadline(time.Now())
		}
		s.mu.Unlock()
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		<-done
	}
}
