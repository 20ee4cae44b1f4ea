package nicdra

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/nicdiscovery"
)

// ErrPortUnavailable is a port Prepare will not hand out now: the node's
// uplink, excluded by the operator, or in use by a pod's CNI attachment (the
// claim was allocated from a slice published before that was known). The
// kubelet tries again; in use, it can succeed once the pod is gone.
var ErrPortUnavailable = errors.New("port not available to claims")

// PortUse is what the driver knows of the node's ports beside its NIC
// inventory, read each time the devices are published and at each prepare:
// which ports the CNI path uses, which carry the host's addresses or routes,
// and which the operator excluded. ipam-node fills it from its store and from
// the host's network namespace; nil fields stand for nothing known.
type PortUse struct {
	// InUse returns the ports CNI allocations use, by PCI address: who uses
	// each (Publish.InUse).
	InUse func() map[string]string
	// HostPorts returns the host's netdevs that carry its addresses or routes,
	// by name: why (Publish.HostPorts). An error leaves the last answer.
	HostPorts func() (map[string]string, error)
	// HostLinks returns the names of every link in the host's network
	// namespace (Publish.HostLinks); nil: not known, every netdev counts as
	// there.
	HostLinks func() (map[string]bool, error)
	// Exclude are netdev names or PCI addresses never handed out.
	Exclude []string
}

// fill sets p's port use fields.
func (u *PortUse) fill(p *Publish) error {
	if u == nil {
		return nil
	}
	p.Exclude = u.Exclude
	if u.InUse != nil {
		p.InUse = u.InUse()
	}
	if u.HostPorts != nil {
		hp, err := u.HostPorts()
		if err != nil {
			return fmt.Errorf("reading the host's addresses and routes: %w", err)
		}
		p.HostPorts = hp
	}
	if u.HostLinks != nil {
		links, err := u.HostLinks()
		if err != nil {
			return fmt.Errorf("listing the host's links: %w", err)
		}
		p.HostLinks = links
	}
	return nil
}

// check refuses the NIC function n of inv when Withheld would withhold it.
func (u *PortUse) check(inv *nicdiscovery.Inventory, n nicdiscovery.NIC) error {
	p := Publish{Inventory: inv}
	if err := u.fill(&p); err != nil {
		return fmt.Errorf("%w: %w; the kubelet tries again", ErrPortUnavailable, err)
	}
	if why := withheld(p, n); why != "" {
		return fmt.Errorf("%w: NIC port %s (%s) is withheld from claims: %s; the claim waits for it (the kubelet "+
			"tries again), or delete the pod and its claim to have another port allocated", ErrPortUnavailable,
			DeviceName(n.PCIAddress), n.PCIAddress, why)
	}
	return nil
}

// PreparedNetdevs returns, by PCI address, the host netdev of each device of
// the prepared claims: where a device's netdev is not in the host's namespace
// (it is in the claim's pod), the inventory is read as if it were
// (WithPreparedNetdevs).
func PreparedNetdevs(claims map[types.UID]PreparedClaim) map[string]string {
	out := map[string]string{}
	for _, pc := range claims {
		for _, d := range pc.Devices {
			if d.PCIAddress != "" && d.HostNetdev != "" {
				out[d.PCIAddress] = d.HostNetdev
			}
		}
	}
	return out
}

// WithPreparedNetdevs returns inv with the host netdev of each prepared device
// (by PCI address: PreparedNetdevs) put back where the scan does not show one
// because the netdev is in the claim's pod. The device then keeps the
// attributes that come from its netdev (rail, pool, netdev) and its PF's rail
// stays that of its port label, instead of changing on every attach and
// detach. inv itself is not changed. ipam-node's NIC labeller reads its scans
// through it too, so that a port in a claim's pod keeps its node labels also
// after a restart.
func WithPreparedNetdevs(inv *nicdiscovery.Inventory, prepared map[string]string) *nicdiscovery.Inventory {
	out := *inv
	out.NICs = slices.Clone(inv.NICs)
	for i := range out.NICs {
		n := &out.NICs[i]
		netdev, ok := prepared[n.PCIAddress]
		if !ok || len(n.Netdevs) > 0 {
			continue
		}
		n.Netdevs = []string{netdev}
		n.Ports = slices.Clone(n.Ports)
		if len(n.Ports) > 0 && n.Ports[0].Netdev == "" {
			n.Ports[0].Netdev = netdev
		} else if len(n.Ports) == 0 {
			n.Ports = []nicdiscovery.Port{{Netdev: netdev, Number: 1, LinkLayer: n.LinkLayer}}
		}
	}
	return &out
}

// exempt returns p with the prepared devices' functions kept out of Withheld:
// a device allocated to a claim stays published as it is (its netdev is in the
// claim's pod, not in a CNI attachment).
func exempt(p Publish, prepared map[string]string) Publish {
	if len(prepared) == 0 {
		return p
	}
	p.InUse = maps.Clone(p.InUse)
	for addr := range prepared {
		delete(p.InUse, addr)
	}
	if p.HostLinks != nil {
		// A prepared device's netdev is in its claim's pod, or will be back.
		p.HostLinks = maps.Clone(p.HostLinks)
		for _, netdev := range prepared {
			p.HostLinks[netdev] = true
		}
	}
	return p
}

// publishInputs is what the devices are published from: the inventory with
// the prepared devices' netdevs put back, the pools, and the ports' use.
func (d *Driver) publishInputs(inv *nicdiscovery.Inventory, claims map[types.UID]PreparedClaim,
	pools map[string][]string) (Publish, error) {
	prepared := PreparedNetdevs(claims)
	pub := Publish{Inventory: WithPreparedNetdevs(inv, prepared), Rails: d.Preparer.Rails, PoolsByRail: pools, Now: metav1.Now()}
	if err := d.Preparer.Ports.fill(&pub); err != nil {
		return pub, err
	}
	return exempt(pub, prepared), nil
}

// HeldBy names the prepared claim (namespace/name) that holds a port, or the
// claim being prepared with it, by the PCI address or host netdev name of one
// of its devices; "" when none does (the Preparer's ledger; "" without one).
func (d *Driver) HeldBy(names ...string) string {
	return d.Preparer.Ledger.HeldBy(names...)
}
