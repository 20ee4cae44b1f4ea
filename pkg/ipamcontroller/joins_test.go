package ipamcontroller_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/test/harness"
)

// A node that joins gets its block from the pool's index of free blocks,
// without waiting for a plan of the whole pool (pkg/poolcontroller/joins.go).

// TestJoinPlacedWhileThePoolsPlanIsStuck: the pool's plan is stuck in a status
// write that takes 20 s; a node that joins meanwhile has its block in its
// record within 5 s, a block no other node has, and the status lists it once
// the writes go through. Before the index, the join waited for the stuck plan
// and then for a plan of its own.
func TestJoinPlacedWhileThePoolsPlanIsStuck(t *testing.T) {
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
	w.faults.Add(harness.FaultRule{Path: poolStatusPath, Fault: harness.FaultSlow, Delay: 20 * time.Second})
	// d's join: placed, and the plan that follows it is stuck in its status
	// write.
	w.node("node-d")
	d := w.waitBlock("node-d")
	eventually(t, "a status write stuck", func() (bool, string) {
		hits := w.faults.Hits()
		return len(hits) > 0, fmt.Sprint(hits)
	})
	w.node("node-e")
	start := time.Now()
	var e string
	for e == "" && time.Since(start) < 5*time.Second {
		time.Sleep(50 * time.Millisecond)
		e = w.block("node-e")
	}
	if e == "" {
		t.Fatalf("node-e had no block 5 s after it joined, while the pool's plan was stuck: records %v", nodeBlocks(t, w.c, w.ns))
	}
	t.Logf("node-e's block %s in its record %s after its Node was created", e, time.Since(start).Round(time.Millisecond))
	if e == d {
		t.Fatalf("node-e got node-d's block %s", e)
	}
	w.checkOneOwner()
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
}

// TestJoinsRaceThePlans: nodes join, leave and change labels at random while
// the pool's plans run, its status writes are slow or refused now and then,
// and its layout is edited; after every step no range is in two nodes'
// records (a block of one and a block, or a reserved or held retired block,
// of another), and at the end the status lists what the records hold.
// Randomised; HWIPAM_SEED replays.
func TestJoinsRaceThePlans(t *testing.T) {
	rng := harness.Rand(t)
	w := newRecordsWorld(t, 10000)
	w.opts.ReleaseGracePeriod = 3 * time.Second
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: w.ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.9.0.0/24", PerNodeBlockSize: 8, NodeSelector: railSelector("r0")}}
	if err := w.c.Create(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	runController(t, w.opts)
	const names = 24
	exists := map[string]bool{}
	for step := range 80 {
		n := fmt.Sprintf("n%02d", rng.IntN(names))
		var did string
		switch k := rng.IntN(20); {
		case k < 9:
			if exists[n] {
				continue
			}
			labels := map[string]string{"nic.hwipam.io/rail.r": "r0"}
			if rng.IntN(5) == 0 {
				labels = nil
			}
			if err := w.c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: labels}}); err != nil {
				t.Fatal(err)
			}
			exists[n], did = true, "join "+n
		case k < 13:
			if !exists[n] {
				continue
			}
			if err := w.c.Delete(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			delete(exists, n)
			did = "delete " + n
		case k < 16:
			if !exists[n] {
				continue
			}
			var node corev1.Node
			if err := w.c.Get(t.Context(), client.ObjectKey{Name: n}, &node); err != nil {
				t.Fatal(err)
			}
			if node.Labels == nil {
				node.Labels = map[string]string{"nic.hwipam.io/rail.r": "r0"}
			} else {
				node.Labels = nil
			}
			if err := w.c.Update(t.Context(), &node); err != nil {
				t.Fatal(err)
			}
			did = "relabel " + n
		case k < 18:
			if rng.IntN(2) == 0 {
				w.faults.Add(harness.FaultRule{Path: poolStatusPath, Fault: harness.FaultSlow, Delay: time.Duration(1+rng.IntN(3)) * time.Second, Times: 3})
				did = "slow status writes"
			} else {
				w.faults.Add(harness.FaultRule{Path: poolStatusPath, Fault: harness.FaultRefused, Code: 500, Times: 3})
				did = "refused status writes"
			}
		default:
			var p v1alpha1.IPPool
			if err := w.c.Get(t.Context(), client.ObjectKeyFromObject(pool), &p); err != nil {
				t.Fatal(err)
			}
			p.Spec.PerNodeBlockSize = 12 - p.Spec.PerNodeBlockSize // 8 <-> 4
			if err := w.c.Update(t.Context(), &p); err != nil {
				t.Fatal(err)
			}
			did = fmt.Sprintf("blocks of %d", p.Spec.PerNodeBlockSize)
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		checkRecordsDisjoint(t, w, fmt.Sprintf("step %d (%s)", step, did))
	}
	w.faults.Clear()
	eventually(t, "the status listing what the records hold", func() (bool, string) {
		checkRecordsDisjoint(t, w, "at the end")
		st, _ := w.statusBlocks()
		bs := nodeBlocks(t, w.c, w.ns)
		recorded := 0
		for _, list := range bs {
			recorded += len(list)
		}
		ok := len(st) == recorded
		for n, b := range st {
			ok = ok && slices.Contains(bs[n], "IPPool/rail0="+b)
		}
		return ok, fmt.Sprintf("status %v, records %v", st, bs)
	})
}

// checkRecordsDisjoint fails when one address is in two nodes' records: in
// the blocks of both, or in the block of one and a retired block of the
// other that is still reserved or held.
func checkRecordsDisjoint(t *testing.T, w *recordsWorld, when string) {
	t.Helper()
	var list nodeipamv1.NodeIPAMList
	if err := w.c.List(t.Context(), &list, client.InNamespace(w.ns)); err != nil {
		t.Fatal(err)
	}
	type claim struct {
		node, what string
		r          iprange.Range
		current    bool
	}
	var claims []claim
	parse := func(s string) iprange.Range {
		t.Helper()
		r, err := iprange.ParseRange(s)
		if err != nil {
			t.Fatalf("%s: a record's range %q: %v", when, s, err)
		}
		return r
	}
	now := time.Now()
	for _, rec := range list.Items {
		for _, b := range rec.Spec.Blocks {
			claims = append(claims, claim{rec.Name, "block " + b.StartIP + "-" + b.EndIP, parse(b.StartIP + "-" + b.EndIP), true})
		}
		for _, rb := range rec.Spec.Retired {
			// A record keeps reservedUntil rounded up to the second: the
			// controller's reservation may have ended up to a second before.
			if rb.Held || (rb.ReservedUntil != nil && rb.ReservedUntil.After(now.Add(time.Second))) {
				claims = append(claims, claim{rec.Name, fmt.Sprintf("retired %s (held %t, reserved until %v, now %v)",
					rb.Range, rb.Held, rb.ReservedUntil, now.Format(time.RFC3339Nano)), parse(rb.Range), false})
			}
		}
	}
	for i, a := range claims {
		for _, b := range claims[i+1:] {
			if a.node != b.node && (a.current || b.current) && a.r.Overlaps(b.r) {
				t.Fatalf("%s: %s of %s overlaps %s of %s", when, a.what, a.node, b.what, b.node)
			}
		}
	}
}
