package v1alpha1_test

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
)

func ipPool(mod func(*v1alpha1.IPPoolSpec)) *v1alpha1.IPPool {
	p := &v1alpha1.IPPool{Spec: v1alpha1.IPPoolSpec{Subnet: "192.168.0.0/16", PerNodeBlockSize: 100, Gateway: "192.168.0.1"}}
	if mod != nil {
		mod(&p.Spec)
	}
	return p
}

func cidrPool(mod func(*v1alpha1.CIDRPoolSpec)) *v1alpha1.CIDRPool {
	p := &v1alpha1.CIDRPool{Spec: v1alpha1.CIDRPoolSpec{CIDR: "10.0.0.0/16", PerNodeNetworkPrefix: 24, GatewayIndex: ptr.To[int32](1)}}
	if mod != nil {
		mod(&p.Spec)
	}
	return p
}

func TestIPPoolValidate(t *testing.T) {
	goodSelector := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "nic.hwipam.io/ibp75s0", Operator: corev1.NodeSelectorOpIn, Values: []string{"ib"}}},
	}}}
	for _, tc := range []struct {
		name   string
		mod    func(*v1alpha1.IPPoolSpec)
		fields []string // expected error field paths; none = valid
	}{
		{name: "valid"},
		{name: "valid IPv6 with everything", mod: func(s *v1alpha1.IPPoolSpec) {
			*s = v1alpha1.IPPoolSpec{Subnet: "fd00::/64", PerNodeBlockSize: 1 << 20, Gateway: "fd00::1", DefaultGateway: true,
				Exclusions:        []v1alpha1.ExcludeRange{{StartIP: "fd00::2", EndIP: "fd00::ff"}},
				PerNodeExclusions: []v1alpha1.ExcludeIndexRange{{StartIndex: 0, EndIndex: 3}},
				Routes:            []v1alpha1.Route{{Dst: "fd01::/48"}}, NodeSelector: goodSelector}
		}},
		{name: "valid /32 block of 1", mod: func(s *v1alpha1.IPPoolSpec) { *s = v1alpha1.IPPoolSpec{Subnet: "10.0.0.1/32", PerNodeBlockSize: 1} }},
		{name: "valid /127", mod: func(s *v1alpha1.IPPoolSpec) { *s = v1alpha1.IPPoolSpec{Subnet: "fd00::/127", PerNodeBlockSize: 2} }},
		{name: "subnet missing", mod: func(s *v1alpha1.IPPoolSpec) { s.Subnet = ""; s.Gateway = "" }, fields: []string{"spec.subnet"}},
		{name: "subnet garbage", mod: func(s *v1alpha1.IPPoolSpec) { s.Subnet = "192.168.0.0/33" }, fields: []string{"spec.subnet"}},
		{name: "block size 0", mod: func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 0 }, fields: []string{"spec.perNodeBlockSize"}},
		{name: "block larger than subnet", mod: func(s *v1alpha1.IPPoolSpec) { s.Subnet = "192.168.0.0/24"; s.PerNodeBlockSize = 255 },
			fields: []string{"spec.perNodeBlockSize"}},
		{name: "gateway outside", mod: func(s *v1alpha1.IPPoolSpec) { s.Gateway = "10.0.0.1" }, fields: []string{"spec.gateway"}},
		{name: "gateway other family", mod: func(s *v1alpha1.IPPoolSpec) { s.Gateway = "fd00::1" }, fields: []string{"spec.gateway"}},
		{name: "gateway garbage", mod: func(s *v1alpha1.IPPoolSpec) { s.Gateway = "192.168.0.x" }, fields: []string{"spec.gateway"}},
		{name: "defaultGateway without gateway", mod: func(s *v1alpha1.IPPoolSpec) { s.Gateway = ""; s.DefaultGateway = true },
			fields: []string{"spec.gateway"}},
		{name: "exclusion outside and reversed", mod: func(s *v1alpha1.IPPoolSpec) {
			s.Exclusions = []v1alpha1.ExcludeRange{{StartIP: "10.0.0.1", EndIP: "192.168.0.9"}, {StartIP: "192.168.0.9", EndIP: "192.168.0.2"}}
		}, fields: []string{"spec.exclusions[0].startIP", "spec.exclusions[1].endIP"}},
		{name: "per-node exclusion past the block", mod: func(s *v1alpha1.IPPoolSpec) {
			s.PerNodeExclusions = []v1alpha1.ExcludeIndexRange{{StartIndex: 5, EndIndex: 100}}
		}, fields: []string{"spec.perNodeExclusions[0].endIndex"}},
		{name: "per-node exclusion negative and reversed", mod: func(s *v1alpha1.IPPoolSpec) {
			s.PerNodeExclusions = []v1alpha1.ExcludeIndexRange{{StartIndex: -1, EndIndex: 3}, {StartIndex: 9, EndIndex: 2}}
		}, fields: []string{"spec.perNodeExclusions[0].startIndex", "spec.perNodeExclusions[1].endIndex"}},
		{name: "route garbage and other family", mod: func(s *v1alpha1.IPPoolSpec) {
			s.Routes = []v1alpha1.Route{{Dst: "nope"}, {Dst: "fd00::/8"}}
		}, fields: []string{"spec.routes[0].dst", "spec.routes[1].dst"}},
		{name: "selector without terms", mod: func(s *v1alpha1.IPPoolSpec) { s.NodeSelector = &corev1.NodeSelector{} },
			fields: []string{"spec.nodeSelector.nodeSelectorTerms"}},
		{name: "selector with a bad operator", mod: func(s *v1alpha1.IPPoolSpec) {
			s.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "a", Operator: "Near", Values: []string{"b"}}}}}}
		}, fields: []string{"spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := ipPool(tc.mod).Validate()
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
				if e.Detail == "" && e.Type != "FieldValueRequired" {
					t.Errorf("error on %s has no detail: %v", e.Field, e)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.fields) {
				t.Errorf("error fields = %v, want %v (errors: %v)", got, tc.fields, errs)
			}
		})
	}
}

func TestCIDRPoolValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mod    func(*v1alpha1.CIDRPoolSpec)
		fields []string
	}{
		{name: "valid"},
		{name: "valid with static allocations and a reservation", mod: func(s *v1alpha1.CIDRPoolSpec) {
			s.DefaultGateway = true
			s.StaticAllocations = []v1alpha1.CIDRPoolStaticAllocation{
				{NodeName: "a", Prefix: "10.0.1.0/24", Gateway: "10.0.1.254"}, {Prefix: "10.0.2.0/24"}}
		}},
		{name: "valid IPv6 /64 per node", mod: func(s *v1alpha1.CIDRPoolSpec) {
			*s = v1alpha1.CIDRPoolSpec{CIDR: "fd00::/48", PerNodeNetworkPrefix: 64, GatewayIndex: ptr.To[int32](1)}
		}},
		{name: "valid /32 per node, no gateway", mod: func(s *v1alpha1.CIDRPoolSpec) { s.PerNodeNetworkPrefix = 32; s.GatewayIndex = nil }},
		{name: "cidr garbage", mod: func(s *v1alpha1.CIDRPoolSpec) { s.CIDR = "10.0.0/16" }, fields: []string{"spec.cidr"}},
		{name: "per-node prefix shorter than cidr", mod: func(s *v1alpha1.CIDRPoolSpec) { s.PerNodeNetworkPrefix = 8 },
			fields: []string{"spec.perNodeNetworkPrefix"}},
		{name: "per-node prefix 0 on ::/0", mod: func(s *v1alpha1.CIDRPoolSpec) {
			*s = v1alpha1.CIDRPoolSpec{CIDR: "::/0", PerNodeNetworkPrefix: 0}
		}, fields: []string{"spec.perNodeNetworkPrefix"}},
		{name: "per-node prefix too long", mod: func(s *v1alpha1.CIDRPoolSpec) { s.PerNodeNetworkPrefix = 33 },
			fields: []string{"spec.perNodeNetworkPrefix"}},
		{name: "gateway index outside the prefix", mod: func(s *v1alpha1.CIDRPoolSpec) { s.GatewayIndex = ptr.To[int32](256) },
			fields: []string{"spec.gatewayIndex"}},
		{name: "gateway index on the network address", mod: func(s *v1alpha1.CIDRPoolSpec) { s.GatewayIndex = ptr.To[int32](0) },
			fields: []string{"spec.gatewayIndex"}},
		{name: "defaultGateway without gatewayIndex", mod: func(s *v1alpha1.CIDRPoolSpec) { s.GatewayIndex = nil; s.DefaultGateway = true },
			fields: []string{"spec.gatewayIndex"}},
		{name: "static allocation problems", mod: func(s *v1alpha1.CIDRPoolSpec) {
			s.StaticAllocations = []v1alpha1.CIDRPoolStaticAllocation{
				{NodeName: "a", Prefix: "10.0.1.0/25"},                      // wrong length
				{NodeName: "b", Prefix: "10.0.1.1/24"},                      // host bits
				{NodeName: "c", Prefix: "10.9.1.0/24"},                      // outside
				{NodeName: "d", Prefix: "10.0.4.0/24"},                      // fine
				{NodeName: "d", Prefix: "10.0.4.0/24", Gateway: "10.0.5.1"}, // duplicate prefix and node, gateway outside
			}
		}, fields: []string{"spec.staticAllocations[0].prefix", "spec.staticAllocations[1].prefix", "spec.staticAllocations[2].prefix",
			"spec.staticAllocations[4].gateway", "spec.staticAllocations[4].nodeName", "spec.staticAllocations[4].prefix"}},
		{name: "per-node exclusion past the prefix", mod: func(s *v1alpha1.CIDRPoolSpec) {
			s.PerNodeExclusions = []v1alpha1.ExcludeIndexRange{{StartIndex: 0, EndIndex: 256}}
		}, fields: []string{"spec.perNodeExclusions[0].endIndex"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := cidrPool(tc.mod).Validate()
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.fields) {
				t.Errorf("error fields = %v, want %v (errors: %v)", got, tc.fields, errs)
			}
		})
	}
}

