package nodealloc

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// PoolConfig is one pool's block on this node, parsed once at the edge.
type PoolConfig struct {
	Name string
	Kind string
	// Prefix is the network handed out with each address: the IPPool's subnet or
	// the node's CIDRPool prefix.
	Prefix netip.Prefix
	// Block is the range addresses come from. allocate_ip_with_index counts from
	// its first address, as nv-ipam does: the IPPool block's start, or the first
	// usable address of the CIDRPool prefix (network+1, the network address itself
	// for /31, /32, /127 and /128).
	Block iprange.Range
	// Gateway is the gateway returned with each address; invalid when none.
	Gateway netip.Addr
	// Exclusions are absolute ranges never handed out, per-node index exclusions
	// already turned into addresses.
	Exclusions []iprange.Range
	// ExclusionBase is the address index 0 of perNodeExclusions counts from: the
	// block's first address for an IPPool, the prefix's network address for a
	// CIDRPool. It differs from the allocation index base for a CIDRPool:
	//
	//	CIDRPool 10.0.0.0/24    .0    .1    .2   ...  .254  .255
	//	perNodeExclusions       0     1     2         254   (255)
	//	allocate_ip_with_index        0     1         253
	ExclusionBase netip.Addr
	// Routes are returned with each address; DefaultGateway adds 0.0.0.0/0 or ::/0.
	Routes         []netip.Prefix
	DefaultGateway bool
}

// Key is the pool's store key.
func (c *PoolConfig) Key() string { return v1alpha1.PoolKey(c.Kind, c.Name) }

// Equal reports whether two configs describe the same block.
func (c *PoolConfig) Equal(o *PoolConfig) bool {
	return c.Name == o.Name && c.Kind == o.Kind && c.Prefix == o.Prefix && c.Block == o.Block &&
		c.Gateway == o.Gateway && slices.Equal(c.Exclusions, o.Exclusions) && c.ExclusionBase == o.ExclusionBase &&
		slices.Equal(c.Routes, o.Routes) && c.DefaultGateway == o.DefaultGateway
}

// FromIPPool returns the node's block of an IPPool: nil when the pool lists no
// block for the node, an error when what it lists does not parse.
func FromIPPool(p *v1alpha1.IPPool, node string) (*PoolConfig, error) {
	i := slices.IndexFunc(p.Status.Allocations, func(a v1alpha1.Allocation) bool { return a.NodeName == node })
	if i < 0 {
		return nil, nil
	}
	al := &p.Status.Allocations[i]
	subnet, err := v1alpha1.ParsePrefix(p.Spec.Subnet)
	if err != nil {
		return nil, fmt.Errorf("IPPool %s: subnet %q: %w", p.Name, p.Spec.Subnet, err)
	}
	start, err1 := v1alpha1.ParseAddr(al.StartIP)
	end, err2 := v1alpha1.ParseAddr(al.EndIP)
	if err1 != nil || err2 != nil || !subnet.Contains(start) || !subnet.Contains(end) || end.Less(start) {
		return nil, fmt.Errorf("IPPool %s: block %s-%s of node %s is not a range in %s", p.Name, al.StartIP, al.EndIP, node, subnet)
	}
	c := &PoolConfig{Name: p.Name, Kind: v1alpha1.KindIPPool, Prefix: subnet, Block: iprange.Range{Start: start, End: end},
		ExclusionBase: start, DefaultGateway: p.Spec.DefaultGateway}
	if p.Spec.Gateway != "" {
		if c.Gateway, err = v1alpha1.ParseAddr(p.Spec.Gateway); err != nil {
			return nil, fmt.Errorf("IPPool %s: gateway %q: %w", p.Name, p.Spec.Gateway, err)
		}
	}
	if err := c.addCommon(p.Spec.Exclusions, p.Spec.PerNodeExclusions, p.Spec.Routes); err != nil {
		return nil, fmt.Errorf("IPPool %s: %w", p.Name, err)
	}
	return c, nil
}

// FromCIDRPool returns the node's prefix of a CIDRPool; see FromIPPool.
func FromCIDRPool(p *v1alpha1.CIDRPool, node string) (*PoolConfig, error) {
	i := slices.IndexFunc(p.Status.Allocations, func(a v1alpha1.CIDRPoolAllocation) bool { return a.NodeName == node })
	if i < 0 {
		return nil, nil
	}
	al := &p.Status.Allocations[i]
	prefix, err := netip.ParsePrefix(al.Prefix)
	if err != nil || prefix != prefix.Masked() {
		return nil, fmt.Errorf("CIDRPool %s: prefix %q of node %s is not a network in CIDR notation", p.Name, al.Prefix, node)
	}
	c := &PoolConfig{Name: p.Name, Kind: v1alpha1.KindCIDRPool, Prefix: prefix, Block: iprange.Usable(prefix),
		ExclusionBase: prefix.Addr(), DefaultGateway: p.Spec.DefaultGateway}
	if al.Gateway != "" {
		if c.Gateway, err = v1alpha1.ParseAddr(al.Gateway); err != nil || !prefix.Contains(c.Gateway) {
			return nil, fmt.Errorf("CIDRPool %s: gateway %q of node %s is not an address in %s", p.Name, al.Gateway, node, prefix)
		}
	}
	if err := c.addCommon(p.Spec.Exclusions, p.Spec.PerNodeExclusions, p.Spec.Routes); err != nil {
		return nil, fmt.Errorf("CIDRPool %s: %w", p.Name, err)
	}
	return c, nil
}

