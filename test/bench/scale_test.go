package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolwatch"
	"github.com/hwipam/hwipam/test/harness"
)

// BenchmarkRailScale compares the two ways the ipam-controller hands nodes their
// blocks, at cluster sizes up to 100,000 nodes with 8 rail pools (IPPools
// selecting every node, blocks of 8):
//
//   - new: this tree's controller, with its default flags: each node's blocks in
//     its NodeIPAM, which that node's daemon watches by name; above
//     --status-allocations-max-nodes (10,000) the pools' status lists none.
//   - old: the controller of commit d626a56 (before NodeIPAM): the pools' status
//     lists every node's block, and every daemon watches every pool. It runs only
//     up to 20,000 nodes: one pool's status holds some 76 bytes a node, and etcd
//     stores at most 1.5 MiB (about 20,600 nodes). A refusal (StatusTooLarge) is
//     reported as old-status-too-large, not as a failure.
//
// For each size and design, one run (whatever b.N) in a namespace of its own
// (--ippools-namespace and --leader-elect-namespace), whose pools, NodeIPAMs,
// Lease and events are deleted afterwards (the benchmark waits until they are
// gone), reports, with the design's prefix (new-, old-):
//
//   - s-converge: from the 8 pools' creation, the controller started and ready,
//     until every node has its 8 blocks: new, a watch of the namespace's NodeIPAMs
//     (decoded with encoding/json into a few fields) saw each node's list 8
//     blocks; old, a watch of the pools saw each pool's status list every node.
//     15 minutes at most, after which the figure fails (the run stops there).
//     apiserver-cpu-s, etcd-cpu-s, controller-cpu-s and bench-cpu-s are the CPU
//     time of kube-apiserver, etcd, the controller and the benchmark itself over
//     that time; nodeipam-writes/node (new) the NodeIPAM versions the watch
//     saw, by node, and nodeipam-bytes the size of one (JSON, as stored).
//   - s-join-median and -max: over 3 joins, each one Node created (labelled like
//     the others) after convergence, from its create's return until (new) its
//     NodeIPAM lists 8 blocks, (old) all 8 pools' status list it.
//   - bytes/join and bytes/join-max: what another node's daemon reads for a
//     join, counted on the TCP connection (TLS and HTTP/2 framing included,
//     gzip as Go's transport asks for it, as client-go's does) of a watch opened
//     as a daemon watches, from just before the create until 3 s after the join
//     was served: new, that node's NodeIPAM by name (fieldSelector
//     metadata.name); old, the IPPools and CIDRPools of the namespace.
//   - burst-joins/s, burst-s-median, -p99, -max and burst-over-5s (new): after
//     those joins, Nodes created at 100 a second for a minute, as a cluster
//     autoscaler adds them (HWIPAM_BENCH_BURST_RATE, HWIPAM_BENCH_BURST_SECONDS;
//     0 seconds: none), each from its create's return until its NodeIPAM lists
//     8 blocks (see burst);
//   - controller-peak-RSS-MiB: its VmHWM at the end of the run;
//     status-writes and reconcile-errors: its counters then.
//   - daemon-start-s and daemon-RSS-MiB (new): the real ipam-node started for a
//     converged node, from exec until its first successful Allocate from a rail
//     pool, and its VmRSS 5 s later. The sub-benchmark nodes=5-tiny measures the
//     same in a 5-node world (one pool, 5 nodes of their own, before the other
//     nodes exist), to set a daemon in a 100,000-node cluster beside one in a
//     5-node cluster. The daemon runs with --nic-labels=off and
//     --pools-in-use-interval=0, so that it changes no Node.
//
// With HWIPAM_BENCH_PROFILE_DIR set, CPU profiles of the controller and of
// kube-apiserver are taken over the joins (HWIPAM_BENCH_PROFILE_SECONDS long).
//
// Each line the log prints per run says the same in words. ns/op is the wall
// time of the whole size: creating its nodes, then both designs.
//
// One control plane serves every size: the nodes of a size are added to those of
// the size before (createNodes, which logs how long that took).
//
// Environment: HWIPAM_BENCH_SCALE_SIZES (comma-separated node counts; default
// 1000,5000,20000,65000,100000), HWIPAM_BENCH_OLD_CONTROLLER_BIN (the old
// design's binary; by default built from d626a56 in a temporary git worktree,
// once, and kept in ~/.cache/hwipam/bench keyed by the commit). The full run
// takes well over an hour; `make bench` allows 180 minutes:
//
//	go test ./test/bench/ -run '^$' -bench BenchmarkRailScale -benchtime 1x -timeout 180m -v
func BenchmarkRailScale(b *testing.B) {
	sizes := scaleSizes(b)
	newBin := harness.BuildBinary(b, "./cmd/ipam-controller")
	oldBin := oldControllerBinary(b)
	w := &scaleWorld{nodeBin: harness.BuildBinary(b, "./cmd/ipam-node")}
	w.cp = harness.StartControlPlane(b, harness.ControlPlaneOptions{})
	var err error
	if w.kubeconfig, err = w.cp.WriteKubeconfig(b.TempDir()); err != nil {
		b.Fatal(err)
	}
	if w.httpClient, err = rest.HTTPClientFor(w.cp.Config); err != nil {
		b.Fatal(err)
	}
	w.apiserverPID, w.etcdPID, _ = controlPlanePIDs(b, w.cp)

	// First, while the cluster has no other node.
	b.Run("nodes=5-tiny", func(b *testing.B) {
		out := w.runTiny(b, newBin)
		for unit, v := range out {
			b.ReportMetric(v, "new-"+unit)
		}
		b.Logf("nodes=5 (tiny) new: daemon started (first Allocate) in %.3fs, RSS %.1f MiB 5 s later",
			out["daemon-start-s"], out["daemon-RSS-MiB"])
	})

	designs := []scaleDesign{{name: "new", bin: newBin, nodeIPAM: true}, {name: "old", bin: oldBin}}
	created := 0
	for _, nodes := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			start := time.Now()
			createNodes(b, w.cp.Client, created, nodes)
			created = nodes
			for _, d := range designs {
				if !d.nodeIPAM && nodes > oldDesignMaxNodes {
					b.Logf("nodes=%d old: not run: the old design lists every node in each pool's status, and a pool of "+
						"more than about 20,600 nodes is larger than etcd stores (1.5 MiB)", nodes)
					continue
				}
				runStart := time.Now()
				out := w.run(b, d, nodes)
				for unit, v := range out {
					b.ReportMetric(v, d.name+"-"+unit)
				}
				b.Logf("nodes=%d %s: %s (run took %s)", nodes, d.name, describeScaleRun(out), time.Since(runStart).Round(time.Second))
			}
			b.Logf("nodes=%d took %s wall-clock", nodes, time.Since(start).Round(time.Second))
		})
	}
}

