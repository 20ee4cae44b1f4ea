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
// flushed, up or down as it was before. The port is found by what the attach
// recorded of it (its ifindex in the pod, its parent PCI device, its MAC),
// never by a name alone, which a pod with NET_ADMIN can give to any link.
// Both are idempotent and act through netlink
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
	// ErrNotTheDevice: a link carries the device's name but is not the device
	// (its parent device or MAC address says so), or several links match
	// the device's record. Such a link is never moved, flushed or renamed.
	ErrNotTheDevice = errors.New("not the device")
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

// Attachment is the result of an Attach: what it did, and what it learnt of
// the host link, to be recorded in the device's PreparedDevice (RecordIn):
// its MAC address and MTU, permanent MAC and parent device, and whether it
// was up (zero when it was in the pod already), and its ifindex in the pod.
type Attachment struct {
	Outcome    AttachOutcome
	MAC        string
	MTU        int
	PermMAC    string
	ParentDev  string
	HostUp     *bool
	PodIfIndex int
}

// RecordIn sets in d what the attach learnt; it says whether d changed.
func (a Attachment) RecordIn(d *PreparedDevice) bool {
	return d.recordAttach(PreparedDevice{MAC: a.MAC, MTU: a.MTU, PermMAC: a.PermMAC, ParentDev: a.ParentDev,
		HostUp: a.HostUp, PodIfIndex: a.PodIfIndex})
}

// recordAttach takes from the attach's record (from) what it learnt: its
// non-zero fields among MAC, MTU, PermMAC, ParentDev, HostUp and
// PodIfIndex. It says whether d changed.
func (d *PreparedDevice) recordAttach(from PreparedDevice) bool {
	before := *d
	if from.MAC != "" {
		d.MAC = from.MAC
	}
	if from.MTU > 0 {
		d.MTU = from.MTU
	}
	if from.PermMAC != "" {
		d.PermMAC = from.PermMAC
	}
	if from.ParentDev != "" {
		d.ParentDev = from.ParentDev
	}
	if from.HostUp != nil {
		up := *from.HostUp
		d.HostUp = &up
	}
	if from.PodIfIndex > 0 {
		d.PodIfIndex = from.PodIfIndex
	}
	return d.MAC != before.MAC || d.MTU != before.MTU || d.PermMAC != before.PermMAC || d.ParentDev != before.ParentDev ||
		d.PodIfIndex != before.PodIfIndex || (d.HostUp == nil) != (before.HostUp == nil) ||
		(d.HostUp != nil && *d.HostUp != *before.HostUp)
}

// DetachOutcome says what Detach found and did.
type DetachOutcome string

