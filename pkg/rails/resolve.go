package rails

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/devicename"
)

// Device is what an attachment's network config says about its device, as
// Multus, the SR-IOV CNI, host-device, macvlan or ipoib put it there.
type Device struct {
	// DeviceID is the top-level deviceID: a PCI address, or an auxiliary device
	// (a sub-function, mlx5_core.sf.N).
	DeviceID string
	// PCIBusID is host-device's pciBusID.
	PCIBusID string
	// Master is the parent netdev of macvlan, ipvlan and ipoib.
	Master string
	// Netdev is host-device's device.
	Netdev string
}

// Empty says the config names no device.
func (d Device) Empty() bool { return d == Device{} }

// String names the field that is used, as the network config spells it.
func (d Device) String() string {
	switch {
	case d.DeviceID != "":
		return fmt.Sprintf("deviceID %q", d.DeviceID)
	case d.PCIBusID != "":
		return fmt.Sprintf("pciBusID %q", d.PCIBusID)
	case d.Master != "":
		return fmt.Sprintf("master %q", d.Master)
	case d.Netdev != "":
		return fmt.Sprintf("device %q", d.Netdev)
	}
	return "no device"
}

// Check refuses a field that is not a name of what it can hold (deviceID: a
// PCI address or an auxiliary device; pciBusID: a PCI address; master and
// device: netdevs): each field that is set, whichever is used, before any path
// is built from one. Its error wraps devicename.ErrInvalid.
func (d Device) Check() error {
	for _, f := range []struct {
		field devicename.Field
		value string
	}{{devicename.DeviceID, d.DeviceID}, {devicename.PCIBusID, d.PCIBusID}, {devicename.Master, d.Master},
		{devicename.Device, d.Netdev}} {
		if f.value == "" {
			continue
		}
		if err := f.field.Check(f.value); err != nil {
			return err
		}
	}
	return nil
}

// Resolution is where a device was found.
type Resolution struct {
	// Function is the device's PCI function, PF the physical function, Rail its rail.
	Function, PF, Rail string
}

// Resolver finds the rail of a device on this node.
type Resolver struct {
	Locator Locator
	// Inventory returns the node's NIC inventory; fresh is true after a device
	// was not found in the last one, to rescan (a VF created since).
	Inventory func(fresh bool) (*nicdiscovery.Inventory, error)
	Rails     nicdiscovery.Rails
}

// ErrNoDevice is a network config that names no device while the rail is "auto".
var ErrNoDevice = errors.New("the network config names no device")

// Resolve finds d's rail: the first field set of deviceID, pciBusID, master and
// device, its PCI function, that function's PF, and the PF's rail. A device
// whose fields are not names (Check) is refused before anything is looked up.
func (r *Resolver) Resolve(d Device) (Resolution, error) {
	var res Resolution
	if err := d.Check(); err != nil {
		return res, err
	}
	var err error
	res.Function, err = Function(r.Locator, d)
	if errors.Is(err, ErrNoDevice) {
		return res, err
	}
	if err == nil {
		res.PF, err = r.Locator.PFOfPCI(res.Function)
	}
	if err != nil {
		return res, r.notFound(d, err)
	}
	for _, fresh := range []bool{false, true} {
		inv, err := r.Inventory(fresh)
		if err != nil {
			return res, fmt.Errorf("reading this node's NICs: %w", err)
		}
		if rail, ok := r.railOf(inv, res.PF); ok {
			res.Rail = rail
			return res, nil
		}
	}
	return res, r.notFound(d, fmt.Errorf("its physical function %s is not an NVIDIA NIC port of this node", res.PF))
}

// Function returns the PCI function of the first field of d that is set
// (deviceID, pciBusID, master, device), without reading the NIC inventory: a
// few sysfs links at most. d must have passed Check.
func Function(loc Locator, d Device) (string, error) {
	switch {
	case d.DeviceID != "" && IsPCIAddress(d.DeviceID):
		return d.DeviceID, nil
	case d.DeviceID != "":
		return loc.PCIOfAux(d.DeviceID)
	case d.PCIBusID != "":
		return d.PCIBusID, nil
	case d.Master != "":
		return loc.PCIOfNetdev(d.Master)
	case d.Netdev != "":
		return loc.PCIOfNetdev(d.Netdev)
	}
	return "", ErrNoDevice
}

