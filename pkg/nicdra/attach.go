package nicdra

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Attaching moves a prepared device's netdev from the host's network
// namespace into a pod's, under the name the pod asked for, and configures it
// there as the CNI path configures an interface from the same pool's result
// (the reference plugins' ipam.ConfigureIface): its addresses, link up, then
// each route of the pool through the pool's gateway (the pool's routes include
// 0.0.0.0/0 or ::/0 when it sets defaultGateway; a gateway alone adds no
// default route). Detaching moves it back under its host name, its addresses
// flushed and its link down. Both are idempotent and act through netlink
// sockets bound to each namespace: the calling thread never changes namespace
// (bar the instant the library takes to open such a socket, thread locked).

// Errors callers branch on.
var (
	// ErrNetdevMissing: the device's netdev is neither on the host under its
	// host name nor in the pod under its pod name.
	ErrNetdevMissing = errors.New("netdev not found")
	// ErrNameClash: the pod's network namespace already has another
	// interface (or route) by the name the device is to take.
	ErrNameClash = errors.New("name clash in the pod's network namespace")
	// ErrNetNSGone: the pod's network namespace no longer exists.
	ErrNetNSGone = errors.New("the pod's network namespace is gone")
)

// Attacher moves prepared devices' netdevs between the host's network
// namespace and pods'.
type Attacher struct {
	// HostNetNS is the host network namespace's path; "" is the process's own
	// (ipam-node then runs with hostNetwork, or points this at
	// /proc/1/ns/net with hostPID).
	HostNetNS string
}

// AttachOutcome says what Attach found and did.
type AttachOutcome string

const (
	// Attached means the netdev was on the host and is now in the pod.
	Attached AttachOutcome = "attached"
	// AlreadyAttached means the netdev was in the pod already (a repeated
	// RunPodSandbox); its configuration was made sure of.
	AlreadyAttached AttachOutcome = "already-attached"
	// NoNetdev means the device has no netdev to move (an RDMA-only function).
	NoNetdev AttachOutcome = "no-netdev"
)

// Attachment is the result of an Attach: what it did, and the MAC address and
// MTU the link had on the host (zero when it was in the pod already), to be
// recorded in the device's PreparedDevice (MTU: restored on detach; MAC: the
// claim's networkData.hardwareAddress).
type Attachment struct {
	Outcome AttachOutcome
	MAC     string
	MTU     int
}

// DetachOutcome says what Detach found and did.
type DetachOutcome string

const (
	// Detached means the netdev was in the pod and is now on the host.
	Detached DetachOutcome = "detached"
	// AlreadyOnHost means the netdev was on the host under its host name already.
	AlreadyOnHost DetachOutcome = "already-on-host"
	// ReturnedByKernel means the pod's namespace was gone and the kernel had given
	// the netdev back to the host under its pod name (what happens to a
	// physical function when its namespace is destroyed); it was found by its
	// MAC address and renamed back.
	ReturnedByKernel DetachOutcome = "returned-by-kernel"
	// Gone means the netdev is neither in the pod nor on the host: a veth (or any
	// virtual link) is destroyed with the namespace it is in. Nothing is left
	// to do.
	Gone DetachOutcome = "gone"
	// NothingToDetach means the device has no netdev.
	NothingToDetach DetachOutcome = "no-netdev"
)

// linkPlan is what a device's link gets in the pod, parsed once.
type linkPlan struct {
	addrs    []netip.Prefix
	gateways []netip.Addr // at most one per family
	routes   []netip.Prefix
}

