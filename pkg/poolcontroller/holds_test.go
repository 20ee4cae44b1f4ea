package poolcontroller_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
)

// report sets node short's daemon report (v1alpha1.HeldAnnotation).
func (f *fixture) report(short string, holds map[string]v1alpha1.PoolHold) {
	f.t.Helper()
	raw, err := json.Marshal(holds)
	if err != nil {
		f.t.Fatal(err)
	}
	var n corev1.Node
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Name: f.nodeName(short)}, &n); err != nil {
		f.t.Fatal(err)
	}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[v1alpha1.HeldAnnotation] = string(raw)
	if err := f.c.Update(f.t.Context(), &n); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) setSelected(short string, selected bool) {
	f.t.Helper()
	var n corev1.Node
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Name: f.nodeName(short)}, &n); err != nil {
		f.t.Fatal(err)
	}
	n.Labels = nil
	if selected {
		n.Labels = map[string]string{testLabel: f.label}
	}
	if err := f.c.Update(f.t.Context(), &n); err != nil {
		f.t.Fatal(err)
	}
}

// The example: blocks of 10 on a and b with live pods; block size 10 -> 20;
// c joins. c must get nothing overlapping a's or b's live addresses, also with no
// grace period, as long as the daemons report them.
func TestIPPoolLayoutEditKeepsLiveRangesFromOtherNodes(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.newIPPool("p", "10.88.0.0/24", 10, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.88.0.1-10.88.0.10", "b=10.88.0.11-10.88.0.20"})
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.88.0.1-10.88.0.10"}})
	f.report("b", map[string]v1alpha1.PoolHold{"p": {Block: "10.88.0.11-10.88.0.20"}})

	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 20 })
	f.reconcile(f.ip, "p")
	// The daemons have not acknowledged yet: their old blocks stay theirs.
	wantStrings(t, "blocks after the edit", f.blocksOf(f.ipPool("p")), []string{"a=10.88.0.21-10.88.0.40", "b=10.88.0.41-10.88.0.60"})
	f.node("c", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks after c joined", f.blocksOf(f.ipPool("p")),
		[]string{"a=10.88.0.21-10.88.0.40", "b=10.88.0.41-10.88.0.60", "c=10.88.0.61-10.88.0.80"})

	// The daemons acknowledge their new blocks; six pods each are left in the old
	// ones. d joins: 10.88.0.1-.20 holds a's and b's live addresses.
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.88.0.21-10.88.0.40", Held: []string{"10.88.0.1-10.88.0.6"}}})
	f.report("b", map[string]v1alpha1.PoolHold{"p": {Block: "10.88.0.41-10.88.0.60", Held: []string{"10.88.0.11-10.88.0.16"}}})
	f.node("d", true, nil)
	f.reconcile(f.ip, "p")
	p := f.ipPool("p")
	wantStrings(t, "blocks after d joined", f.blocksOf(p),
		[]string{"a=10.88.0.21-10.88.0.40", "b=10.88.0.41-10.88.0.60", "c=10.88.0.61-10.88.0.80", "d=10.88.0.81-10.88.0.100"})
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionOrphans, metav1.ConditionTrue, "10.88.0.1-10.88.0.6")

	// The old pods are gone: the old range is free again.
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.88.0.21-10.88.0.40"}})
	f.report("b", map[string]v1alpha1.PoolHold{"p": {Block: "10.88.0.41-10.88.0.60"}})
	f.node("e", true, nil)
	f.reconcile(f.ip, "p")
	p = f.ipPool("p")
	if got := f.blocksOf(p); !strings.Contains(strings.Join(got, " "), "e=10.88.0.1-10.88.0.20") {
		t.Errorf("blocks = %v, want e to get the freed 10.88.0.1-10.88.0.20", got)
	}
	wantCondition(t, p.Status.PoolStatusCommon, v1alpha1.ConditionOrphans, metav1.ConditionFalse, "")
}