const (
	// railPools is how many pools (rails) each node gets a block of.
	railPools = 8
	// railLabel selects the nodes of the rail pools (createNodes sets it).
	railLabel = "nic.hwipam.io/present"
	// oldDesignCommit is main before per-node delivery (NodeIPAM): the controller
	// writes the pools' status only, and daemons watch every pool.
	oldDesignCommit = "d626a56"
	// oldDesignMaxNodes is the largest size the old design runs at.
	oldDesignMaxNodes = 20000
	// scaleConvergeTimeout bounds a convergence; joinTimeout one join.
	scaleConvergeTimeout = 15 * time.Minute
	joinTimeout          = 5 * time.Minute
	// scaleJoins is how many nodes join after each convergence.
	scaleJoins = 3
	// wireSettle is how long after a join was served its bytes are still counted.
	wireSettle = 3 * time.Second
)

// scaleSizes is $HWIPAM_BENCH_SCALE_SIZES, or the default sizes.
func scaleSizes(b *testing.B) []int {
	b.Helper()
	v := os.Getenv("HWIPAM_BENCH_SCALE_SIZES")
	if v == "" {
		return []int{1000, 5000, 20000, 65000, 100000}
	}
	var sizes []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 100000 || len(sizes) > 0 && n <= sizes[len(sizes)-1] {
			b.Fatalf("HWIPAM_BENCH_SCALE_SIZES=%q: want node counts of 1 to 100000, increasing, separated by commas", v)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// oldControllerBinary returns $HWIPAM_BENCH_OLD_CONTROLLER_BIN, or the
// ipam-controller of oldDesignCommit: built once in a temporary git worktree of
// this repository and kept under the cache directory (as hack/test-assets.sh
// finds it), named after the full commit.
func oldControllerBinary(b *testing.B) string {
	b.Helper()
	if bin := os.Getenv("HWIPAM_BENCH_OLD_CONTROLLER_BIN"); bin != "" {
		return bin
	}
	root := harness.RepoRoot()
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).CombinedOutput()
		if err != nil {
			b.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	commit := git("rev-parse", "--verify", oldDesignCommit+"^{commit}")
	cache := os.Getenv("HWIPAM_CACHE_DIR")
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			b.Fatal(err)
		}
		cache = filepath.Join(dir, "hwipam")
	}
	bin := filepath.Join(cache, "bench", "ipam-controller-"+commit)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		b.Fatal(err)
	}
	src := filepath.Join(b.TempDir(), "src")
	git("worktree", "add", "--detach", src, commit)
	defer git("worktree", "remove", "--force", src)
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "./cmd/ipam-controller")
	cmd.Dir = src
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building the ipam-controller of %s: %v\n%s", oldDesignCommit, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		b.Fatal(err)
	}
	b.Logf("built the ipam-controller of %s into %s", oldDesignCommit, bin)
	return bin
}

