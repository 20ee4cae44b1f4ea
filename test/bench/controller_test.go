// Package bench holds the benchmarks that run the project's real processes against
// the real control plane. `make bench` runs them; each reports its figures with
// b.ReportMetric.
package bench

import (
	"bufio"
	"bytes"
	"cmp"
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
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolwatch"
	"github.com/hwipam/hwipam/test/harness"
)

// BenchmarkController measures the ipam-controller binary against the real
// apiserver, as issue 14 states the measurement: N nodes exist, a fresh controller
// settles (/readyz answers and its IPPool workers run), P pools selecting all of
// them are created at once, and a watch on the pools times until every pool's
// status lists all N nodes. Reported: seconds to assign, status writes, reconcile
// errors (conflicts included), the controller's API requests and the time its
// client spent throttled, its peak RSS, the CPU time of the controller,
// kube-apiserver, etcd, the benchmark itself and the whole machine over the
// convergence, and the size of the largest pool object (JSON, as stored) against
// etcd's default request limit of 1.5 MiB. Each figure is the median of at least 5
// runs (ns/op too); s-to-assigned-min and -max are the fastest and slowest.
//
// It measures the status convergence, as before per-node delivery (NodeIPAM): a
// build whose --help lists --status-allocations-max-nodes is given
// --status-allocations-max-nodes=0, so that its pools' status lists every block at
// every size (by default it stops listing them above 10,000 nodes, and the
// 20,000-node case would never converge). Builds without the flag (older commits,
// nv-ipam's) list every block anyway. BenchmarkRailScale measures the delivery
// through NodeIPAMs.
//
// One control plane serves every size: the nodes of a size are added to those of
// the size before, since creating 20,000 nodes takes a while (the log says how
// long). Environment: HWIPAM_BENCH_CONTROLLER_BIN measures another build (several,
// separated by commas, run in turn, each one's medians logged),
// HWIPAM_BENCH_CONTROLLER_RUNS sets the fewest runs, HWIPAM_BENCH_CONTROLLER_ARGS
// adds flags, HWIPAM_BENCH_PROFILE_DIR (and _SECONDS) writes CPU profiles of the
// controller and kube-apiserver.
func BenchmarkController(b *testing.B) {
	// Another build (an older commit, nv-ipam's) can be measured in the same
	// conditions: it must take the flags runControllerOnce passes.
	var builds []string
	if bins := os.Getenv("HWIPAM_BENCH_CONTROLLER_BIN"); bins != "" {
		builds = strings.Split(bins, ",")
	} else {
		builds = []string{harness.BuildBinary(b, "./cmd/ipam-controller")}
	}
	// Status convergence: every block listed in the pools' status, whatever the size.
	buildArgs := map[string][]string{}
	for _, build := range builds {
		if hasFlag(b, build, "--status-allocations-max-nodes") {
			buildArgs[build] = []string{"--status-allocations-max-nodes=0"}
		}
	}
	cp := harness.StartControlPlane(b, harness.ControlPlaneOptions{})
	kubeconfig, err := cp.WriteKubeconfig(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	// The benchmark's watch decodes every status written, on the same 2 cores as
	// what it measures: it decodes with poolwatch, as the controller does, which
	// takes half the CPU of client-go's watch.
	watchClient, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		b.Fatal(err)
	}
	created := 0
	sizes := []struct {
		nodes int
		pools []int
	}{{1000, []int{1, 8}}, {5000, []int{1, 8}}, {20000, []int{1}}}
	for _, size := range sizes {
		nodes := size.nodes
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			createNodes(b, cp.Client, created, nodes)
			created = nodes
			for _, pools := range size.pools {
				b.Run(fmt.Sprintf("pools=%d", pools), func(b *testing.B) {
					b.StopTimer()
					// At least controllerRuns runs, whatever b.N: one run's figure
					// varies by some 15 % with the API server's garbage collection.
					var runs []map[string]float64
					byBuild := map[string][]map[string]float64{}
					var floors []map[string]float64
					for i := range max(b.N, controllerRuns(b)) {
						build := builds[i%len(builds)]
						r, statuses := runControllerOnce(b, cp, watchClient, build, buildArgs[build], kubeconfig, nodes, pools)
						runs = append(runs, r)
						byBuild[build] = append(byBuild[build], r)
						// The floor writes the statuses this run stored, so both
						// send the same bytes.
						floors = append(floors, runFloorOnce(b, cp, watchClient, statuses, nodes, pools))
					}
					if len(builds) > 1 {
						for _, build := range builds {
							b.Logf("%s: %s", build, medians(byBuild[build], "s-to-assigned", "apiserver-cpu-s", "controller-cpu-s"))
						}
					}
					reportMedians(b, runs)
					reportFloor(b, runs, floors)
				})
			}
		})
	}
}

