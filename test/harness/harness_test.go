package harness_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/test/harness"
)

func TestControlPlaneStoresObjects(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()

	info, err := cp.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if info.GitVersion != "v1.37.1" || info.Major != "1" || info.Minor != "37" {
		t.Errorf("apiserver reports version %q (major %q, minor %q), want v1.37.1: check the ldflags in hack/test-assets.sh",
			info.GitVersion, info.Major, info.Minor)
	}

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   "gpu-node-1",
		Labels: map[string]string{"nic.hwipam.io/ibp75s0": "ib"},
	}}
	if err := cp.Client.Create(ctx, node); err != nil {
		t.Fatalf("creating node: %v", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "rails", Namespace: "default"},
		Data:       map[string]string{"rail0": "ibp75s0"},
	}
	if err := cp.Client.Create(ctx, cm); err != nil {
		t.Fatalf("creating configmap: %v", err)
	}

	// Read back through the typed clientset, a second path to the same apiserver.
	gotNode, err := cp.Clientset.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting node: %v", err)
	}
	if gotNode.Labels["nic.hwipam.io/ibp75s0"] != "ib" || gotNode.UID == "" {
		t.Errorf("node read back = labels %v uid %q, want the label set at creation and a UID", gotNode.Labels, gotNode.UID)
	}
	var gotCM corev1.ConfigMap
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "rails"}, &gotCM); err != nil {
		t.Fatalf("getting configmap: %v", err)
	}
	if gotCM.Data["rail0"] != "ibp75s0" {
		t.Errorf("configmap data = %v, want rail0=ibp75s0", gotCM.Data)
	}
}

// TestMacvlanHostLocalInNetNS runs the real macvlan plugin with host-local IPAM: a
// "node" namespace holds a veth whose other end sits in a "peer" namespace; macvlan
// puts an interface on top of the node's veth end into a fresh "pod" namespace.
func TestMacvlanHostLocalInNetNS(t *testing.T) {
	harness.RequireRoot(t)
	bin := harness.CNIBinDir(t)
	node, pod, peer := harness.NewNetNS(t), harness.NewNetNS(t), harness.NewNetNS(t)
	harness.NewVethPair(t, node, "uplink0", peer, "peer0")
	if _, err := peer.Exec("ip", "addr", "add", "192.168.77.1/24", "dev", "peer0"); err != nil {
		t.Fatal(err)
	}

	dataDir := t.TempDir()
	conf := fmt.Sprintf(`{
		"cniVersion": "1.0.0", "name": "railnet", "type": "macvlan",
		"master": "uplink0", "mode": "bridge",
		"ipam": {"type": "host-local", "dataDir": %q,
			"ranges": [[{"subnet": "192.168.77.0/24", "rangeStart": "192.168.77.10", "rangeEnd": "192.168.77.20"}]]}
	}`, dataDir)
	call := harness.CNICall{
		Plugin: filepath.Join(bin, "macvlan"), Command: "ADD",
		ContainerID: "c0ffee", NetNS: pod.Path, IfName: "net1",
		Path: []string{bin}, Config: []byte(conf), RunIn: node,
	}
	out := call.MustRun(t)

	var res current.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("decoding ADD result %s: %v", out, err)
	}
	if len(res.IPs) != 1 {
		t.Fatalf("ADD result has %d IPs, want 1: %s", len(res.IPs), out)
	}
	got := res.IPs[0].Address.String()
	addr := netip.MustParsePrefix(got)
	if addr.Bits() != 24 || addr.Addr().Compare(netip.MustParseAddr("192.168.77.10")) < 0 ||
		addr.Addr().Compare(netip.MustParseAddr("192.168.77.20")) > 0 {
		t.Errorf("ADD returned %s, want an address in 192.168.77.10-20 with /24", got)
	}
	if inNS := pod.Addrs(t, "net1", netlink.FAMILY_V4); !slices.Equal(inNS, []string{got}) {
		t.Errorf("addresses on net1 inside the pod netns = %v, want [%s]", inNS, got)
	}
	if _, err := pod.Exec("ping", "-c", "1", "-W", "5", "192.168.77.1"); err != nil {
		t.Errorf("pod cannot reach the peer through macvlan over the veth: %v", err)
	}

	check := call
	check.Command = "CHECK"
	check.Config = withPrevResult(t, conf, out)
	check.MustRun(t)

	del := call
	del.Command = "DEL"
	del.MustRun(t)
	if _, err := pod.Handle(t).LinkByName("net1"); err == nil {
		t.Errorf("net1 still exists in the pod netns after DEL")
	}
	if _, err := os.Stat(filepath.Join(dataDir, "railnet", addr.Addr().String())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("host-local still holds %s after DEL (stat: %v)", addr.Addr(), err)
	}
}

// TestCNIRunnerDecodesErrors proves the runner hands back the plugin's error object.
func TestCNIRunnerDecodesErrors(t *testing.T) {
	harness.RequireRoot(t)
	bin := harness.CNIBinDir(t)
	node, pod := harness.NewNetNS(t), harness.NewNetNS(t)
	_, err := harness.CNICall{
		Plugin: filepath.Join(bin, "macvlan"), Command: "ADD",
		ContainerID: "c0ffee", NetNS: pod.Path, IfName: "net1", Path: []string{bin},
		Config: []byte(`{"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "master": "nosuchlink0",
			"ipam": {"type": "host-local", "ranges": [[{"subnet": "10.9.0.0/24"}]]}}`),
		RunIn: node,
	}.Run()
	var cniErr *harness.CNIError
	if !errors.As(err, &cniErr) {
		t.Fatalf("ADD with a missing master: err = %v, want a *CNIError", err)
	}
	if cniErr.Code == 0 || cniErr.Msg == "" {
		t.Errorf("error object = %+v, want a non-zero code and a message", cniErr)
	}
}

// withPrevResult adds the ADD result as prevResult, as a runtime does for CHECK.
func withPrevResult(t *testing.T, conf string, result []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(conf), &m); err != nil {
		t.Fatal(err)
	}
	var prev map[string]any
	if err := json.Unmarshal(result, &prev); err != nil {
		t.Fatal(err)
	}
	m["prevResult"] = prev
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
