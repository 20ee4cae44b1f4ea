package system

// DRA in the whole-system test (issue 28, "both paths on one node"): every
// ipam-node also runs its DRA kubelet plugin (driver nic.hwipam.io) over a
// DGX-H100 NIC tree, and the test plays the scheduler and the kubelet around
// it. The scheduler's part: a ResourceClaim for one device of a rail, picked
// from the node's published ResourceSlice, allocated in the claim's status (as
// the test's admin) and reserved for a pod. The kubelet's part: registration
// through the plugin registration socket, then NodePrepareResources and
// NodeUnprepareResources over the plugin's DRA socket, retried while the
// plugin is down or restarting, as kubelet's pod sync does.
//
// The rail pools (r0, r1) serve both paths: CNI networks name them outright,
// DRA claims get them by rail. check() then also holds checkClaims: no address
// twice across both (the allocations map already), a prepared claim's address
// in the store under its UID and nowhere else, a claim whose prepare failed
// holding nothing, a deleted claim's allocation gone (at once after
// unprepare; within draGCBound of its daemon's return, by the driver's garbage
// collection, when deleted while the daemon was down), and the claim's status
// showing what the store holds.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

const (
	// draRequest is the claims' one request.
	draRequest = "nic"
	// draGCBound is how long after its daemon started a claim deleted while
	// the daemon was down may still hold its address: the driver collects
	// once it serves. draGCLate is how long after the API server came back,
	// when it was away at the start: the collection then comes with the next
	// round, at most a minute (nicdra.Driver's GCInterval) later.
	draGCBound = 15 * time.Second
	draGCLate  = time.Minute + 15*time.Second
	// draCallTimeout bounds one prepare or unprepare call, as kubelet's
	// plugin client timeout (45 s) does.
	draCallTimeout = 20 * time.Second
	// draOutageTimeout bounds a prepare while the API server is unreachable.
	draOutageTimeout = 2 * time.Second
	// draRetryFor is how long one kubelet sync retries a plugin that does not
	// answer (its socket not there yet after a restart).
	draRetryFor = 10 * time.Second
)

// noPoolRail is a rail of the tree that no pool is labelled for: a claim for
// its NIC without a pool in its configuration must be refused.
var noPoolRail = fakesysfs.DGXH100Rails[2]

// claimState is what the model knows a claim holds.
type claimState int

const (
	// claimPending: allocated by the scheduler, not prepared (not yet, or
	// every prepare failed, or unprepared): it holds nothing.
	claimPending claimState = iota
	// claimPrepared: a prepare succeeded; it holds ips under its UID.
	claimPrepared
	// claimUncertain: a call that may or may not have done something did not
	// return (timed out).
	claimUncertain
)

func (s claimState) String() string {
	return [...]string{"pending", "prepared", "uncertain"}[s]
}

// draClaim is one ResourceClaim as the model knows it.
type draClaim struct {
	name   string
	uid    types.UID
	node   int
	rail   string
	device string
	// what its configuration asks: rail (none, or an interface name only),
	// static, index, pool (an override), or bad-… (must be refused).
	what   string
	config string
	// pool is where its address must come from (zero for bad ones).
	pool poolDef
	// bad: every prepare must fail; refuseFirst: the first must (a static
	// address another interface holds), later ones may not.
	bad, refuseFirst bool
	want             netip.Addr // static: the address asked for
	index            int        // index: the index asked for
	state            claimState
	ip               netip.Addr // prepared: what it holds
	// uncertainIn: the node's blocks when a prepare left the claim uncertain
	// (its addresses allocated, its status not written): the next prepare
	// answers with those addresses, also once a layout edit has moved the block.
	uncertainIn []iprange.Range
	// ifName is the name its port takes in its pod; pod is its pod's
	// running sandbox (nil when none runs).
	ifName string
	pod    *draPod
	// deleted is when its tenant deleted it while its pod ran (zero: it
	// exists): the driver keeps what it holds until the pod's sandbox
	// stops (edges_test.go). refusal is what its last prepare was refused
	// with.
	deleted time.Time
	refusal string
}

func (c *draClaim) String() string {
	s := fmt.Sprintf("claim %s (%s) on n%d %s/%s [%s]", c.name, c.uid[:8], c.node, c.rail, c.device, c.what)
	if !c.deleted.IsZero() {
		s += " (deleted)"
	}
	if c.state == claimPrepared {
		return s + " " + c.ip.String()
	}
	return s + " " + c.state.String()
}

// draGone is a claim deleted while its node's daemon was down.
type draGone struct {
	name string
	node int
	// deadline is when the daemon's garbage collection must have released it:
	// zero while the daemon is down, pushed on while the API server is.
	deadline time.Time
}

// draAction is an action of run's table (the same shape).
type draAction struct {
	name   string
	weight func() int
	do     func()
}

