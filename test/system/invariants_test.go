// Package system drives the whole of hwipam — the real API server, the real
// ipam-controller binary, several real ipam-node processes and the real nv-ipam CNI
// plugin binary — through seeded random operator actions, and checks the global
// invariants of DESIGN.md §5 after every step.
package system

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/test/harness"
)

const (
	namespace  = "default"
	groupLabel = "system.hwipam.io/group"
	nodeCount  = 4
	// hostileNode is a Node without a daemon whose held report the test writes
	// as a compromised daemon could (its own Node only): forged, malformed,
	// oversized and foreign reports. It sorts after the honest nodes.
	hostileNode = "sys-zz-hostile"
	// grace is the controller's release grace period: longer than a Node object is
	// ever away in this test (deleted and re-registered at once), so that a block is
	// never released under a node that is merely re-registering.
	grace = "3s"
	// grantAge is the controller's --min-grant-age: a block taken from a node
	// counts for its daemon's report at least this long (a minute outside
	// tests), short enough for a long outage to cross.
	grantAge = "10s"
	// longOutage is how long the rare long outage keeps the API server away,
	// at least: past client-go's retries of one request (about 10 s), a
	// restarted daemon's start-up pool listing (3 s) and its claim
	// collection's first retries (5 s, then 10 s), the grace period and
	// grantAge (see docs/development.md).
	longOutage = 16 * time.Second
)

// poolDef is a pool the test may create: fixed name, kind and network, so that
// pools never overlap one another, and a re-created pool reuses its network. A
// pool with a rail is labelled nic.hwipam.io/rail=<rail>: DRA claims for that
// rail's NIC get their address from it, and CNI networks name it outright.
type poolDef struct {
	name, kind, network, rail string
}

var poolDefs = []poolDef{
	{"p0", v1alpha1.KindIPPool, "10.100.0.0/24", ""},
	{"p1", v1alpha1.KindIPPool, "10.101.0.0/25", ""},
	{"c0", v1alpha1.KindCIDRPool, "10.120.0.0/24", ""},
	{"r0", v1alpha1.KindIPPool, "10.130.0.0/25", fakesysfs.DGXH100Rails[0]},
	{"r1", v1alpha1.KindIPPool, "10.131.0.0/25", fakesysfs.DGXH100Rails[1]},
}

// network is a CNI network; several share a pool.
type network struct {
	name string
	pool poolDef
}

var networks = []network{
	{"net-a", poolDefs[0]}, {"net-b", poolDefs[0]}, {"net-c", poolDefs[1]}, {"net-d", poolDefs[2]}, {"net-e", poolDefs[2]},
	{"net-r0", poolDefs[3]}, {"net-r1", poolDefs[4]},
}

// attachment is one interface's address as the model knows it.
type attachment struct {
	node        int
	net         network
	containerID string
	ip          netip.Addr
	// master is the port its configuration names (a macvlan NAD's master),
	// "" for none.
	master string
}

func (a attachment) String() string {
	return fmt.Sprintf("%s/%s on n%d (%s) %s", a.net.name, a.containerID, a.node, a.net.pool.name, a.ip)
}

type simNode struct {
	name   string
	dir    string
	group  string
	cmd    *exec.Cmd
	exited chan struct{}
	conn   *grpc.ClientConn
	info   infov1.NodeInfoServiceClient
	socket string
	fast   bool // the daemon serves the compact endpoint
	// sysfs is the node's NIC tree (a DGX-H100's, which the DRA driver
	// publishes), kubeletDir the kubelet's root the DRA plugin registers in,
	// dra the kubelet's connection to the registered plugin (nil until it
	// registered since the daemon last started).
	sysfs      string
	kubeletDir string
	draConn    *grpc.ClientConn
	dra        drapb.DRAPluginClient
	// hostNS is the node's host network namespace (its ports, veths named
	// as the tree's netdevs), wireNS holds their peers, nri is its
	// container runtime's NRI side (attach_test.go).
	hostNS, wireNS string
	ports          []*hostPort
	nri            *nriNode
	// tree is its NIC tree, bonded says bond0 is made in it over the
	// BlueField-3's two ports (edges_test.go), started is when its daemon
	// last started.
	tree    *fakesysfs.Tree
	bonded  bool
	started time.Time
}

type world struct {
	t     *testing.T
	ctx   context.Context
	seed  uint64
	rng   *rand.Rand
	cp    *harness.ControlPlane
	c     client.Client
	proxy *harness.APIProxy
	// faults: the API writes of the controller and the daemons that fail, by
	// seed (see apiFaults); every process reaches the API server through them.
	faults     *harness.Faults
	kubeconfig string
	nodeBin    string
	pluginBin  string
	ctrlBin    string
	ctrl       *exec.Cmd
	ctrlExited chan struct{}
	nodes      []*simNode
	step       int
	trace      []string

	// live: ADDs that succeeded and were neither DEL'd nor GC'd by their network.
	live map[string]attachment
	// pods: the UID of each attachment's pod, by container ID (see podUID).
	pods map[string]string
	// uncertain: ADDs that failed or DELs that failed; they may or may not hold an
	// address, and are cleaned up by DEL later as a runtime would.
	uncertain map[string]attachment
	nextID    int
	counts    map[string]int
	// hostileHad: per pool name, every block the hostile node was seen with. The
	// controller gave them to it, so its report may keep them (see checkHonestBlocks).
	hostileHad map[string][]iprange.Range
	logs       []namedLog

	// dra: ipam-node runs its DRA kubelet plugin and the DRA actions run
	// (HWIPAM_SYSTEM_DRA=off: neither).
	dra bool
	// claims: the ResourceClaims that exist, by UID; collect: claims deleted
	// while their node's daemon was down, whose allocation the driver's
	// garbage collection must release once it is back (see dra_test.go).
	claims    map[types.UID]*draClaim
	collect   map[types.UID]*draGone
	nextClaim int
	// outages counts the API server's outages; draOutageTried is the last one
	// in which a prepare was tried.
	outages, draOutageTried int
	// draRestartedAPIDown says that draRestartAPIDown has run;
	// longOutageDone that apiLongOutage has.
	draRestartedAPIDown, longOutageDone bool
	// nextPod numbers pod namespaces; draSlowDone says that draSlowPrepare
	// has run (once a seed: it takes seconds).
	nextPod     int
	draSlowDone bool
	// sharedBeforePolicyDone says that draSharedClaim has shared a claim
	// past the policy once (it restarts a daemon: once a seed at most).
	sharedBeforePolicyDone bool
	// violations counts issue 36's broken invariants by kind, with
	// HWIPAM_SYSTEM_REPORT=1 (see violation).
	violations map[string]int
	// maxListed is the controller's --status-allocations-max-nodes for the
	// seed: pools above it list no blocks in their status, and cross it both
	// ways as nodes are relabelled and re-registered (issue 37).
	maxListed int
	// blocksIn is each pool's status.blocksIn as last seen (changes are
	// counted as "blocksIn-change").
	blocksIn map[string]string
	// apiUpAt is when the API server last became reachable (zero: from the
	// start).
	apiUpAt time.Time
	// statusWants are what the driver's status files must show soon
	// (edges_test.go).
	statusWants []statusWant
}

