// Package realnode runs a real single-node Kubernetes cluster on this machine, for the
// end-to-end suite and `make demo`: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, containerd (with Debian's runc), kubelet and a loopback image
// registry, with Multus (thin) over a bridge pod network. Every piece of state lives
// in one run directory; everything it puts on the host (links, iptables rules,
// cgroups, mounts) is recorded in that directory's state.json and undone by Teardown.
//
// The binaries come from `make test-assets` (hack/test-assets.sh): KUBEBUILDER_ASSETS
// (kube-apiserver, etcd), HWIPAM_CNI_BIN_DIR (reference CNI plugins) and
// HWIPAM_NODE_BIN_DIR (the node's components). It needs root.
package realnode

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrNoAssets says which binaries are missing and how to get them.
var ErrNoAssets = errors.New("real-node binaries not found: run `make test-assets`, then " +
	"`eval \"$(hack/test-assets.sh env)\"` (or run `make test` / `make demo`)")

// Options tune Start.
type Options struct {
	// NodeName is the Node's name; default "hwipam-node".
	NodeName string
	// Dir is the run directory; default a new directory under /tmp.
	Dir string
	// Progress receives one line per stage; nil discards them.
	Progress func(format string, args ...any)
	// Detach leaves the processes running when this process exits (make demo); the
	// node is then stopped with Teardown on LoadState(dir).
	Detach bool
}

// Cluster is a running node.
type Cluster struct {
	Dir      string
	NodeName string
	// NodeIP is the node's InternalIP, on the pod bridge; the apiserver listens there.
	NodeIP netip.Addr
	// PodSubnet is the default pod network (bridge + host-local).
	PodSubnet netip.Prefix
	// Bridge is the pod network's bridge on the host; Prefix is the per-run prefix of
	// host link names (at most 6 characters), for links the caller creates.
	Bridge, Prefix string
	// Kubeconfig is a cluster-admin kubeconfig; Config and Clientset are bound to it.
	Kubeconfig string
	Config     *rest.Config
	Clientset  kubernetes.Interface
	// Registry is host:port of the loopback registry that holds the images.
	Registry string
	// CNIBinDir and CNIConfDir are the node's CNI directories (containerd's bin_dirs
	// and conf_dir); StateDir is where hwipam's node state goes (the DaemonSet's
	// /var/lib/cni/nv-ipam).
	CNIBinDir, CNIConfDir, StateDir string
	// ContainerdSocket is containerd's gRPC socket (for ctr).
	ContainerdSocket string
	// Bin holds the node's binaries (kubectl, ctr, hwipam-image, ...).
	Bin string

	opts  Options
	state *State
}

// Start brings the node up and returns when the Node is Ready. On error everything
// started so far is torn down (the run directory is kept for its logs).
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.NodeName == "" {
		opts.NodeName = "hwipam-node"
	}
	if opts.Progress == nil {
		opts.Progress = func(string, ...any) {}
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the real node needs root (network links, mounts, cgroups, iptables)")
	}
	assets, err := findAssets()
	if err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "hwn-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	// Absolute and without symlinks: mount points are compared against it.
	if opts.Dir, err = filepath.EvalSymlinks(opts.Dir); err != nil {
		return nil, err
	}
	c = &Cluster{Dir: opts.Dir, NodeName: opts.NodeName, Bin: assets.node, opts: opts,
		state: &State{Dir: opts.Dir}}
	if err := c.state.save(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (logs in %s/logs)", err, c.Dir)
			if terr := c.state.Teardown(true); terr != nil {
				err = errors.Join(err, fmt.Errorf("teardown: %w", terr))
			}
		}
	}()
	for _, d := range []string{"logs", "pki", "cni/bin", "cni/net.d", "cni/ipam", "cni/multus", "nv-ipam", "images"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	c.CNIBinDir, c.CNIConfDir = filepath.Join(c.Dir, "cni", "bin"), filepath.Join(c.Dir, "cni", "net.d")
	c.StateDir = filepath.Join(c.Dir, "nv-ipam")
	c.quietClientLog()

	steps := []struct {
		what string
		fn   func(context.Context, assetDirs) error
	}{
		{"network: pod bridge and node address", c.startNetwork},
		{"etcd and kube-apiserver", c.startControlPlane},
		{"kube-controller-manager and kube-scheduler", c.startControllers},
		{"image registry on loopback with the pause and busybox images", c.startRegistry},
		{"containerd (runc " + runcVersion() + ")", c.startContainerd},
		{"kubelet, CNI (Multus over a bridge)", c.startKubelet},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.fn(ctx, assets); err != nil {
			return nil, fmt.Errorf("%s: %w", s.what, err)
		}
		opts.Progress("%-62s %5.1fs", s.what, time.Since(t).Seconds())
	}
	return c, nil
}