// scaleWorld is what every run of BenchmarkRailScale shares.
type scaleWorld struct {
	cp                    *harness.ControlPlane
	kubeconfig            string
	httpClient            *http.Client // the benchmark's own watches
	nodeBin               string
	apiserverPID, etcdPID int
}

// scaleDesign is one way of delivering blocks: its controller binary, and
// whether it delivers them through NodeIPAMs.
type scaleDesign struct {
	name     string
	bin      string
	nodeIPAM bool
}

// run measures one design at one size (see BenchmarkRailScale) and returns its
// figures by unit.
func (w *scaleWorld) run(b *testing.B, d scaleDesign, nodes int) map[string]float64 {
	b.Helper()
	ns := w.namespace(b, "scale-"+d.name)
	var joined []string
	defer func() { w.remove(b, ns, joined) }() // after the controller's stop
	ctl := startController(b, d.bin, w.kubeconfig, ns, "--leader-elect-namespace", ns)
	defer ctl.stop()
	select {
	case <-ctl.working:
	case <-time.After(time.Minute):
		b.Fatalf("the controller's IPPool workers did not start within a minute of /readyz; its log ends:\n%s", ctl.tail())
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", ctl.metricsPort)
	out := map[string]float64{}
	defer func() {
		out["status-writes"] = scrapeSum(b, metricsURL, `hwipam_pool_status_writes_total{kind="IPPool"}`)
		out["reconcile-errors"] = scrapeSum(b, metricsURL, `hwipam_pool_reconcile_errors_total{kind="IPPool"}`)
		out["controller-peak-RSS-MiB"] = float64(peakRSSKiB(b, ctl.cmd.Process.Pid)) / 1024
		if n, lines := logProblems(ctl.log.String()); n > 0 {
			out["controller-log-problems"] = float64(n)
			b.Logf("nodes=%d %s: the controller logged %d errors and warnings; the first:\n%s", nodes, d.name, n, strings.Join(lines, "\n"))
		}
	}()

	if !w.converge(b, d, ns, nodes, ctl, metricsURL, out) {
		return out
	}
	snapshotHeap(b, ctl, fmt.Sprintf("railscale-%s-%d-converged", d.name, nodes))
	if d.nodeIPAM && scaleReports() {
		// Every node reports its 8 blocks, as its daemon would, before the
		// joins; taken off again after the run.
		reported := w.reportAll(b, ns, ctl.cmd.Process.Pid, out)
		defer w.unreportAll(b, reported)
		snapshotHeap(b, ctl, fmt.Sprintf("railscale-%s-%d-reported", d.name, nodes))
	}

	var served []time.Duration
	var wire []float64
	// With $HWIPAM_BENCH_PROFILE_DIR: CPU profiles of the controller and
	// kube-apiserver over the joins (set $HWIPAM_BENCH_PROFILE_SECONDS to
	// cover them), as railscale-<design>-<nodes>-joins.*.pprof.
	profiled := profileConvergence(b, w.cp, ctl.pprofPort, metricsURL, fmt.Sprintf("railscale-%s-%d-joins", d.name, nodes))
	defer profiled()
	for i := range scaleJoins {
		node := fmt.Sprintf("join-%s-%d-%d", d.name, nodes, i)
		joined = append(joined, node)
		took, bytes, err := w.join(b, d, ns, node, metricsURL)
		if errors.Is(err, errStatusTooLarge) {
			out["status-too-large"] = 1
			b.Logf("nodes=%d %s: the API server refused a pool's status as too large (StatusTooLarge) when %s joined: "+
				"this design cannot serve %d nodes", nodes, d.name, node, nodes+i+1)
			return out
		}
		if err != nil {
			b.Errorf("nodes=%d %s: %v; the controller's log ends:\n%s", nodes, d.name, err, ctl.tail())
			return out
		}
		served = append(served, took)
		wire = append(wire, float64(bytes))
	}
	slices.Sort(served)
	slices.Sort(wire)
	out["s-join-median"] = served[len(served)/2].Seconds()
	out["s-join-max"] = served[len(served)-1].Seconds()
	out["bytes/join"] = wire[len(wire)/2]
	out["bytes/join-max"] = wire[len(wire)-1]

	if d.nodeIPAM {
		// 100 joins a second for a minute (see burst).
		joined = append(joined, w.burst(b, ns, nodes, out)...)
		snapshotHeap(b, ctl, fmt.Sprintf("railscale-%s-%d-burst", d.name, nodes))
		start, rss := w.daemonStart(b, ns, createdNodeName(0), "rail0")
		out["daemon-start-s"] = start.Seconds()
		out["daemon-RSS-MiB"] = float64(rss) / 1024
	}
	return out
}

// dropFinalizers takes the controller's finalizer off the NodeIPAMs of ns (the
// controller has stopped), as an uninstall does, so that they can go.
func (w *scaleWorld) dropFinalizers(b *testing.B, ns string) {
	b.Helper()
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(nodeipamv1.GroupVersion.WithKind("NodeIPAMList"))
	if err := w.cp.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		b.Fatalf("listing the NodeIPAMs of %s: %v", ns, err)
	}
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	inParallel(b, "taking the finalizer off the NodeIPAMs", len(list.Items), func(i int) error {
		if len(list.Items[i].Finalizers) == 0 {
			return nil
		}
		obj := &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: list.Items[i].Name}}
		err := w.cp.Client.Patch(context.Background(), obj, client.RawPatch("application/merge-patch+json", patch))
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// createdNodeName is the name createNodes gives node i.
func createdNodeName(i int) string { return fmt.Sprintf("gpu-node-%05d", i) }

// converge creates the rail pools in ns and waits until each of nodes has its
// block of every one (see BenchmarkRailScale), filling in out. It reports
// whether they did: a timeout fails the benchmark, the old design's status
// refused as too large is a result (status-too-large).
func (w *scaleWorld) converge(b *testing.B, d scaleDesign, ns string, nodes int, ctl *controllerProc, metricsURL string,
	out map[string]float64) bool {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The watch starts before the first pool exists, so it sees every write.
	var writes atomic.Int64
	var done <-chan waitResult
	if d.nodeIPAM {
		done = w.waitNodeIPAMs(ctx, b, ns, "", railPools, nodes, &writes)
	} else {
		done = w.waitPools(ctx, b, ns, func(p *v1alpha1.IPPool) bool { return len(p.Status.Allocations) == nodes })
	}
	cpuNow := func() [4]float64 {
		return [4]float64{cpuSeconds(b, w.apiserverPID), cpuSeconds(b, w.etcdPID), cpuSeconds(b, ctl.cmd.Process.Pid),
			cpuSeconds(b, os.Getpid())}
	}
	before := cpuNow()
	start := time.Now()
	for p := range railPools {
		// A /12 per pool: 131,072 blocks of 8, room for 100,000 nodes.
		pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rail%d", p), Namespace: ns},
			Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.%d.0.0/12", 16*p), PerNodeBlockSize: 8,
				NodeSelector: selectLabel(railLabel, "true")}}
		if err := w.cp.Client.Create(ctx, pool); err != nil {
			b.Fatal(err)
		}
	}
	timeout := time.After(scaleConvergeTimeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				b.Fatalf("nodes=%d %s: waiting for the convergence: %v", nodes, d.name, r.err)
			}
			cpu := cpuNow()
			out["s-converge"] = r.at.Sub(start).Seconds()
			out["apiserver-cpu-s"] = cpu[0] - before[0]
			out["etcd-cpu-s"] = cpu[1] - before[1]
			out["controller-cpu-s"] = cpu[2] - before[2]
			out["bench-cpu-s"] = cpu[3] - before[3]
			if d.nodeIPAM {
				out["nodeipam-writes/node"] = float64(writes.Load()) / float64(nodes)
				// One node's object as stored: what each write carries.
				raw, err := w.cp.Clientset.CoreV1().RESTClient().Get().AbsPath(nodeIPAMPath(ns), createdNodeName(0)).DoRaw(ctx)
				if err != nil {
					b.Fatal(err)
				}
				out["nodeipam-bytes"] = float64(len(raw))
			}
			return true
		case <-tick.C:
			if !statusTooLarge(b, d, metricsURL) {
				continue
			}
			out["status-too-large"] = 1
			b.Logf("nodes=%d %s: the API server refused a pool's status as too large (StatusTooLarge) %s after the pools' "+
				"creation: this design cannot serve %d nodes", nodes, d.name, time.Since(start).Round(time.Millisecond), nodes)
			return false
		case <-timeout:
			b.Errorf("nodes=%d %s: not every node had its %d blocks %s after the pools' creation; the controller's log ends:\n%s",
				nodes, d.name, railPools, scaleConvergeTimeout, ctl.tail())
			return false
		}
	}
}