// createNodes creates the nodes numbered from to n-1.
func createNodes(b *testing.B, c client.Client, from, n int) {
	b.Helper()
	if from >= n {
		return
	}
	start := time.Now()
	inParallel(b, "creating nodes", n-from, func(i int) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-node-%05d", from+i),
			Labels: map[string]string{"nic.hwipam.io/present": "true"}}}
		return c.Create(context.Background(), node)
	})
	b.Logf("created %d nodes (now %d) in %s", n-from, n, time.Since(start).Round(time.Millisecond))
}

// inParallel calls do for 0 to n-1, 16 at a time, and fails the benchmark on
// the first error (what says what was being done).
func inParallel(b *testing.B, what string, n int, do func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if err := do(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("%s: %v", what, err)
	}
}

// etcdRequestLimit is etcd's default --max-request-bytes: an object larger than this
// (less a little for the request around it) cannot be stored.
const etcdRequestLimit = 1.5 * 1024 * 1024

// controllerRuns is the fewest runs each BenchmarkController case makes:
// HWIPAM_BENCH_CONTROLLER_RUNS, 5 if unset.
func controllerRuns(b *testing.B) int {
	b.Helper()
	v := os.Getenv("HWIPAM_BENCH_CONTROLLER_RUNS")
	if v == "" {
		return 5
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("HWIPAM_BENCH_CONTROLLER_RUNS=%q: want a positive number of runs", v)
	}
	return n
}

// reportMedians reports the median of each figure over the runs, the median
// convergence also as ns/op, and the fastest and slowest convergence as
// s-to-assigned-min and -max: on a machine with other load, the least and the
// most disturbed run.
func reportMedians(b *testing.B, runs []map[string]float64) {
	b.Helper()
	for unit := range runs[0] {
		b.ReportMetric(median(runs, unit), unit)
	}
	vs := figures(runs, "s-to-assigned")
	b.ReportMetric(median(runs, "s-to-assigned")*1e9, "ns/op")
	b.ReportMetric(vs[0], "s-to-assigned-min")
	b.ReportMetric(vs[len(vs)-1], "s-to-assigned-max")
}

// reportFloor reports the floor's figures (runFloorOnce) with the prefix floor-:
// the median convergence, the fastest, and the CPU time of kube-apiserver and of the
// machine; and the controller's median convergence over the floor's as x-floor.
func reportFloor(b *testing.B, runs, floors []map[string]float64) {
	b.Helper()
	for _, unit := range []string{"s-to-assigned", "apiserver-cpu-s", "machine-busy-cpu-s"} {
		b.ReportMetric(median(floors, unit), "floor-"+unit)
	}
	b.ReportMetric(figures(floors, "s-to-assigned")[0], "floor-s-to-assigned-min")
	b.ReportMetric(median(runs, "s-to-assigned")/median(floors, "s-to-assigned"), "x-floor")
}

