package blocks_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
)

func TestIPPoolLayout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     v1alpha1.IPPoolSpec
		count    uint64
		first    string // block 0
		last     string // block count-1
		unusable []uint64
	}{
		{name: "v4 /24 blocks of 10, partial tail unused",
			spec:  v1alpha1.IPPoolSpec{Subnet: "192.168.0.0/24", PerNodeBlockSize: 10},
			count: 25, first: "192.168.0.1-192.168.0.10", last: "192.168.0.241-192.168.0.250"},
		{name: "host bits in subnet are masked",
			spec:  v1alpha1.IPPoolSpec{Subnet: "192.168.0.77/24", PerNodeBlockSize: 127},
			count: 2, first: "192.168.0.1-192.168.0.127", last: "192.168.0.128-192.168.0.254"},
		{name: "v4 /31 point to point, blocks of 1",
			spec:  v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/31", PerNodeBlockSize: 1},
			count: 2, first: "10.0.0.0-10.0.0.0", last: "10.0.0.1-10.0.0.1"},
		{name: "v4 /32",
			spec:  v1alpha1.IPPoolSpec{Subnet: "10.0.0.9/32", PerNodeBlockSize: 1},
			count: 1, first: "10.0.0.9-10.0.0.9", last: "10.0.0.9-10.0.0.9"},
		{name: "v6 /64 blocks of 2^16",
			spec:  v1alpha1.IPPoolSpec{Subnet: "fd00:1::/64", PerNodeBlockSize: 65536},
			count: 281474976710655, first: "fd00:1::1-fd00:1::1:0", last: "fd00:1::ffff:ffff:fffe:1-fd00:1::ffff:ffff:ffff:0"},
		{name: "v6 /127",
			spec:  v1alpha1.IPPoolSpec{Subnet: "fd00::/127", PerNodeBlockSize: 1},
			count: 2, first: "fd00::-fd00::", last: "fd00::1-fd00::1"},
		{name: "v6 /128",
			spec:  v1alpha1.IPPoolSpec{Subnet: "fd00::8/128", PerNodeBlockSize: 1},
			count: 1, first: "fd00::8-fd00::8", last: "fd00::8-fd00::8"},
		{name: "entirely excluded blocks are unusable, partly excluded ones are not",
			spec: v1alpha1.IPPoolSpec{Subnet: "10.1.0.0/24", PerNodeBlockSize: 4, Exclusions: []v1alpha1.ExcludeRange{
				{StartIP: "10.1.0.5", EndIP: "10.1.0.6"}, {StartIP: "10.1.0.7", EndIP: "10.1.0.12"}, // blocks 1 (.5-.8) and 2 (.9-.12)
				{StartIP: "10.1.0.14", EndIP: "10.1.0.16"}, // block 3 (.13-.16) only partly
			}},
			count: 63, first: "10.1.0.1-10.1.0.4", last: "10.1.0.249-10.1.0.252", unusable: []uint64{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := blocks.NewIPPool(&tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if l.Count() != tc.count {
				t.Fatalf("Count = %d, want %d", l.Count(), tc.count)
			}
			if got := l.Block(0).String(); got != tc.first {
				t.Errorf("block 0 = %s, want %s", got, tc.first)
			}
			if got := l.Block(tc.count - 1).String(); got != tc.last {
				t.Errorf("last block = %s, want %s", got, tc.last)
			}
			for i := range min(tc.count, 64) {
				want := true
				for _, u := range tc.unusable {
					if u == i {
						want = false
					}
				}
				if l.Usable(i) != want {
					t.Errorf("Usable(%d) = %v, want %v", i, !want, want)
				}
				b := l.Block(i)
				if idx, ok := l.IndexOf(b.Start, b.End); !ok || idx != i {
					t.Errorf("IndexOf(block %d %s) = %d, %v", i, b, idx, ok)
				}
			}
		})
	}
}

func TestIPPoolIndexOfRejectsMisfits(t *testing.T) {
	l, err := blocks.NewIPPool(&v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/24", PerNodeBlockSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]string{
		{"10.0.0.2", "10.0.0.11"},    // misaligned
		{"10.0.0.1", "10.0.0.20"},    // wrong size
		{"10.0.0.251", "10.0.0.254"}, // the unused tail
		{"10.0.1.1", "10.0.1.10"},    // outside
		{"fd00::1", "fd00::a"},       // other family
	} {
		if idx, ok := l.IndexOf(netip.MustParseAddr(r[0]), netip.MustParseAddr(r[1])); ok {
			t.Errorf("IndexOf(%s-%s) = %d, want no block", r[0], r[1], idx)
		}
	}
}

