package ipamwire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// Code is a gRPC status code; both transports carry the daemon's codes unchanged.
type Code uint32

// The gRPC codes the plugin tells apart (google.golang.org/grpc/codes values).
const (
	OK                Code = 0
	Canceled          Code = 1
	Unknown           Code = 2
	InvalidArgument   Code = 3
	DeadlineExceeded  Code = 4
	NotFound          Code = 5
	ResourceExhausted Code = 8
	Unimplemented     Code = 12
	Internal          Code = 13
	Unavailable       Code = 14
)

var codeNames = map[Code]string{OK: "OK", Canceled: "Canceled", Unknown: "Unknown", InvalidArgument: "InvalidArgument",
	DeadlineExceeded: "DeadlineExceeded", NotFound: "NotFound", ResourceExhausted: "ResourceExhausted",
	Unimplemented: "Unimplemented", Internal: "Internal", Unavailable: "Unavailable"}

func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("Code(%d)", uint32(c))
}

// Error is a failed call: the daemon's status, or Unavailable/DeadlineExceeded
// when the daemon could not be reached or did not answer in time.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// CodeOf returns the code of an error from a Client (Unknown for other errors).
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Unknown
}

// MessageOf returns an error's message without its code.
func MessageOf(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

// Method names, as gRPC's full method names; the compact endpoint uses the same.
const (
	MethodAllocate        = "/nvidia.ipam.node.v1.IPAMService/Allocate"
	MethodIsAllocated     = "/nvidia.ipam.node.v1.IPAMService/IsAllocated"
	MethodDeallocate      = "/nvidia.ipam.node.v1.IPAMService/Deallocate"
	MethodListPools       = "/hwipam.node.v1.NodeInfoService/ListPools"
	MethodListAllocations = "/hwipam.node.v1.NodeInfoService/ListAllocations"
)

// FastSocketPath is where a daemon whose gRPC socket is grpcPath serves its
// compact endpoint: beside it, "daemon.sock" giving "daemon-fast.sock".
func FastSocketPath(grpcPath string) string {
	return strings.TrimSuffix(grpcPath, ".sock") + "-fast.sock"
}

// Transport says how a Client reaches the daemon.
type Transport string

// The transports.
const (
	TransportFast Transport = "fast"
	TransportGRPC Transport = "grpc"
)

// Client makes calls to one daemon over one connection; it is not safe for
// concurrent use (a plugin makes its calls one after the other).
type Client struct {
	conn      conn
	transport Transport
	target    string
	deadline  time.Time
	h2        *h2conn
	calls     int
}

// conn is a connection to the daemon: an fdConn to the compact endpoint, a
// net.Conn for gRPC.
type conn interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
}

// Dial connects to the daemon at target (nv-ipam's daemonSocket: "unix:///path" or
// "tcp://host:port"). For a unix socket it tries the compact endpoint beside it
// first; when nothing listens there (a daemon that predates it, or nv-ipam's) it
// connects to the gRPC socket. Every call must finish by deadline.
func Dial(target string, deadline time.Time) (*Client, error) {
	network, addr, err := parseTarget(target)
	if err != nil {
		return nil, &Error{Code: InvalidArgument, Message: err.Error()}
	}
	if network == "unix" {
		fc, err := dialUnixBlocking(FastSocketPath(addr), deadline)
		if err == nil {
			return &Client{conn: fc, transport: TransportFast, target: target, deadline: deadline}, nil
		}
		if !noListener(err) {
			return nil, dialError(target, err)
		}
	}
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial(network, addr)
	if err != nil {
		return nil, dialError(target, err)
	}
	_ = conn.SetDeadline(deadline)
	c := &Client{conn: conn, transport: TransportGRPC, target: target, deadline: deadline}
	if c.h2, err = newH2Conn(conn); err != nil {
		_ = conn.Close()
		return nil, c.ioError(err)
	}
	return c, nil
}

