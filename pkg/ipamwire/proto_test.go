package ipamwire_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/test/harness"
)

func seed(t *testing.T) *rand.Rand { return harness.Rand(t) }

// str returns a random string, empty a quarter of the time, with any UTF-8.
func str(r *rand.Rand) string {
	if r.IntN(4) == 0 {
		return ""
	}
	runes := []rune("abcXYZ019-_./:é漢🙂\x00\n")
	b := make([]rune, r.IntN(300))
	for i := range b {
		b[i] = runes[r.IntN(len(runes))]
	}
	return string(b)
}

func strs(r *rand.Rand) []string {
	out := make([]string, r.IntN(4))
	for i := range out {
		out[i] = str(r)
		if out[i] == "" {
			out[i] = "x" // a repeated string's empty element is sent; keep the comparison simple
		}
	}
	return out
}

// TestParamsEncodeAsGenerated encodes random parameters by hand and decodes them
// with the generated code: every field arrives, in every request type.
func TestParamsEncodeAsGenerated(t *testing.T) {
	r := seed(t)
	for i := range 2000 {
		p := &ipamwire.Params{Pools: strs(r), ContainerID: str(r), IfName: str(r), PoolType: ipamwire.PoolType(r.IntN(3)),
			RequestedIPs: strs(r), NetworkName: str(r), PodName: str(r), PodNamespace: str(r), PodUID: str(r), DeviceID: str(r),
			AllocateDefaultGateway: r.IntN(2) == 0, Rail: str(r), PCIBusID: str(r), Master: str(r), Device: str(r)}
		if r.IntN(2) == 0 {
			idx := int32(r.Uint32())
			if r.IntN(4) == 0 {
				idx = 0
			}
			p.AllocateIPWithIndex = &idx
		}
		want := &nodev1.IPAMParameters{Pools: p.Pools, CniContainerid: p.ContainerID, CniIfname: p.IfName,
			PoolType: nodev1.PoolType(p.PoolType), RequestedIps: p.RequestedIPs, NetworkName: p.NetworkName,
			Rail: p.Rail, PciBusId: p.PCIBusID, Master: p.Master, Device: p.Device,
			Metadata: &nodev1.IPAMMetadata{K8SPodName: p.PodName, K8SPodNamespace: p.PodNamespace, K8SPodUid: p.PodUID, DeviceId: p.DeviceID},
			Features: &nodev1.IPAMFeatures{AllocateDefaultGateway: p.AllocateDefaultGateway, AllocateIpWithIndex: p.AllocateIPWithIndex}}
		data := ipamwire.EncodeParamsRequest(p)
		for _, got := range []interface {
			proto.Message
			GetParameters() *nodev1.IPAMParameters
		}{&nodev1.AllocateRequest{}, &nodev1.IsAllocatedRequest{}, &nodev1.DeallocateRequest{}} {
			if err := proto.Unmarshal(data, got); err != nil {
				t.Fatalf("case %d: %T cannot be decoded: %v", i, got, err)
			}
			if !proto.Equal(got.GetParameters(), want) {
				t.Fatalf("case %d: %T decodes to\n%v\nwant\n%v", i, got, got.GetParameters(), want)
			}
		}
	}
	var lr infov1.ListAllocationsRequest
	if err := proto.Unmarshal(ipamwire.EncodeListAllocationsRequest("cidrpool/a"), &lr); err != nil || lr.Pool != "cidrpool/a" {
		t.Errorf("ListAllocationsRequest = %v %v", &lr, err)
	}
}

// TestRepliesDecodeAsGenerated encodes random replies with the generated code,
// including fields the plugin does not read, and decodes them by hand.
func TestRepliesDecodeAsGenerated(t *testing.T) {
	r := seed(t)
	for i := range 1000 {
		var ar nodev1.AllocateResponse
		var want []ipamwire.Allocation
		for range r.IntN(3) {
			a := &nodev1.AllocationInfo{Pool: str(r), Ip: str(r), Gateway: str(r), PoolType: nodev1.PoolType(r.IntN(3))}
			w := ipamwire.Allocation{Pool: a.Pool, IP: a.Ip, Gateway: a.Gateway, PoolType: ipamwire.PoolType(a.PoolType)}
			for range r.IntN(3) {
				d := str(r)
				a.Routes = append(a.Routes, &nodev1.Route{Dest: d})
				w.Routes = append(w.Routes, d)
			}
			ar.Allocations = append(ar.Allocations, a)
			want = append(want, w)
		}
		got, err := ipamwire.DecodeAllocateResponse(marshal(t, &ar))
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) || len(got) != len(want) {
			t.Fatalf("case %d: AllocateResponse %v decodes to %v %v", i, &ar, got, err)
		}

		var lr infov1.ListAllocationsResponse
		var wantRecs []ipamwire.AllocationRecord
		for range r.IntN(4) {
			a := &infov1.AllocationRecord{Pool: str(r), ContainerId: str(r), IfName: str(r), Ip: str(r), PodName: str(r),
				PodNamespace: str(r), PodUid: str(r), DeviceId: str(r), CreateTime: r.Int64(), Network: str(r)}
			lr.Allocations = append(lr.Allocations, a)
			wantRecs = append(wantRecs, ipamwire.AllocationRecord{Pool: a.Pool, ContainerID: a.ContainerId, IfName: a.IfName, IP: a.Ip, Network: a.Network})
		}
		recs, err := ipamwire.DecodeListAllocationsResponse(marshal(t, &lr))
		if err != nil || fmt.Sprint(recs) != fmt.Sprint(wantRecs) {
			t.Fatalf("case %d: ListAllocationsResponse decodes to %v %v, want %v", i, recs, err, wantRecs)
		}

		var pr infov1.ListPoolsResponse
		var wantPools []ipamwire.PoolInfo
		for range r.IntN(4) {
			p := &infov1.PoolInfo{Key: str(r), Name: str(r), Kind: str(r), Start: str(r), Size: str(r), Allocated: r.Uint64(),
				Active: r.IntN(2) == 0, Exclusions: strs(r), Orphans: r.Uint64(), Rail: str(r)}
			pr.Pools = append(pr.Pools, p)
			wantPools = append(wantPools, ipamwire.PoolInfo{Key: p.Key, Active: p.Active, Rail: p.Rail})
		}
		pools, err := ipamwire.DecodeListPoolsResponse(marshal(t, &pr))
		if err != nil || fmt.Sprint(pools) != fmt.Sprint(wantPools) {
			t.Fatalf("case %d: ListPoolsResponse decodes to %v %v, want %v", i, pools, err, wantPools)
		}
	}
}

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDecode feeds arbitrary bytes to the decoders: an error or a value, never a
// panic.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{0x0a, 0x05, 0x12, 0x03, 'a', 'b', 'c'})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0x0b})
	f.Fuzz(func(_ *testing.T, b []byte) {
		_, _ = ipamwire.DecodeAllocateResponse(b)
		_, _ = ipamwire.DecodeListAllocationsResponse(b)
		_, _ = ipamwire.DecodeListPoolsResponse(b)
	})
}

func TestDecodeRefusesMalformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"truncated length":      {0x0a, 0x05, 0x12},
		"length past the end":   {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"group wire type":       {0x0b},
		"field zero":            {0x02, 0x00},
		"allocations as varint": {0x08, 0x01},
	} {
		if _, err := ipamwire.DecodeAllocateResponse(b); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}
