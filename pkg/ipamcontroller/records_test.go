package ipamcontroller_test

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamcontroller"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

// The NodeIPAMs are the record of which node holds which block: the planner
// plans from them, a block reaches a daemon only through them, and no failed,
// slow or lost write of a pool's status can give a block to two nodes. Each test
// here is a sequence a review reproduced against the controller that planned
// from the pool's status (issue 44, items 1-3).

// recordsWorld is a control plane, a controller whose API requests can be made
// to fail, and helpers to make nodes and read their records.
type recordsWorld struct {
	t      *testing.T
	cp     *harness.ControlPlane
	c      client.Client
	faults *harness.Faults
	opts   *ipamcontroller.Options
	ns     string
}

func newRecordsWorld(t *testing.T, maxListed int) *recordsWorld {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	w := &recordsWorld{t: t, cp: cp, c: cp.Client, faults: harness.NewFaults(), ns: "default"}
	w.opts = ipamcontroller.NewOptions()
	w.opts.RestConfig = w.faults.Wrap(cp.Config)
	w.opts.PoolsNamespace, w.opts.LeaderElectNamespace = w.ns, w.ns
	w.opts.MetricsBindAddress, w.opts.HealthProbeBindAddress = "0", "0"
	w.opts.ReleaseGracePeriod = 0
	w.opts.StatusAllocationsMaxNodes = maxListed
	return w
}

func (w *recordsWorld) node(name string) {
	w.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nic.hwipam.io/rail.r": "r0"}}}
	if err := w.c.Create(w.t.Context(), n); err != nil {
		w.t.Fatal(err)
	}
}

func (w *recordsWorld) pool() *v1alpha1.IPPool {
	w.t.Helper()
	ip := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: w.ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.7.0.0/24", PerNodeBlockSize: 16, NodeSelector: railSelector("r0")}}
	if err := w.c.Create(w.t.Context(), ip); err != nil {
		w.t.Fatal(err)
	}
	return ip
}

// block returns node's IPPool block in its NodeIPAM, "" when it has none.
func (w *recordsWorld) block(node string) string {
	for _, b := range nodeBlocks(w.t, w.c, w.ns)[node] {
		if r, ok := strings.CutPrefix(b, "IPPool/rail0="); ok {
			return r
		}
	}
	return ""
}

func (w *recordsWorld) waitBlock(node string) string {
	w.t.Helper()
	var b string
	eventually(w.t, node+"'s block in its NodeIPAM", func() (bool, string) {
		b = w.block(node)
		return b != "", fmt.Sprint(nodeBlocks(w.t, w.c, w.ns))
	})
	return b
}

