// Package nicdiscovery inventories the NVIDIA (vendor 0x15b3) NIC functions of a
// node from a sysfs tree, plus netlink when the tree is the live one, with each
// function's PCIe root complex and the NVIDIA GPUs (vendor 0x10de) that share its
// PCIe switch or root, and derives the node labels that let a pool's nodeSelector
// follow a physical rail.
//
// The root directory is an option: tests and `ipamctl nics --sysfs-root` scan
// captured trees; the node daemon scans "/".
package nicdiscovery

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// Options configure a scan.
type Options struct {
	// Root is the directory that contains sys/; "" means "/".
	Root string
	// Logger receives warnings (ghw's among them); the zero value discards them.
	Logger logr.Logger
	// Live adds netlink attributes (operstate, MTU, MAC, addresses, devlink
	// eswitch mode). Nil means: when Root is "/".
	Live *bool
}

// Scan inventories the NVIDIA NIC functions under o.Root.
func Scan(ctx context.Context, o Options) (*Inventory, error) {
	root := o.Root
	if root == "" {
		root = "/"
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("sysfs root %q: %w", o.Root, err)
	}
	log := o.Logger
	funcs, err := enumerate(ctx, root, log)
	if err != nil {
		return nil, err
	}
	inv := &Inventory{Root: root, NICs: []NIC{}}
	var idsDB *pciNames // loaded on first use: most scans need no pci.ids
	names := func() *pciNames {
		if idsDB == nil {
			idsDB = loadPCINames(root, log)
		}
		return idsDB
	}
	for _, f := range funcs {
		if f.vendorID != VendorNVIDIA {
			continue
		}
		if why := notNIC(f.deviceID, f.classID); why != "" {
			log.V(1).Info("not a NIC", "address", f.address, "device", fmt.Sprintf("%04x", f.deviceID), "reason", why)
			continue
		}
		dir := filepath.Join(root, "sys", "bus", "pci", "devices", f.address)
		n := readFunction(dir, f)
		m, known := knownModel(f.deviceID)
		if !known && len(n.Netdevs) == 0 && len(n.RDMADevices) == 0 && n.Driver != "mlx4_core" && n.Driver != "mlx5_core" {
			log.V(1).Info("skipping an NVIDIA function that is neither a known NIC nor bound to a NIC driver",
				"address", f.address, "device", n.DeviceID)
			continue
		}
		if known {
			n.Model = m.name
		} else {
			n.Model = names().lookup(f.vendorID, f.deviceID)
		}
		if n.PhysFn != "" || m.vf {
			n.Function = FunctionVF
		}
		inv.NICs = append(inv.NICs, n)
	}
	slices.SortFunc(inv.NICs, func(a, b NIC) int { return cmp.Compare(a.PCIAddress, b.PCIAddress) })
	nameVFs(inv.NICs)
	addLocality(root, funcs, inv, names)
	if netdevsHidden(root, inv.NICs) {
		inv.NetdevsHidden = true
		for i := range inv.NICs {
			addGIDNetdevs(filepath.Join(root, "sys", "bus", "pci", "devices", inv.NICs[i].PCIAddress), &inv.NICs[i])
		}
	}
	live := root == "/"
	if o.Live != nil {
		live = *o.Live
	}
	if live {
		addLive(inv.NICs, log)
	}
	return inv, nil
}

// nameVFs names a generic VF (0x101e) after its PF: "ConnectX-7 VF".
func nameVFs(nics []NIC) {
	byAddr := make(map[string]int, len(nics))
	for i := range nics {
		byAddr[nics[i].PCIAddress] = i
	}
	for i := range nics {
		n := &nics[i]
		if n.Function != FunctionVF || n.DeviceID != "101e" || n.PhysFn == "" {
			continue
		}
		if pf, ok := byAddr[n.PhysFn]; ok && nics[pf].Function == FunctionPF {
			n.Model = nics[pf].Model + " VF"
		}
	}
}