// Without reports (no RBAC to annotate nodes), a block that no longer fits the
// spec is kept from other nodes for the grace period.
func TestIPPoolLayoutEditWithoutReportsHoldsForGrace(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	f.newIPPool("p", "10.89.0.0/24", 10, nil)
	f.reconcile(f.ip, "p")
	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 20 })
	f.reconcile(f.ip, "p")
	// a's new block may overlap its own old one.
	wantStrings(t, "blocks after the edit", f.blocksOf(f.ipPool("p")), []string{"a=10.89.0.1-10.89.0.20"})
	f.setSelected("a", false)
	f.node("b", true, nil)
	f.reconcile(f.ip, "p") // a departs (grace), b waits for a block clear of a's old one
	f.clock.Advance(time.Minute)
	f.reconcile(f.ip, "p")
	got := strings.Join(f.blocksOf(f.ipPool("p")), " ")
	if !strings.Contains(got, "b=10.89.0.21-10.89.0.40") {
		t.Errorf("blocks = %s, want b clear of a's blocks", got)
	}
}

// A block taken from a node (no longer selected, not in use, grace over) stays
// held while the daemon's last report still names it as its block: it may have
// allocated there since it last reported. Its acknowledgement frees it.
func TestIPPoolReleasedBlockWaitsForTheDaemon(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.newIPPool("p", "10.90.0.0/28", 7, nil)
	f.reconcile(f.ip, "p")
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.90.0.1-10.90.0.7"}})
	f.setSelected("a", false)
	f.node("b", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"b=10.90.0.8-10.90.0.14"})
	f.node("c", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks before a acknowledged", f.blocksOf(f.ipPool("p")), []string{"b=10.90.0.8-10.90.0.14"})
	// a saw the block go; one pod allocated in the meantime is still there.
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Held: []string{"10.90.0.3"}}})
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks with a's pod left", f.blocksOf(f.ipPool("p")), []string{"b=10.90.0.8-10.90.0.14"})
	f.report("a", map[string]v1alpha1.PoolHold{})
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks after a's pod left", f.blocksOf(f.ipPool("p")),
		[]string{"b=10.90.0.8-10.90.0.14", "c=10.90.0.1-10.90.0.7"})
}

// staleClient returns, for pools, the copy saved by freeze: a cache that lags the
// reconciler's own status write.
type staleClient struct {
	client.Client
	frozen client.Object
}

