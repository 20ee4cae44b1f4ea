package nicdiscovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/harness"
)

var notLive = false

func scan(t *testing.T, root string) *nicdiscovery.Inventory {
	t.Helper()
	inv, err := nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: root, Logger: testr.New(t), Live: &notLive})
	if err != nil {
		t.Fatalf("Scan(%s): %v", root, err)
	}
	return inv
}

func extract(t *testing.T, name string) string {
	t.Helper()
	root, err := fakesysfs.Extract(filepath.Join("testdata", "sysfs", name), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// The real ConnectX-3 capture: one mlx4 function, class 0x028000 (not 0x0207), IPoIB.
func TestCapturedConnectX3(t *testing.T) {
	inv := scan(t, extract(t, "hwloc-32em64t-2n8c-cx3-ib.tar.bz2"))
	want := []nicdiscovery.NIC{{
		PCIAddress: "0000:82:00.0", VendorID: "15b3", DeviceID: "1003", Model: "ConnectX-3", Function: "PF",
		Driver: "mlx4_core", NUMANode: 1, PCIeRoot: "pci0000:80", PCIeSwitch: "0000:80:02.2", Netdevs: []string{"ib0"}, LinkLayer: "InfiniBand", SpeedMbps: 56000,
		RDMADevices: []string{"mlx4_0"}, PortState: "ACTIVE", PortGUID: "0002:c903:00f9:bfa1",
		Ports: []nicdiscovery.Port{{
			Netdev: "ib0", Number: 1, LinkLayer: "InfiniBand", SpeedMbps: 56000, NetdevType: 32, RDMADevice: "mlx4_0",
			RDMAPort: 1, PortState: "ACTIVE", PortGUID: "0002:c903:00f9:bfa1", OperState: "up", MTU: 2044,
		}},
	}}
	if !reflect.DeepEqual(inv.NICs, want) {
		t.Fatalf("inventory:\n got %s\nwant %s", js(inv.NICs), js(want))
	}
	// Its VGA controller is an ASPEED BMC's (1a03:2000), not an NVIDIA GPU.
	if len(inv.GPUs) != 0 {
		t.Fatalf("GPUs %s", js(inv.GPUs))
	}
	labels, warnings := nicdiscovery.Labels(inv, nil)
	wantLabels := map[string]string{
		"nic.hwipam.io/present": "true", "nic.hwipam.io/count": "1", "nic.hwipam.io/rdma": "true",
		"nic.hwipam.io/ib0": "ib", "nic.hwipam.io/ib0.model": "ConnectX-3", "nic.hwipam.io/ib0.speed": "56000",
		"nic.hwipam.io/ib0.vfs": "0", "nic.hwipam.io/ib0.numa": "1", "nic.hwipam.io/ib0.pcieroot": "pci0000_80",
	}
	if !reflect.DeepEqual(labels, wantLabels) || len(warnings) != 0 {
		t.Fatalf("labels %v (warnings %v), want %v", labels, warnings, wantLabels)
	}
}

// The real ConnectX-4 capture: two functions without netdevs or RDMA devices, and
// Intel ports that are not ours.
func TestCapturedConnectX4WithoutNetdevs(t *testing.T) {
	inv := scan(t, extract(t, "hwloc-32intel64-2p8co2t-cx4-ib.tar.bz2"))
	var addrs []string
	for _, n := range inv.NICs {
		addrs = append(addrs, n.PCIAddress)
		if n.Model != "ConnectX-4" || n.Function != "PF" || n.DeviceID != "1013" || len(n.Netdevs) != 0 ||
			len(n.RDMADevices) != 0 || len(n.Ports) != 0 || n.SpeedMbps != 0 || n.LinkLayer != "" || len(n.GPUs) != 0 {
			t.Errorf("%s: %s", n.PCIAddress, js(n))
		}
	}
	if want := []string{"0000:1a:00.0", "0000:3e:00.0"}; !reflect.DeepEqual(addrs, want) {
		t.Fatalf("functions %v, want %v (the Intel ports enp96s0f0/1 must not be reported)", addrs, want)
	}
	// Each sits behind a PLX switch (10b5:9797) with four NEC vector engines,
	// which are not GPUs: .../pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1a:00.0.
	if r0, r1 := inv.NICs[0].PCIeRoot, inv.NICs[1].PCIeRoot; r0 != "pci0000:17" || r1 != "pci0000:3a" || len(inv.GPUs) != 0 {
		t.Fatalf("PCIe roots %q, %q (want pci0000:17, pci0000:3a), GPUs %s", r0, r1, js(inv.GPUs))
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	want := map[string]string{"nic.hwipam.io/present": "true", "nic.hwipam.io/count": "0"}
	if !reflect.DeepEqual(labels, want) {
		t.Fatalf("labels %v, want %v", labels, want)
	}
}

func TestDGXH100(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	if len(inv.NICs) != 10 {
		t.Fatalf("%d functions, want 8 ConnectX-7 + 2 BlueField-3 (no bridge, SoC management, flash recovery or Intel): %s",
			len(inv.NICs), js(inv.NICs))
	}
	if got := inv.NICs[0].Netdevs; !reflect.DeepEqual(got, []string{"ibp24s0"}) {
		t.Errorf("netdevs of the first rail %v: the IPoIB child ibp24s0.8001 is not a port", got)
	}
	for i, n := range inv.NICs[:8] {
		if n.Model != "ConnectX-7" || n.LinkLayer != "InfiniBand" || n.SpeedMbps != 400000 || n.NUMANode != i/4 ||
			n.Netdevs[0] != fakesysfs.DGXH100Rails[i] || n.PortState != "ACTIVE" || n.PortGUID == "" || n.SRIOVTotalVFs != 16 {
			t.Errorf("CX-7 %d: %s", i, js(n))
		}
	}
	bf := inv.NICs[8:]
	if bf[0].Model != "BlueField-3" || bf[0].LinkLayer != "Ethernet" || bf[0].SpeedMbps != 100000 || bf[0].EswitchMode != "switchdev" ||
		bf[0].PortGUID != "" {
		t.Errorf("BlueField-3 port 0: %s", js(bf[0]))
	}
	// No link: the netdev says -1 and the RDMA port is DOWN, so its rate is not a speed.
	if bf[1].Ports[0].OperState != "down" || bf[1].PortState != "DOWN" || bf[1].SpeedMbps != 0 {
		t.Errorf("BlueField-3 port 1: %s", js(bf[1]))
	}
	if _, ok := labels0(inv)["nic.hwipam.io/enp225s0f1np1.speed"]; ok {
		t.Error("a port without link has a speed label")
	}
	labels, warnings := nicdiscovery.Labels(inv, nicdiscovery.Rails{
		"compute0": {"ibp24s0"}, "compute7": {"0000:dc:00.0"}, "storage": {"nosuch0", "enp225s0f0np0"}, "absent": {"eth9"},
	})
	if len(warnings) != 0 {
		t.Errorf("warnings: %v", warnings)
	}
	for k, v := range map[string]string{
		"nic.hwipam.io/count": "10", "nic.hwipam.io/ibp24s0": "ib", "nic.hwipam.io/ibp220s0.numa": "1",
		"nic.hwipam.io/ibp220s0.speed": "400000", "nic.hwipam.io/ibp94s0.numa": "0", "nic.hwipam.io/enp225s0f0np0": "eth",
		"nic.hwipam.io/enp225s0f0np0.model": "BlueField-3", "nic.hwipam.io/rail.compute0": "ibp24s0",
		"nic.hwipam.io/rail.compute7": "ibp220s0", "nic.hwipam.io/rail.storage": "enp225s0f0np0",
	} {
		if labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, labels[k], v)
		}
	}
	for _, k := range []string{"nic.hwipam.io/rail.absent", "nic.hwipam.io/eno1"} {
		if _, ok := labels[k]; ok {
			t.Errorf("label %s should not be there", k)
		}
	}
}

// 2 PFs × 64 VFs: every VF is found, with its PF, and named after it.
func TestSRIOV64VFs(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 2, 64)
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	pfs, vfs := 0, map[string]int{}
	for _, n := range inv.NICs {
		switch n.Function {
		case "PF":
			pfs++
			if n.SRIOVNumVFs != 64 || n.SRIOVTotalVFs != 127 || n.Model != "ConnectX-6 Dx" || n.NUMANode != -1 || n.EswitchMode != "legacy" {
				t.Errorf("PF %s", js(n))
			}
		case "VF":
			vfs[n.PhysFn]++
			if n.Model != "ConnectX-6 Dx VF" || len(n.Netdevs) != 1 || len(n.RDMADevices) != 1 || n.NUMANode != -1 {
				t.Errorf("VF %s", js(n))
			}
		}
	}
	if pfs != 2 || vfs["0000:3b:00.0"] != 64 || vfs["0000:3b:00.1"] != 64 {
		t.Fatalf("%d PFs and VFs per PF %v, want 2 and 64 each", pfs, vfs)
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	if labels["nic.hwipam.io/count"] != "2" || labels["nic.hwipam.io/ens1f0np0.vfs"] != "64" {
		t.Fatalf("labels %v", labels)
	}
	if _, ok := labels["nic.hwipam.io/ens1f0np0.numa"]; ok {
		t.Fatal("NUMA node -1 must not be labelled (it is not a valid label value)")
	}
	for k := range labels {
		if strings.Contains(k, "v0") {
			t.Fatalf("a VF netdev is labelled: %s", k)
		}
	}
}

func TestRoCELAG(t *testing.T) {
	tree, err := fakesysfs.RoCELAG(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	if len(inv.NICs) != 2 {
		t.Fatalf("%s", js(inv.NICs))
	}
	pf0, pf1 := inv.NICs[0], inv.NICs[1]
	if !reflect.DeepEqual(pf0.RDMADevices, []string{"mlx5_bond_0"}) || pf0.Ports[0].Master != "bond0" || pf0.SpeedMbps != 25000 {
		t.Errorf("PF0 %s", js(pf0))
	}
	if len(pf1.RDMADevices) != 0 || pf1.LinkLayer != "Ethernet" || pf1.SpeedMbps != 25000 || pf1.Ports[0].Master != "bond0" {
		t.Errorf("PF1 (no RDMA device of its own) %s", js(pf1))
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	if labels["nic.hwipam.io/enp134s0f1np1"] != "eth" || labels["nic.hwipam.io/rdma"] != "true" || labels["nic.hwipam.io/count"] != "2" {
		t.Fatalf("labels %v", labels)
	}
}

// A mlx4 VPI card: two ports on one function, port 1 InfiniBand, port 2 Ethernet.
func TestVPI(t *testing.T) {
	tree, err := fakesysfs.VPI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	if len(inv.NICs) != 1 || len(inv.NICs[0].Ports) != 2 {
		t.Fatalf("%s", js(inv.NICs))
	}
	n := inv.NICs[0]
	p1, p2 := n.Ports[0], n.Ports[1]
	if p1.Netdev != "ib0" || p1.LinkLayer != "InfiniBand" || p1.SpeedMbps != 56000 || p1.PortGUID != "0002:c903:00f9:c0a1" {
		t.Errorf("port 1 %s", js(p1))
	}
	if p2.Netdev != "ens1d1" || p2.Number != 2 || p2.LinkLayer != "Ethernet" || p2.SpeedMbps != 40000 || p2.PortGUID != "" || p2.RDMAPort != 2 {
		t.Errorf("port 2 %s", js(p2))
	}
	if n.Model != "ConnectX-3 Pro" || n.LinkLayer != "InfiniBand" {
		t.Errorf("%s", js(n))
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	if labels["nic.hwipam.io/ib0"] != "ib" || labels["nic.hwipam.io/ens1d1"] != "eth" || labels["nic.hwipam.io/count"] != "2" {
		t.Fatalf("labels %v", labels)
	}
}

func TestNoNICs(t *testing.T) {
	tree, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.Add(fakesysfs.Function{Address: "0000:00:19.0", Vendor: 0x8086, Device: 0x15b7, Class: 0x020000, Driver: "e1000e",
		Netdevs: []fakesysfs.Netdev{{Name: "eno1", Type: 1, Speed: 1000}}}); err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	labels, _ := nicdiscovery.Labels(inv, nil)
	if len(inv.NICs) != 0 || len(labels) != 0 {
		t.Fatalf("inventory %s labels %v", js(inv.NICs), labels)
	}
}

func TestBadRoot(t *testing.T) {
	_, err := nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "must be a directory that contains sys/") {
		t.Fatalf("error %v", err)
	}
}

// A function without a driver: known by its ID, no netdev, no RDMA device.
func TestUnboundFunction(t *testing.T) {
	tree, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.Add(fakesysfs.Function{Address: "0000:17:00.0", Vendor: 0x15b3, Device: 0x1021, Class: 0x020700, NUMA: 0}); err != nil {
		t.Fatal(err)
	}
	// An unknown NVIDIA function without a driver is not taken for a NIC.
	if err := tree.Add(fakesysfs.Function{Address: "0000:17:00.1", Vendor: 0x15b3, Device: 0x9999, Class: 0x120000, NUMA: 0}); err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	if len(inv.NICs) != 1 || inv.NICs[0].Driver != "" || inv.NICs[0].Model != "ConnectX-7" || len(inv.NICs[0].Netdevs) != 0 {
		t.Fatalf("%s", js(inv.NICs))
	}
}

func TestLabelSanitising(t *testing.T) {
	inv := &nicdiscovery.Inventory{NICs: []nicdiscovery.NIC{
		{PCIAddress: "0000:01:00.0", Function: "PF", Model: "ConnectX-6 Dx", NUMANode: 0, Ports: []nicdiscovery.Port{
			{Netdev: "eth@0", LinkLayer: "Ethernet", SpeedMbps: 0},
			{Netdev: "eth_0", LinkLayer: "Ethernet"}, // same key as eth@0
			{Netdev: "--", LinkLayer: "Ethernet"},    // nothing valid left
			{Netdev: "count", LinkLayer: "Ethernet"}, // would be the count label
			{Netdev: "a.speed", LinkLayer: "Ethernet", SpeedMbps: 1000},
		}},
	}}
	labels, warnings := nicdiscovery.Labels(inv, nil)
	if labels["nic.hwipam.io/count"] != "5" || labels["nic.hwipam.io/a_speed"] != "eth" || labels["nic.hwipam.io/a_speed.speed"] != "1000" {
		t.Fatalf("labels %v", labels)
	}
	if labels["nic.hwipam.io/eth_0"] != "eth" || labels["nic.hwipam.io/eth_0.model"] != "ConnectX-6_Dx" {
		t.Fatalf("labels %v", labels)
	}
	if _, ok := labels["nic.hwipam.io/eth_0.speed"]; ok {
		t.Fatal("an unknown speed must not be labelled")
	}
	if len(warnings) != 5 {
		t.Fatalf("warnings %q, want two renames, a collision and two impossible names", warnings)
	}
}

func TestLoadRails(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("rail0: [ibp24s0, \"0000:18:00.0\"]\nrail1:\n- ibp64s0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := nicdiscovery.LoadRails(good)
	if err != nil || len(r) != 2 || r["rail0"][1] != "0000:18:00.0" {
		t.Fatalf("%v %v", r, err)
	}
	for content, want := range map[string]string{
		"rail 0: [a]\n":   "does not make a valid label key",
		"rail0: []\n":     "lists no netdev",
		"rail0: ibp1\n":   "want a map of rail name",
		"- just a list\n": "want a map of rail name",
	} {
		p := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := nicdiscovery.LoadRails(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", content, err, want)
		}
	}
}

func js(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// The live machine: whatever it has, a scan of "/" succeeds.
func TestLiveRoot(t *testing.T) {
	inv, err := nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Logger: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Root != "/" {
		t.Fatalf("root %q", inv.Root)
	}
}

// Live attributes come from netlink: a veth in the host stands in for the tree's
// netdev (same name), and its MTU and address show up in the inventory.
func TestLiveNetlinkAttributes(t *testing.T) {
	harness.RequireRoot(t)
	name := fmt.Sprintf("hwnd%d", os.Getpid()%100000)
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1400}, PeerName: name + "p"}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(link) })
	addr, err := netlink.ParseAddr("10.99.0.1/24")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	tree, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.Add(fakesysfs.Function{Address: "0000:3b:00.0", Vendor: 0x15b3, Device: 0x101d, Class: 0x020000, Driver: "mlx5_core",
		Netdevs: []fakesysfs.Netdev{{Name: name, Type: 1, Speed: 100000, OperState: "up", MTU: 9000, MAC: "0c:42:a1:00:00:01"}}}); err != nil {
		t.Fatal(err)
	}
	live := true
	inv, err := nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: tree.Root, Logger: testr.New(t), Live: &live})
	if err != nil {
		t.Fatal(err)
	}
	p := inv.NICs[0].Ports[0]
	if p.MTU != 1400 || !reflect.DeepEqual(p.Addresses, []string{"10.99.0.1/24"}) || p.OperState != "down" || p.MAC == "0c:42:a1:00:00:01" {
		t.Fatalf("live attributes not taken from netlink: %s", js(p))
	}
}