// representorName matches the phys_port_name of a switchdev representor: of a VF
// (pf0vf3), an SF (c1pf0sf2) or a PF (pf0, the host PF seen from a BlueField's Arm
// side: pf0hpf), as opposed to an uplink (p0) or a port without one.
var representorName = regexp.MustCompile(`^(c\d+)?pf\d+`)

// readFunction reads one function's sysfs directory.
func readFunction(dir string, f pciFunction) NIC {
	n := NIC{
		PCIAddress:  f.address,
		VendorID:    fmt.Sprintf("%04x", f.vendorID),
		DeviceID:    fmt.Sprintf("%04x", f.deviceID),
		Function:    FunctionPF,
		Driver:      readDriver(dir),
		NUMANode:    readInt(filepath.Join(dir, "numa_node"), -1),
		Netdevs:     []string{},
		RDMADevices: listDir(filepath.Join(dir, "infiniband")),
	}
	if pf, err := os.Readlink(filepath.Join(dir, "physfn")); err == nil {
		n.PhysFn = filepath.Base(pf)
	} else {
		// Only a PF has VFs (and an eswitch).
		n.SRIOVTotalVFs = readInt(filepath.Join(dir, "sriov_totalvfs"), 0)
		n.SRIOVNumVFs = readInt(filepath.Join(dir, "sriov_numvfs"), 0)
	}

	var rdma rdmaDevice
	if len(n.RDMADevices) > 0 {
		rdma = readRDMA(filepath.Join(dir, "infiniband", n.RDMADevices[0]), n.RDMADevices[0])
	}
	used := map[int]bool{}
	for _, name := range listDir(filepath.Join(dir, "net")) {
		nd := filepath.Join(dir, "net", name)
		if isChild(nd) {
			// An IPoIB child (ib0.8001, one per pod with ipoib-cni) or another
			// stacked device: not a port, and it comes and goes with pods.
			continue
		}
		if representorName.MatchString(readString(filepath.Join(nd, "phys_port_name"))) {
			n.Representors = append(n.Representors, name)
			continue
		}
		n.Netdevs = append(n.Netdevs, name)
		p := Port{
			Netdev:     name,
			Number:     portNumber(nd),
			NetdevType: readInt(filepath.Join(nd, "type"), 0),
			SpeedMbps:  netdevSpeed(readString(filepath.Join(nd, "speed"))),
			OperState:  readString(filepath.Join(nd, "operstate")),
			MTU:        readInt(filepath.Join(nd, "mtu"), 0),
		}
		if p.NetdevType == arphrdEther {
			p.MAC = readString(filepath.Join(nd, "address"))
		}
		if m, err := os.Readlink(filepath.Join(nd, "master")); err == nil {
			p.Master = filepath.Base(m)
		}
		if rp, ok := rdma.ports[p.Number]; ok {
			rp.fill(&p, rdma.name)
			used[p.Number] = true
		}
		if p.LinkLayer == "" {
			p.LinkLayer = linkLayerOfType(p.NetdevType)
		}
		if n.EswitchMode == "" && n.PhysFn == "" {
			n.EswitchMode = readString(filepath.Join(nd, "compat", "devlink", "mode"))
		}
		n.Ports = append(n.Ports, p)
	}
	for num, rp := range rdma.ports {
		// An InfiniBand port without IPoIB has no netdev but is a port; the extra
		// Ethernet ports of a switchdev PF's RDMA device are its representors'.
		if !used[num] && rp.linkLayer == LinkLayerInfiniBand {
			p := Port{Number: num}
			rp.fill(&p, rdma.name)
			n.Ports = append(n.Ports, p)
		}
	}
	sortPorts(&n)
	return n
}

// sortPorts orders the ports and sets the function's first-port summary.
func sortPorts(n *NIC) {
	slices.SortFunc(n.Ports, func(a, b Port) int {
		return cmp.Or(cmp.Compare(a.Number, b.Number), cmp.Compare(a.Netdev, b.Netdev))
	})
	if len(n.Ports) > 0 {
		p := n.Ports[0]
		n.LinkLayer, n.SpeedMbps, n.PortState, n.PortGUID = p.LinkLayer, p.SpeedMbps, p.PortState, p.PortGUID
	}
}