// errStatusTooLarge says the old design's controller reports a pool whose status
// the API server refused as too large.
var errStatusTooLarge = errors.New("a pool's status is too large to store")

// join creates node, labelled for the rail pools, and returns how long after
// its create returned it had its block of every pool, and how many bytes a watch
// opened as another node's daemon watches read from just before the create
// until wireSettle after that. It fails when the node did not get its blocks
// within joinTimeout, and with errStatusTooLarge when the controller (its
// metrics at metricsURL) reports a pool's status refused as too large.
func (w *scaleWorld) join(b *testing.B, d scaleDesign, ns, node, metricsURL string) (time.Duration, int64, error) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wire *wireWatch
	var done <-chan waitResult
	if d.nodeIPAM {
		// The watch of an existing node's daemon: its own NodeIPAM, by name.
		other := createdNodeName(0)
		_, rv, err := w.listNodeIPAMs(ctx, ns, other)
		if err != nil {
			b.Fatal(err)
		}
		wire = w.openWireWatch(b, nodeIPAMPath(ns)+"?"+url.Values{"watch": {"true"}, "resourceVersion": {rv},
			"fieldSelector": {"metadata.name=" + other}}.Encode())
		done = w.waitNodeIPAMs(ctx, b, ns, node, railPools, 1, nil)
	} else {
		// The old daemon's watches: every pool of both kinds.
		rv := w.poolsVersion(b, ns)
		q := "?" + url.Values{"watch": {"true"}, "resourceVersion": {rv}}.Encode()
		base := "/apis/" + v1alpha1.GroupVersion.Group + "/" + v1alpha1.GroupVersion.Version + "/namespaces/" + ns
		wire = w.openWireWatch(b, base+"/ippools"+q, base+"/cidrpools"+q)
		done = w.waitPools(ctx, b, ns, func(p *v1alpha1.IPPool) bool {
			return slices.ContainsFunc(p.Status.Allocations, func(a v1alpha1.Allocation) bool { return a.NodeName == node })
		})
	}
	defer wire.close()

	before := wire.bytes()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{railLabel: "true"}}}
	if err := w.cp.Client.Create(ctx, n); err != nil {
		b.Fatal(err)
	}
	created := time.Now()
	timeout := time.After(joinTimeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				b.Fatalf("waiting for %s's blocks: %v", node, r.err)
			}
			time.Sleep(time.Until(r.at.Add(wireSettle)))
			return r.at.Sub(created), wire.bytes() - before, nil
		case <-tick.C:
			if statusTooLarge(b, d, metricsURL) {
				return 0, 0, errStatusTooLarge
			}
		case <-timeout:
			return 0, 0, fmt.Errorf("node %s had not its %d blocks within %s of joining", node, railPools, joinTimeout)
		}
	}
}