func (w *world) draActions() []draAction {
	down := func(c *draClaim) bool { return w.nodes[c.node].cmd == nil }
	prepared := func(c *draClaim) bool { return c.state == claimPrepared }
	return []draAction{
		{"dra-claim", func() int { return 12 }, w.draNewClaim},
		{"dra-prepare-again", func() int { return 3 }, w.draPrepareAgain},
		{"dra-release", func() int { return 6 }, w.draRelease},
		{"dra-kubelet-sync", func() int { return 3 }, w.draSync},
		{"dra-delete-while-down", func() int {
			if w.pickClaimExists(down) {
				return 10
			}
			return 0
		}, w.draDeleteWhileDown},
		// A daemon starting while the API server is away cannot tell which
		// claims still exist: its collection must release nothing. Once a
		// seed.
		{"dra-restart-api-down", func() int {
			if !w.draRestartedAPIDown &&
				w.pickClaimExists(func(c *draClaim) bool { return c.state == claimPrepared && w.nodes[c.node].cmd != nil }) {
				return 3
			}
			return 0
		}, w.draRestartAPIDown},
		// Daemon kills alone rarely find a prepared claim on their node.
		{"dra-kill-and-delete", func() int {
			if w.pickClaimExists(prepared) {
				return 4
			}
			return 0
		}, w.draKillAndDelete},
		// The attach (attach_test.go, issue 36).
		{"dra-pod-start", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return c.state == claimPrepared && c.pod == nil && !down(c) }) {
				return 10
			}
			return 0
		}, w.draPodStart},
		{"dra-pod-restart", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return c.pod != nil && !down(c) }) {
				return 2
			}
			return 0
		}, w.draPodRestart},
		{"dra-missed-stop", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return c.pod != nil }) {
				return 2
			}
			return 0
		}, w.draMissedStop},
		{"dra-pod-rename", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return c.pod != nil && c.state == claimPrepared && !down(c) }) {
				return 2
			}
			return 0
		}, w.draPodRename},
		{"dra-shared-claim", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return prepared(c) && !down(c) }) {
				return 2
			}
			return 0
		}, w.draSharedClaim},
		{"cni-master-add", func() int { return 3 }, w.cniMasterAdd},
		{"dra-recreate-while-down", func() int {
			if w.pickClaimExists(prepared) {
				return 2
			}
			return 0
		}, w.draRecreateWhileDown},
		{"dra-kill-during-prepare", func() int { return 3 }, w.draKillDuringPrepare},
		{"dra-slow-prepare", func() int {
			if !w.draSlowDone && w.pickClaimExists(func(c *draClaim) bool { return prepared(c) && !down(c) }) {
				return 3
			}
			return 0
		}, w.draSlowPrepare},
		// Issue 45's edges (edges_test.go).
		{"dra-delete-running", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return prepared(c) && c.pod != nil && !down(c) }) {
				return 3
			}
			return 0
		}, w.draDeleteRunning},
		{"dra-deleted-pod-stop", func() int {
			for _, c := range w.claims {
				if !c.deleted.IsZero() {
					return 3
				}
			}
			return 0
		}, w.draDeletedPodStop},
		{"dra-checkpoint-full", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return prepared(c) && !down(c) }) {
				return 2
			}
			return 0
		}, w.draCheckpointFull},
		{"dra-cni-race", func() int { return 3 }, w.draCNIRace},
		{"cni-bond-master", func() int { return 2 }, w.cniBondMaster},
		{"dra-nri-reconnect", func() int {
			if w.pickClaimExists(func(c *draClaim) bool { return prepared(c) && c.pod == nil && !down(c) }) {
				return 2
			}
			return 0
		}, w.draNRIReconnect},
	}
}

// draNodeSetup gives a node its NIC tree and its kubelet directory (short: a
// unix socket path has at most 107 bytes).
func (w *world) draNodeSetup(n *simNode) {
	tree, err := fakesysfs.DGXH100(filepath.Join(n.dir, "sysfs"))
	if err != nil {
		w.t.Fatalf("building the NIC tree of %s: %v", n.name, err)
	}
	n.sysfs, n.tree = tree.Root, tree
	if n.kubeletDir, err = os.MkdirTemp("", "kl-"); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = os.RemoveAll(n.kubeletDir) })
	w.draAttachSetup(len(w.nodes), n, tree)
}

func (w *world) draFlags(n *simNode) []string {
	n.nri.syncsAtStart.Store(n.nri.syncs.Load())
	return []string{"--dra", "--dra-kubelet-dir=" + n.kubeletDir, "--dra-nri-socket=" + n.nri.sock,
		"--dra-host-netns=/run/netns/" + n.hostNS, "--sysfs-root=" + n.sysfs, "--dra-cdi-dir=" + filepath.Join(n.dir, "cdi")}
}

// draClusterSetup creates the DeviceClass the claims name.
func (w *world) draClusterSetup() {
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nicdra.DriverName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", nicdra.DriverName)}}}}}
	if _, err := w.cp.Clientset.ResourceV1().DeviceClasses().Create(w.ctx, dc, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("creating the DeviceClass: %v", err)
	}
	w.installNotSharedPolicy()
}

// draDaemonStarted starts the garbage-collection clock of the claims deleted
// while the node's daemon was down.
func (w *world) draDaemonStarted(i int) {
	w.portsReturning(i)
	for _, g := range w.collect {
		if g.node == i {
			g.deadline = time.Now().Add(draGCBound)
			if !w.proxy.Up() {
				g.deadline = time.Now().Add(draGCLate)
			}
		}
	}
}

// draUnregister is kubelet losing the plugin when its daemon dies.
func (w *world) draUnregister(n *simNode) {
	if n.draConn != nil {
		_ = n.draConn.Close()
	}
	n.draConn, n.dra = nil, nil
	for _, g := range w.collect {
		if w.nodes[g.node] == n {
			g.deadline = time.Time{}
		}
	}
}

