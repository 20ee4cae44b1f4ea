package poolcontroller_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
)

func wantStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s =\n  %v\nwant\n  %v", what, got, want)
	}
}

func wantCondition(t *testing.T, c v1alpha1.PoolStatusCommon, typ string, status metav1.ConditionStatus, msgPart string) {
	t.Helper()
	cond := meta.FindStatusCondition(c.Conditions, typ)
	if cond == nil {
		t.Errorf("no %s condition in %+v", typ, c.Conditions)
		return
	}
	if cond.Status != status || !strings.Contains(cond.Message, msgPart) {
		t.Errorf("condition %s = %s %q, want %s containing %q", typ, cond.Status, cond.Message, status, msgPart)
	}
}

func (f *fixture) newIPPool(name, subnet string, size int, mod func(*v1alpha1.IPPoolSpec)) {
	p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: size, NodeSelector: f.selector()}}
	if mod != nil {
		mod(&p.Spec)
	}
	f.create(p)
}

func (f *fixture) updateIPPool(name string, mod func(*v1alpha1.IPPoolSpec)) {
	f.t.Helper()
	p := f.ipPool(name)
	mod(&p.Spec)
	if err := f.c.Update(f.t.Context(), p); err != nil {
		f.t.Fatalf("updating IPPool %s: %v", name, err)
	}
}

func TestIPPoolOneBlockPerSelectedNode(t *testing.T) {
	f := newFixture(t, 0)
	f.node("c", true, nil)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.node("other", false, nil)
	f.newIPPool("rail0", "10.0.0.0/24", 10, func(s *v1alpha1.IPPoolSpec) { s.Gateway = "10.0.0.1" })
	f.reconcile(f.ip, "rail0")

	p := f.ipPool("rail0")
	wantStrings(t, "blocks", f.blocksOf(p), []string{"a=10.0.0.1-10.0.0.10", "b=10.0.0.11-10.0.0.20", "c=10.0.0.21-10.0.0.30"})
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionReady, metav1.ConditionTrue, "every selected node")
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionExhausted, metav1.ConditionFalse, "")
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionInvalidSpec, metav1.ConditionFalse, "")
	if p.Status.SelectedNodes != 3 || p.Status.AllocatedNodes != 3 || p.Status.ObservedGeneration != p.Generation {
		t.Errorf("selected %d allocated %d observedGeneration %d (generation %d)",
			p.Status.SelectedNodes, p.Status.AllocatedNodes, p.Status.ObservedGeneration, p.Generation)
	}
}

func TestIPPoolStableAcrossRestartsAndUnrelatedChanges(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.newIPPool("p", "10.1.0.0/16", 256, nil)
	f.reconcile(f.ip, "p")
	before := f.ipPool("p")

	// The same reconciler again, and a fresh one (a controller restart): no write.
	f.reconcile(f.ip, "p")
	restarted := &poolcontroller.Reconciler{Client: cp.Client, Kind: v1alpha1.KindIPPool, Now: f.clock.Now}
	f.reconcile(restarted, "p")
	if rv := f.ipPool("p").ResourceVersion; rv != before.ResourceVersion {
		t.Errorf("reconciling an unchanged world wrote the pool (resourceVersion %s -> %s)", before.ResourceVersion, rv)
	}

	// Churn elsewhere: an unselected node comes, a new selected one too; old blocks stay.
	f.node("unrelated", false, nil)
	f.node("0first", true, nil) // sorts first, must not displace anyone
	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) {
		s.Routes = []v1alpha1.Route{{Dst: "192.168.0.0/16"}}
		s.Exclusions = []v1alpha1.ExcludeRange{{StartIP: "10.1.200.0", EndIP: "10.1.200.255"}}
	})
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")),
		[]string{"0first=10.1.2.1-10.1.3.0", "a=10.1.0.1-10.1.1.0", "b=10.1.1.1-10.1.2.0"})
	if evs := f.events(); len(evs) != 0 {
		t.Errorf("unexpected events: %v", evs)
	}
}

