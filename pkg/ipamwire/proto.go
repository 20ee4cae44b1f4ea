// Package ipamwire is the plugin's side of the daemon's API without grpc-go,
// net/http or the protobuf runtime: the messages of nv-ipam's IPAMService and
// hwipam's NodeInfoService that the plugin sends and reads, encoded by hand in the
// protobuf wire format, and two transports for them — the daemon's compact
// endpoint (see Frame) and, for a daemon without one, plain gRPC over HTTP/2
// cleartext (see grpcCall). The plugin is exec'd for every CNI call, so what it
// links and initialises is paid on every pod interface.
//
// Field numbers are those of api/grpc/nvidia/ipam/node/v1/node.proto and
// api/grpc/hwipam/node/v1/info.proto; the tests check every message against the
// generated code.
package ipamwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ReservedNetworkName is the network name of the DRA driver nic.hwipam.io's
// allocations. A CNI network of that name is refused (by the plugin at ADD and
// GC, and by the daemon at Allocate): the name is shown beside the driver's
// allocations, and a NAD that took it could be mistaken for them.
const ReservedNetworkName = "nic.hwipam.io"

// PoolType is nv-ipam's PoolType enum.
type PoolType int32

// nv-ipam's PoolType values.
const (
	PoolTypeUnspecified PoolType = 0
	PoolTypeIPPool      PoolType = 1
	PoolTypeCIDRPool    PoolType = 2
)

// Params is IPAMParameters, with IPAMMetadata and IPAMFeatures folded in.
type Params struct {
	Pools        []string
	ContainerID  string
	IfName       string
	PoolType     PoolType
	RequestedIPs []string
	NetworkName  string
	// IPAMMetadata
	PodName, PodNamespace, PodUID, DeviceID string
	// IPAMFeatures
	AllocateDefaultGateway bool
	AllocateIPWithIndex    *int32
	// hwipam's rail-aware allocation: the rail ("auto" or a name) and the
	// attachment's device besides DeviceID.
	Rail, PCIBusID, Master, Device string
}

// Allocation is AllocationInfo; Routes are the routes' destinations.
type Allocation struct {
	Pool, IP, Gateway string
	PoolType          PoolType
	Routes            []string
}

// AllocationRecord is the part of hwipam's AllocationRecord the plugin uses.
type AllocationRecord struct {
	Pool, ContainerID, IfName, IP, Network string
}

// PoolInfo is the part of hwipam's PoolInfo the plugin uses.
type PoolInfo struct {
	Key    string
	Active bool
	Rail   string
}

// Wire types of the protobuf encoding.
const (
	wireVarint = 0
	wireI64    = 1
	wireLen    = 2
	wireI32    = 5
)

func appendTag(b []byte, field, wire int) []byte {
	return binary.AppendUvarint(b, uint64(field)<<3|uint64(wire))
}

