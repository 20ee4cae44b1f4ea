// Package e2e runs the CNI path end to end: the real ipam-node process, the real
// nv-ipam plugin exec'd by the real reference plugins in network namespaces,
// against a real apiserver.
package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

const nodeName = "e2e-node"

type world struct {
	binDir, socket, confDir string
	daemon                  *exec.Cmd
	daemonArgs              []string
}

func copyExec(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// start runs a binary until the test ends.
func start(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func setup(t *testing.T) *world {
	t.Helper()
	harness.RequireRoot(t)
	refBin := harness.CNIBinDir(t)
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()
	if err := cp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}); err != nil {
		t.Fatal(err)
	}
	for name, blk := range map[string][4]string{
		"rail0":   {"192.168.50.0/24", "192.168.50.10", "192.168.50.20", "192.168.50.1"},
		"rail0v6": {"fd00:50::/64", "fd00:50::10", "fd00:50::20", ""},
	} {
		p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: v1alpha1.IPPoolSpec{Subnet: blk[0], PerNodeBlockSize: 11, Gateway: blk[3]}}
		if name == "rail0" {
			p.Spec.Routes = []v1alpha1.Route{{Dst: "10.200.0.0/16"}}
		}
		if err := cp.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status.Allocations = []v1alpha1.Allocation{{NodeName: nodeName, StartIP: blk[1], EndIP: blk[2]}}
		if err := cp.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{binDir: t.TempDir(), confDir: t.TempDir()}
	for _, p := range []string{"macvlan", "host-device", "bridge"} {
		copyExec(t, filepath.Join(refBin, p), filepath.Join(w.binDir, p))
	}
	state := t.TempDir()
	w.socket = filepath.Join(state, "daemon.sock")
	// The daemon installs the plugin and nv-ipam.conf, as in a cluster; network
	// configs below name no daemonSocket, so it comes from that file.
	w.daemonArgs = []string{"--node-name", nodeName, "--kubeconfig", kubeconfig, "--ippools-namespace", "default",
		"--store-file", filepath.Join(state, "store"), "--bind-address", "unix://" + w.socket,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "0",
		"--cni-bin-dir", w.binDir, "--cni-nv-ipam-bin-file", harness.BuildBinary(t, "./cmd/nv-ipam"),
		"--cni-conf-dir", w.confDir, "--cni-daemon-socket", "unix://" + w.socket, "--cni-daemon-call-timeout", "2",
		"--cni-log-file", filepath.Join(state, "cni.log")}
	daemonBin := harness.BuildBinary(t, "./cmd/ipam-node")
	w.daemonArgs = append([]string{daemonBin}, w.daemonArgs...)
	w.startDaemon(t)
	return w
}

func (w *world) startDaemon(t *testing.T) {
	t.Helper()
	w.daemon = start(t, w.daemonArgs...)
	eventually(t, "ipam-node's socket", func() bool {
		_, err := os.Stat(w.socket)
		return err == nil
	})
	if _, err := os.Stat(filepath.Join(w.binDir, "nv-ipam")); err != nil {
		t.Fatalf("ipam-node did not install the plugin: %v", err)
	}
}

func (w *world) stopDaemon(t *testing.T) {
	t.Helper()
	_ = w.daemon.Process.Signal(syscall.SIGTERM)
	_ = w.daemon.Wait()
}

