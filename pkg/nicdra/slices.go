// Package nicdra is hwipam's Dynamic Resource Allocation driver for NVIDIA NIC
// ports, driver name nic.hwipam.io (docs/dra.md, when it lands): the node's NIC
// ports, from the same inventory as the nic.hwipam.io/ labels, published as
// devices of ResourceSlices, each with the rail, pool and PCIe locality a claim
// can select on and align with a GPU by.
//
// This file is what the driver publishes: a pure function of the inventory, the
// rail map and the pools labelled for each rail.
package nicdra

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/rails"
)

// DriverName is the DRA driver's name: the domain of its attributes, its
// DeviceClass's selector and its kubelet plugin's socket directory.
const DriverName = "nic.hwipam.io"

// hwipam's device attributes, beside the standard resource.kubernetes.io/
// pciBusID, pcieRoot and numaNode (whose values compare equal to those of the
// NVIDIA GPU driver, which publishes them through the same helpers).
const (
	// AttrRail is the port's rail: the rail map's name for it, else its netdev
	// (or RDMA device), as the node's nic.hwipam.io/<rail> label names it.
	AttrRail resourceapi.QualifiedName = DriverName + "/rail"
	// AttrPool is the pool labelled nic.hwipam.io/rail=<rail> that a claim for
	// the port gets its address from (two, comma-separated, for dual-stack);
	// absent while no pool is labelled for the rail.
	AttrPool resourceapi.QualifiedName = DriverName + "/pool"
	// AttrLinkType is "ib" or "eth".
	AttrLinkType resourceapi.QualifiedName = DriverName + "/linkType"
	// AttrSpeed is the negotiated link speed in Mb/s; absent when unknown.
	AttrSpeed resourceapi.QualifiedName = DriverName + "/speedMbps"
	// AttrModel is the adapter model, e.g. ConnectX-7.
	AttrModel resourceapi.QualifiedName = DriverName + "/model"
	// AttrNetdev is the port's network interface on the host.
	AttrNetdev resourceapi.QualifiedName = DriverName + "/netdev"
	// AttrRDMA is the port's RDMA device, e.g. mlx5_0.
	AttrRDMA resourceapi.QualifiedName = DriverName + "/rdmaDevice"
	// AttrSwitch names the PCIe switch the port is behind (the root port it
	// hangs from, nicdiscovery.NIC.PCIeSwitch): closer than the root complex.
	AttrSwitch resourceapi.QualifiedName = DriverName + "/pcieSwitch"
	// AttrGPUs are the indexes of the GPUs behind the same PCIe switch, as the
	// node label nic.hwipam.io/<netdev>.gpus writes them ("0", "2.3").
	AttrGPUs resourceapi.QualifiedName = DriverName + "/gpus"
	// AttrFunction is PF or VF; AttrPF is a VF's physical function.
	AttrFunction resourceapi.QualifiedName = DriverName + "/function"
	AttrPF       resourceapi.QualifiedName = DriverName + "/pf"
	// AttrNetdevOnHost tells whether the port's netdev is in the host's
	// network namespace (or in the pod of the claim that has the port): a
	// port without it cannot be prepared, whatever the claim says.
	AttrNetdevOnHost resourceapi.QualifiedName = DriverName + "/netdevOnHost"
	// AttrPreparable tells whether a claim that takes its address from the
	// port's rail can be prepared: its netdev is on the host and a pool is
	// labelled for its rail (AttrPool). Select on it to keep the scheduler
	// off ports a claim would fail on ("unknown pool", "netdev not found").
	AttrPreparable resourceapi.QualifiedName = DriverName + "/preparable"
)

// TaintLinkDown taints a port whose link is down (Ethernet oper state, or the
// RDMA port of an InfiniBand one not ACTIVE): the scheduler hands it to no new
// claim until the link is back, instead of handing it out silently.
const TaintLinkDown = DriverName + "/link-down"

// Publish is what the published devices are made from.
type Publish struct {
	// Inventory is the node's NICs (its Root: where sys/ was read, for the
	// standard attributes).
	Inventory *nicdiscovery.Inventory
	// Rails is the rail map (ipam-node's --rail-config); nil: rails are netdevs.
	Rails nicdiscovery.Rails
	// PoolsByRail are the pools labelled for each rail, by name.
	PoolsByRail map[string][]string
	// Now stamps new taints.
	Now metav1.Time
	// InUse are the ports the CNI path uses, by PCI address: who uses it
	// ("pod ns/name, network X"). Such a port is not published.
	InUse map[string]string
	// HostLinks are the names of the links in the host's network namespace
	// (AttrNetdevOnHost); nil: not known, every netdev counts as there.
	HostLinks map[string]bool
	// HostPorts are the host's netdevs that carry its own addresses or routes
	// (or are enslaved to a bond or bridge that does), by name: why. A port
	// with such a netdev is the node's uplink and is not published.
	HostPorts map[string]string
	// Exclude are netdev names or PCI addresses never published
	// (--dra-exclude-devices).
	Exclude []string
}

