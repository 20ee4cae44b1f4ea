package nicdra_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/test/harness"
)

// claimLists counts the requests that list ResourceClaims (of a namespace or
// of all), as the API server sees them.
type claimLists struct {
	rt    http.RoundTripper
	lists atomic.Int64
}

var claimList = regexp.MustCompile(`^/apis/resource\.k8s\.io/v1/(namespaces/[^/]+/)?resourceclaims$`)

func (c *claimLists) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && claimList.MatchString(r.URL.Path) {
		c.lists.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// runDriver runs the driver of node n on the control plane as node dgx-1,
// with its kubelet registered, until the test ends.
func runDriver(t *testing.T, cs kubernetes.Interface, n *node, opts ...func(*nicdra.Driver)) (*nicdra.Driver, *kubelet) {
	t.Helper()
	d, k, _ := startDriver(t, cs, n, opts...)
	if _, err := k.reg.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	return d, k
}

// startDriver runs the driver of node n on the control plane as node
// dgx-1 until the test ends, and returns it once its sockets are there, with
// a kubelet that has not registered it yet, and the kubelet directory.
func startDriver(t *testing.T, cs kubernetes.Interface, n *node, opts ...func(*nicdra.Driver)) (*nicdra.Driver, *kubelet, string) {
	t.Helper()
	ctx := t.Context()
	kubeletDir, err := os.MkdirTemp("", "kl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(kubeletDir) })
	d := &nicdra.Driver{NodeName: "dgx-1", Client: cs, Preparer: n.preparer(), KubeletDir: kubeletDir,
		Inventory:   func() (*nicdiscovery.Inventory, error) { return n.inv, nil },
		PoolsByRail: func() (map[string][]string, bool) { return map[string][]string{"ibp24s0": {"rail0", "rail0-v6"}}, true },
		Allocations: func(fn func(string, store.Allocation) error) error { return n.alloc.EachAllocation("", fn) },
		Release:     n.alloc.ReleaseIf, RefreshInterval: 200 * time.Millisecond, GCInterval: 300 * time.Millisecond,
		Log: testr.New(t)}
	for _, o := range opts {
		o(d)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("the driver stopped with %v", err)
		}
	})
	waitFor(t, "the plugin's sockets", func() error {
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("the driver stopped: %w", err)
		default:
		}
		for _, p := range []string{nicdra.RegistrationSocket(kubeletDir), nicdra.PluginSocket(kubeletDir)} {
			if _, err := os.Stat(p); err != nil {
				return err
			}
		}
		return nil
	})
	k := &kubelet{dra: drapb.NewDRAPluginClient(dial(t, nicdra.PluginSocket(kubeletDir))),
		reg: registerapi.NewRegistrationClient(dial(t, nicdra.RegistrationSocket(kubeletDir)))}
	return d, k, kubeletDir
}

// controlPlane starts an API server with node dgx-1 and namespace ml.
func controlPlane(t *testing.T) (*rest.Config, kubernetes.Interface) {
	t.Helper()
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dgx-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cp.Config, cs
}

func driverStatus(t *testing.T, d *nicdra.Driver) nicdra.DriverStatus {
	t.Helper()
	st, _, err := nicdra.ReadStatus(nicdra.StatusFile(d.Preparer.Checkpoint.Path))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func sliceDevices(t *testing.T, cs kubernetes.Interface) int {
	t.Helper()
	l, err := cs.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{FieldSelector: "spec.driver=" + nicdra.DriverName})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range l.Items {
		n += len(s.Spec.Devices)
	}
	return n
}