// draRegister registers the node's plugin as kubelet does when its
// registration socket appears: GetInfo, a connection to the endpoint it
// names, NotifyRegistrationStatus. False when the socket does not appear
// within wait (the plugin is not registered; kubelet's prepares wait).
func (w *world) draRegister(i int, wait time.Duration) bool {
	n := w.nodes[i]
	if n.dra != nil {
		return true
	}
	if n.cmd == nil {
		return false
	}
	reg := filepath.Join(n.kubeletDir, "plugins_registry", nicdra.DriverName+"-reg.sock")
	deadline := time.Now().Add(wait)
	for {
		if _, err := os.Stat(reg); err == nil {
			break
		}
		if time.Now().After(deadline) {
			w.tracef("kubelet on %s: no plugin registration socket %s yet", n.name, reg)
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+reg, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	rc := registerapi.NewRegistrationClient(conn)
	var info *registerapi.PluginInfo
	for {
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		info, err = rc.GetInfo(ctx, &registerapi.InfoRequest{})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			w.tracef("kubelet on %s: GetInfo of the registration socket: %v", n.name, firstLine(err))
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != nicdra.DriverName || !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
		w.fail("the plugin on %s registers as %+v, want a %s named %s supporting %s", n.name, info, registerapi.DRAPlugin,
			nicdra.DriverName, drapb.DRAPluginService)
	}
	want := filepath.Join(n.kubeletDir, "plugins", nicdra.DriverName, "dra.sock")
	if info.Endpoint != want {
		w.fail("the plugin on %s names its DRA socket %s, want %s", n.name, info.Endpoint, want)
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	_, err = rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	cancel()
	if err != nil {
		w.tracef("kubelet on %s: NotifyRegistrationStatus: %v", n.name, firstLine(err))
		return false
	}
	dc, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.t.Fatal(err)
	}
	n.draConn, n.dra = dc, drapb.NewDRAPluginClient(dc)
	w.tracef("kubelet on %s registers plugin %s", n.name, info.Name)
	return true
}

// kubeletCall makes one of kubelet's calls to the node's plugin, again while
// the plugin does not answer (Unavailable), for up to draRetryFor.
func kubeletCall[R any](w *world, i int, timeout time.Duration, call func(context.Context) (R, error)) (R, error) {
	deadline := time.Now().Add(draRetryFor)
	for {
		ctx, cancel := context.WithTimeout(w.ctx, timeout)
		r, err := call(ctx)
		cancel()
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) || w.nodes[i].cmd == nil {
			return r, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// draDevice is the scheduler's pick: a device of the node's published
// ResourceSlices whose rail attribute is rail and that no existing claim is
// allocated, "" when there is none; published says whether the node has
// published any device of the rail yet.
func (w *world) draDevice(i int, rail string) (device string, published bool) {
	slicesList, err := w.cp.Clientset.ResourceV1().ResourceSlices().List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.fail("listing ResourceSlices: %v", err)
	}
	for _, s := range slicesList.Items {
		if s.Spec.Driver != nicdra.DriverName || s.Spec.Pool.Name != w.nodes[i].name {
			continue
		}
		if s.Spec.NodeName == nil || *s.Spec.NodeName != w.nodes[i].name {
			w.fail("ResourceSlice %s of pool %s is for node %v, want %s", s.Name, s.Spec.Pool.Name, s.Spec.NodeName, w.nodes[i].name)
		}
		for _, d := range s.Spec.Devices {
			a, ok := d.Attributes[nicdra.AttrRail]
			if !ok || a.StringValue == nil || *a.StringValue != rail {
				continue
			}
			published = true
			if !w.pickClaimExists(func(c *draClaim) bool { return c.node == i && c.device == d.Name }) {
				return d.Name, true
			}
		}
	}
	return "", published
}

// draNewClaim is a pod with a claim for one NIC of a random rail on a random
// node: sometimes with a configuration (a static address, free or held by
// another interface; an index; another pool; one that must be refused),
// allocated by the scheduler and prepared by the node's kubelet.
func (w *world) draNewClaim() {
	i := w.rng.IntN(nodeCount)
	railPools := []poolDef{poolDefs[3], poolDefs[4]}
	c := &draClaim{node: i, what: "rail"}
	c.pool = railPools[w.rng.IntN(len(railPools))]
	c.rail = c.pool.rail
	var cfg map[string]any
	config := func(kv ...any) {
		cfg = map[string]any{"apiVersion": nicdra.ConfigAPIVersion, "kind": nicdra.ConfigKind}
		for j := 0; j < len(kv); j += 2 {
			cfg[kv[j].(string)] = kv[j+1]
		}
	}
	switch w.rng.IntN(10) {
	case 0, 1, 2, 3:
	case 4:
		config("interfaceName", "net1")
		c.ifName = "net1"
	case 5:
		c.what = "static"
		c.want, c.refuseFirst = w.draStaticAddr(i, c.pool)
		if c.refuseFirst {
			c.what = "static-held"
		}
		config("ips", []string{c.want.String()})
	case 6:
		c.what, c.index = "index", w.rng.IntN(4)
		config("ipIndex", c.index)
	case 7:
		c.what = "pool"
		if w.rng.IntN(2) == 0 {
			c.pool = poolDefs[1]
			config("pool", c.pool.name)
		} else {
			c.pool = poolDefs[2]
			config("pool", c.pool.name, "poolType", "cidrpool")
		}
	default:
		c.bad, c.pool = true, poolDef{}
		switch w.rng.IntN(6) {
		case 0:
			c.what = "bad-unknown-pool"
			config("pool", "no-such-pool")
		case 1:
			c.what = "bad-static-outside"
			config("ips", []string{"192.0.2.7"})
		case 2:
			c.what = "bad-long-ifname"
			config("interfaceName", "a-much-too-long-name")
		case 3:
			c.what = "bad-kind"
			config()
			cfg["kind"] = "NetConfig"
		case 4:
			c.what = "bad-unknown-field"
			config("ipAddress", "10.130.0.9")
		default:
			c.what, c.rail = "bad-rail-without-pool", noPoolRail
		}
	}
	if cfg != nil {
		raw, err := json.Marshal(cfg)
		if err != nil {
			w.t.Fatal(err)
		}
		c.config = string(raw)
	}
	// The kubelet starts the pod's sandbox once its claims are prepared
	// (mostly at once here; dra-pod-start starts the others later).
	if w.draSchedule(c) && c.state == claimPrepared && w.rng.IntN(4) != 0 && w.nriConnected(c.node, draRetryFor) {
		w.podStart(c)
	}
}

// draSchedule allocates the claim a device of its rail on its node, as the
// scheduler does, creates it, and has the node's kubelet prepare it; false
// when the node has published no such device.
func (w *world) draSchedule(c *draClaim) bool {
	if !w.draAllocate(c) {
		return false
	}
	w.draPrepare(c)
	return true
}

// draAllocate is draSchedule without the prepare.
func (w *world) draAllocate(c *draClaim) bool {
	i := c.node
	// The slices come shortly after the daemon starts (when it can reach
	// the API server): the scheduler waits for them a little.
	deadline := time.Now().Add(10 * time.Second)
	device, published := w.draDevice(i, c.rail)
	for ; !published && w.nodes[i].cmd != nil && w.proxy.Up() && time.Now().Before(deadline); device, published = w.draDevice(i, c.rail) {
		time.Sleep(100 * time.Millisecond)
	}
	switch {
	case !published:
		w.tracef("scheduler: no %s device of rail %s published for %s yet", nicdra.DriverName, c.rail, w.nodes[i].name)
		w.counts["dra-no-slice"]++
		return false
	case device == "":
		w.tracef("scheduler: every %s device of rail %s on %s is allocated", nicdra.DriverName, c.rail, w.nodes[i].name)
		w.counts["dra-rail-busy"]++
		return false
	}
	c.device = device
	w.nextClaim++
	c.name = fmt.Sprintf("d%d", w.nextClaim)
	w.draCreate(c)
	w.claims[c.uid] = c
	w.tracef("create %s config=%s", c, c.config)
	return true
}

// draStaticAddr returns an address of the node's block of pool: one that
// another interface holds (held true) a third of the time when there is one,
// else a free one (or, with no block, any of the pool's).
func (w *world) draStaticAddr(i int, p poolDef) (addr netip.Addr, held bool) {
	allocs := w.allocations(i)
	if w.rng.IntN(3) == 0 {
		var taken []netip.Addr
		for ip, h := range allocs {
			if h.pool == v1alpha1.PoolKey(p.kind, p.name) {
				taken = append(taken, ip)
			}
		}
		if len(taken) > 0 {
			slices.SortFunc(taken, netip.Addr.Compare)
			return taken[w.rng.IntN(len(taken))], true
		}
	}
	r := iprange.PrefixRange(netip.MustParsePrefix(p.network))
	for _, b := range w.blocks()[p.name] {
		if b.node == w.nodes[i].name {
			r = b.r
		}
	}
	for range 20 {
		size := uint64(64) // IPv4 pools: small
		if sz := r.Size(); sz.IsUint64() {
			size = min(sz.Lo, size)
		}
		a, _ := iprange.Add(r.Start, iprange.U64(w.rng.Uint64N(size)))
		if _, ok := allocs[a]; !ok {
			return a, false
		}
	}
	return r.Start, false
}

// draCreate creates the claim and allocates it as the scheduler does: its
// device in the node's pool, its configuration, the node, and the pod it is
// reserved for.
func (w *world) draCreate(c *draClaim) {
	rc := w.cp.Clientset.ResourceV1().ResourceClaims(namespace)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: draRequest, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName}}}}}}
	var configs []resourceapi.DeviceAllocationConfiguration
	if c.config != "" {
		opaque := &resourceapi.OpaqueDeviceConfiguration{Driver: nicdra.DriverName, Parameters: runtime.RawExtension{Raw: []byte(c.config)}}
		claim.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{draRequest},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: opaque}}}
		configs = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
			Requests: []string{draRequest}, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: opaque}}}
	}
	claim, err := rc.Create(w.ctx, claim, metav1.CreateOptions{})
	if err != nil {
		w.fail("creating claim %s: %v", c.name, err)
	}
	c.uid = claim.UID
	node := w.nodes[c.node].name
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: draRequest, Driver: nicdra.DriverName, Pool: node, Device: c.device}},
			Config:  configs},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + c.name,
		UID: types.UID("pod-uid-" + c.name)}}
	if _, err := rc.UpdateStatus(w.ctx, claim, metav1.UpdateOptions{}); err != nil {
		w.fail("allocating claim %s: %v", c.name, err)
	}
}