// planFor parses the device's record; a record it cannot parse is an error
// that names the field (the checkpoint was edited or damaged).
func planFor(d PreparedDevice) (linkPlan, error) {
	var p linkPlan
	for _, s := range d.Addresses {
		a, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("device %s: address %q is not an address with a prefix length (e.g. 10.0.0.4/24)", d.Device, s)
		}
		p.addrs = append(p.addrs, a)
	}
	gws := d.Gateways
	if len(gws) == 0 && d.Gateway != "" {
		gws = []string{d.Gateway} // a checkpoint written before Gateways
	}
	for _, s := range gws {
		g, err := netip.ParseAddr(s)
		if err != nil {
			return p, fmt.Errorf("device %s: gateway %q is not an IP address", d.Device, s)
		}
		p.gateways = append(p.gateways, g)
	}
	for _, s := range d.Routes {
		r, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("device %s: route %q is not a destination in CIDR notation", d.Device, s)
		}
		p.routes = append(p.routes, r.Masked())
		// A route goes through its family's gateway, or on-link when its pool
		// has none (as CNI's with a result without one). A record whose
		// gateway is of the other family cannot say which: the route would be
		// wrong either way.
		if len(p.gateways) > 0 && !p.gatewayFor(r).IsValid() {
			return p, fmt.Errorf("device %s: route %s has no gateway of its family in the device's record (gateway %s): "+
				"a dual-stack device's second gateway is not recorded; use single-stack pools for this device, "+
				"or pools without routes for the second family", d.Device, r, d.Gateway)
		}
	}
	return p, nil
}

// gatewayFor is the gateway of dst's family, invalid when there is none.
func (p linkPlan) gatewayFor(dst netip.Prefix) netip.Addr {
	for _, g := range p.gateways {
		if g.Is4() == dst.Addr().Is4() {
			return g
		}
	}
	return netip.Addr{}
}

// handleAt opens a netlink handle bound to the namespace at path ("" is the
// process's own).
func handleAt(path string) (*netlink.Handle, netns.NsHandle, error) {
	if path == "" {
		path = "/proc/self/ns/net"
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, netns.None(), err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		_ = ns.Close()
		return nil, netns.None(), fmt.Errorf("netlink in network namespace %s: %w", path, err)
	}
	return h, ns, nil
}

// nsPair is the host's and a pod's namespace, each with a netlink handle.
type nsPair struct {
	hostPath, podPath string
	host, pod         *netlink.Handle
	hostNS, podNS     netns.NsHandle
}

func (a *Attacher) open(podNetNS string) (*nsPair, error) {
	p := &nsPair{hostPath: a.HostNetNS, podPath: podNetNS, hostNS: netns.None(), podNS: netns.None()}
	if p.hostPath == "" {
		p.hostPath = "/proc/self/ns/net"
	}
	if podNetNS == "" {
		return nil, fmt.Errorf("%w: the runtime gave no path", ErrNetNSGone)
	}
	var err error
	if p.host, p.hostNS, err = handleAt(p.hostPath); err != nil {
		return nil, fmt.Errorf("opening the host's network namespace %s: %w", p.hostPath, err)
	}
	if p.pod, p.podNS, err = handleAt(podNetNS); err != nil {
		p.close()
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%w: %s does not exist", ErrNetNSGone, podNetNS)
		}
		return nil, fmt.Errorf("opening the pod's network namespace %s: %w", podNetNS, err)
	}
	return p, nil
}

func (p *nsPair) close() {
	for _, h := range []*netlink.Handle{p.host, p.pod} {
		if h != nil {
			h.Close()
		}
	}
	for _, ns := range []netns.NsHandle{p.hostNS, p.podNS} {
		if ns.IsOpen() {
			_ = ns.Close()
		}
	}
}

// linkByName returns the link, nil when there is none by that name.
func linkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
		return nil, nil
	}
	return l, err
}