// Stop tears the node down (see State.Teardown). keepDir keeps the run directory.
func (c *Cluster) Stop(keepDir bool) error {
	return c.state.Teardown(keepDir)
}

type assetDirs struct{ controlPlane, cni, node string }

func findAssets() (assetDirs, error) {
	a := assetDirs{
		controlPlane: os.Getenv("KUBEBUILDER_ASSETS"),
		cni:          os.Getenv("HWIPAM_CNI_BIN_DIR"),
		node:         os.Getenv("HWIPAM_NODE_BIN_DIR"),
	}
	need := map[string][]string{
		a.controlPlane: {"kube-apiserver", "etcd"},
		a.cni:          {"bridge", "host-local", "macvlan", "host-device"},
		a.node: {"kubelet", "kube-scheduler", "kube-controller-manager", "kubectl", "containerd",
			"containerd-shim-runc-v2", "ctr", "multus", "hwipam-image", "pause"},
	}
	var missing []string
	for dir, bins := range need {
		for _, b := range bins {
			if dir == "" {
				missing = append(missing, b)
			} else if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				missing = append(missing, filepath.Join(dir, b))
			}
		}
	}
	for _, tool := range []string{"runc", "iptables", "ip", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (Debian packages runc, iptables, iproute2, busybox-static: `make deps`)")
		}
	}
	if len(missing) > 0 {
		return a, fmt.Errorf("%w; missing: %s", ErrNoAssets, strings.Join(missing, ", "))
	}
	return a, nil
}

func runcVersion() string {
	out, err := exec.Command("runc", "--version").Output()
	if err != nil {
		return "not found"
	}
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return f[2]
	}
	return "?"
}

