package ipamnode_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// railPool creates an IPPool labelled for rail, with this node's block start-end
// (no block when start is "").
func railPool(t *testing.T, c client.Client, name, rail, subnet, start, end string) {
	t.Helper()
	p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{}},
		Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: 16}}
	if rail != "" {
		p.Labels[ipamnode.LabelRail] = rail
	}
	if err := c.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	if start == "" {
		return
	}
	p.Status.Allocations = []v1alpha1.Allocation{{NodeName: node, StartIP: start, EndIP: end}}
	if err := c.Status().Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

// TestRailAuto: one network config with "rail": "auto" for every VF of a node with
// two ConnectX PFs (a captured-shape SR-IOV tree under --sysfs-root); the real
// plugin binary and the daemon give each attachment an address from the pools of
// its VF's rail — dual-stack on the rail that has two — and refuse what cannot
// work with what to do.
func TestRailAuto(t *testing.T) {
	harness.RequireRoot(t)
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	if err := c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	tree, err := fakesysfs.SRIOV(t.TempDir(), 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Rail ens1f0np0: IPv4 and IPv6; rail ens1f1np1: IPv4; rail "spare": a pool
	// with no block on this node; an unlabelled pool that rail "auto" never picks.
	railPool(t, c, "r0-v4", "ens1f0np0", "10.10.0.0/24", "10.10.0.16", "10.10.0.31")
	railPool(t, c, "r0-v6", "ens1f0np0", "fd00:10::/64", "fd00:10::10", "fd00:10::1f")
	railPool(t, c, "r1-v4", "ens1f1np1", "10.11.0.0/24", "10.11.0.16", "10.11.0.31")
	railPool(t, c, "spare", "spare", "10.12.0.0/24", "", "")
	railPool(t, c, "plain", "", "10.13.0.0/24", "10.13.0.16", "10.13.0.31")
	dir := t.TempDir()
	d := startDaemon(t, cp.Config, dir, func(o *ipamnode.Options) {
		o.SysfsRoot = tree.Root
		o.NICLabels = ipamnode.NICLabelsOff
	})
	plugin := harness.BuildBinary(t, "./cmd/nv-ipam")
	ns := harness.NewNetNS(t)
	call := func(cmd, cid string, top map[string]any, ipam map[string]any) (map[string]any, error) {
		t.Helper()
		conf := map[string]any{"cniVersion": "1.0.0", "name": "rails", "type": "sriov"}
		for k, v := range top {
			conf[k] = v
		}
		conf["ipam"] = map[string]any{"type": "nv-ipam", "daemonSocket": "unix://" + d.socket, "confDir": filepath.Join(dir, "none"), "logFile": ""}
		for k, v := range ipam {
			conf["ipam"].(map[string]any)[k] = v
		}
		raw, _ := json.Marshal(conf)
		out, err := harness.CNICall{Plugin: plugin, Command: cmd, ContainerID: cid, NetNS: ns.Path, IfName: "net1",
			Args: "K8S_POD_NAME=pod-" + cid + ";K8S_POD_NAMESPACE=default", Path: []string{filepath.Dir(plugin)}, Config: raw}.Run()
		if err != nil || cmd != "ADD" {
			return nil, err
		}
		var res map[string]any
		err = json.Unmarshal(out, &res)
		return res, err
	}
	ips := func(res map[string]any) []netip.Prefix {
		var out []netip.Prefix
		for _, ip := range res["ips"].([]any) {
			out = append(out, netip.MustParsePrefix(ip.(map[string]any)["address"].(string)))
		}
		return out
	}
	auto := map[string]any{"rail": "auto"}
	waitFor(t, "the rail pools to sync", func() bool {
		_, err := call("ADD", "probe", map[string]any{"deviceID": "0000:3d:00.0"}, auto)
		return err == nil
	})
	if _, err := call("DEL", "probe", map[string]any{"deviceID": "0000:3d:00.0"}, auto); err != nil {
		t.Fatal(err)
	}

	inRail0 := func(p []netip.Prefix) bool {
		return len(p) == 2 && netip.MustParsePrefix("10.10.0.0/24").Contains(p[0].Addr()) &&
			netip.MustParsePrefix("fd00:10::/64").Contains(p[1].Addr())
	}
	inRail1 := func(p []netip.Prefix) bool {
		return len(p) == 1 && netip.MustParsePrefix("10.11.0.0/24").Contains(p[0].Addr())
	}
	for v := range 4 {
		for pf, in := range map[int]func([]netip.Prefix) bool{0: inRail0, 1: inRail1} {
			vf := fmt.Sprintf("0000:%02x:00.%d", 0x3c+pf, v)
			res, err := call("ADD", fmt.Sprintf("c-%d-%d", pf, v), map[string]any{"deviceID": vf}, auto)
			if err != nil {
				t.Fatalf("ADD for VF %s: %v", vf, err)
			}
			if !in(ips(res)) {
				t.Errorf("VF %s of PF %d got %v, not its rail's pools", vf, pf, ips(res))
			}
		}
	}
	// host-device's pciBusID, a macvlan's master, and a rail named outright.
	for name, tc := range map[string]struct {
		top, ipam map[string]any
		in        func([]netip.Prefix) bool
	}{
		"pciBusID":    {map[string]any{"pciBusID": "0000:3d:00.3"}, auto, inRail1},
		"master":      {map[string]any{"master": "ens1f0np0"}, auto, inRail0},
		"named rail":  {nil, map[string]any{"rail": "ens1f1np1"}, inRail1},
		"device wins": {map[string]any{"deviceID": "0000:3c:00.1", "master": "ens1f1np1"}, auto, inRail0},
	} {
		res, err := call("ADD", "x-"+strings.ReplaceAll(name, " ", "-"), tc.top, tc.ipam)
		if err != nil || !tc.in(ips(res)) {
			t.Errorf("%s: %v %v", name, res, err)
		}
	}

	// A VF moved into a pod's network namespace still resolves by its deviceID.
	if err := tree.MoveNetdev("0000:3c:00.2", "ens1f0v2"); err != nil {
		t.Fatal(err)
	}
	res, err := call("ADD", "moved", map[string]any{"deviceID": "0000:3c:00.2"}, auto)
	if err != nil || !inRail0(ips(res)) {
		t.Errorf("VF in a pod's netns: %v %v", res, err)
	}

	// The summary (the pod event's first words) names the cause the details spell out.
	for name, tc := range map[string]struct {
		top, ipam map[string]any
		code      uint
		summary   string
		want      string
	}{
		"a device the node does not have": {map[string]any{"deviceID": "0000:99:00.1"}, auto, 7, "invalid request",
			"PCI function 0000:99:00.1: not found on this node; this node's rails: ens1f0np0, ens1f1np1"},
		"a rail no pool is labelled for": {nil, map[string]any{"rail": "ens1f7"}, 11, "no pool is labelled for the rail",
			`no IPPool in namespace default is labelled nic.hwipam.io/rail=ens1f7`},
		"a rail whose pool has no block here": {nil, map[string]any{"rail": "spare"}, 11, "pool has no block on this node", "spare"},
		"a CIDRPool rail": {map[string]any{"deviceID": "0000:3c:00.0"}, map[string]any{"rail": "auto", "poolType": "cidrpool"}, 11,
			"no pool is labelled for the rail", "no CIDRPool"},
	} {
		_, err := call("ADD", "bad", tc.top, tc.ipam)
		var cniErr *harness.CNIError
		if !errors.As(err, &cniErr) || cniErr.Code != tc.code || cniErr.Msg != tc.summary || !strings.Contains(cniErr.Details, tc.want) {
			t.Errorf("%s: %v, want CNI code %d, %q, saying %q", name, err, tc.code, tc.summary, tc.want)
		}
	}

	// Device fields that are no names (docs/rails.md): the plugin refuses them as
	// a configuration error; the daemon, asked directly, refuses them too, and
	// neither shows a path of the host (here: of the tree) or follows one. A
	// release with such a device releases the interface wherever it is held.
	secret := filepath.Join(tree.Root, "secret", "0000:3b:00.0", "x")
	if err := os.MkdirAll(secret, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"../../../../secret/0000:3b:00.0/x", "../../../../secret", "/etc/passwd", "..", "eth0\x00", strings.Repeat("x", 200)} {
		for _, field := range []string{"deviceID", "pciBusID", "master", "device"} {
			_, err := call("ADD", "hostile", map[string]any{field: v}, auto)
			var cniErr *harness.CNIError
			if !errors.As(err, &cniErr) || cniErr.Code != 7 || !strings.Contains(cniErr.Details, field+" ") ||
				!strings.Contains(cniErr.Details, "e.g.") || strings.Contains(cniErr.Details, tree.Root) {
				t.Errorf("plugin, %s %q: %v, want CNI code 7 naming the field and what a valid one looks like", field, v, err)
			}
			prm := params("hostile")
			prm.Rail = "auto"
			switch field {
			case "deviceID":
				prm.Metadata.DeviceId = v
			case "pciBusID":
				prm.PciBusId = v
			case "master":
				prm.Master = v
			case "device":
				prm.Device = v
			}
			_, err = d.ipam.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: prm})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), field+" ") ||
				!strings.Contains(err.Error(), "e.g.") || strings.Contains(err.Error(), tree.Root) {
				t.Errorf("daemon, %s %q: %v, want InvalidArgument naming the field and what a valid one looks like", field, v, err)
			}
		}
	}
	if _, err := call("ADD", "released", map[string]any{"deviceID": "0000:3d:00.2"}, auto); err != nil {
		t.Fatal(err)
	}
	prm := params("released")
	prm.Rail, prm.Master = "auto", "../../../../secret"
	if _, err := d.ipam.Deallocate(t.Context(), &nodev1.DeallocateRequest{Parameters: prm}); err != nil {
		t.Errorf("release with a master that is no name: %v", err)
	}
	for _, list := range listAllocations(t, d) {
		for _, a := range list {
			if a.GetContainerId() == "released" || a.GetContainerId() == "hostile" {
				t.Errorf("%s holds %s after the release with a device that is no name", a.GetContainerId(), a.GetIp())
			}
		}
	}

	// The plugin's log line of a rail ADD names the rail and the pools chosen.
	logFile := filepath.Join(dir, "plugin.log")
	if _, err := call("ADD", "logged", map[string]any{"deviceID": "0000:3c:00.3"}, map[string]any{"rail": "auto", "logFile": logFile}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(logFile); err != nil || !strings.Contains(string(b), "ADD logged/net1 rail auto pools [r0-v4 r0-v6]: 10.10.0.") {
		t.Errorf("the plugin's log of a rail ADD (%v): %q, want the rail and the pools chosen", err, b)
	}
	if _, err := call("DEL", "logged", map[string]any{"deviceID": "0000:3c:00.3"}, auto); err != nil {
		t.Fatal(err)
	}

	// CHECK, STATUS and GC of a network whose pools are picked by rail.
	res, err = call("ADD", "checked", map[string]any{"deviceID": "0000:3d:00.1"}, auto)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := call("CHECK", "checked", map[string]any{"deviceID": "0000:3d:00.1", "prevResult": res}, auto); err != nil {
		t.Errorf("CHECK by rail: %v", err)
	}
	bogus := map[string]any{"cniVersion": "1.0.0", "ips": []any{map[string]any{"address": "10.11.0.99/24"}}}
	if _, err := call("CHECK", "checked", map[string]any{"deviceID": "0000:3d:00.1", "prevResult": bogus}, auto); err == nil {
		t.Error("CHECK by rail of an address the daemon does not hold succeeded")
	}
	v11 := func(m map[string]any) map[string]any { m["cniVersion"] = "1.1.0"; return m }
	if _, err := call("STATUS", "", v11(map[string]any{}), auto); err != nil {
		t.Errorf("STATUS, rail auto: %v", err)
	}
	var cniErr *harness.CNIError
	if _, err := call("STATUS", "", v11(map[string]any{}), map[string]any{"rail": "spare"}); !errors.As(err, &cniErr) || cniErr.Code != 50 {
		t.Errorf("STATUS of a rail without a block here: %v, want CNI code 50", err)
	}
	// GC keeps the valid attachments and releases this network's others: "checked".
	var valid []any
	for _, r := range listAllocations(t, d) {
		for _, a := range r {
			if a.GetContainerId() != "checked" {
				valid = append(valid, map[string]any{"containerID": a.GetContainerId(), "ifname": a.GetIfName()})
			}
		}
	}
	if _, err := call("GC", "", v11(map[string]any{"cni.dev/valid-attachments": valid}), auto); err != nil {
		t.Errorf("GC by rail: %v", err)
	}
	for _, r := range listAllocations(t, d) {
		for _, a := range r {
			if a.GetContainerId() == "checked" {
				t.Errorf("GC by rail left %s of an attachment that is not valid", a.GetIp())
			}
		}
	}

	// DEL by rail releases; so does DEL of a VF that has gone from the node since.
	if _, err := call("DEL", "c-1-0", map[string]any{"deviceID": "0000:3d:00.0"}, auto); err != nil {
		t.Fatal(err)
	}
	if err := tree.Remove("0000:3c:00.3"); err != nil {
		t.Fatal(err)
	}
	if _, err := call("DEL", "c-0-3", map[string]any{"deviceID": "0000:3c:00.3"}, auto); err != nil {
		t.Fatalf("DEL of a VF gone from the node: %v", err)
	}
	held := map[string]int{}
	for pool, list := range listAllocations(t, d) {
		held[pool] = len(list)
		want := map[string]string{"r0-v4": "ens1f0np0", "r0-v6": "ens1f0np0", "r1-v4": "ens1f1np1"}[pool]
		for _, a := range list {
			if a.GetRail() != want {
				t.Errorf("allocation %s in pool %s: rail %q, want %q", a.GetIp(), pool, a.GetRail(), want)
			}
		}
	}
	pools, err := d.info.ListPools(t.Context(), &infov1.ListPoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools.GetPools() {
		want := map[string]string{"r0-v4": "ens1f0np0", "r0-v6": "ens1f0np0", "r1-v4": "ens1f1np1"}[p.GetKey()]
		if p.GetRail() != want {
			t.Errorf("pool %s: rail %q, want %q", p.GetKey(), p.GetRail(), want)
		}
	}
	// rail 0: VFs 0-2 (VF 3 released), master, "device wins", the moved VF; rail 1:
	// VFs 1-3 (VF 0 released), pciBusID, the named rail.
	if held["r0-v4"] != 6 || held["r0-v6"] != 6 || held["r1-v4"] != 5 || held["plain"] != 0 {
		t.Errorf("allocations per pool: %v, want r0-v4 6, r0-v6 6, r1-v4 5, plain 0", held)
	}

	// The rail is recorded with the allocation: it stays when the pool's label goes.
	var r1 v1alpha1.IPPool
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "r1-v4"}, &r1); err != nil {
		t.Fatal(err)
	}
	delete(r1.Labels, ipamnode.LabelRail)
	if err := c.Update(t.Context(), &r1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the label's removal to sync", func() bool {
		pools, err := d.info.ListPools(t.Context(), &infov1.ListPoolsRequest{})
		if err != nil {
			return false
		}
		for _, p := range pools.GetPools() {
			if p.GetKey() == "r1-v4" {
				return p.GetRail() == ""
			}
		}
		return false
	})
	for _, a := range listAllocations(t, d)["r1-v4"] {
		if a.GetRail() != "ens1f1np1" {
			t.Errorf("allocation %s of rail ens1f1np1 shows rail %q once its pool lost the label", a.GetIp(), a.GetRail())
		}
	}
}

