package ipamnode_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

// inRange reports whether the address of an allocation (with its prefix length)
// is within start-end.
func inBlock(t *testing.T, ip, start, end string) bool {
	t.Helper()
	p, err := netip.ParsePrefix(ip)
	if err != nil {
		t.Fatalf("allocated %q: %v", ip, err)
	}
	return netip.MustParseAddr(start).Compare(p.Addr()) <= 0 && p.Addr().Compare(netip.MustParseAddr(end)) <= 0
}

// TestDaemonAllocatesFromItsNodeIPAM: the daemon reads the pools' status while
// its node has no NodeIPAM, switches to the NodeIPAM (with the PoolSpecs) once
// the controller writes it (and then ignores the pools' status), never uses a
// NodeIPAM or PoolSpecs someone else wrote, keeps its blocks while the object is
// deleted, and stops allocating from a pool its NodeIPAM no longer lists.
func TestDaemonAllocatesFromItsNodeIPAM(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "p", "10.6.0.0/24", "10.6.0.1", "10.6.0.8")
	var pool v1alpha1.IPPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "p"}, &pool); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cp.Config, t.TempDir(), nil)
	n := 0
	allocate := func() (string, codes.Code) {
		n++
		resp, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(fmt.Sprintf("c%d", n), "p")})
		if err != nil {
			return "", code(err)
		}
		return resp.Allocations[0].Ip, codes.OK
	}
	// allocatesIn waits until an allocation lands in start-end, and then checks
	// that the next ones do too.
	allocatesIn := func(what, start, end string) {
		t.Helper()
		waitFor(t, what, func() bool {
			ip, c := allocate()
			return c == codes.OK && inBlock(t, ip, start, end)
		})
		for range 2 {
			if ip, c := allocate(); c != codes.OK || !inBlock(t, ip, start, end) {
				t.Fatalf("%s: then allocated %q (%v), outside %s-%s", what, ip, c, start, end)
			}
		}
	}
	allocatesIn("an allocation from the pool's status", "10.6.0.1", "10.6.0.8")

	block := func(start, end string) nodeipamv1.NodeBlock {
		return nodeipamv1.NodeBlock{Kind: v1alpha1.KindIPPool, Pool: "p", PoolUID: pool.UID, StartIP: start, EndIP: end}
	}
	// The pool's spec, as the controller writes it for every node.
	specs := &nodeipamv1.PoolSpecs{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: nodeipamv1.PoolSpecsName},
		Spec: nodeipamv1.PoolSpecsSpec{Pools: []nodeipamv1.PoolSpec{{Kind: v1alpha1.KindIPPool, Pool: "p", PoolUID: pool.UID,
			IPPool: pool.Spec.DeepCopy()}}}}
	if err := c.Create(ctx, specs, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	obj := &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: node},
		Spec: nodeipamv1.NodeIPAMSpec{Blocks: []nodeipamv1.NodeBlock{block("10.6.0.33", "10.6.0.62")}}}
	if err := c.Create(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	allocatesIn("an allocation from the NodeIPAM's block", "10.6.0.33", "10.6.0.62")

	// The pools' status is no longer read.
	pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: node, StartIP: "10.6.0.65", EndIP: "10.6.0.72"}}
	if err := c.Status().Update(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	allocatesIn("allocations from the NodeIPAM after a pool status change", "10.6.0.33", "10.6.0.62")

	// Written by someone else: not used.
	edited := obj.DeepCopy()
	edited.Spec.Blocks[0].StartIP, edited.Spec.Blocks[0].EndIP = "10.6.0.97", "10.6.0.104"
	if err := c.Update(ctx, edited, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	allocatesIn("allocations from the controller's block after a hand edit", "10.6.0.33", "10.6.0.62")

	// Deleted: the blocks stay; created again by the controller: its block.
	if err := c.Delete(ctx, edited); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	allocatesIn("allocations while the NodeIPAM is deleted", "10.6.0.33", "10.6.0.62")
	obj = &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: node},
		Spec: nodeipamv1.NodeIPAMSpec{Blocks: []nodeipamv1.NodeBlock{block("10.6.0.129", "10.6.0.158")}}}
	if err := c.Create(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	allocatesIn("an allocation from the re-created NodeIPAM", "10.6.0.129", "10.6.0.158")

	// PoolSpecs edited by hand (a foreign spec): not used.
	specs.Spec.Pools[0].IPPool.Subnet = "10.99.0.0/24"
	if err := c.Update(ctx, specs, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	allocatesIn("allocations from the controller's spec after a hand edit of PoolSpecs", "10.6.0.129", "10.6.0.158")

	// The pool no longer listed: no new allocation from it.
	obj.Spec.Blocks = nil
	if err := c.Update(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pool to go inactive", func() bool {
		_, c := allocate()
		return c == codes.NotFound
	})
}

