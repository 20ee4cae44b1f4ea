package nicdiscovery_test

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
)

// On the DGX-H100-like tree each rail shares its PCIe switch with one H100, and
// the other rail's H100 under the same root complex only the root.
func TestDGXH100Locality(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A VF of rail 0 sits beside its PF, behind the same switch.
	if err := tree.AddVF("0000:18:00.0", 0, fakesysfs.Function{Address: "0000:18:00.1", Vendor: fakesysfs.VendorNVIDIA,
		Device: fakesysfs.DeviceCXVF, Class: fakesysfs.ClassIB, Driver: "mlx5_core", NUMA: 0}); err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	roots := []string{"pci0000:15", "pci0000:15", "pci0000:4c", "pci0000:4c", "pci0000:97", "pci0000:97", "pci0000:cb", "pci0000:cb"}
	// Each rail and its GPU are behind one switch, below root port 01.0 or 02.0 of
	// their root complex.
	switches := make([]string, len(roots))
	for i, r := range roots {
		switches[i] = fmt.Sprintf("0000:%s:%02x.0", strings.TrimPrefix(r, "pci0000:"), 1+i%2)
	}
	var wantGPUs []nicdiscovery.GPU
	for i, addr := range fakesysfs.DGXH100GPUs {
		wantGPUs = append(wantGPUs, nicdiscovery.GPU{Index: i, PCIAddress: addr, DeviceID: "2330", Model: "H100 SXM5 80GB",
			Driver: "nvidia", NUMANode: i / 4, PCIeRoot: roots[i], PCIeSwitch: switches[i]})
	}
	if !reflect.DeepEqual(inv.GPUs, wantGPUs) {
		t.Fatalf("GPUs:\n got %s\nwant %s", js(inv.GPUs), js(wantGPUs))
	}
	byAddr, byNetdev := map[string]nicdiscovery.NIC{}, map[string]nicdiscovery.NIC{}
	for _, n := range inv.NICs {
		byAddr[n.PCIAddress] = n
		for _, nd := range n.Netdevs {
			byNetdev[nd] = n
		}
	}
	labels, warnings := nicdiscovery.Labels(inv, nil)
	if len(warnings) != 0 {
		t.Errorf("warnings %q", warnings)
	}
	for i, rail := range fakesysfs.DGXH100Rails {
		n := byNetdev[rail]
		other := i ^ 1 // the other rail under the same root complex
		want := []nicdiscovery.NearGPU{
			{Index: i, PCIAddress: fakesysfs.DGXH100GPUs[i], Shares: nicdiscovery.GPUSharesSwitch},
			{Index: other, PCIAddress: fakesysfs.DGXH100GPUs[other], Shares: nicdiscovery.GPUSharesRoot},
		}
		if n.PCIeRoot != roots[i] || n.PCIeSwitch != switches[i] || !reflect.DeepEqual(n.GPUs, want) {
			t.Errorf("rail %d (%s): root %q, switch %q, GPUs %s; want %q, %q, %s", i, rail, n.PCIeRoot, n.PCIeSwitch,
				js(n.GPUs), roots[i], switches[i], js(want))
		}
		if got := labels["nic.hwipam.io/"+rail+".gpus"]; got != strconv.Itoa(i) {
			t.Errorf("%s.gpus=%q, want %d", rail, got, i)
		}
		if got, want := labels["nic.hwipam.io/"+rail+".pcieroot"], strings.ReplaceAll(roots[i], ":", "_"); got != want {
			t.Errorf("%s.pcieroot=%q, want %q", rail, got, want)
		}
	}
	vf, pf := byAddr["0000:18:00.1"], byAddr["0000:18:00.0"]
	if vf.Function != nicdiscovery.FunctionVF || vf.PCIeRoot != pf.PCIeRoot || vf.PCIeSwitch != pf.PCIeSwitch ||
		!reflect.DeepEqual(vf.GPUs, pf.GPUs) {
		t.Errorf("the VF does not have its PF's locality:\nVF %s\nPF %s", js(vf), js(pf))
	}
	for _, addr := range []string{"0000:e1:00.0", "0000:e1:00.1"} {
		if n := byAddr[addr]; n.PCIeRoot != "pci0000:de" || len(n.GPUs) != 0 {
			t.Errorf("BlueField-3 %s: root %q, GPUs %s", addr, n.PCIeRoot, js(n.GPUs))
		}
	}
	for _, k := range []string{"nic.hwipam.io/enp225s0f0np0.gpus", "nic.hwipam.io/enp225s0f1np1.gpus"} {
		if _, ok := labels[k]; ok {
			t.Errorf("label %s on a NIC without a GPU", k)
		}
	}
	if labels["nic.hwipam.io/enp225s0f0np0.pcieroot"] != "pci0000_de" {
		t.Errorf("BlueField-3 pcieroot %q", labels["nic.hwipam.io/enp225s0f0np0.pcieroot"])
	}
}