// draPrepare is the node's kubelet preparing the claim, and what the model
// then expects.
func (w *world) draPrepare(c *draClaim) {
	n := w.nodes[c.node]
	if !w.draRegister(c.node, draRetryFor) {
		w.tracef("kubelet on %s: plugin not registered, prepare of %s waits", n.name, c.name)
		w.counts["dra-prepare-waits"]++
		return
	}
	// While the API server is unreachable the plugin cannot read the claim,
	// which the library does before anything else; it fails only after
	// client-go's retries (about 10 s). One prepare per outage shows it, with
	// a shorter timeout; a timeout then leaves the claim as it was, since the
	// plugin never got past reading it.
	timeout, apiDown := draCallTimeout, !w.proxy.Up()
	if apiDown {
		if w.draOutageTried == w.outages {
			w.tracef("kubelet: prepare of %s waits for the API server", c.name)
			w.counts["dra-prepare-waits"]++
			return
		}
		w.draOutageTried, timeout = w.outages, draOutageTimeout
	}
	key := v1alpha1.PoolKey(c.pool.kind, c.pool.name)
	before := w.nodeBlock(c.node, key)
	again := c.state == claimPrepared
	req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: namespace, Uid: string(c.uid), Name: c.name}}}
	start := time.Now()
	resp, err := kubeletCall(w, c.node, timeout, func(ctx context.Context) (*drapb.NodePrepareResourcesResponse, error) {
		return n.dra.NodePrepareResources(ctx, req)
	})
	if err != nil {
		if status.Code(err) == codes.DeadlineExceeded && c.state != claimPrepared && !apiDown {
			c.state = claimUncertain
			c.uncertainIn = append(c.uncertainIn, before, w.nodeBlock(c.node, key))
		}
		w.tracef("kubelet: prepare %s failed as a whole after %s (retried later): %v", c, time.Since(start).Round(time.Millisecond), firstLine(err))
		w.counts["dra-prepare-call-failed"]++
		return
	}
	r := resp.Claims[string(c.uid)]
	if r == nil || len(resp.Claims) != 1 {
		w.fail("prepare %s: the answer %v has no entry for the claim alone", c, resp.Claims)
	}
	if r.Error != "" {
		switch {
		case again && strings.Contains(r.Error, "its addresses are held, but writing its status failed"):
			// The claim stays prepared, with its addresses: only its status
			// write (again, after a restart or a changed device) met an API
			// fault; the kubelet tries again (seed 124587).
			w.counts["dra-prepare-again-status-failed"]++
			w.tracef("kubelet: prepare %s again: its status write failed, retried later: %s", c, r.Error)
			return
		case again:
			w.fail("prepare of %s again was refused: %s", c, r.Error)
		case c.bad || c.refuseFirst:
			w.counts["dra-refused-as-it-must"]++
		default:
			w.counts["dra-prepare-refused"]++
		}
		c.refuseFirst, c.refusal = false, r.Error
		switch {
		case strings.Contains(r.Error, "its addresses are held, but writing its status failed"):
			// The claim's status write failed (api-faults): the driver keeps
			// what it allocated for the kubelet's next try, and the write
			// may have been stored with its answer lost. Settled by the next
			// prepare, an unprepare, or the claim's deletion.
			c.state = claimUncertain
			c.uncertainIn = append(c.uncertainIn, before, w.nodeBlock(c.node, key))
			w.counts["dra-prepare-status-failed"]++
		case c.state == claimUncertain:
			c.state = claimPending // a refusal releases what the claim got
			c.uncertainIn = nil
		}
		w.tracef("kubelet: prepare %s refused: %s", c, r.Error)
		return
	}
	if c.bad || c.refuseFirst {
		w.fail("prepare of %s with configuration %s succeeded; it must be refused", c, c.config)
	}
	if len(r.Devices) != 1 || r.Devices[0].PoolName != n.name || r.Devices[0].DeviceName != c.device ||
		!slices.Equal(r.Devices[0].RequestNames, []string{draRequest}) {
		w.fail("prepare %s answered devices %v, want %s's %s for request %s", c, r.Devices, n.name, c.device, draRequest)
	}
	var recs []held
	var ips []netip.Addr
	for ip, h := range w.allocations(c.node) {
		if h.cid == string(c.uid) {
			recs, ips = append(recs, h), append(ips, ip)
		}
	}
	if len(recs) != 1 || recs[0].ifName != draRequest+":"+c.device || recs[0].network != nicdra.DriverName || recs[0].pool != key {
		w.fail("prepared %s: the store holds %v under its UID, want one address of pool %s as %s:%s of network %s",
			c, recs, key, draRequest, c.device, nicdra.DriverName)
	}
	ip := ips[0]
	if again {
		// The same address, also when its block has gone since (a pool
		// edited or deleted keeps what is held).
		if ip != c.ip {
			w.fail("prepare of %s again: the store holds %s, want the same address", c, ip)
		}
		w.counts["dra-prepared-again-same"]++
		w.tracef("kubelet: prepared %s again", c)
		w.draWaitStatus(c)
		return
	}
	after := w.nodeBlock(c.node, key)
	blocks := append([]iprange.Range{before, after}, c.uncertainIn...)
	c.uncertainIn = nil
	var in bool
	for _, b := range blocks {
		in = in || (b.Start.IsValid() && b.Contains(ip))
	}
	if !in {
		w.fail("prepared %s got %s, outside %s's block of %s (%s before, %s after)", c, ip, n.name, key, before, after)
	}
	switch c.what {
	case "static":
		if ip != c.want {
			w.fail("prepared %s got %s, but its configuration asks for %s", c, ip, c.want)
		}
	case "index":
		var ok bool
		for _, b := range blocks {
			a, _ := iprange.Add(b.Start, iprange.U64(uint64(c.index)))
			ok = ok || (b.Start.IsValid() && a == ip)
		}
		if !ok {
			w.fail("prepared %s got %s, but its configuration asks for index %d of the block (%s before, %s after)", c, ip, c.index, before, after)
		}
	}
	c.state, c.ip = claimPrepared, ip
	if c.ifName == "" {
		c.ifName = w.portOf(c.node, c.device).name
	}
	w.counts["dra-prepared"]++
	w.tracef("kubelet: prepared %s", c)
	w.draWaitStatus(c)
}

