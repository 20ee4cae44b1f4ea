// Command demo is `make demo` and `make demo-down`: a real single-node cluster on this
// machine (test/realnode) running hwipam from deploy/ with the locally built image, NIC
// labels from a DGX-H100-like sysfs tree, one IPPool and one macvlan
// NetworkAttachmentDefinition per rail plus a host-device one, and pods that ask for
// them through Multus; then it prints what a person wants to see.
//
//	go run ./hack/demo up     (needs root and `eval "$(hack/test-assets.sh env)"`)
//	go run ./hack/demo down
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/realnode"
)

// dir is the demo's run directory: fixed, so that `make demo-down` finds it
// (HWIPAM_DEMO_DIR replaces it, for the test that runs the demo beside one a
// person may have running).
var dir = cmp.Or(os.Getenv("HWIPAM_DEMO_DIR"), "/tmp/hwipam-demo")

// rails are the DGX-H100 layout's rails the demo gives pools and networks to.
var rails = fakesysfs.DGXH100Rails[:2]

func main() {
	if len(os.Args) > 1 && os.Args[1] == "gpu-driver" {
		if err := gpuDriver(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "demo gpu-driver: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) != 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: demo up|down")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: the demo runs a real kubelet and containerd and needs root "+
			"(network links, mounts, cgroups, iptables): run it as root, e.g. `sudo make demo`")
		os.Exit(1)
	}
	var err error
	if os.Args[1] == "down" {
		err = down()
	} else {
		err = up()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "[demo %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func down() error {
	st, err := realnode.LoadState(dir)
	if errors.Is(err, os.ErrNotExist) {
		progress("no demo is running (nothing in %s)", dir)
		return nil
	}
	if err != nil {
		return err
	}
	if err := st.Teardown(false); err != nil {
		return err
	}
	progress("demo stopped; processes, mounts, links, iptables rules, cgroups and %s removed", dir)
	return nil
}

func up() (err error) {
	if st, err := realnode.LoadState(dir); err == nil {
		if st.Running() {
			return fmt.Errorf("a demo is already running in %s: `make demo-down` first", dir)
		}
		progress("removing what a previous, failed demo left in %s", dir)
		if err := st.Teardown(false); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	start := time.Now()
	progress("starting a real node in %s (logs in %s/logs)", dir, dir)
	c, err := realnode.Start(ctx, realnode.Options{Dir: dir, NodeName: "demo-node", Detach: true,
		Progress: func(f string, a ...any) { progress("  "+f, a...) }})
	if err != nil {
		if ctx.Err() != nil { // Ctrl-C: Start has torn down; leave nothing behind
			_ = os.RemoveAll(dir)
			return errors.New("interrupted; everything removed")
		}
		return err
	}
	defer func() {
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			progress("interrupted; tearing the node down")
			err = errors.Join(errors.New("interrupted"), c.Stop(false))
			return
		}
		progress("failed; tearing the node down (logs kept in %s/logs; make demo-down removes them)", dir)
		err = errors.Join(err, c.Stop(true))
	}()
	t := time.Now()
	image, err := c.BuildImage(ctx, repo, "demo")
	if err != nil {
		return err
	}
	progress("  %-62s %5.1fs", "make image, pushed as "+image, time.Since(t).Seconds())

	// NICs: a DGX-H100-like sysfs tree for discovery, and host links named like its
	// rails, so that macvlan has real masters.
	t = time.Now()
	tree, err := fakesysfs.DGXH100(filepath.Join(dir, "sysfs"))
	if err != nil {
		return err
	}
	for i, r := range append(slices.Clone(rails), draRails...) {
		if err := c.AddVeth(r, fmt.Sprintf("%sr%d", c.Prefix, i)); err != nil {
			return err
		}
	}
	if err := c.AddVeth(c.Prefix+"hd0", c.Prefix+"hd0p"); err != nil {
		return err
	}
	if err := c.Deploy(ctx, repo, realnode.DeployOptions{Image: image, HostPaths: []string{tree.Root},
		Overlay: "deploy/overlays/dra", NodeArgs: []string{"--sysfs-root=" + tree.Root}}); err != nil {
		return err
	}
	progress("  %-62s %5.1fs", "hwipam deployed from deploy/overlays/dra (controller + node daemon)", time.Since(t).Seconds())

	t = time.Now()
	if err := waitLabels(ctx, c); err != nil {
		return err
	}
	progress("  %-62s %5.1fs", "NIC labels published by ipam-node", time.Since(t).Seconds())

	t = time.Now()
	if err := createNetworks(ctx, c); err != nil {
		return err
	}
	progress("  %-62s %5.1fs", fmt.Sprintf("%d rail IPPools + a host-device pool, their NADs", len(rails)), time.Since(t).Seconds())

	t = time.Now()
	pods := []string{"demo-a", "demo-b"}
	if err := startPods(ctx, c, pods); err != nil {
		return err
	}
	progress("  %-62s %5.1fs", "pods running with their networks", time.Since(t).Seconds())

	t = time.Now()
	if err := startGPUDriver(c, tree.Root); err != nil {
		return err
	}
	if err := startDRAPod(ctx, c); err != nil {
		return err
	}
	progress("  %-62s %5.1fs", "pod demo-gpu running with a GPU and its NIC (DRA)", time.Since(t).Seconds())
	progress("ready in %.0fs\n", time.Since(start).Seconds())
	return show(ctx, c, pods)
}