func TestCIDRPoolLayout(t *testing.T) {
	spec := v1alpha1.CIDRPoolSpec{
		CIDR: "10.10.0.0/16", PerNodeNetworkPrefix: 24, GatewayIndex: ptr.To[int32](1),
		Exclusions: []v1alpha1.ExcludeRange{{StartIP: "10.10.3.1", EndIP: "10.10.3.254"}},
		StaticAllocations: []v1alpha1.CIDRPoolStaticAllocation{
			{NodeName: "pinned", Prefix: "10.10.7.0/24", Gateway: "10.10.7.254"},
			{Prefix: "10.10.8.0/24"},
		},
	}
	l, err := blocks.NewCIDRPool(&spec)
	if err != nil {
		t.Fatal(err)
	}
	if l.Count() != 256 || l.Prefix(5).String() != "10.10.5.0/24" || l.Block(255).String() != "10.10.255.0-10.10.255.255" {
		t.Errorf("count %d, prefix 5 %s, block 255 %s", l.Count(), l.Prefix(5), l.Block(255))
	}
	for i, want := range map[uint64]bool{0: true, 3: false, 7: false, 8: false, 9: true} {
		if l.Usable(i) != want {
			t.Errorf("Usable(%d) = %v, want %v", i, !want, want)
		}
	}
	if gw, ok := l.Gateway(netip.MustParsePrefix("10.10.5.0/24")); !ok || gw.String() != "10.10.5.1" {
		t.Errorf("gateway by index = %s %v", gw, ok)
	}
	if gw, ok := l.Gateway(netip.MustParsePrefix("10.10.7.0/24")); !ok || gw.String() != "10.10.7.254" {
		t.Errorf("static gateway = %s %v", gw, ok)
	}
	if p, ok := l.StaticFor("pinned"); !ok || p.String() != "10.10.7.0/24" {
		t.Errorf("StaticFor(pinned) = %s %v", p, ok)
	}
	if owner, ok := l.StaticOwner(netip.MustParsePrefix("10.10.8.0/24")); !ok || owner != "" {
		t.Errorf("reservation owner = %q %v", owner, ok)
	}
	for _, bad := range []string{"10.10.5.0/25", "10.10.5.128/24", "10.11.0.0/24"} {
		p, err := netip.ParsePrefix(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := l.IndexOf(p); ok {
			t.Errorf("IndexOf(%s) accepted a prefix that is not one of the layout's", bad)
		}
	}
}

func TestCIDRPoolIPv6Wide(t *testing.T) {
	l, err := blocks.NewCIDRPool(&v1alpha1.CIDRPoolSpec{CIDR: "fd00::/48", PerNodeNetworkPrefix: 64})
	if err != nil {
		t.Fatal(err)
	}
	if l.Count() != 65536 {
		t.Fatalf("count %d", l.Count())
	}
	p := l.Prefix(65535)
	if p.String() != "fd00:0:0:ffff::/64" {
		t.Errorf("prefix 65535 = %s", p)
	}
	if idx, ok := l.IndexOf(p); !ok || idx != 65535 {
		t.Errorf("IndexOf(%s) = %d %v", p, idx, ok)
	}
	if _, ok := l.Gateway(p); ok {
		t.Error("a pool without gatewayIndex reported a gateway")
	}
}

func TestNextUsableJumpsOverHugeExclusions(t *testing.T) {
	l, err := blocks.NewIPPool(&v1alpha1.IPPoolSpec{Subnet: "fd00::/64", PerNodeBlockSize: 256,
		Exclusions: []v1alpha1.ExcludeRange{{StartIP: "fd00::1", EndIP: "fd00::ffff:ffff:ffff"}}})
	if err != nil {
		t.Fatal(err)
	}
	i, ok := l.NextUsable(0)
	if !ok {
		t.Fatal("no usable block")
	}
	if l.Usable(i-1) || !l.Usable(i) {
		t.Errorf("NextUsable(0) = %d: block before usable %v, block usable %v", i, l.Usable(i-1), l.Usable(i))
	}
	if got := l.Block(i).String(); got != "fd00::ffff:ffff:ff01-fd00::1:0:0:0" { // partly excluded: usable
		t.Errorf("first usable block = %s", got)
	}
	c, err := blocks.NewCIDRPool(&v1alpha1.CIDRPoolSpec{CIDR: "10.0.0.0/8", PerNodeNetworkPrefix: 24,
		Exclusions:        []v1alpha1.ExcludeRange{{StartIP: "10.0.0.0", EndIP: "10.200.0.255"}},
		StaticAllocations: []v1alpha1.CIDRPoolStaticAllocation{{Prefix: "10.200.1.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	if i, ok := c.NextUsable(0); !ok || c.Prefix(i).String() != "10.200.2.0/24" {
		t.Errorf("CIDRPool NextUsable(0) = %s %v", c.Prefix(i), ok)
	}
	if _, ok := c.NextUsable(c.Count()); ok {
		t.Error("NextUsable past the end found a block")
	}
}

// TestNextUsableMatchesLinearScan compares the jumping search with a plain scan.
func TestNextUsableMatchesLinearScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		spec := v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/24", PerNodeBlockSize: 1 + r.IntN(20)}
		cspec := v1alpha1.CIDRPoolSpec{CIDR: "10.0.0.0/24", PerNodeNetworkPrefix: int32(25 + r.IntN(6))}
		for range r.IntN(4) {
			a, b := r.IntN(256), r.IntN(256)
			e := v1alpha1.ExcludeRange{StartIP: fmt.Sprintf("10.0.0.%d", min(a, b)), EndIP: fmt.Sprintf("10.0.0.%d", max(a, b))}
			spec.Exclusions = append(spec.Exclusions, e)
			cspec.Exclusions = append(cspec.Exclusions, e)
		}
		ip, err := blocks.NewIPPool(&spec)
		if err != nil {
			t.Fatal(err)
		}
		cp, err := blocks.NewCIDRPool(&cspec)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []blocks.Layout{ip, cp} {
			for from := range l.Count() + 1 {
				want, wantOK := uint64(0), false
				for j := from; j < l.Count(); j++ {
					if l.Usable(j) {
						want, wantOK = j, true
						break
					}
				}
				got, ok := l.NextUsable(from)
				if ok != wantOK || got != want {
					t.Fatalf("%+v %+v: NextUsable(%d) = %d %v, scan %d %v", spec, cspec, from, got, ok, want, wantOK)
				}
			}
		}
	}
}
