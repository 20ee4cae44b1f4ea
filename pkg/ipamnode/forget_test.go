package ipamnode_test

import (
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/test/harness"
)

// listedPools is what `ipamctl pools` and `check` see of the daemon's pools:
// their keys, sorted.
func listedPools(t *testing.T, d *daemon) []string {
	t.Helper()
	resp, err := d.info.ListPools(t.Context(), &infov1.ListPoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, p := range resp.GetPools() {
		keys = append(keys, p.GetKey())
	}
	slices.Sort(keys)
	return keys
}

// storedPools are the pool keys the store file holds (records or allocations).
func storedPools(t *testing.T, path string) []string {
	t.Helper()
	pools, err := store.Snapshot(path)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range pools {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// A pool deleted from the API server is forgotten by the daemon once it holds
// nothing on the node (issue 39, item 8): at once when it holds nothing, at the
// release of its last allocation otherwise, and at start for one deleted while
// the daemon was down. It no longer lingers in `ipamctl check` as "no block on
// this node any more, nothing held". A pool that still exists but gives the
// node no block stays listed; a pool created again under the same name gets a
// block and keeps what is allocated from it across a restart.
func TestDeletedPoolIsForgottenOnceEmpty(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "empty", "10.7.0.0/24", "10.7.0.1", "10.7.0.4")
	poolWithBlock(t, c, "held", "10.7.1.0/24", "10.7.1.1", "10.7.1.4")
	poolWithBlock(t, c, "elsewhere", "10.7.2.0/24", "10.7.2.1", "10.7.2.4")
	poolWithBlock(t, c, "later", "10.7.3.0/24", "10.7.3.1", "10.7.3.4")
	dir := t.TempDir()
	storePath := filepath.Join(dir, "store")
	d := startDaemon(t, cp.Config, dir, nil)
	for _, p := range []string{"held", "later"} {
		waitFor(t, "pool "+p+" to sync", func() bool {
			_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c-"+p, p)})
			return err == nil
		})
	}

	// "elsewhere" exists but gives this node no block any more: kept, nothing held.
	var el v1alpha1.IPPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "elsewhere"}, &el); err != nil {
		t.Fatal(err)
	}
	el.Status.Allocations = nil
	if err := c.Status().Update(ctx, &el); err != nil {
		t.Fatal(err)
	}
	deletePool(t, c, "empty")
	deletePool(t, c, "held")
	want := []string{"elsewhere", "held", "later"}
	waitFor(t, "the deleted empty pool to be forgotten", func() bool { return slices.Equal(listedPools(t, d), want) })
	if got := listedPools(t, d); !slices.Equal(got, want) {
		t.Fatalf("pools listed after deleting an empty and a holding pool = %v, want %v", got, want)
	}

	// The held allocation is still there; its release takes the pool with it.
	if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("c-held", "held")}); err != nil {
		t.Fatalf("the allocation of a deleted pool was lost: %v", err)
	}
	if _, err := d.ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: params("c-held", "held")}); err != nil {
		t.Fatal(err)
	}
	if got, want := listedPools(t, d), []string{"elsewhere", "later"}; !slices.Equal(got, want) {
		t.Errorf("pools listed once the deleted pool's last allocation is released = %v, want %v", got, want)
	}

	// Created again under the same name: a block, and what it hands out survives
	// a restart.
	poolWithBlock(t, c, "held", "10.7.1.0/24", "10.7.1.1", "10.7.1.4")
	waitFor(t, "the re-created pool to sync", func() bool {
		_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c-again", "held")})
		return err == nil
	})

	// Deleted while the daemon is down: forgotten at start once released.
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := storedPools(t, storePath), []string{"elsewhere", "held", "later"}; !slices.Equal(got, want) {
		t.Errorf("pools in the store = %v, want %v", got, want)
	}
	deletePool(t, c, "elsewhere")
	d = startDaemon(t, cp.Config, dir, nil)
	waitFor(t, "the pool deleted while the daemon was down to be forgotten", func() bool {
		return slices.Equal(listedPools(t, d), []string{"held", "later"})
	})
	for _, p := range []string{"held", "later"} {
		cid := map[string]string{"held": "c-again", "later": "c-later"}[p]
		if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params(cid, p)}); err != nil {
			t.Errorf("allocation in pool %s lost across the restart: %v", p, err)
		}
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := storedPools(t, storePath), []string{"held", "later"}; !slices.Equal(got, want) {
		t.Errorf("pools in the store after the restart = %v, want %v", got, want)
	}
}