func TestIPPoolReleaseGracePeriod(t *testing.T) {
	f := newFixture(t, 5*time.Minute)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.newIPPool("p", "10.2.0.0/24", 16, nil)
	f.reconcile(f.ip, "p")
	f.deleteNode("a")
	f.node("c", true, nil)

	res := f.reconcile(f.ip, "p")
	wantStrings(t, "blocks during grace", f.blocksOf(f.ipPool("p")),
		[]string{"a=10.2.0.1-10.2.0.16", "b=10.2.0.17-10.2.0.32", "c=10.2.0.33-10.2.0.48"})
	if res.RequeueAfter <= 0 || res.RequeueAfter > 5*time.Minute {
		t.Errorf("RequeueAfter = %s, want the rest of the grace period", res.RequeueAfter)
	}
	f.clock.Advance(4 * time.Minute)
	f.reconcile(f.ip, "p")
	if got := f.blocksOf(f.ipPool("p")); len(got) != 3 {
		t.Errorf("block released before the grace period ended: %v", got)
	}
	f.clock.Advance(time.Minute)
	f.node("d", true, nil)
	f.reconcile(f.ip, "p")
	// a's block is released, and not handed to d in the same reconcile.
	wantStrings(t, "blocks after grace", f.blocksOf(f.ipPool("p")),
		[]string{"b=10.2.0.17-10.2.0.32", "c=10.2.0.33-10.2.0.48", "d=10.2.0.49-10.2.0.64"})
	f.node("e", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks later", f.blocksOf(f.ipPool("p")),
		[]string{"b=10.2.0.17-10.2.0.32", "c=10.2.0.33-10.2.0.48", "d=10.2.0.49-10.2.0.64", "e=10.2.0.1-10.2.0.16"})
}

func TestIPPoolKeepsBlockWhileDaemonReportsItInUse(t *testing.T) {
	f := newFixture(t, 0)
	n := f.node("a", true, map[string]string{v1alpha1.PoolsInUseAnnotation: "other, p"})
	f.newIPPool("p", "10.3.0.0/24", 8, nil)
	f.reconcile(f.ip, "p")

	// The node stops matching; its daemon still holds addresses: the block stays,
	// even with a grace period of 0.
	n.Labels = nil
	if err := f.c.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Hour)
	f.reconcile(f.ip, "p")
	p := f.ipPool("p")
	wantStrings(t, "blocks while in use", f.blocksOf(p), []string{"a=10.3.0.1-10.3.0.8"})
	if p.Status.SelectedNodes != 0 || p.Status.AllocatedNodes != 1 {
		t.Errorf("selected %d allocated %d, want 0 and 1", p.Status.SelectedNodes, p.Status.AllocatedNodes)
	}

	delete(n.Annotations, v1alpha1.PoolsInUseAnnotation)
	if err := f.c.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	f.reconcile(f.ip, "p")
	if got := f.blocksOf(f.ipPool("p")); len(got) != 0 {
		t.Errorf("block kept after the daemon released the pool: %v", got)
	}
}

func TestIPPoolSpecEditReplacesBlocksWithWarning(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.newIPPool("p", "10.4.0.0/24", 10, nil)
	f.reconcile(f.ip, "p")
	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) {
		// Excluding all of a's block makes it unusable; b's block is untouched.
		s.Exclusions = []v1alpha1.ExcludeRange{{StartIP: "10.4.0.1", EndIP: "10.4.0.10"}}
	})
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.4.0.21-10.4.0.30", "b=10.4.0.11-10.4.0.20"})
	evs := f.events()
	if len(evs) != 1 || !strings.Contains(evs[0], "Warning BlockReplaced") || !strings.Contains(evs[0], f.nodeName("a")) {
		t.Errorf("events = %v, want one BlockReplaced warning naming %s", evs, f.nodeName("a"))
	}

	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 20 })
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks after a block size change", f.blocksOf(f.ipPool("p")),
		// Each node's new block is clear of the other node's old block, where its
		// daemon may still hold addresses, and overlaps the node's own where it
		// can: b's old .11-.20 lies in the first block, clear of a's.
		[]string{"a=10.4.0.21-10.4.0.40", "b=10.4.0.1-10.4.0.20"})
	if evs := f.events(); len(evs) != 2 {
		t.Errorf("events = %v, want a BlockReplaced warning for each node", evs)
	}
}

