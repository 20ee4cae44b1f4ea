package system

// Scripted scenarios of the whole system (issue 38): the sequences the seeded
// test reaches only by chance, played step by step against the same real
// binaries and the same invariants (world.check).

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/test/harness"
)

// scenarioBins builds the three binaries once per test.
func scenarioBins(t *testing.T) map[string]string {
	t.Helper()
	bins := map[string]string{}
	for _, b := range []string{"ipam-controller", "ipam-node", "nv-ipam"} {
		bins[b] = harness.BuildBinary(t, "./cmd/"+b)
	}
	return bins
}

// addOn adds an attachment of network nw on node i, trying again for up to
// 15 s (a daemon that just started waits for its stored blocks' decision).
func (w *world) addOn(i int, nw network) attachment {
	w.t.Helper()
	w.nextID++
	a := attachment{node: i, net: nw, containerID: fmt.Sprintf("c%d", w.nextID)}
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := w.call("ADD", a, nil)
		if err == nil {
			a.ip = resultIP(w, out)
			w.live[key(a)] = a
			w.tracef("ADD %s", a)
			return a
		}
		if time.Now().After(deadline) {
			w.fail("ADD %s keeps failing: %v", a, err)
		}
		_, _ = w.call("DEL", a, nil) // as a runtime does after a failed ADD
		time.Sleep(300 * time.Millisecond)
	}
}

// blockOf returns node's block in the pool named pool, as its status has it.
func (w *world) blockOf(pool, node string) (iprange.Range, bool) {
	for _, b := range w.blocks()[pool] {
		if b.node == node {
			return b.r, true
		}
	}
	return iprange.Range{}, false
}

// waitBlock waits until node has a block in pool, and returns it.
func (w *world) waitBlock(pool, node string, within time.Duration) iprange.Range {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if r, ok := w.blockOf(pool, node); ok {
			return r
		}
		if time.Now().After(deadline) {
			w.fail("%s got no block in %s within %s", node, pool, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createCIDRPool creates CIDRPool c0 (poolDefs[2]) with /28 node prefixes,
// selecting group g ("" for every node).
func (w *world) createCIDRPool(g string) {
	w.t.Helper()
	p := poolDefs[2]
	obj := &v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: namespace},
		Spec: v1alpha1.CIDRPoolSpec{CIDR: p.network, PerNodeNetworkPrefix: 28}}
	if g != "" {
		obj.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: groupLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{g}}}}}}
	}
	if err := w.c.Create(w.ctx, obj); err != nil {
		w.fail("creating CIDRPool %s: %v", p.name, err)
	}
	w.tracef("create CIDRPool %s", describe(obj))
}