// netdevsHidden tells a scan in a network namespace other than the host's (a pod
// without hostNetwork: its sysfs lists that namespace's netdevs only) from one on
// the host: no NIC function shows a netdev, and no netdev of the namespace is a
// physical device - a host has at least its management port, a pod only lo and
// its veth. A host whose every physical netdev was moved into pods looks the same.
func netdevsHidden(root string, nics []NIC) bool {
	rdma := false
	for _, n := range nics {
		if len(n.Netdevs) > 0 || len(n.Representors) > 0 {
			return false
		}
		rdma = rdma || len(n.RDMADevices) > 0
	}
	if !rdma {
		return false
	}
	class := filepath.Join(root, "sys", "class", "net")
	for _, name := range listDir(class) {
		if _, err := os.Stat(filepath.Join(class, name, "device")); err == nil {
			return false
		}
		target, err := os.Readlink(filepath.Join(class, name))
		if err == nil && !strings.Contains(target, "/virtual/") {
			return false
		}
	}
	return true
}

// addGIDNetdevs names the Ethernet ports of a function whose netdevs this network
// namespace does not show, from its RDMA device's GID table: gid_attrs/ndevs/<i>
// holds the name of the netdev a RoCE GID belongs to, in whatever namespace that
// netdev is. An InfiniBand port's GIDs name no netdev (the read fails). A switchdev
// RDMA device has a port per representor after the uplink's port 1: only port 1
// is taken there.
func addGIDNetdevs(dir string, n *NIC) {
	if len(n.RDMADevices) == 0 {
		return
	}
	rdmaDir := filepath.Join(dir, "infiniband", n.RDMADevices[0])
	rdma := readRDMA(rdmaDir, n.RDMADevices[0])
	have := map[int]bool{}
	for _, p := range n.Ports {
		if p.Netdev != "" {
			have[p.Number] = true
		}
	}
	added := false
	for num, rp := range rdma.ports {
		if have[num] || rp.linkLayer != LinkLayerEthernet || len(rdma.ports) > 2 && num != 1 {
			continue
		}
		name := gidNetdev(filepath.Join(rdmaDir, "ports", strconv.Itoa(num), "gid_attrs", "ndevs"))
		if name == "" || slices.Contains(n.Netdevs, name) {
			continue
		}
		p := Port{Netdev: name, Number: num, NetdevType: arphrdEther, NetdevFrom: NetdevFromRDMAGID}
		rp.fill(&p, rdma.name)
		n.Ports = append(n.Ports, p)
		n.Netdevs = append(n.Netdevs, name)
		added = true
	}
	if added {
		slices.Sort(n.Netdevs)
		sortPorts(n)
	}
}

// gidNetdev is the netdev named by the lowest-indexed GID entry that names one.
func gidNetdev(dir string) string {
	names := listDir(dir)
	slices.SortFunc(names, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return cmp.Compare(x, y)
	})
	for _, idx := range names {
		if name := readString(filepath.Join(dir, idx)); name != "" {
			return name
		}
	}
	return ""
}

// ARPHRD types of the netdevs a NIC has.
const (
	arphrdEther      = 1
	arphrdInfiniBand = 32
)

func linkLayerOfType(t int) string {
	switch t {
	case arphrdEther:
		return LinkLayerEthernet
	case arphrdInfiniBand:
		return LinkLayerInfiniBand
	}
	return ""
}

// isChild tells a netdev stacked on another (its iflink is another's ifindex),
// such as an IPoIB child interface, from a port's own netdev.
func isChild(nd string) bool {
	idx, link := readInt(filepath.Join(nd, "ifindex"), 0), readInt(filepath.Join(nd, "iflink"), 0)
	return idx > 0 && link > 0 && idx != link
}

// portNumber is the netdev's port on its function, from 1: mlx4 puts two ports'
// netdevs on one function and numbers them by dev_port (dev_id on older kernels
// for IPoIB).
func portNumber(nd string) int {
	if p := readInt(filepath.Join(nd, "dev_port"), 0); p > 0 {
		return p + 1
	}
	if s := readString(filepath.Join(nd, "dev_id")); s != "" {
		if id, err := strconv.ParseInt(strings.TrimPrefix(s, "0x"), 16, 32); err == nil && id > 0 {
			return int(id) + 1
		}
	}
	return 1
}