// noListener says that a unix socket has no server: the file is missing, or a
// stale one is left from a daemon that has stopped.
func noListener(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

func parseTarget(target string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(target, "unix://"):
		network, addr = "unix", strings.TrimPrefix(target, "unix://")
	case strings.HasPrefix(target, "unix:"):
		network, addr = "unix", strings.TrimPrefix(target, "unix:")
	case strings.HasPrefix(target, "tcp://"):
		network, addr = "tcp", strings.TrimPrefix(target, "tcp://")
	case strings.HasPrefix(target, "/"):
		network, addr = "unix", target
	default:
		// grpc-go's default scheme is dns: a plain host:port.
		network, addr = "tcp", strings.TrimPrefix(target, "dns:///")
	}
	if addr == "" {
		return "", "", fmt.Errorf("daemon socket %q has no address", target)
	}
	return network, addr, nil
}

func dialError(target string, err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Code: DeadlineExceeded, Message: fmt.Sprintf("connecting to %s: %v", target, err)}
	}
	return &Error{Code: Unavailable, Message: fmt.Sprintf("connecting to %s: %v", target, err)}
}

// ioError turns a transport failure into the code gRPC would report for it.
func (c *Client) ioError(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Code: DeadlineExceeded, Message: fmt.Sprintf("%s (%s): no answer in time", c.target, c.transport)}
	}
	return &Error{Code: Unavailable, Message: fmt.Sprintf("%s (%s): %v", c.target, c.transport, err)}
}

// Transport returns the transport in use.
func (c *Client) Transport() Transport { return c.transport }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Invoke sends one request (an encoded message) for method and returns the encoded
// reply, or an *Error.
func (c *Client) Invoke(ctx context.Context, method string, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Code: DeadlineExceeded, Message: err.Error()}
	}
	if d, ok := ctx.Deadline(); ok && d.Before(c.deadline) {
		_ = c.conn.SetDeadline(d)
	} else if c.calls > 0 {
		// The compact endpoint's deadline is a time left, counted from when it
		// was set: count it again from now for every call after the first.
		_ = c.conn.SetDeadline(c.deadline)
	}
	c.calls++
	if c.transport == TransportFast {
		return c.invokeFast(method, req)
	}
	return c.h2.invoke(c, method, req)
}

// Allocate calls IPAMService.Allocate.
func (c *Client) Allocate(ctx context.Context, p *Params) ([]Allocation, error) {
	return call(ctx, c, MethodAllocate, EncodeParamsRequest(p), "AllocateResponse", DecodeAllocateResponse)
}

// call invokes method and decodes its reply; a reply that does not decode is an
// Internal error naming the message.
func call[T any](ctx context.Context, c *Client, method string, req []byte, reply string, decode func([]byte) (T, error)) (T, error) {
	var zero T
	resp, err := c.Invoke(ctx, method, req)
	if err != nil {
		return zero, err
	}
	out, err := decode(resp)
	if err != nil {
		return zero, &Error{Code: Internal, Message: "the daemon's " + reply + " cannot be read: " + err.Error()}
	}
	return out, nil
}

// IsAllocated calls IPAMService.IsAllocated.
func (c *Client) IsAllocated(ctx context.Context, p *Params) error {
	_, err := c.Invoke(ctx, MethodIsAllocated, EncodeParamsRequest(p))
	return err
}

// Deallocate calls IPAMService.Deallocate.
func (c *Client) Deallocate(ctx context.Context, p *Params) error {
	_, err := c.Invoke(ctx, MethodDeallocate, EncodeParamsRequest(p))
	return err
}

// ListAllocations calls NodeInfoService.ListAllocations.
func (c *Client) ListAllocations(ctx context.Context, pool string) ([]AllocationRecord, error) {
	return call(ctx, c, MethodListAllocations, EncodeListAllocationsRequest(pool), "ListAllocationsResponse", DecodeListAllocationsResponse)
}

// ListPools calls NodeInfoService.ListPools.
func (c *Client) ListPools(ctx context.Context) ([]PoolInfo, error) {
	return call(ctx, c, MethodListPools, nil, "ListPoolsResponse", DecodeListPoolsResponse)
}