// A damaged checkpoint does not stop the driver (and so not ipam-node): it
// serves the kubelet, refusing every prepare and unprepare with an error that
// names the file and says what to do, publishes no device, collects nothing,
// and says so in its status file. Once the file is moved away it prepares
// again, without a restart.
func TestDriverRefusesOnADamagedCheckpoint(t *testing.T) {
	n := newNode(t)
	path := filepath.Join(n.dir, "checkpoint.json")
	if err := os.WriteFile(path, []byte(`{"version": 1, "claims": {`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, cs := controlPlane(t)
	// An allocation of a claim that does not exist: a collection would release it.
	if _, err := n.alloc.Allocate(t.Context(), &nodealloc.Request{Pools: []string{"spare"}, Kind: v1alpha1.KindIPPool,
		ContainerID: orphanClaim, IfName: "nic:pci-0000-3b-00-0",
		Meta: nodealloc.Metadata{Network: nicdra.DriverName, Owner: nicdra.OwnerDRA, PodName: "gone", PodNamespace: "ml"}}); err != nil {
		t.Fatal(err)
	}
	d, k := runDriver(t, cs, n)
	waitFor(t, "the checkpoint's damage in the status file", func() error {
		if st := driverStatus(t, d); !strings.Contains(st.CheckpointError, path) || !strings.Contains(st.CheckpointError, "is damaged") {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	c := allocated(t, cs, "c1", "pci-0000-18-00-0")
	for _, e := range []string{k.prepare(t, c).GetError(), k.unprepare(t, c)} {
		if !strings.Contains(e, "is damaged") || !strings.Contains(e, path) || !strings.Contains(e, "moved away") {
			t.Errorf("refusal %q, want the file, its damage and what to do", e)
		}
	}
	time.Sleep(time.Second) // collections and refreshes
	if got := sliceDevices(t, cs); got != 0 {
		t.Errorf("%d devices published while every prepare is refused", got)
	}
	if h := heldBy(t, n); len(h) != 1 {
		t.Errorf("the store holds %v: a collection ran on a damaged checkpoint", h)
	}
	// The operator moves the file away: the driver works again.
	if err := os.Rename(path, path+".damaged"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a prepare after the file was moved away", func() error {
		if e := k.prepare(t, c).GetError(); e != "" {
			return errors.New(e)
		}
		return nil
	})
	waitFor(t, "the status and slices after the repair", func() error {
		if st := driverStatus(t, d); st.CheckpointError != "" || sliceDevices(t, cs) == 0 {
			return fmt.Errorf("status %+v, %d devices", st, sliceDevices(t, cs))
		}
		return nil
	})
}

// The driver's recovery on a real API server:
//   - the claim garbage collection reads the checkpoint's claims by name and
//     lists claims only when the store has an allocation the checkpoint does
//     not know, which it then releases;
//   - a pod reserved on a prepared claim besides its pod is refused when its
//     sandbox starts;
//   - a MAC the attach learnt after the first status write reaches the claim;
//   - a publication error is cleared once the slices are there;
//   - a claim deleted and re-created under its name is not written to, and
//     the one prepared is released.
func TestDriverRecovers(t *testing.T) {
	n := newNode(t)
	cfg, _ := controlPlane(t)
	counted := rest.CopyConfig(cfg)
	lists := &claimLists{}
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper { lists.rt = rt; return lists })
	cs, err := kubernetes.NewForConfig(counted)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	d, k := runDriver(t, cs, n)
	c1 := allocated(t, cs, "c1", "pci-0000-18-00-0")
	c2 := allocated(t, cs, "c2", "pci-0000-40-00-0",
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{"apiVersion":"nic.hwipam.io/v1alpha1","kind":"NicConfig","pool":"spare"}`))
	for _, c := range []*resourceapi.ResourceClaim{c1, c2} {
		if e := k.prepare(t, c).GetError(); e != "" {
			t.Fatal(e)
		}
	}

	t.Run("collection by name", func(t *testing.T) {
		before := lists.lists.Load()
		time.Sleep(2 * time.Second) // several collections (every 300ms)
		if l := lists.lists.Load() - before; l != 0 {
			t.Errorf("%d listings of claims while every allocation is the checkpoint's", l)
		}
		if _, err := n.alloc.Allocate(ctx, &nodealloc.Request{Pools: []string{"spare"}, Kind: v1alpha1.KindIPPool,
			ContainerID: orphanClaim, IfName: "nic:pci-0000-3b-00-0",
			Meta: nodealloc.Metadata{Network: nicdra.DriverName, Owner: nicdra.OwnerDRA, PodName: "gone", PodNamespace: "ml"}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the orphan released", func() error {
			for _, h := range heldBy(t, n) {
				if strings.HasPrefix(h, orphanClaim+" ") {
					return fmt.Errorf("held %v", heldBy(t, n))
				}
			}
			return nil
		})
		if lists.lists.Load() == before {
			t.Errorf("the orphan was released without a listing of claims")
		}
	})

	t.Run("a second pod on a prepared claim", func(t *testing.T) {
		got, err := cs.ResourceV1().ResourceClaims("ml").Get(ctx, "c1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Status.ReservedFor = append(got.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods",
			Name: "second", UID: "uid-second"})
		if _, err := cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		nri := &nicdra.NRIPlugin{Devices: d.Preparer, Attacher: &nicdra.Attacher{}, Log: testr.New(t)}
		waitFor(t, "the second pod refused", func() error {
			err := nri.RunPodSandbox(ctx, &api.PodSandbox{Id: "sb", Uid: "uid-second", Name: "second", Namespace: "ml"})
			if !errors.Is(err, nicdra.ErrSharedClaim) || !strings.Contains(err.Error(), "ml/c1") {
				return fmt.Errorf("RunPodSandbox: %v", err)
			}
			return nil
		})
		if err := d.Preparer.Refusal(string(c1.Status.ReservedFor[0].UID)); err != nil {
			t.Errorf("the claim's own pod is refused: %v", err)
		}
	})

	t.Run("the MAC learnt at attach", func(t *testing.T) {
		time.Sleep(time.Second) // the status of every claim written once more after the prepare
		dev := d.Preparer.PodDevices(string(c2.Status.ReservedFor[0].UID))[0]
		dev.MAC = "02:00:00:00:0a:0b"
		d.Preparer.DeviceAttached(string(c2.Status.ReservedFor[0].UID), dev)
		waitFor(t, "the MAC in the claim's status", func() error {
			got, err := cs.ResourceV1().ResourceClaims("ml").Get(ctx, "c2", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(got.Status.Devices) != 1 || got.Status.Devices[0].NetworkData == nil ||
				got.Status.Devices[0].NetworkData.HardwareAddress != dev.MAC {
				return fmt.Errorf("status %+v", got.Status.Devices)
			}
			return nil
		})
	})

	t.Run("a publication error cleared", func(t *testing.T) {
		at := time.Now()
		d.HandleError(ctx, fmt.Errorf("an injected error: %w", kubeletplugin.ErrRecoverable), "publishing the slices")
		waitFor(t, "the publication error cleared", func() error {
			if st := driverStatus(t, d); st.PublishError != "" || !st.Updated.After(at) {
				return fmt.Errorf("status %+v", st)
			}
			return nil
		})
	})

	t.Run("a claim re-created under its name", func(t *testing.T) {
		if err := cs.ResourceV1().ResourceClaims("ml").Delete(ctx, "c2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		again := allocated(t, cs, "c2", "pci-0000-40-00-0")
		waitFor(t, "the replaced claim released", func() error {
			if h := heldOf(t, n, c2.UID); len(h) != 0 {
				return fmt.Errorf("held %v", h)
			}
			if _, ok := n.fileClaims(t)[c2.UID]; ok {
				return errors.New("still in the checkpoint")
			}
			return nil
		})
		time.Sleep(500 * time.Millisecond) // status refreshes
		got, err := cs.ResourceV1().ResourceClaims("ml").Get(ctx, "c2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.UID != again.UID || len(got.Status.Devices) != 0 {
			t.Errorf("the re-created claim got a status: %+v", got.Status.Devices)
		}
	})
}

// A tenant may remove its claim's delete-protection finalizer and delete the
// claim while its pod runs. The claim garbage collection then keeps the claim's
// addresses (and ports) until the pod stops, and the driver's status says why;
// once the pod has stopped it releases them. It used to release them at once:
// the pool handed the address still up on the port in the running pod to the
// next claim (issue 45, item 1).
func TestDeletedClaimOfARunningPodIsKept(t *testing.T) {
	n := newNode(t)
	cfg, _ := controlPlane(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	d, k := runDriver(t, cs, n)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "ml"},
		Spec: corev1.PodSpec{NodeName: "dgx-1", Containers: []corev1.Container{{Name: "train", Image: "busybox"}}}}
	if pod, err = cs.CoreV1().Pods("ml").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setPhase := func(phase corev1.PodPhase) {
		t.Helper()
		pod.Status.Phase = phase
		if pod, err = cs.CoreV1().Pods("ml").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setPhase(corev1.PodRunning)
	c := allocatedFor(t, cs, "c-run", "pci-0000-18-00-0", pod.Name, pod.UID)
	deletedButKept(t, cs, d, k, n, c, "ml/trainer still runs")
	if _, ok := n.fileClaims(t)[c.UID]; !ok {
		t.Fatal("the claim of a running pod, deleted, is no longer in the checkpoint")
	}
	setPhase(corev1.PodSucceeded)
	waitFor(t, "the claim released once its pod stopped", func() error {
		if h := heldOf(t, n, c.UID); len(h) != 0 {
			return fmt.Errorf("held %v", h)
		}
		if _, ok := n.fileClaims(t)[c.UID]; ok {
			return errors.New("still in the checkpoint")
		}
		for _, f := range driverStatus(t, d).Failures {
			if f.Op == nicdra.WaitingRelease {
				return fmt.Errorf("the status still says it waits: %+v", f)
			}
		}
		return nil
	})
}

// A restarted ipam-node has not heard from the runtime which sandboxes run
// until its NRI plugin synchronizes: a claim deleted meanwhile whose pod the
// API server no longer has (deleted with --force, the sandbox still running)
// keeps its addresses until the runtime says its sandbox does not run.
func TestDeletedClaimKeptUntilTheRuntimeSaysItsPodStopped(t *testing.T) {
	ctx := t.Context()
	n, cs, d, k := driverOnAPIServer(t, func(d *nicdra.Driver) {
		// A runtime that never answers: the plugin never synchronizes here.
		d.NRI = &nicdra.NRIPlugin{Devices: d.Preparer, Attacher: &nicdra.Attacher{}, Log: testr.New(t)}
		d.NRISocket = filepath.Join(t.TempDir(), "nri.sock")
		d.NRIWait = 100 * time.Millisecond
	})
	c := allocatedFor(t, cs, "c-forced", "pci-0000-18-00-0", "forced", "uid-forced")
	deletedButKept(t, cs, d, k, n, c, "not yet heard from the runtime")
	// The runtime says which sandboxes run: not this pod's.
	if _, err := d.NRI.Synchronize(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim released once the runtime said its pod does not run", func() error {
		if h := heldOf(t, n, c.UID); len(h) != 0 {
			return fmt.Errorf("held %v", h)
		}
		return nil
	})
}

// A failed prepare reaches the driver's status file (ipamctl check) within a
// second, not at the next refresh; and so does its clearing by a prepare that
// succeeds.
func TestFailureReachesTheStatusFileAtOnce(t *testing.T) {
	_, cs, d, k := driverOnAPIServer(t, func(d *nicdra.Driver) { d.RefreshInterval = time.Hour })
	failed := func() bool {
		for _, f := range driverStatus(t, d).Failures {
			if f.Op == nicdra.FailedPrepare && f.Claim == "ml/c-bad" {
				return true
			}
		}
		return false
	}
	within := func(what string, want bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for failed() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the status file has %+v after 2 s", what, driverStatus(t, d).Failures)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(500 * time.Millisecond) // the status file's first write, at start
	c := allocated(t, cs, "c-bad", "pci-0000-18-00-0",
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{"apiVersion":"nic.hwipam.io/v1alpha1","kind":"NicConfig","pool":"no-such-pool"}`))
	if e := k.prepare(t, c).GetError(); e == "" {
		t.Fatal("a claim naming an unknown pool was prepared")
	}
	within("the failed prepare", true)
	// The tenant fixes the claim (a new one of that name), which prepares.
	if err := cs.ResourceV1().ResourceClaims("ml").Delete(t.Context(), c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c = allocated(t, cs, "c-bad", "pci-0000-18-00-0")
	if e := k.prepare(t, c).GetError(); e != "" {
		t.Fatal(e)
	}
	within("the prepare that succeeded", false)
}

// deletedButKept prepares claim c, deletes it, and checks that the claim
// collection keeps its addresses, its driver's status saying why (with why in
// the message).
func deletedButKept(t *testing.T, cs kubernetes.Interface, d *nicdra.Driver, k *kubelet, n *node, c *resourceapi.ResourceClaim,
	why string) {
	t.Helper()
	if e := k.prepare(t, c).GetError(); e != "" {
		t.Fatal(e)
	}
	held := heldOf(t, n, c.UID)
	if len(held) == 0 {
		t.Fatal("the prepared claim holds no address")
	}
	if err := cs.ResourceV1().ResourceClaims(c.Namespace).Delete(t.Context(), c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	name := c.Namespace + "/" + c.Name
	waitFor(t, "the driver's status saying why the deleted claim is kept", func() error {
		for _, f := range driverStatus(t, d).Failures {
			if f.Op == nicdra.WaitingRelease && f.Claim == name && strings.Contains(f.Message, why) {
				return nil
			}
		}
		return fmt.Errorf("status %+v", driverStatus(t, d).Failures)
	})
	time.Sleep(time.Second) // more collections (every 300ms)
	if got := heldOf(t, n, c.UID); !slices.Equal(got, held) {
		t.Fatalf("claim %s, deleted while its pod may run, holds %v; it held %v", name, got, held)
	}
}

// driverOnAPIServer runs a node's driver, changed by opts, on a control plane of
// its own, registered with a kubelet.
func driverOnAPIServer(t *testing.T, opts ...func(*nicdra.Driver)) (*node, kubernetes.Interface, *nicdra.Driver, *kubelet) {
	t.Helper()
	n := newNode(t)
	cfg, _ := controlPlane(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, k := runDriver(t, cs, n, opts...)
	return n, cs, d, k
}
