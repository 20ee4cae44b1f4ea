// Package blocks is the layout of a pool's per-node blocks: where block i of an
// IPPool or prefix i of a CIDRPool lies, whether an assigned block still fits the
// spec, and which blocks are unusable. It is pure: no I/O, no clients.
//
// IPPool layout (nv-ipam's): the usable range of the subnet (iprange.Usable) is cut
// into consecutive blocks of perNodeBlockSize addresses, starting at its first
// address; a partial block at the end is not used.
//
//	10.0.0.0/24, perNodeBlockSize 10:
//	  .0 (network) | .1-.10 block 0 | .11-.20 block 1 | ... | .241-.250 block 24 | .251-.254 unused | .255
//
// CIDRPool layout: prefix i is the i-th perNodeNetworkPrefix-long prefix of cidr.
package blocks

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// maxIndex bounds block indexes to what a uint64 holds; an IPv6 pool with more
// blocks than that is treated as having 2^63 of them, far more than any cluster.
const maxIndex = uint64(1) << 63

// Layout is the block layout of one pool of either kind.
type Layout interface {
	// Count is the number of blocks in the pool.
	Count() uint64
	// Block returns block i; i < Count.
	Block(i uint64) iprange.Range
	// Usable reports whether block i may be assigned: it is not entirely excluded
	// and not reserved.
	Usable(i uint64) bool
	// NextUsable returns the first usable block index >= i, jumping over excluded
	// stretches in one step each, so that a huge exclusion costs nothing.
	NextUsable(i uint64) (uint64, bool)
	// Range is every address the pool spans, for overlap checks.
	Range() iprange.Range
}

// IPPool is the layout of an IPPool.
type IPPool struct {
	usable     iprange.Range
	size       uint64
	count      uint64
	exclusions []iprange.Range
	network    iprange.Range
}

// NewIPPool builds the layout of a validated IPPool spec.
func NewIPPool(spec *v1alpha1.IPPoolSpec) (*IPPool, error) {
	subnet, err := v1alpha1.ParsePrefix(spec.Subnet)
	if err != nil {
		return nil, fmt.Errorf("subnet %q: %w", spec.Subnet, err)
	}
	if spec.PerNodeBlockSize < 1 {
		return nil, fmt.Errorf("perNodeBlockSize %d: must be at least 1", spec.PerNodeBlockSize)
	}
	l := &IPPool{usable: iprange.Usable(subnet), size: uint64(spec.PerNodeBlockSize), network: iprange.PrefixRange(subnet)}
	n, _ := l.usable.Size().Div64(l.size)
	l.count = capIndex(n)
	if l.exclusions, err = parseExclusions(spec.Exclusions); err != nil {
		return nil, err
	}
	return l, nil
}

// Count implements Layout.
func (l *IPPool) Count() uint64 { return l.count }

// Block implements Layout.
func (l *IPPool) Block(i uint64) iprange.Range {
	off, _ := iprange.U64(i).Mul64(l.size)
	start, _ := iprange.Add(l.usable.Start, off)
	end, _ := iprange.Add(start, iprange.U64(l.size-1))
	return iprange.Range{Start: start, End: end}
}

// Usable implements Layout.
func (l *IPPool) Usable(i uint64) bool { return !coveredBy(l.Block(i), l.exclusions) }

// Range implements Layout.
func (l *IPPool) Range() iprange.Range { return l.network }

// NextUsable implements Layout.
func (l *IPPool) NextUsable(i uint64) (uint64, bool) {
	for i < l.count {
		e, ok := coveringExclusion(l.Block(i), l.exclusions)
		if !ok {
			return i, true
		}
		// The block holding e.End+1, the first address past the exclusion.
		past, _ := iprange.Distance(l.usable.Start, e.End).Add(iprange.U64(1))
		q, _ := past.Div64(l.size)
		if !q.IsUint64() || q.Lo >= l.count {
			return 0, false
		}
		i = max(q.Lo, i+1)
	}
	return 0, false
}

