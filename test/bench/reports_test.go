package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
)

// scaleReports tells whether BenchmarkRailScale makes every node report its
// blocks (as its daemon would) before the joins: HWIPAM_BENCH_SCALE_REPORTS=0
// turns it off.
func scaleReports() bool { return os.Getenv("HWIPAM_BENCH_SCALE_REPORTS") != "0" }

// reportAll writes on every node that has a NodeIPAM in ns the held report its
// daemon would write (v1alpha1.HeldAnnotation: each pool's block, nothing held
// outside it), then waits until the controller has taken every report in: every
// record says that its daemon reports (NodeIPAMSpec.DaemonReports). It returns
// the nodes it annotated, and adds to out how long the writes took and how long
// until the records said so, with the CPU time of the API server, etcd and the
// controller over both.
func (w *scaleWorld) reportAll(b *testing.B, ns string, ctlPID int, out map[string]float64) []string {
	b.Helper()
	ctx := context.Background()
	var list nodeipamv1.NodeIPAMList
	if err := w.cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	cpuNow := func() [3]float64 {
		return [3]float64{cpuSeconds(b, w.apiserverPID), cpuSeconds(b, w.etcdPID), cpuSeconds(b, ctlPID)}
	}
	before := cpuNow()
	start := time.Now()
	nodes := make([]string, 0, len(list.Items))
	patches := make(map[string][]byte, len(list.Items))
	for i := range list.Items {
		rec := &list.Items[i]
		report := map[string]v1alpha1.PoolHold{}
		for _, bl := range rec.Spec.Blocks {
			report[v1alpha1.PoolKey(bl.Kind, bl.Pool)] = v1alpha1.PoolHold{Block: bl.StartIP + "-" + bl.EndIP}
		}
		raw, _ := json.Marshal(report)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			v1alpha1.HeldAnnotation: string(raw)}}})
		nodes = append(nodes, rec.Name)
		patches[rec.Name] = patch
	}
	list.Items = nil
	patchNodes(b, w.cp.Client, nodes, func(n string) []byte { return patches[n] })
	out["s-report-all"] = time.Since(start).Seconds()
	for {
		var recs nodeipamv1.NodeIPAMList
		if err := w.cp.Client.List(ctx, &recs, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
		reporting := 0
		for i := range recs.Items {
			if recs.Items[i].Spec.DaemonReports {
				reporting++
			}
		}
		if reporting >= len(nodes) {
			break
		}
		if time.Since(start) > scaleConvergeTimeout {
			b.Fatalf("%d of %d records say that their daemon reports %s after the reports were written", reporting, len(nodes),
				scaleConvergeTimeout)
		}
		time.Sleep(2 * time.Second)
	}
	cpu := cpuNow()
	out["s-reports-recorded"] = time.Since(start).Seconds()
	out["reports-apiserver-cpu-s"] = cpu[0] - before[0]
	out["reports-etcd-cpu-s"] = cpu[1] - before[1]
	out["reports-controller-cpu-s"] = cpu[2] - before[2]
	return nodes
}

// unreportAll removes the held reports reportAll wrote.
func (w *scaleWorld) unreportAll(b *testing.B, nodes []string) {
	b.Helper()
	start := time.Now()
	patch := []byte(`{"metadata":{"annotations":{"` + v1alpha1.HeldAnnotation + `":null}}}`)
	patchNodes(b, w.cp.Client, nodes, func(string) []byte { return patch })
	b.Logf("removed %d nodes' held reports in %s", len(nodes), time.Since(start).Round(time.Millisecond))
}

// patchNodes merge-patches each node with its patch, 16 at a time.
func patchNodes(b *testing.B, c client.Client, nodes []string, patch func(string) []byte) {
	b.Helper()
	inParallel(b, "patching nodes", len(nodes), func(i int) error {
		obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}}
		if err := c.Patch(context.Background(), obj, client.RawPatch("application/merge-patch+json", patch(nodes[i]))); err != nil {
			return fmt.Errorf("node %s: %w", nodes[i], err)
		}
		return nil
	})
}