// namedLog is the output of one process the test started.
type namedLog struct {
	what string
	w    *harness.LogBuffer
}

// TestWholeSystemInvariants is the model-based whole-system test. Each seed runs
// HWIPAM_SYSTEM_STEPS steps (default 80); HWIPAM_SYSTEM_SEEDS seeds run (default
// 3), or exactly HWIPAM_SYSTEM_SEED to replay a failure.
func TestWholeSystemInvariants(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed to build the binaries: %v", err)
	}
	steps := envInt(t, "HWIPAM_SYSTEM_STEPS", 80)
	var seeds []uint64
	if s := os.Getenv("HWIPAM_SYSTEM_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("HWIPAM_SYSTEM_SEED=%q: %v", s, err)
		}
		seeds = []uint64{seed}
	} else {
		for range envInt(t, "HWIPAM_SYSTEM_SEEDS", 3) {
			seeds = append(seeds, rand.Uint64()%1_000_000)
		}
	}
	bins := map[string]string{}
	for _, b := range []string{"ipam-controller", "ipam-node", "nv-ipam"} {
		bins[b] = harness.BuildBinary(t, "./cmd/"+b)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("replay with: %sHWIPAM_SYSTEM_SEED=%d HWIPAM_SYSTEM_STEPS=%d go test ./test/system/ -run TestWholeSystemInvariants -v",
				faultsEnv(), seed, steps)
			w := newWorld(t, seed, bins)
			w.run(steps)
		})
	}
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

func newWorld(t *testing.T, seed uint64, bins map[string]string) *world {
	w := newBareWorld(t, seed, bins, os.Getenv("HWIPAM_SYSTEM_DRA") != "off")
	for i := range nodeCount {
		w.addNode(i)
	}
	if err := w.c.Create(w.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: hostileNode,
		Labels: map[string]string{groupLabel: []string{"a", "b"}[w.rng.IntN(2)]}}}); err != nil {
		t.Fatalf("creating node %s: %v", hostileNode, err)
	}
	for _, p := range poolDefs {
		w.createPool(p)
	}
	if w.dra {
		w.draClusterSetup()
	}
	return w
}

// newBareWorld starts the API server, the proxy in front of it and
// ipam-controller: no nodes, no pools.
func newBareWorld(t *testing.T, seed uint64, bins map[string]string, dra bool) *world {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	w := &world{t: t, ctx: t.Context(), seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5157)), cp: cp, c: cp.Client,
		nodeBin: bins["ipam-node"], pluginBin: bins["nv-ipam"], live: map[string]attachment{}, uncertain: map[string]attachment{}, pods: map[string]string{},
		counts: map[string]int{}, hostileHad: map[string][]iprange.Range{},
		dra: dra, claims: map[types.UID]*draClaim{}, collect: map[types.UID]*draGone{}}
	// The processes' path to the API server: a TCP proxy that can cut it
	// (outages), then an HTTPS proxy that makes chosen writes fail.
	w.faults = harness.NewFaults()
	fp := harness.NewFaultProxy(t, cp.Config, w.faults)
	w.proxy = harness.NewAPIProxy(t, &rest.Config{Host: "https://" + fp.Addr()})
	kc, err := fp.WriteKubeconfig(t.TempDir(), w.proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	w.kubeconfig = kc
	w.ctrlBin = bins["ipam-controller"]
	w.maxListed = []int{0, 2, 3, 4}[w.rng.IntN(4)]
	t.Logf("ipam-controller --status-allocations-max-nodes %d", w.maxListed)
	w.startController()
	return w
}

// addNode adds node i (named sys-n<i>, in group a or b by parity; i is the
// number of nodes so far): its Node object and its running daemon.
func (w *world) addNode(i int) {
	w.t.Helper()
	if i != len(w.nodes) {
		w.t.Fatalf("adding node %d after %d nodes", i, len(w.nodes))
	}
	n := &simNode{name: fmt.Sprintf("sys-n%d", i), dir: w.t.TempDir(), group: []string{"a", "b"}[i%2]}
	n.socket = filepath.Join(n.dir, "daemon.sock")
	if w.dra {
		w.nodeFilesystem(n)
		w.draNodeSetup(n)
	}
	w.nodes = append(w.nodes, n)
	w.createNode(i)
	w.startDaemon(i)
}