// statusBlocks returns the blocks the pool's status lists, by node.
func (w *recordsWorld) statusBlocks() (map[string]string, string) {
	var p v1alpha1.IPPool
	if err := w.c.Get(w.t.Context(), client.ObjectKey{Namespace: w.ns, Name: "rail0"}, &p); err != nil {
		w.t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range p.Status.Allocations {
		out[a.NodeName] = a.StartIP + "-" + a.EndIP
	}
	return out, p.Status.BlocksIn
}

// checkOneOwner fails when one block is in two nodes' records, or the status
// gives a node's recorded block to another node.
func (w *recordsWorld) checkOneOwner() {
	w.t.Helper()
	bs := nodeBlocks(w.t, w.c, w.ns)
	checkDisjoint(w.t, bs)
	owner := map[string]string{}
	for node, list := range bs {
		for _, b := range list {
			owner[b] = node
		}
	}
	st, _ := w.statusBlocks()
	for node, b := range st {
		if o, ok := owner["IPPool/rail0="+b]; ok && o != node {
			w.t.Fatalf("the status gives %s %s, which is %s's in its NodeIPAM", node, b, o)
		}
	}
}

// waitStatusLists waits until the pool's status lists n blocks, each the one
// its node's record gives it.
func (w *recordsWorld) waitStatusLists(n int) {
	w.t.Helper()
	eventually(w.t, fmt.Sprintf("the status listing the %d recorded blocks", n), func() (bool, string) {
		st, _ := w.statusBlocks()
		bs := nodeBlocks(w.t, w.c, w.ns)
		ok := len(st) == n
		for node, b := range st {
			ok = ok && slices.Contains(bs[node], "IPPool/rail0="+b)
		}
		return ok, fmt.Sprintf("status %v, records %v", st, bs)
	})
}

var poolStatusPath = regexp.MustCompile(`/ippools/rail0/status$`)

// TestFailedStatusWriteGivesNoBlockTwice: nodes b and c hold blocks; every write
// of the pool's status fails from then on; node d joins and its NodeIPAM gives it
// a block; node a joins. a must not get d's block, and d keeps its own, though no
// status ever listed it. Against the controller that planned from the status, a
// got d's block (and d a new one) in the next reconcile, with no restart.
func TestFailedStatusWriteGivesNoBlockTwice(t *testing.T) {
	for _, fault := range []harness.FaultRule{
		{Path: poolStatusPath, Fault: harness.FaultRefused, Code: 500},
		{Path: poolStatusPath, Fault: harness.FaultRefused, Code: 409},
		{Path: poolStatusPath, Fault: harness.FaultTimeout, Delay: 300 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%s-%d", fault.Fault, fault.Code), func(t *testing.T) {
			w := newRecordsWorld(t, 10000)
			w.node("node-b")
			w.node("node-c")
			w.pool()
			runController(t, w.opts)
			w.waitBlock("node-b")
			w.waitBlock("node-c")
			eventually(t, "the status listing b and c", func() (bool, string) {
				st, _ := w.statusBlocks()
				return len(st) == 2, fmt.Sprint(st)
			})
			w.faults.Add(fault)
			w.node("node-d")
			d := w.waitBlock("node-d")
			time.Sleep(time.Second) // reconciles after d's: the status write failed each time
			w.node("node-a")
			a := w.waitBlock("node-a")
			if a == d {
				t.Fatalf("node-a got node-d's block %s while every status write failed", a)
			}
			time.Sleep(2 * time.Second)
			if now := w.block("node-d"); now != d {
				t.Fatalf("node-d's block moved from %s to %s while every status write failed", d, now)
			}
			w.checkOneOwner()
			if hits := w.faults.Hits(); len(hits) == 0 {
				t.Fatalf("no status write met the fault")
			}
			// The writes go through again: the status lists what the records hold.
			w.faults.Clear()
			w.waitStatusLists(4)
			w.checkOneOwner()
		})
	}
}

// TestRecordDeletedWhileNoControllerRuns: above the threshold the records are
// the only place a node's block is written down. They are deleted while no
// controller runs (kubectl delete nodeipams --all), and a node that sorts before
// every other joins. The restarted controller must not give it a block another
// node's daemon still allocates from: the records stay (a finalizer) until the
// controller has read them, and are written back as they were.
func TestRecordDeletedWhileNoControllerRuns(t *testing.T) {
	w := newRecordsWorld(t, 1)
	for _, n := range []string{"node-b", "node-c", "node-d"} {
		w.node(n)
	}
	w.pool()
	stop := runController(t, w.opts)
	before := map[string]string{}
	for _, n := range []string{"node-b", "node-c", "node-d"} {
		before[n] = w.waitBlock(n)
	}
	eventually(t, "the status listing no block", func() (bool, string) {
		st, in := w.statusBlocks()
		return len(st) == 0 && in == v1alpha1.BlocksInNodeIPAM, fmt.Sprintf("%v in %q", st, in)
	})
	stop()
	var list nodeipamv1.NodeIPAMList
	if err := w.c.List(t.Context(), &list, client.InNamespace(w.ns)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if !slices.Contains(list.Items[i].Finalizers, nodeipamv1.Finalizer) {
			t.Errorf("%s's NodeIPAM has no finalizer %s: %v", list.Items[i].Name, nodeipamv1.Finalizer, list.Items[i].Finalizers)
		}
	}
	if err := w.c.DeleteAllOf(t.Context(), &nodeipamv1.NodeIPAM{}, client.InNamespace(w.ns)); err != nil {
		t.Fatal(err)
	}
	w.node("node-a")
	runController(t, w.opts)
	a := w.waitBlock("node-a")
	for n, b := range before {
		if a == b {
			t.Fatalf("node-a got %s, %s's block, after the NodeIPAMs were deleted while no controller ran", a, n)
		}
	}
	eventually(t, "every record written back as it was, and not terminating", func() (bool, string) {
		var list nodeipamv1.NodeIPAMList
		if err := w.c.List(t.Context(), &list, client.InNamespace(w.ns)); err != nil {
			return false, err.Error()
		}
		ok := len(list.Items) == 4
		var state []string
		for _, o := range list.Items {
			got := ""
			for _, b := range o.Spec.Blocks {
				got = b.StartIP + "-" + b.EndIP
			}
			if want, was := before[o.Name]; was && got != want {
				ok = false
			}
			if o.DeletionTimestamp != nil {
				ok = false
			}
			state = append(state, fmt.Sprintf("%s=%s deleting=%v", o.Name, got, o.DeletionTimestamp != nil))
		}
		return ok, strings.Join(state, " ")
	})
	w.checkOneOwner()
}

