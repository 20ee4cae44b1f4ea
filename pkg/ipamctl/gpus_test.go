package ipamctl_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

// Issue 39, item 5: the operator's first question on a DRA node, GPU → NIC →
// rail → pool → address, had no answer but reading slices, checkpoints and
// sysfs side by side. `ipamctl gpus` joins them: on the DGX-H100-like tree, GPU
// 2's switch port ibp79s0 held by a claim (its pod, interface and address),
// ibp94s0 on the same root complex published and preparable, GPU 0's port
// without a pool.
func TestGPUsView(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	cp := nicdra.CheckpointFile{Path: nicdra.CheckpointBeside(store)}
	if err := cp.Save(&nicdra.Checkpoint{Claims: map[types.UID]nicdra.PreparedClaim{"u1": {Namespace: "default", Name: "demo-gpu",
		PodName: "demo-gpu", PodUID: "p1", State: nicdra.PrepareCompleted, Devices: []nicdra.PreparedDevice{{Request: "nic",
			Device: "pci-0000-4f-00-0", PCIAddress: "0000:4f:00.0", HostNetdev: "ibp79s0", InterfaceName: "net1",
			Pools: []string{"demo-ibp79s0"}, PoolType: "ippool", Rail: "ibp79s0", Addresses: []string{"10.26.0.3/16"}}}}}}); err != nil {
		t.Fatal(err)
	}
	st := nicdra.DriverStatus{Ports: []nicdra.PublishedPort{
		{Device: "pci-0000-4f-00-0", PCIAddress: "0000:4f:00.0", Netdev: "ibp79s0", Rail: "ibp79s0", Pools: "demo-ibp79s0", Preparable: true},
		{Device: "pci-0000-5e-00-0", PCIAddress: "0000:5e:00.0", Netdev: "ibp94s0", Rail: "ibp94s0", Pools: "demo-ibp94s0", Preparable: true},
		{Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0", Netdev: "ibp24s0", Rail: "ibp24s0"},
	}}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nicdra.StatusFile(cp.Path), b, 0o644); err != nil {
		t.Fatal(err)
	}
	rails := filepath.Join(dir, "rails.yaml")
	if err := os.WriteFile(rails, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"gpus", "--sysfs-root", tree.Root, "--rail-config", rails, "--store-file", store}
	out, err := run(t, append(args, "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var r ipamctl.GPUsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	row := func(gpu int, nic string) ipamctl.GPUNIC {
		t.Helper()
		for _, g := range r.GPUs {
			if g.GPU == gpu && g.NIC == nic {
				return g
			}
		}
		t.Fatalf("no row for GPU %d and NIC %s in %+v", gpu, nic, r.GPUs)
		return ipamctl.GPUNIC{}
	}
	held := row(2, "ibp79s0")
	if held.Near != "switch" || held.Rail != "ibp79s0" || held.Pools != "demo-ibp79s0" || held.Claim != "default/demo-gpu" ||
		held.Pod != "default/demo-gpu" || held.Interface != "net1" || strings.Join(held.Addresses, ",") != "10.26.0.3/16" {
		t.Errorf("GPU 2's switch port: %+v", held)
	}
	free := row(2, "ibp94s0")
	if free.Near != "root" || free.Claim != "" || free.Preparable == nil || !*free.Preparable || free.Pools != "demo-ibp94s0" {
		t.Errorf("GPU 2's root complex port: %+v", free)
	}
	if g0 := row(0, "ibp24s0"); g0.Preparable == nil || *g0.Preparable || g0.Pools != "" || g0.Rail != "ibp24s0" {
		t.Errorf("GPU 0's port without a pool: %+v", g0)
	}
	// The table: the same, one line per GPU and port.
	table, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"GPU  GPU PCI", "ibp79s0", "default/demo-gpu", "net1", "10.26.0.3/16"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("ipamctl gpus:\n%s", table)
}
