package ipamctl_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/test/harness"
)

// draNode is a check test's node whose ipam-node runs the DRA driver: the real
// node service over its store, with one claim prepared (its allocation in the
// store, the claim in the checkpoint beside it), the driver's status file and
// its two kubelet sockets, a veth standing in for the claimed port's netdev,
// and the real API server with the node's ResourceSlice.
type draNode struct {
	dir, sock, kubeconfig string
	m                     *nodealloc.Manager
	c                     client.Client
	netdev, mac           string
	uid                   types.UID
	claim                 nicdra.PreparedClaim
	status                nicdra.DriverStatus
	slice                 *resourceapi.ResourceSlice
}

const draDevice = "pci-0000-3b-00-0"

func newDRANode(t *testing.T) *draNode {
	t.Helper()
	harness.RequireRoot(t)
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	dir, binDir, confDir := nodeDirs(t)
	n := &draNode{dir: dir, c: cp.Client, uid: "7d3c0a51-5a1e-4c8e-9d0f-3b2a1c0e9f11"}
	start, end := netip.MustParseAddr("10.88.0.16"), netip.MustParseAddr("10.88.0.31")
	cfg := &nodealloc.PoolConfig{Name: "rail0", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.88.0.0/24"),
		Block: iprange.Range{Start: start, End: end}, ExclusionBase: start}
	n.sock, n.m = harness.ServeNodeIn(t, dir, &infov1.GetInfoResponse{Version: "test", NodeName: "n1",
		StoreFile: filepath.Join(dir, "store"), CniBinDir: binDir, CniConfDir: confDir, PluginSha256: installedPlugin(t, binDir),
		PoolsNamespace: "pools"}, cfg)
	if err := os.WriteFile(filepath.Join(confDir, "nv-ipam.conf"), []byte(fmt.Sprintf(`{"daemonSocket": %q}`, n.sock)), 0o644); err != nil {
		t.Fatal(err)
	}

	// The claimed port's netdev: a veth on the host.
	n.netdev = fmt.Sprintf("hwdra%d", os.Getpid()%100000)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.netdev}, PeerName: n.netdev + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", n.netdev).Run() })
	l, err := netlink.LinkByName(n.netdev)
	if err != nil {
		t.Fatal(err)
	}
	n.mac = l.Attrs().HardwareAddr.String()

	// The claim, prepared as the driver prepares it: its address in the store
	// under its UID, the claim in the checkpoint.
	res := n.allocate(t, n.uid, "trainer-0")
	n.claim = nicdra.PreparedClaim{Namespace: "ml", Name: "trainer-0-nic", PodName: "trainer-0", PodUID: "pod-uid-0",
		State: nicdra.PrepareCompleted, Devices: []nicdra.PreparedDevice{{Request: "nic", Device: draDevice,
			PCIAddress: "0000:3b:00.0", HostNetdev: n.netdev, MTU: 1500, InterfaceName: "net1", Pools: []string{"rail0"},
			PoolType: "ippool", Rail: "rail0", Addresses: []string{res}, MAC: n.mac}}}
	n.saveCheckpoint(t, map[types.UID]nicdra.PreparedClaim{n.uid: n.claim})

	// The driver: registered under this kubelet dir, its sockets there, one
	// device published.
	kubeletDir := filepath.Join(dir, "kubelet")
	for _, p := range []string{nicdra.RegistrationSocket(kubeletDir), nicdra.PluginSocket(kubeletDir)} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lis.Close() })
	}
	n.status = nicdra.DriverStatus{KubeletDir: kubeletDir, Registered: true, Devices: 1, Published: time.Now(), Updated: time.Now()}
	n.saveStatus(t, n.status)

	if n.kubeconfig, err = cp.WriteKubeconfig(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	n.slice = &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "n1-" + nicdra.DriverName},
		Spec: resourceapi.ResourceSliceSpec{Driver: nicdra.DriverName, NodeName: ptr.To("n1"),
			Pool:    resourceapi.ResourcePool{Name: "n1", Generation: 1, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: draDevice}}}}
	for _, obj := range []client.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, n.slice} {
		if err := n.c.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// allocate makes a claim's allocation as the driver does (its ownership mark,
// network nic.hwipam.io, the claim's UID, "<request>:<device>") and returns
// its address.
func (n *draNode) allocate(t *testing.T, uid types.UID, pod string) string {
	t.Helper()
	res, err := n.m.Allocate(t.Context(), &nodealloc.Request{Pools: []string{"rail0"}, ContainerID: string(uid),
		IfName: "nic:" + draDevice, Meta: nodealloc.Metadata{PodName: pod, PodNamespace: "ml", PodUID: "pod-uid-0",
			DeviceID: "0000:3b:00.0", Rail: "rail0", Network: nicdra.DriverName, Owner: nicdra.OwnerDRA}})
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Addr.String()
}

func (n *draNode) checkpointPath() string {
	return nicdra.CheckpointBeside(filepath.Join(n.dir, "store"))
}

func (n *draNode) saveCheckpoint(t *testing.T, claims map[types.UID]nicdra.PreparedClaim) {
	t.Helper()
	if err := (nicdra.CheckpointFile{Path: n.checkpointPath()}).Save(&nicdra.Checkpoint{Claims: claims}); err != nil {
		t.Fatal(err)
	}
}

func (n *draNode) saveStatus(t *testing.T, st nicdra.DriverStatus) {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nicdra.StatusFile(n.checkpointPath()), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// draFindings are a report's findings of the DRA checks, "severity check: message".
func draFindings(r ipamctl.CheckReport) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Check == "dra" || f.Check == "slices" || f.Check == "claim" {
			out = append(out, f.Severity+" "+f.Check+": "+f.Message)
		}
	}
	return out
}