func (w *world) startProcess(cmd *exec.Cmd, what string) chan struct{} {
	w.t.Helper()
	logw := &harness.LogBuffer{}
	w.logs = append(w.logs, namedLog{what, logw})
	cmd.Stdout, cmd.Stderr = logw, logw
	if os.Getenv("HWIPAM_TEST_LOG") != "" {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		w.t.Fatalf("starting %s: %v", what, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	w.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return exited
}

// startController starts ipam-controller. It keeps what daemons report in memory
// only, so a restart loses what a silent daemon (down, its Node re-registered
// without annotations) holds.
func (w *world) startController() {
	w.t.Helper()
	w.ctrl = exec.Command(w.ctrlBin, "--kubeconfig", w.kubeconfig, "--ippools-namespace", namespace,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--release-grace-period", grace,
		"--min-grant-age", grantAge)
	if w.maxListed >= 0 { // -1: a controller before the flag
		w.ctrl.Args = append(w.ctrl.Args, "--status-allocations-max-nodes", strconv.Itoa(w.maxListed))
	}
	w.ctrlExited = w.startProcess(w.ctrl, "ipam-controller")
}

func (w *world) controllerRestart() {
	_ = w.ctrl.Process.Signal(syscall.SIGKILL)
	<-w.ctrlExited
	w.startController()
	w.tracef("kill -9 ipam-controller and start it again")
}

func (w *world) startDaemon(i int) {
	w.t.Helper()
	n := w.nodes[i]
	// A third of the starts are of a daemon without the plugin's compact endpoint,
	// as in a rolling upgrade between versions with and without it: the plugin
	// then falls back to gRPC, past the stale socket a killed daemon may leave.
	fast := w.rng.IntN(3) != 0
	w.tracef("ipam-node on %s starts with --fast-endpoint=%t", n.name, fast)
	n.fast = fast
	cmd := exec.Command(w.nodeBin, "--node-name", n.name, "--kubeconfig", w.kubeconfig, "--ippools-namespace", namespace,
		"--store-file", filepath.Join(n.dir, "store"), "--bind-address", "unix://"+n.socket,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "1s",
		"--pools-in-use-interval", "200ms", "--nic-labels", "off", fmt.Sprintf("--fast-endpoint=%t", fast),
		"--cni-skip-nv-ipam-binary-copy", "--cni-skip-nv-ipam-config-creation")
	if w.dra {
		cmd.Args = append(cmd.Args, w.draFlags(n)...)
	}
	n.cmd, n.started = cmd, time.Now()
	n.exited = w.startProcess(cmd, "ipam-node "+n.name)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(n.socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			w.fail("ipam-node %s did not create its socket within 30s", n.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+n.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.t.Fatal(err)
	}
	n.conn, n.info = conn, infov1.NewNodeInfoServiceClient(conn)
	if w.dra {
		w.draDaemonStarted(i)
	}
}

func (w *world) killDaemon(i int) {
	n := w.nodes[i]
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
	_ = n.conn.Close()
	n.cmd, n.conn, n.info = nil, nil, nil
	w.draUnregister(n)
	_ = os.Remove(n.socket) // a killed daemon leaves its socket; the restart replaces it anyway
}

func (w *world) createNode(i int) {
	n := w.nodes[i]
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{groupLabel: n.group}}}

	if err := w.c.Create(w.ctx, obj); err != nil {
		w.fail("creating node %s: %v", n.name, err)
	}
}

// selector returns a pool's nodeSelector: all nodes, or one group. A rail's
// pool selects all nodes more often (GPU nodes all have their rails), so that
// DRA claims find their rail's pool more often than not.
func (w *world) selector(p poolDef) *corev1.NodeSelector {
	if p.rail != "" && w.rng.IntN(2) == 0 {
		return nil
	}
	switch w.rng.IntN(3) {
	case 0:
		return nil
	default:
		g := []string{"a", "b"}[w.rng.IntN(2)]
		return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: groupLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{g}}}}}}
	}
}

func (w *world) createPool(p poolDef) {
	var obj client.Object
	switch p.kind {
	case v1alpha1.KindIPPool:
		obj = &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: namespace},
			Spec: v1alpha1.IPPoolSpec{Subnet: p.network, PerNodeBlockSize: w.blockSize(), NodeSelector: w.selector(p),
				Exclusions: w.exclusions(p)}}
	default:
		obj = &v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: namespace},
			Spec: v1alpha1.CIDRPoolSpec{CIDR: p.network, PerNodeNetworkPrefix: w.nodePrefix(), NodeSelector: w.selector(p),
				Exclusions: w.exclusions(p)}}
	}
	if p.rail != "" {
		obj.SetLabels(map[string]string{v1alpha1.LabelRail: p.rail})
	}
	if err := w.c.Create(w.ctx, obj); err != nil {
		w.fail("creating %s %s: %v", p.kind, p.name, err)
	}
	w.tracef("create %s %s", p.kind, describe(obj))
}

func (w *world) blockSize() int    { return []int{4, 6, 8, 10, 16}[w.rng.IntN(5)] }
func (w *world) nodePrefix() int32 { return []int32{26, 27, 28}[w.rng.IntN(3)] }

// exclusions returns nothing, or one short range inside the pool's network.
func (w *world) exclusions(p poolDef) []v1alpha1.ExcludeRange {
	if w.rng.IntN(2) == 0 {
		return nil
	}
	base := netip.MustParsePrefix(p.network).Addr()
	start, _ := iprange.Add(base, iprange.U64(uint64(1+w.rng.IntN(40))))
	end, _ := iprange.Add(start, iprange.U64(uint64(w.rng.IntN(4))))
	return []v1alpha1.ExcludeRange{{StartIP: start.String(), EndIP: end.String()}}
}

func describe(obj client.Object) string {
	switch p := obj.(type) {
	case *v1alpha1.IPPool:
		return fmt.Sprintf("%s size=%d excl=%v sel=%s", p.Name, p.Spec.PerNodeBlockSize, p.Spec.Exclusions, selString(p.Spec.NodeSelector))
	case *v1alpha1.CIDRPool:
		return fmt.Sprintf("%s prefix=/%d excl=%v sel=%s", p.Name, p.Spec.PerNodeNetworkPrefix, p.Spec.Exclusions, selString(p.Spec.NodeSelector))
	}
	return obj.GetName()
}

func selString(s *corev1.NodeSelector) string {
	if s == nil {
		return "all"
	}
	return "group=" + s.NodeSelectorTerms[0].MatchExpressions[0].Values[0]
}

func (w *world) getPool(p poolDef) (client.Object, error) {
	var obj client.Object = &v1alpha1.IPPool{}
	if p.kind == v1alpha1.KindCIDRPool {
		obj = &v1alpha1.CIDRPool{}
	}
	err := w.c.Get(w.ctx, client.ObjectKey{Namespace: namespace, Name: p.name}, obj)
	return obj, err
}

func (w *world) tracef(format string, args ...any) {
	line := fmt.Sprintf("step %d: ", w.step) + fmt.Sprintf(format, args...)
	w.trace = append(w.trace, line)
	if testing.Verbose() {
		w.t.Log(line)
	}
}

