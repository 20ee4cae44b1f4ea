package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/test/harness"
)

// cniPlugin is one IPAM plugin under test, exec'd per call as a runtime does.
type cniPlugin struct {
	name   string
	bin    string
	conf   []byte
	fill   func(b *testing.B, n int) // brings the plugin to n more existing allocations
	binDir string
	netns  string
	// held lists the addresses the plugin's store holds for containers whose ID
	// starts with prefix (nil: not checked).
	held func(b *testing.B, prefix string) []string
	// daemon is the daemon's process ID, 0 for plugins without one.
	daemon int
}

// exec runs one CNI command and returns the addresses an ADD printed.
func (p *cniPlugin) exec(cmd, cid string) ([]string, error) {
	c := exec.Command(p.bin)
	c.Env = append(os.Environ(), "CNI_COMMAND="+cmd, "CNI_CONTAINERID="+cid, "CNI_NETNS="+p.netns,
		"CNI_IFNAME=net1", "CNI_PATH="+p.binDir,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAME=pod-"+cid+";K8S_POD_NAMESPACE=default")
	c.Stdin = bytes.NewReader(p.conf)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s%s", p.name, cmd, err, stdout.Bytes(), stderr.Bytes())
	}
	if cmd != "ADD" || p.name == "floor" {
		return nil, nil
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || len(res.IPs) == 0 {
		return nil, fmt.Errorf("%s ADD printed %q: %w", p.name, stdout.Bytes(), err)
	}
	var out []string
	for _, ip := range res.IPs {
		out = append(out, ip.Address)
	}
	return out, nil
}

// BenchmarkCNI measures the CNI path as a runtime pays for it — one plugin exec
// per call, config on stdin — side by side in one run: a bare exec of a trivial Go
// binary (the floor), hwipam's nv-ipam plugin against ipam-node (compact endpoint),
// the same plugin against an ipam-node without it (gRPC, as during a rolling
// upgrade), and the reference host-local plugin. For 0, 2,000 and 10,000 existing
// allocations: sequential ADD and DEL p50/p99, the plugins interleaved call by call
// so that the machine's drift hits all alike, in an order shuffled every round (in
// a fixed one the floor always ran right after host-local, whose calls at 2,000 and
// 10,000 allocations write files for 30-130 ms, and the call after those pays for
// them), and each plugin's ratio to the floor.
// Then ADD throughput with 16 and 64 concurrent execs (1,200 ADDs per plugin in 4
// rounds, the plugins taking turns in an order shuffled every round), and a check
// that no address was handed out twice or lost: the addresses printed are
// distinct and are exactly those the daemon holds for them.
func BenchmarkCNI(b *testing.B) {
	ctx := context.Background()
	_, kubeconfig := benchPool(b, "10.0.0.0/8", 65536, "10.0.0.1", "10.1.0.0")
	refBin := harness.CNIBinDir(b)
	nvipam := harness.BuildBinary(b, "./cmd/nv-ipam")
	ipamNode := harness.BuildBinary(b, "./cmd/ipam-node")
	// Two daemons on one node, each with its own store and socket: one serves the
	// compact endpoint, one only gRPC. The plugin is the same binary.
	hwipam := func(name string, extra ...string) *cniPlugin {
		binDir, dir := b.TempDir(), b.TempDir()
		d, _ := startNodeDaemonArgs(b, ipamNode, kubeconfig, dir, append([]string{
			"--cni-bin-dir", binDir, "--cni-nv-ipam-bin-file", nvipam, "--cni-conf-dir", filepath.Join(dir, "conf"),
			"--cni-daemon-socket", "unix://" + filepath.Join(dir, "daemon.sock"), "--cni-log-file", ""}, extra...)...)
		b.Cleanup(d.stop)
		d.waitForPool(b)
		info := infov1.NewNodeInfoServiceClient(d.conn)
		return &cniPlugin{name: name, bin: filepath.Join(binDir, "nv-ipam"), binDir: binDir, daemon: d.cmd.Process.Pid,
			conf: []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "nv-ipam", "confDir": %q}}`,
				filepath.Join(dir, "conf"))),
			fill: func(b *testing.B, n int) { fill(b, d, fmt.Sprintf("prefill%d", time.Now().UnixNano()), n) },
			held: func(b *testing.B, prefix string) []string {
				resp, err := info.ListAllocations(ctx, &infov1.ListAllocationsRequest{Pool: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				var out []string
				for _, a := range resp.GetAllocations() {
					if strings.HasPrefix(a.GetContainerId(), prefix) {
						out = append(out, a.GetIp())
					}
				}
				return out
			}}
	}
	hostLocalData := b.TempDir()
	plugins := []*cniPlugin{
		{name: "floor", bin: filepath.Join(refBin, "noop"), binDir: refBin, conf: []byte(`{}`), fill: func(*testing.B, int) {}},
		hwipam("nv-ipam"),
		hwipam("nv-ipam-grpc", "--fast-endpoint=false"),
		{name: "host-local", bin: filepath.Join(refBin, "host-local"), binDir: refBin,
			conf: []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "host-local", "dataDir": %q,
				"ranges": [[{"subnet": "10.0.0.0/8", "rangeStart": "10.0.0.1", "rangeEnd": "10.1.0.0"}]]}}`, hostLocalData)),
			fill: func(b *testing.B, n int) { fillHostLocal(b, filepath.Join(hostLocalData, "bench"), n) },
			held: func(b *testing.B, prefix string) []string {
				return hostLocalHeld(b, filepath.Join(hostLocalData, "bench"), prefix)
			}},
	}
	// IPAM plugins never enter the pod's namespace, but skel refuses the caller's own.
	podNS := harness.NewNetNS(b)
	for _, p := range plugins {
		p.netns = podNS.Path
	}

	filled := 0
	for _, existing := range []int{0, 2000, 10000} {
		for _, p := range plugins {
			p.fill(b, existing-filled)
		}
		filled = existing
		b.Run(fmt.Sprintf("sequential/existing=%d", existing), func(b *testing.B) {
			const rounds = 200
			add := map[string][]time.Duration{}
			del := map[string][]time.Duration{}
			order := slices.Clone(plugins)
			rng := rand.New(rand.NewPCG(uint64(existing), 1)) // the same orders every run
			for i := range rounds {
				rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
				for _, p := range order {
					cid := fmt.Sprintf("seq-%d-%d", existing, i)
					t0 := time.Now()
					if _, err := p.exec("ADD", cid); err != nil {
						b.Fatal(err)
					}
					add[p.name] = append(add[p.name], time.Since(t0))
					t0 = time.Now()
					if _, err := p.exec("DEL", cid); err != nil {
						b.Fatal(err)
					}
					del[p.name] = append(del[p.name], time.Since(t0))
				}
			}
			floorAdd, floorAdd99 := percentile(add["floor"], 0.5), percentile(add["floor"], 0.99)
			floorDel := percentile(del["floor"], 0.5)
			for _, p := range plugins {
				a50, a99, d50 := percentile(add[p.name], 0.5), percentile(add[p.name], 0.99), percentile(del[p.name], 0.5)
				b.ReportMetric(ms(a50), p.name+"-ADD-p50-ms")
				b.ReportMetric(ms(a99), p.name+"-ADD-p99-ms")
				b.ReportMetric(ms(d50), p.name+"-DEL-p50-ms")
				b.ReportMetric(ms(percentile(del[p.name], 0.99)), p.name+"-DEL-p99-ms")
				if p.name != "floor" {
					b.ReportMetric(float64(a50)/float64(floorAdd), p.name+"-ADD-p50-x-floor")
					b.ReportMetric(float64(a99)/float64(floorAdd99), p.name+"-ADD-p99-x-floor-p99")
					b.ReportMetric(float64(d50)/float64(floorDel), p.name+"-DEL-p50-x-floor")
				}
			}
		})
	}
	for _, execs := range []int{16, 64} {
		b.Run(fmt.Sprintf("concurrent/execs=%d", execs), func(b *testing.B) {
			// The plugins take turns, a quarter of the ADDs each per round, in an
			// order shuffled every round, so that the machine's drift over a run
			// hits all alike; a plugin's rate is its ADDs over its summed time.
			const total, rounds = 1200, 4
			type tally struct {
				seconds, execCPU, daemonCPU float64
				printed                     map[string]string
			}
			tallies := make([]tally, len(plugins))
			for pi := range tallies {
				tallies[pi].printed = map[string]string{}
			}
			prefix := fmt.Sprintf("conc-%d-", execs)
			turns := make([]int, len(plugins))
			for pi := range turns {
				turns[pi] = pi
			}
			rng := rand.New(rand.NewPCG(uint64(execs), 2)) // the same orders every run
			for round := range rounds {
				// As in the sequential part, an order shuffled every round: in a
				// fixed one the floor's turn always came right after host-local's.
				rng.Shuffle(len(turns), func(a, b int) { turns[a], turns[b] = turns[b], turns[a] })
				for _, pi := range turns {
					p := plugins[pi]
					t := &tallies[pi]
					var mu sync.Mutex
					// CPU time: the plugin processes' (children that have been waited
					// for) and the daemon's.
					var before, after syscall.Rusage
					_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &before)
					daemonBefore := 0.0
					if p.daemon != 0 {
						daemonBefore = cpuSeconds(b, p.daemon)
					}
					n := total / rounds
					rate := concurrently(b, execs, n, func(i int) error {
						cid := fmt.Sprintf("%s%d", prefix, round*n+i)
						ips, err := p.exec("ADD", cid)
						mu.Lock()
						defer mu.Unlock()
						for _, ip := range ips {
							if other, dup := t.printed[ip]; dup {
								return fmt.Errorf("%s handed %s to both %s and %s", p.name, ip, other, cid)
							}
							t.printed[ip] = cid
						}
						return err
					})
					_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &after)
					t.seconds += float64(n) / rate
					t.execCPU += cpuMs(after) - cpuMs(before)
					if p.daemon != 0 {
						t.daemonCPU += (cpuSeconds(b, p.daemon) - daemonBefore) * 1000
					}
				}
			}
			floorRate := total / tallies[0].seconds
			for pi, p := range plugins {
				t := tallies[pi]
				rate := total / t.seconds
				b.ReportMetric(t.execCPU/total, p.name+"-exec-CPU-ms/ADD")
				if p.daemon != 0 {
					b.ReportMetric(t.daemonCPU/total, p.name+"-daemon-CPU-ms/ADD")
				}
				b.ReportMetric(rate, p.name+"-ADD/s")
				if pi == 0 {
					continue
				}
				b.ReportMetric(rate/floorRate, p.name+"-ADD/s-x-floor")
				checkHeld(b, p, prefix, t.printed, total)
			}
		})
	}
}

