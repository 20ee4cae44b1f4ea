package nicdra_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// kubelet is the test's stand-in for the kubelet: it calls the plugin's
// registration and DRA sockets as the kubelet does.
type kubelet struct {
	dra drapb.DRAPluginClient
	reg registerapi.RegistrationClient
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func (k *kubelet) prepare(t *testing.T, c *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
	t.Helper()
	resp, err := k.dra.NodePrepareResources(t.Context(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Claims[string(c.UID)]
}

func (k *kubelet) unprepare(t *testing.T, c *resourceapi.ResourceClaim) string {
	t.Helper()
	resp, err := k.dra.NodeUnprepareResources(t.Context(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Claims[string(c.UID)].GetError()
}

// allocated creates a claim for one nic.hwipam.io device and writes the
// scheduler's part of its status: the device allocated on the node, the claim
// reserved for a pod.
func allocated(t *testing.T, cs kubernetes.Interface, name, device string, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	t.Helper()
	return allocatedFor(t, cs, name, device, "pod-"+name, "", configs...)
}

// allocatedFor is allocated, reserved for the pod podName with podUID (when
// empty, "uid-pod-" and the claim's UID).
func allocatedFor(t *testing.T, cs kubernetes.Interface, name, device, podName string, podUID types.UID,
	configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	t.Helper()
	ctx := t.Context()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName}}}}}}
	c, err := cs.ResourceV1().ResourceClaims("ml").Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "nic", Driver: nicdra.DriverName, Pool: "dgx-1", Device: device}}, Config: configs}}
	if podUID == "" {
		podUID = "uid-pod-" + c.UID
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: podName, UID: podUID}}
	if c, err = cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The driver on a real API server, called as the kubelet calls it: it
