package ipamcontroller_test

import (
	"fmt"
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
			eventually(t, "the status listing the 4 recorded blocks", func() (bool, string) {
				st, _ := w.statusBlocks()
				bs := nodeBlocks(t, w.c, w.ns)
				ok := len(st) == 4
				for n, b := range st {
					ok = ok && slices.Contains(bs[n], "IPPool/rail0="+b)
				}
				return ok, fmt.Sprintf("status %v, records %v", st, bs)
			})
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
			if lost == "deleted" {
				lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: poolcontroller.MemoryLeaseName}}
				if err := w.c.Delete(t.Context(), lease); err != nil {
					t.Fatal(err)
				}
			} else if len(w.faults.Hits()) == 0 {
				t.Fatal("no Lease write met the fault")
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
