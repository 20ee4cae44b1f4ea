package v1alpha1

import (
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/hwipam/hwipam/pkg/iprange"
)

// Validate checks an IPPool's spec. It is the one place IPPool validation lives: the
// admission webhook and the controller both call it. Each error names the field.
func (p *IPPool) Validate() field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	subnet, err := ParsePrefix(p.Spec.Subnet)
	if err != nil {
		errs = append(errs, field.Invalid(spec.Child("subnet"), p.Spec.Subnet, err.Error()))
	}
	if p.Spec.PerNodeBlockSize < 1 {
		errs = append(errs, field.Invalid(spec.Child("perNodeBlockSize"), p.Spec.PerNodeBlockSize,
			"must be at least 1"))
	}
	errs = append(errs, validateNodeSelector(p.Spec.NodeSelector, spec.Child("nodeSelector"))...)
	if p.Spec.DefaultGateway && p.Spec.Gateway == "" {
		errs = append(errs, field.Required(spec.Child("gateway"), "defaultGateway needs a gateway"))
	}
	if !subnet.IsValid() {
		return errs
	}
	usable := iprange.Usable(subnet)
	if p.Spec.PerNodeBlockSize >= 1 && usable.Size().Cmp(iprange.U64(uint64(p.Spec.PerNodeBlockSize))) < 0 {
		errs = append(errs, field.Invalid(spec.Child("perNodeBlockSize"), p.Spec.PerNodeBlockSize,
			fmt.Sprintf("larger than the %s usable addresses of subnet %s", usable.Size(), subnet)))
	}
	if p.Spec.Gateway != "" {
		errs = append(errs, validateAddrIn(p.Spec.Gateway, subnet, "subnet", spec.Child("gateway"))...)
	}
	errs = append(errs, validateExclusions(p.Spec.Exclusions, subnet, spec.Child("exclusions"))...)
	if p.Spec.PerNodeBlockSize >= 1 {
		errs = append(errs, validateIndexExclusions(p.Spec.PerNodeExclusions, iprange.U64(uint64(p.Spec.PerNodeBlockSize)),
			spec.Child("perNodeExclusions"))...)
	}
	errs = append(errs, validateRoutes(p.Spec.Routes, subnet, spec.Child("routes"))...)
	return errs
}

// Validate checks a CIDRPool's spec; see IPPool.Validate.
func (p *CIDRPool) Validate() field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	cidr, err := ParsePrefix(p.Spec.CIDR)
	if err != nil {
		errs = append(errs, field.Invalid(spec.Child("cidr"), p.Spec.CIDR, err.Error()))
	}
	errs = append(errs, validateNodeSelector(p.Spec.NodeSelector, spec.Child("nodeSelector"))...)
	if p.Spec.DefaultGateway && p.Spec.GatewayIndex == nil {
		errs = append(errs, field.Required(spec.Child("gatewayIndex"), "defaultGateway needs a gatewayIndex"))
	}
	if !cidr.IsValid() {
		return errs
	}
	perNode := int(p.Spec.PerNodeNetworkPrefix)
	prefixPath := spec.Child("perNodeNetworkPrefix")
	if perNode < max(cidr.Bits(), 1) || perNode > cidr.Addr().BitLen() {
		errs = append(errs, field.Invalid(prefixPath, p.Spec.PerNodeNetworkPrefix,
			fmt.Sprintf("must be between the prefix length of cidr (%d, at least 1) and %d", cidr.Bits(), cidr.Addr().BitLen())))
		return errs
	}
	hostBits := cidr.Addr().BitLen() - perNode
	perNodeSize := iprange.Pow2(hostBits)
	if gi := p.Spec.GatewayIndex; gi != nil {
		sample := netip.PrefixFrom(cidr.Addr(), perNode)
		gw, ok := iprange.Add(sample.Addr(), iprange.U64(uint64(max(*gi, 0))))
		switch {
		case *gi < 0 || !ok || !sample.Contains(gw):
			errs = append(errs, field.Invalid(spec.Child("gatewayIndex"), *gi,
				fmt.Sprintf("must be an index inside a /%d prefix (0 to %s)", perNode, mustSub1(perNodeSize))))
		case !iprange.Usable(sample).Contains(gw):
			errs = append(errs, field.Invalid(spec.Child("gatewayIndex"), *gi,
				fmt.Sprintf("is the network or broadcast address of a /%d prefix", perNode)))
		}
	}
	errs = append(errs, validateExclusions(p.Spec.Exclusions, cidr, spec.Child("exclusions"))...)
	errs = append(errs, validateIndexExclusions(p.Spec.PerNodeExclusions, perNodeSize, spec.Child("perNodeExclusions"))...)
	errs = append(errs, validateStaticAllocations(p.Spec.StaticAllocations, cidr, perNode, spec.Child("staticAllocations"))...)
	errs = append(errs, validateRoutes(p.Spec.Routes, cidr, spec.Child("routes"))...)
	return errs
}

// ParsePrefix parses a pool's subnet or cidr. Like nv-ipam it accepts host bits
// ("10.0.0.5/24" means 10.0.0.0/24), and returns the masked prefix.
func ParsePrefix(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("required: a network in CIDR notation such as 10.0.0.0/16 or fd00::/64")
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not a network in CIDR notation such as 10.0.0.0/16 or fd00::/64")
	}
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("IPv4-mapped IPv6 and zoned addresses are not supported")
	}
	return p.Masked(), nil
}

