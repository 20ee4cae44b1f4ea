package ipamnode_test

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/test/harness"
)

// TestCleanupKeepsStaticPods: a static pod's allocation carries the UID the
// kubelet gave it, which the API server shows only in its mirror pod's
// kubernetes.io/config.mirror annotation; the mirror pod's own UID differs. The
// cleaner keeps such an allocation, and releases one whose static pod the kubelet
// has replaced (the mirror names another UID).
func TestCleanupKeepsStaticPods(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "p", "10.14.0.0/24", "10.14.0.1", "10.14.0.8")
	mirror := func(name, staticUID string) {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
				Annotations: map[string]string{corev1.MirrorPodAnnotationKey: staticUID, "kubernetes.io/config.hash": staticUID}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		if string(pod.UID) == staticUID {
			t.Fatalf("the API server gave mirror pod %s the static pod's UID; the test means nothing", name)
		}
	}
	// What the kubelet derives from the manifests; the old pod's manifest changed.
	mirror("etcd-"+node, "c1b2a39a7d4b2f1e0d8e6f5a4b3c2d1e")
	mirror("proxy-"+node, "9f8e7d6c5b4a39281706f5e4d3c2b1a0")
	d := startDaemon(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) {
		o.CleanupInterval, o.CleanupMisses = 200*time.Millisecond, 3
	})
	alloc := func(cid, pod, uid string) {
		t.Helper()
		prm := params(cid, "p")
		prm.Metadata = &nodev1.IPAMMetadata{K8SPodName: pod, K8SPodNamespace: "default", K8SPodUid: uid}
		waitFor(t, "allocation "+cid, func() bool {
			_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: prm})
			return err == nil
		})
	}
	alloc("static", "etcd-"+node, "c1b2a39a7d4b2f1e0d8e6f5a4b3c2d1e")
	alloc("replaced", "proxy-"+node, "0000000000000000000000000000dead")
	waitFor(t, "the replaced static pod's allocation to be released", func() bool {
		_, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("replaced", "p")})
		return code(err) == codes.NotFound
	})
	time.Sleep(time.Second) // five more sweeps
	if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("static", "p")}); err != nil {
		t.Errorf("a live static pod's allocation was released: %v", err)
	}
}

// podRequests counts the requests a daemon makes for pods, by what they are:
// "get <name>" (one pod), "list" and "watch" (with the field selector they carry).
type podRequests struct {
	mu     sync.Mutex
	counts map[string]int
}

// config returns cfg with every pod request counted into r.
func (r *podRequests) config(cfg *rest.Config) *rest.Config {
	r.counts = map[string]int{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			r.record(req)
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

func (r *podRequests) record(req *http.Request) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	if req.Method != http.MethodGet || len(parts) < 3 || parts[0] != "api" {
		return
	}
	var kind string
	switch {
	case parts[len(parts)-1] == "pods" && req.URL.Query().Get("watch") == "true":
		kind = "watch " + req.URL.Query().Get("fieldSelector")
	case parts[len(parts)-1] == "pods":
		kind = "list " + req.URL.Query().Get("fieldSelector")
	case len(parts) == 6 && parts[4] == "pods":
		kind = "get " + parts[5]
	default:
		return
	}
	r.mu.Lock()
	r.counts[kind]++
	r.mu.Unlock()
}

func (r *podRequests) get(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[kind]
}

func (r *podRequests) gets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, v := range r.counts {
		if strings.HasPrefix(k, "get ") {
			n += v
		}
	}
	return n
}

// now deletes a pod at once: one bound to a node is otherwise only marked for
// deletion until its kubelet confirms (and until then exists, so is kept).
var now = client.GracePeriodSeconds(0)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// cleanupPod creates a pod in default, bound to nodeName when it is not empty.
func cleanupPod(t *testing.T, c client.Client, name, nodeName string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// allocFor allocates an address in pool p for cid, with pod's metadata.
func allocFor(t *testing.T, d *daemon, cid string, pod *corev1.Pod) {
	t.Helper()
	prm := params(cid, "p")
	prm.Metadata = &nodev1.IPAMMetadata{K8SPodName: pod.Name, K8SPodNamespace: pod.Namespace, K8SPodUid: string(pod.UID)}
	waitFor(t, "allocation "+cid, func() bool {
		_, err := d.ipam.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: prm})
		return err == nil
	})
}

