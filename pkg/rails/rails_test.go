package rails_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/devicename"
	"github.com/hwipam/hwipam/pkg/rails"
)

// resolver reads tree t, rescanning when asked for a fresh inventory.
func resolver(t *testing.T, root string, railMap nicdiscovery.Rails) (*rails.Resolver, *int) {
	t.Helper()
	scans := 0
	var last *nicdiscovery.Inventory
	return &rails.Resolver{Locator: rails.SysfsLocator{Root: root}, Rails: railMap,
		Inventory: func(fresh bool) (*nicdiscovery.Inventory, error) {
			if last == nil || fresh {
				scans++
				inv, err := nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: root, Live: new(bool)})
				if err != nil {
					return nil, err
				}
				last = inv
			}
			return last, nil
		}}, &scans
}

func TestResolveSRIOV(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	// A sub-function of PF 1, as mlx5 exposes it on the auxiliary bus.
	sf := filepath.Join(tree.Root, "sys", "devices", "pci0000:3b", "0000:3b:00.1", "mlx5_core.sf.4")
	aux := filepath.Join(tree.Root, "sys", "bus", "auxiliary", "devices")
	if err := errors.Join(os.MkdirAll(sf, 0o755), os.MkdirAll(aux, 0o755)); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(aux, sf)
	if err := os.Symlink(rel, filepath.Join(aux, "mlx5_core.sf.4")); err != nil {
		t.Fatal(err)
	}
	r, _ := resolver(t, tree.Root, nil)
	for _, c := range []struct {
		dev                rails.Device
		function, pf, rail string
	}{
		{rails.Device{DeviceID: "0000:3c:00.1"}, "0000:3c:00.1", "0000:3b:00.0", "ens1f0np0"},
		{rails.Device{DeviceID: "0000:3d:00.3"}, "0000:3d:00.3", "0000:3b:00.1", "ens1f1np1"},
		{rails.Device{DeviceID: "0000:3b:00.1"}, "0000:3b:00.1", "0000:3b:00.1", "ens1f1np1"},
		{rails.Device{DeviceID: "mlx5_core.sf.4"}, "0000:3b:00.1", "0000:3b:00.1", "ens1f1np1"},
		{rails.Device{PCIBusID: "0000:3c:00.2"}, "0000:3c:00.2", "0000:3b:00.0", "ens1f0np0"},
		{rails.Device{Master: "ens1f1np1"}, "0000:3b:00.1", "0000:3b:00.1", "ens1f1np1"},
		{rails.Device{Netdev: "ens1f0v3"}, "0000:3c:00.3", "0000:3b:00.0", "ens1f0np0"},
		// deviceID wins over the others.
		{rails.Device{DeviceID: "0000:3c:00.0", PCIBusID: "0000:3d:00.0", Master: "ens1f1np1"}, "0000:3c:00.0", "0000:3b:00.0", "ens1f0np0"},
	} {
		got, err := r.Resolve(c.dev)
		if err != nil || got != (rails.Resolution{Function: c.function, PF: c.pf, Rail: c.rail}) {
			t.Errorf("%s: %+v %v, want function %s, PF %s, rail %s", c.dev, got, err, c.function, c.pf, c.rail)
		}
	}

	// A VF moved into a pod's network namespace: its netdev is gone from the
	// host's view, its PCI function is not.
	if err := tree.MoveNetdev("0000:3c:00.2", "ens1f0v2"); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Resolve(rails.Device{DeviceID: "0000:3c:00.2"}); err != nil || got.Rail != "ens1f0np0" {
		t.Errorf("VF in a pod's netns by deviceID: %+v %v", got, err)
	}
	_, err = r.Resolve(rails.Device{Netdev: "ens1f0v2"})
	if !errors.Is(err, rails.ErrNotFound) || !strings.Contains(err.Error(), "give the network config's deviceID or pciBusID") {
		t.Errorf("VF in a pod's netns by name: %v, want not found with what to do", err)
	}
}

