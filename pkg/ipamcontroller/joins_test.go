package ipamcontroller_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
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
// write that takes 12 s; a node that joins meanwhile has its block in its
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
	w.waitStatusLists(2)
	w.faults.Add(harness.FaultRule{Path: poolStatusPath, Fault: harness.FaultSlow, Delay: 12 * time.Second})
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
	w.waitStatusLists(4)
	w.checkOneOwner()
}

// TestJoinsRaceThePlans: nodes join, leave and change labels at random while
// the pool's plans run, its status writes are slow or refused now and then,
// and its layout is edited; each node's daemon reports holding addresses in
// every block its record gives it or lists as retired (as a daemon with pods
// in each would). After every step no range is in two nodes' records (a block
// of one and a block, or a retired block still reserved, of another), and at
// the end the status lists what the records hold. Some joins must have been
// placed from the index (hwipam_controller_joins_placed_total). Randomised;
// HWIPAM_SEED replays.
func TestJoinsRaceThePlans(t *testing.T) {
	rng := harness.Rand(t)
	w := newRecordsWorld(t, 10000)
	w.opts.ReleaseGracePeriod = 3 * time.Second
	metricsPort := freePort(t)
	w.opts.MetricsBindAddress = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	newPool := func() *v1alpha1.IPPool {
		return &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: w.ns},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.9.0.0/24", PerNodeBlockSize: 8, NodeSelector: railSelector("r0")}}
	}
	pool := newPool()
	if err := w.c.Create(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	runController(t, w.opts)
	eventually(t, "the controller's metrics", func() (bool, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return true, ""
	})
	placedBefore := scrapeCounter(t, metricsPort, `hwipam_controller_joins_placed_total{kind="IPPool"}`)
	const names = 24
	exists := map[string]bool{}
	reported := map[string]string{}
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
		t.Logf("step %d: %s", step, did)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		checkRecordsDisjoint(t, w, fmt.Sprintf("step %d (%s)", step, did))
		reportHolding(t, w, exists, reported)
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
	if placed := scrapeCounter(t, metricsPort, `hwipam_controller_joins_placed_total{kind="IPPool"}`); placed <= placedBefore {
		t.Fatalf("no join was placed from the pool's index (hwipam_controller_joins_placed_total %v, %v before)", placed, placedBefore)
	}
}

// reportHolding writes, for each node that exists, the report its daemon
// would if it held addresses in every block its record gives it or lists as
// retired, where that changed since the last (reported).
func reportHolding(t *testing.T, w *recordsWorld, exists map[string]bool, reported map[string]string) {
	t.Helper()
	var list nodeipamv1.NodeIPAMList
	if err := w.c.List(t.Context(), &list, client.InNamespace(w.ns)); err != nil {
		t.Fatal(err)
	}
	for _, rec := range list.Items {
		if !exists[rec.Name] {
			continue
		}
		type hold struct {
			Block string   `json:"block,omitempty"`
			Held  []string `json:"held,omitempty"`
		}
		var h hold
		for _, b := range rec.Spec.Blocks {
			if b.Pool == "rail0" {
				h.Block = b.StartIP + "-" + b.EndIP
			}
		}
		for _, rb := range rec.Spec.Retired {
			if rb.Pool == "rail0" {
				h.Held = append(h.Held, rb.Range)
			}
		}
		raw, err := json.Marshal(map[string]hold{"rail0": h})
		if err != nil {
			t.Fatal(err)
		}
		if reported[rec.Name] == string(raw) {
			continue
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: rec.Name}}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.HeldAnnotation: string(raw)}}})
		if err := w.c.Patch(t.Context(), n, client.RawPatch("application/merge-patch+json", patch)); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			t.Fatal(err)
		}
		reported[rec.Name] = string(raw)
	}
}

// scrapeCounter returns the value of a metric line (name and labels, as
// exposed) that the controller's metrics endpoint serves, 0 when absent.
func scrapeCounter(t *testing.T, port int, series string) float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", series, v)
			}
			return f
		}
	}
	return 0
}

// checkRecordsDisjoint fails when one address is in two nodes' records: in
// the blocks of both (of one pool UID), or in the block of one and a retired
// block of the other that is still reserved. A retired block whose daemon
// reports holding addresses in it is not checked: a report the controller
// reads after it gave the range to another node (a daemon that reports late,
// here one that reports only between steps) does not take it back.
func checkRecordsDisjoint(t *testing.T, w *recordsWorld, when string) {
	t.Helper()
	var list nodeipamv1.NodeIPAMList
	if err := w.c.List(t.Context(), &list, client.InNamespace(w.ns)); err != nil {
		t.Fatal(err)
	}
	type claim struct {
		node, what, uid string
		r               iprange.Range
		current         bool
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
			claims = append(claims, claim{rec.Name, "block " + b.StartIP + "-" + b.EndIP, string(b.PoolUID), parse(b.StartIP + "-" + b.EndIP), true})
		}
		for _, rb := range rec.Spec.Retired {
			// A record keeps reservedUntil rounded up to the second: the
			// controller's reservation may have ended up to a second before.
			if rb.ReservedUntil != nil && rb.ReservedUntil.After(now.Add(time.Second)) {
				claims = append(claims, claim{rec.Name, fmt.Sprintf("retired %s (reserved until %v, now %v)",
					rb.Range, rb.ReservedUntil, now.Format(time.RFC3339Nano)), string(rb.PoolUID), parse(rb.Range), false})
			}
		}
	}
	for i, a := range claims {
		for _, b := range claims[i+1:] {
			if a.node != b.node && (a.current || b.current) && !(a.current && b.current && a.uid != b.uid) && a.r.Overlaps(b.r) {
				t.Fatalf("%s: %s of %s overlaps %s of %s", when, a.what, a.node, b.what, b.node)
			}
		}
	}
}
