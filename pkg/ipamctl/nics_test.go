package ipamctl_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
)

func TestNicsAndLabelsOnCapturedTree(t *testing.T) {
	root, err := fakesysfs.Extract(filepath.Join("..", "..", "nicdiscovery", "testdata", "sysfs", "hwloc-32em64t-2n8c-cx3-ib.tar.bz2"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "nics", "--sysfs-root", root)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "PCI ") ||
		strings.Join(strings.Fields(lines[1]), " ") != "0000:82:00.0 ConnectX-3 PF - mlx4_core 1 ib0 InfiniBand 56G mlx4_0 - ACTIVE - pci0000:80 -" {
		t.Fatalf("table:\n%s", out)
	}
	out, err = run(t, "nics", "--sysfs-root", root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		NICs []nicdiscovery.NIC `json:"nics"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.NICs) != 1 || doc.NICs[0].SpeedMbps != 56000 || doc.NICs[0].NUMANode != 1 || !strings.Contains(out, `"pciAddress": "0000:82:00.0"`) {
		t.Fatalf("json:\n%s", out)
	}
	out, err = run(t, "labels", "--sysfs-root", root)
	if err != nil {
		t.Fatal(err)
	}
	want := `nic.hwipam.io/count=1
nic.hwipam.io/ib0=ib
nic.hwipam.io/ib0.model=ConnectX-3
nic.hwipam.io/ib0.numa=1
nic.hwipam.io/ib0.pcieroot=pci0000_80
nic.hwipam.io/ib0.speed=56000
nic.hwipam.io/ib0.vfs=0
nic.hwipam.io/present=true
nic.hwipam.io/rdma=true
`
	if out != want {
		t.Fatalf("labels:\n%s\nwant:\n%s", out, want)
	}
}

func TestLabelsWithRails(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rails := filepath.Join(t.TempDir(), "rails.yaml")
	if err := os.WriteFile(rails, []byte("compute3: [ibp94s0]\nstorage: [\"0000:e1:00.0\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "labels", "--sysfs-root", tree.Root, "--rail-config", rails)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"nic.hwipam.io/rail.compute3=ibp94s0\n", "nic.hwipam.io/rail.storage=enp225s0f0np0\n",
		"nic.hwipam.io/count=10\n", "nic.hwipam.io/ibp24s0.speed=400000\n"} {
		if !strings.Contains(out, l) {
			t.Errorf("missing %q in:\n%s", l, out)
		}
	}
}

// On the DGX-H100-like tree every rail shows its root complex and the H100
// behind its switch, and the GPU table pairs them back; a node without GPUs
// shows no pairing and no GPU table.
func TestNicsGPUPairing(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "nics", "--sysfs-root", tree.Root)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // first field → the row, fields single-spaced
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	for pci, want := range map[string]string{
		"0000:18:00.0": "ibp24s0 InfiniBand 400G mlx5_0 0/16 ACTIVE - pci0000:15 0 (0000:19:00.0)",
		"0000:dc:00.0": "ibp220s0 InfiniBand 400G mlx5_7 0/16 ACTIVE - pci0000:cb 7 (0000:dd:00.0)",
		"0000:e1:00.0": "enp225s0f0np0 Ethernet 100G mlx5_8 0/16 ACTIVE switchdev pci0000:de -",
		"0":            "0 0000:19:00.0 H100 SXM5 80GB nvidia 0 pci0000:15 ibp24s0 ibp64s0",
		"7":            "7 0000:dd:00.0 H100 SXM5 80GB nvidia 1 pci0000:cb ibp220s0 ibp206s0",
	} {
		if !strings.HasSuffix(rows[pci], want) {
			t.Errorf("row %s: %q, want it to end in %q; table:\n%s", pci, rows[pci], want, out)
		}
	}
	if !strings.Contains(out, "\nGPU ") {
		t.Errorf("no GPU table:\n%s", out)
	}
	out, err = run(t, "nics", "--sysfs-root", tree.Root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		NICs []nicdiscovery.NIC `json:"nics"`
		GPUs []nicdiscovery.GPU `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.GPUs) != 8 || doc.GPUs[3].PCIAddress != "0000:5f:00.0" || doc.GPUs[3].Index != 3 ||
		doc.NICs[3].PCIeRoot != "pci0000:4c" || len(doc.NICs[3].GPUs) != 2 || doc.NICs[3].GPUs[0].Index != 3 ||
		doc.NICs[3].GPUs[0].Shares != "switch" || doc.NICs[3].GPUs[1].Shares != "root" {
		t.Fatalf("json:\n%s", out)
	}
	if !strings.Contains(out, `"pcieRoot": "pci0000:4c"`) || !strings.Contains(out, `"shares": "switch"`) {
		t.Fatalf("json field names:\n%s", out)
	}
	out, err = run(t, "labels", "--sysfs-root", tree.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"nic.hwipam.io/ibp94s0.gpus=3\n", "nic.hwipam.io/ibp94s0.pcieroot=pci0000_4c\n"} {
		if !strings.Contains(out, l) {
			t.Errorf("missing %q in:\n%s", l, out)
		}
	}

	sriov, err := fakesysfs.SRIOV(t.TempDir(), 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "nics", "--sysfs-root", sriov.Root)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || strings.Contains(out, "GPU ") {
		t.Fatalf("table:\n%s", out)
	}
	for _, l := range lines[1:] {
		if !strings.HasSuffix(strings.Join(strings.Fields(l), " "), " pci0000:3b -") {
			t.Errorf("row %q: want root pci0000:3b and no GPU", l)
		}
	}
	out, err = run(t, "nics", "--sysfs-root", sriov.Root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, `"gpus"`) {
		t.Errorf("json of a node without GPUs has gpus:\n%s", out)
	}
}

func TestNicsErrors(t *testing.T) {
	if _, err := run(t, "nics", "--sysfs-root", t.TempDir()); err == nil || !strings.Contains(err.Error(), "contains sys/") {
		t.Fatalf("empty root: %v", err)
	}
	if _, err := run(t, "nics", "-o", "xml"); err == nil || !strings.Contains(err.Error(), "want table, json or yaml") {
		t.Fatalf("bad output: %v", err)
	}
	if _, err := run(t, "labels", "--rail-config", "/nonexistent/rails.yaml"); err == nil || !strings.Contains(err.Error(), "rail map") {
		t.Fatalf("missing rail map: %v", err)
	}
}