// fail ends the seed with the trace of what led here and how to replay it.
func (w *world) fail(format string, args ...any) {
	w.t.Helper()
	tail := w.trace[max(0, len(w.trace)-40):]
	for _, l := range w.logs {
		lines := strings.Split(strings.TrimSpace(l.w.String()), "\n")
		w.t.Logf("last lines of %s:\n  %s", l.what, strings.Join(lines[max(0, len(lines)-15):], "\n  "))
	}
	// What the controller plans from: each Node's held report and each pool's blocks.
	var nodes corev1.NodeList
	if err := w.c.List(w.ctx, &nodes); err == nil {
		for _, n := range nodes.Items {
			w.t.Logf("node %s (created %s): %s=%s", n.Name, n.CreationTimestamp.Format(time.TimeOnly),
				v1alpha1.HeldAnnotation, n.Annotations[v1alpha1.HeldAnnotation])
		}
	}
	for p, obj := range w.existingPools() {
		var conds []string
		var common v1alpha1.PoolStatusCommon
		switch o := obj.(type) {
		case *v1alpha1.IPPool:
			common = o.Status.PoolStatusCommon
		case *v1alpha1.CIDRPool:
			common = o.Status.PoolStatusCommon
		}
		for _, c := range common.Conditions {
			if c.Status == metav1.ConditionTrue {
				conds = append(conds, c.Type+": "+c.Message)
			}
		}
		w.t.Logf("pool %s (uid %s) conditions: %s", p.name, obj.GetUID(), strings.Join(conds, "; "))
	}
	for pool, bs := range w.blocks() {
		var list []string
		for _, b := range bs {
			list = append(list, fmt.Sprintf("%s %s", b.node, b.r))
		}
		w.t.Logf("pool %s blocks: %s", pool, strings.Join(list, ", "))
	}
	w.t.Fatalf("seed %d, step %d: %s\nlast actions:\n  %s\nreplay: %sHWIPAM_SYSTEM_SEED=%d go test ./test/system/ -run TestWholeSystemInvariants -v",
		w.seed, w.step, fmt.Sprintf(format, args...), strings.Join(tail, "\n  "), faultsEnv(), w.seed)
}

// run performs steps random actions, checking the invariants after each, then
// brings everything up, releases every address and checks once more.
func (w *world) run(steps int) {
	type action struct {
		name   string
		weight func() int
		do     func()
	}
	anyDown := func() bool { return slices.ContainsFunc(w.nodes, func(n *simNode) bool { return n.cmd == nil }) }
	actions := []action{
		{"add", func() int { return 30 }, w.add},
		{"add-again", func() int { return 4 }, w.addAgain},
		{"del", func() int { return 14 }, w.del},
		{"gc", func() int { return 5 }, w.gc},
		{"retry-uncertain", func() int { return 4 }, w.retryUncertain},
		{"pool-create", func() int { return 3 }, w.poolCreate},
		{"pool-edit", func() int { return 7 }, w.poolEdit},
		{"pool-delete", func() int { return 2 }, w.poolDelete},
		{"node-relabel", func() int { return 5 }, w.nodeRelabel},
		{"node-recreate", func() int { return 3 }, w.nodeRecreate},
		{"daemon-kill", func() int { return 3 }, w.daemonKill},
		{"hostile-report", func() int { return 4 }, w.hostileReport},
		// A NodeIPAM edited or deleted by hand: the controller writes it
		// back, and no daemon allocates from what it did not give.
		{"nodeipam-tamper", func() int { return 3 }, w.nodeIPAMTamper},
		// At any moment, also while a re-registered Node's daemon is down: the
		// controller keeps the reports the Nodes no longer show in a Lease (seed
		// 411767 failed before it did).
		{"controller-restart", func() int { return 2 }, w.controllerRestart},
		{"daemon-restart", func() int {
			if anyDown() {
				return 12
			}
			return 0
		}, w.daemonRestart},
		{"api-stop", func() int {
			if w.proxy.Up() {
				return 2
			}
			return 0
		}, w.apiStop},
		// Once a seed at most, and in about half the seeds of 80 steps: it
		// costs longOutage.
		{"api-long-outage", func() int {
			if w.proxy.Up() && !w.longOutageDone {
				return 1
			}
			return 0
		}, w.apiLongOutage},
		{"api-start", func() int {
			if !w.proxy.Up() {
				return 15
			}
			return 0
		}, w.apiStart},
		// Writes of one resource fail for a while, as an overloaded or
		// flaky API server's do (see apiFaults): with HWIPAM_SYSTEM_FAULTS=1
		// only, until the failures it still finds are fixed (faults_test.go).
		{"api-faults", func() int { return faultWeight(6) }, w.apiFaults},
		{"api-faults-clear", func() int { return faultWeight(2) }, w.apiFaultsClear},
	}
	if w.dra {
		for _, a := range w.draActions() {
			actions = append(actions, action(a))
		}
	}
	for w.step = 1; w.step <= steps; w.step++ {
		total := 0
		for _, a := range actions {
			total += a.weight()
		}
		pick := w.rng.IntN(total)
		for _, a := range actions {
			if pick < a.weight() {
				w.counts[a.name]++
				a.do()
				break
			}
			pick -= a.weight()
		}
		// Let the controller and the daemons react a little before looking.
		time.Sleep(time.Duration(50+w.rng.IntN(250)) * time.Millisecond)
		w.check()
	}
	w.step = steps + 1
	w.tracef("final: everything up, every address released")
	w.faults.Clear()
	if !w.proxy.Up() {
		w.apiStart()
	}
	for i, n := range w.nodes {
		if n.cmd == nil {
			w.startDaemon(i)
		}
	}
	select {
	case <-w.ctrlExited:
		// Started while the API server was unreachable, it gave up (as it
		// should: its Deployment restarts it); the checks below need it.
		w.startController()
		w.tracef("start ipam-controller again (it had exited)")
	default:
	}
	w.check()
	if w.dra {
		w.draFinal()
	}
	for k, a := range w.live {
		w.mustDel(a)
		delete(w.live, k)
	}
	for k, a := range w.uncertain {
		w.mustDel(a)
		delete(w.uncertain, k)
	}
	for i := range w.nodes {
		if got := w.allocations(i); len(got) != 0 {
			w.fail("node %s still holds %v after every attachment was deleted", w.nodes[i].name, got)
		}
	}
	// With nothing held by the honest nodes, whatever the hostile node reports,
	// every honest node a pool selects gets a block where the pool has room, also
	// in pools created anew under the hostile report.
	for _, kind := range []int{hostileForeign, hostileClaimAll} {
		w.writeHostileReport(kind)
		w.recreatePools()
		w.checkHonestBlocks()
	}
	w.t.Logf("seed %d: %d steps, actions %v", w.seed, steps, w.counts)
	if len(w.violations) > 0 {
		w.t.Errorf("seed %d: broken invariants (HWIPAM_SYSTEM_REPORT=1 went on past them), by kind: %v", w.seed, w.violations)
	}
}

// ---- CNI actions through the plugin binary ----

