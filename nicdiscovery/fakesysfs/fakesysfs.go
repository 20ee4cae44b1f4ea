// Package fakesysfs builds sysfs trees with the file shapes of real Linux machines
// with NVIDIA NICs, for tests and benchmarks of nicdiscovery where the hardware is
// not there: the same files, symlinks and value formats as the captured trees in
// testdata (hwloc's gathers of a ConnectX-3 and a ConnectX-4 machine) and as the
// mlx5 driver writes them (sriov_*, virtfnN/physfn, phys_port_name,
// compat/devlink/mode). It also unpacks those captured trees.
package fakesysfs

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Tree is a sysfs tree under Root (Root/sys/...).
type Tree struct {
	Root string

	ifindex map[string]int    // netdev name → its ifindex
	dirs    map[string]string // PCI address → its directory under sys/devices
	uverbs  int               // user verbs devices made so far
}

// New creates the skeleton of a tree under root.
func New(root string) (*Tree, error) {
	t := &Tree{Root: root, ifindex: map[string]int{}, dirs: map[string]string{}}
	for _, d := range []string{"sys/bus/pci/devices", "sys/bus/pci/drivers", "sys/class/net", "sys/class/infiniband",
		"sys/devices/virtual/net"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Function is one PCI function.
type Function struct {
	Address string
	// Parent is the PCI bridge (root port or switch port) the function sits
	// behind, added before it: its directory is made inside the bridge's, as in
	// real sysfs (sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/...). ""
	// puts it directly under a root complex named after its own bus,
	// sys/devices/pci0000:<bus>/<address>.
	Parent string
	Vendor uint16
	Device uint16
	// Class is the 24-bit class code, 0x020000 for an Ethernet controller.
	Class uint32
	// Driver is the bound driver; "" leaves the function unbound.
	Driver string
	// NUMA is written to numa_node (-1: the platform does not say).
	NUMA     int
	TotalVFs int
	NumVFs   int
	Netdevs  []Netdev
	RDMA     *RDMA
}

// Netdev is a network interface of a function.
type Netdev struct {
	Name string
	// Type is the ARPHRD type: 1 Ethernet, 32 IPoIB.
	Type int
	// Speed is written to speed; 0 writes "-1" (link down) for Ethernet and leaves
	// it empty for IPoIB, as older kernels do (the ConnectX-3 capture).
	Speed        int
	OperState    string
	MTU          int
	MAC          string
	DevPort      int
	DevID        int
	PhysPortName string
	// Master is a bond the netdev is enslaved to; it is created as a virtual netdev.
	Master string
	// EswitchMode is written to compat/devlink/mode when set.
	EswitchMode string
	// Parent makes this a stacked netdev (an IPoIB child such as ib0.8001): its
	// iflink is the parent's ifindex. The parent must be added first.
	Parent string
}

// RDMA is the function's RDMA device.
type RDMA struct {
	Name     string
	NodeGUID string
	Ports    []RDMAPort
}

// RDMAPort is a port of an RDMA device.
type RDMAPort struct {
	Num       int
	LinkLayer string
	// Rate as the kernel writes it: "400 Gb/sec (4X NDR)".
	Rate  string
	State string // "4: ACTIVE"
	// GID0 is the port's first GID, "fe80:0000:0000:0000:<port GUID>".
	GID0 string
	// NDev is the netdev the port's RoCE GIDs belong to (gid_attrs/ndevs/0).
	// "" on an Ethernet port means the function's netdev of this port, or its
	// bond master; an InfiniBand port's GIDs name no netdev.
	NDev string
}

// sys is a path under Root/sys.
func (t *Tree) sys(parts ...string) string {
	return filepath.Join(append([]string{t.Root, "sys"}, parts...)...)
}

// devDir is where a function's directory lives: inside its parent bridge's, or
// directly under its root complex.
func (t *Tree) devDir(addr string) string {
	if d, ok := t.dirs[addr]; ok {
		return d
	}
	return filepath.Join(t.Root, "sys", "devices", "pci"+addr[:7], addr)
}

// Add creates a function.
func (t *Tree) Add(f Function) error {
	if len(f.Address) != len("0000:00:00.0") {
		return fmt.Errorf("bad PCI address %q", f.Address)
	}
	if _, dup := t.dirs[f.Address]; dup {
		return fmt.Errorf("PCI address %s added twice", f.Address)
	}
	dir := t.devDir(f.Address)
	if f.Parent != "" {
		p, ok := t.dirs[f.Parent]
		if !ok {
			return fmt.Errorf("function %s: parent bridge %s not added yet", f.Address, f.Parent)
		}
		dir = filepath.Join(p, f.Address)
	}
	return t.add(f, dir)
}

// add creates a function in dir.
func (t *Tree) add(f Function, dir string) error {
	t.dirs[f.Address] = dir
	files := map[string]string{
		"vendor":    fmt.Sprintf("0x%04x", f.Vendor),
		"device":    fmt.Sprintf("0x%04x", f.Device),
		"class":     fmt.Sprintf("0x%06x", f.Class),
		"numa_node": strconv.Itoa(f.NUMA),
		"modalias": fmt.Sprintf("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X", f.Vendor, f.Device, f.Vendor, 0,
			f.Class>>16, (f.Class>>8)&0xff, f.Class&0xff),
		"uevent": fmt.Sprintf("PCI_CLASS=%X\nPCI_ID=%04X:%04X\nPCI_SLOT_NAME=%s\n", f.Class, f.Vendor, f.Device, f.Address),
	}
	if f.Driver != "" {
		files["uevent"] = "DRIVER=" + f.Driver + "\n" + files["uevent"]
	}
	if f.TotalVFs > 0 {
		files["sriov_totalvfs"] = strconv.Itoa(f.TotalVFs)
		files["sriov_numvfs"] = strconv.Itoa(f.NumVFs)
	}
	if err := writeFiles(dir, files); err != nil {
		return err
	}
	rel, _ := filepath.Rel(t.sys("bus", "pci", "devices"), dir)
	if err := os.Symlink(rel, t.sys("bus", "pci", "devices", f.Address)); err != nil {
		return err
	}
	if f.Driver != "" {
		drv := t.sys("bus", "pci", "drivers", f.Driver)
		if err := os.MkdirAll(drv, 0o755); err != nil {
			return err
		}
		if err := relLink(drv, filepath.Join(dir, "driver")); err != nil {
			return err
		}
	}
	for _, nd := range f.Netdevs {
		if err := t.addNetdev(dir, nd); err != nil {
			return err
		}
	}
	if f.RDMA != nil {
		if err := t.addRDMA(dir, f.RDMA, f.Netdevs); err != nil {
			return err
		}
	}
	return nil
}

// AddBridge creates a PCI-to-PCI bridge (class 0x060400, bound to pcieport): a
// root port when parent is "" (directly under the root complex named after its
// bus), else a switch port behind parent. Functions behind it name it as their
// Parent.
func (t *Tree) AddBridge(addr, parent string, vendor, device uint16, numa int) error {
	return t.Add(Function{Address: addr, Parent: parent, Vendor: vendor, Device: device, Class: ClassBridge,
		Driver: "pcieport", NUMA: numa})
}

// AddVF creates a VF of pf as its virtfn<index>, with the physfn link back. The
// VF's directory is a sibling of its PF's (behind the same bridge), as the kernel
// places it; vf.Parent is ignored.
func (t *Tree) AddVF(pf string, index int, vf Function) error {
	pfDir, ok := t.dirs[pf]
	if !ok {
		return fmt.Errorf("VF %s: PF %s not added yet", vf.Address, pf)
	}
	if _, dup := t.dirs[vf.Address]; dup {
		return fmt.Errorf("PCI address %s added twice", vf.Address)
	}
	if err := t.add(vf, filepath.Join(filepath.Dir(pfDir), vf.Address)); err != nil {
		return err
	}
	return errors.Join(
		relLink(t.devDir(vf.Address), filepath.Join(t.devDir(pf), "virtfn"+strconv.Itoa(index))),
		relLink(t.devDir(pf), filepath.Join(t.devDir(vf.Address), "physfn")))
}

// Remove takes a function out of the tree, as a hot-unplug or a driver unbind
// that also removes the device would; a bridge goes with everything behind it.
func (t *Tree) Remove(addr string) error {
	dir := t.devDir(addr)
	gone := []string{addr}
	for a, d := range t.dirs {
		if strings.HasPrefix(d, dir+string(filepath.Separator)) {
			gone = append(gone, a)
		}
	}
	var errs []error
	for _, a := range gone {
		for _, class := range []string{"net", "infiniband"} {
			for _, name := range listNames(filepath.Join(t.devDir(a), class)) {
				_ = os.Remove(t.sys("class", class, name))
			}
		}
		errs = append(errs, os.Remove(t.sys("bus", "pci", "devices", a)))
		delete(t.dirs, a)
	}
	return errors.Join(append(errs, os.RemoveAll(dir))...)
}

// Unbind unbinds the function's driver (as a driver reload does for a moment).
func (t *Tree) Unbind(addr string) error {
	dir := t.devDir(addr)
	b, err := os.ReadFile(filepath.Join(dir, "uevent"))
	if err != nil {
		return err
	}
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "DRIVER=") {
			keep = append(keep, l)
		}
	}
	return errors.Join(os.Remove(filepath.Join(dir, "driver")),
		os.WriteFile(filepath.Join(dir, "uevent"), []byte(strings.Join(keep, "\n")+"\n"), 0o644))
}