func allocated(t *testing.T, d *daemon, cid string) bool {
	t.Helper()
	_, err := d.ipam.IsAllocated(t.Context(), &nodev1.IsAllocatedRequest{Parameters: params(cid, "p")})
	switch code(err) {
	case codes.OK:
		return true
	case codes.NotFound:
		return false
	}
	t.Fatalf("IsAllocated %s: %v", cid, err)
	return false
}

// TestCleanupReadsTheNodesPodInformer: the cleaner checks allocations against an
// informer of the pods bound to its node, not a GET per allocation: live pods cost
// no request however many sweeps run. A deleted pod's allocation goes after three
// missed sweeps (not sooner), confirmed by one GET; so does one whose pod was
// re-created under its name (another UID). An allocation without pod metadata is
// kept as long as a pod of its name exists.
func TestCleanupReadsTheNodesPodInformer(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "p", "10.15.0.0/24", "10.15.0.1", "10.15.0.16")
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"live-0", "live-1", "live-2", "doomed", "replaced"} {
		pods[name] = cleanupPod(t, c, name, node)
	}
	cleanupPod(t, c, "elsewhere", "worker-2") // another node's pod: not in the informer
	const interval = 300 * time.Millisecond
	var reqs podRequests
	d := startDaemon(t, reqs.config(cp.Config), t.TempDir(), func(o *ipamnode.Options) {
		o.CleanupInterval, o.CleanupMisses = interval, 3
	})
	for name, pod := range pods {
		allocFor(t, d, name, pod)
	}
	noUID := *pods["live-2"]
	noUID.UID = "" // an allocation without the pod's UID matches the pod of its name
	allocFor(t, d, "no-uid", &noUID)

	time.Sleep(10 * interval)
	selector := "spec.nodeName=" + node
	if reqs.get("list "+selector)+reqs.get("watch "+selector) == 0 {
		t.Errorf("no list or watch of pods with fieldSelector %s; requests: %v", selector, reqs.counts)
	}
	if n := reqs.gets(); n != 0 {
		t.Errorf("%d pod GETs over ten sweeps of live pods, want none", n)
	}

	if err := c.Delete(ctx, pods["doomed"], now); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitFor(t, "the deleted pod's allocation to be released", func() bool { return !allocated(t, d, "doomed") })
	// Three sweeps that miss the pod span at least two intervals.
	if took := time.Since(deleted); took < 2*interval-50*time.Millisecond {
		t.Errorf("released %s after the pod was deleted, before three sweeps (interval %s) could miss it", took, interval)
	}
	if n := reqs.get("get doomed"); n != 1 {
		t.Errorf("%d GETs of the deleted pod, want the one that confirms it is gone", n)
	}

	if err := c.Delete(ctx, pods["replaced"], now); err != nil {
		t.Fatal(err)
	}
	cleanupPod(t, c, "replaced", node)
	waitFor(t, "the replaced pod's allocation to be released", func() bool { return !allocated(t, d, "replaced") })

	time.Sleep(5 * interval)
	for _, cid := range []string{"live-0", "live-1", "live-2", "no-uid"} {
		if !allocated(t, d, cid) {
			t.Errorf("allocation %s was released", cid)
		}
	}
	if n := reqs.get("get live-0") + reqs.get("get live-1") + reqs.get("get live-2"); n != 0 {
		t.Errorf("%d GETs of live pods, want none", n)
	}
}