const (
	// Detached means the netdev was in the pod and is now on the host.
	Detached DetachOutcome = "detached"
	// AlreadyOnHost means the netdev was on the host under its host name already.
	AlreadyOnHost DetachOutcome = "already-on-host"
	// ReturnedByKernel means the netdev was on the host under another name:
	// the kernel gives a physical function back to the host under its pod
	// name (or devN) when its namespace is destroyed. It was found by its
	// identity and renamed back.
	ReturnedByKernel DetachOutcome = "returned-by-kernel"
	// Gone means the netdev is neither in the pod nor on the host, and it is a
	// virtual link (no parent device recorded): a veth is destroyed with the
	// namespace it is in. Nothing is left to do. (A physical port that is
	// nowhere is an ErrNetdevMissing.)
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
// already there (found by its identity, not by its name) is configured again:
// a repeated call changes nothing. It fails, naming what was found and what to
// do, when the netdev is nowhere to be found (ErrNetdevMissing), when the
// host's link of that name is not the device (ErrNotTheDevice), when the pod
// already has an interface by that name (ErrNameClash; the pod's own, e.g.
// from its CNI network) or a route to a destination of the pool through
// another link, and when the namespace is gone (ErrNetNSGone). On an error
// after the move the netdev stays in the pod (Outcome Attached, with what was
// learnt): Detach brings it back.
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
	var out Attachment
	podLink, err := findInPod(p.pod, d, ifName)
	if err != nil {
		return Attachment{}, fmt.Errorf("looking for device %s in the pod's network namespace %s: %w", d.Device, podNetNS, err)
	}
	if podLink != nil {
		out = Attachment{Outcome: AlreadyAttached, PodIfIndex: podLink.Attrs().Index}
	} else {
		hostLink, err := linkByName(p.host, d.HostNetdev)
		if err != nil {
			return Attachment{}, fmt.Errorf("looking up %s on the host: %w", d.HostNetdev, err)
		}
		if hostLink == nil {
			// Not under its name: a port the kernel returned under its pod
			// name (or devN) when an earlier sandbox's namespace went without
			// StopPodSandbox reaching the plugin. Found by its recorded
			// identity, as the detach finds it.
			if hostLink, err = linkByIdentity(p.host, d); err != nil {
				return Attachment{}, fmt.Errorf("looking for device %s (%s) on the host: %w", d.Device, d.identity(), err)
			}
		}
		named, err := linkByName(p.pod, ifName)
		if err != nil {
			return Attachment{}, fmt.Errorf("looking up %s in the pod's network namespace %s: %w", ifName, podNetNS, err)
		}
		switch {
		case hostLink != nil && notDevice(hostLink, d):
			return Attachment{}, fmt.Errorf("%w: device %s (PCI %s): the host's %s is %s, not the device (%s): it is left "+
				"where it is; find the device (ip -d link; ip -all netns exec ip link), bring it back under its name %s, "+
				"and restart the pod", ErrNotTheDevice, d.Device, d.PCIAddress, d.HostNetdev, describe(hostLink),
				d.identity(), d.HostNetdev)
		case hostLink != nil && named != nil:
			return Attachment{}, fmt.Errorf("%w: device %s: the pod's network namespace %s already has an interface named %s "+
				"(its own, e.g. from its CNI network), so the host's %s cannot take that name: give the device another "+
				"interfaceName in the claim's %s configuration", ErrNameClash, d.Device, podNetNS, ifName, d.HostNetdev, ConfigKind)
		case hostLink == nil && named != nil:
			return Attachment{}, fmt.Errorf("%w: device %s: the pod's network namespace %s has an interface named %s, but it "+
				"is %s, not the device (%s), and the host has no %s: is the device in another pod, "+
				"or renamed on the host?", ErrNameClash, d.Device, podNetNS, ifName, describe(named), d.identity(), d.HostNetdev)
		case hostLink == nil:
			return Attachment{}, fmt.Errorf("%w: device %s (PCI %s): no netdev %s on the host and no %s in the pod's network "+
				"namespace %s: it may be in another pod's namespace (ip -all netns exec ip link), renamed, or its driver "+
				"unbound; find it, bring it back under its name %s, and restart the pod",
				ErrNetdevMissing, d.Device, d.PCIAddress, d.HostNetdev, ifName, podNetNS, d.HostNetdev)
		}
		attrs := hostLink.Attrs()
		out = stateOf(hostLink)
		out.Outcome = Attached
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
		out.PodIfIndex = podLink.Attrs().Index
	}
	if err := configure(p.pod, podLink, plan); err != nil {
		return out, fmt.Errorf("configuring device %s as %s in the pod's network namespace %s: %w", d.Device,
			podLink.Attrs().Name, podNetNS, err)
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
// podNetNS back to the host as d.HostNetdev, its addresses flushed, its MTU
// (d.MTU) and MAC address (d.MAC) as recorded, and up or down as it was
// before the attach (d.HostUp; down when not recorded). The device is found
// by its identity (the ifindex, parent device and MAC the attach recorded),
// never by its name alone: a link that a pod named as the device is left
// where it is, and the device is found under the name the pod gave it. When
// the device is not in the pod, it is looked for on the host as Reclaim does
// (AlreadyOnHost: its state is made sure of when the attach recorded it;
// nothing is flushed). When the namespace is gone, a virtual link is gone
// with it (Gone), and a physical port that the kernel returned to the host
// under its pod name is renamed back (ReturnedByKernel).
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
		h, ns, err := handleAt(a.HostNetNS)
		if err != nil {
			return "", fmt.Errorf("opening the host's network namespace: %w", err)
		}
		defer func() { h.Close(); _ = ns.Close() }()
		return reclaimOn(h, d)
	}
	if err != nil {
		return "", fmt.Errorf("detaching device %s (%s): %w", d.Device, d.HostNetdev, err)
	}
	defer p.close()
	podLink, err := findInPod(p.pod, d, ifName)
	if err != nil {
		return "", fmt.Errorf("looking for device %s in the pod's network namespace %s: %w", d.Device, podNetNS, err)
	}
	if podLink == nil {
		out, err := reclaimOn(p.host, d)
		named, _ := linkByName(p.pod, ifName)
		switch {
		case named == nil:
		case err != nil:
			err = fmt.Errorf("%w (the pod's network namespace %s has an interface named %s, but it is %s, "+
				"not the device: it is left there)", err, podNetNS, ifName, describe(named))
		case out == Gone:
			return "", fmt.Errorf("%w: device %s (%s) is not on the host, and the pod's network namespace %s has an "+
				"interface named %s that is %s, not the device: it is left there; find the device (ip -all netns exec "+
				"ip -d link) and move it back as %s", ErrNotTheDevice, d.Device, d.identity(), podNetNS, ifName,
				describe(named), d.HostNetdev)
		}
		return out, err
	}
	clash := func(other netlink.Link) error {
		return fmt.Errorf("%w: device %s cannot go back to the host as %s: the host has another link by that "+
			"name now (%s), which is left as it is: rename or delete it, then stop the pod again (the device stays "+
			"in the pod's network namespace %s as %s meanwhile)", ErrNameClash, d.Device, d.HostNetdev, describe(other),
			podNetNS, podLink.Attrs().Name)
	}
	// Nothing is changed in the pod before the way back is known to be free.
	if other, err := linkByName(p.host, d.HostNetdev); err != nil || other != nil {
		if err != nil {
			return "", fmt.Errorf("looking up %s on the host: %w", d.HostNetdev, err)
		}
		return "", clash(other)
	}
	if err := flushDown(p.pod, podLink); err != nil {
		return "", fmt.Errorf("device %s (%s in the pod's network namespace %s): %w", d.Device, podLink.Attrs().Name, podNetNS, err)
	}
	if err := moveLink(p.podNS, podLink.Attrs().Index, p.hostNS, d.HostNetdev); err != nil {
		if errors.Is(err, unix.EEXIST) {
			other, _ := linkByName(p.host, d.HostNetdev)
			return "", clash(other)
		}
		return "", fmt.Errorf("moving device %s (%s) from the pod's network namespace %s back to the host as %s: %w",
			d.Device, podLink.Attrs().Name, podNetNS, d.HostNetdev, err)
	}
	l, err := p.host.LinkByName(d.HostNetdev)
	if err != nil {
		return "", fmt.Errorf("device %s moved back to the host as %s, then not found there: %w", d.Device, d.HostNetdev, err)
	}
	return Detached, restoreOnHost(p.host, l, d, true)
}

