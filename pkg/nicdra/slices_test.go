package nicdra_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/test/harness"
)

func scan(t testing.TB, root string) *nicdiscovery.Inventory {
	t.Helper()
	live := false
	inv, err := nicdiscovery.Scan(t.Context(), nicdiscovery.Options{Root: root, Live: &live})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func str(t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName) string {
	t.Helper()
	a, ok := d.Attributes[name]
	if !ok || a.StringValue == nil {
		return ""
	}
	return *a.StringValue
}

func byNetdev(t *testing.T, devs []resourceapi.Device, netdev string) resourceapi.Device {
	t.Helper()
	for _, d := range devs {
		if str(t, d, nicdra.AttrNetdev) == netdev {
			return d
		}
	}
	t.Fatalf("no device with netdev %s", netdev)
	return resourceapi.Device{}
}

// On the DGX-H100-like tree, each rail's device carries what a claim selects and
// aligns on: its rail and pool, link, RDMA device, and the GPU behind its PCIe
// switch, whose standard pcieRoot (as the GPU driver computes it with the same
// helper) equals the port's.
func TestDGXH100Devices(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	devs, warnings := nicdra.Devices(nicdra.Publish{Inventory: inv, PoolsByRail: map[string][]string{"ibp24s0": {"rail0-v4", "rail0-v6"}}})
	if len(warnings) != 0 {
		t.Errorf("warnings: %q", warnings)
	}
	for _, d := range devs {
		if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
			t.Errorf("device name %q: %v", d.Name, errs)
		}
		// The tree's links are up but for one BlueField-3 port's.
		if down := d.Name == "pci-0000-e1-00-1"; down != (len(d.Taints) == 1) {
			t.Errorf("%s is tainted %v; only the BlueField-3 port whose link is down should be", d.Name, d.Taints)
		}
	}
	nics := map[string]nicdiscovery.NIC{}
	for _, n := range inv.NICs {
		for _, nd := range n.Netdevs {
			nics[nd] = n
		}
	}
	for i, rail := range fakesysfs.DGXH100Rails {
		d := byNetdev(t, devs, rail)
		gpu := inv.GPUs[i]
		gpuRoot, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(gpu.PCIAddress,
			deviceattribute.WithFSFromRoot(filepath.Join(tree.Root, "sys")))
		if err != nil {
			t.Fatal(err)
		}
		root := d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot]
		if root.StringValue == nil || *root.StringValue != *gpuRoot.Value.StringValue {
			t.Errorf("%s: pcieRoot %v, want GPU %d's %s", rail, root.StringValue, i, *gpuRoot.Value.StringValue)
		}
		want := map[resourceapi.QualifiedName]string{
			nicdra.AttrRail: rail, nicdra.AttrLinkType: "ib", nicdra.AttrModel: "ConnectX-7",
			nicdra.AttrRDMA: fmt.Sprintf("mlx5_%d", i), nicdra.AttrGPUs: strconv.Itoa(i), nicdra.AttrSwitch: gpu.PCIeSwitch,
			nicdra.AttrFunction: "PF", deviceattribute.StandardDeviceAttributePCIBusID: nics[rail].PCIAddress,
		}
		if d.Name != nicdra.DeviceName(nics[rail].PCIAddress) {
			t.Errorf("%s: device %s, want it named after %s", rail, d.Name, nics[rail].PCIAddress)
		}
		for name, v := range want {
			if got := str(t, d, name); got != v || v == "" {
				t.Errorf("%s: %s = %q, want %q", rail, name, got, v)
			}
		}
		if s := d.Attributes[nicdra.AttrSpeed].IntValue; s == nil || *s != 400000 {
			t.Errorf("%s: speed %v, want 400000", rail, s)
		}
		if n := d.Attributes[deviceattribute.StandardDeviceAttributeNUMANode].IntValue; n == nil || *n != int64(i/4) {
			t.Errorf("%s: numaNode %v, want %d", rail, n, i/4)
		}
		pool := str(t, d, nicdra.AttrPool)
		if (i == 0) != (pool == "rail0-v4,rail0-v6") || (i != 0 && pool != "") {
			t.Errorf("%s: pool %q (only rail 0's pools are labelled)", rail, pool)
		}
	}
}

// A rail map names the rail; a port whose link is down is tainted, so that no
// new claim gets it, and untainted when it is back.
func TestRailMapAndLinkDown(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC))
	p := nicdra.Publish{Rails: nicdiscovery.Rails{"fabric0": {"ibp24s0"}}, PoolsByRail: map[string][]string{"fabric0": {"f0"}}, Now: now}
	p.Inventory = scan(t, tree.Root)
	devs, _ := nicdra.Devices(p)
	if d := byNetdev(t, devs, "ibp24s0"); str(t, d, nicdra.AttrRail) != "fabric0" || str(t, d, nicdra.AttrPool) != "f0" {
		t.Errorf("ibp24s0: rail %q pool %q, want fabric0's", str(t, d, nicdra.AttrRail), str(t, d, nicdra.AttrPool))
	}
	// ibp64s0's RDMA port leaves ACTIVE; ibp79s0's netdev goes down.
	dev := func(addr string) string {
		dir, err := filepath.EvalSymlinks(filepath.Join(tree.Root, "sys", "bus", "pci", "devices", addr))
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}
	write := func(path, v string) {
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dev("0000:40:00.0"), "infiniband", "mlx5_1", "ports", "1", "state"), "1: DOWN")
	write(filepath.Join(dev("0000:4f:00.0"), "net", "ibp79s0", "operstate"), "down")
	p.Inventory = scan(t, tree.Root)
	devs, _ = nicdra.Devices(p)
	for netdev, why := range map[string]string{"ibp64s0": "port-down", "ibp79s0": "oper-down", "ibp94s0": ""} {
		d := byNetdev(t, devs, netdev)
		switch {
		case why == "" && len(d.Taints) != 0:
			t.Errorf("%s tainted %v, its link is up", netdev, d.Taints)
		case why != "" && (len(d.Taints) != 1 || d.Taints[0].Key != nicdra.TaintLinkDown || d.Taints[0].Value != why ||
			d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule || !d.Taints[0].TimeAdded.Equal(&now)):
			t.Errorf("%s taints %+v, want %s=%s:NoSchedule", netdev, d.Taints, nicdra.TaintLinkDown, why)
		}
	}
}

