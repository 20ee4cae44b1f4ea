package ipamnode

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/rails"
	"github.com/hwipam/hwipam/pkg/store"
)

// The NIC ports the CNI path and the host use, told to the DRA driver so that it
// does not hand them to claims (nicdra.PortUse), and the ports the driver's
// claims hold, told to the CNI path so that it refuses them
// (nodeservice.Ports).

// portsInUse returns the ports CNI allocations use, by PCI address: the ports
// each recorded at allocation (store.Allocation.Port and Ports: both ports of
// a bond master), else, for one made
// before ports were recorded, its deviceID when that is a PCI address (SR-IOV,
// host-device). The DRA driver's own allocations are not uses. One pass over
// the store: run when the driver publishes (every 10 s, and when an
// allocation that names a device changed), never per CNI call.
func portsInUse(m *nodealloc.Manager) map[string]string {
	out := map[string]string{}
	_ = m.EachAllocation("", func(_ string, a store.Allocation) error {
		if nicdra.OwnedByDRA(a) {
			return nil
		}
		ports := a.UsedPorts()
		if len(ports) == 0 && rails.IsPCIAddress(a.DeviceID) {
			ports = []string{a.DeviceID}
		}
		for _, port := range ports {
			if _, ok := out[port]; !ok {
				who := fmt.Sprintf("pod %s/%s", a.PodNamespace, a.PodName)
				if a.Network != "" {
					who += " (network " + a.Network + ")"
				}
				out[port] = who
			}
		}
		return nil
	})
	return out
}