// Reclaim brings the device's netdev back to its host name when it is on the
// host under another one: the name it had in a pod whose namespace was
// destroyed without a StopPodSandbox reaching the driver (the kernel returns
// a physical port to the host under its name inside, or devN on a clash). It
// is found by its identity (parent PCI device, permanent MAC, MAC), flushed,
// renamed, and given its recorded MTU, MAC and admin state. A device on the
// host under its own name keeps it and gets its recorded MTU and admin state
// (AlreadyOnHost: the kernel returns a port under its own name when the pod
// had it under that name, down). A device not on
// the host is not looked for in pods' namespaces: a virtual link is Gone; a
// physical port (ParentDev recorded) is in a namespace that outlived its pod,
// an ErrNetdevMissing that says where to look. A host link that carries the
// device's name but is not the device is never touched: renaming the device
// back then fails with ErrNameClash, naming both.
func (a *Attacher) Reclaim(d PreparedDevice) (DetachOutcome, error) {
	if d.HostNetdev == "" {
		return NothingToDetach, nil
	}
	h, ns, err := handleAt(a.HostNetNS)
	if err != nil {
		return "", fmt.Errorf("opening the host's network namespace: %w", err)
	}
	defer func() { h.Close(); _ = ns.Close() }()
	return reclaimOn(h, d)
}

// HostState reads the device's link on the host under its host name, before
// any attach: what Attach records of it (MAC, MTU, permanent MAC, parent
// device, up or down), with ok false when the host has no link by that name
// or the one it has contradicts the record (another device's parent or MAC).
// The prepare records it, so that the device is found by what it is, and
// given back as it was, even when the attach's own record never reaches the
// checkpoint (ipam-node killed as the sandbox starts, a full filesystem).
func (a *Attacher) HostState(d PreparedDevice) (Attachment, bool, error) {
	if d.HostNetdev == "" {
		return Attachment{}, false, nil
	}
	h, ns, err := handleAt(a.HostNetNS)
	if err != nil {
		return Attachment{}, false, fmt.Errorf("opening the host's network namespace: %w", err)
	}
	defer func() { h.Close(); _ = ns.Close() }()
	l, err := linkByName(h, d.HostNetdev)
	if err != nil || l == nil || notDevice(l, d) {
		return Attachment{}, false, err
	}
	return stateOf(l), true, nil
}