func (w *world) conf(version, netType, extra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion": %q, "name": "rail0", "type": %q %s,
		"ipam": {"type": "nv-ipam", "confDir": %q}}`,
		version, netType, extra, w.confDir))
}

// waitReady polls the plugin's STATUS until the daemon has synced the pools.
func (w *world) waitReady(t *testing.T, pools string) {
	t.Helper()
	conf := []byte(fmt.Sprintf(`{"cniVersion": "1.1.0", "name": "rail0", "type": "macvlan",
		"ipam": {"type": "nv-ipam", "confDir": %q, "poolName": %q}}`, w.confDir, pools))
	eventually(t, "STATUS to succeed", func() bool {
		_, err := harness.CNICall{Plugin: filepath.Join(w.binDir, "nv-ipam"), Command: "STATUS", Config: conf, Path: []string{w.binDir}}.Run()
		return err == nil
	})
}

func podArgs(name string) string {
	return "IgnoreUnknown=1;K8S_POD_NAME=" + name + ";K8S_POD_NAMESPACE=default;K8S_POD_UID=uid-" + name
}

func addrOf(t *testing.T, out []byte) string {
	t.Helper()
	var res current.Result
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 {
		t.Fatalf("ADD result %s: %v", out, err)
	}
	return res.IPs[0].Address.String()
}

func TestMacvlanTwoPodsAndEveryVerb(t *testing.T) {
	w := setup(t)
	node, pod1, pod2 := harness.NewNetNS(t), harness.NewNetNS(t), harness.NewNetNS(t)
	peer := harness.NewNetNS(t)
	harness.NewVethPair(t, node, "uplink0", peer, "peer0")
	conf := w.conf("1.0.0", "macvlan", `, "master": "uplink0", "mode": "bridge"`)
	call := func(cmd, cid string, ns *harness.NetNS, pod string, config []byte) ([]byte, error) {
		return harness.CNICall{Plugin: filepath.Join(w.binDir, "macvlan"), Command: cmd, ContainerID: cid, NetNS: ns.Path,
			IfName: "net1", Args: podArgs(pod), Path: []string{w.binDir}, Config: config, RunIn: node}.Run()
	}
	// STATUS says when ADD can succeed: once the daemon has synced the pool.
	w.waitReady(t, "rail0")
	out1, err := call("ADD", "ctr-1", pod1, "pod1", conf)
	if err != nil {
		t.Fatalf("ADD pod1: %v", err)
	}
	a1 := addrOf(t, out1)
	out2, err := call("ADD", "ctr-2", pod2, "pod2", conf)
	if err != nil {
		t.Fatalf("ADD pod2: %v", err)
	}
	a2 := addrOf(t, out2)
	if a1 == a2 || a1 != "192.168.50.10/24" || a2 != "192.168.50.11/24" {
		t.Errorf("pods got %s and %s, want 192.168.50.10/24 and .11/24", a1, a2)
	}
	if got := pod1.Addrs(t, "net1", netlink.FAMILY_V4); !slices.Equal(got, []string{a1}) {
		t.Errorf("pod1's net1 has %v, want %s", got, a1)
	}
	if got := pod2.Addrs(t, "net1", netlink.FAMILY_V4); !slices.Equal(got, []string{a2}) {
		t.Errorf("pod2's net1 has %v, want %s", got, a2)
	}
	if _, err := pod1.Exec("ping", "-c", "1", "-W", "5", strings.Split(a2, "/")[0]); err != nil {
		t.Errorf("pod1 cannot reach pod2 over macvlan: %v", err)
	}
	var res current.Result
	_ = json.Unmarshal(out1, &res)
	if len(res.Routes) != 1 || res.Routes[0].Dst.String() != "10.200.0.0/16" || res.IPs[0].Gateway.String() != "192.168.50.1" {
		t.Errorf("ADD result routes %v gateway %v", res.Routes, res.IPs[0].Gateway)
	}

	// The IPAM plugin alone: repeating ADD returns the same address; CHECK passes.
	ipamCall := func(cmd, cid, pod string, config []byte) ([]byte, error) {
		return harness.CNICall{Plugin: filepath.Join(w.binDir, "nv-ipam"), Command: cmd, ContainerID: cid, NetNS: pod1.Path,
			IfName: "net1", Args: podArgs(pod), Path: []string{w.binDir}, Config: config}.Run()
	}
	again, err := ipamCall("ADD", "ctr-1", "pod1", conf)
	if err != nil || addrOf(t, again) != a1 {
		t.Errorf("repeated ADD = %s %v, want %s", again, err, a1)
	}
	withPrev := func(out []byte) []byte {
		var m map[string]any
		_ = json.Unmarshal(conf, &m)
		var prev any
		_ = json.Unmarshal(out, &prev)
		m["prevResult"] = prev
		b, _ := json.Marshal(m)
		return b
	}
	if _, err := ipamCall("CHECK", "ctr-1", "pod1", withPrev(out1)); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// GC keeps only what is listed as valid: ctr-1 stays, ctr-2 goes.
	gc := w.conf("1.1.0", "macvlan", `, "cni.dev/valid-attachments": [{"containerID": "ctr-1", "ifname": "net1"}]`)
	if _, err := ipamCall("GC", "", "", gc); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := ipamCall("CHECK", "ctr-2", "pod2", withPrev(out2)); err == nil {
		t.Error("CHECK of ctr-2 passed after GC released it")
	}
	if _, err := ipamCall("CHECK", "ctr-1", "pod1", withPrev(out1)); err != nil {
		t.Errorf("GC released a valid attachment: %v", err)
	}
	// DEL through macvlan; CHECK fails afterwards.
	if _, err := call("DEL", "ctr-1", pod1, "pod1", conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, err := ipamCall("CHECK", "ctr-1", "pod1", withPrev(out1)); err == nil {
		t.Error("CHECK passed after DEL")
	}
	if _, err := ipamCall("DEL", "ctr-1", "pod1", conf); err != nil {
		t.Errorf("second DEL: %v", err)
	}

	// STATUS follows the daemon; ADD says "try again later" while it is down.
	status := w.conf("1.1.0", "macvlan", "")
	if _, err := ipamCall("STATUS", "", "", status); err != nil {
		t.Errorf("STATUS with the daemon up: %v", err)
	}
	w.stopDaemon(t)
	var cniErr *harness.CNIError
	if _, err := ipamCall("STATUS", "", "", status); !errors.As(err, &cniErr) || cniErr.Code != 50 {
		t.Errorf("STATUS with the daemon down = %v, want code 50", err)
	}
	if _, err := ipamCall("ADD", "ctr-9", "pod9", conf); !errors.As(err, &cniErr) || cniErr.Code != 11 {
		t.Errorf("ADD with the daemon down = %v, want code 11", err)
	}
	w.startDaemon(t)
}

func TestMalformedConfigIsAnErrorObject(t *testing.T) {
	harness.RequireRoot(t)
	bin := harness.BuildBinary(t, "./cmd/nv-ipam")
	for name, conf := range map[string]string{
		"bad JSON":         `{"cniVersion": "1.0.0", "name": "n", "ipam": {`,
		"args without cni": `{"cniVersion": "1.0.0", "name": "n", "args": {}, "ipam": {"type": "nv-ipam", "poolType": "ippool", "daemonSocket": "unix:///nonexistent"}}`,
		"unknown poolType": `{"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "nv-ipam", "poolType": "bogus"}}`,
		"three pools":      `{"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "nv-ipam", "poolName": "a,b,c"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			out, err := harness.CNICall{Plugin: bin, Command: "ADD", ContainerID: "c", NetNS: "/proc/self/ns/net", IfName: "net1",
				Args: podArgs("p"), Config: []byte(conf), Env: []string{"CNI_PATH=/nonexistent"}}.Run()
			var cniErr *harness.CNIError
			if !errors.As(err, &cniErr) {
				t.Fatalf("ADD = %s, %v: want a CNI error object", out, err)
			}
			want := uint(7)
			switch name {
			case "args without cni":
				want = 11 // valid config; the daemon is unreachable
			case "bad JSON":
				want = 6 // skel's own decoding error, before the plugin runs
			}
			if cniErr.Code != want || strings.Contains(cniErr.Stderr, "panic") {
				t.Errorf("error %+v, want code %d and no panic", cniErr, want)
			}
		})
	}
}

func TestBridgeTwoPods(t *testing.T) {
	w := setup(t)
	node, pod1, pod2 := harness.NewNetNS(t), harness.NewNetNS(t), harness.NewNetNS(t)
	w.waitReady(t, "rail0")
	conf := w.conf("0.4.0", "bridge", `, "bridge": "hwbr0"`)
	var addrs []string
	for i, pod := range []*harness.NetNS{pod1, pod2} {
		out, err := harness.CNICall{Plugin: filepath.Join(w.binDir, "bridge"), Command: "ADD", ContainerID: fmt.Sprintf("br-%d", i),
			NetNS: pod.Path, IfName: "net1", Args: podArgs(fmt.Sprintf("brpod%d", i)), Path: []string{w.binDir}, Config: conf, RunIn: node}.Run()
		if err != nil {
			t.Fatalf("bridge ADD %d: %v", i, err)
		}
		a := addrOf(t, out)
		if got := pod.Addrs(t, "net1", netlink.FAMILY_V4); !slices.Equal(got, []string{a}) {
			t.Errorf("pod %d net1 has %v, want %s", i, got, a)
		}
		addrs = append(addrs, a)
	}
	if addrs[0] == addrs[1] {
		t.Fatalf("both pods got %s", addrs[0])
	}
	if _, err := pod1.Exec("ping", "-c", "1", "-W", "5", strings.Split(addrs[1], "/")[0]); err != nil {
		t.Errorf("pod1 cannot reach pod2 over the bridge: %v", err)
	}
}

func TestHostDeviceAndDualStack(t *testing.T) {
	w := setup(t)
	node, pod, peer := harness.NewNetNS(t), harness.NewNetNS(t), harness.NewNetNS(t)
	harness.NewVethPair(t, node, "hd0", peer, "hd0peer")
	w.waitReady(t, "rail0,rail0v6")
	conf := []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "rail0", "type": "host-device", "device": "hd0",
		"ipam": {"type": "nv-ipam", "confDir": %q, "poolName": "rail0,rail0v6"}}`, w.confDir))
	call := harness.CNICall{Plugin: filepath.Join(w.binDir, "host-device"), Command: "ADD", ContainerID: "hd-1",
		NetNS: pod.Path, IfName: "net1", Args: podArgs("hdpod"), Path: []string{w.binDir}, Config: conf, RunIn: node}
	out, err := call.Run()
	if err != nil {
		t.Fatalf("host-device ADD: %v", err)
	}
	var res current.Result
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 2 {
		t.Fatalf("dual-stack result %s: %v", out, err)
	}
	want := []string{res.IPs[0].Address.String(), res.IPs[1].Address.String()}
	if want[0] != "192.168.50.10/24" || want[1] != "fd00:50::10/64" {
		t.Errorf("dual-stack addresses = %v", want)
	}
	got := append(pod.Addrs(t, "net1", netlink.FAMILY_V4), pod.Addrs(t, "net1", netlink.FAMILY_V6)...)
	if !slices.Equal(got, want) {
		t.Errorf("addresses on the moved device = %v, want %v", got, want)
	}
	del := call
	del.Command = "DEL"
	if _, err := del.Run(); err != nil {
		t.Fatalf("host-device DEL: %v", err)
	}
	if _, err := node.Handle(t).LinkByName("hd0"); err != nil {
		t.Errorf("host-device did not return hd0 to the node after DEL: %v", err)
	}
}