func labels0(inv *nicdiscovery.Inventory) map[string]string {
	l, _ := nicdiscovery.Labels(inv, nil)
	return l
}

// The example rail map in deploy/examples parses and names the DGX tree's rails.
func TestExampleRailConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "deploy", "examples", "rail-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "rails.yaml")
	if err := os.WriteFile(p, []byte(cm.Data["rails.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	rails, err := nicdiscovery.LoadRails(p)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	labels, warnings := nicdiscovery.Labels(scan(t, tree.Root), rails)
	for i, nd := range fakesysfs.DGXH100Rails {
		if k := fmt.Sprintf("nic.hwipam.io/rail.rail%d", i); labels[k] != nd {
			t.Errorf("%s=%q, want %q", k, labels[k], nd)
		}
	}
	if len(warnings) != 0 {
		t.Errorf("warnings %v", warnings)
	}
}

// switchdev: the representors are not ports (nor are their RDMA ports), the uplink is.
func TestSwitchdev(t *testing.T) {
	tree, err := fakesysfs.Switchdev(t.TempDir(), 4)
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	if len(inv.NICs) != 5 {
		t.Fatalf("%s", js(inv.NICs))
	}
	pf := inv.NICs[0]
	if !reflect.DeepEqual(pf.Netdevs, []string{"enp59s0f0np0"}) || len(pf.Representors) != 4 || len(pf.Ports) != 1 ||
		pf.EswitchMode != "switchdev" || pf.SRIOVNumVFs != 4 {
		t.Fatalf("PF %s", js(pf))
	}
	labels := labels0(inv)
	if labels["nic.hwipam.io/count"] != "1" || labels["nic.hwipam.io/enp59s0f0np0.vfs"] != "4" {
		t.Fatalf("labels %v", labels)
	}
	for k := range labels {
		if strings.Contains(k, "r0") || strings.Contains(k, "v0") {
			t.Errorf("a representor or VF is labelled: %s", k)
		}
	}
}

// A VF passed through to a VM, with no PF on the machine, is the node's NIC port.
func TestPassthroughVF(t *testing.T) {
	tree, err := fakesysfs.PassthroughVF(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	if len(inv.NICs) != 1 || inv.NICs[0].Function != "VF" || inv.NICs[0].PhysFn != "" || inv.NICs[0].Model != "ConnectX VF" {
		t.Fatalf("%s", js(inv.NICs))
	}
	want := map[string]string{"nic.hwipam.io/present": "true", "nic.hwipam.io/count": "1", "nic.hwipam.io/rdma": "true",
		"nic.hwipam.io/ens5": "eth", "nic.hwipam.io/ens5.model": "ConnectX_VF", "nic.hwipam.io/ens5.speed": "200000",
		"nic.hwipam.io/ens5.vfs": "0", "nic.hwipam.io/ens5.pcieroot": "pci0000_00"}
	if got := labels0(inv); !reflect.DeepEqual(got, want) {
		t.Fatalf("labels %v, want %v", got, want)
	}
}

// Every label of every layout, and of the captured trees, is a valid key and value.
func TestLabelsAreValid(t *testing.T) {
	roots := []string{extract(t, "hwloc-32em64t-2n8c-cx3-ib.tar.bz2"), extract(t, "hwloc-32intel64-2p8co2t-cx4-ib.tar.bz2")}
	for _, build := range []func(string) (*fakesysfs.Tree, error){
		fakesysfs.DGXH100, fakesysfs.RoCELAG, fakesysfs.VPI, fakesysfs.PassthroughVF,
		func(r string) (*fakesysfs.Tree, error) { return fakesysfs.SRIOV(r, 2, 8) },
		func(r string) (*fakesysfs.Tree, error) { return fakesysfs.Switchdev(r, 4) },
	} {
		tree, err := build(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, tree.Root)
	}
	rails := nicdiscovery.Rails{"a": {"ib0"}, "b.c": {"0000:18:00.0"}, "d-e_f": {"enp134s0f1np1"}}
	for _, root := range roots {
		labels, _ := nicdiscovery.Labels(scan(t, root), rails)
		for k, v := range labels {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				t.Errorf("%s: key %q: %v", root, k, errs)
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("%s: %s value %q: %v", root, k, v, errs)
			}
		}
	}
}

// ghw gives up on the whole bus when one device has no modalias: say so.
func TestDeviceWithoutModalias(t *testing.T) {
	tree, err := fakesysfs.VPI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(tree.Root, "sys", "bus", "pci", "devices", "0000:04:00.0", "modalias")); err != nil {
		t.Fatal(err)
	}
	_, err = nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: tree.Root, Live: &notLive})
	if err == nil || !strings.Contains(err.Error(), "no readable modalias") {
		t.Fatalf("error %v", err)
	}
}

// A model the built-in table does not know is named from a pci.ids under the root;
// without one, by its ID.
func TestModelFromPCIIDs(t *testing.T) {
	tree, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.Add(fakesysfs.Function{Address: "0000:07:00.0", Vendor: 0x15b3, Device: 0x5a5a, Class: 0x020000,
		Driver: "mlx5_core", Netdevs: []fakesysfs.Netdev{{Name: "enp7s0", Type: 1, Speed: 100000}}}); err != nil {
		t.Fatal(err)
	}
	if inv := scan(t, tree.Root); inv.NICs[0].Model != "unknown (15b3:5a5a)" {
		t.Fatalf("without pci.ids: %q", inv.NICs[0].Model)
	}
	ids := filepath.Join(tree.Root, "usr", "share", "misc", "pci.ids")
	if err := os.MkdirAll(filepath.Dir(ids), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ids, []byte("15b3  Mellanox Technologies\n\t5a5a  Future NIC\n8086  Intel Corporation\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if inv := scan(t, tree.Root); inv.NICs[0].Model != "Future NIC" {
		t.Fatalf("with pci.ids: %q", inv.NICs[0].Model)
	}
}
