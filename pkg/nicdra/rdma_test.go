package nicdra_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

// charDevs formats what the driver hands the runtime for a device, one
// "path major:minor mode" each.
func charDevs(devs []nicdra.CharDevice) []string {
	out := []string{}
	for _, d := range devs {
		out = append(out, fmt.Sprintf("%s %d:%d %o", d.Path, d.Major, d.Minor, d.Mode))
	}
	return out
}

// rdmaTable is, for every NIC function of the tree, the character devices its
// device gets (or the error).
func rdmaTable(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, n := range scan(t, root).NICs {
		devs, err := nicdra.RDMACharDevices(root, n.PCIAddress)
		if err != nil {
			out[nicdra.DeviceName(n.PCIAddress)] = []string{"error: " + err.Error()}
			continue
		}
		out[nicdra.DeviceName(n.PCIAddress)] = charDevs(devs)
	}
	return out
}

func checkTable(t *testing.T, got, want map[string][]string) {
	t.Helper()
	for dev, w := range want {
		if g := got[dev]; !slices.Equal(g, w) {
			t.Errorf("%s: got %q, want %q", dev, g, w)
		}
	}
	for dev := range got {
		if _, ok := want[dev]; !ok {
			t.Errorf("unexpected device %s: %q", dev, got[dev])
		}
	}
}

// The captured trees: the ConnectX-3 machine's (an InfiniBand HCA with
// uverbs0 and umad0, whose dev files the capture holds; no sys/class/misc, so
// no rdma_cm, and its issm0 is not handed out) and the ConnectX-4 machine's
// (driver not bound: no RDMA device, nothing to hand out, no error).
func TestRDMACharDevicesCaptured(t *testing.T) {
	for _, tc := range []struct {
		archive string
		want    map[string][]string
	}{
		{"hwloc-32em64t-2n8c-cx3-ib.tar.bz2", map[string][]string{
			"pci-0000-82-00-0": {"/dev/infiniband/uverbs0 231:192 666", "/dev/infiniband/umad0 231:0 600"},
		}},
		{"hwloc-32intel64-2p8co2t-cx4-ib.tar.bz2", map[string][]string{
			"pci-0000-1a-00-0": {},
			"pci-0000-3e-00-0": {},
		}},
	} {
		t.Run(tc.archive, func(t *testing.T) {
			root, err := fakesysfs.Extract(filepath.Join("..", "..", "nicdiscovery", "testdata", "sysfs", tc.archive), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			checkTable(t, rdmaTable(t, root), tc.want)
		})
	}
}

// The DGX-H100 layout (fakesysfs) gives each RDMA device a user verbs device
// and the node rdma_cm. Without the verbs devices (ib_uverbs not loaded) each
// device's error says which directory is empty and to load ib_uverbs. With
// them written in the captured ConnectX-3 tree's shape, each rail gets its own
// uverbs and the shared rdma_cm.
func TestRDMACharDevicesDGXH100(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for dev, got := range rdmaTable(t, tree.Root) {
		if len(got) != 2 || !strings.HasPrefix(got[0], "/dev/infiniband/uverbs") || got[1] != "/dev/infiniband/rdma_cm 10:58 666" {
			t.Errorf("%s as fakesysfs writes it: %q", dev, got)
		}
	}
	removeVerbs(t, tree.Root)
	for dev, got := range rdmaTable(t, tree.Root) {
		if len(got) != 1 || !strings.Contains(got[0], "but no user verbs device") || !strings.Contains(got[0], "modprobe ib_uverbs") {
			t.Errorf("%s without uverbs: %q", dev, got)
		}
	}

	want := addVerbs(t, tree.Root)
	checkTable(t, rdmaTable(t, tree.Root), want)

	// A dev file that does not hold numbers is an error that names it.
	bad := filepath.Join(tree.Root, "sys", "bus", "pci", "devices", "0000:18:00.0", "infiniband_verbs", "uverbs0", "dev")
	writeFile(t, bad, "")
	if _, err := nicdra.RDMACharDevices(tree.Root, "0000:18:00.0"); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("an empty dev file: %v, want an error naming %s", err, bad)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	if _, err := nicdra.RDMACharDevices(tree.Root, "0000:18:00.0"); err == nil || !strings.Contains(err.Error(), filepath.Dir(bad)) {
		t.Errorf("a missing dev file: %v, want an error naming %s", err, filepath.Dir(bad))
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// removeVerbs removes the user verbs devices of the tree's NIC functions, as
// a node without ib_uverbs has them.
func removeVerbs(t *testing.T, root string) {
	t.Helper()
	for _, n := range scan(t, root).NICs {
		if err := os.RemoveAll(filepath.Join(root, "sys", "bus", "pci", "devices", n.PCIAddress, "infiniband_verbs")); err != nil {
			t.Fatal(err)
		}
	}
}

// addVerbs writes a user verbs device for each NIC function of the tree (its
// RDMA device's, uverbs<i> for the i-th function: 231:192+i) in the captured
// ConnectX-3 tree's shape, and the rdma_cm misc device (10:58), and returns
// the character devices each device then gets.
func addVerbs(t *testing.T, root string) map[string][]string {
	t.Helper()
	want := map[string][]string{}
	for i, n := range scan(t, root).NICs {
		dir := filepath.Join(root, "sys", "bus", "pci", "devices", n.PCIAddress, "infiniband_verbs", fmt.Sprintf("uverbs%d", i))
		writeFile(t, filepath.Join(dir, "dev"), fmt.Sprintf("231:%d", 192+i))
		writeFile(t, filepath.Join(dir, "ibdev"), n.RDMADevices[0])
		want[nicdra.DeviceName(n.PCIAddress)] = []string{fmt.Sprintf("/dev/infiniband/uverbs%d 231:%d 666", i, 192+i),
			"/dev/infiniband/rdma_cm 10:58 666"}
	}
	writeFile(t, filepath.Join(root, "sys", "class", "misc", "rdma_cm", "dev"), "10:58")
	return want
}
