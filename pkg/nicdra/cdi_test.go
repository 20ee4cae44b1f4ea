package nicdra_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

// A claim's CDI spec, read with the schema and parser of the CDI library
// containerd 2.x uses (v1.0.1; its cache needs a runtime-tools that does not
// build with this module's runtime-spec, so the injection itself is proven on
// the real node), gives each device of the claim exactly the RDMA character
// devices of its port, with the numbers of the tree's dev files; removing and
// pruning leave no spec of a claim that is not prepared.
func TestCDISpecsAsTheRuntimeReadsThem(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cdi")
	specs := &nicdra.CDISpecs{Dir: dir, SysfsRoot: tree.Root}
	uid := types.UID("0b6f4a7e-0000-4000-8000-000000000001")
	devs := []nicdra.PreparedDevice{{Request: "nic", Device: "pci-0000-4f-00-0", PCIAddress: "0000:4f:00.0"},
		{Request: "gpu-nic", Device: "pci-0000-5e-00-0", PCIAddress: "0000:5e:00.0"}}
	ids, err := specs.Write(uid, devs)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || len(ids["pci-0000-4f-00-0"]) != 1 || ids["pci-0000-4f-00-0"][0] != "k8s.nic.hwipam.io/claim="+string(uid)+"-pci-0000-4f-00-0" {
		t.Fatalf("CDI device IDs %v", ids)
	}
	// The spec as the runtime's CDI library reads it: its schema (strictly),
	// its version, the device names and the qualified IDs.
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("spec files %v, %v; want one for the claim", entries, err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, entries[0].Name()))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var spec cdispec.Spec
	if err := dec.Decode(&spec); err != nil {
		t.Fatalf("the spec does not decode as a CDI spec: %v\n%s", err, raw)
	}
	if err := cdispec.ValidateVersion(&spec); err != nil {
		t.Errorf("spec version: %v", err)
	}
	for _, id := range ids {
		vendor, class, name, err := parser.ParseQualifiedName(id[0])
		if err != nil || vendor+"/"+class != spec.Kind {
			t.Errorf("device ID %s: %s/%s %s, %v; want kind %s", id[0], vendor, class, name, err, spec.Kind)
		}
	}
	byName := map[string][]string{}
	for _, d := range spec.Devices {
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			t.Errorf("device name %q: %v", d.Name, err)
		}
		for _, n := range d.ContainerEdits.DeviceNodes {
			byName[d.Name] = append(byName[d.Name], n.Path)
			if n.Path == "/dev/infiniband/uverbs2" && (n.Type != "c" || n.Major != 231 || n.Minor != 194 || n.FileMode == nil ||
				*n.FileMode != 0o666) {
				t.Errorf("uverbs2: %+v, want a character device 231:194 mode 0666 (the tree's dev file, rdma-core's mode)", n)
			}
		}
	}
	rail2 := byName[string(uid)+"-pci-0000-4f-00-0"]
	if !slices.Contains(rail2, "/dev/infiniband/uverbs2") || !slices.Contains(rail2, "/dev/infiniband/rdma_cm") ||
		slices.Contains(rail2, "/dev/infiniband/uverbs3") {
		t.Errorf("the devices of rail 2's port: %v, want uverbs2 and rdma_cm, not rail 3's uverbs3", rail2)
	}

	// Unprepared: no spec. Pruned: only the prepared claims' stay.
	if err := specs.Remove(uid); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("after Remove: %v", entries)
	}
	if err := specs.Remove(uid); err != nil {
		t.Errorf("removing again: %v", err)
	}
	kept, gone := types.UID("kept-1"), types.UID("gone-1")
	for _, u := range []types.UID{kept, gone} {
		if _, err := specs.Write(u, devs[:1]); err != nil {
			t.Fatal(err)
		}
	}
	n, err := specs.Prune(func() (map[types.UID]nicdra.PreparedClaim, error) {
		return map[types.UID]nicdra.PreparedClaim{kept: {State: nicdra.PrepareCompleted}, gone: {State: nicdra.PrepareCompleted,
			Unpreparing: true}}, nil
	})
	entries, _ = os.ReadDir(dir)
	if err != nil || n != 1 || len(entries) != 1 || !strings.Contains(entries[0].Name(), string(kept)) {
		t.Errorf("prune: %d, %v; left %v, want the prepared claim's spec alone", n, err, entries)
	}
}
