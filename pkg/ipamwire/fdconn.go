package ipamwire

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// fdConn is a blocking unix socket driven by plain system calls. The compact
// endpoint's exchange is one request and one reply, which need none of the
// runtime's network poller: its set-up, the goroutine parked on the reply and
// the thread woken for it cost a plugin that lives for one call more than the
// call itself. Deadlines are the socket's send and receive timeouts.
type fdConn struct {
	fd int
}

// dialUnixBlocking connects to the unix socket at path by deadline. Its errors
// read as net.Dial's ("dial unix <path>: connect: ..."), and wrap the errno.
func dialUnixBlocking(path string, deadline time.Time) (*fdConn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: err}
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, opErr(os.NewSyscallError("socket", err))
	}
	c := &fdConn{fd: fd}
	if err := c.SetDeadline(deadline); err != nil {
		_ = c.Close()
		return nil, opErr(err)
	}
	for {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return c, nil
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINPROGRESS), errors.Is(err, syscall.ETIMEDOUT):
		err = os.ErrDeadlineExceeded
	default:
		err = os.NewSyscallError("connect", err)
	}
	_ = c.Close()
	return nil, opErr(err)
}

// SetDeadline sets the socket's send and receive timeouts to the time left; a
// deadline already past makes the next read or write time out at once.
func (c *fdConn) SetDeadline(t time.Time) error {
	left := time.Until(t)
	if t.IsZero() {
		left = 0 // no timeout
	} else if left < time.Microsecond {
		left = time.Microsecond
	}
	tv := syscall.NsecToTimeval(left.Nanoseconds())
	for _, opt := range []int{syscall.SO_RCVTIMEO, syscall.SO_SNDTIMEO} {
		if err := syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, opt, &tv); err != nil {
			return os.NewSyscallError("setsockopt", err)
		}
	}
	return nil
}

// Read reads once; a timeout is os.ErrDeadlineExceeded (a net.Error with Timeout).
func (c *fdConn) Read(p []byte) (int, error) {
	for {
		n, err := syscall.Read(c.fd, p)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return 0, os.ErrDeadlineExceeded
		case err != nil:
			return 0, os.NewSyscallError("read", err)
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// Write writes all of p.
func (c *fdConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := syscall.Write(c.fd, p[done:])
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return done, os.ErrDeadlineExceeded
		case err != nil:
			return done, os.NewSyscallError("write", err)
		}
		done += n
	}
	return done, nil
}

// Close closes the socket.
func (c *fdConn) Close() error { return syscall.Close(c.fd) }