// nodeBlock is the node's active block of a pool as its daemon has it; zero
// when it has none.
func (w *world) nodeBlock(i int, key string) iprange.Range {
	n := w.nodes[i]
	if n.info == nil {
		return iprange.Range{}
	}
	var res *infov1.ListPoolsResponse
	var err error
	for range 50 {
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		res, err = n.info.ListPools(ctx, &infov1.ListPoolsRequest{})
		cancel()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		w.fail("listing the pools of %s: %v", n.name, err)
	}
	for _, p := range res.Pools {
		if p.Key == key && p.Active {
			r, err := iprange.ParseRange(p.Start + "-" + p.End)
			if err != nil {
				w.fail("%s's block of %s: %v", n.name, key, err)
			}
			return r
		}
	}
	return iprange.Range{}
}

// draStatusIPs returns the addresses the claim's status shows for its device,
// and whether it has an entry of this driver for it at all.
func draStatusIPs(claim *resourceapi.ResourceClaim, node, device string) ([]string, bool) {
	for _, d := range claim.Status.Devices {
		if d.Driver == nicdra.DriverName && d.Pool == node && d.Device == device {
			if d.NetworkData == nil {
				return nil, true
			}
			return d.NetworkData.IPs, true
		}
	}
	return nil, false
}

// statusMatches says whether the status addresses are the claim's address.
func statusMatches(ips []string, want netip.Addr) bool {
	if len(ips) != 1 {
		return false
	}
	p, err := netip.ParsePrefix(ips[0])
	return err == nil && p.Addr() == want
}