func TestIPPoolExhaustion(t *testing.T) {
	f := newFixture(t, 0)
	for _, n := range []string{"e", "d", "c", "b", "a"} {
		f.node(n, true, nil)
	}
	// 10.5.0.0/29: usable .1-.6, three blocks of 2; the gateway's block is still used.
	f.newIPPool("p", "10.5.0.0/29", 2, func(s *v1alpha1.IPPoolSpec) { s.Gateway = "10.5.0.1" })
	f.reconcile(f.ip, "p")
	p := f.ipPool("p")
	wantStrings(t, "blocks", f.blocksOf(p), []string{"a=10.5.0.1-10.5.0.2", "b=10.5.0.3-10.5.0.4", "c=10.5.0.5-10.5.0.6"})
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionExhausted, metav1.ConditionTrue, "2 selected node(s) have no block")
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionReady, metav1.ConditionFalse, "")
	if evs := f.events(); len(evs) != 1 || !strings.Contains(evs[0], "Warning PoolExhausted") {
		t.Errorf("events = %v, want one PoolExhausted warning", evs)
	}
	f.reconcile(f.ip, "p")
	if evs := f.events(); len(evs) != 0 {
		t.Errorf("repeated exhaustion event: %v", evs)
	}

	f.deleteNode("b")
	f.reconcile(f.ip, "p") // b released; not reused in this reconcile
	wantStrings(t, "blocks after release", f.blocksOf(f.ipPool("p")), []string{"a=10.5.0.1-10.5.0.2", "c=10.5.0.5-10.5.0.6"})
	f.reconcile(f.ip, "p")
	p = f.ipPool("p")
	wantStrings(t, "blocks", f.blocksOf(p), []string{"a=10.5.0.1-10.5.0.2", "c=10.5.0.5-10.5.0.6", "d=10.5.0.3-10.5.0.4"})
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionExhausted, metav1.ConditionTrue, "1 selected node(s)")
}

func TestIPPoolSkipsEntirelyExcludedBlocks(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.newIPPool("p", "fd00:5::/120", 16, func(s *v1alpha1.IPPoolSpec) {
		s.Exclusions = []v1alpha1.ExcludeRange{{StartIP: "fd00:5::1", EndIP: "fd00:5::10"}, {StartIP: "fd00:5::15", EndIP: "fd00:5::16"}}
	})
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=fd00:5::11-fd00:5::20", "b=fd00:5::21-fd00:5::30"})
}

func TestInvalidSpecWithoutWebhook(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.newIPPool("p", "10.6.0.0/24", 10, func(s *v1alpha1.IPPoolSpec) { s.Gateway = "10.7.0.1" })
	f.reconcile(f.ip, "p")
	p := f.ipPool("p")
	if len(p.Status.Allocations) != 0 {
		t.Errorf("invalid pool got blocks: %v", f.blocksOf(p))
	}
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionInvalidSpec, metav1.ConditionTrue, "spec.gateway")
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionReady, metav1.ConditionFalse, "")

	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.Gateway = "10.6.0.1" })
	f.reconcile(f.ip, "p")
	p = f.ipPool("p")
	wantStrings(t, "blocks once fixed", f.blocksOf(p), []string{"a=10.6.0.1-10.6.0.10"})
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionInvalidSpec, metav1.ConditionFalse, "")
}

func TestOverlappingPoolsLaterOneConflicts(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.newIPPool("first", "10.8.0.0/16", 10, nil)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have second resolution
	f.newIPPool("second", "10.8.5.0/24", 10, nil)
	f.create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "third"},
		Spec: v1alpha1.CIDRPoolSpec{CIDR: "10.8.128.0/17", PerNodeNetworkPrefix: 24, NodeSelector: f.selector()}})
	for _, n := range []string{"second", "first"} {
		f.reconcile(f.ip, n)
	}
	f.reconcile(f.cidr, "third")
	if got := f.blocksOf(f.ipPool("first")); len(got) != 1 {
		t.Errorf("the older pool has blocks %v, want one", got)
	}
	second := f.ipPool("second")
	if len(second.Status.Allocations) != 0 {
		t.Errorf("the later, overlapping pool got blocks: %v", f.blocksOf(second))
	}
	wantCondition(t, second.Status.PoolStatusCommon, v1alpha1.ConditionConflict, metav1.ConditionTrue, "IPPool first (10.8.0.0-10.8.255.255)")
	third := f.cidrPool("third")
	wantCondition(t, third.Status.PoolStatusCommon, v1alpha1.ConditionConflict, metav1.ConditionTrue, "IPPool first")

	// Deleting the older pool resolves the conflict.
	if err := f.c.Delete(t.Context(), f.ipPool("first")); err != nil {
		t.Fatal(err)
	}
	f.reconcile(f.ip, "second")
	second = f.ipPool("second")
	wantStrings(t, "blocks after the conflict ends", f.blocksOf(second), []string{"a=10.8.5.1-10.8.5.10"})
	wantCondition(t, second.Status.PoolStatusCommon, v1alpha1.ConditionConflict, metav1.ConditionFalse, "")
}