// nodeIPAMPath matches the writes of one node's NodeIPAM.
func nodeIPAMPath(node string) *regexp.Regexp {
	return regexp.MustCompile(`/nodeipams(/` + regexp.QuoteMeta(node) + `)?$`)
}

// TestStatusOmitsBlocksOnlyOnceRecorded: the pool crosses the threshold while
// one node's NodeIPAM cannot be written (its writes fail and wait in the rate
// limiter). The status must keep listing the blocks until that node's record
// holds its block: a controller that restarted in between would find the block
// in neither. Against the controller whose "idle" check looked at the queue's
// length only, the status stopped listing within a few seconds.
func TestStatusOmitsBlocksOnlyOnceRecorded(t *testing.T) {
	w := newRecordsWorld(t, 2)
	w.node("node-a")
	w.node("node-b")
	w.pool()
	runController(t, w.opts)
	w.waitBlock("node-a")
	w.waitBlock("node-b")
	eventually(t, "the status listing a and b", func() (bool, string) {
		st, _ := w.statusBlocks()
		return len(st) == 2, fmt.Sprint(st)
	})
	w.faults.Add(harness.FaultRule{Method: "POST", Path: nodeIPAMPath("node-c"), Fault: harness.FaultRefused, Code: 500})
	w.faults.Add(harness.FaultRule{Method: "PUT", Path: nodeIPAMPath("node-c"), Fault: harness.FaultRefused, Code: 500})
	w.node("node-c")
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		st, in := w.statusBlocks()
		var o nodeipamv1.NodeIPAM
		err := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "node-c"}, &o)
		if in == v1alpha1.BlocksInNodeIPAM && (apierrors.IsNotFound(err) || len(o.Spec.Blocks) == 0) {
			t.Fatalf("the status stopped listing blocks (%v) while node-c's NodeIPAM does not hold its block (%v)", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(w.faults.Hits()) == 0 {
		t.Fatalf("no NodeIPAM write of node-c met the fault")
	}
	w.faults.Clear()
	w.waitBlock("node-c")
	eventually(t, "the status listing no block once every record holds its block", func() (bool, string) {
		st, in := w.statusBlocks()
		return len(st) == 0 && in == v1alpha1.BlocksInNodeIPAM, fmt.Sprintf("%v in %q", st, in)
	})
	w.checkOneOwner()
}

// TestThresholdHysteresis: a pool whose status stopped listing its blocks above
// the threshold lists them again only some 5% below it (one block here), so a
// pool that hovers at the threshold does not rewrite its whole list at each join.
func TestThresholdHysteresis(t *testing.T) {
	w := newRecordsWorld(t, 4)
	nodes := []string{"node-a", "node-b", "node-c", "node-d", "node-e"}
	for _, n := range nodes {
		w.node(n)
	}
	w.pool()
	runController(t, w.opts)
	listed := func(want bool, n int) func() (bool, string) {
		return func() (bool, string) {
			var p v1alpha1.IPPool
			if err := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "rail0"}, &p); err != nil {
				return false, err.Error()
			}
			is := p.Status.BlocksIn == v1alpha1.BlocksInStatus
			return is == want && int(p.Status.AllocatedNodes) == n && (!want || len(p.Status.Allocations) == n),
				fmt.Sprintf("blocksIn %q, %d allocated, %d listed", p.Status.BlocksIn, p.Status.AllocatedNodes, len(p.Status.Allocations))
		}
	}
	eventually(t, "5 blocks, none listed", listed(false, 5))
	if err := w.c.Delete(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-e"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "4 blocks", listed(false, 4))
	time.Sleep(2 * time.Second)
	if ok, state := listed(false, 4)(); !ok {
		t.Fatalf("at the threshold (4 of 4) the status lists the blocks again: %s", state)
	}
	if err := w.c.Delete(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-d"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "3 blocks, listed again", listed(true, 3))
}

// TestRecordEditedWhileNoControllerRuns: above the threshold, node-b's record is
// edited by hand (another block) while no controller runs; node-b's daemon
// ignores the edit and keeps allocating from its block, as its report on its
// Node says. A node that joins meanwhile must not get node-b's block from the
// restarted controller, which has no trusted record of it: before, the edited
// record counted for nothing and node-b's report for nothing either (outside
// what the controller gave it), and the new node got the block (whole-system
// seed 501189, with the API faults).
func TestRecordEditedWhileNoControllerRuns(t *testing.T) {
	w := newRecordsWorld(t, 1)
	for _, n := range []string{"node-b", "node-c", "node-d"} {
		w.node(n)
	}
	w.pool()
	stop := runController(t, w.opts)
	b := w.waitBlock("node-b")
	w.waitBlock("node-c")
	w.waitBlock("node-d")
	eventually(t, "the status listing no block", func() (bool, string) {
		st, in := w.statusBlocks()
		return len(st) == 0 && in == v1alpha1.BlocksInNodeIPAM, fmt.Sprintf("%v in %q", st, in)
	})
	// node-b's daemon reports its block (and an address in use in it).
	report := fmt.Sprintf(`{"rail0":{"block":%q}}`, b)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:"rail0"}}}`, v1alpha1.HeldAnnotation, report, v1alpha1.PoolsInUseAnnotation)
	if err := w.c.Patch(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}},
		client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stop()
	var rec nodeipamv1.NodeIPAM
	if err := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "node-b"}, &rec); err != nil {
		t.Fatal(err)
	}
	rec.Spec.Blocks[0].StartIP, rec.Spec.Blocks[0].EndIP = "10.7.0.193", "10.7.0.208"
	if err := w.c.Update(t.Context(), &rec, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	w.node("node-a")
	// node-b's record cannot be written again for now: the pool says why its
	// report counts.
	w.faults.Add(harness.FaultRule{Path: regexp.MustCompile(`/nodeipams/node-b$`), Fault: harness.FaultRefused, Code: 500})
	runController(t, w.opts)
	a := w.waitBlock("node-a")
	if a == b {
		t.Fatalf("node-a got %s, node-b's block, while node-b's record was edited by hand and its daemon reports holding it", a)
	}
	untrusted := func(want bool) func() (bool, string) {
		return func() (bool, string) {
			var p v1alpha1.IPPool
			if err := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "rail0"}, &p); err != nil {
				return false, err.Error()
			}
			c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionRecordsUntrusted)
			if !want {
				return c == nil, fmt.Sprintf("%+v", c)
			}
			return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "(node-b)"), fmt.Sprintf("%+v", c)
		}
	}
	eventually(t, "the pool's RecordsUntrusted condition naming node-b", untrusted(true))
	w.faults.Clear()
	eventually(t, "no RecordsUntrusted condition once node-b's record is the controller's again", untrusted(false))
	eventually(t, "node-b's record written again by the controller, with its block", func() (bool, string) {
		var o nodeipamv1.NodeIPAM
		if err := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "node-b"}, &o); err != nil {
			return false, err.Error()
		}
		got := o.Spec.Blocks[0].StartIP + "-" + o.Spec.Blocks[0].EndIP
		return nodeipamv1.OwnedByController(&o) && got == b, fmt.Sprintf("%s owned %v", got, nodeipamv1.OwnedByController(&o))
	})
	w.checkOneOwner()
}

// TestRetiredBlocksKeptByTheRecords: a layout edit takes node-a's and node-b's
// blocks, each held back for the grace period (an hour) whatever the daemons
// report (these report nothing, as nv-ipam's daemons). The controller restarts
// without the Lease that kept them: deleted while no controller ran, or never
// written (its writes refused, as when it grew too large: issue 44, item 4).
// node-c joins and must get no address of a retired block. The records list
// every retired block, with its reservation.
func TestRetiredBlocksKeptByTheRecords(t *testing.T) {
	for _, lost := range []string{"deleted", "refused"} {
		t.Run(lost, func(t *testing.T) {
			w := newRecordsWorld(t, 1)
			w.opts.ReleaseGracePeriod = time.Hour
			if lost == "refused" {
				leases := regexp.MustCompile(`/leases(/` + poolcontroller.MemoryLeaseName + `)?$`)
				w.faults.Add(harness.FaultRule{Method: "POST", Path: leases, Fault: harness.FaultRefused, Code: 500})
				w.faults.Add(harness.FaultRule{Method: "PUT", Path: leases, Fault: harness.FaultRefused, Code: 500})
			}
			w.node("node-a")
			w.node("node-b")
			ip := w.pool()
			stop := runController(t, w.opts)
			before := map[string]string{"node-a": w.waitBlock("node-a"), "node-b": w.waitBlock("node-b")}
			patch := []byte(`{"spec":{"perNodeBlockSize":32}}`)
			if err := w.c.Patch(t.Context(), ip, client.RawPatch("application/merge-patch+json", patch)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "node-a and node-b with blocks of 32", func() (bool, string) {
				ok := true
				for n := range before {
					r, err := iprange.ParseRange(w.block(n))
					ok = ok && err == nil && r.Size() == iprange.U64(32)
				}
				return ok, fmt.Sprint(nodeBlocks(t, w.c, w.ns))
			})
			stop()
			// With records, the controller writes no Lease of held reports
			// (an earlier version did, and lost them with it).
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: poolcontroller.MemoryLeaseName}}
			if err := w.c.Delete(t.Context(), lease); !apierrors.IsNotFound(err) {
				t.Fatalf("deleting the held reports' Lease, which the controller no longer writes: %v", err)
			}
			w.node("node-c")
			runController(t, w.opts)
			c, err := iprange.ParseRange(w.waitBlock("node-c"))
			if err != nil {
				t.Fatal(err)
			}
			for n, b := range before {
				if r, _ := iprange.ParseRange(b); r.Overlaps(c) {
					t.Fatalf("node-c got %s, which overlaps %s retired from %s an hour's grace period ago at most", c, b, n)
				}
			}
			w.checkOneOwner()
			for n, b := range before {
				var rec nodeipamv1.NodeIPAM
				if err := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: n}, &rec); err != nil {
					t.Fatal(err)
				}
				found := false
				for _, r := range rec.Spec.Retired {
					found = found || (r.Pool == "rail0" && r.Kind == v1alpha1.KindIPPool && r.Range == b && r.PoolUID == ip.UID &&
						r.ReservedUntil != nil && r.ReservedUntil.After(time.Now().Add(50*time.Minute)))
				}
				if !found {
					t.Errorf("%s's record does not list %s as retired and reserved for the grace period: %+v", n, b, rec.Spec.Retired)
				}
			}
		})
	}
}

// annotate writes node's held report (v1alpha1.HeldAnnotation) as its daemon
// would.
func (w *recordsWorld) annotate(node, report string) {
	w.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.HeldAnnotation: report}}})
	if err := w.c.Patch(w.t.Context(), n, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		w.t.Fatal(err)
	}
}

// record returns node's NodeIPAM.
func (w *recordsWorld) record(node string) nodeipamv1.NodeIPAM {
	w.t.Helper()
	var rec nodeipamv1.NodeIPAM
	if err := w.c.Get(w.t.Context(), client.ObjectKey{Namespace: w.ns, Name: node}, &rec); err != nil {
		w.t.Fatal(err)
	}
	return rec
}

// TestFreshInstallTrustsOnlyItsRecords: on a fresh install (no Lease, no
// records), node-a's report, written before the controller's first start,
// claims the whole pool. It counts for nothing the controller did not give
// node-a: node-b and node-c get blocks. The controller that adopted the reports
// as they stood at its first reconcile (issue 44, item 7) gave them none: one
// node's forged report kept every other node without a block.
func TestFreshInstallTrustsOnlyItsRecords(t *testing.T) {
	w := newRecordsWorld(t, 10)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		w.node(n)
	}
	w.annotate("node-a", `{"rail0":{"held":["10.7.0.1-10.7.0.254"]}}`)
	w.pool()
	runController(t, w.opts)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		w.waitBlock(n)
	}
	w.checkOneOwner()
	var p v1alpha1.IPPool
	if err := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "rail0"}, &p); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionExhausted); c != nil && c.Status == metav1.ConditionTrue {
		t.Fatalf("the pool is exhausted by node-a's forged report: %s", c.Message)
	}
}

// TestSilentNodeKeepsItsRetiredBlockWithoutTheLease: node-a's daemon reports
// holding its block; a layout edit retires it; the controller stops; node-a's
// Node is registered again without its report (its daemon is down) and the
// held-reports Lease is gone. The restarted controller has only the records:
// node-a's says its daemon reports and held addresses in the retired block, so
// the block goes to no node that joins, past --min-grant-age, until node-a's
// daemon reports again. With the Lease as the only memory of the report, node-c
// got the block once the grant's minimum age had passed.
func TestSilentNodeKeepsItsRetiredBlockWithoutTheLease(t *testing.T) {
	w := newRecordsWorld(t, 10)
	w.opts.MinGrantAge = time.Second
	w.node("node-a")
	w.node("node-b")
	ip := w.pool()
	stop := runController(t, w.opts)
	a := w.waitBlock("node-a")
	w.waitBlock("node-b")
	w.annotate("node-a", `{"rail0":{"block":"`+a+`"}}`)
	// The record says so once the controller has read the report (a record
	// of a controller before DaemonReports says nothing: waited for a while).
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !w.record("node-a").Spec.DaemonReports; {
		time.Sleep(100 * time.Millisecond)
	}
	patch := []byte(`{"spec":{"perNodeBlockSize":32}}`)
	if err := w.c.Patch(t.Context(), ip, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node-a with a block of 32, its block of 16 retired", func() (bool, string) {
		r, err := iprange.ParseRange(w.block("node-a"))
		return err == nil && r.Size() == iprange.U64(32), fmt.Sprint(nodeBlocks(t, w.c, w.ns))
	})
	stop()
	rec := w.record("node-a")
	if !rec.Spec.DaemonReports || !slices.ContainsFunc(rec.Spec.Retired, func(r nodeipamv1.RetiredBlock) bool {
		return r.Range == a && r.Held
	}) {
		t.Errorf("node-a's record does not say that its daemon reports and holds addresses in %s: %+v", a, rec.Spec)
	}
	// Registered again, without the annotation; the Lease is gone (if there
	// is one).
	if err := w.c.Delete(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}); err != nil {
		t.Fatal(err)
	}
	w.node("node-a")
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: poolcontroller.MemoryLeaseName}}
	if err := w.c.Delete(t.Context(), lease); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	w.node("node-c")
	runController(t, w.opts)
	old, _ := iprange.ParseRange(a)
	c, _ := iprange.ParseRange(w.waitBlock("node-c"))
	time.Sleep(2 * w.opts.MinGrantAge)
	w.node("node-d") // a reconcile past the grant's minimum age
	d, _ := iprange.ParseRange(w.waitBlock("node-d"))
	for n, r := range map[string]iprange.Range{"node-c": c, "node-d": d} {
		if r.Overlaps(old) {
			t.Fatalf("%s got %s, which overlaps %s, retired from node-a whose silent daemon holds addresses in it", n, r, old)
		}
	}
	w.checkOneOwner()
	if rec := w.record("node-a"); !slices.ContainsFunc(rec.Spec.Retired, func(r nodeipamv1.RetiredBlock) bool { return r.Range == a }) {
		t.Fatalf("node-a's record no longer lists %s as retired: %+v", a, rec.Spec.Retired)
	}
	// node-a's daemon reports again, holding nothing in it: the block goes.
	w.annotate("node-a", `{"rail0":{"block":"`+w.block("node-a")+`"}}`)
	eventually(t, "node-a's retired block gone once its daemon reports holding nothing in it", func() (bool, string) {
		rec := w.record("node-a")
		return !slices.ContainsFunc(rec.Spec.Retired, func(r nodeipamv1.RetiredBlock) bool { return r.Range == a }), fmt.Sprint(rec.Spec)
	})
}

// TestLeaseOfAnEarlierControllerMovesIntoTheRecords: the held-reports Lease of
// a controller before the records kept a grant of node-a (retired two hours ago,
// which node-a's silent daemon last reported holding) and a reservation of
// node-b's retired block. The first controller with records writes both into
// the nodes' records, then says in the Lease that its content moved (so that a
// rollback to that earlier controller does not trust grants no longer kept
// there). Started again, with only the records, it still gives no joining
// node an address of either block.
func TestLeaseOfAnEarlierControllerMovesIntoTheRecords(t *testing.T) {
	w := newRecordsWorld(t, 10)
	w.opts.MinGrantAge = time.Second
	w.opts.ReleaseGracePeriod = time.Hour
	// Neither is selected by the pool any more (node-a's daemon is down: its
	// Node shows no report).
	for _, n := range []string{"node-a", "node-b"} {
		if err := w.c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	ip := w.pool()
	now := time.Now().UTC()
	payload, _ := json.Marshal(map[string]any{
		"reports": map[string]string{"node-a": `{"rail0":{"held":["10.7.0.1-10.7.0.16"]}}`},
		"given": map[string]any{"rail0": map[string]any{"node-a": []map[string]any{
			{"range": "10.7.0.1-10.7.0.16", "since": now.Add(-2 * time.Hour), "uid": ip.UID}}}},
		"reserved": map[string]any{w.ns + "/rail0": map[string]any{"uid": ip.UID, "ranges": []map[string]any{
			{"node": "node-b", "range": "10.7.0.17-10.7.0.32", "until": now.Add(time.Hour)}}}},
		"pools": map[string]any{"rail0": map[string]any{"uid": ip.UID, "network": "10.7.0.0/24"}},
	})
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(payload)
	_ = zw.Close()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: poolcontroller.MemoryLeaseName,
		Annotations: map[string]string{poolcontroller.MemoryAnnotation: base64.StdEncoding.EncodeToString(gz.Bytes())}}}
	if err := w.c.Create(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
	held, _ := iprange.ParseRange("10.7.0.1-10.7.0.32")
	checkClear := func(nodes ...string) {
		t.Helper()
		for _, n := range nodes {
			if r, _ := iprange.ParseRange(w.waitBlock(n)); r.Overlaps(held) {
				t.Fatalf("%s got %s, which overlaps node-a's held grant or node-b's reserved block (%s)", n, r, held)
			}
		}
	}
	w.node("node-c")
	stop := runController(t, w.opts)
	checkClear("node-c")
	eventually(t, "node-a's and node-b's records", func() (bool, string) {
		errA := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "node-a"}, &nodeipamv1.NodeIPAM{})
		errB := w.c.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "node-b"}, &nodeipamv1.NodeIPAM{})
		return errA == nil && errB == nil, fmt.Sprint(errA, errB)
	})
	eventually(t, "the Lease saying its content moved into the records", func() (bool, string) {
		var l coordinationv1.Lease
		if err := w.c.Get(t.Context(), client.ObjectKeyFromObject(lease), &l); err != nil {
			return false, err.Error()
		}
		kept := decodeLease(t, l.Annotations[poolcontroller.MemoryAnnotation])
		return kept["movedToRecords"] == true && kept["given"] == nil && kept["pools"] == nil, fmt.Sprint(kept)
	})
	a, b := w.record("node-a").Spec, w.record("node-b").Spec
	if !a.DaemonReports || !slices.ContainsFunc(a.Retired, func(r nodeipamv1.RetiredBlock) bool {
		return r.Range == "10.7.0.1-10.7.0.16" && r.Held && r.PoolUID == ip.UID
	}) {
		t.Errorf("node-a's record does not keep the grant its silent daemon holds addresses in: %+v", a)
	}
	if !slices.ContainsFunc(b.Retired, func(r nodeipamv1.RetiredBlock) bool {
		return r.Range == "10.7.0.17-10.7.0.32" && r.ReservedUntil != nil && r.ReservedUntil.After(now.Add(50*time.Minute))
	}) {
		t.Errorf("node-b's record does not keep the reservation: %+v", b)
	}
	stop()
	w.node("node-d")
	runController(t, w.opts)
	time.Sleep(2 * w.opts.MinGrantAge)
	w.node("node-e")
	checkClear("node-d", "node-e")
	w.checkOneOwner()
}

// decodeLease returns the JSON object a held-reports Lease's annotation holds.
func decodeLease(t *testing.T, value string) map[string]any {
	t.Helper()
	gz, err := base64.StdEncoding.DecodeString(value)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