// run runs a short host command and returns its error with its output.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// start runs a long-lived component with its output in logs/<name>.log and records it.
func (c *Cluster) start(name, bin string, args []string, env ...string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(filepath.Join(c.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !c.opts.Detach {
		// A test binary that dies takes its node's processes with it.
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c.state.Processes = append(c.state.Processes, Process{Name: name, PID: cmd.Process.Pid, Start: procStart(cmd.Process.Pid)})
	if !c.opts.Detach {
		go func() { _ = cmd.Wait() }() // reap it, so that a dead process is seen as dead
	} else {
		_ = cmd.Process.Release()
	}
	return cmd, c.state.save()
}

// StartHostProcess runs bin on the host beside the node's own components (a
// controller a test adds, such as NFD's nfd-master), started and recorded like them:
// its output in logs/<name>.log, its PID in state.json, so that Teardown stops it
// too. The returned function stops it sooner and forgets it.
func (c *Cluster) StartHostProcess(name, bin string, args []string, env ...string) (stop func() error, err error) {
	if _, err := c.start(name, bin, args, env...); err != nil {
		return nil, err
	}
	return func() error {
		i := slices.IndexFunc(c.state.Processes, func(p Process) bool { return p.Name == name })
		if i < 0 {
			return nil
		}
		c.state.Processes[i].stop(5 * time.Second)
		c.state.Processes = slices.Delete(c.state.Processes, i, i+1)
		return c.state.save()
	}, nil
}

// waitFor polls check until it returns nil, the timeout passes, or the named process
// has exited (then the error quotes the end of its log).
func (c *Cluster) waitFor(ctx context.Context, what, proc string, timeout time.Duration, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		if proc != "" && !c.processAlive(proc) {
			return fmt.Errorf("%s exited while waiting for %s: %w\n%s", proc, what, last, c.logTail(proc, 15))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %w)\n%s", what, ctx.Err(), last, c.logTail(proc, 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) processAlive(name string) bool {
	for _, p := range c.state.Processes {
		if p.Name == name {
			return p.alive()
		}
	}
	return false
}

// logTail returns the last n lines of a component's log.
func (c *Cluster) logTail(name string, n int) string {
	if name == "" {
		return ""
	}
	data, err := os.ReadFile(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return name + ".log: " + strings.Join(lines, "\n  ")
}

// freePort returns a TCP port that is free on host and on every address, below
// the kernel's ephemeral range. A port the kernel hands out (listening on port
// 0) is in that range, and between this check and the component's own bind
// (seconds later, in a pod) any outgoing connection on the node may take it as
// its local port: a daemon then crash-looped for the whole of a run on "bind:
// address already in use" for its metrics port, which the kubelet's or the
// controller's connection to the API server held.
func freePort(host string) (int, error) {
	low := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const from = 20000
	if low <= from+100 {
		return 0, fmt.Errorf("the ephemeral port range starts at %d; the real-node test needs ports below it, from %d", low, from)
	}
	for range 200 {
		port := from + rand.IntN(low-from)
		// Free on every address (the daemon listens on ":port") and on host.
		all, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			continue
		}
		_ = all.Close()
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free TCP port between %d and %d", from, low)
}

// startNetwork makes the pod bridge with the node's address on it. The index of the
// first free 172.29.N.0/24 (N from 100) names the run's links, so that two nodes on
// one machine (a test and a demo) never share one.
func (c *Cluster) startNetwork(context.Context, assetDirs) error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	used := func(p netip.Prefix) bool {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ap, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ap.Unmap()) {
					return true
				}
			}
		}
		return false
	}
	for n := 100; n < 250; n++ {
		subnet := netip.MustParsePrefix(fmt.Sprintf("172.29.%d.0/24", n))
		if used(subnet) {
			continue
		}
		prefix := fmt.Sprintf("hwn%d", n)
		// Creating the bridge is the claim: it fails when another run took N.
		if err := run("ip", "link", "add", prefix+"br", "type", "bridge"); err != nil {
			continue
		}
		c.Prefix, c.Bridge, c.PodSubnet = prefix, prefix+"br", subnet
		c.NodeIP = subnet.Addr().Next()
		c.state.Links = append(c.state.Links, c.Bridge)
		c.state.CgroupName = "hwipam-" + prefix
		if err := c.state.save(); err != nil {
			return err
		}
		if err := run("ip", "addr", "add", netip.PrefixFrom(c.NodeIP, 24).String(), "dev", c.Bridge); err != nil {
			return err
		}
		return run("ip", "link", "set", c.Bridge, "up")
	}
	return errors.New("no free 172.29.N.0/24 for the pod network (N 100-249)")
}

// serviceIP is the "kubernetes" Service's address: the first of the service range
// 172.28.N.0/24, which an iptables DNAT rule (the one thing kube-proxy would do here)
// sends to the apiserver, for pods that use in-cluster configuration.
func (c *Cluster) serviceRange() netip.Prefix {
	b := c.NodeIP.As4()
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 28, b[2], 0}), 24)
}