// draWaitStatus waits (bounded) until the prepared claim's status shows its
// address.
func (w *world) draWaitStatus(c *draClaim) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		claim, err := w.cp.Clientset.ResourceV1().ResourceClaims(namespace).Get(w.ctx, c.name, metav1.GetOptions{})
		if err != nil {
			w.fail("reading claim %s: %v", c.name, err)
		}
		ips, _ := draStatusIPs(claim, w.nodes[c.node].name, c.device)
		if statusMatches(ips, c.ip) {
			return
		}
		if time.Now().After(deadline) {
			w.fail("prepared %s: its status shows %v for the device, want %s (status.devices %+v)", c, ips, c.ip, claim.Status.Devices)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// draRestartAPIDown makes the API server unreachable (if it is not), kills -9
// and restarts the daemon of a node with a prepared claim: the claim stays
// held. (The collection the daemon starts with gives up only after client-go's
// retries, about 10 s per request, which an ordinary outage here seldom
// lasts; apiLongOutage, rarer, does. While the API server is away, a
// restarted daemon's pool listing holds the lock that ListAllocations needs
// for 3 s of every 5.)
func (w *world) draRestartAPIDown() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && w.nodes[c.node].cmd != nil })
	if c == nil {
		return
	}
	if w.proxy.Up() {
		w.apiStop()
	}
	w.killDaemon(c.node)
	w.tracef("kill -9 ipam-node on %s (it holds %s), the API server unreachable", w.nodes[c.node].name, c)
	w.startDaemon(c.node)
	w.draRestartedAPIDown = true
}

// pickClaimExists says whether a claim that ok accepts exists (in the API
// server: not one deleted while its pod runs).
func (w *world) pickClaimExists(ok func(*draClaim) bool) bool {
	for _, c := range w.claims {
		if c.deleted.IsZero() && ok(c) {
			return true
		}
	}
	return false
}

// pickClaim returns a claim that exists (see pickClaimExists), in UID order,
// that ok accepts.
func (w *world) pickClaim(ok func(*draClaim) bool) *draClaim {
	var cands []*draClaim
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		if c := w.claims[types.UID(uid)]; c.deleted.IsZero() && ok(c) {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cands[w.rng.IntN(len(cands))]
}

func claimKeys(m map[types.UID]*draClaim) map[string]struct{} {
	out := make(map[string]struct{}, len(m))
	for k := range m {
		out[string(k)] = struct{}{}
	}
	return out
}

// draPrepareAgain is kubelet preparing a prepared claim again (its pod sync
// after a restart of kubelet): the same address.
func (w *world) draPrepareAgain() {
	if c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && w.nodes[c.node].cmd != nil }); c != nil {
		w.draPrepare(c)
	}
}