// FuzzIPPoolValidate checks that validation never panics and that whatever it
// accepts the block layout can be built from, with blocks inside the subnet.
func FuzzIPPoolValidate(f *testing.F) {
	f.Add("192.168.0.0/24", 10, "192.168.0.1", "192.168.0.5", "192.168.0.9")
	f.Add("fd00::/64", 65536, "fd00::1", "fd00::2", "fd00::ffff")
	f.Add("10.0.0.0/31", 1, "", "10.0.0.0", "10.0.0.0")
	f.Add("0.0.0.0/0", 1<<30, "0.0.0.1", "1.1.1.1", "0.0.0.1")
	f.Add("::/0", 7, "::", "::1", "::")
	f.Add("10.0.0.1/33", -1, "x", "", "")
	f.Fuzz(func(t *testing.T, subnet string, size int, gw, exStart, exEnd string) {
		p := &v1alpha1.IPPool{Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: size, Gateway: gw,
			Exclusions: []v1alpha1.ExcludeRange{{StartIP: exStart, EndIP: exEnd}}}}
		if len(p.Validate()) > 0 {
			return
		}
		checkIPPoolLayout(t, p)
	})
}

// FuzzCIDRPoolValidate is FuzzIPPoolValidate for CIDRPools.
func FuzzCIDRPoolValidate(f *testing.F) {
	f.Add("10.0.0.0/16", int32(24), int32(1), "10.0.3.0/24", "10.0.3.1")
	f.Add("fd00::/48", int32(64), int32(1), "fd00:0:0:5::/64", "")
	f.Add("10.0.0.0/31", int32(32), int32(-1), "", "")
	f.Add("10.0.0.0/8", int32(7), int32(0), "10.0.0.0/8", "10.0.0.0")
	f.Fuzz(func(t *testing.T, cidr string, perNode, gwIndex int32, static, staticGW string) {
		p := &v1alpha1.CIDRPool{Spec: v1alpha1.CIDRPoolSpec{CIDR: cidr, PerNodeNetworkPrefix: perNode}}
		if gwIndex >= 0 {
			p.Spec.GatewayIndex = ptr.To(gwIndex)
		}
		if static != "" {
			p.Spec.StaticAllocations = []v1alpha1.CIDRPoolStaticAllocation{{NodeName: "n", Prefix: static, Gateway: staticGW}}
		}
		if len(p.Validate()) > 0 {
			return
		}
		checkCIDRPoolLayout(t, p)
	})
}

func checkIPPoolLayout(t *testing.T, p *v1alpha1.IPPool) {
	t.Helper()
	l, err := blocks.NewIPPool(&p.Spec)
	if err != nil {
		t.Fatalf("valid spec %+v has no layout: %v", p.Spec, err)
	}
	subnet := netip.MustParsePrefix(p.Spec.Subnet).Masked()
	if l.Count() == 0 {
		t.Fatalf("valid spec %+v has no blocks", p.Spec)
	}
	for _, i := range []uint64{0, l.Count() / 2, l.Count() - 1} {
		b := l.Block(i)
		if !subnet.Contains(b.Start) || !subnet.Contains(b.End) || b.End.Less(b.Start) {
			t.Fatalf("block %d %s of %+v is not inside %s", i, b, p.Spec, subnet)
		}
		if idx, ok := l.IndexOf(b.Start, b.End); !ok || idx != i {
			t.Fatalf("IndexOf(block %d %s) = %d %v", i, b, idx, ok)
		}
	}
}

func checkCIDRPoolLayout(t *testing.T, p *v1alpha1.CIDRPool) {
	t.Helper()
	l, err := blocks.NewCIDRPool(&p.Spec)
	if err != nil {
		t.Fatalf("valid spec %+v has no layout: %v", p.Spec, err)
	}
	cidr := netip.MustParsePrefix(p.Spec.CIDR).Masked()
	for _, i := range []uint64{0, l.Count() / 2, l.Count() - 1} {
		pr := l.Prefix(i)
		if !cidr.Contains(pr.Addr()) || pr.Bits() != int(p.Spec.PerNodeNetworkPrefix) {
			t.Fatalf("prefix %d %s of %+v is not a /%d in %s", i, pr, p.Spec, p.Spec.PerNodeNetworkPrefix, cidr)
		}
		if idx, ok := l.IndexOf(pr); !ok || idx != i {
			t.Fatalf("IndexOf(prefix %d %s) = %d %v", i, pr, idx, ok)
		}
		if gw, ok := l.Gateway(pr); ok && !pr.Contains(gw) {
			t.Fatalf("gateway %s outside prefix %s", gw, pr)
		}
	}
}