// statusTooLarge reports whether the old design's controller (its metrics at
// metricsURL) has a pool whose status the API server refuses as too large.
func statusTooLarge(b *testing.B, d scaleDesign, metricsURL string) bool {
	b.Helper()
	return !d.nodeIPAM && scrapeSum(b, metricsURL, "hwipam_pool_status_too_large") > 0
}

// daemonStart starts ipam-node as node for the pools of ns and returns the time
// from its exec until its first successful Allocate from pool (an IPPool), and
// its VmRSS 5 s after that, in KiB.
func (w *scaleWorld) daemonStart(b *testing.B, ns, node, pool string) (time.Duration, int) {
	b.Helper()
	start := time.Now()
	d, _ := startNodeDaemonOn(b, w.nodeBin, w.kubeconfig, b.TempDir(), node, ns, "--cni-skip-nv-ipam-binary-copy",
		"--cni-skip-nv-ipam-config-creation", "--nic-labels=off", "--pools-in-use-interval=0")
	defer d.stop()
	params := &nodev1.IPAMParameters{Pools: []string{pool}, PoolType: nodev1.PoolType_POOL_TYPE_IPPOOL,
		CniContainerid: "scale-probe", CniIfname: "net1",
		Metadata: &nodev1.IPAMMetadata{K8SPodName: "pod-scale-probe", K8SPodNamespace: "default"}}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("ipam-node for %s allocated nothing from %s within 2 minutes: %v", node, pool, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	if _, err := d.ipam.Deallocate(context.Background(), &nodev1.DeallocateRequest{Parameters: params}); err != nil {
		b.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	return took, currentRSSKiB(b, d.cmd.Process.Pid)
}

// runTiny measures the daemon's start in a world of 5 nodes of its own and one
// pool, with the new controller, and returns daemon-start-s and daemon-RSS-MiB.
func (w *scaleWorld) runTiny(b *testing.B, bin string) map[string]float64 {
	b.Helper()
	const label, nodes = "bench.hwipam.io/tiny", 5
	ns := w.namespace(b, "scale-tiny")
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("tiny-node-%d", i))
	}
	defer w.remove(b, ns, names)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, name := range names {
		if err := w.cp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{label: "true"}}}); err != nil {
			b.Fatal(err)
		}
	}
	ctl := startController(b, bin, w.kubeconfig, ns, "--leader-elect-namespace", ns)
	defer ctl.stop()
	done := w.waitNodeIPAMs(ctx, b, ns, "", 1, nodes, nil)
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "tiny", Namespace: ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.255.0.0/24", PerNodeBlockSize: 8, NodeSelector: selectLabel(label, "true")}}
	if err := w.cp.Client.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			b.Fatal(r.err)
		}
	case <-time.After(2 * time.Minute):
		b.Fatalf("the tiny world's NodeIPAMs did not list their block within 2 minutes; the controller's log ends:\n%s", ctl.tail())
	}
	start, rss := w.daemonStart(b, ns, names[0], pool.Name)
	return map[string]float64{"daemon-start-s": start.Seconds(), "daemon-RSS-MiB": float64(rss) / 1024}
}