// wantFinding fails unless the report has a finding of severity sev containing want.
func wantFinding(t *testing.T, step string, r ipamctl.CheckReport, sev, want string) {
	t.Helper()
	for _, f := range r.Findings {
		if f.Severity == sev && strings.Contains(f.Message, want) {
			if (sev == ipamctl.SeverityWarning || sev == ipamctl.SeverityError) && f.Fix == "" {
				t.Errorf("%s: the finding says nothing to do: %+v", step, f)
			}
			return
		}
	}
	t.Errorf("%s: no %s finding containing %q in %q", step, sev, want, draFindings(r))
}

// check on a node whose ipam-node runs the DRA driver: the kubelet's
// registration, the published slices (the status file's, and the API server's),
// and each prepared claim: prepared to the end, its address in the store under
// its UID, its netdev on the host, in a network namespace (a real one, found by
// MAC), or nowhere. Healthy, check finds nothing wrong; then each fault, one at
// a time, is the one problem it reports.
func TestCheckDRA(t *testing.T) {
	t.Setenv("KUBECONFIG", "") // the API checks only where --kubeconfig says
	n := newDRANode(t)
	args := []string{"--socket", n.sock, "--kubeconfig", n.kubeconfig, "--netns-dir", "/run/netns"}
	r, code := checkRun(t, args...)
	wantOnly(t, "healthy", r, code)
	for _, want := range []string{"registered with the kubelet (" + nicdra.RegistrationSocket(n.status.KubeletDir),
		"1 device(s) published at", "the API server has the 1 device(s) in 1 ResourceSlice(s) of node n1",
		"1 prepared claim(s), each address held in the store under its claim's UID",
		fmt.Sprintf("device %s's netdev %s (MAC %s) is on the host: pod ml/trainer-0's sandbox has not started", draDevice, n.netdev, n.mac)} {
		if !strings.Contains(fmt.Sprint(draFindings(r)), want) {
			t.Errorf("healthy report lacks %q: %q", want, draFindings(r))
		}
	}
	for _, f := range r.Findings {
		if f.Check == "stale" && f.Severity != ipamctl.SeverityOK {
			t.Errorf("the claim's allocation, whose pod does not exist, is reported stale: %+v", f)
		}
	}

	// The driver: not registered, its sockets gone, stopped, publishing nothing
	// or failing to.
	st := n.status
	st.Registered, st.RegistrationError = false, "the kubelet has not called the registration socket yet"
	n.saveStatus(t, st)
	r, code = checkRun(t, args...)
	wantOnly(t, "not registered", r, code, "the kubelet has not registered the DRA plugin: the kubelet has not called")
	wantFinding(t, "not registered", r, ipamctl.SeverityError, "the kubelet has not registered")
	n.saveStatus(t, n.status)

	reg := nicdra.RegistrationSocket(n.status.KubeletDir)
	if err := os.Rename(reg, reg+".away"); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "no registration socket", r, code, "the kubelet plugin's sockets are not where the kubelet looks: stat "+reg)
	if err := os.Rename(reg+".away", reg); err != nil {
		t.Fatal(err)
	}

	st = n.status
	st.Updated = time.Now().Add(-5 * time.Minute)
	n.saveStatus(t, st)
	r, code = checkRun(t, args...)
	wantOnly(t, "status not refreshed", r, code, "the DRA driver last wrote its status 5m0s ago")

	st = n.status
	st.PublishError = "creating ResourceSlice: resourceslices.resource.k8s.io is forbidden"
	n.saveStatus(t, st)
	r, code = checkRun(t, args...)
	wantOnly(t, "publish error", r, code, "publishing the ResourceSlices failed: creating ResourceSlice")

	// Failed prepares and attaches (issue 39, item 5): each a warning naming
	// the claim or pod, with the driver's message; none older than 15 minutes.
	st = n.status
	st.Failures = []nicdra.Failure{
		{At: time.Now().Add(-30 * time.Second), Op: nicdra.FailedPrepare, Claim: "ml/bad-pool",
			Message: `pool "no-such-pool" is unknown on this node`},
		{At: time.Now().Add(-2 * time.Minute), Op: nicdra.FailedAttach, Pod: "ml/trainer-1",
			Message: "nic.hwipam.io: pod ml/trainer-1: moving ibp79s0 into the pod: file exists"},
		{At: time.Now().Add(-20 * time.Minute), Op: nicdra.FailedPrepare, Claim: "ml/long-ago", Message: "old"},
	}
	n.saveStatus(t, st)
	r, code = checkRun(t, args...)
	wantFinding(t, "failed prepare", r, ipamctl.SeverityWarning, `preparing claim ml/bad-pool failed 30s ago: pool "no-such-pool" is unknown`)
	wantFinding(t, "failed attach", r, ipamctl.SeverityWarning, "moving pod ml/trainer-1's NIC ports into its network namespace failed 2m0s ago")
	if strings.Contains(fmt.Sprint(r.Findings), "long-ago") {
		t.Errorf("a failure of 20 minutes ago is reported: %+v", r.Findings)
	}
	if code == 0 {
		t.Errorf("check exits 0 with failed prepares")
	}
	n.saveStatus(t, n.status)

	// Ports the driver withholds, and the port the prepared claim holds: said,
	// not problems.
	st = n.status
	st.Withheld = []nicdra.WithheldDevice{
		{Device: "pci-0000-40-00-0", PCIAddress: "0000:40:00.0", Netdev: "ibp64s0", Reason: "in use by pod ml/nad-a (network demo-a)"},
		{Device: "pci-0000-e1-00-0", PCIAddress: "0000:e1:00.0", Netdev: "enp225s0f0np0",
			Reason: "uplink: enp225s0f0np0 carries the host's default route"},
	}
	n.saveStatus(t, st)
	r, code = checkRun(t, args...)
	wantOnly(t, "withheld ports", r, code)
	wantFinding(t, "withheld ports", r, ipamctl.SeverityInfo, "not published to claims: in use by pod ml/nad-a (network demo-a)")
	wantFinding(t, "withheld ports", r, ipamctl.SeverityInfo, "not published to claims: uplink: enp225s0f0np0 carries the host's default route")
	wantFinding(t, "claim's port", r, ipamctl.SeverityInfo, "claim ml/trainer-0-nic holds port "+draDevice+" (")
	n.saveStatus(t, n.status)

	st = n.status
	st.Devices = 0
	n.saveStatus(t, st)
	r, code = checkRun(t, args...)
	wantOnly(t, "no device", r, code, "the driver publishes no device", "the API server's ResourceSlices of node n1 have 1 device(s), the driver published 0")
	n.saveStatus(t, n.status)

	// A checkpoint the driver cannot read: it refuses and withdraws its devices.
	st = n.status
	st.Devices, st.CheckpointError = 0, "the DRA checkpoint cannot be read: the DRA checkpoint /x is damaged (unexpected end of JSON input)"
	n.saveStatus(t, st)
	r, code = checkRun(t, args...)
	wantOnly(t, "checkpoint damaged", r, code, "the DRA driver refuses every prepare and unprepare, publishes no device and "+
		"releases nothing, because it cannot read its checkpoint: the DRA checkpoint cannot be read: the DRA checkpoint /x is damaged",
		"the API server's ResourceSlices of node n1 have 1 device(s), the driver published 0")
	n.saveStatus(t, n.status)

	// The API server's slices: none.
	if err := n.c.Delete(t.Context(), n.slice); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "no slice", r, code, "the API server has no ResourceSlice of driver nic.hwipam.io for node n1")

	// The claims: one whose prepare did not finish; one whose address the store
	// does not hold; an allocation of a claim the checkpoint does not know.
	started := n.claim
	started.State = nicdra.PrepareStarted
	n.saveCheckpoint(t, map[types.UID]nicdra.PreparedClaim{n.uid: started})
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", "/run/netns")
	wantOnly(t, "prepare started", r, code, "claim ml/trainer-0-nic (UID "+string(n.uid)+", pod ml/trainer-0): its prepare did not finish")

	other := n.claim
	other.Devices = []nicdra.PreparedDevice{other.Devices[0]}
	other.Devices[0].Addresses = []string{"10.88.0.30/24"}
	n.saveCheckpoint(t, map[types.UID]nicdra.PreparedClaim{n.uid: other})
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", "/run/netns")
	wantOnly(t, "store and checkpoint disagree", r, code, "device "+draDevice+": its address 10.88.0.30/24 (pool rail0) is not in the store under the claim's UID")
	n.saveCheckpoint(t, map[types.UID]nicdra.PreparedClaim{n.uid: n.claim})

	leaked := n.allocate(t, "0f0e0d0c-0000-4000-8000-000000000001", "trainer-1")
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", "/run/netns")
	wantOnly(t, "allocation of an unknown claim", r, code, "1 address(es) held for claims the DRA checkpoint does not know: rail0 "+
		strings.Split(leaked, "/")[0]+" (claim UID 0f0e0d0c-0000-4000-8000-000000000001, nic:"+draDevice+")")
	if err := n.m.Deallocate(t.Context(), &nodealloc.Request{Pools: []string{"rail0"}, ContainerID: "0f0e0d0c-0000-4000-8000-000000000001",
		IfName: "nic:" + draDevice}); err != nil {
		t.Fatal(err)
	}

	// The netdev moved into the pod's network namespace, renamed as the claim
	// asks: found there by its MAC.
	pod := harness.NewNetNS(t)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	run("ip", "link", "set", n.netdev, "netns", pod.Name)
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", "/run/netns")
	wantOnly(t, "in the pod, not renamed", r, code, fmt.Sprintf("is in network namespace %s as %s, not as net1", pod.Path, n.netdev))
	run("ip", "-n", pod.Name, "link", "set", n.netdev, "name", "net1")
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", "/run/netns")
	wantOnly(t, "in the pod", r, code)
	wantFinding(t, "in the pod", r, ipamctl.SeverityOK, fmt.Sprintf("(MAC %s) is in network namespace %s as net1 (pod ml/trainer-0)", n.mac, pod.Path))

	// The claim unprepared while the namespace outlived its pod (issue 45,
	// item 7): the port's addresses held, and where the port is.
	held := n.claim
	held.Unpreparing, held.PortsHeld = true, true
	n.saveCheckpoint(t, map[types.UID]nicdra.PreparedClaim{n.uid: held})
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", "/run/netns")
	wantOnly(t, "port held", r, code, fmt.Sprintf("claim ml/trainer-0-nic (UID %s) was unprepared while its port %s (", n.uid, draDevice))
	wantFinding(t, "port held", r, ipamctl.SeverityWarning, fmt.Sprintf("stay held, since they may still be up on the port: the port is "+
		"in network namespace %s as net1", pod.Path))
	n.saveCheckpoint(t, map[types.UID]nicdra.PreparedClaim{n.uid: n.claim})

	// Where ipamctl sees no namespace, it cannot tell: said, not a problem.
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", filepath.Join(n.dir, "no-netns"))
	wantOnly(t, "no namespaces seen", r, code)
	wantFinding(t, "no namespaces seen", r, ipamctl.SeverityInfo, "is not on the host: presumably in pod ml/trainer-0 (ipamctl sees none of "+
		filepath.Join(n.dir, "no-netns"))

	// Directories that hold no namespace (a runtime that keeps its pods'
	// elsewhere): nothing searched, a warning that names the flag, not an
	// error that the pod lacks the interface.
	empty := filepath.Join(n.dir, "empty-netns")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", empty)
	wantFinding(t, "no namespace searched", r, ipamctl.SeverityWarning, "ipamctl searched no network namespace ("+empty+" hold none)")
	for _, f := range r.Findings {
		if f.Check == "claim" && f.Severity == ipamctl.SeverityError {
			t.Errorf("no namespace searched: an error %q", f.Message)
		}
	}

	// Gone: neither on the host nor in any namespace.
	run("ip", "-n", pod.Name, "link", "del", "net1")
	r, code = checkRun(t, "--socket", n.sock, "--netns-dir", "/run/netns")
	wantOnly(t, "netdev gone", r, code, fmt.Sprintf("device %s's netdev %s (MAC %s) is neither on the host nor in any of the", draDevice, n.netdev, n.mac))

	// A daemon that no longer runs the driver (no status file), with claims
	// the driver prepared: a warning naming them.
	if err := os.Remove(nicdra.StatusFile(n.checkpointPath())); err != nil {
		t.Fatal(err)
	}
	r, _ = checkRun(t, args...)
	wantFinding(t, "driver off, claims prepared", r, ipamctl.SeverityWarning,
		"1 claim(s) prepared by the DRA driver, which does not run (ipam-node without --dra): ml/trainer-0-nic")
	// Without claims either: no DRA finding at all.
	n.saveCheckpoint(t, map[types.UID]nicdra.PreparedClaim{})
	r, _ = checkRun(t, args...)
	if got := draFindings(r); len(got) > 0 {
		t.Errorf("without the driver's status file and claims: DRA findings %q", got)
	}
}

