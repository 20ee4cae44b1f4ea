package nicdra_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

func names(t *testing.T, p nicdra.Publish) []string {
	t.Helper()
	devs, _ := nicdra.Devices(p)
	var out []string
	for _, d := range devs {
		out = append(out, d.Name)
	}
	return out
}

func reasons(p nicdra.Publish) map[string]string {
	out := map[string]string{}
	for _, w := range nicdra.Withheld(p) {
		out[w.Device] = w.Reason
	}
	return out
}

// TestDevicesWithholdTheHostsAndTheCNIPathsPorts: on the DGX-H100-like tree,
// the port a pod's macvlan uses as master (in use by the CNI path), the
// BlueField port that carries the host's default route (the node's uplink),
// and two ports the operator excluded (one by netdev, one by PCI address) are
// not published, and Withheld says why; the other rails are.
func TestDevicesWithholdTheHostsAndTheCNIPathsPorts(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := nicdra.Publish{Inventory: scan(t, tree.Root)}
	all := names(t, p)
	p.InUse = map[string]string{"0000:40:00.0": "pod ml/nad-a (network demo-a)"}
	p.HostPorts = map[string]string{"enp225s0f0np0": "carries the host's default route", "eno1": "carries the host address 10.0.0.5/24"}
	p.Exclude = []string{"ibp79s0", "0000:5e:00.0"}
	got := names(t, p)
	want := slices.DeleteFunc(slices.Clone(all), func(n string) bool {
		return slices.Contains([]string{"pci-0000-40-00-0", "pci-0000-e1-00-0", "pci-0000-4f-00-0", "pci-0000-5e-00-0"}, n)
	})
	if !slices.Equal(got, want) || len(want) != len(all)-4 {
		t.Errorf("published %v, want %v", got, want)
	}
	for dev, want := range map[string]string{
		"pci-0000-40-00-0": "in use by pod ml/nad-a (network demo-a)",
		"pci-0000-e1-00-0": "uplink: enp225s0f0np0 carries the host's default route",
		"pci-0000-4f-00-0": "excluded: ibp79s0 is named in --dra-exclude-devices",
		"pci-0000-5e-00-0": "excluded: 0000:5e:00.0 is named in --dra-exclude-devices",
	} {
		if r := reasons(p)[dev]; r != want {
			t.Errorf("%s withheld as %q, want %q", dev, r, want)
		}
	}
	if n := len(nicdra.Withheld(p)); n != 4 {
		t.Errorf("%d ports withheld, want 4 (eno1 is no NVIDIA port): %+v", n, nicdra.Withheld(p))
	}
}

// TestDevicesWithholdVFsInPods: on an SR-IOV node, a VF whose netdev left the
// host (an SR-IOV NAD pod has it; its RDMA device stays visible) is not
// published, whatever IPAM that pod used; nor is a VF a CNI allocation names
// by deviceID. Their PF and sibling VFs are.
func TestDevicesWithholdVFsInPods(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.MoveNetdev("0000:3c:00.1", "ens1f0v1"); err != nil {
		t.Fatal(err)
	}
	p := nicdra.Publish{Inventory: scan(t, tree.Root), InUse: map[string]string{"0000:3c:00.2": "pod ml/sriov-b (network sriov)"}}
	if got, want := names(t, p), []string{"pci-0000-3b-00-0", "pci-0000-3c-00-0", "pci-0000-3c-00-3"}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v", got, want)
	}
	r := reasons(p)
	if !strings.HasPrefix(r["pci-0000-3c-00-1"], "in use: its netdev is in another network namespace") ||
		r["pci-0000-3c-00-2"] != "in use by pod ml/sriov-b (network sriov)" {
		t.Errorf("withheld: %q", r)
	}
}

// TestPrepareRefusesAPortInUse: a claim allocated from a slice published
// before a pod's macvlan took its port as master is refused at prepare, with
// an error naming the pod; so is the node's uplink. Nothing is allocated.
func TestPrepareRefusesAPortInUse(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	p.Ports = &nicdra.PortUse{InUse: func() map[string]string {
		return map[string]string{"0000:18:00.0": "pod ml/nad-a (network demo-a)"}
	}}
	_, err := p.Prepare(t.Context(), claim("u1", map[string]string{"nic": "pci-0000-18-00-0"}))
	if !errors.Is(err, nicdra.ErrPortUnavailable) || !strings.Contains(err.Error(), "in use by pod ml/nad-a (network demo-a)") {
		t.Fatalf("prepare of a port in use: %v, want ErrPortUnavailable naming pod ml/nad-a", err)
	}
	p.Ports = &nicdra.PortUse{HostPorts: func() (map[string]string, error) {
		return map[string]string{"ibp24s0": "carries the host address 10.1.0.5/16"}, nil
	}}
	_, err = p.Prepare(t.Context(), claim("u2", map[string]string{"nic": "pci-0000-18-00-0"}))
	if !errors.Is(err, nicdra.ErrPortUnavailable) || !strings.Contains(err.Error(), "uplink: ibp24s0 carries the host address") {
		t.Fatalf("prepare of the uplink: %v, want ErrPortUnavailable saying it is the uplink", err)
	}
	if held := n.held(t); len(held) != 0 {
		t.Errorf("held after the refusals: %v", held)
	}
	claims, err := p.Claims()
	if err != nil || len(claims) != 0 {
		t.Errorf("checkpointed after the refusals: %v %v", claims, err)
	}
}

// TestPreparedNetdevsKeepTheNodeLabels: the node labels computed from a scan
// in which a claim's PF is in its pod (netdev gone, RDMA device left) are, read
// through WithPreparedNetdevs as ipam-node's labeller reads them, the labels of
// the port on the host: the node stays in the pools that select its rail.
func TestPreparedNetdevsKeepTheNodeLabels(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := nicdiscovery.Labels(scan(t, tree.Root), nil)
	if err := tree.MoveNetdev("0000:18:00.0", "ibp24s0"); err != nil {
		t.Fatal(err)
	}
	inPod := scan(t, tree.Root)
	if bare, _ := nicdiscovery.Labels(inPod, nil); bare["nic.hwipam.io/ibp24s0"] != "" {
		t.Fatalf("the tree still shows ibp24s0 on the host: %v", bare)
	}
	kept, _ := nicdiscovery.Labels(nicdra.WithPreparedNetdevs(inPod, map[string]string{"0000:18:00.0": "ibp24s0"}), nil)
	compared := 0
	for k, v := range before {
		if strings.HasPrefix(k, "nic.hwipam.io/ibp24s0") && !strings.HasPrefix(k, "nic.hwipam.io/ibp24s0_8001") {
			compared++
			if kept[k] != v {
				t.Errorf("label %s: %q in the pod, %q on the host", k, kept[k], v)
			}
		}
	}
	if compared == 0 {
		t.Fatalf("no label of ibp24s0 on the host: %v", before)
	}
}