// Reasons a port is withheld (WithheldDevice.Reason starts with one).
const (
	// WithheldUplink: the port carries the host's addresses or routes.
	WithheldUplink = "uplink"
	// WithheldExcluded: the port is named in --dra-exclude-devices.
	WithheldExcluded = "excluded"
	// WithheldInUse: a CNI attachment uses the port, or its netdev is in
	// another network namespace than the host's.
	WithheldInUse = "in use"
)

// Withheld returns the NIC functions of the inventory that Devices does not
// publish, and why: the node's uplink (host addresses or routes), excluded by
// the operator, or in use by the CNI path (a pod's attachment holds it, or a
// VF's netdev is in another namespace while its RDMA device is visible: a pod
// has it, whichever CNI put it there). Sorted by PCI address.
func Withheld(p Publish) []WithheldDevice {
	var out []WithheldDevice
	for _, n := range p.Inventory.NICs {
		if len(n.Netdevs) == 0 && len(n.RDMADevices) == 0 {
			continue
		}
		if why := withheld(p, n); why != "" {
			w := WithheldDevice{Device: DeviceName(n.PCIAddress), PCIAddress: n.PCIAddress, Reason: why}
			if len(n.Netdevs) > 0 {
				w.Netdev = n.Netdevs[0]
			}
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b WithheldDevice) int { return strings.Compare(a.PCIAddress, b.PCIAddress) })
	return out
}

// withheld says why a function is not published, "" when it is.
func withheld(p Publish, n nicdiscovery.NIC) string {
	netdevs := slices.Clone(n.Netdevs)
	for _, port := range n.Ports {
		if port.Netdev != "" && !slices.Contains(netdevs, port.Netdev) {
			netdevs = append(netdevs, port.Netdev)
		}
	}
	if slices.Contains(p.Exclude, n.PCIAddress) {
		return WithheldExcluded + ": " + n.PCIAddress + " is named in --dra-exclude-devices"
	}
	for _, nd := range netdevs {
		if slices.Contains(p.Exclude, nd) {
			return WithheldExcluded + ": " + nd + " is named in --dra-exclude-devices"
		}
	}
	for _, nd := range netdevs {
		if why, ok := p.HostPorts[nd]; ok {
			return WithheldUplink + ": " + nd + " " + why
		}
	}
	if who, ok := p.InUse[n.PCIAddress]; ok {
		return WithheldInUse + " by " + who
	}
	if n.Function == nicdiscovery.FunctionVF && len(netdevs) == 0 && len(n.RDMADevices) > 0 && !p.Inventory.NetdevsHidden {
		// A VF bound to its driver always has a netdev: not in the host's
		// namespace, it is in a pod's (an SR-IOV attachment), whichever IPAM
		// that pod used.
		return WithheldInUse + ": its netdev is in another network namespace (a pod's SR-IOV attachment), its RDMA device " +
			n.RDMADevices[0] + " is on the host"
	}
	return ""
}