// IndexOf returns the index of the block that starts at start and ends at end, and
// false when no block of this layout is exactly that range.
func (l *IPPool) IndexOf(start, end netip.Addr) (uint64, bool) {
	if !l.usable.Contains(start) || !l.usable.Contains(end) {
		return 0, false
	}
	q, r := iprange.Distance(l.usable.Start, start).Div64(l.size)
	if r != 0 || !q.IsUint64() || q.Lo >= l.count {
		return 0, false
	}
	return q.Lo, l.Block(q.Lo).End == end
}

// CIDRPool is the layout of a CIDRPool.
type CIDRPool struct {
	cidr        netip.Prefix
	perNode     int
	count       uint64
	exclusions  []iprange.Range
	reserved    map[netip.Prefix]string // static allocations: prefix -> node ("" = nobody)
	gatewayIdx  *int32
	staticGWs   map[netip.Prefix]netip.Addr
	staticNodes map[string]netip.Prefix
}

// NewCIDRPool builds the layout of a validated CIDRPool spec.
func NewCIDRPool(spec *v1alpha1.CIDRPoolSpec) (*CIDRPool, error) {
	cidr, err := v1alpha1.ParsePrefix(spec.CIDR)
	if err != nil {
		return nil, fmt.Errorf("cidr %q: %w", spec.CIDR, err)
	}
	perNode := int(spec.PerNodeNetworkPrefix)
	if perNode < cidr.Bits() || perNode > cidr.Addr().BitLen() {
		return nil, fmt.Errorf("perNodeNetworkPrefix %d: must be between %d and %d", perNode, cidr.Bits(), cidr.Addr().BitLen())
	}
	l := &CIDRPool{
		cidr: cidr, perNode: perNode, gatewayIdx: spec.GatewayIndex,
		reserved: map[netip.Prefix]string{}, staticGWs: map[netip.Prefix]netip.Addr{}, staticNodes: map[string]netip.Prefix{},
	}
	if perNode-cidr.Bits() >= 63 {
		l.count = maxIndex
	} else {
		l.count = capIndex(iprange.Pow2(perNode - cidr.Bits()))
	}
	if l.exclusions, err = parseExclusions(spec.Exclusions); err != nil {
		return nil, err
	}
	for _, s := range spec.StaticAllocations {
		p, err := netip.ParsePrefix(s.Prefix)
		if err != nil || p.Bits() != perNode || !cidr.Contains(p.Addr()) {
			return nil, fmt.Errorf("staticAllocations prefix %q: not a /%d of %s", s.Prefix, perNode, cidr)
		}
		p = p.Masked()
		l.reserved[p] = s.NodeName
		if s.NodeName != "" {
			l.staticNodes[s.NodeName] = p
		}
		if s.Gateway != "" {
			gw, err := v1alpha1.ParseAddr(s.Gateway)
			if err != nil || !p.Contains(gw) {
				return nil, fmt.Errorf("staticAllocations gateway %q: not an address in %s", s.Gateway, p)
			}
			l.staticGWs[p] = gw
		}
	}
	return l, nil
}

// Count implements Layout.
func (l *CIDRPool) Count() uint64 { return l.count }

// Prefix returns prefix i; i < Count.
func (l *CIDRPool) Prefix(i uint64) netip.Prefix {
	hostBits := uint(l.cidr.Addr().BitLen() - l.perNode)
	start, _ := iprange.Add(l.cidr.Addr(), iprange.U64(i).Lsh(hostBits))
	return netip.PrefixFrom(start, l.perNode)
}

// Block implements Layout: every address of prefix i.
func (l *CIDRPool) Block(i uint64) iprange.Range { return iprange.PrefixRange(l.Prefix(i)) }

// Usable implements Layout: the prefix is neither entirely excluded nor pinned by
// a static allocation (static prefixes go only to their node, see StaticFor).
func (l *CIDRPool) Usable(i uint64) bool {
	p := l.Prefix(i)
	if _, pinned := l.reserved[p]; pinned {
		return false
	}
	return !coveredBy(iprange.Usable(p), l.exclusions)
}

// Range implements Layout.
func (l *CIDRPool) Range() iprange.Range { return iprange.PrefixRange(l.cidr) }

