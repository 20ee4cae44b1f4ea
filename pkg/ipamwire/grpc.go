package ipamwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2/hpack"
)

// A unary gRPC client over HTTP/2 cleartext, written against RFC 9113 and the
// gRPC-over-HTTP/2 protocol description, for a daemon without the compact
// endpoint. It is only what a unary call needs: one stream per call, requests
// that fit the initial flow-control window, and windows opened wide for the reply.

const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	settingEnablePush        = 0x2
	settingInitialWindowSize = 0x4

	// defaultWindow is HTTP/2's initial flow-control window; a request must fit.
	defaultWindow = 65535
	// replyWindow is the window opened for replies, stream and connection.
	replyWindow = 1 << 30
	// maxReadFrame bounds a frame read from the daemon (its SETTINGS_MAX_FRAME_SIZE
	// may be raised up to 2^24-1).
	maxReadFrame = 1<<24 - 1
)

const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

type h2conn struct {
	conn       net.Conn
	br         *bufio.Reader
	dec        *hpack.Decoder
	nextStream uint32
}

func appendFrame(b []byte, typ, flags byte, stream uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	b = binary.BigEndian.AppendUint32(b, stream&0x7fffffff)
	return append(b, payload...)
}

// newH2Conn sends the connection preface: the client's SETTINGS (no push, a wide
// stream window) and a WINDOW_UPDATE that widens the connection's window.
func newH2Conn(conn net.Conn) (*h2conn, error) {
	b := []byte(clientPreface)
	var settings []byte
	settings = binary.BigEndian.AppendUint16(settings, settingEnablePush)
	settings = binary.BigEndian.AppendUint32(settings, 0)
	settings = binary.BigEndian.AppendUint16(settings, settingInitialWindowSize)
	settings = binary.BigEndian.AppendUint32(settings, replyWindow)
	b = appendFrame(b, frameSettings, 0, 0, settings)
	b = appendFrame(b, 0x8 /* WINDOW_UPDATE */, 0, 0, binary.BigEndian.AppendUint32(nil, replyWindow-defaultWindow))
	if _, err := conn.Write(b); err != nil {
		return nil, err
	}
	return &h2conn{conn: conn, br: bufio.NewReaderSize(conn, 32<<10), dec: hpack.NewDecoder(4096, nil), nextStream: 1}, nil
}

type frame struct {
	typ, flags byte
	stream     uint32
	payload    []byte
}