// cpuMs is the user and system time in r, in milliseconds.
func cpuMs(r syscall.Rusage) float64 {
	return float64(r.Utime.Nano()+r.Stime.Nano()) / 1e6
}

// checkHeld compares the addresses ADD printed with those the plugin's store
// holds: the same set, one per call.
func checkHeld(b *testing.B, p *cniPlugin, prefix string, printed map[string]string, calls int) {
	b.Helper()
	if len(printed) != calls {
		b.Errorf("%s: %d distinct addresses printed for %d ADDs", p.name, len(printed), calls)
	}
	held := p.held(b, prefix)
	seen := map[string]bool{}
	for _, a := range held {
		ip, _, _ := strings.Cut(a, "/")
		if seen[ip] {
			b.Errorf("%s: the store holds %s twice", p.name, ip)
		}
		seen[ip] = true
	}
	for a, cid := range printed {
		ip, _, _ := strings.Cut(a, "/")
		if !seen[ip] {
			b.Errorf("%s: %s was printed for %s but the store does not hold it", p.name, a, cid)
		}
	}
	if len(held) != len(printed) {
		b.Errorf("%s: the store holds %d addresses for these calls, %d were printed", p.name, len(held), len(printed))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// fillHostLocal writes host-local's lease files (one per address, holding the
// container ID) for n more addresses, from the top of its range down. host-local
// looks for a free address from the last one it handed out, one file at a time: with
// the leases right after its cursor every ADD would walk all of them (150 ms at
// 10,000), so they are put where the timed calls do not reach — host-local's best
// case.
func fillHostLocal(b *testing.B, dir string, n int) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	existing, _ := filepath.Glob(filepath.Join(dir, "10.*"))
	base := len(existing)
	for i := range n {
		k := 65535 - (base + i) // 10.0.255.255 down; the range ends at 10.1.0.0
		ip := fmt.Sprintf("10.0.%d.%d", k/256, k%256)
		if err := os.WriteFile(filepath.Join(dir, ip), []byte(fmt.Sprintf("prefill-%d\r\nnet1", k)), 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// hostLocalHeld reads host-local's lease files: the addresses whose container ID
// starts with prefix.
func hostLocalHeld(b *testing.B, dir, prefix string) []string {
	b.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(string(data), prefix) {
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

// BenchmarkCNIExecPath breaks one sequential ADD down, each part timed on its own
// and interleaved with the others (p50 of 300): a bare exec of a trivial Go binary;
// the plugin's start-up (VERSION); start-up plus reading the network config and
// nv-ipam.conf up to a failed connect (a socket that does not exist); the whole ADD
// and DEL; the ADD against a stand-in that answers at once (the plugin's own
// cost); in-process, the connect and the Allocate round trip over the compact
// endpoint; the daemon's own time in Allocate (its request histogram); and one
// store commit (one write of the store's log) on the same file system.
func BenchmarkCNIExecPath(b *testing.B) {
	ctx := context.Background()
	_, kubeconfig := benchPool(b, "10.0.0.0/8", 65536, "10.0.0.1", "10.1.0.0")
	refBin := harness.CNIBinDir(b)
	binDir, dir := b.TempDir(), b.TempDir()
	metrics := freePort(b)
	d, _ := startNodeDaemonArgs(b, harness.BuildBinary(b, "./cmd/ipam-node"), kubeconfig, dir,
		"--cni-bin-dir", binDir, "--cni-nv-ipam-bin-file", harness.BuildBinary(b, "./cmd/nv-ipam"),
		"--cni-conf-dir", filepath.Join(dir, "conf"), "--cni-daemon-socket", "unix://"+filepath.Join(dir, "daemon.sock"),
		"--cni-log-file", "", "--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", metrics))
	defer d.stop()
	d.waitForPool(b)
	podNS := harness.NewNetNS(b)
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "nv-ipam", "confDir": %q}}`, filepath.Join(dir, "conf"))
	plugin := &cniPlugin{name: "nv-ipam", bin: filepath.Join(binDir, "nv-ipam"), binDir: binDir, netns: podNS.Path, conf: []byte(conf)}
	noDaemon := &cniPlugin{name: "nv-ipam-no-daemon", bin: plugin.bin, binDir: binDir, netns: podNS.Path,
		conf: []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "nv-ipam", "confDir": %q,
			"daemonSocket": "unix:///nonexistent/daemon.sock"}}`, filepath.Join(dir, "conf")))}
	floor := &cniPlugin{name: "floor", bin: filepath.Join(refBin, "noop"), binDir: refBin, netns: podNS.Path, conf: []byte(`{}`)}
	// The plugin against a stand-in that answers at once (with the daemon's own
	// first answer to each method): the plugin's own cost, without the daemon's.
	instantDir := b.TempDir()
	instantSock := "unix://" + filepath.Join(instantDir, "daemon.sock")
	instantDaemon(b, ipamwire.FastSocketPath(filepath.Join(instantDir, "daemon.sock")), "unix://"+filepath.Join(dir, "daemon.sock"))
	instant := &cniPlugin{name: "nv-ipam-instant", bin: plugin.bin, binDir: binDir, netns: podNS.Path,
		conf: []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "nv-ipam", "confDir": %q,
			"daemonSocket": %q}}`, filepath.Join(dir, "conf"), instantSock))}
	st, err := store.Open(filepath.Join(b.TempDir(), "store"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()

	parts := map[string][]time.Duration{}
	timed := func(name string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		parts[name] = append(parts[name], time.Since(t0))
	}
	sock := "unix://" + filepath.Join(dir, "daemon.sock")
	for i := range 300 {
		cid := fmt.Sprintf("path-%d", i)
		timed("floor-exec", func() error { _, err := floor.exec("ADD", cid); return err })
		timed("plugin-VERSION", func() error { _, err := plugin.exec("VERSION", cid); return err })
		timed("plugin-config-only", func() error {
			if _, err := noDaemon.exec("ADD", cid); err == nil || !strings.Contains(err.Error(), "not reachable") {
				return fmt.Errorf("ADD without a daemon: %w, want unreachable", err)
			}
			return nil
		})
		timed("plugin-ADD", func() error { _, err := plugin.exec("ADD", cid); return err })
		timed("plugin-ADD-instant-daemon", func() error { _, err := instant.exec("ADD", cid); return err })
		timed("plugin-DEL", func() error { _, err := plugin.exec("DEL", cid); return err })
		var c *ipamwire.Client
		timed("connect", func() (err error) { c, err = ipamwire.Dial(sock, time.Now().Add(5*time.Second)); return err })
		prm := &ipamwire.Params{Pools: []string{"bench"}, ContainerID: "inproc-" + cid, IfName: "net1", PodName: "p", PodNamespace: "default"}
		timed("Allocate-round-trip", func() error { _, err := c.Allocate(ctx, prm); return err })
		timed("Deallocate-round-trip", func() error { return c.Deallocate(ctx, prm) })
		_ = c.Close()
		timed("store-commit", func() error {
			return st.Commit([]store.Put{{PoolKey: "bench", Allocation: store.Allocation{ContainerID: cid, IfName: "net1", IP: "10.0.0.1"}}}, nil)
		})
	}
	for name, d := range parts {
		b.ReportMetric(ms(percentile(d, 0.5)), name+"-p50-ms")
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)
	series := `hwipam_node_request_duration_seconds_%s{code="OK",method="/nvidia.ipam.node.v1.IPAMService/Allocate"}`
	sum, count := scrapeSum(b, url, fmt.Sprintf(series, "sum")), scrapeSum(b, url, fmt.Sprintf(series, "count"))
	b.ReportMetric(sum/count*1000, "daemon-Allocate-mean-ms")
}

// benchPool starts the control plane with Node benchNode and IPPool "bench" in
// "default" (subnet, blockSize), whose block on benchNode is start-end, as the
// controller would write it; it returns a kubeconfig for the daemon.
func benchPool(b *testing.B, subnet string, blockSize int, start, end string) (*harness.ControlPlane, string) {
	b.Helper()
	cp := harness.StartControlPlane(b, harness.ControlPlaneOptions{})
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode}}); err != nil {
		b.Fatal(err)
	}
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"},
		Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: blockSize}}
	if err := cp.Client.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}
	pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: benchNode, StartIP: start, EndIP: end}}
	if err := cp.Client.Status().Update(ctx, pool); err != nil {
		b.Fatal(err)
	}
	kubeconfig, err := cp.WriteKubeconfig(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	return cp, kubeconfig
}

// instantDaemon serves the compact endpoint at path as a stand-in for the daemon
// at target: the first request of each method goes to the
// daemon, and its answer is replayed at once for every later one.
func instantDaemon(b *testing.B, path, target string) {
	b.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	var mu sync.Mutex
	answers := map[string][]byte{}
	answer := func(method string, msg []byte) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if a, ok := answers[method]; ok {
			return a, nil
		}
		c, err := ipamwire.Dial(target, time.Now().Add(5*time.Second))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		reply, err := c.Invoke(context.Background(), method, msg)
		if err != nil {
			return nil, err
		}
		answers[method] = ipamwire.AppendReply(nil, ipamwire.OK, reply)
		return answers[method], nil
	}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					method, msg, err := ipamwire.ReadRequest(br)
					if err != nil {
						return
					}
					a, err := answer(method, msg)
					if err != nil {
						a = ipamwire.AppendReply(nil, ipamwire.Unavailable, []byte(err.Error()))
					}
					if _, err := conn.Write(a); err != nil {
						return
					}
				}
			}()
		}
	}()
}