// MoveNetdev takes a netdev out of the function's net/ directory, as moving it into
// a pod's or VM's network namespace (host-device CNI) does on the host.
func (t *Tree) MoveNetdev(addr, name string) error {
	return errors.Join(os.Remove(t.sys("class", "net", name)), os.RemoveAll(filepath.Join(t.devDir(addr), "net", name)))
}

// PodView makes the tree what a pod without hostNetwork sees of the same machine:
// sysfs mounted in the pod's network namespace lists only that namespace's netdevs
// (lo and the pod's veth eth0), so the functions' net/ directories and the host's
// /sys/class/net entries are gone; PCI functions and RDMA devices (shared RDMA
// namespace mode) stay.
func (t *Tree) PodView() error {
	var errs []error
	for _, name := range listNames(t.sys("class", "net")) {
		errs = append(errs, os.Remove(t.sys("class", "net", name)))
	}
	for _, addr := range listNames(t.sys("bus", "pci", "devices")) {
		errs = append(errs, os.RemoveAll(filepath.Join(t.devDir(addr), "net")))
	}
	errs = append(errs, os.RemoveAll(t.sys("devices", "virtual", "net")))
	for _, v := range []struct{ name, typ string }{{"lo", "772"}, {"eth0", "1"}} {
		dir := t.sys("devices", "virtual", "net", v.name)
		errs = append(errs, writeFiles(dir, map[string]string{"type": v.typ, "operstate": "up"}),
			relLink(dir, t.sys("class", "net", v.name)))
	}
	return errors.Join(errs...)
}