func (w *world) call(cmd string, a attachment, extra map[string]any) ([]byte, error) {
	n := w.nodes[a.node]
	ipam := map[string]any{"type": "nv-ipam", "poolName": a.net.pool.name, "daemonSocket": "unix://" + n.socket,
		"daemonCallTimeoutSeconds": 3, "confDir": filepath.Join(n.dir, "no-conf")}
	if a.net.pool.kind == v1alpha1.KindCIDRPool {
		ipam["poolType"] = "cidrpool"
	}
	conf := map[string]any{"cniVersion": "1.1.0", "name": a.net.name, "type": "system-test", "ipam": ipam}
	if a.master != "" {
		conf["master"] = a.master
	}
	for k, v := range extra {
		conf[k] = v
	}
	raw, err := json.Marshal(conf)
	if err != nil {
		w.t.Fatal(err)
	}
	return harness.CNICall{Plugin: w.pluginBin, Command: cmd, ContainerID: a.containerID, NetNS: "/var/run/netns/system-test",
		IfName: "net1", Args: fmt.Sprintf("K8S_POD_NAME=pod-%s;K8S_POD_NAMESPACE=default;K8S_POD_UID=%s", a.containerID, w.podUID(cmd, a)),
		Path: []string{filepath.Dir(w.pluginBin)}, Config: raw}.Run()
}

// podUID returns the UID of the attachment's pod, pod-<containerID> on its
// node, created for its first ADD: every attachment's pod exists until the
// end, so the daemons' stale-allocation cleaners (every second here) must
// release nothing, also while the API server is away or just back.
func (w *world) podUID(cmd string, a attachment) string {
	if uid, ok := w.pods[a.containerID]; ok {
		return uid
	}
	if cmd != "ADD" {
		return "uid-" + a.containerID
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-" + a.containerID, Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: w.nodes[a.node].name, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	if err := w.c.Create(w.ctx, pod); err != nil {
		w.fail("creating the pod of %s: %v", a, err)
	}
	w.pods[a.containerID] = string(pod.UID)
	return string(pod.UID)
}

func key(a attachment) string { return fmt.Sprintf("%d/%s/%s", a.node, a.net.name, a.containerID) }

func (w *world) add() {
	w.nextID++
	a := attachment{node: w.rng.IntN(nodeCount), net: networks[w.rng.IntN(len(networks))], containerID: fmt.Sprintf("c%d", w.nextID)}
	out, err := w.call("ADD", a, nil)
	if err != nil {
		w.tracef("ADD %s failed: %v", a, firstLine(err))
		w.uncertain[key(a)] = a
		return
	}
	a.ip = resultIP(w, out)
	w.tracef("ADD %s", a)
	w.live[key(a)] = a
	if w.nodes[a.node].fast {
		w.counts["add-ok-compact-endpoint"]++
	} else {
		w.counts["add-ok-grpc"]++
	}
}

func (w *world) addAgain() {
	a, ok := w.pickLive()
	if !ok {
		return
	}
	out, err := w.call("ADD", a, nil)
	if err != nil {
		w.tracef("ADD again %s failed: %v", a, firstLine(err))
		return
	}
	if got := resultIP(w, out); got != a.ip {
		w.fail("ADD repeated for %s returned %s, want the same address", a, got)
	}
	w.tracef("ADD again %s", a)
}

func (w *world) del() {
	a, ok := w.pickLive()
	if !ok {
		return
	}
	delete(w.live, key(a))
	if _, err := w.call("DEL", a, nil); err != nil {
		w.tracef("DEL %s failed: %v", a, firstLine(err))
		w.uncertain[key(a)] = a
		return
	}
	w.tracef("DEL %s", a)
}

// gc collects one network on one node, with every live attachment of that network
// there valid except, sometimes, one (a stale attachment the runtime forgot).
func (w *world) gc() {
	node, nw := w.rng.IntN(nodeCount), networks[w.rng.IntN(len(networks))]
	var valid []map[string]string
	var dropped *attachment
	for _, k := range sortedKeys(w.live) {
		a := w.live[k]
		if a.node != node || a.net.name != nw.name {
			continue
		}
		if dropped == nil && w.rng.IntN(3) == 0 {
			dropped = &a
			continue
		}
		valid = append(valid, map[string]string{"containerID": a.containerID, "ifname": "net1"})
	}
	probe := attachment{node: node, net: nw, containerID: "gc"}
	if _, err := w.call("GC", probe, map[string]any{"cni.dev/valid-attachments": valid}); err != nil {
		w.tracef("GC %s on n%d failed: %v", nw.name, node, firstLine(err))
		if dropped != nil {
			delete(w.live, key(*dropped))
			w.uncertain[key(*dropped)] = *dropped
		}
		return
	}
	if dropped != nil {
		delete(w.live, key(*dropped))
		w.tracef("GC %s on n%d: %d valid, dropped %s", nw.name, node, len(valid), dropped)
	} else {
		w.tracef("GC %s on n%d: %d valid", nw.name, node, len(valid))
	}
}

func (w *world) retryUncertain() {
	for _, k := range sortedKeys(w.uncertain) {
		a := w.uncertain[k]
		if _, err := w.call("DEL", a, nil); err == nil {
			delete(w.uncertain, k)
			w.tracef("DEL (retry) %s", a)
		}
	}
}