// Devices returns one device per NVIDIA NIC port of the inventory that has a
// netdev or an RDMA device (PFs, and VFs where there are) and is not withheld
// (Withheld), sorted by name, and a warning for each attribute that could not
// be given.
func Devices(p Publish) ([]resourceapi.Device, []string) {
	inv := p.Inventory
	byRail := rails.PFRails(inv, p.Rails)
	var out []resourceapi.Device
	var warnings []string
	for _, n := range inv.NICs {
		if len(n.Netdevs) == 0 && len(n.RDMADevices) == 0 {
			continue // no port to hand out (no driver, a management function)
		}
		if withheld(p, n) != "" {
			continue // see Withheld
		}
		pf := n.PCIAddress
		if n.Function == nicdiscovery.FunctionVF {
			pf = n.PhysFn
		}
		d := resourceapi.Device{Name: DeviceName(n.PCIAddress), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
		add := func(name resourceapi.QualifiedName, v resourceapi.DeviceAttribute) { d.Attributes[name] = v }
		str := func(name resourceapi.QualifiedName, s string) {
			switch {
			case s == "":
			case len(s) > resourceapi.DeviceAttributeMaxValueLength:
				warnings = append(warnings, fmt.Sprintf("%s: %s %q is longer than an attribute may be (%d); not published",
					n.PCIAddress, name, s, resourceapi.DeviceAttributeMaxValueLength))
			default:
				add(name, resourceapi.DeviceAttribute{StringValue: &s})
			}
		}
		standard := func(a deviceattribute.DeviceAttribute, err error) {
			if err != nil {
				warnings = append(warnings, fmt.Sprintf("%s: %v", n.PCIAddress, err))
				return
			}
			add(a.Name, a.Value)
		}
		standard(deviceattribute.GetPCIBusIDAttribute(n.PCIAddress))
		standard(deviceattribute.GetPCIeRootAttributeByPCIBusID(n.PCIAddress,
			deviceattribute.WithFSFromRoot(filepath.Join(inv.Root, "sys"))))
		if n.NUMANode >= 0 {
			standard(deviceattribute.GetNUMANodeAttribute(n.NUMANode, deviceattribute.ScalarAttribute))
		}
		rail := byRail[pf]
		str(AttrRail, rail)
		pools := p.PoolsByRail[rail]
		if rail != "" && len(pools) > 0 {
			str(AttrPool, strings.Join(pools, ","))
		}
		onHost := len(n.Netdevs) > 0 && (p.HostLinks == nil || slices.ContainsFunc(n.Netdevs, func(nd string) bool { return p.HostLinks[nd] }))
		preparable := onHost && rail != "" && len(pools) > 0
		add(AttrNetdevOnHost, resourceapi.DeviceAttribute{BoolValue: &onHost})
		add(AttrPreparable, resourceapi.DeviceAttribute{BoolValue: &preparable})
		str(AttrLinkType, linkType(n.LinkLayer))
		if n.SpeedMbps > 0 {
			speed := int64(n.SpeedMbps)
			add(AttrSpeed, resourceapi.DeviceAttribute{IntValue: &speed})
		}
		str(AttrModel, n.Model)
		if len(n.Netdevs) > 0 {
			str(AttrNetdev, n.Netdevs[0])
		}
		if len(n.RDMADevices) > 0 {
			str(AttrRDMA, n.RDMADevices[0])
		}
		str(AttrSwitch, n.PCIeSwitch)
		str(AttrGPUs, joinInts(n.SwitchGPUs()))
		str(AttrFunction, n.Function)
		if n.Function == nicdiscovery.FunctionVF {
			str(AttrPF, n.PhysFn)
		}
		if why := linkDown(n); why != "" {
			now := p.Now
			d.Taints = []resourceapi.DeviceTaint{{Key: TaintLinkDown, Value: why, Effect: resourceapi.DeviceTaintEffectNoSchedule,
				TimeAdded: &now}}
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b resourceapi.Device) int { return strings.Compare(a.Name, b.Name) })
	return out, warnings
}

// DeviceName names the device of the NIC function at a PCI address: a DNS
// label, stable for as long as the card sits in its slot (netdev names are not).
func DeviceName(pciAddress string) string {
	return "pci-" + strings.NewReplacer(":", "-", ".", "-").Replace(pciAddress)
}

// linkType is the attribute value of a link layer.
func linkType(layer string) string {
	switch layer {
	case "InfiniBand":
		return "ib"
	case "Ethernet":
		return "eth"
	}
	return ""
}

// linkDown says why the function's first port is down, "" when it is up or
// cannot be told (no netdev state, no RDMA port state).
func linkDown(n nicdiscovery.NIC) string {
	if len(n.Ports) == 0 {
		return ""
	}
	p := n.Ports[0]
	switch {
	case p.OperState != "" && p.OperState != "up" && p.OperState != "unknown":
		return "oper-" + p.OperState
	case p.PortState != "" && p.PortState != "ACTIVE":
		return "port-" + strings.ToLower(p.PortState)
	}
	return ""
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ".")
}

// maxDevicesPerSlice is how many devices a slice holds: the API's bound when
// any device is tainted (devices are tainted and untainted as links go down and
// up, and a slice's layout should not change with them).
const maxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// Resources is what the driver publishes for a node: one pool named after the
// node, its devices in slices of at most maxDevicesPerSlice.
func Resources(node string, devices []resourceapi.Device) resourceslice.DriverResources {
	var pool resourceslice.Pool
	for chunk := range slices.Chunk(devices, maxDevicesPerSlice) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: chunk})
	}
	if len(pool.Slices) == 0 {
		pool.Slices = []resourceslice.Slice{{}} // an empty pool says the node has none
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: pool}}
}