// hostPorts returns the links of h's network namespace (the host's) that carry
// its own addresses or routes, by name: why. Counted are a global unicast
// address (not a link-local or loopback one), a default route, and a route
// through a gateway or one set up by other than the kernel (the kernel's own
// routes follow from the addresses, and every IPv6 link has fe80::/64), in
// any routing table but the local one; and a link below one that carries any
// of those, at any depth, or a port of Open vSwitch (see uplinks).
func hostPorts(h *netlink.Handle) (map[string]string, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	why := map[int]string{}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() && why[a.LinkIndex] == "" {
			why[a.LinkIndex] = "carries the host address " + a.IPNet.String()
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	for _, r := range routes {
		if r.Table == unix.RT_TABLE_LOCAL || r.Type != unix.RTN_UNICAST {
			continue
		}
		var reason string
		switch {
		case isDefault(r.Dst):
			reason = "carries the host's default route"
		case r.Gw != nil || r.Protocol != unix.RTPROT_KERNEL:
			reason = "carries the host's route to " + r.Dst.String()
		default:
			continue
		}
		idx := []int{r.LinkIndex}
		for _, nh := range r.MultiPath {
			idx = append(idx, nh.LinkIndex)
		}
		for _, i := range idx {
			// A default route says more than an address.
			if i > 0 && (why[i] == "" || isDefault(r.Dst)) {
				why[i] = reason
			}
		}
	}
	return uplinks(links, why), nil
}

// stackedKinds are the link kinds that sit on a parent link (IFLA_LINK): the
// parent carries their traffic, so what they carry, it does. (A veth's link is
// its peer, which is not stacked on it.)
var stackedKinds = map[string]bool{"vlan": true, "macvlan": true, "macvtap": true, "ipvlan": true, "ipvtap": true,
	"vxlan": true, "ipoib": true}

// uplinks returns, by name, the links that carry the host's addresses or
// routes (why, by index), and those below such a link at any depth: enslaved
// to a bond or bridge, the parent of a VLAN, macvlan or the like, or any chain
// of those (port → bond → VLAN with the host's address). A port of Open
// vSwitch (its master is ovs-system) is counted too: which OVS bridge uses it
// cannot be read from the kernel's links, and an OVS bridge commonly carries
// the node's address (br-ex on OpenShift).
func uplinks(links []netlink.Link, why map[int]string) map[string]string {
	byIndex := make(map[int]netlink.Link, len(links))
	uppers := map[int][]int{} // index → the links directly above it
	for _, l := range links {
		a := l.Attrs()
		byIndex[a.Index] = l
	}
	for _, l := range links {
		a := l.Attrs()
		if _, ok := byIndex[a.MasterIndex]; ok && a.MasterIndex != a.Index {
			uppers[a.Index] = append(uppers[a.Index], a.MasterIndex)
		}
		if _, ok := byIndex[a.ParentIndex]; ok && a.ParentIndex != a.Index && stackedKinds[l.Type()] {
			uppers[a.ParentIndex] = append(uppers[a.ParentIndex], a.Index)
		}
	}
	name := func(i int) string { return byIndex[i].Attrs().Name }
	out := map[string]string{}
	for _, l := range links {
		a := l.Attrs()
		if why[a.Index] != "" {
			out[a.Name] = why[a.Index]
			continue
		}
		// The nearest link above that carries something, breadth first, with
		// the path to it.
		type step struct {
			index int
			path  []int
		}
		seen := map[int]bool{a.Index: true}
		queue := []step{{a.Index, []int{a.Index}}}
		var ovs string
		for len(queue) > 0 && out[a.Name] == "" {
			s := queue[0]
			queue = queue[1:]
			for _, u := range uppers[s.index] {
				if seen[u] {
					continue
				}
				seen[u] = true
				path := append(slices.Clone(s.path), u)
				if byIndex[u].Type() == "openvswitch" && ovs == "" {
					ovs = name(u)
				}
				if why[u] == "" {
					queue = append(queue, step{u, path})
					continue
				}
				out[a.Name] = aboveReason(byIndex, path, why[u])
				break
			}
		}
		if out[a.Name] == "" && ovs != "" {
			out[a.Name] = "is a port of Open vSwitch (under " + ovs + "): whether an OVS bridge that uses it carries the " +
				"host's addresses cannot be read from the kernel's links, so it is withheld; take it out of OVS to hand it to claims"
		}
	}
	return out
}

// aboveReason says why a link (path[0]) is the host's: the link at the end of
// path, above it, carries what why says.
func aboveReason(byIndex map[int]netlink.Link, path []int, why string) string {
	first, top := byIndex[path[0]].Attrs(), byIndex[path[len(path)-1]].Attrs()
	if len(path) == 2 {
		if first.MasterIndex == top.Index {
			return "is enslaved to " + top.Name + ", which " + why
		}
		return "has " + top.Name + " (" + byIndex[top.Index].Type() + ") on it, which " + why
	}
	names := make([]string, len(path))
	for i, idx := range path {
		names[i] = byIndex[idx].Attrs().Name
	}
	return "is below " + top.Name + " (" + strings.Join(names, " → ") + "), which " + why
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}

// hostPortsReader reads the host's ports (hostPorts) through one netlink
// handle in the host's network namespace: the one at netns
// (--dra-host-netns), or the daemon's own when that is "" (hostNetwork).
type hostPortsReader struct {
	netns string
	mu    sync.Mutex
	h     *netlink.Handle
}

func (r *hostPortsReader) read() (map[string]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.open(); err != nil {
		return nil, err
	}
	return hostPorts(r.h)
}

// links returns the names of the host's links.
func (r *hostPortsReader) links() (map[string]bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.open(); err != nil {
		return nil, err
	}
	links, err := r.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := make(map[string]bool, len(links))
	for _, l := range links {
		out[l.Attrs().Name] = true
	}
	return out, nil
}

// open opens the netlink handle once; with mu held.
func (r *hostPortsReader) open() error {
	if r.h == nil {
		var h *netlink.Handle
		var err error
		if r.netns == "" {
			h, err = netlink.NewHandle()
		} else {
			var ns netns.NsHandle
			if ns, err = netns.GetFromPath(r.netns); err == nil {
				h, err = netlink.NewHandleAt(ns)
				_ = ns.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("opening a netlink handle in the host's network namespace %q: %w", r.netns, err)
		}
		r.h = h
	}
	return nil
}

// cniPorts is nodeservice.Ports: the PCI function of a request's device through
// the rail resolver's locator (a sysfs link or two, no NIC scan), the DRA
// claims' ports from the driver's ledger (taken there, under the lock its
// prepares take ports under), and a kick that has the driver publish again.
type cniPorts struct {
	loc rails.Locator
	// ledger is the DRA driver's; nil without the driver.
	ledger *nicdra.PortLedger
	kick   chan<- struct{}
}

// Functions implements nodeservice.Ports.
func (p *cniPorts) Functions(dev rails.Device) []string {
	fns, err := rails.Functions(p.loc, dev)
	if err != nil {
		return nil
	}
	return fns
}

// Take implements nodeservice.Ports.
func (p *cniPorts) Take(dev rails.Device, ports ...string) (string, func()) {
	return p.ledger.TakeForCNI(append(slices.Clone(ports), dev.DeviceID, dev.PCIBusID, dev.Master, dev.Netdev)...)
}

// Changed implements nodeservice.Ports.
func (p *cniPorts) Changed() {
	if p.kick == nil {
		return
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
}