func appendString(b []byte, field int, s string) []byte {
	if s == "" {
		return b
	}
	b = appendTag(b, field, wireLen)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendMessage appends field as an embedded message; proto3 sends a present
// sub-message even when it is empty.
func appendMessage(b []byte, field int, msg []byte) []byte {
	b = appendTag(b, field, wireLen)
	b = binary.AppendUvarint(b, uint64(len(msg)))
	return append(b, msg...)
}

func appendVarint(b []byte, field int, v uint64) []byte {
	if v == 0 {
		return b
	}
	return binary.AppendUvarint(appendTag(b, field, wireVarint), v)
}

// encodeParams encodes IPAMParameters.
func encodeParams(p *Params) []byte {
	var b []byte
	for _, s := range p.Pools {
		b = appendTag(b, 1, wireLen)
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = appendString(b, 2, p.ContainerID)
	b = appendString(b, 3, p.IfName)
	var meta []byte
	meta = appendString(meta, 1, p.PodName)
	meta = appendString(meta, 2, p.PodNamespace)
	meta = appendString(meta, 3, p.PodUID)
	meta = appendString(meta, 4, p.DeviceID)
	b = appendMessage(b, 4, meta)
	// Enums and int32 are varints of the value sign-extended to 64 bits.
	b = appendVarint(b, 5, uint64(int64(p.PoolType)))
	for _, s := range p.RequestedIPs {
		b = appendTag(b, 6, wireLen)
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	var feat []byte
	if p.AllocateDefaultGateway {
		feat = appendVarint(feat, 1, 1)
	}
	if p.AllocateIPWithIndex != nil {
		// An optional field is sent when set, even when zero.
		feat = appendTag(feat, 2, wireVarint)
		feat = binary.AppendUvarint(feat, uint64(int64(*p.AllocateIPWithIndex)))
	}
	b = appendMessage(b, 7, feat)
	b = appendString(b, 100, p.NetworkName)
	b = appendString(b, 101, p.Rail)
	b = appendString(b, 102, p.PCIBusID)
	b = appendString(b, 103, p.Master)
	return appendString(b, 104, p.Device)
}

// EncodeParamsRequest encodes AllocateRequest, IsAllocatedRequest and
// DeallocateRequest, which are all {IPAMParameters parameters = 1}.
func EncodeParamsRequest(p *Params) []byte {
	return appendMessage(nil, 1, encodeParams(p))
}

// EncodeListAllocationsRequest encodes ListAllocationsRequest.
func EncodeListAllocationsRequest(pool string) []byte {
	return appendString(nil, 1, pool)
}

// errTruncated and friends describe a reply that is not the message it should be.
var (
	errTruncated = errors.New("truncated protobuf message")
	errWireType  = errors.New("unsupported protobuf wire type")
)

// field is one decoded field: a varint's value, or a length-delimited field's bytes.
type field struct {
	num  int
	wire int
	v    uint64
	data []byte
}

// fields calls fn for each field of a message, skipping none: fn ignores the
// numbers it does not know.
func fields(b []byte, fn func(f field) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return errTruncated
		}
		b = b[n:]
		if tag>>3 == 0 || tag>>3 > math.MaxInt32 {
			return fmt.Errorf("invalid protobuf field number %d", tag>>3)
		}
		f := field{num: int(tag >> 3), wire: int(tag & 7)}
		switch f.wire {
		case wireVarint:
			f.v, n = binary.Uvarint(b)
			if n <= 0 {
				return errTruncated
			}
			b = b[n:]
		case wireI64:
			if len(b) < 8 {
				return errTruncated
			}
			f.v, b = binary.LittleEndian.Uint64(b), b[8:]
		case wireI32:
			if len(b) < 4 {
				return errTruncated
			}
			f.v, b = uint64(binary.LittleEndian.Uint32(b)), b[4:]
		case wireLen:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return errTruncated
			}
			f.data, b = b[n:n+int(l)], b[n+int(l):]
		default:
			return fmt.Errorf("%w %d (field %d)", errWireType, f.wire, f.num)
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// str returns a length-delimited field as a string; a field of another wire type
// is a message that is not the one expected.
func (f field) str() (string, error) {
	if f.wire != wireLen {
		return "", fmt.Errorf("protobuf field %d: wire type %d, want a string", f.num, f.wire)
	}
	return string(f.data), nil
}

func (f field) varint() (uint64, error) {
	if f.wire != wireVarint {
		return 0, fmt.Errorf("protobuf field %d: wire type %d, want a varint", f.num, f.wire)
	}
	return f.v, nil
}

// strings assigns the string fields of a message named in dst by number.
func decodeStrings(b []byte, dst map[int]*string) error {
	return fields(b, func(f field) error {
		p, ok := dst[f.num]
		if !ok {
			return nil
		}
		s, err := f.str()
		*p = s
		return err
	})
}

// repeated decodes a reply whose field 1 is a repeated message (every reply the
// plugin reads): decode turns one element's bytes into a T.
func repeated[T any](b []byte, what string, decode func([]byte) (T, error)) ([]T, error) {
	var out []T
	err := fields(b, func(f field) error {
		if f.num != 1 {
			return nil
		}
		if f.wire != wireLen {
			return fmt.Errorf("%s: wire type %d", what, f.wire)
		}
		v, err := decode(f.data)
		out = append(out, v)
		return err
	})
	return out, err
}

// DecodeAllocateResponse decodes AllocateResponse.
func DecodeAllocateResponse(b []byte) ([]Allocation, error) {
	return repeated(b, "AllocateResponse.allocations", func(data []byte) (Allocation, error) {
		var a Allocation
		err := fields(data, func(g field) error {
			var err error
			switch g.num {
			case 1:
				a.Pool, err = g.str()
			case 2:
				a.IP, err = g.str()
			case 3:
				a.Gateway, err = g.str()
			case 4:
				var v uint64
				v, err = g.varint()
				a.PoolType = PoolType(int32(v))
			case 5:
				var dest string
				if g.wire != wireLen {
					return fmt.Errorf("AllocationInfo.routes: wire type %d", g.wire)
				}
				err = decodeStrings(g.data, map[int]*string{1: &dest})
				a.Routes = append(a.Routes, dest)
			}
			return err
		})
		return a, err
	})
}

// DecodeListAllocationsResponse decodes ListAllocationsResponse.
func DecodeListAllocationsResponse(b []byte) ([]AllocationRecord, error) {
	return repeated(b, "ListAllocationsResponse.allocations", func(data []byte) (AllocationRecord, error) {
		var r AllocationRecord
		err := decodeStrings(data, map[int]*string{1: &r.Pool, 2: &r.ContainerID, 3: &r.IfName, 4: &r.IP, 10: &r.Network})
		return r, err
	})
}

// DecodeListPoolsResponse decodes ListPoolsResponse.
func DecodeListPoolsResponse(b []byte) ([]PoolInfo, error) {
	return repeated(b, "ListPoolsResponse.pools", func(data []byte) (PoolInfo, error) {
		var p PoolInfo
		err := fields(data, func(g field) error {
			var err error
			switch g.num {
			case 1:
				p.Key, err = g.str()
			case 11:
				var v uint64
				v, err = g.varint()
				p.Active = v != 0
			case 15:
				p.Rail, err = g.str()
			}
			return err
		})
		return p, err
	})
}
