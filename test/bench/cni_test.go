package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

// cniPlugin is one IPAM plugin under test, exec'd per call as a runtime does.
type cniPlugin struct {
	name   string
	bin    string
	conf   []byte
	fill   func(b *testing.B, n int) // brings the plugin to n existing allocations
	binDir string
	netns  string
}

func (p *cniPlugin) exec(cmd, cid string) error {
	c := exec.Command(p.bin)
	c.Env = append(os.Environ(), "CNI_COMMAND="+cmd, "CNI_CONTAINERID="+cid, "CNI_NETNS="+p.netns,
		"CNI_IFNAME=net1", "CNI_PATH="+p.binDir,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAME=pod-"+cid+";K8S_POD_NAMESPACE=default")
	c.Stdin = strings.NewReader(string(p.conf))
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", p.name, cmd, err, out)
	}
	return nil
}

// BenchmarkCNI measures the CNI path as a runtime pays for it — one plugin exec
// per call, config on stdin — for nv-ipam against the running ipam-node, for the
// reference host-local plugin, and for a bare exec of a trivial Go binary (the
// floor): sequential ADD p50/p99 at 0, 2,000 and 10,000 existing allocations, DEL
// p50, and ADD throughput with 16 and 64 concurrent execs.
func BenchmarkCNI(b *testing.B) {
	cp := harness.StartControlPlane(b, harness.ControlPlaneOptions{})
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode}}); err != nil {
		b.Fatal(err)
	}
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/8", PerNodeBlockSize: 65536}}
	if err := cp.Client.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}
	pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: benchNode, StartIP: "10.0.0.1", EndIP: "10.1.0.0"}}
	if err := cp.Client.Status().Update(ctx, pool); err != nil {
		b.Fatal(err)
	}
	kubeconfig, err := cp.WriteKubeconfig(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	refBin := os.Getenv("HWIPAM_CNI_BIN_DIR")
	if refBin == "" {
		b.Fatal(harness.ErrNoCNIPlugins)
	}
	binDir := b.TempDir()
	daemonDir := b.TempDir()
	nvipam := harness.BuildBinary(b, "./cmd/nv-ipam")
	d, _ := startNodeDaemonArgs(b, harness.BuildBinary(b, "./cmd/ipam-node"), kubeconfig, daemonDir,
		"--cni-bin-dir", binDir, "--cni-nv-ipam-bin-file", nvipam, "--cni-conf-dir", filepath.Join(daemonDir, "conf"),
		"--cni-daemon-socket", "unix://"+filepath.Join(daemonDir, "daemon.sock"), "--cni-log-file", "")
	defer d.stop()
	d.waitForPool(b)

	hostLocalData := b.TempDir()
	plugins := []*cniPlugin{
		{name: "nv-ipam", bin: filepath.Join(binDir, "nv-ipam"), binDir: binDir,
			conf: []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "nv-ipam", "confDir": %q}}`,
				filepath.Join(daemonDir, "conf"))),
			fill: func(b *testing.B, n int) { fill(b, d, fmt.Sprintf("prefill%d", n), n) }},
		{name: "host-local", bin: filepath.Join(refBin, "host-local"), binDir: refBin,
			conf: []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "host-local", "dataDir": %q,
				"ranges": [[{"subnet": "10.0.0.0/8", "rangeStart": "10.0.0.1", "rangeEnd": "10.1.0.0"}]]}}`, hostLocalData)),
			fill: func(b *testing.B, n int) { fillHostLocal(b, filepath.Join(hostLocalData, "bench"), n) }},
		{name: "floor", bin: filepath.Join(refBin, "noop"), binDir: refBin, conf: []byte(`{}`), fill: func(*testing.B, int) {}},
	}
	// IPAM plugins never enter the pod's namespace, but skel refuses the caller's own.
	podNS := harness.NewNetNS(b)
	for _, p := range plugins {
		p.netns = podNS.Path
		filled := 0
		for _, existing := range []int{0, 2000, 10000} {
			p.fill(b, existing-filled)
			filled = existing
			b.Run(fmt.Sprintf("%s/sequential/existing=%d", p.name, existing), func(b *testing.B) {
				const n = 200
				add := make([]time.Duration, 0, n)
				del := make([]time.Duration, 0, n)
				for i := range n {
					cid := fmt.Sprintf("seq-%d-%d", existing, i)
					t0 := time.Now()
					if err := p.exec("ADD", cid); err != nil {
						b.Fatal(err)
					}
					add = append(add, time.Since(t0))
					t0 = time.Now()
					if err := p.exec("DEL", cid); err != nil {
						b.Fatal(err)
					}
					del = append(del, time.Since(t0))
				}
				b.ReportMetric(float64(percentile(add, 0.5).Microseconds())/1000, "ADD-p50-ms")
				b.ReportMetric(float64(percentile(add, 0.99).Microseconds())/1000, "ADD-p99-ms")
				b.ReportMetric(float64(percentile(del, 0.5).Microseconds())/1000, "DEL-p50-ms")
			})
		}
		for _, clients := range []int{16, 64} {
			b.Run(fmt.Sprintf("%s/concurrent/execs=%d", p.name, clients), func(b *testing.B) {
				rate := concurrently(b, clients, 640, func(i int) error { return p.exec("ADD", fmt.Sprintf("conc-%d-%d", clients, i)) })
				b.ReportMetric(rate, "ADD/s")
			})
		}
	}
}

// fillHostLocal writes host-local's lease files (one per address, holding the
// container ID) for the first n addresses after those already present.
func fillHostLocal(b *testing.B, dir string, n int) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	existing, _ := os.ReadDir(dir)
	base := len(existing)
	for i := range n {
		k := base + i + 1000 // leave the first addresses to the timed calls
		ip := fmt.Sprintf("10.0.%d.%d", k/250, k%250+1)
		if err := os.WriteFile(filepath.Join(dir, ip), []byte(fmt.Sprintf("prefill-%d\r\nnet1", k)), 0o600); err != nil {
			b.Fatal(err)
		}
	}
}