// selectLabel is a node selector of the nodes with label set to value.
func selectLabel(label, value string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
		Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}}}}}
}

// namespace creates a namespace named after prefix and the time.
func (w *scaleWorld) namespace(b *testing.B, prefix string) string {
	b.Helper()
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	if err := w.cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	return ns
}

// remove deletes what a run left in ns (pools, NodeIPAMs, the controller's
// Leases and events) and the nodes named, and waits until they are gone, so
// that etcd does not grow from run to run. The namespace itself stays: no
// namespace controller runs to finish its deletion.
func (w *scaleWorld) remove(b *testing.B, ns string, nodes []string) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	deleteAll := func(obj client.Object) {
		// A deletecollection longer than the API server's request timeout (a
		// minute: tens of thousands of NodeIPAMs) is answered 504; it is sent
		// again while any object is left.
		if err := w.cp.Client.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil && !apierrors.IsTimeout(err) {
			b.Logf("deleting the %T objects of %s: %v", obj, ns, err)
		}
	}
	for _, obj := range []client.Object{&coordinationv1.Lease{}, &corev1.Event{}} {
		deleteAll(obj)
	}
	for _, name := range nodes {
		if err := w.cp.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsNotFound(err) {
			b.Errorf("deleting node %s: %v", name, err)
		}
	}
	waited := []struct {
		obj  client.Object
		list client.ObjectList
	}{
		{&v1alpha1.IPPool{}, &v1alpha1.IPPoolList{}},
		{&v1alpha1.CIDRPool{}, &v1alpha1.CIDRPoolList{}},
		{&nodeipamv1.NodeIPAM{}, &nodeipamv1.NodeIPAMList{}},
	}
	const timeout = 20 * time.Minute
	deadline := time.Now().Add(timeout)
	for {
		left := ""
		for _, k := range waited {
			if err := w.cp.Client.List(ctx, k.list, client.InNamespace(ns), client.Limit(1)); err != nil {
				b.Errorf("listing what is left in %s: %v", ns, err)
				return
			}
			if meta.LenList(k.list) > 0 {
				left = fmt.Sprintf("%T", k.obj)
				if _, ok := k.obj.(*nodeipamv1.NodeIPAM); ok {
					w.dropFinalizers(b, ns)
				}
				deleteAll(k.obj)
			}
		}
		for _, name := range nodes {
			if err := w.cp.Client.Get(ctx, client.ObjectKey{Name: name}, &corev1.Node{}); !apierrors.IsNotFound(err) {
				left = "node " + name
			}
		}
		if left == "" {
			b.Logf("removed the run's objects in %s in %s", ns, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			b.Errorf("%s: still there %s after the run's objects were deleted", left, timeout)
			return
		}
		time.Sleep(time.Second)
	}
}

// logProblems counts the error and warning lines of a klog log and returns the
// first few.
func logProblems(log string) (int, []string) {
	n := 0
	var first []string
	for line := range strings.SplitSeq(log, "\n") {
		if len(line) < 5 || line[0] != 'E' && line[0] != 'W' || line[1] < '0' || line[1] > '9' {
			continue
		}
		n++
		if len(first) < 5 {
			first = append(first, line[:min(len(line), 400)])
		}
	}
	return n, first
}

// describeScaleRun says a run's figures in a line.
func describeScaleRun(out map[string]float64) string {
	var parts []string
	if v, ok := out["s-converge"]; ok {
		parts = append(parts, fmt.Sprintf("converged in %.2fs (CPU: kube-apiserver %.1fs, etcd %.1fs, controller %.1fs, benchmark %.1fs)",
			v, out["apiserver-cpu-s"], out["etcd-cpu-s"], out["controller-cpu-s"], out["bench-cpu-s"]))
	} else {
		parts = append(parts, "did not converge")
	}
	if out["status-too-large"] == 1 {
		parts = append(parts, "a pool's status was refused as too large (StatusTooLarge)")
	}
	if v, ok := out["nodeipam-writes/node"]; ok {
		parts = append(parts, fmt.Sprintf("%.2f NodeIPAM writes a node, %.0f bytes each", v, out["nodeipam-bytes"]))
	}
	if v, ok := out["s-reports-recorded"]; ok {
		parts = append(parts, fmt.Sprintf("every node's report written in %.1fs, in every record %.1fs after the first "+
			"write (CPU apiserver %.1fs etcd %.1fs controller %.1fs)", out["s-report-all"], v,
			out["reports-apiserver-cpu-s"], out["reports-etcd-cpu-s"], out["reports-controller-cpu-s"]))
	}
	if v, ok := out["s-join-median"]; ok {
		parts = append(parts, fmt.Sprintf("join served in %.3fs median, %.3fs max; another daemon read %.0f bytes a join (max %.0f)",
			v, out["s-join-max"], out["bytes/join"], out["bytes/join-max"]))
	}
	if v, ok := out["daemon-start-s"]; ok {
		parts = append(parts, fmt.Sprintf("daemon's first Allocate %.3fs after exec, its RSS %.1f MiB", v, out["daemon-RSS-MiB"]))
	}
	parts = append(parts, fmt.Sprintf("controller peak RSS %.0f MiB, %.0f status writes, %.0f reconcile errors, %.0f log errors/warnings",
		out["controller-peak-RSS-MiB"], out["status-writes"], out["reconcile-errors"], out["controller-log-problems"]))
	return strings.Join(parts, "; ")
}