func (h *h2conn) readFrame() (frame, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(h.br, hdr[:]); err != nil {
		return frame{}, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	if n > maxReadFrame {
		return frame{}, fmt.Errorf("HTTP/2 frame of %d bytes", n)
	}
	f := frame{typ: hdr[3], flags: hdr[4], stream: binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff, payload: make([]byte, n)}
	if _, err := io.ReadFull(h.br, f.payload); err != nil {
		return frame{}, err
	}
	return f, nil
}

// unpad strips a DATA or HEADERS frame's padding and a HEADERS frame's priority.
func (f frame) unpad() ([]byte, error) {
	p := f.payload
	pad := 0
	if f.flags&flagPadded != 0 {
		if len(p) < 1 {
			return nil, errors.New("HTTP/2 padded frame without a pad length")
		}
		pad, p = int(p[0]), p[1:]
	}
	if f.typ == frameHeaders && f.flags&flagPriority != 0 {
		if len(p) < 5 {
			return nil, errors.New("HTTP/2 HEADERS frame too short for its priority")
		}
		p = p[5:]
	}
	if pad > len(p) {
		return nil, errors.New("HTTP/2 frame padding longer than the frame")
	}
	return p[:len(p)-pad], nil
}

// grpcTimeout renders the time left as a grpc-timeout header value.
func grpcTimeout(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if ms > 99999999 {
		return strconv.FormatInt(min(int64(d/time.Second), 99999999), 10) + "S"
	}
	return strconv.FormatInt(ms, 10) + "m"
}

func (h *h2conn) invoke(c *Client, method string, req []byte) ([]byte, error) {
	if len(req)+5 > defaultWindow {
		return nil, &Error{Code: Internal, Message: fmt.Sprintf("request of %d bytes exceeds what this client sends", len(req))}
	}
	sid := h.nextStream
	h.nextStream += 2
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "localhost"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "hwipam-nv-ipam"},
		{"grpc-timeout", grpcTimeout(time.Until(c.deadline))}} {
		if err := enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}); err != nil {
			return nil, &Error{Code: Internal, Message: err.Error()}
		}
	}
	msg := make([]byte, 5, 5+len(req))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(req)))
	msg = append(msg, req...)
	// Both fit the peer's smallest allowed SETTINGS_MAX_FRAME_SIZE (16 KiB).
	if block.Len() > 16384 || len(msg) > 16384 {
		return nil, &Error{Code: Internal, Message: "request too large for one HTTP/2 frame"}
	}
	out := appendFrame(nil, frameHeaders, flagEndHeaders, sid, block.Bytes())
	out = appendFrame(out, frameData, flagEndStream, sid, msg)
	if _, err := h.conn.Write(out); err != nil {
		return nil, c.ioError(err)
	}

	var (
		data     []byte
		headers  map[string]string
		trailers map[string]string
		pending  []byte // a header block awaiting CONTINUATION frames
		endAfter bool   // the pending block ends the stream
	)
	for trailers == nil {
		f, err := h.readFrame()
		if err != nil {
			return nil, c.ioError(err)
		}
		switch f.typ {
		case frameSettings:
			if f.flags&flagAck == 0 {
				if _, err := h.conn.Write(appendFrame(nil, frameSettings, flagAck, 0, nil)); err != nil {
					return nil, c.ioError(err)
				}
			}
		case framePing:
			if f.flags&flagAck == 0 {
				if _, err := h.conn.Write(appendFrame(nil, framePing, flagAck, 0, f.payload)); err != nil {
					return nil, c.ioError(err)
				}
			}
		case frameGoAway:
			if len(f.payload) >= 8 && binary.BigEndian.Uint32(f.payload)&0x7fffffff >= sid {
				continue // a graceful shutdown that lets this call finish
			}
			return nil, &Error{Code: Unavailable, Message: fmt.Sprintf("%s: the daemon closed the connection (GOAWAY %s)", c.target, goAwayText(f.payload))}
		case frameRSTStream:
			if f.stream == sid {
				code := uint32(0)
				if len(f.payload) >= 4 {
					code = binary.BigEndian.Uint32(f.payload)
				}
				return nil, &Error{Code: Unavailable, Message: fmt.Sprintf("%s: the daemon reset the call (HTTP/2 error %d)", c.target, code)}
			}
		case frameData:
			if f.stream != sid {
				continue
			}
			p, err := f.unpad()
			if err != nil {
				return nil, &Error{Code: Internal, Message: err.Error()}
			}
			data = append(data, p...)
			if f.flags&flagEndStream != 0 {
				return nil, &Error{Code: Internal, Message: "the daemon ended the reply without gRPC trailers"}
			}
		case frameHeaders, frameContinuation:
			if f.stream != sid {
				continue
			}
			p := f.payload
			if f.typ == frameHeaders {
				if p, err = f.unpad(); err != nil {
					return nil, &Error{Code: Internal, Message: err.Error()}
				}
				endAfter = f.flags&flagEndStream != 0
			}
			pending = append(pending, p...)
			if f.flags&flagEndHeaders == 0 {
				continue
			}
			fieldsOf, err := h.decodeBlock(pending)
			pending = nil
			if err != nil {
				return nil, &Error{Code: Internal, Message: "reading the daemon's headers: " + err.Error()}
			}
			switch {
			case endAfter:
				trailers = fieldsOf
				if headers == nil {
					headers = fieldsOf // a trailers-only reply
				}
			case headers == nil:
				headers = fieldsOf
			default:
				return nil, &Error{Code: Internal, Message: "the daemon sent a second header block before the trailers"}
			}
		}
	}
	if s := headers[":status"]; s != "200" {
		return nil, &Error{Code: Unavailable, Message: fmt.Sprintf("%s: HTTP status %s from the daemon (is it a gRPC server?)", c.target, s)}
	}
	code, err := strconv.ParseUint(trailers["grpc-status"], 10, 32)
	if err != nil {
		return nil, &Error{Code: Internal, Message: fmt.Sprintf("the daemon's reply has no valid grpc-status (%q)", trailers["grpc-status"])}
	}
	if Code(code) != OK {
		return nil, &Error{Code: Code(code), Message: percentDecode(trailers["grpc-message"])}
	}
	if len(data) < 5 {
		return nil, &Error{Code: Internal, Message: "the daemon's reply has no message"}
	}
	if data[0] != 0 {
		return nil, &Error{Code: Internal, Message: "the daemon compressed its reply, which this client does not ask for"}
	}
	n := binary.BigEndian.Uint32(data[1:5])
	if uint64(n) != uint64(len(data)-5) {
		return nil, &Error{Code: Internal, Message: fmt.Sprintf("the daemon's reply is %d bytes, its prefix says %d", len(data)-5, n)}
	}
	return data[5:], nil
}

func (h *h2conn) decodeBlock(block []byte) (map[string]string, error) {
	out := map[string]string{}
	h.dec.SetEmitFunc(func(f hpack.HeaderField) { out[f.Name] = f.Value })
	if _, err := h.dec.Write(block); err != nil {
		return nil, err
	}
	return out, h.dec.Close()
}

func goAwayText(p []byte) string {
	if len(p) < 8 {
		return "malformed"
	}
	s := fmt.Sprintf("error %d", binary.BigEndian.Uint32(p[4:8]))
	if len(p) > 8 {
		s += ": " + string(p[8:])
	}
	return s
}

// percentDecode decodes grpc-message, which is percent-encoded UTF-8.
func percentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