// TestNewBlockWaitsForItsSpec: the controller cut a new block from a spec (a
// layout edit, generation 2) that the PoolSpecs do not hold yet (NodeIPAM and
// PoolSpecs are written apart). The daemon keeps allocating from the block it
// had, never from the new block with the old spec's exclusions, and takes the
// new block once the PoolSpecs bring generation 2: then the new spec's
// exclusion holds in it.
func TestNewBlockWaitsForItsSpec(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "p", "10.6.0.0/24", "10.6.0.1", "10.6.0.8")
	var pool v1alpha1.IPPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "p"}, &pool); err != nil {
		t.Fatal(err)
	}
	specOf := func(gen int64, excl []v1alpha1.ExcludeRange) nodeipamv1.PoolSpec {
		s := pool.Spec.DeepCopy()
		s.Exclusions = excl
		return nodeipamv1.PoolSpec{Kind: v1alpha1.KindIPPool, Pool: "p", PoolUID: pool.UID, Generation: gen, IPPool: s}
	}
	specs := &nodeipamv1.PoolSpecs{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: nodeipamv1.PoolSpecsName},
		Spec: nodeipamv1.PoolSpecsSpec{Pools: []nodeipamv1.PoolSpec{specOf(1, nil)}}}
	if err := c.Create(ctx, specs, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	block := func(start, end string, gen int64) nodeipamv1.NodeBlock {
		return nodeipamv1.NodeBlock{Kind: v1alpha1.KindIPPool, Pool: "p", PoolUID: pool.UID, StartIP: start, EndIP: end, PoolGeneration: gen}
	}
	obj := &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: node},
		Spec: nodeipamv1.NodeIPAMSpec{Blocks: []nodeipamv1.NodeBlock{block("10.6.0.33", "10.6.0.62", 1)}}}
	if err := c.Create(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d := startDaemon(t, cp.Config, dir, nil)
	n := 0
	allocate := func() (string, codes.Code) {
		n++
		resp, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(fmt.Sprintf("c%d", n), "p")})
		if err != nil {
			return "", code(err)
		}
		return resp.Allocations[0].Ip, codes.OK
	}
	waitFor(t, "an allocation from the NodeIPAM's block", func() bool {
		ip, c := allocate()
		return c == codes.OK && inBlock(t, ip, "10.6.0.33", "10.6.0.62")
	})

	// The new block, of generation 2, before its spec.
	obj.Spec.Blocks = []nodeipamv1.NodeBlock{block("10.6.0.65", "10.6.0.94", 2)}
	if err := c.Update(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for range 3 {
		if ip, c := allocate(); c != codes.OK || !inBlock(t, ip, "10.6.0.33", "10.6.0.62") {
			t.Fatalf("with the new block's spec not there yet, allocated %q (%v), not from the block it had (10.6.0.33-10.6.0.62)", ip, c)
		}
	}
	// Restarted meanwhile: it serves the block its store has, not the new one.
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, cp.Config, dir, nil)
	time.Sleep(2 * time.Second)
	for range 3 {
		if ip, c := allocate(); c != codes.OK || !inBlock(t, ip, "10.6.0.33", "10.6.0.62") {
			t.Fatalf("restarted with the new block's spec not there yet, allocated %q (%v), not from the block it had", ip, c)
		}
	}
	// Its spec: generation 2 excludes the new block's first 6 addresses.
	specs.Spec.Pools = []nodeipamv1.PoolSpec{specOf(2, []v1alpha1.ExcludeRange{{StartIP: "10.6.0.65", EndIP: "10.6.0.70"}})}
	if err := c.Update(ctx, specs, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an allocation from the new block", func() bool {
		ip, c := allocate()
		return c == codes.OK && inBlock(t, ip, "10.6.0.65", "10.6.0.94")
	})
	for range 5 {
		ip, c := allocate()
		if c != codes.OK || !inBlock(t, ip, "10.6.0.71", "10.6.0.94") {
			t.Fatalf("allocated %q (%v) from the new block: outside 10.6.0.71-10.6.0.94 (10.6.0.65-70 are excluded)", ip, c)
		}
	}
}