func TestCIDRPoolStaticAllocationsAndGateways(t *testing.T) {
	f := newFixture(t, 0)
	for _, n := range []string{"a", "b", "pinned"} {
		f.node(n, true, nil)
	}
	f.create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1alpha1.CIDRPoolSpec{
		CIDR: "10.9.0.0/16", PerNodeNetworkPrefix: 24, GatewayIndex: ptr.To[int32](1), NodeSelector: f.selector(),
		Exclusions: []v1alpha1.ExcludeRange{{StartIP: "10.9.1.0", EndIP: "10.9.1.255"}},
		StaticAllocations: []v1alpha1.CIDRPoolStaticAllocation{
			{Prefix: "10.9.0.0/24"}, // reserved for nobody
			{NodeName: f.nodeName("pinned"), Prefix: "10.9.3.0/24", Gateway: "10.9.3.254"},
		},
	}})
	f.reconcile(f.cidr, "c")
	p := f.cidrPool("c")
	wantStrings(t, "prefixes", f.prefixesOf(p),
		[]string{"a=10.9.2.0/24@10.9.2.1", "b=10.9.4.0/24@10.9.4.1", "pinned=10.9.3.0/24@10.9.3.254"})
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionReady, metav1.ConditionTrue, "")
}

func TestCIDRPoolIPv6(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "v6"}, Spec: v1alpha1.CIDRPoolSpec{
		CIDR: "fd00:9::/48", PerNodeNetworkPrefix: 64, NodeSelector: f.selector()}})
	f.reconcile(f.cidr, "v6")
	wantStrings(t, "prefixes", f.prefixesOf(f.cidrPool("v6")), []string{"a=fd00:9::/64", "b=fd00:9:0:1::/64"})
}

func TestCIDRPoolPinMovesPrefixAndRequeues(t *testing.T) {
	f := newFixture(t, 0)
	f.node("y", true, nil)
	f.create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1alpha1.CIDRPoolSpec{
		CIDR: "10.11.0.0/23", PerNodeNetworkPrefix: 24, NodeSelector: f.selector()}})
	f.reconcile(f.cidr, "c")
	wantStrings(t, "prefixes", f.prefixesOf(f.cidrPool("c")), []string{"y=10.11.0.0/24"})

	f.node("x", true, nil)
	p := f.cidrPool("c")
	p.Spec.StaticAllocations = []v1alpha1.CIDRPoolStaticAllocation{{NodeName: f.nodeName("x"), Prefix: "10.11.0.0/24"}}
	if err := f.c.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	res := f.reconcile(f.cidr, "c")
	// y's prefix is now pinned to x: y gets the other prefix, x waits one reconcile
	// for its pin, and the reconciler asks for that reconcile itself.
	wantStrings(t, "prefixes", f.prefixesOf(f.cidrPool("c")), []string{"y=10.11.1.0/24"})
	if res.RequeueAfter <= 0 || res.RequeueAfter > 2*time.Second {
		t.Errorf("RequeueAfter = %s, want a prompt requeue for the waiting node", res.RequeueAfter)
	}
	f.reconcile(f.cidr, "c")
	wantStrings(t, "prefixes", f.prefixesOf(f.cidrPool("c")), []string{"x=10.11.0.0/24", "y=10.11.1.0/24"})
}