func (t *Tree) addNetdev(dev string, nd Netdev) error {
	dir := filepath.Join(dev, "net", nd.Name)
	speed := ""
	switch {
	case nd.Speed > 0:
		speed = strconv.Itoa(nd.Speed)
	case nd.Type != 32:
		speed = "-1"
	}
	files := map[string]string{
		"type": strconv.Itoa(nd.Type), "speed": speed, "operstate": nd.OperState, "mtu": strconv.Itoa(nd.MTU),
		"address": nd.MAC, "dev_port": strconv.Itoa(nd.DevPort), "dev_id": fmt.Sprintf("0x%x", nd.DevID),
	}
	idx := len(t.ifindex) + 2 // 1 is lo
	t.ifindex[nd.Name] = idx
	files["ifindex"] = strconv.Itoa(idx)
	files["iflink"] = strconv.Itoa(idx)
	if nd.Parent != "" {
		p, ok := t.ifindex[nd.Parent]
		if !ok {
			return fmt.Errorf("netdev %s: parent %s not added yet", nd.Name, nd.Parent)
		}
		files["iflink"] = strconv.Itoa(p)
	}
	if nd.PhysPortName != "" {
		files["phys_port_name"] = nd.PhysPortName
	}
	if nd.EswitchMode != "" {
		files["compat/devlink/mode"] = nd.EswitchMode
	}
	if err := writeFiles(dir, files); err != nil {
		return err
	}
	if err := relLink(dir, t.sys("class", "net", nd.Name)); err != nil {
		return err
	}
	if nd.Master != "" {
		m := t.sys("devices", "virtual", "net", nd.Master)
		if err := writeFiles(m, map[string]string{"type": "1", "operstate": "up"}); err != nil {
			return err
		}
		if _, err := os.Lstat(t.sys("class", "net", nd.Master)); err != nil {
			if err := relLink(m, t.sys("class", "net", nd.Master)); err != nil {
				return err
			}
		}
		// The kernel links a bond and its slaves both ways: master and
		// upper_<bond> in the slave's directory, lower_<slave> in the bond's.
		if err := errors.Join(relLink(m, filepath.Join(dir, "master")), relLink(m, filepath.Join(dir, "upper_"+nd.Master)),
			relLink(dir, filepath.Join(m, "lower_"+nd.Name))); err != nil {
			return err
		}
	}
	return nil
}