func (c *Cluster) startControlPlane(ctx context.Context, a assetDirs) error {
	p, err := newPKI(filepath.Join(c.Dir, "pki"))
	if err != nil {
		return err
	}
	svcIP := c.serviceRange().Addr().Next()
	node := c.NodeIP.String()
	if err := p.issue("apiserver", "kube-apiserver", nil, node, svcIP.String(), "127.0.0.1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"); err != nil {
		return err
	}
	if err := p.issue("admin", "hwipam-admin", []string{"system:masters"}); err != nil {
		return err
	}
	if err := p.issue("kubelet", "system:node:"+c.NodeName, []string{"system:masters"}, node, c.NodeName); err != nil {
		return err
	}
	if err := p.serviceAccountKeys(); err != nil {
		return err
	}

	etcdPort, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	peerPort, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	if _, err := c.start("etcd", filepath.Join(a.controlPlane, "etcd"), []string{
		"--data-dir=" + filepath.Join(c.Dir, "etcd"), "--name=realnode",
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", peerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", peerPort),
		fmt.Sprintf("--initial-cluster=realnode=http://127.0.0.1:%d", peerPort),
		"--unsafe-no-fsync", "--log-level=warn",
	}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "etcd health", "etcd", 60*time.Second, func() error {
		return httpOK(etcdURL + "/health")
	}); err != nil {
		return err
	}

	apiPort, err := freePort(node)
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s:%d", node, apiPort)
	if _, err := c.start("kube-apiserver", filepath.Join(a.controlPlane, "kube-apiserver"), []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + node, fmt.Sprintf("--secure-port=%d", apiPort), "--advertise-address=" + node,
		"--cert-dir=" + filepath.Join(c.Dir, "pki"),
		"--tls-cert-file=" + p.path("apiserver.crt"), "--tls-private-key-file=" + p.path("apiserver.key"),
		"--client-ca-file=" + p.path("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.path("sa.pub"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--service-cluster-ip-range=" + c.serviceRange().String(),
		"--authorization-mode=RBAC", "--allow-privileged=true",
		// kubectl exec/logs: the apiserver reaches kubelet by the node's address, as a
		// client kubelet trusts.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + p.path("admin.crt"), "--kubelet-client-key=" + p.path("admin.key"),
		// Admission webhooks: there is no kube-proxy on this node, so the apiserver
		// calls a webhook Service's endpoints (pod addresses on the bridge) directly.
		"--enable-aggregator-routing=true",
		"--v=0",
	}); err != nil {
		return err
	}
	kubeconfig := filepath.Join(c.Dir, "kubeconfig")
	if err := p.kubeconfig(kubeconfig, "admin", server); err != nil {
		return err
	}
	c.Kubeconfig = kubeconfig
	c.state.Kubeconfig, c.state.Kubectl = kubeconfig, filepath.Join(a.node, "kubectl")
	if err := c.state.save(); err != nil {
		return err
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return err
	}
	c.Config.QPS, c.Config.Burst = 50, 100
	if c.Clientset, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "kube-apiserver /readyz", "kube-apiserver", 90*time.Second, func() error {
		return c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
	}); err != nil {
		return err
	}
	// The "kubernetes" Service's address reaches the apiserver, from pods (PREROUTING)
	// and from host-network pods (OUTPUT).
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		rule := []string{chain, "-d", svcIP.String() + "/32", "-p", "tcp", "--dport", "443",
			"-m", "comment", "--comment", "hwipam-realnode " + c.Prefix,
			"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", node, apiPort)}
		if err := run("iptables", append([]string{"-t", "nat", "-A"}, rule...)...); err != nil {
			return err
		}
		c.state.IPTables = append(c.state.IPTables, rule)
		if err := c.state.save(); err != nil {
			return err
		}
	}
	return nil
}

