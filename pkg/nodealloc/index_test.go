package nodealloc_test

import (
	"errors"
	"fmt"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

func cidrPool(t *testing.T, name, prefix string, perNode ...v1alpha1.ExcludeIndexRange) *nodealloc.PoolConfig {
	t.Helper()
	p := &v1alpha1.CIDRPool{Spec: v1alpha1.CIDRPoolSpec{PerNodeExclusions: perNode},
		Status: v1alpha1.CIDRPoolStatus{Allocations: []v1alpha1.CIDRPoolAllocation{{NodeName: "node-1", Prefix: prefix}}}}
	p.Name = name
	c, err := nodealloc.FromCIDRPool(p, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func byIndex(cid, pool string, ix int32) *nodealloc.Request {
	r := req(cid, pool)
	r.Kind = v1alpha1.KindCIDRPool
	r.Index = ptr.To(ix)
	return r
}

// TestCIDRPoolIndexCountsFromFirstUsable: nv-ipam counts allocateIPWithIndex from
// the first usable address of the node's prefix (network+1, except on /31, /32,
// /127 and /128), and perNodeExclusions from the network address.
func TestCIDRPoolIndexCountsFromFirstUsable(t *testing.T) {
	m, _ := newManager(t)
	for _, c := range []*nodealloc.PoolConfig{
		// perNodeExclusions index 3 is 10.5.0.3, which is allocation index 2.
		cidrPool(t, "v4", "10.5.0.0/24", v1alpha1.ExcludeIndexRange{StartIndex: 3, EndIndex: 3}),
		cidrPool(t, "p2p", "10.6.0.0/31"),
		cidrPool(t, "host", "10.7.0.9/32"),
		cidrPool(t, "v6", "fd00:5::/64"),
		cidrPool(t, "host6", "fd00:6::9/128"),
	} {
		if err := m.SetPool(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		pool string
		ix   int32
		want string // empty: refused
	}{
		{"v4", 0, "10.5.0.1/24"},
		{"v4", 5, "10.5.0.6/24"},
		{"v4", 253, "10.5.0.254/24"},
		{"v4", 254, ""}, // the broadcast address
		{"v4", 2, ""},   // excluded by perNodeExclusions index 3
		{"v4", 3, "10.5.0.4/24"},
		{"p2p", 0, "10.6.0.0/31"},
		{"p2p", 1, "10.6.0.1/31"},
		{"host", 0, "10.7.0.9/32"},
		{"v6", 0, "fd00:5::1/64"},
		{"v6", 5, "fd00:5::6/64"},
		{"host6", 0, "fd00:6::9/128"},
	} {
		res, err := m.Allocate(t.Context(), byIndex(fmt.Sprintf("%s-%d", tc.pool, tc.ix), tc.pool, tc.ix))
		switch {
		case tc.want == "" && !errors.Is(err, nodealloc.ErrInvalid):
			t.Errorf("%s index %d = %v %v, want ErrInvalid", tc.pool, tc.ix, res, err)
		case tc.want != "" && (err != nil || res[0].Addr.String() != tc.want):
			t.Errorf("%s index %d = %v %v, want %s", tc.pool, tc.ix, res, err, tc.want)
		}
	}
}

// TestIndexAllocationsMadeBeforeTheFixKeepTheirAddress: an allocation made with
// the old network-based count (index 5 → .5) is returned unchanged by a retry.
func TestIndexAllocationsMadeBeforeTheFixKeepTheirAddress(t *testing.T) {
	m := managerWith(t, cidrPool(t, "v4", "10.5.0.0/24"), store.Put{PoolKey: "cidrpool/v4",
		Allocation: store.Allocation{ContainerID: "old", IfName: "net1", IP: "10.5.0.5", PodName: "pod-old", PodNamespace: "ns"}})
	m.UseStoredBlocks() // as with the API server unreachable: the stored block serves
	res, err := m.Allocate(t.Context(), byIndex("old", "v4", 5))
	if err != nil || res[0].Addr.String() != "10.5.0.5/24" {
		t.Errorf("retry of an old index allocation = %v %v, want its stored 10.5.0.5/24", res, err)
	}
	res, err = m.Allocate(t.Context(), byIndex("new", "v4", 5))
	if err != nil || res[0].Addr.String() != "10.5.0.6/24" {
		t.Errorf("new index allocation = %v %v, want 10.5.0.6/24", res, err)
	}
}