// AddVLAN adds a VLAN netdev on the netdev parent (a port or a bond), as
// `ip link add link <parent> name <name> type vlan` does: a virtual netdev
// with lower_<parent>, and upper_<name> in the parent's directory.
func (t *Tree) AddVLAN(name, parent string) error {
	dir := t.sys("devices", "virtual", "net", name)
	pdir, err := filepath.EvalSymlinks(t.sys("class", "net", parent))
	if err != nil {
		return fmt.Errorf("VLAN %s: parent %s: %w", name, parent, err)
	}
	return errors.Join(writeFiles(dir, map[string]string{"type": "1", "operstate": "up"}),
		relLink(dir, t.sys("class", "net", name)), relLink(pdir, filepath.Join(dir, "lower_"+parent)),
		relLink(dir, filepath.Join(pdir, "upper_"+name)))
}

func (t *Tree) addRDMA(dev string, r *RDMA, netdevs []Netdev) error {
	dir := filepath.Join(dev, "infiniband", r.Name)
	files := map[string]string{"node_guid": r.NodeGUID, "node_type": "1: CA"}
	for _, p := range r.Ports {
		pre := filepath.Join("ports", strconv.Itoa(p.Num))
		files[filepath.Join(pre, "link_layer")] = p.LinkLayer
		files[filepath.Join(pre, "rate")] = p.Rate
		files[filepath.Join(pre, "state")] = p.State
		files[filepath.Join(pre, "phys_state")] = "5: LinkUp"
		files[filepath.Join(pre, "gids", "0")] = p.GID0
		if p.LinkLayer != "Ethernet" {
			// The kernel lists gid_attrs for an InfiniBand port too, but reading
			// its ndevs fails (EINVAL): left out here.
			files[filepath.Join(pre, "gid_attrs", "types", "0")] = "IB/RoCE v1"
			continue
		}
		ndev := p.NDev
		for _, nd := range netdevs {
			if ndev == "" && nd.Type == 1 && nd.DevPort == p.Num-1 && nd.Parent == "" {
				ndev = cmp.Or(nd.Master, nd.Name)
			}
		}
		// RoCE v1 and v2 GIDs of the link-local address, both on the port's netdev.
		for i, typ := range []string{"IB/RoCE v1", "RoCE v2"} {
			files[filepath.Join(pre, "gid_attrs", "types", strconv.Itoa(i))] = typ
			files[filepath.Join(pre, "gid_attrs", "ndevs", strconv.Itoa(i))] = ndev
		}
	}
	if err := writeFiles(dir, files); err != nil {
		return err
	}
	// Its user verbs device, as ib_uverbs makes them (char major 231, minors
	// from 192), and the rdma_cm misc device (rdma_ucm) the node has once.
	verbs := fmt.Sprintf("uverbs%d", t.uverbs)
	if err := writeFiles(filepath.Join(dev, "infiniband_verbs", verbs), map[string]string{
		"dev": fmt.Sprintf("231:%d", 192+t.uverbs), "ibdev": r.Name}); err != nil {
		return err
	}
	t.uverbs++
	if err := writeFiles(t.sys("class", "misc", "rdma_cm"), map[string]string{"dev": "10:58"}); err != nil {
		return err
	}
	return relLink(dir, t.sys("class", "infiniband", r.Name))
}

func writeFiles(dir string, files map[string]string) error {
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// relLink makes link point at target with a relative path, as sysfs does.
func relLink(target, link string) error {
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		return err
	}
	return os.Symlink(rel, link)
}

func listNames(dir string) []string {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// GUID formats a 64-bit GUID the way sysfs does: "0002:c903:00f9:bfa1".
func GUID(v uint64) string {
	s := fmt.Sprintf("%016x", v)
	return strings.Join([]string{s[0:4], s[4:8], s[8:12], s[12:16]}, ":")
}
