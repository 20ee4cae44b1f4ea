package nicdra

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
)

func attr(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// TestPreparedDeviceKeepsItsAttributesInThePod: the PF of a prepared claim
// moves into its pod (its netdev leaves the host, its RDMA device stays in the
// scan): the published device keeps its rail, pool and netdev, instead of
// losing them until the port comes back, also after a restart (the checkpoint
// says which netdev it was).
func TestPreparedDeviceKeepsItsAttributesInThePod(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cp := CheckpointFile{Path: filepath.Join(t.TempDir(), "checkpoint.json")}
	if err := cp.Save(&Checkpoint{Claims: map[types.UID]PreparedClaim{"u1": {Namespace: "ml", Name: "c", PodUID: "pod-uid",
		State: PrepareCompleted, Devices: []PreparedDevice{{Request: "nic", Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0",
			HostNetdev: "ibp24s0", Rail: "ibp24s0"}}}}}); err != nil {
		t.Fatal(err)
	}
	// The host's links: ibp24s0 until the pod's sandbox takes it.
	links := map[string]bool{"ibp24s0": true}
	ports := &PortUse{HostLinks: func() (map[string]bool, error) { return links, nil }}
	newDriver := func() *Driver {
		return &Driver{Preparer: &Preparer{Checkpoint: cp, Ports: ports}, Log: logr.Discard(), changed: make(chan struct{}),
			Inventory: func() (*nicdiscovery.Inventory, error) {
				live := false
				return nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: tree.Root, Live: &live})
			},
			PoolsByRail: func() (map[string][]string, bool) { return map[string][]string{"ibp24s0": {"rail0"}}, true }}
	}
	device := func(d *Driver) resourceapi.Device {
		t.Helper()
		for _, dev := range d.devices {
			if dev.Name == "pci-0000-18-00-0" {
				return dev
			}
		}
		t.Fatalf("pci-0000-18-00-0 is not published: %d devices", len(d.devices))
		return resourceapi.Device{}
	}
	want := map[resourceapi.QualifiedName]string{AttrRail: "ibp24s0", AttrPool: "rail0", AttrNetdev: "ibp24s0"}
	check := func(when string, dev resourceapi.Device) {
		t.Helper()
		for name, v := range want {
			if got := attr(dev, name); got != v {
				t.Errorf("%s: %s is %q, want %q", when, name, got, v)
			}
		}
		// Its netdev counts as on the host in its pod too (issue 39): the
		// device does not flip to "cannot be prepared" while a claim has it.
		for _, name := range []resourceapi.QualifiedName{AttrNetdevOnHost, AttrPreparable} {
			if b := dev.Attributes[name].BoolValue; b == nil || !*b {
				t.Errorf("%s: %s is %v, want true", when, name, b)
			}
		}
	}
	d := newDriver()
	d.refresh()
	check("on the host", device(d))
	if err := tree.MoveNetdev("0000:18:00.0", "ibp24s0"); err != nil { // the pod's sandbox started
		t.Fatal(err)
	}
	links = map[string]bool{}
	d.refresh()
	check("in the pod", device(d))
	restarted := newDriver()
	restarted.refresh()
	check("in the pod, after a restart", device(restarted))
}