// waitResult is when a wait ended, or why it failed.
type waitResult struct {
	at  time.Time
	err error
}

// waitPools watches the IPPools of ns, from now, until done has held for each of
// the rail pools.
func (w *scaleWorld) waitPools(ctx context.Context, b *testing.B, ns string, done func(*v1alpha1.IPPool) bool) <-chan waitResult {
	b.Helper()
	// The benchmark's watch decodes every status written: with poolwatch, as
	// BenchmarkController's does.
	watcher, err := poolwatch.NewWatcher(w.cp.Config, w.httpClient, w.cp.Client.Scheme(), v1alpha1.KindIPPool, ns)
	if err != nil {
		b.Fatal(err)
	}
	rv := w.poolsVersion(b, ns)
	res := make(chan waitResult, 1)
	go func() {
		at, err := watchPoolsUntil(ctx, watcher, rv, railPools, done)
		res <- waitResult{at, err}
	}()
	return res
}

// poolsVersion is the resourceVersion of a list of the IPPools of ns.
func (w *scaleWorld) poolsVersion(b *testing.B, ns string) string {
	b.Helper()
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("IPPoolList"))
	if err := w.cp.Client.List(context.Background(), &list, client.InNamespace(ns), client.Limit(1)); err != nil {
		b.Fatal(err)
	}
	return list.ResourceVersion
}

// nodeIPAMPath is the API path of the NodeIPAMs of ns.
func nodeIPAMPath(ns string) string {
	return "/apis/" + nodeipamv1.GroupVersion.Group + "/" + nodeipamv1.GroupVersion.Version + "/namespaces/" + ns + "/nodeipams"
}

// nodeIPAMFields is what the benchmark decodes of a NodeIPAM (and of the Status
// of a watch's ERROR event): encoding/json skips the rest, the pools' specs
// above all, which keeps the benchmark's own CPU time low.
type nodeIPAMFields struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		Blocks []struct {
			Pool string `json:"pool"`
		} `json:"blocks"`
	} `json:"spec"`
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// waitNodeIPAMs lists the NodeIPAMs of ns (only the one named name, if not
// empty), then watches them until count of them list blocks blocks each; the
// end arrives on the channel returned. writes, if not nil, counts the versions
// the watch delivered. A watch the server ends is resumed from the last version
// seen; one whose version has expired, listed again (a NodeIPAM deleted in
// between would still count, but nothing deletes them while the benchmark
// waits).
func (w *scaleWorld) waitNodeIPAMs(ctx context.Context, b *testing.B, ns, name string, blocks, count int, writes *atomic.Int64) <-chan waitResult {
	b.Helper()
	full := map[string]bool{}
	seen := func(o *nodeIPAMFields) bool {
		if len(o.Spec.Blocks) == blocks {
			full[o.Metadata.Name] = true
		} else {
			delete(full, o.Metadata.Name)
		}
		return len(full) >= count
	}
	res := make(chan waitResult, 1)
	items, rv, err := w.listNodeIPAMs(ctx, ns, name)
	if err != nil {
		b.Fatal(err)
	}
	for i := range items {
		if seen(&items[i]) {
			res <- waitResult{at: time.Now()}
			return res
		}
	}
	go func() {
		for {
			at, err := w.watchNodeIPAMs(ctx, ns, name, &rv, seen, writes)
			if errors.Is(err, errExpired) {
				if items, rv, err = w.listNodeIPAMs(ctx, ns, name); err == nil {
					for i := range items {
						if seen(&items[i]) {
							at = time.Now()
						}
					}
				}
			}
			if err != nil || !at.IsZero() {
				res <- waitResult{at, err}
				return
			}
		}
	}()
	return res
}

// errExpired says a watch's resourceVersion is too old: list again.
var errExpired = errors.New("the watch's resourceVersion has expired")