// stateOf is what an attach records of the device's host link.
func stateOf(l netlink.Link) Attachment {
	attrs := l.Attrs()
	up := attrs.Flags&net.FlagUp != 0
	return Attachment{MAC: attrs.HardwareAddr.String(), MTU: attrs.MTU, PermMAC: permMAC(attrs), ParentDev: attrs.ParentDev,
		HostUp: &up}
}

// reclaimOn finds the device among the host's links (h) and brings it back
// under its name. A device found under its own name gets its recorded MTU and
// admin state again when the attach recorded them: a detach that stopped
// between the move and the restore, or a port the kernel returned under its
// pod name that was its host name (a claim without an interfaceName), down.
func reclaimOn(h *netlink.Handle, d PreparedDevice) (DetachOutcome, error) {
	named, err := linkByName(h, d.HostNetdev)
	if err != nil {
		return "", fmt.Errorf("looking up %s on the host: %w", d.HostNetdev, err)
	}
	if named != nil && !notDevice(named, d) {
		if d.HostUp == nil {
			return AlreadyOnHost, nil
		}
		return AlreadyOnHost, restoreOnHost(h, named, d, false)
	}
	l, err := linkByIdentity(h, d)
	if err != nil {
		return "", fmt.Errorf("device %s (%s): %w", d.Device, d.identity(), err)
	}
	if l == nil {
		if d.ParentDev == "" {
			return Gone, nil // a virtual link, destroyed with its namespace
		}
		what := "no link"
		if named != nil {
			what = describe(named) + ", not the device, which is left as it is"
		}
		return "", fmt.Errorf("%w: device %s (%s) is a physical port, which no namespace takes down with it, but it is "+
			"not on the host (under %s: %s): it is in a network namespace that outlived its pod; find it "+
			"(ip -all netns exec ip -d link; lsns -t net) and move it back as %s", ErrNetdevMissing, d.Device,
			d.identity(), d.HostNetdev, what, d.HostNetdev)
	}
	if named != nil {
		return "", fmt.Errorf("%w: device %s is on the host as %s and cannot be renamed back to %s: the host's %s is %s, "+
			"not the device: rename or delete that link (the device comes back at the next try)", ErrNameClash, d.Device,
			l.Attrs().Name, d.HostNetdev, d.HostNetdev, describe(named))
	}
	was := l.Attrs().Name
	if err := flushDown(h, l); err != nil {
		return "", fmt.Errorf("device %s (on the host as %s): %w", d.Device, was, err)
	}
	if err := h.LinkSetName(l, d.HostNetdev); err != nil {
		return "", fmt.Errorf("renaming device %s, on the host as %s, back to %s: %w", d.Device, was, d.HostNetdev, err)
	}
	return ReturnedByKernel, restoreOnHost(h, l, d, true)
}

// findInPod returns the device's link in a pod's namespace (nil when it is
// not there). With the ifindex the attach recorded, only the link with that
// index is the device, if it still is what was recorded (a pod may rename it,
// and name another link as it; and once the device has left, the namespace
// may give its index to a new link); without one (a record from before the
// ifindex was kept), the link named ifName if it is the device, else the one
// link that is.
func findInPod(h *netlink.Handle, d PreparedDevice, ifName string) (netlink.Link, error) {
	if d.PodIfIndex > 0 {
		l, err := h.LinkByIndex(d.PodIfIndex)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if isDevice(l, d, true) {
			return l, nil
		}
		return nil, nil
	}
	l, err := linkByName(h, ifName)
	if err != nil || (l != nil && isDevice(l, d, false)) {
		return l, err
	}
	return linkByIdentity(h, d)
}