// allocations shows a DRA allocation's claim, by namespace/name from the
// checkpoint (by UID without it), where a CNI allocation shows its container,
// in the table and in -o json and yaml.
func TestAllocationsShowClaims(t *testing.T) {
	n := newDRANode(t)
	if _, err := n.m.Allocate(t.Context(), &nodealloc.Request{Pools: []string{"rail0"}, ContainerID: "0123456789abcdef", IfName: "net2",
		Meta: nodealloc.Metadata{PodName: "web-0", PodNamespace: "default", Network: "rail0-net"}}); err != nil {
		t.Fatal(err)
	}
	// A CNI allocation of a network that an older version let a NAD call
	// nic.hwipam.io, without the driver's mark: a container's, not a claim's
	// (issue 45: told apart by the mark, not by the network name).
	if _, err := n.m.Allocate(t.Context(), &nodealloc.Request{Pools: []string{"rail0"}, ContainerID: "fedcba9876543210", IfName: "net9",
		Meta: nodealloc.Metadata{PodName: "old-0", PodNamespace: "default", Network: nicdra.DriverName}}); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "allocations", "--socket", n.sock)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		rows[f[6]] = f
	}
	// RAIL POOL IP NETWORK POD CONTAINER/CLAIM IF DEVICE CREATED
	if h := strings.Fields(lines[0]); len(h) != 9 || h[5] != "CONTAINER/CLAIM" {
		t.Errorf("header %q", lines[0])
	}
	if f := rows["nic:"+draDevice]; len(f) != 9 || f[4] != "ml/trainer-0" || f[5] != "ml/trainer-0-nic" || f[3] != nicdra.DriverName {
		t.Errorf("the claim's row: %q\n%s", f, out)
	}
	if f := rows["net2"]; len(f) != 9 || f[5] != "0123456789ab" {
		t.Errorf("the CNI row: %q\n%s", f, out)
	}
	if f := rows["net9"]; len(f) != 9 || f[5] != "fedcba987654" || f[3] != nicdra.DriverName {
		t.Errorf("the unmarked row of network %s: %q, want its container\n%s", nicdra.DriverName, f, out)
	}

	js := sameJSONAndYAML(t, "allocations", "--socket", n.sock)
	var rep ipamctl.AllocationsReport
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatal(err)
	}
	for _, a := range rep.Allocations {
		switch a.IfName {
		case "nic:" + draDevice:
			if want := (ipamctl.AllocationClaim{UID: string(n.uid), Namespace: "ml", Name: "trainer-0-nic", State: nicdra.PrepareCompleted}); a.Claim == nil || *a.Claim != want {
				t.Errorf("the claim's allocation: claim %+v, want %+v", a.Claim, want)
			}
		default:
			if a.Claim != nil {
				t.Errorf("a CNI allocation has a claim: %+v", a)
			}
		}
	}
	if strings.Count(string(js), `"claim"`) != 1 {
		t.Errorf("-o json: want one claim, of the DRA allocation only:\n%s", js)
	}
	roundTrip[ipamctl.AllocationsReport](t, "allocations", js)

	// Without the checkpoint: the claim by its UID.
	if err := os.Remove(n.checkpointPath()); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "allocations", "--socket", n.sock)
	if err != nil || !strings.Contains(out, string(n.uid)) {
		t.Errorf("without the checkpoint (%v), the claim's UID is not shown:\n%s", err, out)
	}
}