// deletePool deletes pool p and waits until it is gone.
func (w *world) deletePool(p poolDef) {
	w.t.Helper()
	obj, err := w.getPool(p)
	if err != nil {
		w.fail("reading %s: %v", p.name, err)
	}
	if err := w.c.Delete(w.ctx, obj); err != nil {
		w.fail("deleting %s: %v", p.name, err)
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
	w.tracef("delete %s %s", p.kind, p.name)
}

// TestOutageNodeRecreatePoolRecreate plays the sequence of seed 824446
// (issue 38) step by step: a node holds an address in a CIDRPool; its daemon
// is down and the controller quiet for longer than the grace period; its Node
// is deleted and registered again within the grace period (the daemon cannot
// restore its report); the API server goes away; the daemon starts and serves
// from its stored block; the pool is deleted and created anew; the API server
// comes back while the daemon is down again. The node that sorts first gets a
// block in the new pool: it must not cover what the other node holds.
//
// The controller used to measure a gone Node's grace period from the last
// reconcile that listed it, so that a Node deleted for a second after a quiet
// spell lost its daemon's report at once, and the new pool gave its addresses
// to the other node.
func TestOutageNodeRecreatePoolRecreate(t *testing.T) {
	w := newBareWorld(t, 38, scenarioBins(t), false)
	w.addNode(0) // sys-n0, group a: sorts first, takes the lowest free block
	w.addNode(1) // sys-n1, group b: the holder
	c0 := networks[3]
	if c0.pool.name != "c0" {
		t.Fatalf("networks[3] is %s, want a network of c0", c0.name)
	}

	// sys-n1 alone has a block in c0 (the lowest), and an address in it.
	w.createCIDRPool("b")
	held := w.waitBlock("c0", "sys-n1", 30*time.Second)
	a := w.addOn(1, c0)
	if !held.Contains(a.ip) {
		w.fail("%s is not in sys-n1's block %s", a, held)
	}
	w.check()

	// Its daemon goes down; nothing changes for longer than the grace period.
	w.killDaemon(1)
	w.tracef("kill -9 ipam-node on sys-n1")
	quiet := mustDuration(t, grace) + time.Second
	time.Sleep(quiet)
	w.tracef("quiet for %s", quiet)

	// Its Node is re-registered, away for a third of the grace period.
	w.recreateNode(1, mustDuration(t, grace)/3)
	time.Sleep(time.Second) // the controller takes in the re-registered Node
	w.check()

	// The API server goes away; the daemon starts and serves from its store.
	w.apiStop()
	w.startDaemon(1)
	w.tracef("restart ipam-node on sys-n1 (API server unreachable)")
	b := w.addOn(1, c0)
	if !held.Contains(b.ip) {
		w.fail("%s is not in sys-n1's stored block %s", b, held)
	}

	// The pool is deleted and created anew, for every node.
	w.deletePool(c0.pool)
	w.createCIDRPool("")
	w.killDaemon(1)
	w.tracef("kill -9 ipam-node on sys-n1")

	// The API server comes back: sys-n0 gets a block in the new pool, clear of
	// what sys-n1 holds.
	w.apiStart()
	got := w.waitBlock("c0", "sys-n0", 60*time.Second)
	w.tracef("sys-n0's block in the new c0: %s", got)
	w.check()
	for _, at := range []attachment{a, b} {
		if got.Contains(at.ip) {
			w.fail("sys-n0's block %s in the new c0 covers %s", got, at)
		}
	}

	// The daemon comes back: what it holds stays its own, and every node that
	// the pool selects gets a block.
	w.startDaemon(1)
	w.tracef("restart ipam-node on sys-n1")
	time.Sleep(2 * time.Second)
	w.check()
	w.waitBlock("c0", "sys-n1", 30*time.Second)
	w.check()
	for _, k := range sortedKeys(w.live) {
		w.mustDel(w.live[k])
		delete(w.live, k)
	}
	for i := range w.nodes {
		if got := w.allocations(i); len(got) != 0 {
			w.fail("node %s still holds %v after every attachment was deleted", w.nodes[i].name, got)
		}
	}
	w.check()
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestPoolRecreatedDuringOutage: a pool deleted and created anew under its
// name while the API server was away reaches the controller, once it is back,
// as an update of generation 1 to generation 1 (its informer's relist) with
// another UID. The controller used to filter it out as no spec change, and
// the new pool went without blocks until some other event (issue 38: found
// while playing seed 824446).
func TestPoolRecreatedDuringOutage(t *testing.T) {
	w := newBareWorld(t, 38, scenarioBins(t), false)
	w.addNode(0)
	w.addNode(1)
	w.createCIDRPool("b")
	old := w.waitBlock("c0", "sys-n1", 30*time.Second)
	w.apiStop()
	w.deletePool(poolDefs[2])
	w.createCIDRPool("b")
	// Its daemon is down when the API server returns: its report, changing
	// when it sees the new pool, would make the controller look again.
	w.killDaemon(1)
	w.tracef("kill -9 ipam-node on sys-n1")
	w.apiStart()
	got := w.waitBlock("c0", "sys-n1", 20*time.Second)
	w.tracef("sys-n1's block in the new c0: %s (in the old one: %s)", got, old)
	w.startDaemon(1)
	w.tracef("restart ipam-node on sys-n1")
	a := w.addOn(1, networks[3])
	w.check()
	if !got.Contains(a.ip) {
		w.fail("%s is not in sys-n1's block %s", a, got)
	}
}

// TestNodeRecreatedWhileNoControllerRanThenPoolRecreated: a node's daemon is
// down and its Node re-registered (its report gone with the annotations)
// while no controller runs; the controller starts, then the pool is deleted
// and created anew. The node that sorts first gets a block in the new pool:
// it must not cover what the silent node holds.
func TestNodeRecreatedWhileNoControllerRanThenPoolRecreated(t *testing.T) {
	silentNodeAndPoolRecreated(t, 38, false)
}

// TestCleanerDuringLongOutage: an attachment made while the API server is
// away has a pod the daemon's pod informer cannot see (its watch is broken),
// so the stale-allocation cleaner counts it missing; before it releases, it
// asks the API server, which does not answer, past client-go's retries. It
// must release nothing: a cleaner that took the unreachable API server for
// "pod gone" would release a running pod's address.
func TestCleanerDuringLongOutage(t *testing.T) {
	w := newBareWorld(t, 38, scenarioBins(t), false)
	w.addNode(0)
	w.addNode(1)
	w.createCIDRPool("b")
	w.waitBlock("c0", "sys-n1", 30*time.Second)
	w.addOn(1, networks[3])
	time.Sleep(2 * time.Second) // the cleaner's informer has the pod
	w.apiStop()
	w.addOn(1, networks[3])
	w.tracef("the API server stays away for %s", longOutage)
	time.Sleep(longOutage)
	w.check()
	w.apiStart()
	time.Sleep(5 * time.Second)
	w.check()
	if got := len(w.allocations(1)); got != 2 {
		w.fail("sys-n1 holds %d addresses, want the 2 attachments'", got)
	}
}

// TestPoolDeletedWhileNoControllerSawIt plays seed 310242 (issue 38): a node's
// daemon holds an address in its block and is killed; the controller restarts
// while the API server is away (it knows only its Lease); the node's Node is
// registered again and the pool deleted meanwhile; the pool is created again.
// The Lease kept of the node's live report only what no status records (an
// empty report), the old status is gone, so the new pool gave the node's
// block to the node that sorts first. Now the node's record says that its
// daemon reports (daemonReports), and a block it lists of a pool that is gone
// is a grant of the node from the first plan on, held while the daemon is
// silent.
func TestPoolDeletedWhileNoControllerSawIt(t *testing.T) {
	silentNodeAndPoolRecreated(t, 310242, true)
}

// silentNodeAndPoolRecreated plays the two sequences above: sys-n1 holds an
// address of CIDRPool c0; the controller and sys-n1's daemon are killed and
// sys-n1's Node re-registered; the pool is deleted before the controller
// starts again (deleteFirst) or after; the pool is created anew selecting
// every node, and sys-n0's new block must not cover sys-n1's address.
func silentNodeAndPoolRecreated(t *testing.T, seed uint64, deleteFirst bool) {
	w := newBareWorld(t, seed, scenarioBins(t), false)
	w.addNode(0)
	w.addNode(1)
	c0 := networks[3]
	w.createCIDRPool("b")
	held := w.waitBlock("c0", "sys-n1", 30*time.Second)
	a := w.addOn(1, c0)
	if !held.Contains(a.ip) {
		w.fail("%s is not in sys-n1's block %s", a, held)
	}
	time.Sleep(3 * time.Second) // the controller writes what it knows into the node's record
	w.check()

	_ = w.ctrl.Process.Kill()
	<-w.ctrlExited
	w.tracef("kill -9 ipam-controller")
	w.killDaemon(1)
	w.tracef("kill -9 ipam-node on sys-n1")
	w.recreateNode(1, 0)
	if deleteFirst {
		w.deletePool(c0.pool)
	}
	w.startController()
	w.tracef("start ipam-controller")
	time.Sleep(3 * time.Second)
	w.check()

	if !deleteFirst {
		w.deletePool(c0.pool)
	}
	w.createCIDRPool("")
	got := w.waitBlock("c0", "sys-n0", 30*time.Second)
	w.tracef("sys-n0's block in the new c0: %s", got)
	w.check()
	w.startDaemon(1)
	w.tracef("restart ipam-node on sys-n1")
	time.Sleep(2 * time.Second)
	w.check()
}