// registers, publishes the DGX-H100 tree's ports, prepares a claim (status
// and store), refuses a device another claim holds, unprepares, and releases
// by claim UID what claims deleted behind its back held — and only that.
func TestDriverWithKubelet(t *testing.T) {
	n := newNode(t)
	_, cs := controlPlane(t)
	ctx := t.Context()
	d, k, kubeletDir := startDriver(t, cs, n)
	info, err := k.reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != nicdra.DriverName || info.Endpoint != nicdra.PluginSocket(kubeletDir) {
		t.Errorf("registration info %+v", info)
	}
	if ok, why := d.Registered(); ok {
		t.Errorf("registered before the kubelet said so (%s)", why)
	}
	if _, err := k.reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if ok, why := d.Registered(); !ok {
		t.Errorf("not registered after the kubelet said so: %s", why)
	}
	waitFor(t, "the status file", func() error {
		st, ok, err := nicdra.ReadStatus(nicdra.StatusFile(d.Preparer.Checkpoint.Path))
		switch {
		case err != nil:
			return err
		case !ok || !st.Registered || st.Devices == 0 || st.KubeletDir != kubeletDir:
			return fmt.Errorf("status %+v (file there: %t)", st, ok)
		}
		return nil
	})

	// The slices: every port of the tree, owned by the Node.
	want, _ := nicdra.Devices(nicdra.Publish{Inventory: n.inv, PoolsByRail: map[string][]string{"ibp24s0": {"rail0", "rail0-v6"}}})
	waitFor(t, "the ResourceSlices", func() error {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + nicdra.DriverName})
		if err != nil {
			return err
		}
		var names []string
		for _, s := range l.Items {
			if s.Spec.NodeName == nil || *s.Spec.NodeName != "dgx-1" || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" {
				return fmt.Errorf("slice %s: node %v, owners %v", s.Name, s.Spec.NodeName, s.OwnerReferences)
			}
			for _, dev := range s.Spec.Devices {
				names = append(names, dev.Name)
			}
		}
		if len(names) != len(want) || len(want) == 0 {
			return fmt.Errorf("%d devices published, want %d", len(names), len(want))
		}
		return nil
	})

	// Prepare: the addresses of the rail's pools, in the store and the status.
	c1 := allocated(t, cs, "c1", "pci-0000-18-00-0")
	r := k.prepare(t, c1)
	if r.GetError() != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "pci-0000-18-00-0" || r.Devices[0].PoolName != "dgx-1" {
		t.Fatalf("prepare: %+v", r)
	}
	got, err := cs.ResourceV1().ResourceClaims("ml").Get(ctx, "c1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].NetworkData == nil || len(got.Status.Devices[0].NetworkData.IPs) != 2 {
		t.Fatalf("claim status %+v", got.Status.Devices)
	}
	ips := got.Status.Devices[0].NetworkData.IPs
	held := heldBy(t, n)
	if len(held) != 2 || !strings.Contains(held[0], string(c1.UID)) || !strings.HasSuffix(ips[0], "/16") {
		t.Fatalf("store holds %v, status says %v", held, ips)
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(held, func(h string) bool { return strings.HasSuffix(h, " "+strings.Split(ip, "/")[0]) }) {
			t.Errorf("status address %s is not in the store (%v)", ip, held)
		}
	}
	// Again: the same, nothing more allocated.
	allocs := n.alloc.allocs
	if r := k.prepare(t, c1); r.GetError() != "" || n.alloc.allocs != allocs {
		t.Errorf("second prepare: %+v, %d allocations more", r, n.alloc.allocs-allocs)
	}
	// A second claim for the same device is refused, and gets nothing.
	c2 := allocated(t, cs, "c2", "pci-0000-18-00-0")
	if r := k.prepare(t, c2); !strings.Contains(r.GetError(), "in use by claim ml/c1") {
		t.Errorf("a second claim for the device: %+v", r)
	}
	if h := heldBy(t, n); !slices.Equal(h, held) {
		t.Errorf("after the refused claim the store holds %v, want %v", h, held)
	}
	// Unprepare releases; again is no error.
	for range 2 {
		if e := k.unprepare(t, c1); e != "" {
			t.Fatal(e)
		}
	}
	if h := heldBy(t, n); len(h) != 0 {
		t.Fatalf("after unprepare the store holds %v", h)
	}

	// Garbage collection: c3 is prepared, then deleted while no unprepare
	// comes (the daemon was down); an allocation of a claim UID the checkpoint
	// does not know (a lost checkpoint), and c4 which exists, prepared.
	c3 := allocated(t, cs, "c3", "pci-0000-18-00-0")
	if r := k.prepare(t, c3); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	c4 := allocated(t, cs, "c4", "pci-0000-40-00-0",
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{"apiVersion":"nic.hwipam.io/v1alpha1","kind":"NicConfig","pool":"spare"}`))
	if r := k.prepare(t, c4); r.GetError() != "" {
		t.Fatal(r.GetError())
	}
	if _, err := n.alloc.Allocate(ctx, &nodealloc.Request{Pools: []string{"spare"}, Kind: v1alpha1.KindIPPool,
		ContainerID: orphanClaim, IfName: "nic:pci-0000-3b-00-0",
		Meta: nodealloc.Metadata{Network: nicdra.DriverName, Owner: nicdra.OwnerDRA, PodName: "gone", PodNamespace: "ml"}}); err != nil {
		t.Fatal(err)
	}
	if err := cs.ResourceV1().ResourceClaims("ml").Delete(ctx, "c3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the garbage collection of c3 and the unknown claim", func() error {
		h := heldBy(t, n)
		for _, x := range h {
			if strings.Contains(x, string(c3.UID)) || strings.HasPrefix(x, orphanClaim+" ") {
				return fmt.Errorf("still held: %v", h)
			}
		}
		if len(h) != 1 || !strings.Contains(h[0], string(c4.UID)) {
			return fmt.Errorf("held %v, want c4's one address", h)
		}
		return nil
	})
	claims, err := d.Preparer.Claims()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := claims[c3.UID]; ok || len(claims) != 1 {
		t.Errorf("checkpoint after the garbage collection: %v", claims)
	}
	// Many collections later, c4 (which exists) still holds its address.
	time.Sleep(time.Second)
	if h := heldBy(t, n); len(h) != 1 {
		t.Errorf("c4's address was released: %v", h)
	}
}

// orphanClaim is the claim UID of an allocation the checkpoint does not know.
// The tests find it by the whole UID: a random claim UID may contain any part.
const orphanClaim = "0d5c0e8a-0000-4000-8000-00000000dead"

// heldBy lists the node's allocations as "<container ID> <ip>", sorted.
func heldBy(t *testing.T, n *node) []string {
	t.Helper()
	var out []string
	if err := n.alloc.EachAllocation("", func(_ string, a store.Allocation) error {
		out = append(out, a.ContainerID+" "+a.IP)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}
