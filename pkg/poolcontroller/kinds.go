package poolcontroller

import (
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// pool is what the reconciler needs of an IPPool or a CIDRPool; ipPool and cidrPool
// adapt the two API types to it.
type pool interface {
	object() client.Object
	kind() string
	validate() field.ErrorList
	layout() (blocks.Layout, error)
	nodeSelector() *corev1.NodeSelector
	// existing returns the status assignments that fit the layout, in status order,
	// and the entries whose block does not (or whose node or block appears twice).
	existing(l blocks.Layout) ([]planner.Assignment, []planner.Misfit)
	// pinned returns the blocks static allocations give to nodes.
	pinned(l blocks.Layout) map[string]uint64
	// withStatus returns a copy of the pool whose allocations are as, or left as they
	// are when as is nil, and whose common status fields are c.
	withStatus(l blocks.Layout, as []planner.Assignment, keep bool, c v1alpha1.PoolStatusCommon) pool
	common() v1alpha1.PoolStatusCommon
	allocationCount() int
	// hasNode reports whether status lists a block for node.
	hasNode(node string) bool
	// statusEqual compares the status of two pools, allocations as a set.
	statusEqual(o pool) bool
	// allocationsEqual compares the allocations only.
	allocationsEqual(o pool) bool
	// network is every address of the pool's subnet or cidr, when it parses.
	network() (iprange.Range, bool)
	// allocatedRanges are the address ranges of the blocks status lists.
	allocatedRanges() []iprange.Range
	// storeKey is the pool's key in the node daemon's store and annotation.
	storeKey() string
	// withRecords returns a copy whose status lists the records bs, then its
	// own entries the records do not say (see Delivery).
	withRecords(bs map[string]blockVal) pool
	// template is the pool's entry in PoolSpecs.
	template() nodeipamv1.PoolSpec
}

type ipPool struct{ p *v1alpha1.IPPool }

func (a ipPool) object() client.Object              { return a.p }
func (ipPool) kind() string                         { return "IPPool" }
func (a ipPool) validate() field.ErrorList          { return a.p.Validate() }
func (a ipPool) nodeSelector() *corev1.NodeSelector { return a.p.Spec.NodeSelector }
func (a ipPool) common() v1alpha1.PoolStatusCommon  { return a.p.Status.PoolStatusCommon }
func (a ipPool) allocationCount() int               { return len(a.p.Status.Allocations) }
func (a ipPool) hasNode(node string) bool {
	return slices.ContainsFunc(a.p.Status.Allocations, func(x v1alpha1.Allocation) bool { return x.NodeName == node })
}
func (ipPool) pinned(blocks.Layout) map[string]uint64 { return nil }

func (a ipPool) layout() (blocks.Layout, error) { return blocks.NewIPPool(&a.p.Spec) }

func (a ipPool) existing(l blocks.Layout) ([]planner.Assignment, []planner.Misfit) {
	layout := l.(*blocks.IPPool)
	var out []planner.Assignment
	var invalid []planner.Misfit
	seenNode, seenIdx := map[string]bool{}, map[uint64]bool{}
	for _, al := range a.p.Status.Allocations {
		start, err1 := netip.ParseAddr(al.StartIP)
		end, err2 := netip.ParseAddr(al.EndIP)
		var idx uint64
		ok := err1 == nil && err2 == nil
		if ok {
			idx, ok = layout.IndexOf(start, end)
		}
		if !ok || !layout.Usable(idx) || seenNode[al.NodeName] || seenIdx[idx] {
			m := planner.Misfit{Node: al.NodeName}
			if r, err := iprange.NewRange(start, end); err1 == nil && err2 == nil && err == nil {
				m.Range = r
			}
			invalid = append(invalid, m)
			continue
		}
		seenNode[al.NodeName], seenIdx[idx] = true, true
		out = append(out, planner.Assignment{Node: al.NodeName, Index: idx})
	}
	return out, invalid
}

func (a ipPool) withStatus(l blocks.Layout, as []planner.Assignment, keep bool, c v1alpha1.PoolStatusCommon) pool {
	p := a.p.DeepCopy()
	if !keep {
		p.Status.Allocations = make([]v1alpha1.Allocation, 0, len(as))
		for _, x := range as {
			b := l.Block(x.Index)
			p.Status.Allocations = append(p.Status.Allocations, v1alpha1.Allocation{
				NodeName: x.Node, StartIP: b.Start.String(), EndIP: b.End.String(),
			})
		}
	}
	p.Status.PoolStatusCommon = c
	return ipPool{p}
}

func (a ipPool) statusEqual(o pool) bool {
	return a.allocationsEqual(o) && commonEqual(a.p.Status.PoolStatusCommon, o.common())
}

func (a ipPool) allocationsEqual(o pool) bool {
	b := o.(ipPool).p
	return sameSet(a.p.Status.Allocations, b.Status.Allocations, func(x v1alpha1.Allocation) string { return x.NodeName })
}

func (a ipPool) network() (iprange.Range, bool) { return parseNetwork(a.p.Spec.Subnet) }
func (a ipPool) storeKey() string               { return v1alpha1.PoolKey(v1alpha1.KindIPPool, a.p.Name) }

func (a ipPool) allocatedRanges() []iprange.Range {
	var out []iprange.Range
	for _, al := range a.p.Status.Allocations {
		s, err1 := netip.ParseAddr(al.StartIP)
		e, err2 := netip.ParseAddr(al.EndIP)
		if err1 != nil || err2 != nil {
			continue
		}
		if r, err := iprange.NewRange(s, e); err == nil {
			out = append(out, r)
		}
	}
	return out
}

type cidrPool struct{ p *v1alpha1.CIDRPool }

func (a cidrPool) object() client.Object              { return a.p }
func (cidrPool) kind() string                         { return "CIDRPool" }
func (a cidrPool) validate() field.ErrorList          { return a.p.Validate() }
func (a cidrPool) nodeSelector() *corev1.NodeSelector { return a.p.Spec.NodeSelector }
func (a cidrPool) common() v1alpha1.PoolStatusCommon  { return a.p.Status.PoolStatusCommon }
func (a cidrPool) allocationCount() int               { return len(a.p.Status.Allocations) }

func (a cidrPool) hasNode(node string) bool {
	return slices.ContainsFunc(a.p.Status.Allocations, func(x v1alpha1.CIDRPoolAllocation) bool { return x.NodeName == node })
}

func (a cidrPool) layout() (blocks.Layout, error) { return blocks.NewCIDRPool(&a.p.Spec) }

func (a cidrPool) existing(l blocks.Layout) ([]planner.Assignment, []planner.Misfit) {
	layout := l.(*blocks.CIDRPool)
	var out []planner.Assignment
	var invalid []planner.Misfit
	seenNode, seenIdx := map[string]bool{}, map[uint64]bool{}
	for _, al := range a.p.Status.Allocations {
		p, err := netip.ParsePrefix(al.Prefix)
		var idx uint64
		ok := err == nil
		if ok {
			idx, ok = layout.IndexOf(p)
		}
		if ok && !layout.Usable(idx) {
			// A pinned prefix is valid only for the node it is pinned to.
			owner, pinned := layout.StaticOwner(p)
			ok = pinned && owner == al.NodeName
		}
		if !ok || seenNode[al.NodeName] || seenIdx[idx] {
			m := planner.Misfit{Node: al.NodeName}
			if err == nil {
				m.Range = iprange.PrefixRange(p)
			}
			invalid = append(invalid, m)
			continue
		}
		seenNode[al.NodeName], seenIdx[idx] = true, true
		out = append(out, planner.Assignment{Node: al.NodeName, Index: idx})
	}
	return out, invalid
}

func (a cidrPool) pinned(l blocks.Layout) map[string]uint64 {
	layout := l.(*blocks.CIDRPool)
	out := map[string]uint64{}
	for _, s := range a.p.Spec.StaticAllocations {
		if s.NodeName == "" {
			continue
		}
		if p, ok := layout.StaticFor(s.NodeName); ok {
			if idx, ok := layout.IndexOf(p); ok {
				out[s.NodeName] = idx
			}
		}
	}
	return out
}

func (a cidrPool) withStatus(l blocks.Layout, as []planner.Assignment, keep bool, c v1alpha1.PoolStatusCommon) pool {
	p := a.p.DeepCopy()
	if !keep {
		layout := l.(*blocks.CIDRPool)
		p.Status.Allocations = make([]v1alpha1.CIDRPoolAllocation, 0, len(as))
		for _, x := range as {
			prefix := layout.Prefix(x.Index)
			al := v1alpha1.CIDRPoolAllocation{NodeName: x.Node, Prefix: prefix.String()}
			if gw, ok := layout.Gateway(prefix); ok {
				al.Gateway = gw.String()
			}
			p.Status.Allocations = append(p.Status.Allocations, al)
		}
	}
	p.Status.PoolStatusCommon = c
	return cidrPool{p}
}

func (a cidrPool) statusEqual(o pool) bool {
	return a.allocationsEqual(o) && commonEqual(a.p.Status.PoolStatusCommon, o.common())
}

func (a cidrPool) allocationsEqual(o pool) bool {
	b := o.(cidrPool).p
	return sameSet(a.p.Status.Allocations, b.Status.Allocations, func(x v1alpha1.CIDRPoolAllocation) string { return x.NodeName })
}

func (a cidrPool) network() (iprange.Range, bool) { return parseNetwork(a.p.Spec.CIDR) }
func (a cidrPool) storeKey() string               { return v1alpha1.PoolKey(v1alpha1.KindCIDRPool, a.p.Name) }

func (a cidrPool) allocatedRanges() []iprange.Range {
	var out []iprange.Range
	for _, al := range a.p.Status.Allocations {
		if p, err := netip.ParsePrefix(al.Prefix); err == nil {
			out = append(out, iprange.PrefixRange(p))
		}
	}
	return out
}

func parseNetwork(s string) (iprange.Range, bool) {
	p, err := v1alpha1.ParsePrefix(s)
	if err != nil {
		return iprange.Range{}, false
	}
	return iprange.PrefixRange(p), true
}

// sameSet reports whether a and b hold the same elements, in any order.
func sameSet[T comparable](a, b []T, key func(T) string) bool {
	if len(a) != len(b) {
		return false
	}
	cmp := func(x, y T) int {
		kx, ky := key(x), key(y)
		switch {
		case kx < ky:
			return -1
		case kx > ky:
			return 1
		}
		return 0
	}
	sa, sb := slices.Clone(a), slices.Clone(b)
	slices.SortStableFunc(sa, cmp)
	slices.SortStableFunc(sb, cmp)
	return slices.Equal(sa, sb)
}

// blockVal is one node's block as status lists it: an IPPool's start and end, a
// CIDRPool's prefix and gateway.
type blockVal struct{ start, end, prefix, gateway string }

// withRecords returns a copy of the pool whose status lists the nodes' records
// bs first (sorted by node), then every entry of its own status that a record
// does not already say. existing() keeps the first entry of a node and of a
// block: a record wins over a status entry of the same node or of the same
// block, and the entry it overrides is a misfit, held for its node (a daemon that
// reads the status may have used it) and given to no one else.
func (a ipPool) withRecords(bs map[string]blockVal) pool {
	p := a.p.DeepCopy()
	p.Status.Allocations = make([]v1alpha1.Allocation, 0, len(bs)+len(a.p.Status.Allocations))
	for _, n := range slices.Sorted(maps.Keys(bs)) {
		p.Status.Allocations = append(p.Status.Allocations, v1alpha1.Allocation{NodeName: n, StartIP: bs[n].start, EndIP: bs[n].end})
	}
	for _, al := range a.p.Status.Allocations {
		if b, ok := bs[al.NodeName]; ok && b.start == al.StartIP && b.end == al.EndIP {
			continue
		}
		p.Status.Allocations = append(p.Status.Allocations, al)
	}
	return ipPool{p}
}

func (a cidrPool) withRecords(bs map[string]blockVal) pool {
	p := a.p.DeepCopy()
	p.Status.Allocations = make([]v1alpha1.CIDRPoolAllocation, 0, len(bs)+len(a.p.Status.Allocations))
	for _, n := range slices.Sorted(maps.Keys(bs)) {
		p.Status.Allocations = append(p.Status.Allocations, v1alpha1.CIDRPoolAllocation{NodeName: n, Prefix: bs[n].prefix, Gateway: bs[n].gateway})
	}
	for _, al := range a.p.Status.Allocations {
		if b, ok := bs[al.NodeName]; ok && b.prefix == al.Prefix && b.gateway == al.Gateway {
			continue
		}
		p.Status.Allocations = append(p.Status.Allocations, al)
	}
	return cidrPool{p}
}

// template returns the pool's entry in PoolSpecs: its name, UID, rail and spec
// (without what concerns particular nodes).
func (a ipPool) template() nodeipamv1.PoolSpec {
	spec := a.p.Spec.DeepCopy()
	spec.NodeSelector = nil
	return nodeipamv1.PoolSpec{Kind: v1alpha1.KindIPPool, Pool: a.p.Name, PoolUID: a.p.UID, Generation: a.p.Generation,
		Rail: a.p.Labels[v1alpha1.LabelRail], IPPool: spec}
}

func (a cidrPool) template() nodeipamv1.PoolSpec {
	spec := a.p.Spec.DeepCopy()
	spec.NodeSelector, spec.StaticAllocations = nil, nil
	return nodeipamv1.PoolSpec{Kind: v1alpha1.KindCIDRPool, Pool: a.p.Name, PoolUID: a.p.UID, Generation: a.p.Generation,
		Rail: a.p.Labels[v1alpha1.LabelRail], CIDRPool: spec}
}
