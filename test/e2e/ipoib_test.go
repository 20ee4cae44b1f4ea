package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/harness"
)

// The IPoIB example (deploy/examples/nad-ipoib.yaml) as a cluster takes it: its
// pool and its two NetworkAttachmentDefinitions are created on a real API server
// (with Multus's NAD CRD); the ipam-node binary reads the captured ConnectX-3
// InfiniBand machine (ib0 on PF 0000:82:00.0) and labels its Node; the
// ipam-controller binary gives the pool a block there. Each NAD's config, as the
// API server returns it, goes to the real nv-ipam plugin the way ipoib-cni hands
// it its ipam section (the whole network config on stdin): "rail": "auto" finds
// the pool from master's rail, the fixed NAD names it; both addresses come from
// the node's block, and the daemon records the rail. ipoib-cni itself cannot run
// on this kernel (no IPoIB), so the test calls the IPAM plugin directly.
func TestIPoIBExample(t *testing.T) {
	harness.RequireRoot(t)
	root := harness.RepoRoot()
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{CRDDirs: []string{
		filepath.Join(root, "deploy", "crds"), filepath.Join(root, "test", "realnode", "nad-crd.yaml")}})
	c, ctx := cp.Client, t.Context()
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}); err != nil {
		t.Fatal(err)
	}

	// The example, object by object.
	data, err := os.ReadFile(filepath.Join(root, "deploy", "examples", "nad-ipoib.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var nads []*unstructured.Unstructured
	var pool *unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if err := c.Create(ctx, u); err != nil {
			t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		switch u.GetKind() {
		case "NetworkAttachmentDefinition":
			nads = append(nads, u)
		case "IPPool":
			pool = u
		}
	}
	if len(nads) != 2 || pool == nil {
		t.Fatalf("deploy/examples/nad-ipoib.yaml: %d NADs and pool %v; want two NADs and the pool", len(nads), pool)
	}

	tree, err := fakesysfs.Extract(filepath.Join(root, "nicdiscovery", "testdata", "sysfs", "hwloc-32em64t-2n8c-cx3-ib.tar.bz2"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A partition's child interface on the host, as `ip link add link ib0 name
	// ib0.8001 type ipoib pkey 0x8001` makes it: a netdev of the same PCI function
	// stacked on ib0 (its iflink is ib0's ifindex). It is not a port: no label.
	pf := filepath.Join(tree, "sys", "devices", "pci0000:80", "0000:80:02.2", "0000:82:00.0")
	child := filepath.Join(pf, "net", "ib0.8001")
	if err := os.CopyFS(child, os.DirFS(filepath.Join(pf, "net", "ib0"))); err != nil {
		t.Fatal(err)
	}
	for file, v := range map[string]string{"ifindex": "9\n", "iflink": "5\n", "pkey": "0x8001\n"} {
		if err := os.WriteFile(filepath.Join(child, file), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../devices/pci0000:80/0000:80:02.2/0000:82:00.0/net/ib0.8001",
		filepath.Join(tree, "sys", "class", "net", "ib0.8001")); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	start(t, harness.BuildBinary(t, "./cmd/ipam-controller"), "--kubeconfig", kubeconfig, "--ippools-namespace", pool.GetNamespace(),
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	state := t.TempDir()
	w := &world{binDir: t.TempDir(), confDir: t.TempDir(), socket: filepath.Join(state, "daemon.sock")}
	start(t, harness.BuildBinary(t, "./cmd/ipam-node"), "--node-name", nodeName, "--kubeconfig", kubeconfig,
		"--ippools-namespace", pool.GetNamespace(), "--store-file", filepath.Join(state, "store"), "--bind-address", "unix://"+w.socket,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "0",
		"--cni-bin-dir", w.binDir, "--cni-nv-ipam-bin-file", harness.BuildBinary(t, "./cmd/nv-ipam"),
		"--cni-conf-dir", w.confDir, "--cni-daemon-socket", "unix://"+w.socket, "--sysfs-root", tree, "--nic-rescan-interval", "1h")
	var block v1alpha1.IPPool
	eventually(t, "the pool's block on the node with ib0", func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: pool.GetNamespace(), Name: pool.GetName()}, &block) == nil &&
			len(block.Status.Allocations) == 1 && block.Status.Allocations[0].NodeName == nodeName
	})
	first, last := netip.MustParseAddr(block.Status.Allocations[0].StartIP), netip.MustParseAddr(block.Status.Allocations[0].EndIP)
	var node corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: nodeName}, &node); err != nil {
		t.Fatal(err)
	}
	if node.Labels["nic.hwipam.io/count"] != "1" || node.Labels["nic.hwipam.io/ib0.8001"] != "" {
		t.Errorf("the node's labels count the child interface: %v", node.Labels)
	}
	w.waitReady(t, pool.GetName())

	conn, err := grpc.NewClient("unix://"+w.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	netns := harness.NewNetNS(t)
	type attach struct {
		name   string
		nad    *unstructured.Unstructured
		master string // replaces the NAD's master when set
	}
	cases := []attach{{nads[0].GetName(), nads[0], ""}, {nads[1].GetName(), nads[1], ""}}
	// The same rail NAD on a partition: master is the child interface, whose PCI
	// function is ib0's, so its rail (and pool) is ib0's.
	cases = append(cases, attach{"pkey-child-master", nads[0], "ib0.8001"})
	for _, tc := range cases {
		nad := tc.nad
		t.Run(tc.name, func(t *testing.T) {
			// The NAD as the API server stores it.
			var stored unstructured.Unstructured
			stored.SetGroupVersionKind(nad.GroupVersionKind())
			if err := c.Get(ctx, client.ObjectKeyFromObject(nad), &stored); err != nil {
				t.Fatal(err)
			}
			config, _, _ := unstructured.NestedString(stored.Object, "spec", "config")
			var conf map[string]any
			if err := json.Unmarshal([]byte(config), &conf); err != nil {
				t.Fatalf("the NAD's config: %v", err)
			}
			if conf["type"] != "ipoib" || conf["master"] != "ib0" {
				t.Fatalf("the NAD's config is not an IPoIB network on ib0: %s", config)
			}
			// The only change (besides master for the child): where this test's daemon
			// wrote nv-ipam.conf.
			conf["ipam"].(map[string]any)["confDir"] = w.confDir
			if tc.master != "" {
				conf["master"] = tc.master
			}
			raw, err := json.Marshal(conf)
			if err != nil {
				t.Fatal(err)
			}
			call := harness.CNICall{Plugin: filepath.Join(w.binDir, "nv-ipam"), Command: "ADD", ContainerID: "ctr-" + tc.name,
				NetNS: netns.Path, IfName: "net1", Args: podArgs("trainer-" + tc.name), Path: []string{w.binDir}, Config: raw}
			out, err := call.Run()
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			a := netip.MustParsePrefix(addrOf(t, out)).Addr()
			if a.Less(first) || last.Less(a) {
				t.Fatalf("address %s is outside the node's block %s-%s of pool %s", a, first, last, pool.GetName())
			}
			resp, err := infov1.NewNodeInfoServiceClient(conn).ListAllocations(ctx, &infov1.ListAllocationsRequest{Pool: pool.GetName()})
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, al := range resp.GetAllocations() {
				if al.GetContainerId() == call.ContainerID {
					found = true
					if al.GetRail() != "ib0" {
						t.Errorf("the allocation's rail is %q, want ib0 (the pool's, and master's)", al.GetRail())
					}
				}
			}
			if !found {
				t.Fatalf("the daemon holds no allocation of %s: %v", call.ContainerID, resp.GetAllocations())
			}
			call.Command = "DEL"
			if _, err := call.Run(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}