// Attach moves the device's netdev from the host into the network namespace
// at podNetNS (a pod sandbox's) as d.InterfaceName and configures it. A device
// already there is configured again (a repeated call changes nothing). It
// fails, naming what was found and what to do, when the netdev is nowhere to
// be found (ErrNetdevMissing), when the pod already has an interface by that
// name (ErrNameClash; the pod's own, e.g. from its CNI network) or a route to
// a destination of the pool through another link, and when the namespace is
// gone (ErrNetNSGone). On an error after the move the netdev stays in the pod:
// Detach brings it back.
func (a *Attacher) Attach(podNetNS string, d PreparedDevice) (Attachment, error) {
	if d.HostNetdev == "" {
		return Attachment{Outcome: NoNetdev}, nil
	}
	plan, err := planFor(d)
	if err != nil {
		return Attachment{}, err
	}
	ifName := d.InterfaceName
	if ifName == "" {
		ifName = d.HostNetdev
	}
	p, err := a.open(podNetNS)
	if err != nil {
		return Attachment{}, fmt.Errorf("attaching device %s (%s): %w", d.Device, d.HostNetdev, err)
	}
	defer p.close()
	hostLink, err := linkByName(p.host, d.HostNetdev)
	if err != nil {
		return Attachment{}, fmt.Errorf("looking up %s on the host: %w", d.HostNetdev, err)
	}
	podLink, err := linkByName(p.pod, ifName)
	if err != nil {
		return Attachment{}, fmt.Errorf("looking up %s in the pod's network namespace %s: %w", ifName, podNetNS, err)
	}
	var out Attachment
	switch {
	case hostLink != nil && podLink != nil:
		return Attachment{}, fmt.Errorf("%w: device %s: the pod's network namespace %s already has an interface named %s "+
			"(its own, e.g. from its CNI network), so the host's %s cannot take that name: give the device another "+
			"interfaceName in the claim's %s configuration", ErrNameClash, d.Device, podNetNS, ifName, d.HostNetdev, ConfigKind)
	case hostLink != nil:
		attrs := hostLink.Attrs()
		out = Attachment{Outcome: Attached, MAC: attrs.HardwareAddr.String(), MTU: attrs.MTU}
		if err := moveLink(p.hostNS, attrs.Index, p.podNS, ifName); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return Attachment{}, fmt.Errorf("%w: device %s: an interface named %s appeared in the pod's network namespace %s "+
					"while %s was moved in: give the device another interfaceName in the claim's %s configuration",
					ErrNameClash, d.Device, ifName, podNetNS, d.HostNetdev, ConfigKind)
			}
			return Attachment{}, fmt.Errorf("moving %s (device %s) into the pod's network namespace %s as %s: %w",
				d.HostNetdev, d.Device, podNetNS, ifName, err)
		}
		if podLink, err = p.pod.LinkByName(ifName); err != nil {
			return out, fmt.Errorf("device %s moved into the pod's network namespace %s as %s, then not found there: %w",
				d.Device, podNetNS, ifName, err)
		}
	case podLink != nil:
		if d.MAC != "" && !sameMAC(podLink, d.MAC) {
			return Attachment{}, fmt.Errorf("%w: device %s: the pod's network namespace %s has an interface named %s, but its "+
				"MAC address is %s, not the device's %s, and the host has no %s: is the device in another pod, "+
				"or renamed on the host?", ErrNameClash, d.Device, podNetNS, ifName, podLink.Attrs().HardwareAddr, d.MAC, d.HostNetdev)
		}
		out = Attachment{Outcome: AlreadyAttached}
	default:
		return Attachment{}, fmt.Errorf("%w: device %s (PCI %s): no netdev %s on the host and no %s in the pod's network "+
			"namespace %s: it may be in another pod's namespace (ip -all netns exec ip link), renamed, or its driver "+
			"unbound; find it, bring it back under its name %s, and restart the pod",
			ErrNetdevMissing, d.Device, d.PCIAddress, d.HostNetdev, ifName, podNetNS, d.HostNetdev)
	}
	if err := configure(p.pod, podLink, plan); err != nil {
		return out, fmt.Errorf("configuring device %s as %s in the pod's network namespace %s: %w", d.Device, ifName, podNetNS, err)
	}
	return out, nil
}

// sameMAC says whether the link's address, or its permanent one, is mac.
func sameMAC(l netlink.Link, mac string) bool {
	a := l.Attrs()
	return strings.EqualFold(a.HardwareAddr.String(), mac) || strings.EqualFold(a.PermHWAddr.String(), mac)
}

