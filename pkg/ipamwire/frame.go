package ipamwire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The compact endpoint's framing. A connection carries requests one after the
// other, each answered before the next is sent:
//
//	request:  uint32 n (big-endian) | n bytes: uint8 m | m bytes method | message
//	reply:    uint32 n (big-endian) | n bytes: uint8 code | message, or the error text when code != 0
//
// method is a gRPC full method name and the messages are the gRPC service's, so
// the daemon serves both endpoints with the same handlers, and a reply's code is
// the gRPC status code the gRPC endpoint would have returned.

// Frame size limits: a request is a few hundred bytes; a reply lists at most every
// allocation of a pool.
const (
	MaxRequestFrame = 1 << 20
	MaxReplyFrame   = 256 << 20
)

// ErrFrameTooLarge is returned for a frame over the limit.
var ErrFrameTooLarge = errors.New("frame larger than the limit")

// AppendRequest appends a request frame.
func AppendRequest(b []byte, method string, msg []byte) ([]byte, error) {
	if len(method) > 255 {
		return nil, fmt.Errorf("method name %q too long", method)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(1+len(method)+len(msg)))
	b = append(b, byte(len(method)))
	b = append(b, method...)
	return append(b, msg...), nil
}

// AppendReply appends a reply frame: msg when code is OK, else the error text.
func AppendReply(b []byte, code Code, msg []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(1+len(msg)))
	b = append(b, byte(code))
	return append(b, msg...)
}

// readFrame reads one frame's payload.
func readFrame(r io.Reader, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 {
		return nil, errors.New("empty frame")
	}
	if uint64(n) > uint64(limit) {
		return nil, fmt.Errorf("%w (%d > %d bytes)", ErrFrameTooLarge, n, limit)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// ReadRequest reads a request frame; io.EOF means the client closed the
// connection between requests.
func ReadRequest(r *bufio.Reader) (method string, msg []byte, err error) {
	buf, err := readFrame(r, MaxRequestFrame)
	if err != nil {
		return "", nil, err
	}
	m := int(buf[0])
	if 1+m > len(buf) {
		return "", nil, errors.New("request frame: method name runs past the frame")
	}
	return string(buf[1 : 1+m]), buf[1+m:], nil
}

func (c *Client) invokeFast(method string, req []byte) ([]byte, error) {
	frame, err := AppendRequest(nil, method, req)
	if err != nil {
		return nil, &Error{Code: Internal, Message: err.Error()}
	}
	if _, err := c.conn.Write(frame); err != nil {
		return nil, c.ioError(err)
	}
	buf, err := readFrame(c.conn, MaxReplyFrame)
	if err != nil {
		return nil, c.ioError(err)
	}
	if code := Code(buf[0]); code != OK {
		return nil, &Error{Code: code, Message: string(buf[1:])}
	}
	return buf[1:], nil
}
