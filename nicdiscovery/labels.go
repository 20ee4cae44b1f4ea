package nicdiscovery

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// LabelPrefix is the prefix of every label the node daemon owns.
const LabelPrefix = "nic.hwipam.io/"

// Label keys (after LabelPrefix) that are not per netdev.
const (
	LabelPresent = LabelPrefix + "present"
	LabelCount   = LabelPrefix + "count"
	LabelRDMA    = LabelPrefix + "rdma"
	// LabelNetdevs is "hidden" when the scan ran in a network namespace that does
	// not show the NICs' netdevs (Inventory.NetdevsHidden): InfiniBand ports are
	// then labelled by their RDMA device instead of their IPoIB netdev.
	LabelNetdevs = LabelPrefix + "netdevs"
)

// Rails maps a rail name to the netdev names and PCI addresses that form it; on a
// node the first of them that is a PF port there names the rail's netdev.
type Rails map[string][]string

// LoadRails reads a rail map, YAML:
//
//	rail0: [ibp24s0, "0000:18:00.0"]
//	rail1: [ibp64s0]
func LoadRails(path string) (Rails, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the rail map: %w", err)
	}
	return ParseRails(b, path)
}

// ParseRails reads a rail map's content, as LoadRails does; source names where
// it came from in errors.
func ParseRails(b []byte, source string) (Rails, error) {
	path := source
	var r Rails
	if err := yaml.UnmarshalStrict(b, &r); err != nil {
		return nil, fmt.Errorf("rail map %s: %w; want a map of rail name to a list of netdev names or PCI addresses", path, err)
	}
	for name, members := range r {
		if errs := validation.IsQualifiedName(LabelPrefix + "rail." + name); len(errs) > 0 {
			return nil, fmt.Errorf("rail map %s: rail name %q does not make a valid label key: %s", path, name, strings.Join(errs, "; "))
		}
		if len(members) == 0 {
			return nil, fmt.Errorf("rail map %s: rail %q lists no netdev or PCI address", path, name)
		}
	}
	return r, nil
}

// longestSuffix is the longest of a port's attribute keys after its name part:
// the name part must leave room for it within the 63 characters a label name
// may have.
const longestSuffix = ".pcieroot"

// gpuList is the label value for GPU indexes: "0", "0.1" (dot-separated; a
// label value cannot hold a comma); "" for none. False when they do not fit in
// a label value.
func gpuList(idx []int) (string, bool) {
	parts := make([]string, len(idx))
	for i, x := range idx {
		parts[i] = strconv.Itoa(x)
	}
	v := strings.Join(parts, ".")
	return v, len(v) <= validation.LabelValueMaxLength
}

// reservedKeys are the label names a netdev name cannot take.
var reservedKeys = map[string]bool{"present": true, "count": true, "rdma": true, "netdevs": true}

// invalidLabelChars are the characters a label name or value cannot hold.
var invalidLabelChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// labelSafe makes s a valid label value and name part: invalid characters become
// "_", and it must start and end with a letter or digit. "" when nothing is left.
func labelSafe(s string) string {
	s = invalidLabelChars.ReplaceAllString(s, "_")
	s = strings.TrimFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
	})
	return s
}

// ownsPorts tells whether a function's ports are the node's NIC ports: a PF, or a
// VF whose PF is not on this node (passed through to a VM).
func ownsPorts(n NIC) bool {
	return n.Function == FunctionPF || n.PhysFn == ""
}

// Labels is the label set of DESIGN.md §4 for an inventory, with a warning for
// each netdev or rail that cannot be labelled. Labels hold only slow-changing
// facts: never a link's state.
func Labels(inv *Inventory, rails Rails) (map[string]string, []string) {
	labels, warnings, _ := labelSet(inv, rails)
	return labels, warnings
}

// PortLabel says which label a NIC port is published under.
type PortLabel struct {
	PCIAddress string `json:"pciAddress"`
	// Port is the port's number on its function.
	Port int `json:"port"`
	// Key is the port's label key, nic.hwipam.io/<name>.
	Key string `json:"key"`
	// Rails are the rail map's rails that name this port.
	Rails []string `json:"rails,omitempty"`
}

// PortLabels lists the labelled ports of an inventory, in inventory order.
func PortLabels(inv *Inventory, rails Rails) []PortLabel {
	_, _, ports := labelSet(inv, rails)
	return ports
}