// moveLink moves the link with ifindex idx from namespace from into namespace
// to, renamed name, in one request (as `ip link set dev X netns N name Y`), so
// that its name in from never has to be free in to. The kernel refuses with
// EEXIST when to has a link named name.
func moveLink(from netns.NsHandle, idx int, to netns.NsHandle, name string) error {
	s, err := nl.GetNetlinkSocketAt(from, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer s.Close()
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(idx)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(to))))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// configure gives the link its addresses, sets it up and adds the routes, as
// the CNI reference plugins do with an IPAM result: a route goes through the
// gateway of its family, or is on-link when there is none. An address or a
// route that is there already is left as it is.
func configure(h *netlink.Handle, l netlink.Link, plan linkPlan) error {
	for _, a := range plan.addrs {
		addr := &netlink.Addr{IPNet: ipNet(a)}
		if a.Addr().Is6() {
			// The addresses are the IPAM's, unique by construction: no
			// duplicate address detection, whose tentative second would
			// hold up the routes beyond the runtime's time budget.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrReplace(l, addr); err != nil {
			if a.Addr().Is6() && errors.Is(err, unix.EACCES) {
				return fmt.Errorf("adding %s: IPv6 is disabled on the interface (sysctl net.ipv6.conf.*.disable_ipv6 "+
					"in the pod): enable it for the pod or use an IPv4 pool", a)
			}
			return fmt.Errorf("adding %s: %w", a, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting the link up: %w", err)
	}
	for _, dst := range plan.routes {
		gw := plan.gatewayFor(dst)
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(dst)}
		if gw.IsValid() {
			r.Gw = gw.AsSlice()
		}
		err := h.RouteAdd(r)
		if err == nil {
			continue
		}
		if !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding the route to %s via %s: %w", dst, gwText(gw), err)
		}
		if ours, lerr := hasRoute(h, l, dst, gw); lerr != nil || !ours {
			return fmt.Errorf("%w: the pool's route to %s via %s: the pod already has a route to %s through another "+
				"link (from its CNI network): drop the destination from the pool's routes (or set defaultGateway false "+
				"for 0.0.0.0/0, ::/0), as a CNI attachment of the same pool would fail the same way", ErrNameClash, dst, gwText(gw), dst)
		}
	}
	return nil
}

// hasRoute says whether the link has the route to dst via gw.
func hasRoute(h *netlink.Handle, l netlink.Link, dst netip.Prefix, gw netip.Addr) (bool, error) {
	family := netlink.FAMILY_V4
	if dst.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	routes, err := h.RouteList(l, family)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(routes, func(r netlink.Route) bool {
		got := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if dst.Addr().Is6() {
			got = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		if r.Dst != nil {
			a, _ := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			got = netip.PrefixFrom(a.Unmap(), ones)
		}
		g, _ := netip.AddrFromSlice(r.Gw)
		return got == dst && g.Unmap() == gw
	}), nil
}

func gwText(gw netip.Addr) string {
	if !gw.IsValid() {
		return "the link"
	}
	return gw.String()
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Detach moves the device's netdev from the pod's network namespace at
// podNetNS back to the host as d.HostNetdev, its addresses flushed and its
// link down, and its MTU set back to d.MTU when that is recorded. It succeeds
// without doing anything when the netdev is on the host already, and when the
// namespace is gone and the netdev with it (a veth: Gone). When the namespace
// is gone and the kernel returned the netdev to the host under its pod name (a
// physical function), it is found by d.MAC and renamed back.
func (a *Attacher) Detach(podNetNS string, d PreparedDevice) (DetachOutcome, error) {
	if d.HostNetdev == "" {
		return NothingToDetach, nil
	}
	ifName := d.InterfaceName
	if ifName == "" {
		ifName = d.HostNetdev
	}
	p, err := a.open(podNetNS)
	if errors.Is(err, ErrNetNSGone) {
		return a.detachGone(d)
	}
	if err != nil {
		return "", fmt.Errorf("detaching device %s (%s): %w", d.Device, d.HostNetdev, err)
	}
	defer p.close()
	if l, err := linkByName(p.host, d.HostNetdev); err != nil || l != nil {
		if err != nil {
			return "", fmt.Errorf("looking up %s on the host: %w", d.HostNetdev, err)
		}
		return AlreadyOnHost, restoreOnHost(p.host, l, d)
	}
	podLink, err := linkByName(p.pod, ifName)
	if err != nil {
		return "", fmt.Errorf("looking up %s in the pod's network namespace %s: %w", ifName, podNetNS, err)
	}
	if podLink == nil && d.MAC != "" {
		podLink, err = linkByMAC(p.pod, d.MAC) // renamed in the pod
		if err != nil {
			return "", fmt.Errorf("looking for MAC %s in the pod's network namespace %s: %w", d.MAC, podNetNS, err)
		}
	}
	if podLink == nil {
		return Gone, nil
	}
	if err := flushDown(p.pod, podLink); err != nil {
		return "", fmt.Errorf("device %s (%s in the pod's network namespace %s): %w", d.Device, podLink.Attrs().Name, podNetNS, err)
	}
	if err := moveLink(p.podNS, podLink.Attrs().Index, p.hostNS, d.HostNetdev); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("%w: device %s cannot go back to the host as %s: the host has another link by that "+
				"name now: rename or delete it, then stop the pod again", ErrNameClash, d.Device, d.HostNetdev)
		}
		return "", fmt.Errorf("moving device %s (%s) from the pod's network namespace %s back to the host as %s: %w",
			d.Device, podLink.Attrs().Name, podNetNS, d.HostNetdev, err)
	}
	l, err := p.host.LinkByName(d.HostNetdev)
	if err != nil {
		return "", fmt.Errorf("device %s moved back to the host as %s, then not found there: %w", d.Device, d.HostNetdev, err)
	}
	return Detached, restoreOnHost(p.host, l, d)
}