func (s *staleClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if s.frozen != nil && key == client.ObjectKeyFromObject(s.frozen) {
		if p, ok := obj.(*v1alpha1.IPPool); ok {
			s.frozen.(*v1alpha1.IPPool).DeepCopyInto(p)
			return nil
		}
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// A status write skipped because the cached pool looked current must not leave a
// node without its block: the reconciler reads the pool live when its cache may be
// older than its own last write.
func TestStatusConvergesWhenTheCacheLags(t *testing.T) {
	f := newFixture(t, 0)
	stale := &staleClient{Client: cp.Client}
	r := &poolcontroller.Reconciler{Client: stale, Reader: cp.Client, Kind: v1alpha1.KindIPPool, Now: f.clock.Now}
	f.node("a", true, nil)
	f.newIPPool("p", "10.92.0.0/24", 8, nil)
	f.reconcile(r, "p")
	stale.frozen = f.ipPool("p") // the cache keeps this version, with a's block
	f.setSelected("a", false)
	f.reconcile(r, "p") // reads the frozen pool, removes a's block
	wantStrings(t, "blocks after a left", f.blocksOf(f.ipPool("p")), nil)
	f.setSelected("a", true)
	f.reconcile(r, "p") // desired equals the frozen pool's status
	wantStrings(t, "blocks after a came back", f.blocksOf(f.ipPool("p")), []string{"a=10.92.0.1-10.92.0.8"})
}

// A pool reconciled again before the cache has seen the reconciler's own status
// write (another pool's event, a node's, right after the write) plans from that
// write: nothing is sent when nothing changed — not the whole status again over
// the stale resourceVersion, refused with a conflict — and a new node gets the
// next block while the others keep theirs.
func TestReconcileBeforeTheCacheSeesTheWrite(t *testing.T) {
	f := newFixture(t, 0)
	stale := &staleClient{Client: cp.Client}
	r := &poolcontroller.Reconciler{Client: stale, Reader: cp.Client, StatusWriter: newStatusWriter(t, cp),
		Kind: v1alpha1.KindIPPool, Now: f.clock.Now}
	f.node("a", true, nil)
	f.newIPPool("p", "10.95.0.0/24", 8, nil)
	stale.frozen = f.ipPool("p") // the cache keeps the pool as created, without status
	f.reconcile(r, "p")
	written := f.ipPool("p")
	f.reconcile(r, "p") // fails with a conflict if it writes over the frozen version
	if w := r.StatusWrites(); w != 1 {
		t.Errorf("%d status writes for one change, want 1", w)
	}
	if rv := f.ipPool("p").ResourceVersion; rv != written.ResourceVersion {
		t.Errorf("the pool was written again (resourceVersion %s -> %s)", written.ResourceVersion, rv)
	}
	f.node("b", true, nil)
	f.reconcile(r, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.95.0.1-10.95.0.8", "b=10.95.0.9-10.95.0.16"})
}

// A Node re-registered without annotations keeps its last report until its daemon
// reports again, however long that takes (its daemon may be down: killed, crash-
// looping), inside what the controller gave it. Found by the whole-system test:
// seed 933375 (a pool created within the grace period), and seed 35804, where the
// daemon stayed down past the grace period and a pool edit then gave another node a
// block over an address it held. Once the Node object is gone, the report lasts the
// grace period. (Before issue 38 this test had a report a pool the controller had
// never given a block in, adopted at the pool's first reconcile: that window is
// closed, see TestForgedReportOfAPoolCreatedLaterTakesNothing.)
func TestReportOfARecreatedNodeIsKeptUntilItReports(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	f.node("b", true, nil)
	f.newIPPool("p", "10.93.0.0/24", 4, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.93.0.1-10.93.0.4", "b=10.93.0.5-10.93.0.8"})
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.93.0.1-10.93.0.4"}})
	f.reconcile(f.ip, "p")
	// a re-registers without its annotations (nor the label), its daemon down:
	// its block is released after the grace period, and still held back for it.
	f.deleteNode("a")
	f.node("a", false, nil)
	f.reconcile(f.ip, "p")
	f.clock.Advance(time.Minute)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks past the grace period", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.5-10.93.0.8"})
	f.clock.Advance(5 * time.Minute)
	f.node("c", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks of a new node long past the grace period, a's daemon silent",
		f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.5-10.93.0.8", "c=10.93.0.9-10.93.0.12"})

	// Node a gone: its report outlives it by the grace period, then the range is free.
	f.deleteNode("a")
	f.reconcile(f.ip, "p")
	f.node("d", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks of a new node while a is gone", f.blocksOf(f.ipPool("p")),
		[]string{"b=10.93.0.5-10.93.0.8", "c=10.93.0.9-10.93.0.12", "d=10.93.0.13-10.93.0.16"})
	f.clock.Advance(time.Minute)
	f.node("e", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks of a new node once a has been gone for the grace period", f.blocksOf(f.ipPool("p")),
		[]string{"b=10.93.0.5-10.93.0.8", "c=10.93.0.9-10.93.0.12", "d=10.93.0.13-10.93.0.16", "e=10.93.0.1-10.93.0.4"})

	// A daemon that reports again replaces the remembered report at once; a's
	// grant expired with its report: an address it now claims there counts for
	// nothing (see trust_test.go).
	f.node("a", false, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"held":["10.93.0.18"]}}`})
	f.node("g", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks of a new node after a reported again", f.blocksOf(f.ipPool("p")),
		[]string{"b=10.93.0.5-10.93.0.8", "c=10.93.0.9-10.93.0.12", "d=10.93.0.13-10.93.0.16", "e=10.93.0.1-10.93.0.4",
			"g=10.93.0.17-10.93.0.20"})
}
