// Package rails finds the rail of the device an attachment was given: the device
// named in its network config (deviceID, pciBusID, master or device) → its PCI
// function → the physical function → the rail, named by the rail map or by the PF's
// port label. The node daemon uses it to pick a pool labelled for that rail.
package rails

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/k8snetworkplumbingwg/sriovnet"

	"github.com/hwipam/hwipam/pkg/devicename"
)

// ErrNotFound is a device this node does not have.
var ErrNotFound = errors.New("not found on this node")

// Locator finds a device's PCI function and physical function.
type Locator interface {
	// PFOfPCI returns the physical function of a PCI function: a VF's physfn, a
	// PF's own address.
	PFOfPCI(addr string) (string, error)
	// PCIOfAux returns the PCI function an auxiliary device (a sub-function such
	// as mlx5_core.sf.4) hangs off.
	PCIOfAux(name string) (string, error)
	// PCIOfNetdev returns the PCI function of a netdev of this network namespace.
	PCIOfNetdev(name string) (string, error)
	// LowerNetdevs returns the netdevs a netdev sits on: a VLAN's parent, a
	// bond's or a bridge's ports, a macvlan's master (sysfs lower_* links).
	LowerNetdevs(name string) ([]string, error)
}

// IsPCIAddress says whether s is a PCI address in domain:bus:device.function form.
func IsPCIAddress(s string) bool { return devicename.PCIAddress.Valid(s) }

// Every name a Locator is given is checked before a path is built from it, and
// what its errors say of a path is inside the sysfs tree (see sysfsPath).
var (
	pciFunction = devicename.Field{Name: "PCI function", Kinds: devicename.PCIAddress}
	auxDevice   = devicename.Field{Name: "auxiliary device", Kinds: devicename.AuxDevice}
	netdev      = devicename.Field{Name: "netdev", Kinds: devicename.Netdev}
)

// SysfsLocator reads a sys/ tree under Root: a captured one (--sysfs-root), or the
// node's (Root "/").
type SysfsLocator struct{ Root string }

func (l SysfsLocator) path(parts ...string) string {
	return filepath.Join(append([]string{l.Root, "sys"}, parts...)...)
}

// PFOfPCI implements Locator.
func (l SysfsLocator) PFOfPCI(addr string) (string, error) {
	if err := pciFunction.Check(addr); err != nil {
		return "", err
	}
	dev := l.path("bus", "pci", "devices", addr)
	if _, err := os.Stat(dev); err != nil {
		return "", fmt.Errorf("PCI function %s: %w", addr, ErrNotFound)
	}
	target, err := os.Readlink(filepath.Join(dev, "physfn"))
	if errors.Is(err, os.ErrNotExist) {
		return addr, nil
	}
	if err != nil {
		return "", fmt.Errorf("PCI function %s: reading its physfn link: %w", addr, unwrapPath(err))
	}
	if pf := filepath.Base(target); IsPCIAddress(pf) {
		return pf, nil
	}
	return "", fmt.Errorf("PCI function %s: its physfn link names no PCI function", addr)
}

// PCIOfAux implements Locator.
func (l SysfsLocator) PCIOfAux(name string) (string, error) {
	if err := auxDevice.Check(name); err != nil {
		return "", err
	}
	target, err := filepath.EvalSymlinks(l.path("bus", "auxiliary", "devices", name))
	if err != nil {
		return "", fmt.Errorf("auxiliary device %s: %w", name, ErrNotFound)
	}
	return l.pciAncestor(target, "auxiliary device "+name)
}

// PCIOfNetdev implements Locator.
func (l SysfsLocator) PCIOfNetdev(name string) (string, error) {
	if err := netdev.Check(name); err != nil {
		return "", err
	}
	target, err := filepath.EvalSymlinks(l.path("class", "net", name))
	if err != nil {
		return "", fmt.Errorf("netdev %s: %w (a netdev already moved into a pod's network namespace cannot be looked up by name: "+
			"give the network config's deviceID or pciBusID)", name, ErrNotFound)
	}
	return l.pciAncestor(target, "netdev "+name)
}

// LowerNetdevs implements Locator.
func (l SysfsLocator) LowerNetdevs(name string) ([]string, error) {
	if err := netdev.Check(name); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(l.path("class", "net", name))
	if err != nil {
		return nil, fmt.Errorf("netdev %s: %w", name, ErrNotFound)
	}
	var out []string
	for _, e := range entries {
		if lower, ok := strings.CutPrefix(e.Name(), "lower_"); ok && netdev.Check(lower) == nil {
			out = append(out, lower)
		}
	}
	return out, nil
}

// pciAncestor is the nearest directory of a sysfs device path named by a PCI
// address: /sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0/net/p0 gives
// 0000:03:00.0, .../0000:03:00.0/mlx5_core.sf.3/net/x too. Only a path inside
// the sysfs tree counts.
func (l SysfsLocator) pciAncestor(path, what string) (string, error) {
	shown, inside := l.sysfsPath(path)
	if !inside {
		return "", fmt.Errorf("%s: its sysfs entry leads outside the sysfs tree", what)
	}
	for dir := path; dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		if IsPCIAddress(filepath.Base(dir)) {
			return filepath.Base(dir), nil
		}
	}
	return "", fmt.Errorf("%s is not on a PCI device (%s)", what, shown)
}

// sysfsPath is how an error shows path, a resolved link: as /sys/..., and
// whether it is inside the sysfs tree at all (an error never shows a path that is
// not).
func (l SysfsLocator) sysfsPath(path string) (string, bool) {
	rel, err := filepath.Rel(l.path(), path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return filepath.Clean("/sys/" + rel), true
}

// unwrapPath is a file system error without the path it names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// LiveLocator is the node's own sysfs. VF → PF and auxiliary device → PF go
// through sriovnet; netdev → PCI function does not: sriovnet's
// GetPciFromNetDevice never returns for a netdev that is not on a PCI device (lo,
// a veth: its parent walk of the relative link never reaches "/"), so the link is
// resolved here, as SysfsLocator does.
type LiveLocator struct{}

// PFOfPCI implements Locator.
func (LiveLocator) PFOfPCI(addr string) (string, error) {
	if err := pciFunction.Check(addr); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(sriovnet.PciSysDir, addr)); err != nil {
		return "", fmt.Errorf("PCI function %s: %w", addr, ErrNotFound)
	}
	if _, err := os.Lstat(filepath.Join(sriovnet.PciSysDir, addr, "physfn")); errors.Is(err, os.ErrNotExist) {
		return addr, nil // a PF
	}
	pf, err := sriovnet.GetPfPciFromVfPci(addr)
	if err != nil {
		return "", fmt.Errorf("PCI function %s: %w", addr, err)
	}
	return pf, nil
}

// PCIOfAux implements Locator.
func (LiveLocator) PCIOfAux(name string) (string, error) {
	// sriovnet walks up the link until a PCI address: make sure there is one.
	if _, err := (SysfsLocator{Root: "/"}).PCIOfAux(name); err != nil {
		return "", err
	}
	pf, err := sriovnet.GetPfPciFromAux(name)
	if err != nil {
		return "", fmt.Errorf("auxiliary device %s: %w", name, err)
	}
	return pf, nil
}

// PCIOfNetdev implements Locator.
func (LiveLocator) PCIOfNetdev(name string) (string, error) {
	return SysfsLocator{Root: "/"}.PCIOfNetdev(name)
}

// LowerNetdevs implements Locator.
func (LiveLocator) LowerNetdevs(name string) ([]string, error) {
	return SysfsLocator{Root: "/"}.LowerNetdevs(name)
}