// detachGone handles a device whose pod namespace is gone.
func (a *Attacher) detachGone(d PreparedDevice) (DetachOutcome, error) {
	h, ns, err := handleAt(a.HostNetNS)
	if err != nil {
		return "", fmt.Errorf("opening the host's network namespace: %w", err)
	}
	defer func() { h.Close(); _ = ns.Close() }()
	l, err := linkByName(h, d.HostNetdev)
	if err != nil {
		return "", fmt.Errorf("looking up %s on the host: %w", d.HostNetdev, err)
	}
	if l != nil {
		return AlreadyOnHost, restoreOnHost(h, l, d)
	}
	if d.MAC == "" {
		return Gone, nil
	}
	if l, err = linkByMAC(h, d.MAC); err != nil || l == nil {
		return Gone, err
	}
	if err := flushDown(h, l); err != nil {
		return "", fmt.Errorf("device %s (returned to the host as %s): %w", d.Device, l.Attrs().Name, err)
	}
	if err := h.LinkSetName(l, d.HostNetdev); err != nil {
		return "", fmt.Errorf("renaming device %s, returned to the host as %s, back to %s: %w", d.Device, l.Attrs().Name, d.HostNetdev, err)
	}
	return ReturnedByKernel, restoreOnHost(h, l, d)
}

// linkByMAC returns the link whose (permanent) MAC address is mac, nil when none.
func linkByMAC(h *netlink.Handle, mac string) (netlink.Link, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if l.Attrs().HardwareAddr != nil && sameMAC(l, mac) {
			return l, nil
		}
	}
	return nil, nil
}

// flushDown sets the link down and removes its addresses.
func flushDown(h *netlink.Handle, l netlink.Link) error {
	if err := h.LinkSetDown(l); err != nil {
		return fmt.Errorf("setting the link down: %w", err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue // the kernel's own, gone with the link's move
		}
		if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("removing %s: %w", a.IPNet, err)
		}
	}
	return nil
}

// restoreOnHost makes sure the host link is down, holds no addresses, and has
// its recorded MTU.
func restoreOnHost(h *netlink.Handle, l netlink.Link, d PreparedDevice) error {
	if err := flushDown(h, l); err != nil {
		return fmt.Errorf("device %s (%s on the host): %w", d.Device, d.HostNetdev, err)
	}
	if d.MTU > 0 && l.Attrs().MTU != d.MTU {
		if err := h.LinkSetMTU(l, d.MTU); err != nil {
			return fmt.Errorf("setting %s's MTU back to %d: %w", d.HostNetdev, d.MTU, err)
		}
	}
	return nil
}