func labelSet(inv *Inventory, rails Rails) (map[string]string, []string, []PortLabel) {
	labels := map[string]string{}
	var portLabels []PortLabel
	var warnings []string
	byNetdev := map[string]string{} // netdev → its label name part
	firstNetdev := map[string]string{}
	ports, pfs := 0, 0
	for _, n := range inv.NICs {
		if len(n.RDMADevices) > 0 {
			labels[LabelRDMA] = "true"
		}
		if !ownsPorts(n) {
			continue
		}
		pfs++
		for _, p := range n.Ports {
			netdev := p.Netdev
			if netdev == "" && inv.NetdevsHidden && p.RDMADevice != "" {
				// The port's netdev (IPoIB) exists on the host, but this network
				// namespace cannot name it: label the port by its RDMA device.
				netdev = p.RDMADevice
				if p.RDMAPort > 1 {
					netdev += "_p" + strconv.Itoa(p.RDMAPort)
				}
				warnings = append(warnings, fmt.Sprintf("%s port %d of %s: its netdev is not visible from this network "+
					"namespace (the daemon runs without hostNetwork); labelled by its RDMA device as %q",
					p.RDMADevice, p.RDMAPort, n.PCIAddress, netdev))
			}
			if netdev == "" {
				continue
			}
			ports++
			// "." separates a netdev's keys (ib0.speed, rail.x): not part of a name.
			key := labelSafe(strings.ReplaceAll(netdev, ".", "_"))
			if key == "" || len(key) > validation.LabelValueMaxLength-len(longestSuffix) || reservedKeys[key] {
				warnings = append(warnings, fmt.Sprintf("netdev %q of %s cannot be made a label key of its own; not labelled",
					netdev, n.PCIAddress))
				continue
			}
			if key != netdev {
				warnings = append(warnings, fmt.Sprintf("netdev %q is labelled as %q", netdev, key))
			}
			if _, dup := labels[LabelPrefix+key]; dup {
				warnings = append(warnings, fmt.Sprintf("netdev %q of %s gives the label key %q another netdev has; not labelled",
					p.Netdev, n.PCIAddress, key))
				continue
			}
			kind := "eth"
			if p.LinkLayer == LinkLayerInfiniBand {
				kind = "ib"
			}
			base := LabelPrefix + key
			labels[base] = kind
			if m := labelSafe(n.Model); m != "" && len(m) <= validation.LabelValueMaxLength {
				labels[base+".model"] = m
			}
			if p.SpeedMbps > 0 {
				labels[base+".speed"] = strconv.Itoa(p.SpeedMbps)
			}
			labels[base+".vfs"] = strconv.Itoa(n.SRIOVNumVFs)
			if n.NUMANode >= 0 {
				labels[base+".numa"] = strconv.Itoa(n.NUMANode)
			}
			if r := labelSafe(n.PCIeRoot); r != "" {
				labels[base+".pcieroot"] = r
			}
			if v, ok := gpuList(n.SwitchGPUs()); ok && v != "" {
				labels[base+".gpus"] = v
			} else if !ok {
				warnings = append(warnings, fmt.Sprintf("%s: the indexes of the %d GPUs behind its PCIe switch do not fit "+
					"in a label value; no %s.gpus label", n.PCIAddress, len(n.SwitchGPUs()), key))
			}
			portLabels = append(portLabels, PortLabel{PCIAddress: n.PCIAddress, Port: p.Number, Key: base})
			byNetdev[netdev] = key
			if _, ok := firstNetdev[n.PCIAddress]; !ok {
				firstNetdev[n.PCIAddress] = netdev
			}
		}
	}
	if pfs > 0 {
		labels[LabelPresent] = "true"
		labels[LabelCount] = strconv.Itoa(ports)
		if inv.NetdevsHidden {
			labels[LabelNetdevs] = "hidden"
		}
	}
	names := make([]string, 0, len(rails))
	for name := range rails {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		key := LabelPrefix + "rail." + name
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			warnings = append(warnings, fmt.Sprintf("rail %q does not make a valid label key; not labelled", name))
			continue
		}
		for _, member := range rails[name] {
			netdev := member
			if nd, ok := firstNetdev[member]; ok {
				netdev = nd
			}
			if v, ok := byNetdev[netdev]; ok {
				labels[key] = v
				for i := range portLabels {
					if portLabels[i].Key == LabelPrefix+v {
						portLabels[i].Rails = append(portLabels[i].Rails, name)
					}
				}
				break
			}
		}
		if _, ok := labels[key]; !ok && inv.NetdevsHidden {
			warnings = append(warnings, fmt.Sprintf("rail %q: none of %v is visible from this network namespace; "+
				"name the rail's functions by PCI address in the rail map", name, rails[name]))
		}
	}
	return labels, warnings, portLabels
}