// listAllocations lists what the daemon holds, by pool.
func listAllocations(t *testing.T, d *daemon) map[string][]*infov1.AllocationRecord {
	t.Helper()
	resp, err := d.info.ListAllocations(t.Context(), &infov1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*infov1.AllocationRecord{}
	for _, a := range resp.GetAllocations() {
		out[a.GetPool()] = append(out[a.GetPool()], a)
	}
	return out
}

// dgxRailPCI are the PCI addresses of fakesysfs.DGXH100Rails.
var dgxRailPCI = []string{"0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0", "0000:9a:00.0", "0000:c0:00.0",
	"0000:ce:00.0", "0000:dc:00.0"}

// TestRailWalkthrough applies docs/rails.md's DGX H100 walk-through: its eight pools
// and its NAD's config. On a DGX-H100-like node (the captured-shape tree, two VFs
// per rail) the real plugin, given that config and a VF of each rail as Multus
// passes it, gets each address from that rail's pool.
func TestRailWalkthrough(t *testing.T) {
	harness.RequireRoot(t)
	data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "docs", "rails.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The walk-through's section only: the IPoIB one after it has its own tests
	// (test/examples, test/e2e TestIPoIBExample).
	walk, _, _ := strings.Cut(string(data), "\n## IPoIB")
	_, walk, _ = strings.Cut(walk, "\n## Walk-through")
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(walk, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) != 3 {
		t.Fatalf("docs/rails.md's walk-through has %d yaml blocks, want the pools, the NAD and the pod", len(blocks))
	}
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for i, rail := range fakesysfs.DGXH100Rails {
		labels["nic.hwipam.io/"+rail] = "ib"
		pf := dgxRailPCI[i]
		for v := range 2 {
			vf := fmt.Sprintf("%s.%d", pf[:len(pf)-2], v+1)
			if err := tree.AddVF(pf, v, fakesysfs.Function{Address: vf, Vendor: fakesysfs.VendorNVIDIA, Device: fakesysfs.DeviceCXVF,
				Class: fakesysfs.ClassIB, Driver: "mlx5_core", NUMA: i / 4}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: labels}}); err != nil {
		t.Fatal(err)
	}
	// The pools, as written; their blocks, as the controller would give them.
	subnets := map[string]netip.Prefix{}
	for _, doc := range strings.Split(blocks[0], "\n---\n") {
		var p v1alpha1.IPPool
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			t.Fatalf("a pool of docs/rails.md: %v\n%s", err, doc)
		}
		p.Namespace = "default" // the daemon's namespace here
		if err := c.Create(t.Context(), &p); err != nil {
			t.Fatal(err)
		}
		prefix := netip.MustParsePrefix(p.Spec.Subnet)
		start := prefix.Addr().Next()
		end := start
		for range 63 {
			end = end.Next()
		}
		p.Status.Allocations = []v1alpha1.Allocation{{NodeName: node, StartIP: start.String(), EndIP: end.String()}}
		if err := c.Status().Update(t.Context(), &p); err != nil {
			t.Fatal(err)
		}
		subnets[p.Labels[ipamnode.LabelRail]] = prefix
	}
	if len(subnets) != 8 {
		t.Fatalf("docs/rails.md binds %d rails, want 8: %v", len(subnets), subnets)
	}
	var nad nadv1.NetworkAttachmentDefinition
	if err := yaml.UnmarshalStrict([]byte(blocks[1]), &nad); err != nil {
		t.Fatal(err)
	}
	if nad.Annotations["k8s.v1.cni.cncf.io/resourceName"] == "" {
		t.Errorf("the NAD has no resourceName: %+v", nad.ObjectMeta)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(blocks[2]), &pod); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(pod.Annotations[nadv1.NetworkAttachmentAnnot], nad.Name); got != 8 {
		t.Errorf("the pod lists the NAD %d times, want 8", got)
	}

	dir := t.TempDir()
	d := startDaemon(t, cp.Config, dir, func(o *ipamnode.Options) { o.SysfsRoot, o.NICLabels = tree.Root, ipamnode.NICLabelsOff })
	// With the labels off, ipamctl still gets the daemon's inventory: the rail NICs
	// and the BlueField's two Ethernet ports.
	var ports []string
	for i, rail := range fakesysfs.DGXH100Rails {
		ports = append(ports, fmt.Sprintf("%s %s/1 InfiniBand []", rail, dgxRailPCI[i]))
	}
	ports = append(ports, "enp225s0f0np0 0000:e1:00.0/1 Ethernet []", "enp225s0f1np1 0000:e1:00.1/1 Ethernet []")
	wantPorts(t, d, ports...)
	plugin := harness.BuildBinary(t, "./cmd/nv-ipam")
	ns := harness.NewNetNS(t)
	for i, rail := range fakesysfs.DGXH100Rails {
		pf := dgxRailPCI[i]
		for v := range 2 {
			// Multus adds the device it took from the resource as deviceID.
			var conf map[string]any
			if err := json.Unmarshal([]byte(nad.Spec.Config), &conf); err != nil {
				t.Fatal(err)
			}
			conf["deviceID"] = fmt.Sprintf("%s.%d", pf[:len(pf)-2], v+1)
			ipam := conf["ipam"].(map[string]any)
			ipam["daemonSocket"], ipam["confDir"], ipam["logFile"] = "unix://"+d.socket, filepath.Join(dir, "none"), ""
			raw, _ := json.Marshal(conf)
			call := harness.CNICall{Plugin: plugin, Command: "ADD", ContainerID: "trainer-0", NetNS: ns.Path,
				IfName: fmt.Sprintf("net%d", 1+2*i+v), Args: "K8S_POD_NAME=trainer-0;K8S_POD_NAMESPACE=default",
				Path: []string{filepath.Dir(plugin)}, Config: raw}
			var out []byte
			waitFor(t, "the rail pools to sync", func() bool { out, err = call.Run(); return err == nil })
			var res struct{ IPs []struct{ Address string } }
			if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 {
				t.Fatalf("ADD %s: %s %v", conf["deviceID"], out, err)
			}
			if ip := netip.MustParsePrefix(res.IPs[0].Address); !subnets[rail].Contains(ip.Addr()) {
				t.Errorf("VF %s of rail %s got %s, outside the rail's subnet %s", conf["deviceID"], rail, ip, subnets[rail])
			}
		}
	}
}