// draSync is kubelet's pod sync: the claims not prepared yet on nodes whose
// daemon runs are prepared again (a few).
func (w *world) draSync() {
	var todo []*draClaim
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		c := w.claims[types.UID(uid)]
		if c.state != claimPrepared && c.deleted.IsZero() && w.nodes[c.node].cmd != nil {
			todo = append(todo, c)
		}
	}
	w.rng.Shuffle(len(todo), func(a, b int) { todo[a], todo[b] = todo[b], todo[a] })
	for _, c := range todo[:min(len(todo), 3)] {
		w.draPrepare(c)
	}
}

// draRelease is a pod going away: kubelet unprepares its claim, then the claim
// is deleted. Its allocation must be gone at once.
func (w *world) draRelease() {
	c := w.pickClaim(func(c *draClaim) bool { return w.nodes[c.node].cmd != nil })
	if c == nil {
		return
	}
	if c.pod != nil && !w.nriConnected(c.node, draRetryFor) {
		return
	}
	if !w.podStop(c, true) {
		return
	}
	w.draDelete(c)
	delete(w.claims, c.uid)
	w.tracef("delete %s", c)
}

// draUnprepare is kubelet unpreparing the claim; true when it did.
func (w *world) draUnprepare(c *draClaim) bool {
	n := w.nodes[c.node]
	if !w.draRegister(c.node, draRetryFor) {
		w.tracef("kubelet on %s: plugin not registered, unprepare of %s waits", n.name, c.name)
		return false
	}
	req := &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: namespace, Uid: string(c.uid), Name: c.name}}}
	resp, err := kubeletCall(w, c.node, draCallTimeout, func(ctx context.Context) (*drapb.NodeUnprepareResourcesResponse, error) {
		return n.dra.NodeUnprepareResources(ctx, req)
	})
	if err != nil {
		w.tracef("kubelet: unprepare %s failed as a whole (retried later): %v", c, firstLine(err))
		return false
	}
	r, ok := resp.Claims[string(c.uid)]
	if !ok || len(resp.Claims) != 1 {
		w.fail("unprepare %s: the answer %v has no entry for the claim alone", c, resp.Claims)
	}
	if r != nil && r.Error != "" {
		w.tracef("kubelet: unprepare %s refused (retried later): %s", c, r.Error)
		w.counts["dra-unprepare-refused"]++
		return false
	}
	for ip, h := range w.allocations(c.node) {
		if h.cid == string(c.uid) {
			w.violation("unprepare-leaves-address", "unprepared %s, but the store still holds %s (%s) under its UID", c, ip, h.rec)
		}
	}
	c.state, c.uncertainIn = claimPending, nil
	w.portsUnprepared(c)
	w.counts["dra-unprepared"]++
	w.tracef("kubelet: unprepared %s", c)
	return true
}

func (w *world) draDelete(c *draClaim) {
	err := w.cp.Clientset.ResourceV1().ResourceClaims(namespace).Delete(w.ctx, c.name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		w.fail("deleting claim %s: %v", c.name, err)
	}
}

// draDeleteWhileDown deletes a claim of a node whose daemon is down, without
// an unprepare (the pod was force-deleted, kubelet lost track): the driver's
// garbage collection must release its allocation when the daemon is back.
func (w *world) draDeleteWhileDown() {
	if c := w.pickClaim(func(c *draClaim) bool { return w.nodes[c.node].cmd == nil }); c != nil {
		w.draDeleteDown(c)
	}
}

func (w *world) draDeleteDown(c *draClaim) {
	if pod := c.pod; pod != nil {
		// The pod goes too, its stop missed by the plugin.
		ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
		_ = w.nodes[c.node].nri.rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod.sandbox()})
		cancel()
		w.podGone(pod, true)
		c.pod = nil
	}
	w.draDelete(c)
	delete(w.claims, c.uid)
	w.collect[c.uid] = &draGone{name: c.name, node: c.node}
	w.counts["dra-deleted-while-down"]++
	w.tracef("delete %s while ipam-node on %s is down", c, w.nodes[c.node].name)
}

// draKillAndDelete kills -9 the daemon of a node with a prepared claim and
// deletes the claim while it is down.
func (w *world) draKillAndDelete() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared })
	if c == nil {
		return
	}
	if w.nodes[c.node].cmd != nil {
		w.killDaemon(c.node)
		w.tracef("kill -9 ipam-node on %s", w.nodes[c.node].name)
	}
	w.draDeleteDown(c)
}