// figures returns one figure of every run, sorted.
func figures(runs []map[string]float64, unit string) []float64 {
	vs := make([]float64, 0, len(runs))
	for _, r := range runs {
		vs = append(vs, r[unit])
	}
	slices.Sort(vs)
	return vs
}

// median is the median of one figure over the runs (the upper one of an even number).
func median(runs []map[string]float64, unit string) float64 {
	vs := figures(runs, unit)
	return vs[len(vs)/2]
}

// medians formats the medians of some figures over the runs.
func medians(runs []map[string]float64, units ...string) string {
	parts := make([]string, 0, len(units))
	for _, unit := range units {
		parts = append(parts, fmt.Sprintf("%s %.3f", unit, median(runs, unit)))
	}
	return fmt.Sprintf("%d runs, median %s", len(runs), strings.Join(parts, ", "))
}

// runControllerOnce starts a controller (bin with args) for a namespace of its own, creates the
// pools there, and returns the figures BenchmarkController reports, by unit, and
// the status of each pool as the controller stored it (in the pools' order). The
// pools are deleted afterwards, so that the API server holds the same objects for
// every run.
func runControllerOnce(b *testing.B, cp *harness.ControlPlane, watchClient *http.Client, bin string, args []string, kubeconfig string,
	nodes, pools int) (map[string]float64, []json.RawMessage) {
	b.Helper()
	ns, cleanup := benchNamespace(b, cp, "bench", pools)
	defer cleanup()
	ctl := startController(b, bin, kubeconfig, ns, args...)
	defer ctl.stop()
	cmd, metricsPort, pprofPort := ctl.cmd, ctl.metricsPort, ctl.pprofPort
	// Settled: ready (its caches synced) and the IPPool workers running, which
	// controller-runtime starts up to a cache poll period (100 ms) after /readyz.
	select {
	case <-ctl.working:
	case <-time.After(time.Minute):
		b.Fatalf("the controller's IPPool workers did not start within a minute of /readyz; its log ends:\n%s", ctl.tail())
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	requestsBefore := scrapeSum(b, metricsURL, "rest_client_requests_total")

	profiled := profileConvergence(b, cp, pprofPort, metricsURL, fmt.Sprintf("nodes=%d-pools=%d", nodes, pools))
	defer profiled()
	out := measureConvergence(b, cp, watchClient, ns, nodes, pools, cmd.Process.Pid, nil)
	largest, statuses := storedPools(b, cp, ns, pools)

	writes := scrapeSum(b, metricsURL, `hwipam_pool_status_writes_total{kind="IPPool"}`)
	errs := scrapeSum(b, metricsURL, `hwipam_pool_reconcile_errors_total{kind="IPPool"}`)
	requests := scrapeSum(b, metricsURL, "rest_client_requests_total") - requestsBefore
	throttled := scrapeSum(b, metricsURL, "rest_client_rate_limiter_duration_seconds_sum")
	rss := peakRSSKiB(b, cmd.Process.Pid)
	out["status-writes"] = writes
	out["reconcile-errors"] = errs
	out["api-requests"] = requests
	out["s-throttled"] = throttled
	out["peak-RSS-MiB"] = float64(rss) / 1024
	out["largest-pool-bytes"] = float64(largest)
	perNode := float64(largest) / float64(nodes)
	out["pool-bytes/node"] = perNode
	// A pool object grows linearly with its nodes.
	out["nodes-at-1.5MiB"] = etcdRequestLimit / perNode
	out["%-of-1.5MiB"] = 100 * float64(largest) / etcdRequestLimit
	return out, statuses
}

// runFloorOnce measures what any controller's convergence costs at least, in the
// conditions of runControllerOnce: the same pools are created the same way, and the
// benchmark itself gives each one, as soon as its create returns, the status a
// controller stored for it (statuses, from runControllerOnce) in one status update,
// encoded beforehand and sent with the parameters ipam-controller's writes use. No
// controller runs: no watch of Nodes or pools, no lists, no computation, one write
// per pool. It returns the same convergence figures as runControllerOnce (the
// stand-in's CPU time is in bench-cpu-s).
func runFloorOnce(b *testing.B, cp *harness.ControlPlane, watchClient *http.Client, statuses []json.RawMessage, nodes, pools int) map[string]float64 {
	b.Helper()
	ns, cleanup := benchNamespace(b, cp, "floor", pools)
	defer cleanup()
	// The body of a status update, up to the status: filled in with the created
	// pool's resourceVersion, which a custom resource's update must carry.
	type head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name            string `json:"name"`
			Namespace       string `json:"namespace"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec v1alpha1.IPPoolSpec `json:"spec"`
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	created := func(p int, pool *v1alpha1.IPPool) {
		h := head{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindIPPool, Spec: pool.Spec}
		h.Metadata.Name, h.Metadata.Namespace, h.Metadata.ResourceVersion = pool.Name, pool.Namespace, pool.ResourceVersion
		wg.Go(func() {
			body, err := json.Marshal(h)
			if err != nil {
				b.Error(err)
				return
			}
			body = append(append(append(body[:len(body)-1], `,"status":`...), statuses[p]...), '}')
			err = cp.Clientset.CoreV1().RESTClient().Put().
				AbsPath("/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "namespaces", ns, "ippools", pool.Name, "status").
				Param("fieldValidation", metav1.FieldValidationIgnore).
				SetHeader("Content-Type", "application/json").
				SetHeader("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json").
				Body(body).Timeout(time.Minute).Do(context.Background()).Error()
			if err != nil {
				b.Errorf("the floor's status update of %s: %v", pool.Name, err)
			}
		})
	}
	profiled := profileConvergence(b, cp, 0, "", fmt.Sprintf("nodes=%d-pools=%d-floor", nodes, pools))
	defer profiled()
	return measureConvergence(b, cp, watchClient, ns, nodes, pools, 0, created)
}

// benchNamespace creates a namespace for one run, and returns it and a function
// that deletes its pools, so that the API server holds the same objects for every
// run: deferred before the controller's stop, it runs after that.
func benchNamespace(b *testing.B, cp *harness.ControlPlane, prefix string, pools int) (string, func()) {
	b.Helper()
	ns := fmt.Sprintf("%s-%d-%d", prefix, pools, time.Now().UnixNano())
	if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	return ns, func() {
		if err := cp.Client.DeleteAllOf(context.Background(), &v1alpha1.IPPool{}, client.InNamespace(ns)); err != nil {
			b.Errorf("deleting the pools of %s: %v", ns, err)
		}
	}
}

// measureConvergence creates the pools rail0... in ns, each selecting every node,
// and returns the seconds until a watch saw each pool's status list all nodes
// (s-to-assigned) and the CPU time the controller (pid; none if 0), kube-apiserver,
// etcd, the benchmark and the whole machine used by then. created, if not nil, is
// called with each pool as its create returned; what it starts may outlast the
// convergence (the answer to the last status write can arrive after the watch
// event).
func measureConvergence(b *testing.B, cp *harness.ControlPlane, watchClient *http.Client, ns string, nodes, pools, pid int,
	created func(p int, pool *v1alpha1.IPPool)) map[string]float64 {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The watch starts before the first pool exists, so it sees every status write.
	var list v1alpha1.IPPoolList
	if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	watcher, err := poolwatch.NewWatcher(cp.Config, watchClient, cp.Client.Scheme(), v1alpha1.KindIPPool, ns)
	if err != nil {
		b.Fatal(err)
	}
	assigned := make(chan time.Time, 1)
	go func() {
		at, err := watchUntilAssigned(ctx, watcher, list.ResourceVersion, nodes, pools)
		if err != nil {
			b.Error(err)
		}
		assigned <- at
	}()

	apiserverPID, etcdPID, etcdURL := controlPlanePIDs(b, cp)
	cpuNow := func() []float64 {
		ctl := 0.0
		if pid != 0 {
			ctl = cpuSeconds(b, pid)
		}
		return []float64{ctl, cpuSeconds(b, apiserverPID), cpuSeconds(b, etcdPID), cpuSeconds(b, os.Getpid()), machineBusySeconds(b)}
	}
	cpuBefore := cpuNow()
	fsyncBefore := scrapeSum(b, etcdURL+"/metrics", "etcd_disk_wal_fsync_duration_seconds_sum")

	b.StartTimer()
	start := time.Now()
	for p := range pools {
		// A /14 per pool: 32,768 blocks of 8, room for 20,000 nodes.
		pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rail%d", p), Namespace: ns},
			Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.%d.0.0/14", 4*p), PerNodeBlockSize: 8}}
		if err := cp.Client.Create(ctx, pool); err != nil {
			b.Fatal(err)
		}
		if created != nil {
			created(p, pool)
		}
	}
	var elapsed time.Duration
	select {
	case at := <-assigned:
		if at.IsZero() {
			b.FailNow()
		}
		elapsed = at.Sub(start)
	case <-time.After(10 * time.Minute):
		b.Fatalf("after 10 minutes not every one of %d pools lists all %d nodes", pools, nodes)
	}
	b.StopTimer()
	cpu := cpuNow()
	for i := range cpu {
		cpu[i] -= cpuBefore[i]
	}
	fsync := scrapeSum(b, etcdURL+"/metrics", "etcd_disk_wal_fsync_duration_seconds_sum") - fsyncBefore

	out := map[string]float64{}
	out["s-to-assigned"] = elapsed.Seconds()
	// CPU time spent until then, which other load on the machine does not inflate
	// as it does the wall clock.
	if pid != 0 {
		out["controller-cpu-s"] = cpu[0]
	}
	out["apiserver-cpu-s"] = cpu[1]
	out["etcd-cpu-s"] = cpu[2]
	// The benchmark's own process: its watch decodes every status written.
	out["bench-cpu-s"] = cpu[3]
	// Every CPU of the machine, busy: near the cores times s-to-assigned, the
	// convergence was bound by CPU rather than by waiting.
	out["machine-busy-cpu-s"] = cpu[4]
	// Time etcd spent in fsync of its log, which other disk load slows down.
	out["etcd-fsync-s"] = fsync
	return out
}

// storedPools reads the pools of a run as stored, and returns the size of the
// largest (JSON, as the API server sends it) and each one's status.
func storedPools(b *testing.B, cp *harness.ControlPlane, ns string, pools int) (int, []json.RawMessage) {
	b.Helper()
	largest := 0
	statuses := make([]json.RawMessage, pools)
	for p := range pools {
		raw, err := cp.Clientset.CoreV1().RESTClient().Get().AbsPath("/apis", v1alpha1.GroupVersion.Group,
			v1alpha1.GroupVersion.Version, "namespaces", ns, "ippools", fmt.Sprintf("rail%d", p)).DoRaw(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		largest = max(largest, len(raw))
		var pool struct {
			Status json.RawMessage `json:"status"`
		}
		if err := json.Unmarshal(raw, &pool); err != nil {
			b.Fatalf("rail%d as stored: %v", p, err)
		}
		statuses[p] = pool.Status
	}
	return largest, statuses
}

// controlPlanePIDs finds the kube-apiserver of cp by its port, and its etcd by the
// address the apiserver uses, which it also returns.
func controlPlanePIDs(b *testing.B, cp *harness.ControlPlane) (apiserver, etcd int, etcdURL string) {
	b.Helper()
	host, err := url.Parse(cp.Config.Host)
	if err != nil {
		b.Fatal(err)
	}
	args := map[int][]string{}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if raw, err := os.ReadFile("/proc/" + d.Name() + "/cmdline"); err == nil {
			args[pid] = strings.Split(string(raw), "\x00")
		}
	}
	find := func(arg string) (int, []string) {
		for pid, a := range args {
			if slices.Contains(a, arg) {
				return pid, a
			}
		}
		b.Fatalf("no process with argument %s", arg)
		return 0, nil
	}
	apiserver, a := find("--secure-port=" + host.Port())
	for _, arg := range a {
		if servers, ok := strings.CutPrefix(arg, "--etcd-servers="); ok {
			etcd, _ = find("--listen-client-urls=" + servers)
			return apiserver, etcd, servers
		}
	}
	b.Fatalf("kube-apiserver %d has no --etcd-servers", apiserver)
	return 0, 0, ""
}

// cpuSeconds is the user and system CPU time a process has used.
func cpuSeconds(b *testing.B, pid int) float64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses: state is the
	// first (field 3), utime and stime fields 14 and 15, in clock ticks of 1/100 s.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return (utime + stime) / 100
}

// machineBusySeconds is the CPU time all CPUs of the machine spent on anything but
// idling and waiting for I/O, from /proc/stat.
func machineBusySeconds(b *testing.B) float64 {
	b.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	// "cpu  user nice system idle iowait irq softirq steal ...", in clock ticks.
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		b.Fatalf("/proc/stat: %q", line)
	}
	busy := 0.0
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q", line)
		}
		busy += v
	}
	return busy / 100
}

// controllerProc is a running ipam-controller of BenchmarkController.
type controllerProc struct {
	cmd                                *exec.Cmd
	metricsPort, healthPort, pprofPort int
	// working is closed once its IPPool workers run, exited once it has exited.
	working, exited chan struct{}
	log             *harness.LogBuffer
}

// errExited says the controller exited before it was ready.
var errExited = errors.New("the controller exited before it was ready")

// startController starts bin for the pools of ns, with the flags every run passes
// and then extra, and waits until it is ready: its caches synced (/readyz). A port picked free may be taken before the
// controller binds it (another process's outgoing connection): a controller that
// exits for that is started again on other ports, up to 3 times. Any other exit, or
// no readiness within 2 minutes, fails the benchmark with the end of its log.
func startController(b *testing.B, bin, kubeconfig, ns string, extra ...string) *controllerProc {
	b.Helper()
	for attempt := 1; ; attempt++ {
		c := &controllerProc{metricsPort: freePort(b), healthPort: freePort(b), pprofPort: freePort(b),
			working: make(chan struct{}), exited: make(chan struct{}), log: &harness.LogBuffer{}}
		args := []string{"--kubeconfig", kubeconfig, "--ippools-namespace", ns, "--release-grace-period", "0",
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", c.metricsPort),
			"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", c.healthPort)}
		if os.Getenv("HWIPAM_BENCH_PROFILE_DIR") != "" {
			args = append(args, "--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", c.pprofPort))
		}
		args = append(args, extra...)
		// More flags for the controller, e.g. --v=5 to log every reconcile.
		args = append(args, strings.Fields(os.Getenv("HWIPAM_BENCH_CONTROLLER_ARGS"))...)
		c.cmd = exec.Command(bin, args...)
		// Environment for the controller alone, e.g. GOMEMLIMIT=1GiB as
		// deploy/'s Deployment sets it from its memory limit.
		c.cmd.Env = append(os.Environ(), strings.Fields(os.Getenv("HWIPAM_BENCH_CONTROLLER_ENV"))...)
		logs, err := c.cmd.StderrPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := c.cmd.Start(); err != nil {
			b.Fatal(err)
		}
		go func() {
			watchControllerLog(logs, c.working, c.log)
			_ = c.cmd.Wait() // after the log is read to its end
			close(c.exited)
		}()
		err = c.waitReady(2 * time.Minute)
		if err == nil {
			return c
		}
		if errors.Is(err, errExited) && strings.Contains(c.log.String(), "address already in use") && attempt < 3 {
			b.Logf("the controller could not bind a port picked free; starting it again:\n%s", c.tail())
			continue
		}
		c.stop()
		b.Fatalf("%v; its log ends:\n%s", err, c.tail())
	}
}

// hasFlag reports whether the --help of bin lists flag.
func hasFlag(b *testing.B, bin, flag string) bool {
	b.Helper()
	// --help exits 0 or 2 depending on the flag library; the usage is what counts.
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("--")) {
		b.Fatalf("%s --help printed no flags: %s", bin, out)
	}
	return bytes.Contains(out, []byte(flag+" "))
}

// waitReady polls the controller's /readyz until it answers OK, the controller
// exits (errExited) or timeout passes.
func (c *controllerProc) waitReady(timeout time.Duration) error {
	endpoint := fmt.Sprintf("http://127.0.0.1:%d/readyz", c.healthPort)
	deadline := time.After(timeout)
	for {
		if resp, err := http.Get(endpoint); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.exited:
			return fmt.Errorf("%w (%v)", errExited, c.cmd.ProcessState)
		case <-deadline:
			return fmt.Errorf("%s not OK within %s", endpoint, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail is the end of the controller's log, for a failure message.
func (c *controllerProc) tail() string { return harness.LastLines(c.log.String(), 30) }

// stop interrupts the controller and waits until it has exited.
func (c *controllerProc) stop() {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.exited:
	case <-time.After(time.Minute):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// watchControllerLog reads the controller's log, copies it to stderr with -v and
// to keep, and closes working once the IPPool controller has started its workers.
func watchControllerLog(logs io.Reader, working chan<- struct{}, keep *harness.LogBuffer) {
	sc := bufio.NewScanner(logs)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	started := false
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(keep, line)
		if testing.Verbose() {
			fmt.Fprintln(os.Stderr, line)
		}
		if !started && strings.Contains(line, `"Starting workers"`) && strings.Contains(line, `controller="IPPool"`) {
			started = true
			close(working)
		}
	}
	_, _ = io.Copy(io.Discard, logs)
}

// profileConvergence, when $HWIPAM_BENCH_PROFILE_DIR is set, starts CPU profiles of
// the controller and of kube-apiserver over the next $HWIPAM_BENCH_PROFILE_SECONDS
// (default 3) and returns a function that waits for them and writes
// <dir>/<name>.{controller,apiserver}.pprof, and the controller's metrics then to
// <dir>/<name>.metrics.txt. With pprofPort 0 and no metricsURL (the floor), only
// kube-apiserver is profiled.
func profileConvergence(b *testing.B, cp *harness.ControlPlane, pprofPort int, metricsURL, name string) func() {
	b.Helper()
	dir := os.Getenv("HWIPAM_BENCH_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	seconds := cmp.Or(os.Getenv("HWIPAM_BENCH_PROFILE_SECONDS"), "3")
	var wg sync.WaitGroup
	save := func(file string, get func() ([]byte, error)) {
		wg.Go(func() {
			data, err := get()
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name+"."+file), data, 0o644)
			}
			if err != nil {
				b.Errorf("writing %s: %v", file, err)
			}
		})
	}
	if pprofPort != 0 {
		save("controller.pprof", func() ([]byte, error) {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%s", pprofPort, seconds))
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			return io.ReadAll(resp.Body)
		})
	}
	save("apiserver.pprof", func() ([]byte, error) {
		return cp.Clientset.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", seconds).
			Timeout(time.Minute).DoRaw(context.Background())
	})
	time.Sleep(100 * time.Millisecond) // both profiles running before the clock starts
	return func() {
		wg.Wait()
		if metricsURL == "" {
			return
		}
		save("metrics.txt", func() ([]byte, error) {
			resp, err := http.Get(metricsURL)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			return io.ReadAll(resp.Body)
		})
		wg.Wait()
	}
}

// snapshotHeap, when $HWIPAM_BENCH_PROFILE_DIR is set, logs the controller's
// current and peak RSS and writes its heap profile (in use, after a GC) to
// <dir>/<name>.heap.pprof: where the controller's memory goes at that point.
func snapshotHeap(b *testing.B, ctl *controllerProc, name string) {
	b.Helper()
	dir := os.Getenv("HWIPAM_BENCH_PROFILE_DIR")
	if dir == "" || ctl.pprofPort == 0 {
		return
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", ctl.pprofPort))
	if err != nil {
		b.Errorf("the controller's heap profile: %v", err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name+".heap.pprof"), data, 0o644)
	}
	if err != nil {
		b.Errorf("writing the controller's heap profile: %v", err)
	}
	pid := ctl.cmd.Process.Pid
	b.Logf("%s: controller RSS %.0f MiB, peak %.0f MiB; heap profile in %s", name,
		float64(currentRSSKiB(b, pid))/1024, float64(peakRSSKiB(b, pid))/1024, dir)
}

// watchUntilAssigned watches IPPools from resourceVersion rv until each of pools
// lists nodes allocations, and returns when the event saying so arrived.
func watchUntilAssigned(ctx context.Context, watcher *poolwatch.Watcher, rv string, nodes, pools int) (time.Time, error) {
	return watchPoolsUntil(ctx, watcher, rv, pools, func(pool *v1alpha1.IPPool) bool {
		return len(pool.Status.Allocations) == nodes
	})
}

// watchPoolsUntil watches IPPools from resourceVersion rv until done has held for
// pools of them (each counted once, when done first holds), and returns when the
// event saying so arrived. A watch the server ends is resumed from the last
// version seen.
func watchPoolsUntil(ctx context.Context, watcher *poolwatch.Watcher, rv string, pools int, done func(*v1alpha1.IPPool) bool) (time.Time, error) {
	seen := map[string]bool{}
	for {
		w, err := watcher.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			return time.Time{}, fmt.Errorf("watching IPPools: %w", err)
		}
		for ev := range w.ResultChan() {
			pool, ok := ev.Object.(*v1alpha1.IPPool)
			if !ok {
				w.Stop()
				return time.Time{}, fmt.Errorf("watch event %s of %T: %v", ev.Type, ev.Object, ev.Object)
			}
			rv = pool.ResourceVersion
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if !seen[pool.Name] && done(pool) {
				seen[pool.Name] = true
				if len(seen) == pools {
					w.Stop()
					return time.Now(), nil
				}
			}
		}
		if ctx.Err() != nil {
			return time.Time{}, ctx.Err()
		}
	}
}

func freePort(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// scrapeSum adds up the samples of the metric series at endpoint whose name and labels
// begin with series (all label sets of a bare name); 0 when there are none, as for
// a counter vector never incremented.
func scrapeSum(b *testing.B, endpoint, series string) float64 {
	b.Helper()
	resp, err := http.Get(endpoint)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		after, ok := strings.CutPrefix(line, series)
		if !ok || strings.HasPrefix(line, "#") || (after != "" && after[0] != ' ' && after[0] != '{' && after[0] != ',') {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			b.Fatal(err)
		}
		sum += f
	}
	if err := sc.Err(); err != nil {
		b.Fatalf("reading %s: %v", endpoint, err)
	}
	return sum
}

// peakRSSKiB reads VmHWM, the peak resident set size, of a running process.
func peakRSSKiB(b *testing.B, pid int) int { return procStatusKiB(b, pid, "VmHWM") }

// currentRSSKiB reads VmRSS of a running process.
func currentRSSKiB(b *testing.B, pid int) int { return procStatusKiB(b, pid, "VmRSS") }

// procStatusKiB reads a "<field>: N kB" line of /proc/<pid>/status.
func procStatusKiB(b *testing.B, pid int, field string) int {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			return kib
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func grpcCode(err error) string { return status.Code(err).String() }