// linkByIdentity returns the one link that is the device, nil when none; two
// that match are an error naming them (the record cannot tell them apart).
func linkByIdentity(h *netlink.Handle, d PreparedDevice) (netlink.Link, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var found []netlink.Link
	for _, l := range links {
		if isDevice(l, d, false) {
			found = append(found, l)
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	}
	var names []string
	for _, l := range found {
		names = append(names, l.Attrs().Name)
	}
	return nil, fmt.Errorf("%w: links %s all match the device's record: it cannot tell them apart, and moves none",
		ErrNotTheDevice, strings.Join(names, ", "))
}

// isDevice says whether the link is the device the record describes. Its
// parent device, when it has one on the PCI bus or the record has one, must
// be the device's; its permanent MAC, when both have one, must be the
// recorded one; then, unless the link was found by its recorded ifindex in
// the pod (byIndex: the pod may have changed its MAC) with its parent
// matched, its MAC (current or permanent) must be the recorded one. A record
// with neither a MAC nor a parent identifies nothing.
func isDevice(l netlink.Link, d PreparedDevice, byIndex bool) bool {
	a := l.Attrs()
	parent := false
	switch {
	case d.ParentDev != "":
		if a.ParentDev != d.ParentDev {
			return false
		}
		parent = true
	case a.ParentDevBus == "pci" && d.PCIAddress != "":
		if a.ParentDev != d.PCIAddress {
			return false
		}
		parent = true
	}
	if perm := permMAC(a); perm != "" && d.PermMAC != "" {
		return strings.EqualFold(perm, d.PermMAC)
	}
	if byIndex && parent {
		return true
	}
	if d.MAC != "" {
		return sameMAC(l, d.MAC)
	}
	return parent
}

// notDevice says whether the link is certainly not the device: its parent,
// permanent MAC or MAC contradicts the record. (A record without any of them,
// as a prepare writes for a virtual link, contradicts nothing.)
func notDevice(l netlink.Link, d PreparedDevice) bool {
	a := l.Attrs()
	if d.ParentDev != "" && a.ParentDev != d.ParentDev {
		return true
	}
	if a.ParentDevBus == "pci" && d.PCIAddress != "" && a.ParentDev != d.PCIAddress {
		return true
	}
	if perm := permMAC(a); perm != "" && d.PermMAC != "" {
		return !strings.EqualFold(perm, d.PermMAC)
	}
	return d.MAC != "" && !sameMAC(l, d.MAC)
}

// permMAC is the link's permanent MAC address, "" when it has none (a
// virtual link reports zeros, or nothing).
func permMAC(a *netlink.LinkAttrs) string {
	for _, b := range a.PermHWAddr {
		if b != 0 {
			return a.PermHWAddr.String()
		}
	}
	return ""
}

// identity describes what the record identifies the device by.
func (d PreparedDevice) identity() string {
	var parts []string
	if d.ParentDev != "" {
		parts = append(parts, "parent device "+d.ParentDev)
	} else if d.PCIAddress != "" {
		parts = append(parts, "PCI "+d.PCIAddress)
	}
	if d.PermMAC != "" {
		parts = append(parts, "permanent MAC "+d.PermMAC)
	}
	if d.MAC != "" {
		parts = append(parts, "MAC "+d.MAC)
	}
	if d.PodIfIndex > 0 {
		parts = append(parts, fmt.Sprintf("ifindex %d in the pod", d.PodIfIndex))
	}
	return strings.Join(parts, ", ")
}

// describe says what a link is, for an error.
func describe(l netlink.Link) string {
	if l == nil {
		return "gone"
	}
	a := l.Attrs()
	s := fmt.Sprintf("%s (%s, MAC %s", a.Name, l.Type(), a.HardwareAddr)
	if a.ParentDev != "" {
		s += ", parent device " + a.ParentDev
	} else {
		s += ", no parent device"
	}
	return s + ")"
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

// restoreOnHost gives the host link its recorded state: addresses flushed
// (flush: it comes back from a pod), its MTU and MAC address as recorded, and
// up when it was up before the attach (down when that was not recorded and it
// comes back from a pod; left as it is otherwise).
func restoreOnHost(h *netlink.Handle, l netlink.Link, d PreparedDevice, flush bool) error {
	name := l.Attrs().Name
	if flush {
		if err := flushDown(h, l); err != nil {
			return fmt.Errorf("device %s (%s on the host): %w", d.Device, name, err)
		}
	}
	if d.MTU > 0 && l.Attrs().MTU != d.MTU {
		if err := h.LinkSetMTU(l, d.MTU); err != nil {
			return fmt.Errorf("setting %s's MTU back to %d: %w", name, d.MTU, err)
		}
	}
	if mac, err := net.ParseMAC(d.MAC); flush && err == nil && len(mac) == 6 && !strings.EqualFold(l.Attrs().HardwareAddr.String(), d.MAC) {
		if err := h.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("setting %s's MAC address back to %s: %w", name, d.MAC, err)
		}
	}
	if d.HostUp != nil && *d.HostUp {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("setting %s up again, as it was before the claim: %w", name, err)
		}
	} else if d.HostUp != nil || flush {
		if err := h.LinkSetDown(l); err != nil {
			return fmt.Errorf("setting %s down, as it was before the claim: %w", name, err)
		}
	}
	return nil
}
