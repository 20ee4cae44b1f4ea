package ipamnode_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

func allocate(t *testing.T, d *daemon, cid, pool string) (*nodev1.AllocateResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(cid, pool)})
}

func setBlock(t *testing.T, c client.Client, pool, start, end string) {
	t.Helper()
	var p v1alpha1.IPPool
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: pool}, &p); err != nil {
		t.Fatal(err)
	}
	p.Status.Allocations = []v1alpha1.Allocation{{NodeName: node, StartIP: start, EndIP: end}}
	if err := c.Status().Update(t.Context(), &p); err != nil {
		t.Fatal(err)
	}
}

func deletePool(t *testing.T, c client.Client, name string) {
	t.Helper()
	if err := c.Delete(t.Context(), &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}); err != nil {
		t.Fatal(err)
	}
}

func inRange(t *testing.T, prefix, start, end string) bool {
	t.Helper()
	a := netip.MustParsePrefix(prefix).Addr()
	return !a.Less(netip.MustParseAddr(start)) && !netip.MustParseAddr(end).Less(a)
}

// TestRestartWithTheAPIServerUpFollowsThePoolStatus: the daemon restarts with the
// API server reachable after its block moved, a pool was deleted, and then every
// pool was deleted while it was down. The very first allocation after the restart
// follows the current pool status, never the stored blocks; the allocations held
// from before stay until released.
func TestRestartWithTheAPIServerUpFollowsThePoolStatus(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	poolWithBlock(t, c, "moved", "10.11.0.0/24", "10.11.0.1", "10.11.0.4")
	poolWithBlock(t, c, "gone", "10.12.0.0/24", "10.12.0.1", "10.12.0.4")
	dir := t.TempDir()
	d := startDaemon(t, cp.Config, dir, nil)
	for _, pool := range []string{"moved", "gone"} {
		waitFor(t, "the pools to sync", func() bool { _, err := allocate(t, d, "c1", pool); return err == nil })
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	// While the daemon is down, the controller moves this node's block of "moved"
	// and "gone" is deleted.
	setBlock(t, c, "moved", "10.11.0.9", "10.11.0.12")
	deletePool(t, c, "gone")
	d = startDaemon(t, cp.Config, dir, nil)
	if res, err := allocate(t, d, "c2", "moved"); err != nil || !inRange(t, res.Allocations[0].Ip, "10.11.0.9", "10.11.0.12") {
		t.Errorf("first allocation after the restart, block moved = %v %v, want an address in the new block 10.11.0.9-10.11.0.12", res, err)
	}
	if res, err := allocate(t, d, "c2", "gone"); code(err) != codes.NotFound {
		t.Errorf("first allocation after the restart, pool deleted = %v %v, want NotFound", res, err)
	}
	if _, err := d.ipam.IsAllocated(t.Context(), &nodev1.IsAllocatedRequest{Parameters: params("c1", "gone")}); err != nil {
		t.Errorf("the allocation held in the deleted pool: %v", err)
	}
	if _, err := d.ipam.Deallocate(t.Context(), &nodev1.DeallocateRequest{Parameters: params("c1", "gone")}); err != nil {
		t.Errorf("releasing in the deleted pool: %v", err)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	// Every pool is deleted while the daemon is down: no pool event will come.
	deletePool(t, c, "moved")
	d = startDaemon(t, cp.Config, dir, nil)
	if res, err := allocate(t, d, "c3", "moved"); code(err) != codes.NotFound {
		t.Errorf("first allocation after the restart, every pool deleted = %v %v, want NotFound", res, err)
	}
	time.Sleep(2 * time.Second) // the watch has synced by now, with nothing to say
	if res, err := allocate(t, d, "c4", "moved"); code(err) != codes.NotFound {
		t.Errorf("allocation 2s after the restart, every pool deleted = %v %v, want NotFound", res, err)
	}
	if _, err := d.ipam.IsAllocated(t.Context(), &nodev1.IsAllocatedRequest{Parameters: params("c2", "moved")}); err != nil {
		t.Errorf("the allocation held in the deleted pool: %v", err)
	}
}

// TestStoredBlocksServeUntilTheAPIServerAnswers: restarted while the API server
// cannot be reached, the daemon allocates from its stored block; once the API
// server answers, it reconciles at once, here with an empty listing (every pool
// was deleted meanwhile, so no pool event tells it).
func TestStoredBlocksServeUntilTheAPIServerAnswers(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	poolWithBlock(t, c, "p", "10.13.0.0/24", "10.13.0.1", "10.13.0.4")
	proxy := harness.NewAPIProxy(t, cp.Config)
	dir := t.TempDir()
	d := startDaemon(t, proxy.Config(cp.Config), dir, nil)
	waitFor(t, "the pool to sync", func() bool { _, err := allocate(t, d, "c1", "p"); return err == nil })
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	proxy.SetUp(false)
	deletePool(t, c, "p")
	d = startDaemon(t, proxy.Config(cp.Config), dir, nil)
	res, err := allocate(t, d, "c2", "p")
	if err != nil || res.Allocations[0].Ip != "10.13.0.2/24" {
		t.Fatalf("allocation with the API server unreachable = %v %v, want 10.13.0.2/24 from the stored block", res, err)
	}

	proxy.SetUp(true)
	answered := time.Now()
	probe := 0
	waitFor(t, "the stored block to be reconciled once the API server answers", func() bool {
		probe++
		_, err := allocate(t, d, fmt.Sprintf("probe%d", probe), "p")
		return code(err) == codes.NotFound
	})
	t.Logf("reconciled %s after the API server came back", time.Since(answered).Round(100*time.Millisecond))
	for _, cid := range []string{"c1", "c2"} {
		if _, err := d.ipam.IsAllocated(t.Context(), &nodev1.IsAllocatedRequest{Parameters: params(cid, "p")}); err != nil {
			t.Errorf("allocation %s after the reconcile: %v", cid, err)
		}
	}
}