func (c *PoolConfig) addCommon(excl []v1alpha1.ExcludeRange, perNode []v1alpha1.ExcludeIndexRange, routes []v1alpha1.Route) error {
	for _, e := range excl {
		s, err1 := v1alpha1.ParseAddr(e.StartIP)
		en, err2 := v1alpha1.ParseAddr(e.EndIP)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("exclusion %s-%s: not a pair of addresses", e.StartIP, e.EndIP)
		}
		r, err := iprange.NewRange(s, en)
		if err != nil {
			return fmt.Errorf("exclusion: %w", err)
		}
		c.Exclusions = append(c.Exclusions, r)
	}
	for _, e := range perNode {
		if e.StartIndex < 0 || e.EndIndex < e.StartIndex {
			return fmt.Errorf("perNodeExclusions %d-%d: not an index range", e.StartIndex, e.EndIndex)
		}
		s, ok1 := iprange.Add(c.ExclusionBase, iprange.U64(uint64(e.StartIndex)))
		en, ok2 := iprange.Add(c.ExclusionBase, iprange.U64(uint64(e.EndIndex)))
		if !ok1 {
			continue
		}
		if !ok2 {
			en = c.Block.End
		}
		c.Exclusions = append(c.Exclusions, iprange.Range{Start: s, End: en})
	}
	for _, r := range routes {
		dst, err := netip.ParsePrefix(r.Dst)
		if err != nil {
			return fmt.Errorf("route %q: not a destination in CIDR notation", r.Dst)
		}
		c.Routes = append(c.Routes, dst.Masked())
	}
	return nil
}

// storedConfig is PoolConfig as the store keeps it (strings, so the file stays
// readable and independent of Go's encodings of netip types).
type storedConfig struct {
	Name       string      `json:"name"`
	Kind       string      `json:"kind"`
	Prefix     string      `json:"prefix"`
	Start      string      `json:"start"`
	End        string      `json:"end"`
	Gateway    string      `json:"gateway,omitempty"`
	Exclusions [][2]string `json:"exclusions,omitempty"`
	// IndexBase is ExclusionBase, under the name older daemons read.
	IndexBase      string   `json:"indexBase"`
	Routes         []string `json:"routes,omitempty"`
	DefaultGateway bool     `json:"defaultGateway,omitempty"`
}

// MarshalConfig encodes a config for the store.
func MarshalConfig(c *PoolConfig) (json.RawMessage, error) {
	s := storedConfig{Name: c.Name, Kind: c.Kind, Prefix: c.Prefix.String(), Start: c.Block.Start.String(),
		End: c.Block.End.String(), IndexBase: c.ExclusionBase.String(), DefaultGateway: c.DefaultGateway}
	if c.Gateway.IsValid() {
		s.Gateway = c.Gateway.String()
	}
	for _, e := range c.Exclusions {
		s.Exclusions = append(s.Exclusions, [2]string{e.Start.String(), e.End.String()})
	}
	for _, r := range c.Routes {
		s.Routes = append(s.Routes, r.String())
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding pool %s: %w", c.Key(), err)
	}
	return b, nil
}

// UnmarshalConfig decodes a config from the store.
func UnmarshalConfig(data json.RawMessage) (*PoolConfig, error) {
	var s storedConfig
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decoding stored pool: %w", err)
	}
	c := &PoolConfig{Name: s.Name, Kind: s.Kind, DefaultGateway: s.DefaultGateway}
	var err error
	bad := func(what, v string, e error) error {
		return fmt.Errorf("stored pool %s: %s %q: %w", s.Name, what, v, e)
	}
	if c.Prefix, err = netip.ParsePrefix(s.Prefix); err != nil {
		return nil, bad("prefix", s.Prefix, err)
	}
	if c.Block.Start, err = netip.ParseAddr(s.Start); err != nil {
		return nil, bad("start", s.Start, err)
	}
	if c.Block.End, err = netip.ParseAddr(s.End); err != nil {
		return nil, bad("end", s.End, err)
	}
	if c.ExclusionBase, err = netip.ParseAddr(s.IndexBase); err != nil {
		return nil, bad("indexBase", s.IndexBase, err)
	}
	if s.Gateway != "" {
		if c.Gateway, err = netip.ParseAddr(s.Gateway); err != nil {
			return nil, bad("gateway", s.Gateway, err)
		}
	}
	for _, e := range s.Exclusions {
		a, err1 := netip.ParseAddr(e[0])
		b, err2 := netip.ParseAddr(e[1])
		if err1 != nil || err2 != nil {
			return nil, bad("exclusion", e[0]+"-"+e[1], fmt.Errorf("not a pair of addresses"))
		}
		c.Exclusions = append(c.Exclusions, iprange.Range{Start: a, End: b})
	}
	for _, r := range s.Routes {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, bad("route", r, err)
		}
		c.Routes = append(c.Routes, p)
	}
	return c, nil
}