func TestOverlapNeverHandsOutAnotherPoolsBlocks(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.node("b", true, nil)
	// An older pool with a typo is still an older pool: the newer overlapping one
	// gets no blocks.
	f.newIPPool("older", "10.12.0.0/24", 8, func(s *v1alpha1.IPPoolSpec) { s.Gateway = "10.99.0.1" })
	time.Sleep(1100 * time.Millisecond)
	f.newIPPool("newer", "10.12.0.0/16", 8, nil)
	f.reconcile(f.ip, "older")
	f.reconcile(f.ip, "newer")
	if got := f.blocksOf(f.ipPool("newer")); len(got) != 0 {
		t.Fatalf("a pool overlapping an older, invalid pool got blocks: %v", got)
	}
	// Fix the typo; move the older pool elsewhere: the newer pool takes blocks.
	f.updateIPPool("older", func(s *v1alpha1.IPPoolSpec) { s.Gateway = ""; s.Subnet = "10.13.0.0/24" })
	f.reconcile(f.ip, "older")
	f.reconcile(f.ip, "newer")
	wantStrings(t, "newer's blocks", f.blocksOf(f.ipPool("newer")), []string{"a=10.12.0.1-10.12.0.8", "b=10.12.0.9-10.12.0.16"})
	// Now the older pool is edited to overlap the newer one, which holds blocks:
	// the newer one keeps them (Conflict), and the older one never hands them out.
	f.updateIPPool("older", func(s *v1alpha1.IPPoolSpec) { s.Subnet = "10.12.0.0/27" })
	f.reconcile(f.ip, "newer")
	f.reconcile(f.ip, "older")
	newer := f.ipPool("newer")
	wantCondition(t, newer.Status.PoolStatusCommon, v1alpha1.ConditionConflict, metav1.ConditionTrue, "blocks already held are kept")
	wantStrings(t, "newer's blocks in conflict", f.blocksOf(newer), []string{"a=10.12.0.1-10.12.0.8", "b=10.12.0.9-10.12.0.16"})
	wantStrings(t, "older's blocks", f.blocksOf(f.ipPool("older")), []string{"a=10.12.0.17-10.12.0.24"})
}

func TestCIDRPoolInUseAnnotationUsesStoreKey(t *testing.T) {
	f := newFixture(t, 0)
	n := f.node("a", true, map[string]string{v1alpha1.PoolsInUseAnnotation: "c"}) // the IPPool named c, not ours
	f.create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1alpha1.CIDRPoolSpec{
		CIDR: "10.14.0.0/16", PerNodeNetworkPrefix: 24, NodeSelector: f.selector()}})
	f.reconcile(f.cidr, "c")
	n.Labels = nil
	if err := f.c.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	f.reconcile(f.cidr, "c")
	if got := f.prefixesOf(f.cidrPool("c")); len(got) != 0 {
		t.Errorf("an annotation naming the IPPool c kept the CIDRPool c's prefix: %v", got)
	}
	n.Labels = map[string]string{testLabel: f.label}
	n.Annotations = map[string]string{v1alpha1.PoolsInUseAnnotation: v1alpha1.PoolKey(v1alpha1.KindCIDRPool, "c")}
	if err := f.c.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	f.reconcile(f.cidr, "c")
	n.Labels = nil
	if err := f.c.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	f.reconcile(f.cidr, "c")
	wantStrings(t, "prefix kept while in use", f.prefixesOf(f.cidrPool("c")), []string{"a=10.14.0.0/24"})
}

// A pool whose nodeSelector selects no node says so (issue 32): Ready, with
// reason NoNodeSelected, not "every selected node has a block".
func TestPoolSelectingNoNodeSaysSo(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", false, nil)
	f.newIPPool("p", "10.102.0.0/24", 8, nil)
	f.reconcile(f.ip, "p")
	st := f.ipPool("p").Status.PoolStatusCommon
	wantCondition(t, st, v1alpha1.ConditionReady, metav1.ConditionTrue, "selects no node")
	wantCondition(t, st, v1alpha1.ConditionExhausted, metav1.ConditionFalse, "selects no node")
	f.setSelected("a", true)
	f.reconcile(f.ip, "p")
	wantCondition(t, f.ipPool("p").Status.PoolStatusCommon, v1alpha1.ConditionReady, metav1.ConditionTrue, "every selected node has a block")
}