// TestCleanupKeepsPodsTheInformerDoesNotShow: a pod the node's informer does not
// show (not bound yet, as a pod whose binding the informer has not seen) but the
// API server has is never released: after three misses the confirming GET finds
// it, and the count starts again. Once the pod is bound the informer shows it and
// the GETs stop.
func TestCleanupKeepsPodsTheInformerDoesNotShow(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "p", "10.16.0.0/24", "10.16.0.1", "10.16.0.8")
	const interval = 100 * time.Millisecond
	var reqs podRequests
	d := startDaemon(t, reqs.config(cp.Config), t.TempDir(), func(o *ipamnode.Options) {
		o.CleanupInterval, o.CleanupMisses = interval, 3
	})
	pending := cleanupPod(t, c, "pending", "")
	allocFor(t, d, "pending", pending)
	waitFor(t, "two confirming GETs of the pod the informer lacks", func() bool {
		return reqs.get("get pending") >= 2 || !allocated(t, d, "pending")
	})
	if !allocated(t, d, "pending") {
		t.Fatal("the allocation of a pod that exists, but is not in the node's informer yet, was released")
	}

	if err := cp.Clientset.CoreV1().Pods("default").Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "pending"},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * interval) // the informer sees the binding; a count already at two may still GET once
	before := reqs.get("get pending")
	time.Sleep(10 * interval)
	if n := reqs.get("get pending") - before; n != 0 {
		t.Errorf("%d GETs of a pod the informer shows, want none", n)
	}
	if !allocated(t, d, "pending") {
		t.Error("a bound pod's allocation was released")
	}
}

// TestCleanupFallsBackToGetsWithoutListWatch: a service account that may only get
// pods (the daemon's RBAC before the informer) still has stale allocations
// released, by one GET per allocation, with exactly one warning and the
// stale-cleanup gauge at 0. Without even get the gauge is 1 and the old warning
// is logged. When list and watch are granted the cleaner goes back to the informer.
func TestCleanupFallsBackToGetsWithoutListWatch(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	grant := func(name string, rules ...rbacv1.PolicyRule) {
		t.Helper()
		if err := c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "get-only"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	grant("pools", rbacv1.PolicyRule{APIGroups: []string{"nv-ipam.nvidia.com"}, Resources: []string{"ippools", "cidrpools"},
		Verbs: []string{"list", "watch"}})
	restricted, err := cp.AddUser("get-only")
	if err != nil {
		t.Fatal(err)
	}
	restricted.QPS, restricted.Burst = 1000, 2000 // as the admin's: client-go's default 5/s would pace the sweeps
	poolWithBlock(t, c, "p", "10.17.0.0/24", "10.17.0.1", "10.17.0.8")
	live, doomed := cleanupPod(t, c, "live", node), cleanupPod(t, c, "doomed", node)

	var mu sync.Mutex
	var logs []string
	count := func(sub string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range logs {
			if strings.Contains(l, sub) {
				n++
			}
		}
		return n
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePortFor(t))
	gauge := func() string {
		t.Helper()
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, `hwipam_node_feature_forbidden{feature="stale-cleanup"} `); ok {
				return v
			}
		}
		return ""
	}
	const interval = 100 * time.Millisecond
	var reqs podRequests
	d := startDaemonLogged(t, reqs.config(restricted), t.TempDir(), func(o *ipamnode.Options) {
		o.CleanupInterval, o.CleanupMisses = interval, 3
		o.MetricsBindAddress = metricsAddr
		o.NICLabels, o.AnnotationInterval = ipamnode.NICLabelsOff, 0
	}, func(line string) {
		mu.Lock()
		logs = append(logs, line)
		mu.Unlock()
	})
	allocFor(t, d, "live", live)
	allocFor(t, d, "doomed", doomed)
	const refusedGet = "cannot read pods, stale allocations are not cleaned up"
	waitFor(t, "the warning that pods cannot be read", func() bool { return count(refusedGet) > 0 })
	waitFor(t, "the stale-cleanup gauge at 1", func() bool { return gauge() == "1" })
	if err := c.Delete(ctx, doomed, now); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * interval)
	if !allocated(t, d, "doomed") {
		t.Fatal("released an allocation without being able to read its pod")
	}

	grant("pods-get", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}})
	waitFor(t, "the deleted pod's allocation to be released by GETs", func() bool { return !allocated(t, d, "doomed") })
	if gauge() != "0" {
		t.Errorf("stale-cleanup gauge %q with get on pods, want 0", gauge())
	}
	const fallback = "cannot list and watch the pods of this node"
	time.Sleep(30 * interval) // several informer retries
	if n := count(fallback); n != 1 {
		t.Errorf("%d warnings that pods cannot be listed and watched, want exactly one", n)
	}
	if n := count(refusedGet); n != 1 {
		t.Errorf("%d warnings that pods cannot be read, want exactly one", n)
	}
	if n := reqs.get("get live"); n < 15 {
		t.Errorf("%d GETs of the live pod over 30 sweeps without list and watch, want one a sweep", n)
	}
	if !allocated(t, d, "live") {
		t.Error("a live pod's allocation was released")
	}

	grant("pods-watch", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}})
	waitFor(t, "the cleaner to return to the informer", func() bool { return count("listing and watching pods works now") == 1 })
	time.Sleep(2 * interval)
	before := reqs.get("get live")
	time.Sleep(10 * interval)
	if n := reqs.get("get live") - before; n != 0 {
		t.Errorf("%d GETs of the live pod with the informer back, want none", n)
	}
}