func TestResolveErrorsNameTheRails(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := resolver(t, tree.Root, nil)
	for _, c := range []struct {
		dev  rails.Device
		want string
	}{
		{rails.Device{DeviceID: "0000:99:00.0"}, `deviceID "0000:99:00.0": PCI function 0000:99:00.0: not found on this node; this node's rails: ens1f0np0, ens1f1np1`},
		{rails.Device{DeviceID: "mlx5_core.sf.9"}, `deviceID "mlx5_core.sf.9": auxiliary device mlx5_core.sf.9: not found on this node`},
		{rails.Device{Master: "eth7"}, `master "eth7": netdev eth7: not found on this node`},
		{rails.Device{PCIBusID: "3b:00.0"}, `pciBusID "3b:00.0" is not a PCI address`},
		{rails.Device{Netdev: "../x"}, `not a netdev name`},
		{rails.Device{}, rails.ErrNoDevice.Error()},
	} {
		_, err := r.Resolve(c.dev)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.dev, err, c.want)
		}
	}
}

// TestResolveRefusesWhatIsNoName: a device field that is not a name of what it
// can be (a path, a NUL, an overlong value...) is refused before any path is
// built from it, with what a valid value looks like, in every field; and no
// error shows a path outside the sysfs tree, nor the tree's own location. The
// tree has a directory beside sys/ that a path could reach, with a PCI
// address's name inside, and a netdev link leading out of sys/.
func TestResolveRefusesWhatIsNoName(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(tree.Root, "secret")
	if err := os.MkdirAll(filepath.Join(secret, "0000:3b:00.0", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, _ := resolver(t, tree.Root, nil)
	hostile := []string{
		"../../../../secret/0000:3b:00.0/x", // resolved to a rail by its parent's name on the old code
		"../../../../secret",
		"../../../secret",
		"../../../../secret/none",
		secret,
		"/etc/passwd",
		"..",
		".",
		"mlx5_core.sf.4\x00",
		"\x00",
		strings.Repeat("a", 300),
		strings.Repeat("../", 200) + "etc",
		"eth0 x",
		"eth0\n",
	}
	for _, v := range hostile {
		for _, dev := range []rails.Device{{DeviceID: v}, {PCIBusID: v}, {Master: v}, {Netdev: v},
			{DeviceID: "0000:3c:00.1", Master: v}} { // a set field is checked even where another is used
			got, err := r.Resolve(dev)
			if !errors.Is(err, devicename.ErrInvalid) || !strings.Contains(err.Error(), "e.g.") {
				t.Errorf("%+v: %+v %v, want refused as no device name, with what one looks like", dev, got, err)
			}
			if err != nil && strings.Contains(err.Error(), tree.Root) && !strings.Contains(v, tree.Root) {
				t.Errorf("%+v: the error shows a host path: %v", dev, err)
			}
		}
	}

	// A netdev whose sysfs entry leads out of sys/: not followed into an error.
	if err := os.Symlink("../../../secret/0000:3b:00.0/x", filepath.Join(tree.Root, "sys", "class", "net", "evil0")); err != nil {
		t.Fatal(err)
	}
	_, err = r.Resolve(rails.Device{Master: "evil0"})
	if err == nil || strings.Contains(err.Error(), tree.Root) || !strings.Contains(err.Error(), "leads outside the sysfs tree") {
		t.Errorf("a netdev leading out of sysfs: %v, want refused without the path", err)
	}
	// A netdev not on a PCI device is shown by its sysfs path, from /sys.
	virtual := filepath.Join(tree.Root, "sys", "devices", "virtual", "net", "veth9")
	if err := os.MkdirAll(virtual, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../devices/virtual/net/veth9", filepath.Join(tree.Root, "sys", "class", "net", "veth9")); err != nil {
		t.Fatal(err)
	}
	_, err = r.Resolve(rails.Device{Master: "veth9"})
	if err == nil || !strings.Contains(err.Error(), "netdev veth9 is not on a PCI device (/sys/devices/virtual/net/veth9)") ||
		strings.Contains(err.Error(), tree.Root) {
		t.Errorf("a virtual netdev: %v, want not on a PCI device, shown from /sys", err)
	}
	// The Locator checks what it is given too.
	l := rails.SysfsLocator{Root: tree.Root}
	for name, f := range map[string]func(string) (string, error){"PFOfPCI": l.PFOfPCI, "PCIOfAux": l.PCIOfAux,
		"PCIOfNetdev": l.PCIOfNetdev, "live PFOfPCI": rails.LiveLocator{}.PFOfPCI, "live PCIOfAux": rails.LiveLocator{}.PCIOfAux,
		"live PCIOfNetdev": rails.LiveLocator{}.PCIOfNetdev} {
		if got, err := f("../../../../secret"); !errors.Is(err, devicename.ErrInvalid) {
			t.Errorf("%s of a path: %q %v, want refused", name, got, err)
		}
	}
}

// TestResolveDGXRailMap: a DGX-H100-like node's IB rails, named by the PF's
// netdev, by the rail map, and — in a pod without hostNetwork — by the RDMA device
// the node's labels use; a non-NVIDIA NIC is no rail.
func TestResolveDGXRailMap(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r, _ := resolver(t, tree.Root, nil)
	if got, err := r.Resolve(rails.Device{Master: "ibp64s0"}); err != nil || got.Rail != "ibp64s0" || got.PF != "0000:40:00.0" {
		t.Errorf("ipoib master ibp64s0: %+v %v", got, err)
	}
	if got, err := r.Resolve(rails.Device{Master: "ibp24s0.8001"}); err != nil || got.Rail != "ibp24s0" {
		t.Errorf("an IPoIB child's parent PF: %+v %v", got, err)
	}
	_, err = r.Resolve(rails.Device{Master: "eno1"})
	if err == nil || !strings.Contains(err.Error(), "physical function 0000:06:00.0 is not an NVIDIA NIC port of this node") ||
		!strings.Contains(err.Error(), "ibp220s0, ibp24s0") {
		t.Errorf("Intel eno1: %v, want not an NVIDIA NIC port, with the rails", err)
	}

	mapped, _ := resolver(t, tree.Root, nicdiscovery.Rails{"rail0": {"ibp24s0"}, "rail1": {"0000:40:00.0"}})
	for dev, want := range map[rails.Device]string{
		{DeviceID: "0000:18:00.0"}: "rail0", {DeviceID: "0000:40:00.0"}: "rail1", {Master: "ibp79s0"}: "ibp79s0"} {
		if got, err := mapped.Resolve(dev); err != nil || got.Rail != want {
			t.Errorf("rail map, %s: %+v %v, want rail %s", dev, got, err, want)
		}
	}
	names := rails.RailNames(mustScan(t, tree.Root), nicdiscovery.Rails{"rail0": {"ibp24s0"}, "rail1": {"0000:40:00.0"}})
	if strings.Join(names, ",") != "enp225s0f0np0,enp225s0f1np1,ibp154s0,ibp192s0,ibp206s0,ibp220s0,ibp79s0,ibp94s0,rail0,rail1" {
		t.Errorf("rail names with a map: %v", names)
	}

	if err := tree.PodView(); err != nil {
		t.Fatal(err)
	}
	hidden, _ := resolver(t, tree.Root, nil)
	if got, err := hidden.Resolve(rails.Device{DeviceID: "0000:4f:00.0"}); err != nil || got.Rail != "mlx5_2" {
		t.Errorf("pod view, IB PF by deviceID: %+v %v, want the RDMA device's name as the labels use", got, err)
	}
}

// TestResolveRescansForANewFunction: a PF the last inventory does not have (a
// NIC that came up since) is looked for in a fresh one.
func TestResolveRescansForANewFunction(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	var asked []bool
	r := &rails.Resolver{Locator: rails.SysfsLocator{Root: tree.Root}, Inventory: func(fresh bool) (*nicdiscovery.Inventory, error) {
		asked = append(asked, fresh)
		if !fresh {
			return &nicdiscovery.Inventory{}, nil // the last scan, from before the NIC
		}
		return nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: tree.Root, Live: new(bool)})
	}}
	if got, err := r.Resolve(rails.Device{DeviceID: "0000:3b:00.1"}); err != nil || got.Rail != "ens1f1np1" {
		t.Errorf("after a rescan: %+v %v", got, err)
	}
	if len(asked) != 2 || asked[0] || !asked[1] {
		t.Errorf("inventories asked for (fresh?): %v, want the last one, then a fresh one", asked)
	}
}