// A node without GPUs (SR-IOV, VFs beside their PFs): roots, but no pairing.
func TestNoGPUs(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	if len(inv.GPUs) != 0 {
		t.Fatalf("GPUs %s", js(inv.GPUs))
	}
	for _, n := range inv.NICs {
		if n.PCIeRoot != "pci0000:3b" || len(n.GPUs) != 0 {
			t.Errorf("%s: root %q, GPUs %s", n.PCIAddress, n.PCIeRoot, js(n.GPUs))
		}
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	for k := range labels {
		if strings.HasSuffix(k, ".gpus") {
			t.Errorf("label %s on a node without GPUs", k)
		}
	}
	if labels["nic.hwipam.io/ens1f1np1.pcieroot"] != "pci0000_3b" {
		t.Errorf("labels %v", labels)
	}
}

// Only NVIDIA VGA and 3D controllers that are not VFs are GPUs; each NIC lists
// those behind its switch first, then those sharing only its root complex, and
// none under another root complex. Indexes follow PCI address order.
func TestGPUKindsAndPlaces(t *testing.T) {
	tree, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bridges := []struct{ addr, parent string }{
		{"0000:00:01.0", ""}, {"0000:01:00.0", "0000:00:01.0"}, {"0000:02:00.0", "0000:01:00.0"},
		{"0000:02:01.0", "0000:01:00.0"}, {"0000:02:02.0", "0000:01:00.0"}, {"0000:02:03.0", "0000:01:00.0"},
		{"0000:02:04.0", "0000:01:00.0"}, {"0000:00:02.0", ""}, {"0000:80:01.0", ""},
	}
	for _, b := range bridges {
		if err := tree.AddBridge(b.addr, b.parent, fakesysfs.VendorBroadcom, fakesysfs.DevicePEX890xx, 0); err != nil {
			t.Fatal(err)
		}
	}
	gpu := func(addr, parent string, device uint16, class uint32) fakesysfs.Function {
		return fakesysfs.Function{Address: addr, Parent: parent, Vendor: fakesysfs.VendorNVIDIAGPU, Device: device, Class: class,
			Driver: "nvidia", NUMA: 0}
	}
	for _, f := range []fakesysfs.Function{
		{Address: "0000:03:00.0", Parent: "0000:02:00.0", Vendor: fakesysfs.VendorNVIDIA, Device: fakesysfs.DeviceCX7,
			Class: fakesysfs.ClassEthernet, Driver: "mlx5_core", TotalVFs: 4, NumVFs: 1,
			Netdevs: []fakesysfs.Netdev{{Name: "enp3s0np0", Type: 1, Speed: 200000, OperState: "up", MTU: 1500}}},
		gpu("0000:04:00.0", "0000:02:01.0", 0x2331, fakesysfs.Class3D),                                              // behind the switch
		gpu("0000:05:00.0", "0000:02:02.0", 0x2684, 0x030000),                                                       // a VGA GPU behind the switch
		gpu("0000:06:00.0", "0000:02:03.0", 0x9999, 0x068000),                                                       // an NVIDIA bridge-class function: no GPU
		gpu("0000:07:00.0", "0000:02:04.0", 0x9998, 0x040300),                                                       // an NVIDIA audio function: no GPU
		gpu("0000:08:00.0", "0000:00:02.0", 0x2330, fakesysfs.Class3D),                                              // same root complex, another root port
		gpu("0000:81:00.0", "0000:80:01.0", 0x2330, fakesysfs.Class3D),                                              // another root complex
		{Address: "0000:09:00.0", Parent: "0000:00:02.0", Vendor: 0x1002, Device: 0x74a1, Class: fakesysfs.Class3D}, // not NVIDIA
	} {
		if err := tree.Add(f); err != nil {
			t.Fatal(err)
		}
	}
	// A VF of the H100 PCIe (vGPU): not a GPU of its own.
	if err := tree.AddVF("0000:04:00.0", 0, gpu("0000:04:00.4", "", 0x2331, fakesysfs.Class3D)); err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	var addrs []string
	for i, g := range inv.GPUs {
		addrs = append(addrs, g.PCIAddress)
		if g.Index != i {
			t.Errorf("GPU %s has index %d, want %d", g.PCIAddress, g.Index, i)
		}
	}
	if want := []string{"0000:04:00.0", "0000:05:00.0", "0000:08:00.0", "0000:81:00.0"}; !reflect.DeepEqual(addrs, want) {
		t.Fatalf("GPUs %v, want %v", addrs, want)
	}
	if inv.GPUs[0].Model != "H100 PCIe" || inv.GPUs[3].PCIeRoot != "pci0000:80" {
		t.Errorf("GPUs %s", js(inv.GPUs))
	}
	want := []nicdiscovery.NearGPU{
		{Index: 0, PCIAddress: "0000:04:00.0", Shares: "switch"},
		{Index: 1, PCIAddress: "0000:05:00.0", Shares: "switch"},
		{Index: 2, PCIAddress: "0000:08:00.0", Shares: "root"},
	}
	if n := inv.NICs[0]; n.PCIeRoot != "pci0000:00" || !reflect.DeepEqual(n.GPUs, want) {
		t.Fatalf("NIC %s, want GPUs %s", js(n), js(want))
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	if labels["nic.hwipam.io/enp3s0np0.gpus"] != "0.1" || labels["nic.hwipam.io/enp3s0np0.pcieroot"] != "pci0000_00" {
		t.Fatalf("labels %v", labels)
	}
}

// GPU index lists that do not fit in a label value are left out, with a warning;
// a long netdev name leaves room for the longest attribute key.
func TestGPULabelLimits(t *testing.T) {
	var many []nicdiscovery.NearGPU
	for i := range 40 {
		many = append(many, nicdiscovery.NearGPU{Index: i, Shares: nicdiscovery.GPUSharesSwitch})
	}
	long := strings.Repeat("n", validation.LabelValueMaxLength-len(".pcieroot"))
	inv := &nicdiscovery.Inventory{NICs: []nicdiscovery.NIC{
		{PCIAddress: "0000:01:00.0", Function: "PF", NUMANode: 0, PCIeRoot: "pci0000:00", GPUs: many,
			Ports: []nicdiscovery.Port{{Netdev: "eth0", LinkLayer: "Ethernet"}}},
		{PCIAddress: "0000:02:00.0", Function: "PF", NUMANode: 0, PCIeRoot: "pci10000:e0",
			GPUs:  []nicdiscovery.NearGPU{{Index: 3, Shares: "switch"}, {Index: 7, Shares: "switch"}, {Index: 1, Shares: "root"}},
			Ports: []nicdiscovery.Port{{Netdev: long, LinkLayer: "Ethernet"}, {Netdev: long + "x", LinkLayer: "Ethernet"}}},
	}}
	labels, warnings := nicdiscovery.Labels(inv, nil)
	if _, ok := labels["nic.hwipam.io/eth0.gpus"]; ok {
		t.Errorf("a 40-GPU list was labelled: %v", labels)
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], "do not fit") || !strings.Contains(warnings[1], "cannot be made a label key") {
		t.Errorf("warnings %q", warnings)
	}
	if labels["nic.hwipam.io/"+long+".gpus"] != "3.7" || labels["nic.hwipam.io/"+long+".pcieroot"] != "pci10000_e0" {
		t.Errorf("labels %v", labels)
	}
	for k, v := range labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("key %q: %v", k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s value %q: %v", k, v, errs)
		}
	}
}
