package nicdiscovery_test

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
)

// A daemon without hostNetwork (network-operator's NicClusterPolicy rendering)
// reads a sysfs mounted in its pod's network namespace: the NICs' net/ directories
// and /sys/class/net show none of the host's netdevs. Ethernet ports must keep
// their labels (named from the RDMA GID table); InfiniBand ports, whose IPoIB
// netdev nothing there names, are labelled by RDMA device, and the node says so.
func TestPodViewWithoutHostNetwork(t *testing.T) {
	layouts := []struct {
		name  string
		build func(root string) (*fakesysfs.Tree, error)
		// renamed maps a host label name part to the pod view's, for ports the pod
		// view names differently: IB ports by RDMA device, a RoCE LAG by its bond.
		renamed map[string]string
		// differs are the pod view's values where they differ from the host's.
		differs map[string]string
	}{
		{"DGX-H100", fakesysfs.DGXH100, map[string]string{
			"ibp24s0": "mlx5_0", "ibp64s0": "mlx5_1", "ibp79s0": "mlx5_2", "ibp94s0": "mlx5_3",
			"ibp154s0": "mlx5_4", "ibp192s0": "mlx5_5", "ibp206s0": "mlx5_6", "ibp220s0": "mlx5_7"}, nil},
		{"SR-IOV", func(root string) (*fakesysfs.Tree, error) { return fakesysfs.SRIOV(root, 2, 4) }, nil, nil},
		{"switchdev", func(root string) (*fakesysfs.Tree, error) { return fakesysfs.Switchdev(root, 3) }, nil, nil},
		{"VPI", fakesysfs.VPI, map[string]string{"ib0": "mlx4_0"}, nil},
		// The LAG's RDMA device has one port, on bond0: one labelled port where the
		// host has the two slaves.
		// Its speed is the LAG RDMA port's, both slaves together.
		{"RoCE LAG", fakesysfs.RoCELAG, map[string]string{"enp134s0f0np0": "bond0", "enp134s0f1np1": ""},
			map[string]string{"nic.hwipam.io/bond0.speed": "50000"}},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			tree, err := l.build(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			host := scan(t, tree.Root)
			if host.NetdevsHidden {
				t.Fatal("the host's view reported hidden netdevs")
			}
			hostLabels, _ := nicdiscovery.Labels(host, nil)
			if err := tree.PodView(); err != nil {
				t.Fatal(err)
			}
			pod := scan(t, tree.Root)
			if !pod.NetdevsHidden {
				t.Fatalf("the pod's view did not report hidden netdevs: %s", js(pod))
			}
			podLabels, warnings := nicdiscovery.Labels(pod, nil)
			t.Logf("pod view labels: %v; warnings: %q", podLabels, warnings)

			want := map[string]string{}
			ports := 0
			for k, v := range hostLabels {
				name, attr, _ := strings.Cut(strings.TrimPrefix(k, nicdiscovery.LabelPrefix), ".")
				if !strings.HasPrefix(k, nicdiscovery.LabelPrefix) || name == "present" || name == "count" || name == "rdma" {
					want[k] = v
					continue
				}
				if to, ok := l.renamed[name]; ok {
					name = to
				}
				if name == "" {
					continue
				}
				key := nicdiscovery.LabelPrefix + name
				if attr != "" {
					key += "." + attr
				} else {
					ports++
				}
				want[key] = v
			}
			want[nicdiscovery.LabelCount] = strconv.Itoa(ports)
			want[nicdiscovery.LabelNetdevs] = "hidden"
			maps.Copy(want, l.differs)
			if !maps.Equal(podLabels, want) {
				t.Errorf("pod view labels\n got %v\nwant %v", podLabels, want)
			}
			for from, to := range l.renamed {
				if to == "" || strings.HasPrefix(to, "bond") {
					continue
				}
				if !slices.ContainsFunc(warnings, func(w string) bool {
					return strings.Contains(w, "not visible from this network namespace") && strings.Contains(w, `"`+to+`"`)
				}) {
					t.Errorf("no warning says that %s (%s on the host) is labelled by its RDMA device: %q", to, from, warnings)
				}
			}
			for _, n := range pod.NICs {
				for _, p := range n.Ports {
					if p.Netdev != "" && p.NetdevFrom != nicdiscovery.NetdevFromRDMAGID {
						t.Errorf("%s: port %s does not say it was named by the GID table", n.PCIAddress, p.Netdev)
					}
				}
			}
		})
	}
}

// Rails named by PCI address still resolve in the pod's view; rails named by an
// IPoIB netdev cannot, and say how to fix the map.
func TestPodViewRails(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.PodView(); err != nil {
		t.Fatal(err)
	}
	labels, warnings := nicdiscovery.Labels(scan(t, tree.Root), nicdiscovery.Rails{
		"r0": {"0000:18:00.0"}, "r1": {"ibp64s0"}, "fe": {"enp225s0f0np0"},
	})
	if got := labels["nic.hwipam.io/rail.r0"]; got != "mlx5_0" {
		t.Errorf("rail.r0 = %q, want mlx5_0 (the RDMA device of 0000:18:00.0)", got)
	}
	if got := labels["nic.hwipam.io/rail.fe"]; got != "enp225s0f0np0" {
		t.Errorf("rail.fe = %q, want the RoCE port's netdev from its GID table", got)
	}
	if _, ok := labels["nic.hwipam.io/rail.r1"]; ok {
		t.Error("rail.r1 labelled though its netdev is not visible")
	}
	if !slices.ContainsFunc(warnings, func(w string) bool {
		return strings.Contains(w, `rail "r1"`) && strings.Contains(w, "by PCI address")
	}) {
		t.Errorf("no warning tells to name rail r1 by PCI address: %q", warnings)
	}
}

// A host whose NVIDIA netdevs were all moved into pods still has its own physical
// ports (here the Intel management port): not a pod's view.
func TestHostWithEveryNICNetdevMovedIsNotAPodView(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inv := scan(t, tree.Root)
	for _, n := range inv.NICs {
		for _, nd := range n.Netdevs {
			if err := tree.MoveNetdev(n.PCIAddress, nd); err != nil {
				t.Fatal(err)
			}
		}
	}
	inv = scan(t, tree.Root)
	if inv.NetdevsHidden {
		t.Fatal("a host with its management port was taken for a pod's view")
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	if _, ok := labels[nicdiscovery.LabelNetdevs]; ok {
		t.Errorf("labels %v say netdevs are hidden", labels)
	}
}