// netdevSpeed parses net/<if>/speed: Mb/s, or -1 / 4294967295 / empty / unreadable
// (EINVAL) when the link is down or the driver does not say.
func netdevSpeed(s string) int {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 || v >= 0xffffffff {
		return 0
	}
	return int(v)
}

// ibRate parses an RDMA port's rate, "56 Gb/sec (4X FDR)" or "2.5 Gb/sec (1X SDR)",
// into Mb/s; 0 when it does not parse.
func ibRate(s string) int {
	num, unit, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok {
		return 0
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return 0
	}
	switch {
	case strings.HasPrefix(unit, "Gb/sec"):
		return int(v*1000 + 0.5)
	case strings.HasPrefix(unit, "Mb/sec"):
		return int(v + 0.5)
	}
	return 0
}

// rdmaDevice is an RDMA device's ports by number.
type rdmaDevice struct {
	name  string
	ports map[int]rdmaPort
}

type rdmaPort struct {
	num       int
	linkLayer string
	speed     int
	state     string
	guid      string
}

func (rp rdmaPort) fill(p *Port, dev string) {
	p.RDMADevice, p.RDMAPort = dev, rp.num
	if rp.linkLayer != "" {
		p.LinkLayer = rp.linkLayer
	}
	// A port that is not ACTIVE reports the lowest rate (or a stale one), and its
	// netdev may still show the last speed: not a speed anyone should select on.
	switch {
	case rp.state != "" && rp.state != "ACTIVE":
		p.SpeedMbps = 0
	case p.SpeedMbps == 0:
		p.SpeedMbps = rp.speed
	}
	p.PortState = rp.state
	if p.LinkLayer == LinkLayerInfiniBand {
		p.PortGUID = rp.guid
	}
}

func readRDMA(dir, name string) rdmaDevice {
	d := rdmaDevice{name: name, ports: map[int]rdmaPort{}}
	for _, e := range listDir(filepath.Join(dir, "ports")) {
		num, err := strconv.Atoi(e)
		if err != nil {
			continue
		}
		pd := filepath.Join(dir, "ports", e)
		rp := rdmaPort{num: num, linkLayer: readString(filepath.Join(pd, "link_layer")),
			speed: ibRate(readString(filepath.Join(pd, "rate")))}
		// "4: ACTIVE"
		rp.state = readString(filepath.Join(pd, "state"))
		if _, after, ok := strings.Cut(rp.state, ": "); ok {
			rp.state = after
		}
		rp.guid = portGUID(readString(filepath.Join(pd, "gids", "0")))
		d.ports[num] = rp
	}
	return d
}

// portGUID is the interface ID (low 64 bits) of a port's GID 0,
// "fe80:0000:0000:0000:0002:c903:00f9:bfa1" → "0002:c903:00f9:bfa1"; "" when unset.
func portGUID(gid string) string {
	parts := strings.Split(gid, ":")
	if len(parts) != 8 {
		return ""
	}
	g := strings.Join(parts[4:], ":")
	if g == "0000:0000:0000:0000" {
		return ""
	}
	return g
}

// readDriver is the bound driver's name: the driver link's target, or the uevent's
// DRIVER= line (a captured tree may lack the drivers directory the link points to).
func readDriver(dir string) string {
	if t, err := os.Readlink(filepath.Join(dir, "driver")); err == nil {
		return filepath.Base(t)
	}
	for line := range strings.Lines(readString(filepath.Join(dir, "uevent"))) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "DRIVER="); ok {
			return v
		}
	}
	return ""
}

func readString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readInt(path string, def int) int {
	v, err := strconv.Atoi(readString(path))
	if err != nil {
		return def
	}
	return v
}

// listDir is the sorted entry names of dir; none when it does not exist.
func listDir(dir string) []string {
	es, err := os.ReadDir(dir)
	if err != nil {
		return []string{}
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
