package nicdra_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/store"
)

// TestOwnershipIsTheMarkNotTheNetworkName: what Prepare allocates carries the
// owner mark, which the claim garbage collection goes by; a CNI allocation
// whose network a NAD named nic.hwipam.io (an old store's: the name is refused
// now) does not, so the collection never releases it however its container ID
// compares with claim UIDs. At start, an earlier version's allocation for a
// claim the checkpoint knows gets the mark; the NAD's does not.
func TestOwnershipIsTheMarkNotTheNetworkName(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	c := claim("u1", map[string]string{"nic": "pci-0000-18-00-0"})
	if _, err := p.Prepare(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	prepared := n.alloc.Allocations("")
	if len(prepared) == 0 {
		t.Fatal("Prepare allocated nothing")
	}
	for pool, list := range prepared {
		for _, a := range list {
			if !nicdra.OwnedByDRA(a) {
				t.Errorf("pool %s: the driver's allocation %+v is not marked as the driver's", pool, a)
			}
		}
	}
	// An old store: a NAD named nic.hwipam.io, and a claim prepared by the
	// version before the mark (its UID in the checkpoint).
	now := time.Now()
	nad := store.Allocation{ContainerID: "cni-container", IfName: "net1", IP: "10.99.0.5", PodName: "nad-pod", PodNamespace: "ml",
		PodUID: "nad-uid", Network: nicdra.DriverName, CreateTime: now}
	old := store.Allocation{ContainerID: "old-claim", IfName: "nic:pci-0000-19-00-0", IP: "10.99.0.6", PodName: "trainer",
		PodNamespace: "ml", PodUID: "pod-uid", Network: nicdra.DriverName, CreateTime: now}
	if err := n.st.Commit([]store.Put{{PoolKey: "spare", Allocation: nad}, {PoolKey: "spare", Allocation: old}}, nil); err != nil {
		t.Fatal(err)
	}
	if nicdra.OwnedByDRA(nad) || nicdra.OwnedByDRA(old) {
		t.Fatal("an allocation without the mark counts as the driver's")
	}
	n.open(t) // the daemon restarts over the old store
	claims := map[types.UID]nicdra.PreparedClaim{"old-claim": {Namespace: "ml", Name: "c-old", State: nicdra.PrepareCompleted}}
	marked, err := nicdra.MarkLegacy(t.Context(), claims, func(fn func(string, store.Allocation) error) error {
		return n.alloc.EachAllocation("", fn)
	}, n.alloc.SetOwner)
	if err != nil || marked != 1 {
		t.Fatalf("MarkLegacy: %d marked, %v; want the old claim's one", marked, err)
	}
	owned := map[string]bool{}
	for _, list := range n.alloc.Allocations("") {
		for _, a := range list {
			owned[a.ContainerID] = nicdra.OwnedByDRA(a)
		}
	}
	if !owned["old-claim"] || owned["cni-container"] || !owned["u1"] {
		t.Errorf("owned by the driver after the mark: %v; want old-claim and u1, not the NAD's cni-container", owned)
	}
}