// Devices go in slices of at most 64 (the bound for slices with taints); a node
// without NICs publishes one empty slice.
func TestResourcesSlices(t *testing.T) {
	devs := make([]resourceapi.Device, 130)
	for i := range devs {
		devs[i].Name = fmt.Sprintf("d%d", i)
	}
	pool := nicdra.Resources("n1", devs).Pools["n1"]
	if len(pool.Slices) != 3 || len(pool.Slices[0].Devices) != 64 || len(pool.Slices[2].Devices) != 2 ||
		pool.Slices[2].Devices[1].Name != "d129" {
		t.Errorf("130 devices in %d slices", len(pool.Slices))
	}
	if empty := nicdra.Resources("n1", nil).Pools["n1"]; len(empty.Slices) != 1 || len(empty.Slices[0].Devices) != 0 {
		t.Errorf("no devices: %+v, want one empty slice", empty)
	}
}

// What the driver publishes for the DGX-H100-like tree, one port tainted, is a
// valid ResourceSlice for a real API server (names, attribute names and value
// lengths, taints).
func TestSlicesOnAPIServer(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree.Root, "sys", "class", "net", "ibp24s0", "operstate"), []byte("down\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	devs, _ := nicdra.Devices(nicdra.Publish{Inventory: scan(t, tree.Root), PoolsByRail: map[string][]string{"ibp64s0": {"p"}},
		Now: metav1.Now()})
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	res := nicdra.Resources("dgx-1", devs)
	pool := res.Pools["dgx-1"]
	for i, s := range pool.Slices {
		slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("dgx-1-%s-%d", nicdra.DriverName, i)},
			Spec: resourceapi.ResourceSliceSpec{Driver: nicdra.DriverName, NodeName: ptr.To("dgx-1"), Devices: s.Devices,
				Pool: resourceapi.ResourcePool{Name: "dgx-1", Generation: 1, ResourceSliceCount: int64(len(pool.Slices))}}}
		if err := cp.Client.Create(t.Context(), slice); err != nil {
			t.Fatalf("the API server refuses slice %d: %v", i, err)
		}
	}
	var got resourceapi.ResourceSliceList
	if err := cp.Client.List(t.Context(), &got, client.MatchingFields{"spec.driver": nicdra.DriverName}); err != nil {
		t.Fatal(err)
	}
	n, tainted := 0, 0
	for _, s := range got.Items {
		n += len(s.Spec.Devices)
		for _, d := range s.Spec.Devices {
			tainted += len(d.Taints)
		}
	}
	// ibp24s0, and the BlueField-3 port the tree has down.
	if n != len(devs) || tainted != 2 {
		t.Errorf("the API server keeps %d devices (%d tainted), want %d (2)", n, tainted, len(devs))
	}
}

func boolAttr(d resourceapi.Device, name resourceapi.QualifiedName) *bool {
	return d.Attributes[name].BoolValue
}

// Issue 39, item 4: ports with no pool for their rail, or whose netdev is not in
// the host's network namespace, were published like the others: a claim landed
// on one and its prepare failed for ever ("unknown pool", "netdev not found").
// Now each port says whether it can be prepared, and whether its netdev is on
// the host (a prepared device's netdev counts as there: its claim's pod has it).
func TestDevicesSayWhetherTheyCanBePrepared(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := nicdra.Publish{Inventory: scan(t, tree.Root),
		PoolsByRail: map[string][]string{"ibp24s0": {"r0"}, "ibp64s0": {"r1"}, "ibp79s0": {"r2"}},
		HostLinks:   map[string]bool{"lo": true, "ibp24s0": true, "ibp79s0": true, "ibp94s0": true}}
	devs, _ := nicdra.Devices(p)
	for netdev, want := range map[string][2]bool{ // netdevOnHost, preparable
		"ibp24s0":  {true, true},   // a pool and the netdev
		"ibp64s0":  {false, false}, // a pool, no netdev on the host
		"ibp79s0":  {true, true},
		"ibp94s0":  {true, false}, // the netdev, no pool
		"ibp154s0": {false, false},
	} {
		d := byNetdev(t, devs, netdev)
		on, prep := boolAttr(d, nicdra.AttrNetdevOnHost), boolAttr(d, nicdra.AttrPreparable)
		if on == nil || prep == nil || *on != want[0] || *prep != want[1] {
			t.Errorf("%s: netdevOnHost %v preparable %v, want %v", netdev, on, prep, want)
		}
	}
	// Without a view of the host's links, a netdev the tree shows counts.
	p.HostLinks = nil
	devs, _ = nicdra.Devices(p)
	if prep := boolAttr(byNetdev(t, devs, "ibp64s0"), nicdra.AttrPreparable); prep == nil || !*prep {
		t.Errorf("ibp64s0 without a view of the host's links: preparable %v, want true", prep)
	}
}