// listNodeIPAMs lists the NodeIPAMs of ns (only the one named name, if not
// empty), 1,000 a page, and returns them and the list's resourceVersion.
func (w *scaleWorld) listNodeIPAMs(ctx context.Context, ns, name string) ([]nodeIPAMFields, string, error) {
	var items []nodeIPAMFields
	q := url.Values{"limit": {"1000"}}
	if name != "" {
		q.Set("fieldSelector", "metadata.name="+name)
	}
	for {
		var page struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
				Continue        string `json:"continue"`
			} `json:"metadata"`
			Items []nodeIPAMFields `json:"items"`
		}
		if err := w.getJSON(ctx, nodeIPAMPath(ns)+"?"+q.Encode(), &page); err != nil {
			return nil, "", fmt.Errorf("listing NodeIPAMs: %w", err)
		}
		items = append(items, page.Items...)
		if page.Metadata.Continue == "" {
			return items, page.Metadata.ResourceVersion, nil
		}
		q.Set("continue", page.Metadata.Continue)
	}
}

// watchNodeIPAMs watches the NodeIPAMs of ns (only the one named name, if not
// empty) from *rv, passing each version to seen, and returns when seen first
// returned true; with a zero time when the server ended the watch (*rv then is
// the last version seen), errExpired when *rv is too old.
func (w *scaleWorld) watchNodeIPAMs(ctx context.Context, ns, name string, rv *string, seen func(*nodeIPAMFields) bool,
	writes *atomic.Int64) (time.Time, error) {
	q := url.Values{"watch": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersion": {*rv}}
	if name != "" {
		q.Set("fieldSelector", "metadata.name="+name)
	}
	resp, err := w.get(ctx, nodeIPAMPath(ns)+"?"+q.Encode())
	if err != nil {
		return time.Time{}, fmt.Errorf("watching NodeIPAMs: %w", err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string         `json:"type"`
			Object nodeIPAMFields `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return time.Time{}, ctx.Err()
			}
			return time.Time{}, nil // ended by the server: resumed from rv
		}
		switch ev.Type {
		case "ERROR":
			if ev.Object.Code == http.StatusGone {
				return time.Time{}, errExpired
			}
			return time.Time{}, fmt.Errorf("watching NodeIPAMs: %d %s", ev.Object.Code, ev.Object.Message)
		case "BOOKMARK":
		default:
			if ev.Type == "DELETED" {
				ev.Object.Spec.Blocks = nil
			} else if writes != nil {
				writes.Add(1)
			}
			if seen(&ev.Object) {
				return time.Now(), nil
			}
		}
		*rv = ev.Object.Metadata.ResourceVersion
	}
}

// get sends a GET of path to the API server and returns the response when it is
// 200 OK.
func (w *scaleWorld) get(ctx context.Context, path string) (*http.Response, error) {
	return getOK(ctx, w.httpClient, strings.TrimSuffix(w.cp.Config.Host, "/")+path)
}

// getJSON decodes the answer to a GET of path into v.
func (w *scaleWorld) getJSON(ctx context.Context, path string, v any) error {
	resp, err := w.get(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("decoding GET %s: %w", path, err)
	}
	return nil
}

func getOK(ctx context.Context, c *http.Client, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s: %s", u, resp.Status, body)
	}
	return resp, nil
}

// wireWatch is a set of watches on one connection of their own, whose bytes
// read are counted: what a daemon's watch receives, on the wire.
type wireWatch struct {
	n      atomic.Int64
	cancel context.CancelFunc
	client *http.Client
	done   chan struct{}
}

// openWireWatch opens a watch of each path (with its query) over one new
// connection, and reads them until close. Each is open (its response's header
// read) when it returns.
func (w *scaleWorld) openWireWatch(b *testing.B, paths ...string) *wireWatch {
	b.Helper()
	ww := &wireWatch{done: make(chan struct{})}
	cfg := rest.CopyConfig(w.cp.Config)
	dialer := &net.Dialer{Timeout: 30 * time.Second}
	// A new Dial, a new transport: client-go's transport cache keys on it.
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, n: &ww.n}, nil
	}
	var err error
	if ww.client, err = rest.HTTPClientFor(cfg); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ww.cancel = cancel
	var open []*http.Response
	for _, p := range paths {
		resp, err := getOK(ctx, ww.client, strings.TrimSuffix(w.cp.Config.Host, "/")+p)
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		open = append(open, resp)
	}
	go func() {
		defer close(ww.done)
		done := make(chan struct{}, len(open))
		for _, resp := range open {
			go func() {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done <- struct{}{}
			}()
		}
		for range open {
			<-done
		}
	}()
	return ww
}

// bytes is how many bytes were read off the connection so far.
func (ww *wireWatch) bytes() int64 { return ww.n.Load() }

// close ends the watches and the connection.
func (ww *wireWatch) close() {
	ww.cancel()
	<-ww.done
	ww.client.CloseIdleConnections()
}

// countingConn adds the bytes read from a connection to n.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	c.n.Add(int64(k))
	return k, err
}