func (w *world) mustDel(a attachment) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := w.call("DEL", a, nil)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			w.fail("DEL %s keeps failing: %v", a, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *world) pickLive() (attachment, bool) {
	keys := sortedKeys(w.live)
	if len(keys) == 0 {
		return attachment{}, false
	}
	return w.live[keys[w.rng.IntN(len(keys))]], true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func resultIP(w *world, out []byte) netip.Addr {
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 {
		w.fail("ADD result %s: want one address (%v)", out, err)
	}
	p, err := netip.ParsePrefix(res.IPs[0].Address)
	if err != nil {
		w.fail("ADD result address %q: %v", res.IPs[0].Address, err)
	}
	return p.Addr()
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// ---- operator actions ----

func (w *world) poolCreate() {
	if !w.proxy.Up() && w.rng.IntN(2) == 0 {
		return // the operator's kubectl works; the components' API does not
	}
	for _, i := range w.rng.Perm(len(poolDefs)) {
		p := poolDefs[i]
		if _, err := w.getPool(p); apierrors.IsNotFound(err) {
			w.createPool(p)
			return
		}
	}
}

func (w *world) poolEdit() {
	p := poolDefs[w.rng.IntN(len(poolDefs))]
	obj, err := w.getPool(p)
	if err != nil {
		return
	}
	what := w.rng.IntN(3)
	switch o := obj.(type) {
	case *v1alpha1.IPPool:
		switch what {
		case 0:
			o.Spec.PerNodeBlockSize = w.blockSize()
		case 1:
			o.Spec.Exclusions = w.exclusions(p)
		case 2:
			o.Spec.NodeSelector = w.selector(p)
		}
	case *v1alpha1.CIDRPool:
		switch what {
		case 0:
			o.Spec.PerNodeNetworkPrefix = w.nodePrefix()
		case 1:
			o.Spec.Exclusions = w.exclusions(p)
		case 2:
			o.Spec.NodeSelector = w.selector(p)
		}
	}
	if err := w.c.Update(w.ctx, obj); err != nil {
		w.tracef("edit %s refused: %v", p.name, firstLine(err))
		return
	}
	w.tracef("edit %s", describe(obj))
}

func (w *world) poolDelete() {
	p := poolDefs[w.rng.IntN(len(poolDefs))]
	obj, err := w.getPool(p)
	if err != nil {
		return
	}
	if err := w.c.Delete(w.ctx, obj); err != nil {
		w.fail("deleting %s: %v", p.name, err)
	}
	w.tracef("delete %s %s", p.kind, p.name)
}

func (w *world) nodeRelabel() {
	i := w.rng.IntN(nodeCount)
	n := w.nodes[i]
	n.group = map[string]string{"a": "b", "b": "a"}[n.group]
	var obj corev1.Node
	if err := w.c.Get(w.ctx, client.ObjectKey{Name: n.name}, &obj); err != nil {
		w.fail("reading node %s: %v", n.name, err)
	}
	obj.Labels[groupLabel] = n.group
	if err := w.c.Update(w.ctx, &obj); err != nil {
		w.tracef("relabel %s failed: %v", n.name, firstLine(err))
		return
	}
	w.tracef("relabel %s group=%s", n.name, n.group)
}

// nodeRecreate deletes a Node object and registers it again at once, as a kubelet
// does after its Node was deleted: labels come back, annotations do not.
func (w *world) nodeRecreate() { w.recreateNode(w.rng.IntN(nodeCount), 0) }

// recreateNode deletes node i's Node object and registers it again away
// after it is gone.
func (w *world) recreateNode(i int, away time.Duration) {
	n := w.nodes[i]
	if err := w.c.Delete(w.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}); err != nil {
		w.fail("deleting node %s: %v", n.name, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var obj corev1.Node
		if err := w.c.Get(w.ctx, client.ObjectKey{Name: n.name}, &obj); apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			w.fail("node %s was not deleted", n.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(away)
	w.createNode(i)
	if away > 0 {
		w.tracef("re-create node %s, away %s", n.name, away)
		return
	}
	w.tracef("re-create node %s", n.name)
}

func (w *world) daemonKill() {
	i := w.rng.IntN(nodeCount)
	if w.nodes[i].cmd == nil {
		return
	}
	w.killDaemon(i)
	w.tracef("kill -9 ipam-node on %s", w.nodes[i].name)
}

func (w *world) daemonRestart() {
	for i, n := range w.nodes {
		if n.cmd == nil {
			w.startDaemon(i)
			w.tracef("restart ipam-node on %s", n.name)
			return
		}
	}
}

func (w *world) apiStop() {
	w.proxy.SetUp(false)
	w.outages++
	w.tracef("API server unreachable")
}

// apiLongOutage makes the API server unreachable for longOutage at least (it
// stays so until api-start), and restarts a daemon at its start, one with a
// prepared claim if there is one: its pool listing gives up and its stored
// blocks serve; its claim collection cannot read the claims and must release
// nothing (check). Every component's timeouts run out meanwhile.
func (w *world) apiLongOutage() {
	w.longOutageDone = true
	w.apiStop()
	i := w.rng.IntN(nodeCount)
	if w.dra {
		if c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && w.nodes[c.node].cmd != nil }); c != nil {
			i = c.node
		}
	}
	if w.nodes[i].cmd != nil {
		w.killDaemon(i)
	}
	w.startDaemon(i)
	w.tracef("ipam-node on %s restarted; the API server stays away for %s", w.nodes[i].name, longOutage)
	time.Sleep(longOutage)
}

func (w *world) apiStart() {
	w.proxy.SetUp(true)
	w.apiUpAt = time.Now()
	w.tracef("API server reachable")
}

// The hostile node's reports (see writeHostileReport).
const (
	hostileClaimPool = iota
	hostileForeign
	hostileMalformed
	hostileOversized
	hostileEmpty
	hostileClaimAll
	hostileKinds
)

func (w *world) hostileReport() { w.writeHostileReport(w.rng.IntN(hostileKinds)) }

// writeHostileReport writes the hostile node's held report, as a compromised
// daemon could: a claim of a whole pool or of all of them, pools that do not
// exist, garbage, a report over the controller's limit, or an honest-looking
// empty one.
func (w *world) writeHostileReport(kind int) {
	var raw, what string
	p := poolDefs[w.rng.IntN(len(poolDefs))]
	net := iprange.PrefixRange(netip.MustParsePrefix(p.network))
	key := v1alpha1.PoolKey(p.kind, p.name)
	switch kind {
	case hostileClaimAll:
		var parts []string
		for _, p := range poolDefs {
			r := iprange.PrefixRange(netip.MustParsePrefix(p.network)).String()
			parts = append(parts, fmt.Sprintf(`%q:{"block":%q,"held":[%q]}`, v1alpha1.PoolKey(p.kind, p.name), r, r))
		}
		raw, what = "{"+strings.Join(parts, ",")+"}", "claims all of every pool"
	case hostileClaimPool:
		raw, what = fmt.Sprintf(`{%q:{"block":%q,"held":[%q]}}`, key, net.String(), net.String()), "claims all of "+key
	case hostileForeign:
		raw, what = `{"no-such-pool":{"held":["0.0.0.0-255.255.255.255"]},"cidrpool/gone":{"held":["::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]}}`,
			"claims every address for pools that do not exist"
	case hostileMalformed:
		raw, what = []string{`{"p0":`, `not json`, `{"p0":{"held":["10.100.0.9-x","10.100.0.300"]}}`, `[]`}[w.rng.IntN(4)], "malformed"
	case hostileOversized:
		var b strings.Builder
		fmt.Fprintf(&b, `{%q:{"held":[`, key)
		for i := 0; b.Len() < 100<<10; i++ {
			a, _ := iprange.Add(net.Start, iprange.U64(uint64(w.rng.IntN(200))))
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%q", a.String())
		}
		b.WriteString(`]}}`)
		raw, what = b.String(), "oversized (100 KiB)"
	default:
		raw, what = `{}`, "empty"
	}
	var obj corev1.Node
	if err := w.c.Get(w.ctx, client.ObjectKey{Name: hostileNode}, &obj); err != nil {
		w.fail("reading node %s: %v", hostileNode, err)
	}
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations[v1alpha1.HeldAnnotation] = raw
	if err := w.c.Update(w.ctx, &obj); err != nil {
		w.tracef("hostile report refused: %v", firstLine(err))
		return
	}
	w.tracef("hostile node reports: %s", what)
}

// recreatePools deletes every pool and creates each again, with a new random
// spec: every block is assigned anew.
// nodeIPAMTamper edits a node's NodeIPAM as someone other than the controller
// would (a block moved onto another node's, or anywhere in its pool), or
// deletes it.
func (w *world) nodeIPAMTamper() {
	if !w.proxy.Up() {
		return
	}
	var objs nodeipamv1.NodeIPAMList
	if err := w.c.List(w.ctx, &objs, client.InNamespace(namespace)); err != nil || len(objs.Items) == 0 {
		return
	}
	o := &objs.Items[w.rng.IntN(len(objs.Items))]
	if len(o.Spec.Blocks) == 0 || w.rng.IntN(3) == 0 {
		if err := w.c.Delete(w.ctx, o); err == nil {
			w.tracef("NodeIPAM %s deleted by hand", o.Name)
		}
		return
	}
	b := &o.Spec.Blocks[w.rng.IntN(len(o.Spec.Blocks))]
	// Another object's block of the same pool, or the one after it.
	other := &objs.Items[w.rng.IntN(len(objs.Items))]
	moved := false
	for _, x := range other.Spec.Blocks {
		if x.Pool == b.Pool && x.Kind == b.Kind && other.Name != o.Name {
			b.StartIP, b.EndIP, b.Prefix, b.Gateway = x.StartIP, x.EndIP, x.Prefix, x.Gateway
			moved = true
		}
	}
	if !moved && b.Kind == v1alpha1.KindIPPool {
		if s, err := netip.ParseAddr(b.StartIP); err == nil {
			e, _ := netip.ParseAddr(b.EndIP)
			n := 0
			for a := s; a.Compare(e) <= 0; a = a.Next() {
				n++
			}
			for range n {
				s, e = s.Next(), e.Next()
			}
			b.StartIP, b.EndIP = s.String(), e.String()
		}
	}
	if err := w.c.Update(w.ctx, o, client.FieldOwner("kubectl-edit")); err == nil {
		w.tracef("NodeIPAM %s edited by hand: %s %s now %s-%s%s", o.Name, b.Kind, b.Pool, b.StartIP, b.EndIP, b.Prefix)
	}
}

func (w *world) recreatePools() {
	for _, p := range poolDefs {
		obj, err := w.getPool(p)
		if err == nil {
			if err := w.c.Delete(w.ctx, obj); err != nil {
				w.fail("deleting %s: %v", p.name, err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := w.getPool(p); apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				w.fail("%s %s was not deleted", p.kind, p.name)
			}
			time.Sleep(20 * time.Millisecond)
		}
		w.createPool(p)
	}
}

// checkHonestBlocks waits until every honest node that a pool selects has a
// block in it, for every pool with a usable block for each node (the hostile
// node's included) clear of the blocks the hostile node ever had in a pool of
// that name: what the controller gave the hostile node its report may keep, and
// nothing more.
func (w *world) checkHonestBlocks() {
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing := w.honestWithoutBlock()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.fail("honest nodes without a block they should have: %s", strings.Join(missing, "; "))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (w *world) honestWithoutBlock() []string {
	var missing []string
	have := w.blocks()
	for p, obj := range w.existingPools() {
		var sel *corev1.NodeSelector
		var layout blocks.Layout
		var err error
		switch o := obj.(type) {
		case *v1alpha1.IPPool:
			sel = o.Spec.NodeSelector
			layout, err = blocks.NewIPPool(&o.Spec)
		case *v1alpha1.CIDRPool:
			sel = o.Spec.NodeSelector
			layout, err = blocks.NewCIDRPool(&o.Spec)
		}
		if err != nil {
			w.fail("layout of %s: %v", p.name, err)
		}
		var usable uint64
		for i, ok := layout.NextUsable(0); ok; i, ok = layout.NextUsable(i + 1) {
			if !slices.ContainsFunc(w.hostileHad[p.name], layout.Block(i).Overlaps) {
				usable++
			}
		}
		var want []string
		for _, n := range w.nodes {
			if sel == nil || slices.ContainsFunc(sel.NodeSelectorTerms, func(t corev1.NodeSelectorTerm) bool {
				return slices.ContainsFunc(t.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool {
					return e.Key == groupLabel && slices.Contains(e.Values, n.group)
				})
			}) {
				want = append(want, n.name)
			}
		}
		if usable < uint64(len(want)+1) {
			continue
		}
		for _, n := range want {
			if !slices.ContainsFunc(have[p.name], func(b struct {
				node string
				r    iprange.Range
			}) bool {
				return b.node == n
			}) {
				missing = append(missing, fmt.Sprintf("%s in %s", n, p.name))
			}
		}
	}
	return missing
}

// ---- the invariants ----

type held struct {
	node int
	pool string
	rec  string
	// cid and ifName are the owner, network the CNI network (nic.hwipam.io for
	// DRA claims) of the allocation.
	cid, ifName, network string
}

// allocations returns node i's allocations as "poolKey ip containerID/ifName"
// records keyed by address: from the daemon when it runs, from its store when not.
func (w *world) allocations(i int) map[netip.Addr]held {
	n := w.nodes[i]
	out := map[netip.Addr]held{}
	addRec := func(pool, ip, cid, ifName, network string) {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			w.fail("node %s: allocation %s/%s has address %q", n.name, cid, ifName, ip)
		}
		if prev, dup := out[a]; dup {
			w.fail("node %s holds %s twice: %s and %s/%s in %s", n.name, a, prev.rec, cid, ifName, pool)
		}
		out[a] = held{node: i, pool: pool, rec: cid + "/" + ifName, cid: cid, ifName: ifName, network: network}
	}
	if n.cmd == nil {
		st, err := store.Open(filepath.Join(n.dir, "store"), store.Options{})
		if err != nil {
			w.fail("opening the store of stopped node %s: %v", n.name, err)
		}
		defer st.Close()
		pools, err := st.Load()
		if err != nil {
			w.fail("loading the store of stopped node %s: %v", n.name, err)
		}
		for key, ps := range pools {
			for _, a := range ps.Allocations {
				addRec(key, a.IP, a.ContainerID, a.IfName, a.Network)
			}
		}
		return out
	}
	var res *infov1.ListAllocationsResponse
	var err error
	for range 50 {
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		res, err = n.info.ListAllocations(ctx, &infov1.ListAllocationsRequest{})
		cancel()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		w.fail("listing the allocations of %s: %v", n.name, err)
	}
	for _, r := range res.Allocations {
		addRec(r.Pool, r.Ip, r.ContainerId, r.IfName, r.Network)
	}
	return out
}

// existingPools yields the pools of poolDefs that exist, as the API server has them.
func (w *world) existingPools() iter.Seq2[poolDef, client.Object] {
	return func(yield func(poolDef, client.Object) bool) {
		for _, p := range poolDefs {
			obj, err := w.getPool(p)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				w.fail("reading %s: %v", p.name, err)
			}
			if !yield(p, obj) {
				return
			}
		}
	}
}

// blocks returns every node's block in every pool, as ranges: those its
// status lists and those the NodeIPAMs the controller wrote give (a node's
// daemon allocates from the latter; the two may differ for a moment while one
// is written after the other).
func (w *world) blocks() map[string][]struct {
	node string
	r    iprange.Range
} {
	type nb = struct {
		node string
		r    iprange.Range
	}
	out := map[string][]nb{}
	add := func(pool string, b nb) {
		if !slices.Contains(out[pool], b) {
			out[pool] = append(out[pool], b)
		}
	}
	var objs nodeipamv1.NodeIPAMList
	if err := w.c.List(w.ctx, &objs, client.InNamespace(namespace)); err != nil {
		w.fail("listing NodeIPAMs: %v", err)
	}
	for p, obj := range w.existingPools() {
		switch o := obj.(type) {
		case *v1alpha1.IPPool:
			for _, a := range o.Status.Allocations {
				r, err := iprange.ParseRange(a.StartIP + "-" + a.EndIP)
				if err != nil {
					w.fail("IPPool %s status: %v", p.name, err)
				}
				add(p.name, nb{a.NodeName, r})
			}
		case *v1alpha1.CIDRPool:
			for _, a := range o.Status.Allocations {
				pfx, err := netip.ParsePrefix(a.Prefix)
				if err != nil {
					w.fail("CIDRPool %s status: %v", p.name, err)
				}
				add(p.name, nb{a.NodeName, iprange.PrefixRange(pfx)})
			}
		}
		for _, n := range objs.Items {
			if !nodeipamv1.OwnedByController(&n) {
				continue // edited by hand: no daemon uses it
			}
			for _, b := range n.Spec.Blocks {
				if b.Pool != p.name || b.PoolUID != obj.GetUID() {
					continue
				}
				var r iprange.Range
				var err error
				if b.Kind == v1alpha1.KindCIDRPool {
					var pfx netip.Prefix
					if pfx, err = netip.ParsePrefix(b.Prefix); err == nil {
						r = iprange.PrefixRange(pfx)
					}
				} else {
					r, err = iprange.ParseRange(b.StartIP + "-" + b.EndIP)
				}
				if err != nil {
					w.fail("NodeIPAM %s, pool %s: %v", n.Name, p.name, err)
				}
				add(p.name, nb{n.Name, r})
			}
		}
	}
	return out
}

// check verifies, against the daemons' own state and the pools' status:
//   - no ipam-node the test did not kill has exited;
//   - no address is held twice, on one node or on two;
//   - every ADD that succeeded is still held, with its address, unless its own
//     network DEL'd or GC'd it;
//   - no address a node holds lies in another node's block of any pool;
//   - with DRA, what checkClaims says.
func (w *world) check() {
	w.checkDaemonsRun()
	all := map[netip.Addr]held{}
	for i := range w.nodes {
		for ip, h := range w.allocations(i) {
			if prev, dup := all[ip]; dup {
				w.fail("address %s is held on %s (%s, %s) and on %s (%s, %s)", ip,
					w.nodes[prev.node].name, prev.pool, prev.rec, w.nodes[h.node].name, h.pool, h.rec)
			}
			all[ip] = h
		}
	}
	for _, k := range sortedKeys(w.live) {
		a := w.live[k]
		h, ok := all[a.ip]
		if !ok || h.node != a.node || h.rec != a.containerID+"/net1" {
			w.fail("%s succeeded and was neither deleted nor collected by its network, but the node holds %+v", a, h)
		}
	}
	for p, obj := range w.existingPools() {
		in := ""
		switch o := obj.(type) {
		case *v1alpha1.IPPool:
			in = o.Status.BlocksIn
		case *v1alpha1.CIDRPool:
			in = o.Status.BlocksIn
		}
		if w.blocksIn == nil {
			w.blocksIn = map[string]string{}
		}
		if prev, ok := w.blocksIn[p.name]; ok && prev != in && prev != "" && in != "" {
			w.counts["blocksIn-change"]++
			w.tracef("pool %s: blocks now in %s", p.name, in)
		}
		w.blocksIn[p.name] = in
	}
	for pool, bs := range w.blocks() {
		for _, b := range bs {
			if b.node == hostileNode && !slices.Contains(w.hostileHad[pool], b.r) {
				w.hostileHad[pool] = append(w.hostileHad[pool], b.r)
			}
			for ip, h := range all {
				if b.r.Contains(ip) && b.node != w.nodes[h.node].name {
					w.fail("address %s held on %s (%s %s) lies in %s's block %s of pool %s",
						ip, w.nodes[h.node].name, h.pool, h.rec, b.node, b.r, pool)
				}
			}
		}
	}
	if w.dra {
		w.checkClaims(all)
		w.checkPorts()
	}
}

// checkDaemonsRun fails when an ipam-node exited that the test did not kill:
// nothing a node meets (a full disk, a dropped runtime connection, a failed
// checkpoint write) may end it, since its CNI path goes with it.
func (w *world) checkDaemonsRun() {
	for _, n := range w.nodes {
		if n.cmd == nil {
			continue
		}
		select {
		case <-n.exited:
			w.fail("ipam-node on %s exited (%v) without being killed", n.name, n.cmd.ProcessState)
		default:
		}
	}
}
