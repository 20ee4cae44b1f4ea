package system

// Scripted scenarios of per-node delivery (issue 37): NodeIPAMs edited or
// deleted by hand, and a rolling upgrade from the hwipam before NodeIPAMs and
// the downgrade back to it, against the same real binaries and invariants
// (world.check).

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/test/harness"
)

// restartControllerWith kills ipam-controller and starts bin with
// --status-allocations-max-nodes maxListed (-1: without the flag, which
// binaries before NodeIPAMs lack).
func (w *world) restartControllerWith(bin string, maxListed int) {
	w.t.Helper()
	_ = w.ctrl.Process.Kill()
	<-w.ctrlExited
	w.ctrlBin, w.maxListed = bin, maxListed
	w.startController()
	w.tracef("ipam-controller now %s (--status-allocations-max-nodes %d)", filepath.Base(filepath.Dir(bin)), maxListed)
}

// nodeIPAM returns node's NodeIPAM.
func (w *world) nodeIPAM(node string) (*nodeipamv1.NodeIPAM, error) {
	var o nodeipamv1.NodeIPAM
	err := w.c.Get(w.ctx, client.ObjectKey{Namespace: namespace, Name: node}, &o)
	return &o, err
}

// waitNodeIPAM waits until node's NodeIPAM is the controller's and gives it
// want in pool (a CIDRPool's prefix).
func (w *world) waitNodeIPAM(node, pool, want string, within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		o, err := w.nodeIPAM(node)
		if err == nil && nodeipamv1.OwnedByController(o) {
			for _, b := range o.Spec.Blocks {
				if b.Pool == pool && b.Prefix == want {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			w.fail("%s's NodeIPAM does not give it %s in %s within %s (%v)", node, want, pool, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNodeIPAMEditedByHandWhileNoControllerRuns: above the threshold a pool's
// status lists no block, so the daemons have only their NodeIPAMs. With no
// controller running to write them back, sys-n0's is edited to give it
// sys-n1's block, and sys-n1's is deleted: sys-n0 goes on allocating from the
// block the controller gave it, sys-n1 from its own, and the controller, once
// back, writes both objects as they were.
func TestNodeIPAMEditedByHandWhileNoControllerRuns(t *testing.T) {
	w := newBareWorld(t, 37, scenarioBins(t), false)
	w.restartControllerWith(w.ctrlBin, 1)
	w.addNode(0)
	w.addNode(1)
	c0 := networks[3]
	w.createCIDRPool("")
	b0 := w.waitBlock("c0", "sys-n0", 30*time.Second)
	b1 := w.waitBlock("c0", "sys-n1", 30*time.Second)
	var pool v1alpha1.CIDRPool
	if err := w.c.Get(w.ctx, client.ObjectKey{Namespace: namespace, Name: "c0"}, &pool); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for pool.Status.BlocksIn != v1alpha1.BlocksInNodeIPAM || len(pool.Status.Allocations) != 0 {
		if time.Now().After(deadline) {
			w.fail("c0's status lists its blocks (%d, blocksIn %q) above the threshold of 1", len(pool.Status.Allocations), pool.Status.BlocksIn)
		}
		time.Sleep(100 * time.Millisecond)
		if err := w.c.Get(w.ctx, client.ObjectKey{Namespace: namespace, Name: "c0"}, &pool); err != nil {
			t.Fatal(err)
		}
	}
	w.addOn(0, c0)
	w.addOn(1, c0)
	w.check()
	n0, err := w.nodeIPAM("sys-n0")
	if err != nil {
		t.Fatal(err)
	}
	n1, err := w.nodeIPAM("sys-n1")
	if err != nil {
		t.Fatal(err)
	}
	p0, p1 := n0.Spec.Blocks[0].Prefix, n1.Spec.Blocks[0].Prefix

	_ = w.ctrl.Process.Kill()
	<-w.ctrlExited
	w.tracef("kill -9 ipam-controller")
	n0.Spec.Blocks[0].Prefix, n0.Spec.Blocks[0].Gateway = n1.Spec.Blocks[0].Prefix, n1.Spec.Blocks[0].Gateway
	if err := w.c.Update(w.ctx, n0, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	w.tracef("NodeIPAM sys-n0 edited by hand: c0 %s (sys-n1's)", n0.Spec.Blocks[0].Prefix)
	if err := w.c.Delete(w.ctx, n1); err != nil {
		t.Fatal(err)
	}
	w.tracef("NodeIPAM sys-n1 deleted by hand")
	time.Sleep(time.Second) // the daemons see both
	for range 3 {
		if a := w.addOn(0, c0); !b0.Contains(a.ip) {
			w.fail("%s is not in the block %s the controller gave sys-n0", a, b0)
		}
		if a := w.addOn(1, c0); !b1.Contains(a.ip) {
			w.fail("%s is not in sys-n1's block %s", a, b1)
		}
	}
	w.check()

	w.startController()
	w.tracef("start ipam-controller")
	w.waitNodeIPAM("sys-n0", "c0", p0, 30*time.Second)
	w.waitNodeIPAM("sys-n1", "c0", p1, 30*time.Second)
	w.check()
	for _, k := range sortedKeys(w.live) {
		w.mustDel(w.live[k])
		delete(w.live, k)
	}
}

// previousBins builds ipam-controller and ipam-node of commit (an hwipam
// before NodeIPAMs) from the repository's history, once: they are kept under
// ~/.cache/hwipam/previous/<commit>.
func previousBins(t *testing.T, commit string) map[string]string {
	t.Helper()
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(commit))
	dir := filepath.Join(home, ".cache", "hwipam", "previous", commit[:12]+"-"+hex.EncodeToString(sum[:4]))
	out := map[string]string{}
	for _, b := range []string{"ipam-controller", "ipam-node"} {
		out[b] = filepath.Join(dir, b, b)
	}
	if _, err := os.Stat(out["ipam-node"]); err == nil {
		return out
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", harness.RepoRoot(), commit, src))
	if b, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting commit %s (the hwipam before NodeIPAMs) from the repository's history: %v\n%s", commit, err, b)
	}
	for _, b := range []string{"ipam-controller", "ipam-node"} {
		build := exec.Command("go", "build", "-o", out[b], "./cmd/"+b)
		build.Dir = src
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if o, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s of commit %s: %v\n%s", b, commit, err, o)
		}
	}
	return out
}

// previousCommit is the last commit before NodeIPAMs: its daemons read their
// blocks from the pools' status.
const previousCommit = "d626a56fb1538abbe46c09d603098e85989579d1"

// TestRollingUpgradeAndDowngrade: a cluster of the hwipam before NodeIPAMs
// (its controller and daemons) holds addresses; the controller is upgraded,
// then one daemon, so that old and new daemons run side by side while a pool's
// layout is edited; then the other. Then back: the daemons first, then the
// controller, while the pools are under the threshold. No address is held
// twice or in another node's block, nothing held is lost, and every node keeps
// allocating throughout.
func TestRollingUpgradeAndDowngrade(t *testing.T) {
	commit := resolveCommit(t, previousCommit)
	old := previousBins(t, commit)
	bins := scenarioBins(t)
	w := newBareWorld(t, 3737, map[string]string{"ipam-controller": old["ipam-controller"], "ipam-node": old["ipam-node"],
		"nv-ipam": bins["nv-ipam"]}, false)
	// The world started the old controller with the new flag: start it without.
	w.restartControllerWith(old["ipam-controller"], -1)
	w.addNode(0)
	w.addNode(1)
	c0 := networks[3]
	w.createCIDRPool("")
	w.waitBlock("c0", "sys-n0", 30*time.Second)
	w.waitBlock("c0", "sys-n1", 30*time.Second)
	both := func(what string) {
		w.tracef("%s", what)
		w.addOn(0, c0)
		w.addOn(1, c0)
		w.check()
	}
	both("old controller, old daemons")

	w.restartControllerWith(bins["ipam-controller"], 10000)
	w.waitNodeIPAMOf("sys-n0", "c0", 30*time.Second)
	both("new controller, old daemons")

	w.killDaemon(0)
	w.nodeBin = bins["ipam-node"]
	w.startDaemon(0)
	both("new controller, sys-n0 new, sys-n1 old")
	// A layout edit while both kinds of daemons run: both follow it.
	var pool v1alpha1.CIDRPool
	if err := w.c.Get(w.ctx, client.ObjectKey{Namespace: namespace, Name: "c0"}, &pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.PerNodeNetworkPrefix = 27
	if err := w.c.Update(w.ctx, &pool); err != nil {
		t.Fatal(err)
	}
	w.tracef("c0: per-node prefix /27")
	for _, n := range []string{"sys-n0", "sys-n1"} {
		w.waitPrefixLen("c0", n, 27, 30*time.Second)
	}
	time.Sleep(time.Second)
	both("after the layout edit, mixed daemons")

	w.killDaemon(1)
	w.startDaemon(1)
	both("new controller, new daemons")

	// Back, under the threshold: the daemons first, then the controller.
	w.nodeBin = old["ipam-node"]
	for i := range w.nodes {
		w.killDaemon(i)
		w.startDaemon(i)
	}
	both("new controller, old daemons again")
	w.restartControllerWith(old["ipam-controller"], -1)
	time.Sleep(2 * time.Second)
	both("old controller, old daemons again")
	for _, k := range sortedKeys(w.live) {
		w.mustDel(w.live[k])
		delete(w.live, k)
	}
}

// resolveCommit returns the full name of commit, which the repository's
// history must hold.
func resolveCommit(t *testing.T, commit string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", harness.RepoRoot(), "rev-parse", "--verify", commit+"^{commit}").Output()
	if err != nil {
		t.Fatalf("commit %s (the hwipam before NodeIPAMs) is not in this clone's history (a shallow clone?): %v", commit, err)
	}
	return strings.TrimSpace(string(out))
}

// waitNodeIPAMOf waits until node's NodeIPAM gives it a block in pool.
func (w *world) waitNodeIPAMOf(node, pool string, within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if o, err := w.nodeIPAM(node); err == nil {
			for _, b := range o.Spec.Blocks {
				if b.Pool == pool {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			w.fail("%s has no NodeIPAM with a block of %s within %s", node, pool, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitPrefixLen waits until node's block in pool (as every source has it) is
// a prefix of length bits.
func (w *world) waitPrefixLen(pool, node string, bits int, within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, seen := true, false
		for _, b := range w.blocks()[pool] {
			if b.node != node {
				continue
			}
			seen = true
			if iprange.PrefixRange(netip.PrefixFrom(b.r.Start, bits).Masked()) != b.r {
				ok = false
			}
		}
		if ok && seen {
			return
		}
		if time.Now().After(deadline) {
			w.fail("%s's block in %s is not a /%d within %s: %v", node, pool, bits, within, w.blocks()[pool])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unfinalizedCommit is the last hwipam whose NodeIPAMs were not yet the
// planner's record: no finalizer, and its controller planned a pool under the
// threshold from the pool's status.
const unfinalizedCommit = "b4d1c25"

// TestUpgradeToRecordsAndBack: a cluster of the hwipam before NodeIPAMs were the
// planner's record (its controller and daemons, the pool above the threshold, so
// that the NodeIPAMs are the only place the blocks are written down) holds
// addresses. The new controller takes over its NodeIPAMs (adds its finalizer,
// keeps every block), the daemons are rolled, a node joins. Then back: the
// daemons first, then the old controller, which must go on with NodeIPAMs that
// carry a finalizer it does not know. No address is held twice or outside its
// node's block at any step, and every node keeps allocating.
func TestUpgradeToRecordsAndBack(t *testing.T) {
	commit := resolveCommit(t, unfinalizedCommit)
	old := previousBins(t, commit)
	bins := scenarioBins(t)
	w := newBareWorld(t, 4404, map[string]string{"ipam-controller": old["ipam-controller"], "ipam-node": old["ipam-node"],
		"nv-ipam": bins["nv-ipam"]}, false)
	w.restartControllerWith(old["ipam-controller"], 1)
	w.addNode(0)
	w.addNode(1)
	c0 := networks[3]
	w.createCIDRPool("")
	w.waitNodeIPAMOf("sys-n0", "c0", 30*time.Second)
	w.waitNodeIPAMOf("sys-n1", "c0", 30*time.Second)
	all := func(what string) {
		w.tracef("%s", what)
		for i := range w.nodes {
			w.addOn(i, c0)
		}
		w.check()
	}
	all("old controller, old daemons, the blocks in the NodeIPAMs only")
	before := map[string]string{}
	for _, n := range []string{"sys-n0", "sys-n1"} {
		o, err := w.nodeIPAM(n)
		if err != nil {
			t.Fatal(err)
		}
		before[n] = fmt.Sprint(o.Spec.Blocks)
		if len(o.Finalizers) != 0 {
			t.Fatalf("the old controller's NodeIPAM of %s has finalizers %v", n, o.Finalizers)
		}
	}

	w.restartControllerWith(bins["ipam-controller"], 1)
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range []string{"sys-n0", "sys-n1"} {
		for {
			o, err := w.nodeIPAM(n)
			if err == nil && len(o.Finalizers) == 1 && o.Finalizers[0] == nodeipamv1.Finalizer {
				if got := fmt.Sprint(o.Spec.Blocks); got != before[n] {
					t.Fatalf("the new controller changed %s's blocks: %s, before %s", n, got, before[n])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the new controller did not add its finalizer to %s's NodeIPAM (%v)", n, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	all("new controller, old daemons")
	w.nodeBin = bins["ipam-node"]
	for i := range w.nodes {
		w.killDaemon(i)
		w.startDaemon(i)
	}
	all("new controller, new daemons")
	w.addNode(2)
	w.waitNodeIPAMOf("sys-n2", "c0", 30*time.Second)
	all("a node joined")

	w.nodeBin = old["ipam-node"]
	for i := range w.nodes {
		w.killDaemon(i)
		w.startDaemon(i)
	}
	all("new controller, old daemons again")
	w.restartControllerWith(old["ipam-controller"], 1)
	time.Sleep(2 * time.Second)
	all("old controller, old daemons again, NodeIPAMs with the finalizer")
	for _, k := range sortedKeys(w.live) {
		w.mustDel(w.live[k])
		delete(w.live, k)
	}
	w.check()
}