func httpOK(url string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func (c *Cluster) startControllers(ctx context.Context, a assetDirs) error {
	pkiDir := filepath.Join(c.Dir, "pki")
	if _, err := c.start("kube-controller-manager", filepath.Join(a.node, "kube-controller-manager"), []string{
		"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--service-account-private-key-file=" + filepath.Join(pkiDir, "sa.key"),
		"--root-ca-file=" + filepath.Join(pkiDir, "ca.crt"),
		"--service-cluster-ip-range=" + c.serviceRange().String(),
		// No pod CIDRs are handed out: the pod network's IPAM is host-local.
		"--controllers=*,-nodeipam",
		"--v=0",
	}); err != nil {
		return err
	}
	if _, err := c.start("kube-scheduler", filepath.Join(a.node, "kube-scheduler"), []string{
		"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--v=0",
	}); err != nil {
		return err
	}
	// The service-account controller has run once "default" has its account.
	return c.waitFor(ctx, "the default service account", "kube-controller-manager", 60*time.Second, func() error {
		_, err := c.Clientset.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// Images the harness serves besides hwipam's own.
const (
	pauseImage   = "pause:hwipam"
	busyboxImage = "busybox:hwipam"
)

// PauseImage is the sandbox image (containerd's pinned sandbox image).
func (c *Cluster) PauseImage() string { return c.Registry + "/" + pauseImage }

// CDIDir is where this node's containerd reads CDI specs (cdi_spec_dirs), and
// ipam-node's DRA driver writes them: under the run directory, not the host's
// /var/run/cdi, which another node on the machine would share.
func (c *Cluster) CDIDir() string { return filepath.Join(c.Dir, "cdi") }

// BusyboxImage is the workload image: busybox with sh, ip, ping, sleep, cat and ls.
func (c *Cluster) BusyboxImage() string { return c.Registry + "/" + busyboxImage }

func (c *Cluster) startRegistry(ctx context.Context, a assetDirs) error {
	addrFile := filepath.Join(c.Dir, "registry.addr")
	if _, err := c.start("registry", filepath.Join(a.node, "hwipam-image"), []string{"serve", "--addr-file", addrFile,
		"--blob-dir", filepath.Join(c.Dir, "registry")}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "the registry", "registry", 30*time.Second, func() error {
		data, err := os.ReadFile(addrFile)
		c.Registry = string(data)
		return err
	}); err != nil {
		return err
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return err
	}
	images := []struct {
		ref  string
		args []string
	}{
		{pauseImage, []string{"--entrypoint", "/pause", "/pause=" + filepath.Join(a.node, "pause")}},
		{busyboxImage, []string{"--dir", "/tmp:1777",
			"--link", "/bin/sh=busybox", "--link", "/bin/ip=busybox", "--link", "/bin/ping=busybox",
			"--link", "/bin/sleep=busybox", "--link", "/bin/cat=busybox", "--link", "/bin/ls=busybox",
			"/bin/busybox=" + busybox}},
	}
	for _, img := range images {
		tar := filepath.Join(c.Dir, "images", strings.ReplaceAll(img.ref, ":", "_")+".tar")
		args := append([]string{"build", "-o", tar, "--tag", img.ref}, img.args...)
		if out, err := exec.CommandContext(ctx, filepath.Join(a.node, "hwipam-image"), args...).CombinedOutput(); err != nil {
			return fmt.Errorf("building image %s: %w: %s", img.ref, err, out)
		}
		if err := c.PushImage(ctx, tar, img.ref); err != nil {
			return err
		}
	}
	return nil
}

// PushImage pushes an image tarball (from hwipam-image build or `make image`) to the
// node's registry as ref (name:tag) and returns nothing but an error.
func (c *Cluster) PushImage(ctx context.Context, tarball, ref string) error {
	out, err := exec.CommandContext(ctx, filepath.Join(c.Bin, "hwipam-image"), "push", "--insecure", tarball, c.Registry+"/"+ref).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pushing %s: %w: %s", ref, err, out)
	}
	return nil
}

func (c *Cluster) startContainerd(ctx context.Context, a assetDirs) error {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return err
	}
	cd := filepath.Join(c.Dir, "containerd")
	// Sandboxes' network namespaces, on a shared mount of their own: a pod
	// that mounts the directory HostToContainer (ipam-node with the DRA
	// overlay, which moves netdevs into them) sees the namespaces made after
	// it started. Teardown unmounts everything under the run directory.
	netns := filepath.Join(cd, "state", "io.containerd.grpc.v1.cri", "netns")
	if err := os.MkdirAll(netns, 0o711); err != nil {
		return err
	}
	if err := syscall.Mount(netns, netns, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s: %w", netns, err)
	}
	if err := syscall.Mount("", netns, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s a shared mount: %w", netns, err)
	}
	hosts := filepath.Join(cd, "certs.d", c.Registry)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), fmt.Appendf(nil,
		"server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n",
		"http://"+c.Registry, "http://"+c.Registry), 0o644); err != nil {
		return err
	}
	c.ContainerdSocket = filepath.Join(cd, "containerd.sock")
	c.state.ContainerdSocket = c.ContainerdSocket
	config := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.cri.v1.runtime"]
  # runc cannot lower its own oom_score_adj here: "failed to update
  # /proc/self/oom_score_adj: Permission denied".
  restrict_oom_score_adj = true
  # Sandboxes' network namespaces under the state dir, so that teardown finds them.
  netns_mounts_under_state_dir = true
  # CDI (on by default in containerd 2.x) from this node's directory only.
  enable_cdi = true
  cdi_spec_dirs = [%[11]q]

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = %[5]q
  Root = %[6]q
  SystemdCgroup = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = [%[7]q]
  conf_dir = %[8]q
  max_conf_num = 1
  use_internal_loopback = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %[9]q

[plugins."io.containerd.cri.v1.images".registry]
  config_path = %[10]q
`, filepath.Join(cd, "root"), filepath.Join(cd, "state"), c.ContainerdSocket, filepath.Join(cd, "opt"),
		runc, filepath.Join(cd, "runc"), c.CNIBinDir, c.CNIConfDir, c.PauseImage(), filepath.Join(cd, "certs.d"), c.CDIDir())
	cfgPath := filepath.Join(cd, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return err
	}
	if _, err := c.start("containerd", filepath.Join(a.node, "containerd"), []string{"--config", cfgPath},
		// containerd finds its shim on PATH.
		"PATH="+a.node+":"+os.Getenv("PATH")); err != nil {
		return err
	}
	return c.waitFor(ctx, "containerd's socket", "containerd", 60*time.Second, func() error {
		return exec.CommandContext(ctx, filepath.Join(a.node, "ctr"), "--address", c.ContainerdSocket, "version").Run()
	})
}

//go:embed nad-crd.yaml
var nadCRD []byte

func (c *Cluster) startKubelet(ctx context.Context, a assetDirs) error {
	crd := filepath.Join(c.Dir, "nad-crd.yaml")
	if err := os.WriteFile(crd, nadCRD, 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", crd); err != nil {
		return err
	}
	// CNI: Multus (thin) delegating the default network to a bridge, plus the plugins
	// that secondary networks use. ipam-node installs nv-ipam into the same directory.
	for _, p := range []struct{ dir, name string }{
		{a.cni, "bridge"}, {a.cni, "host-local"}, {a.cni, "macvlan"}, {a.cni, "host-device"}, {a.node, "multus"},
	} {
		if err := os.Symlink(filepath.Join(p.dir, p.name), filepath.Join(c.CNIBinDir, p.name)); err != nil {
			return err
		}
	}
	multus := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "multus-cni-network",
  "type": "multus",
  "kubeconfig": %q,
  "cniDir": %q,
  "binDir": %q,
  "logFile": %q,
  "logLevel": "verbose",
  "delegates": [{
    "cniVersion": "0.4.0",
    "name": "podnet",
    "plugins": [{
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "rangeStart": %q, "rangeEnd": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }]
  }]
}
`, c.Kubeconfig, filepath.Join(c.Dir, "cni", "multus"), c.CNIBinDir, filepath.Join(c.Dir, "logs", "multus.log"),
		c.Bridge, filepath.Join(c.Dir, "cni", "ipam"), c.PodSubnet.String(),
		nthAddr(c.PodSubnet, 10), nthAddr(c.PodSubnet, 250), c.NodeIP.String())
	if err := os.WriteFile(filepath.Join(c.CNIConfDir, "00-multus.conf"), []byte(multus), 0o644); err != nil {
		return err
	}

	// The pods' cgroup root, in every v1 hierarchy (cgroupfs driver).
	if err := c.makeCgroups(); err != nil {
		return err
	}
	port, err := freePort(c.NodeIP.String())
	if err != nil {
		return err
	}
	pkiDir := filepath.Join(c.Dir, "pki")
	kcfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This kernel mounts cgroup v1 and there is no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[1]s
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
address: %[3]s
port: %[4]d
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %[5]s
tlsPrivateKeyFile: %[6]s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[7]s}
authorization:
  mode: AlwaysAllow
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
podLogsDir: %[8]s
`, c.state.CgroupName, c.ContainerdSocket, c.NodeIP, port,
		filepath.Join(pkiDir, "kubelet.crt"), filepath.Join(pkiDir, "kubelet.key"), filepath.Join(pkiDir, "ca.crt"),
		filepath.Join(c.Dir, "pod-logs"))
	// kubelet makes these at fixed paths (its device-plugin socket, the links to
	// container logs): removed at teardown when this node made them.
	for _, d := range []string{"/var/lib/kubelet", "/var/log/containers"} {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			c.state.KubeletDirs = append(c.state.KubeletDirs, d)
		}
	}
	kdir := filepath.Join(c.Dir, "kubelet")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return err
	}
	cfgPath := filepath.Join(c.Dir, "kubelet-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(kcfg), 0o644); err != nil {
		return err
	}
	if _, err := c.start("kubelet", filepath.Join(a.node, "kubelet"), []string{
		"--config=" + cfgPath, "--kubeconfig=" + c.Kubeconfig, "--root-dir=" + kdir,
		"--node-ip=" + c.NodeIP.String(), "--hostname-override=" + c.NodeName, "--v=1",
	}); err != nil {
		return err
	}
	return c.waitFor(ctx, "the Node to be Ready", "kubelet", 120*time.Second, func() error {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s not ready: %s", c.NodeName, cond.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", c.NodeName)
	})
}

func nthAddr(p netip.Prefix, n int) string {
	a := p.Addr()
	for range n {
		a = a.Next()
	}
	return a.String()
}

// makeCgroups creates the pods' cgroup root under every cgroup v1 hierarchy. A new
// cpuset cgroup starts with no CPUs and no memory nodes: it gets its parent's.
func (c *Cluster) makeCgroups() error {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == "unified" || !e.IsDir() {
			continue
		}
		dir := "/sys/fs/cgroup/" + e.Name() + "/" + c.state.CgroupName
		if err := os.Mkdir(dir, 0o755); err != nil {
			if errors.Is(err, os.ErrExist) {
				continue
			}
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		c.state.Cgroups = append(c.state.Cgroups, dir)
		if err := c.state.save(); err != nil {
			return err
		}
		if e.Name() == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile("/sys/fs/cgroup/cpuset/" + f)
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("initialising %s/%s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// Kubectl runs kubectl against the node with args and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Bin, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Usage is the memory and CPU the node's own processes (not the pods) use now.
type Usage struct {
	RSSBytes   map[string]int64
	CPUSeconds map[string]float64
}

// Usage reads RSS and CPU time of every process the node started.
func (c *Cluster) Usage() Usage {
	u := Usage{RSSBytes: map[string]int64{}, CPUSeconds: map[string]float64{}}
	for _, p := range c.state.Processes {
		if !p.alive() {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
		if err != nil {
			continue
		}
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		rss, _ := strconv.ParseInt(f[21], 10, 64)
		u.CPUSeconds[p.Name] = (utime + stime) / 100 // USER_HZ
		u.RSSBytes[p.Name] = rss * int64(os.Getpagesize())
	}
	return u
}

// AddVeth creates a veth pair on the host with both ends up (the end called name
// serves as a macvlan master or a host-device link); Teardown removes it.
func (c *Cluster) AddVeth(name, peer string) error {
	if err := run("ip", "link", "add", name, "type", "veth", "peer", "name", peer); err != nil {
		return err
	}
	c.state.Links = append(c.state.Links, name)
	if err := c.state.save(); err != nil {
		return err
	}
	if err := run("ip", "link", "set", name, "up"); err != nil {
		return err
	}
	return run("ip", "link", "set", peer, "up")
}

// Ctr runs ctr against the node's containerd and returns its combined output.
func Ctr(ctx context.Context, c *Cluster, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(c.Bin, "ctr"), append([]string{"--address", c.ContainerdSocket}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
