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
		strings.Join(strings.Fields(lines[1]), " ") != "0000:82:00.0 ConnectX-3 PF - mlx4_core 1 ib0 InfiniBand 56G mlx4_0 - ACTIVE -" {
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