// maxLowerDepth bounds the walk down from a master to its ports (a VLAN on a
// bond of ports is two levels).
const maxLowerDepth = 8

// Functions returns every PCI function an attachment's device uses, sorted:
// Function's one, or, for a master or netdev that is on no PCI device (a
// bond, a VLAN, a bridge, a macvlan), the functions of the netdevs below it,
// to any depth: a VLAN on a bond of two ports uses both ports. It fails as
// Function does when nothing below is on a PCI device either.
func Functions(loc Locator, d Device) ([]string, error) {
	f, err := Function(loc, d)
	if err == nil {
		return []string{f}, nil
	}
	name := d.Master
	if name == "" {
		name = d.Netdev
	}
	if d.DeviceID != "" || d.PCIBusID != "" || name == "" {
		return nil, err
	}
	var out []string
	seen := map[string]bool{name: true}
	var walk func(n string, depth int)
	walk = func(n string, depth int) {
		lowers, lerr := loc.LowerNetdevs(n)
		if lerr != nil {
			return
		}
		for _, lower := range lowers {
			if seen[lower] {
				continue
			}
			seen[lower] = true
			if pci, perr := loc.PCIOfNetdev(lower); perr == nil {
				if !slices.Contains(out, pci) {
					out = append(out, pci)
				}
			} else if depth < maxLowerDepth {
				walk(lower, depth+1)
			}
		}
	}
	walk(name, 1)
	if len(out) == 0 {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

// notFound is a device the node does not have, with the rails it has.
func (r *Resolver) notFound(d Device, err error) error {
	rails := "none"
	if inv, ierr := r.Inventory(false); ierr == nil {
		if names := RailNames(inv, r.Rails); len(names) > 0 {
			rails = strings.Join(names, ", ")
		}
	}
	return fmt.Errorf("%s: %w; this node's rails: %s", d, err, rails)
}

// railOf names the rail of a PF: the rail map's rail that lists the PF (by PCI
// address or by one of its port netdevs), else the PF's port label name (its
// netdev, or its RDMA device where the netdev cannot be seen), as in the node's
// nic.hwipam.io/<name> label.
func (r *Resolver) railOf(inv *nicdiscovery.Inventory, pf string) (string, bool) {
	rails := PFRails(inv, r.Rails)
	rail, ok := rails[pf]
	return rail, ok
}

// PFRails maps each PF with a labelled port (by PCI address) to its rail: the
// rail map's rail that lists it, else its port label name (see railOf).
func PFRails(inv *nicdiscovery.Inventory, railMap nicdiscovery.Rails) map[string]string {
	out := map[string]string{}
	netdevs := map[string][]string{} // PF → its port netdevs
	for _, n := range inv.NICs {
		for _, p := range n.Ports {
			if p.Netdev != "" {
				netdevs[n.PCIAddress] = append(netdevs[n.PCIAddress], p.Netdev)
			}
		}
	}
	names := make([]string, 0, len(railMap))
	for name := range railMap {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, pl := range nicdiscovery.PortLabels(inv, nil) {
		if _, done := out[pl.PCIAddress]; done {
			continue
		}
		out[pl.PCIAddress] = strings.TrimPrefix(pl.Key, nicdiscovery.LabelPrefix)
		for _, name := range names {
			if slices.ContainsFunc(railMap[name], func(m string) bool {
				return m == pl.PCIAddress || slices.Contains(netdevs[pl.PCIAddress], m)
			}) {
				out[pl.PCIAddress] = name
				break
			}
		}
	}
	return out
}

// RailNames lists the rails of this node's PFs, sorted.
func RailNames(inv *nicdiscovery.Inventory, railMap nicdiscovery.Rails) []string {
	var out []string
	for _, rail := range PFRails(inv, railMap) {
		if !slices.Contains(out, rail) {
			out = append(out, rail)
		}
	}
	slices.Sort(out)
	return out
}