// NextUsable implements Layout.
func (l *CIDRPool) NextUsable(i uint64) (uint64, bool) {
	hostBits := uint(l.cidr.Addr().BitLen() - l.perNode)
	for i < l.count {
		p := l.Prefix(i)
		if _, pinned := l.reserved[p]; pinned {
			i++
			continue
		}
		e, ok := coveringExclusion(iprange.Usable(p), l.exclusions)
		if !ok {
			return i, true
		}
		// The prefix holding e.End+1, the first address past the exclusion.
		past, overflow := iprange.Distance(l.cidr.Addr(), e.End).Add(iprange.U64(1))
		q := past.Rsh(hostBits)
		if overflow || !q.IsUint64() || q.Lo >= l.count {
			return 0, false
		}
		i = max(q.Lo, i+1)
	}
	return 0, false
}

// IndexOf returns the index of prefix p, false when p is not one of this layout's.
func (l *CIDRPool) IndexOf(p netip.Prefix) (uint64, bool) {
	if p.Bits() != l.perNode || p != p.Masked() || !l.cidr.Contains(p.Addr()) {
		return 0, false
	}
	hostBits := uint(l.cidr.Addr().BitLen() - l.perNode)
	q := iprange.Distance(l.cidr.Addr(), p.Addr()).Rsh(hostBits)
	if !q.IsUint64() || q.Lo >= l.count {
		return 0, false
	}
	return q.Lo, true
}

// StaticFor returns the prefix a static allocation pins to node, if any.
func (l *CIDRPool) StaticFor(node string) (netip.Prefix, bool) {
	p, ok := l.staticNodes[node]
	return p, ok
}

// StaticOwner returns the node a static allocation pins p to ("" for a reservation)
// and whether p is pinned at all.
func (l *CIDRPool) StaticOwner(p netip.Prefix) (string, bool) {
	n, ok := l.reserved[p]
	return n, ok
}

// Gateway returns the gateway of prefix p: the static allocation's, else the
// address at gatewayIndex, else none.
func (l *CIDRPool) Gateway(p netip.Prefix) (netip.Addr, bool) {
	if gw, ok := l.staticGWs[p]; ok {
		return gw, true
	}
	if l.gatewayIdx == nil {
		return netip.Addr{}, false
	}
	gw, ok := iprange.Add(p.Addr(), iprange.U64(uint64(*l.gatewayIdx)))
	if !ok || !p.Contains(gw) {
		return netip.Addr{}, false
	}
	return gw, true
}

func parseExclusions(excl []v1alpha1.ExcludeRange) ([]iprange.Range, error) {
	out := make([]iprange.Range, 0, len(excl))
	for _, e := range excl {
		s, err1 := v1alpha1.ParseAddr(e.StartIP)
		en, err2 := v1alpha1.ParseAddr(e.EndIP)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("exclusion %s-%s: not a pair of IP addresses", e.StartIP, e.EndIP)
		}
		r, err := iprange.NewRange(s, en)
		if err != nil {
			return nil, fmt.Errorf("exclusion: %w", err)
		}
		out = append(out, r)
	}
	return iprange.Merge(out), nil
}

// coveredBy reports whether every address of r is in the union of the merged,
// sorted ranges excl.
func coveredBy(r iprange.Range, excl []iprange.Range) bool {
	_, ok := coveringExclusion(r, excl)
	return ok
}

// coveringExclusion returns the merged exclusion that covers all of r.
func coveringExclusion(r iprange.Range, excl []iprange.Range) (iprange.Range, bool) {
	i, _ := slices.BinarySearchFunc(excl, r.Start, func(e iprange.Range, a netip.Addr) int {
		if e.End.Less(a) {
			return -1
		}
		return 1
	})
	if i < len(excl) && excl[i].Covers(r) {
		return excl[i], true
	}
	return iprange.Range{}, false
}

func capIndex(n iprange.U128) uint64 {
	if !n.IsUint64() || n.Lo > maxIndex {
		return maxIndex
	}
	return n.Lo
}