// ParseAddr parses an address of a pool spec, refusing zones and IPv4-mapped IPv6.
func ParseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("not an IP address")
	}
	if a.Is4In6() || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("IPv4-mapped IPv6 and zoned addresses are not supported")
	}
	return a, nil
}

func validateAddrIn(s string, p netip.Prefix, what string, path *field.Path) field.ErrorList {
	a, err := ParseAddr(s)
	if err != nil {
		return field.ErrorList{field.Invalid(path, s, err.Error())}
	}
	if !p.Contains(a) {
		return field.ErrorList{field.Invalid(path, s, fmt.Sprintf("outside the %s %s", what, p))}
	}
	return nil
}

func validateNodeSelector(ns *corev1.NodeSelector, path *field.Path) field.ErrorList {
	if ns == nil {
		return nil
	}
	if len(ns.NodeSelectorTerms) == 0 {
		return field.ErrorList{field.Required(path.Child("nodeSelectorTerms"),
			"at least one term; leave nodeSelector out to select every node")}
	}
	_, err := nodeaffinity.NewNodeSelector(ns, field.WithPath(path))
	if err == nil {
		return nil
	}
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		return field.ErrorList{field.Invalid(path, "", err.Error())}
	}
	var out field.ErrorList
	for _, e := range agg.Errors() {
		var fe *field.Error
		if errors.As(e, &fe) {
			out = append(out, fe)
		} else {
			out = append(out, field.Invalid(path, "", e.Error()))
		}
	}
	return out
}

func validateExclusions(excl []ExcludeRange, p netip.Prefix, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, e := range excl {
		ip := path.Index(i)
		startErrs := validateAddrIn(e.StartIP, p, "network", ip.Child("startIP"))
		endErrs := validateAddrIn(e.EndIP, p, "network", ip.Child("endIP"))
		errs = append(errs, startErrs...)
		errs = append(errs, endErrs...)
		if len(startErrs) == 0 && len(endErrs) == 0 {
			s, _ := ParseAddr(e.StartIP)
			en, _ := ParseAddr(e.EndIP)
			if en.Less(s) {
				errs = append(errs, field.Invalid(ip.Child("endIP"), e.EndIP, "before startIP "+e.StartIP))
			}
		}
	}
	return errs
}

func validateIndexExclusions(excl []ExcludeIndexRange, size iprange.U128, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, e := range excl {
		ip := path.Index(i)
		if e.StartIndex < 0 {
			errs = append(errs, field.Invalid(ip.Child("startIndex"), e.StartIndex, "must not be negative"))
		}
		if e.EndIndex < e.StartIndex {
			errs = append(errs, field.Invalid(ip.Child("endIndex"), e.EndIndex, "must not be below startIndex"))
		}
		if e.EndIndex >= 0 && size.Cmp(iprange.U64(uint64(e.EndIndex))) <= 0 {
			errs = append(errs, field.Invalid(ip.Child("endIndex"), e.EndIndex,
				fmt.Sprintf("outside a node's block of %s addresses (indexes 0 to %s)", size, mustSub1(size))))
		}
	}
	return errs
}

func validateStaticAllocations(static []CIDRPoolStaticAllocation, cidr netip.Prefix, perNode int,
	path *field.Path) field.ErrorList {
	var errs field.ErrorList
	prefixes := map[netip.Prefix]int{}
	nodes := map[string]int{}
	for i, s := range static {
		ip := path.Index(i)
		p, err := netip.ParsePrefix(s.Prefix)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(ip.Child("prefix"), s.Prefix, "not a prefix in CIDR notation"))
			continue
		case p != p.Masked():
			errs = append(errs, field.Invalid(ip.Child("prefix"), s.Prefix,
				"has host bits set; write the network address, "+p.Masked().String()))
			continue
		case p.Bits() != perNode:
			errs = append(errs, field.Invalid(ip.Child("prefix"), s.Prefix,
				fmt.Sprintf("must be a /%d (perNodeNetworkPrefix)", perNode)))
			continue
		case !cidr.Overlaps(p) || p.Addr().Is4() != cidr.Addr().Is4():
			errs = append(errs, field.Invalid(ip.Child("prefix"), s.Prefix, "outside cidr "+cidr.String()))
			continue
		}
		if j, dup := prefixes[p]; dup {
			errs = append(errs, field.Duplicate(ip.Child("prefix"), s.Prefix+fmt.Sprintf(" (also at index %d)", j)))
		}
		prefixes[p] = i
		if s.NodeName != "" {
			if j, dup := nodes[s.NodeName]; dup {
				errs = append(errs, field.Duplicate(ip.Child("nodeName"), s.NodeName+fmt.Sprintf(" (also at index %d)", j)))
			}
			nodes[s.NodeName] = i
		}
		if s.Gateway != "" {
			errs = append(errs, validateAddrIn(s.Gateway, p, "prefix", ip.Child("gateway"))...)
		}
	}
	return errs
}

func validateRoutes(routes []Route, p netip.Prefix, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, r := range routes {
		dst, err := netip.ParsePrefix(r.Dst)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path.Index(i).Child("dst"), r.Dst, "not a destination in CIDR notation"))
		case dst.Addr().Is4() != p.Addr().Is4():
			errs = append(errs, field.Invalid(path.Index(i).Child("dst"), r.Dst,
				"not of the pool's address family ("+p.String()+")"))
		}
	}
	return errs
}

func mustSub1(u iprange.U128) iprange.U128 {
	d, _ := u.Sub(iprange.U64(1))
	return d
}
