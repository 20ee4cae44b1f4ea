package ipamnode

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// poolLister answers the pool sync's listings with these IPPools (and no
// CIDRPool), as the API server would.
type poolLister struct {
	client.Reader
	ipPools []v1alpha1.IPPool
}

func (l poolLister) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	if ips, ok := list.(*v1alpha1.IPPoolList); ok {
		ips.Items = l.ipPools
	}
	return nil
}

// ipam-node's DRA driver takes a rail's pools from the pool sync: before its
// first listing they are unknown, not missing, and a prepare of a rail's
// device fails with nicdra.ErrNotReady (the kubelet retries), not with
// ErrUnknownPool ("label the rail's pool"); after the listing the same claim
// gets its address from the pool labelled for the rail.
func TestDRARailPoolsWaitForThePoolListing(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(st, "dgx-1")
	if err != nil {
		t.Fatal(err)
	}
	pools := &poolSync{manager: m, node: "dgx-1", namespace: "kube-system"}
	o := &Options{NodeName: "dgx-1", StoreFile: filepath.Join(dir, "store"), SysfsRoot: tree.Root}
	d, err := newDRADriver(o, &rest.Config{Host: "http://127.0.0.1:1"}, m, pools, nil, inventoryCache(tree.Root), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if names, known := d.Preparer.PoolsForRail("ibp24s0", v1alpha1.KindIPPool); known || names != nil {
		t.Errorf("before the listing: %v known=%t, want unknown", names, known)
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "nic", Namespace: "ml", UID: "claim-1"}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: nicdra.DriverName, Pool: "dgx-1",
			Device: nicdra.DeviceName("0000:18:00.0")}}}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: "pod-1"}}
	_, err = d.Preparer.Prepare(t.Context(), c)
	if !errors.Is(err, nicdra.ErrNotReady) || errors.Is(err, nodealloc.ErrUnknownPool) || !strings.Contains(err.Error(), "retries") {
		t.Errorf("prepare before the listing: %v, want ErrNotReady", err)
	}

	rail0 := v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: "kube-system",
		Labels: map[string]string{LabelRail: "ibp24s0"}},
		Spec:   v1alpha1.IPPoolSpec{Subnet: "10.24.0.0/16", PerNodeBlockSize: 16},
		Status: v1alpha1.IPPoolStatus{Allocations: []v1alpha1.Allocation{{NodeName: "dgx-1", StartIP: "10.24.0.1", EndIP: "10.24.0.16"}}}}
	if _, err := pools.sync(t.Context(), poolLister{ipPools: []v1alpha1.IPPool{rail0}}); err != nil {
		t.Fatal(err)
	}
	if names, known := d.Preparer.PoolsForRail("ibp24s0", v1alpha1.KindIPPool); !known || len(names) != 1 || names[0] != "rail0" {
		t.Errorf("after the listing: %v known=%t, want [rail0] known", names, known)
	}
	devs, err := d.Preparer.Prepare(t.Context(), c)
	if err != nil || len(devs) != 1 || len(devs[0].Addresses) != 1 || devs[0].Addresses[0] != "10.24.0.1/16" {
		t.Errorf("prepare after the listing: %+v %v", devs, err)
	}
}