// TestLiveLocator runs against this machine's own sysfs, which has no NVIDIA
// NIC: a virtual netdev is not a PCI device (and the lookup returns), a PCI
// function that does not exist is not found.
func TestLiveLocator(t *testing.T) {
	l := rails.LiveLocator{}
	done := make(chan error, 1)
	go func() { _, err := l.PCIOfNetdev("lo"); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "netdev lo is not on a PCI device") {
			t.Errorf("lo: %v, want not on a PCI device", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("looking up lo's PCI function did not return")
	}
	if _, err := l.PFOfPCI("0000:ff:1f.7"); !errors.Is(err, rails.ErrNotFound) {
		t.Errorf("a missing PCI function: %v, want not found", err)
	}
	if _, err := l.PCIOfAux("mlx5_core.sf.99"); !errors.Is(err, rails.ErrNotFound) {
		t.Errorf("a missing auxiliary device: %v, want not found", err)
	}
	// A PCI function this machine has (any): a PF of itself, or its VF's PF.
	if entries, _ := os.ReadDir("/sys/bus/pci/devices"); len(entries) > 0 {
		pf, err := l.PFOfPCI(entries[0].Name())
		if err != nil || !rails.IsPCIAddress(pf) {
			t.Errorf("PCI function %s: PF %q %v", entries[0].Name(), pf, err)
		}
	}
}

func mustScan(t *testing.T, root string) *nicdiscovery.Inventory {
	t.Helper()
	inv, err := nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: root, Live: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// Issue 45, item 5: a NAD whose master is a bond of two ports (RoCE LAG), or a
// VLAN on that bond, uses both ports. Function finds no PCI function for such
// a master (it is a virtual netdev), so nothing was recorded and the DRA
// driver could hand a bond slave to a claim; Functions walks the lower
// netdevs, to any depth, to both ports.
func TestFunctionsThroughBondsAndVLANs(t *testing.T) {
	tree, err := fakesysfs.RoCELAG(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(tree.AddVLAN("bond0.100", "bond0"), tree.AddVLAN("enp134s0f0np0.7", "enp134s0f0np0")); err != nil {
		t.Fatal(err)
	}
	loc := rails.SysfsLocator{Root: tree.Root}
	both := []string{"0000:86:00.0", "0000:86:00.1"}
	for _, c := range []struct {
		dev  rails.Device
		want []string
	}{
		{rails.Device{Master: "bond0"}, both},
		{rails.Device{Master: "bond0.100"}, both},
		{rails.Device{Netdev: "bond0.100"}, both},
		{rails.Device{Master: "enp134s0f0np0.7"}, both[:1]},
		{rails.Device{Master: "enp134s0f1np1"}, both[1:]},
		{rails.Device{DeviceID: "0000:86:00.1"}, both[1:]},
	} {
		got, err := rails.Functions(loc, c.dev)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Functions(%s) = %v, %v; want %v", c.dev, got, err, c.want)
		}
	}
	if _, err := rails.Function(loc, rails.Device{Master: "bond0"}); err == nil {
		t.Errorf("Function(bond0) found one function of a bond")
	}
	if got, err := rails.Functions(loc, rails.Device{Master: "nosuch0"}); err == nil {
		t.Errorf("Functions(nosuch0) = %v, want an error", got)
	}
}