// checkClaims verifies the claims against the stores and the API server:
//   - a prepared claim holds its address, under its UID, on its node, and
//     nothing else; one not prepared (or unprepared) holds nothing;
//   - a claim deleted while its daemon was down holds nothing draGCBound after
//     the daemon (and the API server) is back;
//   - no allocation of network nic.hwipam.io belongs to a claim the model no
//     longer has;
//   - a prepared claim's status shows its address; a claim not prepared shows
//     none;
//   - no two claims are prepared with one port, a claim deleted while its
//     pod runs is in its driver's status (checkDeletedClaims), and so is
//     what the edges' actions expect there (checkStatusWants).
func (w *world) checkClaims(all map[netip.Addr]held) {
	byCID := map[string][]netip.Addr{}
	for ip, h := range all {
		byCID[h.cid] = append(byCID[h.cid], ip)
	}
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		c := w.claims[types.UID(uid)]
		ips := byCID[uid]
		switch c.state {
		case claimPrepared:
			if len(ips) != 1 || ips[0] != c.ip || all[c.ip].node != c.node {
				w.violation("prepared-holds", "%s is prepared, but the stores hold %v under its UID", c, ips)
			}
		case claimPending:
			if len(ips) != 0 {
				w.violation("pending-holds", "%s is not prepared (never, refused or unprepared), but the stores hold %v under its UID", c, ips)
			}
		}
	}
	w.checkOneClaimPerPort()
	w.checkDeletedClaims()
	w.checkStatusWants()
	now := time.Now()
	for _, uid := range sortedKeys(goneKeys(w.collect)) {
		g := w.collect[types.UID(uid)]
		if !g.deadline.IsZero() && !w.proxy.Up() {
			g.deadline = now.Add(draGCLate) // the collection needs the API server to know the claim is gone
		}
		ips := byCID[uid]
		switch {
		case len(ips) == 0:
			if w.nodes[g.node].cmd != nil {
				w.counts["dra-collected"]++
				w.tracef("claim %s (%s), left to the driver's claim collection, holds nothing now", g.name, uid[:8])
			}
			delete(w.collect, types.UID(uid))
		case !g.deadline.IsZero() && now.After(g.deadline):
			w.fail("claim %s (%s) was deleted while ipam-node on %s was down; the store still holds %v, more than %s after "+
				"the daemon started (%s after the API server came back, when it was away)", g.name, uid, w.nodes[g.node].name, ips,
				draGCBound, draGCLate)
		}
	}
	for ip, h := range all {
		if h.network != nicdra.DriverName {
			continue
		}
		_, known := w.claims[types.UID(h.cid)]
		_, gone := w.collect[types.UID(h.cid)]
		if !known && !gone {
			w.violation("held-for-gone-claim", "%s holds %s (%s %s) for a claim that was unprepared and deleted, or never existed",
				w.nodes[h.node].name, ip, h.pool, h.rec)
		}
	}
	list, err := w.cp.Clientset.ResourceV1().ResourceClaims(namespace).List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.fail("listing claims: %v", err)
	}
	for _, claim := range list.Items {
		c, ok := w.claims[claim.UID]
		if !ok {
			continue
		}
		ips, _ := draStatusIPs(&claim, w.nodes[c.node].name, c.device)
		switch c.state {
		case claimPrepared:
			if !statusMatches(ips, c.ip) {
				w.fail("%s is prepared, but its status shows %v", c, ips)
			}
		case claimPending:
			if len(ips) != 0 {
				w.violation("status-of-unprepared", "%s is not prepared, but its status shows %v", c, ips)
			}
		}
	}
}

// draFinalCollect deletes a prepared claim (one made for the purpose when
// none is) while its daemon is down, starts the daemon again and waits for
// the collection, so that every seed sees one.
func (w *world) draFinalCollect() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared })
	for i := 0; c == nil && i < nodeCount; i++ {
		for _, p := range []poolDef{poolDefs[3], poolDefs[4]} {
			nc := &draClaim{node: i, what: "rail", pool: p, rail: p.rail}
			if w.draSchedule(nc) && nc.state == claimPrepared {
				c = nc
				break
			}
		}
	}
	if c == nil {
		w.tracef("final: no claim could be prepared, so none is deleted while its daemon is down")
		return
	}
	w.killDaemon(c.node)
	w.tracef("kill -9 ipam-node on %s", w.nodes[c.node].name)
	w.draDeleteDown(c)
	w.startDaemon(c.node)
	for len(w.collect) > 0 {
		w.check() // fails once the deadline has passed
		time.Sleep(200 * time.Millisecond)
	}
}

func goneKeys(m map[types.UID]*draGone) map[string]struct{} {
	out := make(map[string]struct{}, len(m))
	for k := range m {
		out[string(k)] = struct{}{}
	}
	return out
}

// draFinal runs with everything up: the claims deleted while their daemon was
// down are collected within the bound, every prepared claim prepares again to
// the same address, and every claim is unprepared and deleted.
func (w *world) draFinal() {
	for i := range w.nodes {
		if !w.draRegister(i, 30*time.Second) {
			w.fail("the DRA plugin of %s did not register within 30s of everything being up", w.nodes[i].name)
		}
	}
	w.deletedFinal()
	for len(w.collect) > 0 {
		w.check() // fails once a deadline has passed
		time.Sleep(500 * time.Millisecond)
	}
	w.draFinalCollect()
	w.portsFinal()
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		if c := w.claims[types.UID(uid)]; c.state == claimPrepared {
			w.draPrepare(c)
			if c.state != claimPrepared {
				w.fail("%s: prepare again with everything up failed", c)
			}
		}
	}
	w.check()
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		c := w.claims[types.UID(uid)]
		if c.pod != nil {
			if !w.nriConnected(c.node, 30*time.Second) {
				w.fail("the NRI plugin of %s did not connect within 30s of everything being up", w.nodes[c.node].name)
			}
			w.podStop(c, false)
		}
		w.unprepareUntilDone(c, "with everything up")
		w.draDelete(c)
		delete(w.claims, c.uid)
	}
	w.check()
	w.portsFinal()
	w.tracef("every claim unprepared and deleted")
}