// An allocation made for a DRA claim (owner mark "dra") is never released by
// pod lookups, whatever they say: only its claim's unprepare or garbage
// collection releases it. Nor is one an earlier version made for a claim the
// DRA checkpoint knows (network nic.hwipam.io, no mark: marked at start). A
// CNI allocation of a pod that is gone is released beside them, also one
// whose NAD was named nic.hwipam.io (a network name decides nothing).
func TestCleanupLeavesClaimAllocations(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()
	poolWithBlock(t, cp.Client, "p", "10.15.0.0/24", "10.15.0.1", "10.15.0.8")
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	gone := func(cid, ifName, ip, network, owner string) store.Put {
		return store.Put{PoolKey: "p", Allocation: store.Allocation{ContainerID: cid, IfName: ifName, IP: ip,
			PodName: "gone", PodNamespace: "default", PodUID: "gone-uid", Network: network, Owner: owner, CreateTime: now}}
	}
	if err := st.Commit([]store.Put{
		gone("claim-uid", "nic:pci-0000-18-00-0", "10.15.0.2", nicdra.DriverName, nicdra.OwnerDRA),
		gone("old-claim-uid", "nic:pci-0000-19-00-0", "10.15.0.4", nicdra.DriverName, ""),
		gone("cni-cid", "net1", "10.15.0.3", "net-a", ""),
		gone("nad-cid", "net2", "10.15.0.5", nicdra.DriverName, ""),
	}, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// The checkpoint an earlier ipam-node left: it prepared old-claim-uid.
	if err := (nicdra.CheckpointFile{Path: nicdra.CheckpointBeside(filepath.Join(dir, "store"))}).Save(&nicdra.Checkpoint{
		Claims: map[types.UID]nicdra.PreparedClaim{"old-claim-uid": {Namespace: "default", Name: "c", State: nicdra.PrepareCompleted,
			Devices: []nicdra.PreparedDevice{{Request: "nic", Device: "pci-0000-19-00-0", Pools: []string{"p"}}}}},
	}); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cp.Config, dir, func(o *ipamnode.Options) {
		o.CleanupInterval, o.CleanupMisses = 200*time.Millisecond, 3
	})
	isAllocated := func(cid, ifName string) error {
		prm := params(cid, "p")
		prm.CniIfname = ifName
		_, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: prm})
		return err
	}
	waitFor(t, "the gone pods' CNI allocations to be released", func() bool {
		return code(isAllocated("cni-cid", "net1")) == codes.NotFound && code(isAllocated("nad-cid", "net2")) == codes.NotFound
	})
	time.Sleep(time.Second) // five more sweeps
	if err := isAllocated("claim-uid", "nic:pci-0000-18-00-0"); err != nil {
		t.Errorf("a DRA claim's allocation was released by pod lookups: %v", err)
	}
	if err := isAllocated("old-claim-uid", "nic:pci-0000-19-00-0"); err != nil {
		t.Errorf("a checkpointed claim's allocation from an earlier version was released by pod lookups: %v", err)
	}
}