func waitLabels(ctx context.Context, c *realnode.Cluster) error {
	key := "nic.hwipam.io/" + rails[0]
	return wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil // retried until the timeout
		}
		return n.Labels[key] != "", nil
	})
}

func createNetworks(ctx context.Context, c *realnode.Cluster) error {
	cl, err := c.Client()
	if err != nil {
		return err
	}
	nads, err := c.NADClient()
	if err != nil {
		return err
	}
	confDir := filepath.Join(c.CNIConfDir, "nv-ipam.d")
	type network struct{ pool, subnet, plugin string }
	var nets []network
	for i, r := range rails {
		nets = append(nets, network{"demo-" + r, fmt.Sprintf("10.%d.0.0/16", 24+i), fmt.Sprintf(`"type": "macvlan", "master": %q, "mode": "bridge"`, r)})
	}
	nets = append(nets, network{"demo-hostdev", "10.250.0.0/24", fmt.Sprintf(`"type": "host-device", "device": %q`, c.Prefix+"hd0")})
	// The rails of the DRA pod: pools only (a claim, not a NAD, gets their NIC).
	for i, r := range draRails {
		nets = append(nets, network{"demo-" + r, fmt.Sprintf("10.%d.0.0/16", 26+i), ""})
	}
	for _, n := range nets {
		pool := &v1alpha1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: n.pool, Namespace: "kube-system"},
			Spec: v1alpha1.IPPoolSpec{Subnet: n.subnet, PerNodeBlockSize: 32,
				Gateway: netip.MustParsePrefix(n.subnet).Addr().Next().String()},
		}
		if r, ok := strings.CutPrefix(n.pool, "demo-"); ok && (slices.Contains(rails, r) || slices.Contains(draRails, r)) {
			// The pool follows the rail: only nodes whose NIC discovery found it; and it
			// is the rail's pool, for NADs that pick theirs by rail (docs/rails.md).
			pool.Labels = map[string]string{"nic.hwipam.io/rail": r}
			pool.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "nic.hwipam.io/" + r, Operator: corev1.NodeSelectorOpIn, Values: []string{"ib"}}},
			}}}
		}
		if err := cl.Create(ctx, pool); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("IPPool %s: %w", n.pool, err)
		}
		if n.plugin == "" {
			continue
		}
		nad := &nadv1.NetworkAttachmentDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: n.pool, Namespace: "default"},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, %s,
  "ipam": {"type": "nv-ipam", "poolName": %q, "confDir": %q}}`, n.pool, n.plugin, n.pool, confDir)},
		}
		if _, err := nads.K8sCniCncfIoV1().NetworkAttachmentDefinitions("default").Create(ctx, nad, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("NetworkAttachmentDefinition %s: %w", n.pool, err)
		}
	}
	// Wait for the controller to give the node a block of each pool.
	return wait.PollUntilContextTimeout(ctx, time.Second, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, n := range nets {
			var p v1alpha1.IPPool
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: n.pool}, &p); err != nil || len(p.Status.Allocations) == 0 {
				return false, nil // retried until the timeout
			}
		}
		return true, nil
	})
}

func startPods(ctx context.Context, c *realnode.Cluster, names []string) error {
	for i, name := range names {
		networks := "demo-" + strings.Join(rails, ",demo-")
		if i == 0 {
			networks += ",demo-hostdev"
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
				Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": networks}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "app", Image: c.BusyboxImage(),
					Command: []string{"sleep", "1000000"}}},
				TerminationGracePeriodSeconds: new(int64),
			},
		}
		if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("pod %s: %w", name, err)
		}
	}
	for _, name := range names {
		if _, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=120s"); err != nil {
			events, _ := c.Kubectl(ctx, "get", "events", "--field-selector", "involvedObject.name="+name)
			return fmt.Errorf("%w\n%s", err, events)
		}
	}
	return nil
}

func show(ctx context.Context, c *realnode.Cluster, pods []string) error {
	n, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "== NIC labels on node %s (published by ipam-node's NIC discovery; %d nic.hwipam.io/ labels)\n", c.NodeName, countPrefix(n.Labels))
	l := func(k string) string { return n.Labels["nic.hwipam.io/"+k] }
	fmt.Fprintf(os.Stdout, "  present=%s count=%s rdma=%s\n", l("present"), l("count"), l("rdma"))
	var netdevs []string
	for k := range n.Labels {
		if nd, ok := strings.CutPrefix(k, "nic.hwipam.io/"); ok && !strings.Contains(nd, ".") && n.Labels[k] != "true" && nd != "count" {
			netdevs = append(netdevs, nd)
		}
	}
	slices.Sort(netdevs)
	fmt.Fprintf(os.Stdout, "  %-16s %-5s %-12s %-12s %-5s %s\n", "NETDEV", "LINK", "MODEL", "SPEED(Mb/s)", "NUMA", "VFS")
	for _, nd := range netdevs {
		fmt.Fprintf(os.Stdout, "  %-16s %-5s %-12s %-12s %-5s %s\n", nd, l(nd), l(nd+".model"), or(l(nd+".speed"), "-"), l(nd+".numa"), l(nd+".vfs"))
	}
	out, err := c.Kubectl(ctx, "get", "ippools", "-A", "-o",
		"custom-columns=POOL:.metadata.name,SUBNET:.spec.subnet,NODE:.status.allocations[*].nodeName,BLOCK-START:.status.allocations[*].startIP,BLOCK-END:.status.allocations[*].endIP")
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "\n== each pool's blocks\n%s", indent(out))
	for _, p := range pods {
		pod, err := c.Clientset.CoreV1().Pods("default").Get(ctx, p, metav1.GetOptions{})
		if err != nil {
			return err
		}
		// Multus' network-status: which network each interface belongs to.
		var status []nadv1.NetworkStatus
		if err := json.Unmarshal([]byte(pod.Annotations[nadv1.NetworkStatusAnnot]), &status); err != nil {
			return fmt.Errorf("pod %s: %s: %w", p, nadv1.NetworkStatusAnnot, err)
		}
		network := map[string]string{}
		for _, s := range status {
			network[s.Interface] = strings.TrimPrefix(s.Name, "default/")
		}
		out, err := c.Kubectl(ctx, "exec", p, "--", "ip", "-4", "-o", "addr", "show")
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stdout, "\n== addresses inside pod %s (kubectl exec %s -- ip -4 -o addr show)\n", p, p)
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) >= 4 && f[1] != "lo" {
				fmt.Fprintf(os.Stdout, "  %-6s %-18s %s\n", f[1], f[3], network[f[1]])
			}
		}
	}
	out, err = c.Kubectl(ctx, "get", "ippools", "-A")
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "\n== kubectl get ippools -A\n%s", indent(out))
	if err := showDRA(ctx, c); err != nil {
		return err
	}
	if err := writeTry(c.Registry); err != nil {
		return err
	}
	state := c.StateDir
	confDir := filepath.Join(c.CNIConfDir, "nv-ipam.d")
	fmt.Fprintf(os.Stdout, "\nThe node keeps running (docs/demo.md says more). Try:\n"+
		"  export KUBECONFIG=%s PATH=%s:$PATH\n"+
		"  kubectl get pods -A -o wide\n\n"+
		"  # ipamctl in the ipam-node pod (it asks the daemon for its paths and its NIC view, the demo's sysfs tree):\n"+
		"  kubectl -n kube-system exec ds/hwipam-node -c ipam-node -- /ipamctl check\n"+
		"  kubectl -n kube-system exec ds/hwipam-node -c ipam-node -- /ipamctl allocations\n\n"+
		"  # ipamctl on the host (make build), with the demo's paths under %s:\n"+
		"  bin/ipamctl check --cluster --socket unix://%s --store-file %s \\\n"+
		"    --cni-bin-dir %s --cni-conf-dir %s \\\n"+
		"    --netns-dir %s\n"+
		"  bin/ipamctl pools --cluster\n\n"+
		"  # a pool, a NAD that names it, a NAD that picks its pool by rail, and a pod with both\n"+
		"  # (every NAD on this node needs \"confDir\": %q):\n"+
		"  kubectl apply -f %s\n"+
		"  kubectl wait --for=condition=Ready pod/try-a && kubectl exec try-a -- ip -4 -o addr show\n\n"+
		"  # a pod that claims a NIC port through DRA (any port that can be prepared) as net1:\n"+
		"  kubectl apply -f %s\n"+
		"  kubectl wait --for=condition=Ready pod/try-nic && kubectl exec try-nic -- ip -4 -o addr show net1\n\n"+
		"Stop it with: make demo-down\n",
		c.Kubeconfig, c.Bin, dir, filepath.Join(state, "daemon.sock"), filepath.Join(state, "store"),
		c.CNIBinDir, confDir, filepath.Join(c.Dir, "containerd", "state", "io.containerd.grpc.v1.cri", "netns"), confDir, tryFile,
		tryNICFile)
	return nil
}

func countPrefix(labels map[string]string) int {
	n := 0
	for k := range labels {
		if strings.HasPrefix(k, "nic.hwipam.io/") {
			n++
		}
	}
	return n
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}
