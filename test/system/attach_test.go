package system

// The attach in the whole-system test (issue 36): each simulated node has a
// network namespace of its own standing in for its host's ("sysh-…"), holding
// a veth under the name of each NVIDIA port of its NIC tree (the tree's
// address files rewritten to the veths' MACs, their peers in a "wire"
// namespace), and the test plays containerd's side of NRI: the runtime half of
// the NRI library (github.com/containerd/nri pkg/adaptation, what containerd
// embeds, with its 2 s plugin timeout and its failure policy) serves an NRI
// socket per node, which ipam-node's plugin connects to
// (--dra-nri-socket, --dra-host-netns: the daemon runs in the test's network
// namespace, where the API server proxy is, and acts on its node's host
// namespace through the flag). A pod sandbox is a network namespace the test
// creates, whose path RunPodSandbox, StopPodSandbox and RemovePodSandbox
// carry.
//
// A pod namespace deleted while a port is in it (a missed StopPodSandbox) is
// emulated as a physical port's return: the kernel destroys a veth with its
// namespace, but gives a physical function back to the host's namespace under
// the name it had in the pod (devN when that name is taken), link down; so the
// test re-creates the host's veth under that name with the port's MAC.
//
// checkPorts, run by check() after every step: every port is in exactly one
// place; in a pod only as the port of that pod's prepared claim, under the
// claim's interface name, with its address; on the host under its own name,
// with the admin state it had before any claim and no address, unless a pod
// that holds it runs (then it must be in that pod: a sandbox never runs
// without its devices) or it is on its way back (its pod's namespace went
// away without the plugin: until the claim is unprepared, or, the claim gone,
// draGCBound after its daemon started); and no port is both a prepared
// claim's and named by a live CNI attachment (master).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/test/harness"
)

// nriBudget is containerd's default plugin_request_timeout, which the
// adaptation enforces too.
const nriBudget = 2 * time.Second

// hostPort is one NVIDIA port of a node: a veth in the node's host namespace.
type hostPort struct {
	name, pci, device, mac, peer string
	mtu                          int
	// up is its admin state before any claim: what it must have on the host.
	up bool
	// returning: its pod's namespace went away while it was in it, without
	// the plugin: it may be on the host under another name until its claim
	// (claimUID) is unprepared, or, when the claim is gone, until returnBy
	// (zero while its daemon is down).
	returning bool
	claimUID  types.UID
	returnBy  time.Time
}

// draPod is a pod sandbox the test's runtime started for a claim.
type draPod struct {
	name, uid string
	node      int
	ns        string // network namespace name (/run/netns/<ns>)
	// renamed: the pod renamed the claim's link and made another by its name.
	renamed bool
}

func (p *draPod) path() string { return "/run/netns/" + p.ns }

func (p *draPod) sandbox() *api.PodSandbox {
	return &api.PodSandbox{Id: "sb-" + p.ns, Uid: p.uid, Name: p.name, Namespace: namespace,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{{Type: "network", Path: p.path()}}}}
}

// nriNode is a node's container runtime, NRI side.
type nriNode struct {
	rt *adaptation.Adaptation
	// sock is the socket the plugin connects to: proxy's, which forwards
	// each connection to the runtime's (and can drop them).
	sock  string
	proxy *nriProxy
	// syncs counts the synchronizations that succeeded; syncsAtStart is its
	// value when the daemon last started.
	syncs, syncsAtStart atomic.Int64
	mu                  sync.Mutex
	running             map[string]*draPod // by pod UID: the sandboxes it reports at synchronization
	// containers are the running pods' containers it created, by pod UID,
	// which it reports at synchronization too.
	containers map[string][]*api.Container
}

// nriLog sends the NRI library's logs (one global logger) to a buffer that a
// failure prints.
type nriLog struct{ w io.Writer }

func (l nriLog) Debugf(context.Context, string, ...any) {}
func (l nriLog) Infof(_ context.Context, f string, a ...any) {
	fmt.Fprintf(l.w, time.Now().Format(time.TimeOnly)+" "+f+"\n", a...)
}
func (l nriLog) Warnf(ctx context.Context, f string, a ...any)  { l.Infof(ctx, "warning: "+f, a...) }
func (l nriLog) Errorf(ctx context.Context, f string, a ...any) { l.Infof(ctx, "error: "+f, a...) }

// ipNetns runs ip netns … and fails the test when it fails.
func (w *world) ipNetns(args ...string) {
	w.t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns"}, args...)...).CombinedOutput(); err != nil {
		w.fail("ip netns %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// ipIn runs ip -n ns … and fails the test when it fails.
func (w *world) ipIn(ns string, args ...string) {
	w.t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		w.fail("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
}

// nsHandle opens a netlink handle in the named namespace; nil when it does
// not exist.
func nsHandle(name string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath("/run/netns/" + name)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// links returns the links of a namespace by MAC address.
func (w *world) links(ns string) map[string]netlink.Link {
	h, err := nsHandle(ns)
	if err != nil {
		w.fail("netns %s: %v", ns, err)
	}
	defer h.Close()
	ls, err := h.LinkList()
	if err != nil {
		w.fail("links of netns %s: %v", ns, err)
	}
	out := map[string]netlink.Link{}
	for _, l := range ls {
		if a := l.Attrs().HardwareAddr; len(a) == 6 {
			out[a.String()] = l
		}
	}
	return out
}

// draAttachSetup gives node n its host and wire namespaces, a veth per
// NVIDIA port of its tree (the tree's addresses and MTUs made the veths'),
// and its runtime's NRI socket.
func (w *world) draAttachSetup(idx int, n *simNode, tree *fakesysfs.Tree) {
	if idx == 0 {
		logw := &harness.LogBuffer{}
		w.logs = append(w.logs, namedLog{"the NRI runtimes (every node's)", logw})
		nrilog.Set(nriLog{logw})
	}
	suffix := fmt.Sprintf("%d-%d", os.Getpid(), idx)
	n.hostNS, n.wireNS = "sysh-"+suffix, "sysw-"+suffix
	for _, ns := range []string{n.hostNS, n.wireNS} {
		_ = exec.Command("ip", "netns", "del", ns).Run() // left by a killed run
		w.ipNetns("add", ns)
		w.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	}
	names := append(slices.Clone(fakesysfs.DGXH100Rails), "enp225s0f0np0", "enp225s0f1np1")
	for j, name := range names {
		target, err := os.Readlink(filepath.Join(tree.Root, "sys", "class", "net", name))
		if err != nil {
			w.t.Fatalf("the tree of %s has no netdev %s: %v", n.name, name, err)
		}
		dev := filepath.Dir(filepath.Dir(filepath.Join(tree.Root, "sys", "class", "net", target)))
		pci := filepath.Base(dev)
		mtu := 4092
		if strings.HasPrefix(name, "enp") {
			mtu = 9000
		}
		p := &hostPort{name: name, pci: pci, device: nicdra.DeviceName(pci), mac: fmt.Sprintf("02:5a:%02x:00:00:%02x", idx, j),
			peer: fmt.Sprintf("w%d", j), mtu: mtu, up: w.rng.IntN(4) != 0}
		if err := os.WriteFile(filepath.Join(dev, "net", name, "address"), []byte(p.mac+"\n"), 0o644); err != nil {
			w.t.Fatal(err)
		}
		w.addPortVeth(n, p, name, p.up)
		n.ports = append(n.ports, p)
	}
	n.nri = &nriNode{sock: filepath.Join(n.kubeletDir, "nri.sock"), running: map[string]*draPod{},
		containers: map[string][]*api.Container{}}
	rtSock := filepath.Join(n.kubeletDir, "nri-runtime.sock")
	n.nri.rt = w.nriRuntime(n, rtSock)
	if err := n.nri.rt.Start(); err != nil {
		w.t.Fatalf("starting the NRI runtime of %s: %v", n.name, err)
	}
	n.nri.proxy = w.startNRIProxy(n.nri.sock, rtSock)
}

// nriRuntime makes the node's runtime's NRI side, serving sock once
// started: at a plugin's synchronization it reports the sandboxes it runs
// and their containers.
func (w *world) nriRuntime(n *simNode, sock string) *adaptation.Adaptation {
	nn := n.nri
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		nn.mu.Lock()
		var pods []*api.PodSandbox
		var ctrs []*api.Container
		for _, uid := range sortedKeys(nn.running) {
			pods = append(pods, nn.running[uid].sandbox())
			ctrs = append(ctrs, nn.containers[uid]...)
		}
		nn.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		if err == nil {
			nn.syncs.Add(1)
		}
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	rt, err := adaptation.New("containerd", "system-test", syncFn, update, adaptation.WithSocketPath(sock),
		adaptation.WithPluginPath(filepath.Join(n.dir, "nri-plugins")), adaptation.WithPluginConfigPath(filepath.Join(n.dir, "nri-conf")))
	if err != nil {
		w.t.Fatalf("the NRI runtime of %s: %v", n.name, err)
	}
	w.t.Cleanup(rt.Stop)
	return rt
}

// nriProxy forwards the connections made to its socket to the runtime's
// NRI socket, so that the test can drop them as a broken connection or a
// restarting runtime does, and hold new ones meanwhile.
type nriProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	// held: new connections wait in waiting (see drop, resume).
	held    bool
	waiting []net.Conn
}

func (w *world) startNRIProxy(sock, target string) *nriProxy {
	l, err := net.Listen("unix", sock)
	if err != nil {
		w.t.Fatalf("the NRI proxy on %s: %v", sock, err)
	}
	p := &nriProxy{l: l, target: target}
	w.t.Cleanup(func() {
		_ = l.Close()
		p.drop()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.held {
				p.waiting = append(p.waiting, c)
				p.mu.Unlock()
				continue
			}
			p.mu.Unlock()
			go p.forward(c)
		}
	}()
	return p
}

// forward relays c to the runtime until either side closes.
func (p *nriProxy) forward(c net.Conn) {
	r, err := net.Dial("unix", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, r)
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	relay := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go relay(r, c)
	go relay(c, r)
	<-done
	<-done
}

// drop closes every connection, both ways, and holds new ones until resume.
func (p *nriProxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// resume forwards the connections held since drop, and new ones.
func (p *nriProxy) resume() {
	p.mu.Lock()
	held := p.waiting
	p.held, p.waiting = false, nil
	p.mu.Unlock()
	for _, c := range held {
		go p.forward(c)
	}
}

// addPortVeth creates the port's veth on the host under name (its peer in
// the wire namespace), with its MAC and MTU, admin up or down.
func (w *world) addPortVeth(n *simNode, p *hostPort, name string, up bool) {
	wire, err := netns.GetFromPath("/run/netns/" + n.wireNS)
	if err != nil {
		w.fail("netns %s: %v", n.wireNS, err)
	}
	defer wire.Close()
	h, err := nsHandle(n.hostNS)
	if err != nil {
		w.fail("netns %s: %v", n.hostNS, err)
	}
	defer h.Close()
	mac, _ := net.ParseMAC(p.mac)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac, MTU: p.mtu}, PeerName: p.peer,
		PeerNamespace: netlink.NsFd(int(wire))}
	// The peer of a veth destroyed with a pod's namespace goes away a little
	// after the namespace (the kernel cleans namespaces up in the background).
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = h.LinkAdd(veth)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || time.Now().After(deadline) {
			w.fail("creating %s's veth %s on %s's host: %v", p.name, name, n.name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if up {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			w.fail("setting %s up on %s's host: %v", name, n.name, err)
		}
	}
	if wh, err := nsHandle(n.wireNS); err == nil {
		if l, err := wh.LinkByName(p.peer); err == nil {
			_ = wh.LinkSetUp(l)
		}
		wh.Close()
	}
}

// portOf is node i's port of a device, nil for none.
func (w *world) portOf(i int, device string) *hostPort {
	for _, p := range w.nodes[i].ports {
		if p.device == device {
			return p
		}
	}
	return nil
}

// portNamed is node i's port by its own name.
func (w *world) portNamed(i int, name string) *hostPort {
	for _, p := range w.nodes[i].ports {
		if p.name == name {
			return p
		}
	}
	return nil
}

// nriConnected waits (bounded) until the node's daemon's plugin has
// connected to its runtime since the daemon started.
func (w *world) nriConnected(i int, wait time.Duration) bool {
	n := w.nodes[i]
	if n.cmd == nil {
		return false
	}
	deadline := time.Now().Add(wait)
	for n.nri.syncs.Load() <= n.nri.syncsAtStart.Load() {
		if time.Now().After(deadline) || n.cmd == nil {
			var last []string
			for _, l := range w.logs {
				if l.what == "ipam-node "+n.name || strings.HasPrefix(l.what, "the NRI") {
					for _, line := range strings.Split(l.w.String(), "\n") {
						if strings.Contains(strings.ToLower(line), "nri") || strings.Contains(line, "plugin") {
							last = append(last, line)
						}
					}
				}
			}
			w.tracef("runtime on %s: the NRI plugin has not connected (synchronizations %d, %d at its start); log: %s", n.name,
				n.nri.syncs.Load(), n.nri.syncsAtStart.Load(), strings.Join(last[max(0, len(last)-8):], " | "))
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the runtime adds the plugin right after its synchronization
	return true
}

// newPod makes a pod's network namespace (loopback up).
func (w *world) newPod(i int, name, uid string) *draPod {
	w.nextPod++
	p := &draPod{name: name, uid: uid, node: i, ns: fmt.Sprintf("sysp-%d-%d", os.Getpid(), w.nextPod)}
	w.ipNetns("add", p.ns)
	w.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.ns).Run() })
	w.ipIn(p.ns, "link", "set", "lo", "up")
	return p
}

// podStart is the runtime starting the claim's pod's sandbox: the plugin must
// answer within its budget and, when the start succeeds, the claim's port is
// in the pod.
func (w *world) podStart(c *draClaim) {
	n := w.nodes[c.node]
	start := time.Now()
	pod, err := w.podRun(c)
	took := time.Since(start)
	if err != nil {
		w.tracef("runtime on %s: RunPodSandbox of %s's pod refused after %s: %v", n.name, c.name, took.Round(time.Millisecond), firstLine(err))
		w.counts["dra-pod-start-refused"]++
		return
	}
	w.tracef("runtime on %s: RunPodSandbox of %s's pod took %s", n.name, c.name, took.Round(time.Millisecond))
	if took >= nriBudget {
		w.violation("hook-budget", "RunPodSandbox of %s's pod took %s: containerd drops a plugin after %s and runs the sandbox without it", c, took, nriBudget)
	}
	p := w.portOf(c.node, c.device)
	if l := w.links(pod.ns)[p.mac]; l == nil {
		w.violation("pod-without-device", "RunPodSandbox of %s's pod succeeded, but its port %s (%s) is not in the pod: the pod runs without its device", c, p.name, p.mac)
	}
	w.counts["dra-pod-started"]++
}

// podRun is the runtime's RunPodSandbox of the claim's pod, as containerd
// makes it: with plugin synchronization blocked, so that a plugin that
// connects meanwhile is either told of the sandbox at its synchronization
// or sees its RunPodSandbox. On success the pod runs (c.pod); on a refusal
// its namespace is gone again.
func (w *world) podRun(c *draClaim) (*draPod, error) {
	n := w.nodes[c.node]
	pod := w.newPod(c.node, "pod-"+c.name, "pod-uid-"+c.name)
	rt := n.nri.rt
	block := rt.BlockPluginSync()
	defer block.Unblock()
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	err := rt.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod.sandbox()})
	cancel()
	if err != nil {
		block.Unblock()
		w.podGone(pod, false)
		return nil, err
	}
	n.nri.mu.Lock()
	n.nri.running[pod.uid] = pod
	n.nri.mu.Unlock()
	c.pod = pod
	return pod, nil
}

// podStop is the runtime stopping and removing the claim's pod's sandbox,
// with the kubelet's unprepare between the two when unprepare is set (the
// kubelet calls it after it killed the pod, before the removal); false when
// the unprepare did not succeed.
func (w *world) podStop(c *draClaim, unprepare bool) bool {
	n := w.nodes[c.node]
	ok := true
	if pod := c.pod; pod != nil {
		ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
		err := n.nri.rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod.sandbox()})
		cancel()
		if err != nil {
			w.fail("StopPodSandbox of %s's pod: %v (containerd only logs a plugin's stop error)", c, err)
		}
		w.tracef("runtime on %s: StopPodSandbox of %s's pod", n.name, c.name)
		if unprepare {
			ok = w.draUnprepare(c)
		}
		ctx, cancel = context.WithTimeout(w.ctx, 30*time.Second)
		err = n.nri.rt.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod.sandbox()})
		cancel()
		if err != nil {
			w.fail("RemovePodSandbox of %s's pod: %v", c, err)
		}
		w.podGone(pod, true)
		c.pod = nil
	} else if unprepare {
		ok = w.draUnprepare(c)
	}
	return ok
}

// podGone deletes a pod's network namespace, as the runtime does after the
// sandbox stopped, and emulates the kernel's return of a physical port still
// in it (a missed or failed detach).
func (w *world) podGone(pod *draPod, wasRunning bool) {
	n := w.nodes[pod.node]
	in := w.links(pod.ns)
	n.nri.mu.Lock()
	delete(n.nri.running, pod.uid)
	delete(n.nri.containers, pod.uid)
	n.nri.mu.Unlock()
	w.ipNetns("del", pod.ns)
	for _, p := range n.ports {
		l, ok := in[p.mac]
		if !ok {
			continue
		}
		name := l.Attrs().Name
		host := w.links(n.hostNS)
		if slices.ContainsFunc(mapsValues(host), func(h netlink.Link) bool { return h.Attrs().Name == name }) {
			name = fmt.Sprintf("dev%d", l.Attrs().Index)
		}
		w.waitPeerGone(n, p)
		w.addPortVeth(n, p, name, false)
		p.returning, p.returnBy = true, time.Time{}
		p.claimUID = ""
		for _, c := range w.claims {
			if c.node == pod.node && c.device == p.device {
				p.claimUID = c.uid
			}
		}
		w.counts["dra-port-returned-by-kernel"]++
		w.tracef("%s's pod namespace %s deleted with port %s in it as %s: back on the host as %s, down (as a physical port comes back)",
			n.name, pod.ns, p.name, l.Attrs().Name, name)
	}
	_ = wasRunning
}

func mapsValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// waitPeerGone waits until the port's veth peer, destroyed with the pod's
// namespace, is gone from the wire namespace.
func (w *world) waitPeerGone(n *simNode, p *hostPort) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, err := nsHandle(n.wireNS)
		if err != nil {
			w.fail("netns %s: %v", n.wireNS, err)
		}
		_, err = h.LinkByName(p.peer)
		h.Close()
		if err != nil {
			return
		}
		if time.Now().After(deadline) {
			w.fail("the veth peer %s of %s's port %s outlived its pod's namespace by 10s", p.peer, n.name, p.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// portsReturning starts the clock of node i's ports on their way back whose
// claim is gone: its daemon started.
func (w *world) portsReturning(i int) {
	for _, p := range w.nodes[i].ports {
		if _, ok := w.claims[p.claimUID]; p.returning && !ok {
			p.returnBy = time.Now().Add(draGCBound)
		}
	}
}

// portsUnprepared: the claim was unprepared, so its port, if on its way back,
// must be home now.
func (w *world) portsUnprepared(c *draClaim) {
	if p := w.portOf(c.node, c.device); p != nil && p.returning && p.claimUID == c.uid {
		p.returnBy = time.Now()
	}
}

// portsFinal waits until every port on its way back is due home, checking
// meanwhile, and checks once more.
func (w *world) portsFinal() {
	for {
		var due time.Time
		for _, n := range w.nodes {
			for _, p := range n.ports {
				if p.returning && !p.returnBy.IsZero() && p.returnBy.After(due) {
					due = p.returnBy
				}
			}
		}
		w.check()
		if due.IsZero() || time.Now().After(due) {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkPorts is the attach's invariants (see the file's comment).
func (w *world) checkPorts() {
	now := time.Now()
	for i, n := range w.nodes {
		host := w.links(n.hostNS)
		pods := map[string]map[string]netlink.Link{}
		for _, c := range w.claims {
			if c.node == i && c.pod != nil {
				pods[c.pod.ns] = w.links(c.pod.ns)
			}
		}
		for _, p := range n.ports {
			var where []string
			if _, ok := host[p.mac]; ok {
				where = append(where, "the host")
			}
			for ns, ls := range pods {
				if _, ok := ls[p.mac]; ok {
					where = append(where, "pod netns "+ns)
				}
			}
			if len(where) != 1 {
				w.violation("port-places", "%s's port %s (%s) is in %d places (%v), want exactly one", n.name, p.name, p.mac, len(where), where)
				continue
			}
			var holder *draClaim
			for _, c := range w.claims {
				if c.node == i && c.device == p.device && (c.state == claimPrepared || c.state == claimUncertain) {
					holder = c
				}
			}
			if l, ok := host[p.mac]; ok {
				if holder != nil && holder.pod != nil {
					w.violation("pod-without-device", "%s's pod runs, but its port %s is on %s's host as %s: the pod runs without its device",
						holder, p.name, n.name, l.Attrs().Name)
					continue
				}
				if p.returning && (p.returnBy.IsZero() || now.Before(p.returnBy)) {
					continue
				}
				a := l.Attrs()
				up := a.Flags&net.FlagUp != 0
				addrs := globalAddrs(w, n.hostNS, l)
				switch {
				case a.Name != p.name:
					w.violation("host-name", "%s's port %s is on the host as %s, not under its own name (%s)", n.name, p.name, a.Name, returnNote(p))
				case up != p.up:
					w.violation("admin-state", "%s's port %s is on the host with its link %s, but it was %s before any claim (%s)", n.name, p.name,
						upDown(up), upDown(p.up), returnNote(p))
				case len(addrs) > 0:
					w.violation("host-addresses", "%s's port %s is on the host with addresses %v a claim's pod gave it", n.name, p.name, addrs)
				}
				if p.returning && a.Name == p.name && up == p.up && len(addrs) == 0 {
					w.counts["dra-port-home-again"]++
					w.tracef("%s's port %s is home again under its name, %s", n.name, p.name, upDown(up))
					p.returning = false
				}
				continue
			}
			// In a pod: only its claim's running pod, under the claim's name, with its address.
			if holder == nil || holder.pod == nil || holder.pod.ns != strings.TrimPrefix(where[0], "pod netns ") {
				w.violation("port-in-foreign-pod", "%s's port %s is in %s, which is no pod of a prepared claim of the port (its holder: %v)", n.name, p.name, where[0], holder)
				continue
			}
			l := pods[holder.pod.ns][p.mac]
			if !holder.pod.renamed && l.Attrs().Name != holder.ifName {
				w.violation("pod-name", "%s's port %s is in %s's pod as %s, want the claim's interface name %s", n.name, p.name, holder, l.Attrs().Name, holder.ifName)
			}
			if holder.state == claimPrepared {
				addrs := globalAddrs(w, holder.pod.ns, l)
				if !slices.ContainsFunc(addrs, func(s string) bool { return strings.HasPrefix(s, holder.ip.String()+"/") }) {
					w.violation("pod-address", "%s's port %s is in %s's pod without the claim's address (it has %v)", n.name, p.name, holder, addrs)
				}
			}
		}
		// One owner per port: no prepared claim's port is named by a live
		// CNI attachment, or is below the bond one names.
		for _, k := range sortedKeys(w.live) {
			a := w.live[k]
			if a.node != i || a.master == "" {
				continue
			}
			for _, p := range w.masterPorts(i, a.master) {
				for _, c := range w.claims {
					if c.node == i && c.device == p.device && c.state == claimPrepared {
						w.violation("two-owners", "port %s of %s has two owners: %s and the CNI attachment %s (master %s)", p.name, n.name, c, a, a.master)
					}
				}
			}
		}
	}
}

func returnNote(p *hostPort) string {
	if p.returning {
		return "its pod's namespace went away without the plugin; its claim has been unprepared or collected since"
	}
	return "its pod stopped through the plugin"
}

func upDown(up bool) string {
	if up {
		return "up"
	}
	return "down"
}

// globalAddrs are a link's addresses but link-local ones.
func globalAddrs(w *world, ns string, l netlink.Link) []string {
	h, err := nsHandle(ns)
	if err != nil {
		w.fail("netns %s: %v", ns, err)
	}
	defer h.Close()
	as, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		w.fail("addresses of %s in %s: %v", l.Attrs().Name, ns, err)
	}
	var out []string
	for _, a := range as {
		if !a.IP.IsLinkLocalUnicast() {
			out = append(out, a.IPNet.String())
		}
	}
	return out
}

// violation is a broken invariant of issue 36: the seed fails, or, with
// HWIPAM_SYSTEM_REPORT=1, it is logged (once per kind and seed) and the run
// goes on, failing at its end: a list of what a build breaks, rather than
// the first thing.
func (w *world) violation(kind, format string, args ...any) {
	w.t.Helper()
	if os.Getenv("HWIPAM_SYSTEM_REPORT") == "" {
		w.fail(format, args...)
	}
	if w.violations == nil {
		w.violations = map[string]int{}
	}
	if w.violations[kind] == 0 {
		msg := fmt.Sprintf(format, args...)
		w.tracef("VIOLATION [%s]: %s", kind, msg)
		w.t.Logf("seed %d, step %d: VIOLATION [%s]: %s\nlast actions:\n  %s", w.seed, w.step, kind, msg,
			strings.Join(w.trace[max(0, len(w.trace)-15):], "\n  "))
	}
	w.violations[kind]++
}

// ---- actions ----

// draPodStart starts the sandbox of a prepared claim's pod.
func (w *world) draPodStart() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && c.pod == nil && w.nodes[c.node].cmd != nil })
	if c == nil || !w.nriConnected(c.node, draRetryFor) {
		return
	}
	w.podStart(c)
}

// draPodRestart stops a running pod's sandbox and removes it, as the runtime
// does with a sandbox that died (the kubelet then starts another; the claim
// stays prepared).
func (w *world) draPodRestart() {
	c := w.pickClaim(func(c *draClaim) bool { return c.pod != nil && w.nodes[c.node].cmd != nil })
	if c == nil || !w.nriConnected(c.node, draRetryFor) {
		return
	}
	w.podStop(c, false)
	if w.rng.IntN(2) == 0 {
		w.podStart(c)
	}
}

// draMissedStop: the pod of a claim stops while its node's ipam-node is down
// (a rollout's gap): no StopPodSandbox reaches the plugin, the namespace is
// deleted and the port comes back as the kernel gives it back; the daemon
// starts and the kubelet unprepares the claim (before the runtime's removal),
// then deletes it. The port must be home, under its name and admin state.
func (w *world) draMissedStop() {
	c := w.pickClaim(func(c *draClaim) bool { return c.pod != nil })
	if c == nil {
		return
	}
	n := w.nodes[c.node]
	if n.cmd != nil {
		w.killDaemon(c.node)
		w.tracef("kill -9 ipam-node on %s", n.name)
	}
	pod := c.pod
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	_ = n.nri.rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod.sandbox()}) // no plugin to tell
	cancel()
	w.podGone(pod, true)
	c.pod = nil
	w.counts["dra-missed-stop"]++
	w.tracef("%s's pod stopped while ipam-node on %s was down", c, n.name)
	w.startDaemon(c.node)
	w.unprepareUntilDone(c, "after a missed stop")
	ctx, cancel = context.WithTimeout(w.ctx, 30*time.Second)
	_ = n.nri.rt.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod.sandbox()})
	cancel()
	w.draDelete(c)
	delete(w.claims, c.uid)
	w.tracef("delete %s", c)
}

// draPodRename: a pod with NET_ADMIN renames its claim's link and makes a
// veth by the claim's interface name; then the pod goes away (stop,
// unprepare, remove). The plugin must bring back the port, not the pod's
// veth.
func (w *world) draPodRename() {
	c := w.pickClaim(func(c *draClaim) bool { return c.pod != nil && c.state == claimPrepared && w.nodes[c.node].cmd != nil })
	if c == nil || !w.nriConnected(c.node, draRetryFor) {
		return
	}
	pod := c.pod
	w.ipIn(pod.ns, "link", "set", c.ifName, "down")
	w.ipIn(pod.ns, "link", "set", c.ifName, "name", "mine0")
	w.ipIn(pod.ns, "link", "add", c.ifName, "type", "veth", "peer", "name", "mine1")
	w.ipIn(pod.ns, "link", "set", c.ifName, "up")
	pod.renamed = true
	w.counts["dra-pod-renamed"]++
	w.tracef("%s's pod renames %s to mine0 and makes a veth %s", c, c.ifName, c.ifName)
	if !w.podStop(c, true) {
		return
	}
	w.draDelete(c)
	delete(w.claims, c.uid)
	w.tracef("delete %s", c)
}

// draSharedClaim: the scheduler reserves a prepared claim for a second pod
// (a claim shared by name). The policy hwipam-nic-claims-not-shared refuses
// that write, as it refuses the real scheduler's: the claim stays reserved
// for its pod alone, and no second pod is scheduled, so none runs. Once a
// seed at most, the claim is shared past the policy (its binding lifted for
// the write: a claim shared before the policy was installed, or on a cluster
// without it), and the driver must refuse the second pod's sandbox: it learns
// of the second reservation when it reads the claim (its garbage collection,
// at its start and every minute), so the test restarts the node's daemon and
// waits for the driver to say it noted the pod before starting the sandbox.
func (w *world) draSharedClaim() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && w.nodes[c.node].cmd != nil })
	if c == nil || !w.nriConnected(c.node, draRetryFor) {
		return
	}
	second := resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod2-" + c.name, UID: types.UID("pod2-uid-" + c.name)}
	share := func(r []resourceapi.ResourceClaimConsumerReference) []resourceapi.ResourceClaimConsumerReference {
		return append(r, second)
	}
	if w.sharedBeforePolicyDone || w.rng.IntN(3) != 0 || !w.proxy.Up() {
		err := w.tryReserve(c, share)
		if err == nil || !strings.Contains(err.Error(), sharedRefusal) {
			w.violation("shared-claim-policy", "the scheduler's write reserving claim %s for a second pod %s: %v; want the "+
				"policy %s's refusal (%q)", c, second.Name, err, notSharedPolicy, sharedRefusal)
			if err == nil {
				w.reserve(c, func(r []resourceapi.ResourceClaimConsumerReference) []resourceapi.ResourceClaimConsumerReference {
					return slices.DeleteFunc(r, func(x resourceapi.ResourceClaimConsumerReference) bool { return x.UID == second.UID })
				})
			}
			return
		}
		claim, gerr := w.cp.Clientset.ResourceV1().ResourceClaims(namespace).Get(w.ctx, c.name, metav1.GetOptions{})
		if gerr != nil {
			w.fail("reading claim %s: %v", c.name, gerr)
		}
		if slices.ContainsFunc(claim.Status.ReservedFor, func(x resourceapi.ResourceClaimConsumerReference) bool { return x.UID == second.UID }) {
			w.violation("shared-claim-policy", "claim %s is reserved for the second pod %s after the policy refused the write", c, second.Name)
		}
		w.counts["dra-shared-refused-by-policy"]++
		w.tracef("claim %s: reserving it for a second pod %s refused by the policy: %s", c.name, second.Name, firstLine(err))
		return
	}
	// Past the policy: the driver's own refusal.
	w.sharedBeforePolicyDone = true
	w.bypassPolicy(func() { w.reserve(c, share) })
	w.tracef("claim %s reserved for a second pod %s too, past the policy (its binding lifted for the write)", c.name, second.Name)
	n := w.nodes[c.node]
	w.killDaemon(c.node)
	w.startDaemon(c.node)
	w.tracef("kill -9 ipam-node on %s and start it again: the driver reads its claims at start", n.name)
	noted := "a pod is reserved on a claim prepared for another pod"
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(w.logs[len(w.logs)-1].w.String(), noted) {
		if time.Now().After(deadline) {
			w.violation("shared-claim", "ipam-node on %s did not note the second pod %s of claim %s within 30 s of its start "+
				"(log %q)", n.name, second.Name, c, noted)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !w.nriConnected(c.node, draRetryFor) {
		w.fail("ipam-node on %s did not connect to the runtime's NRI socket after its restart", n.name)
	}
	pod := w.newPod(c.node, second.Name, string(second.UID))
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	err := n.nri.rt.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod.sandbox()})
	cancel()
	if err == nil {
		p := w.portOf(c.node, c.device)
		where := "the host"
		if _, ok := w.links(pod.ns)[p.mac]; ok {
			where = "the second pod"
		}
		w.violation("shared-claim", "the second pod %s on %s started, and the claim's port %s is in %s: a claim's device cannot be in two pods, "+
			"and a pod must not run without its devices (refuse its sandbox, or the reservation)", second.Name, c, p.name, where)
	}
	if err != nil {
		w.counts["dra-shared-refused-by-driver"]++
		w.tracef("runtime on %s: RunPodSandbox of %s refused: %v", n.name, second.Name, firstLine(err))
	} else {
		ctx, cancel = context.WithTimeout(w.ctx, 30*time.Second)
		_ = n.nri.rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod.sandbox()})
		cancel()
	}
	ctx, cancel = context.WithTimeout(w.ctx, 30*time.Second)
	_ = n.nri.rt.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod.sandbox()})
	cancel()
	w.podGone(pod, false)
	w.reserve(c, func(r []resourceapi.ResourceClaimConsumerReference) []resourceapi.ResourceClaimConsumerReference {
		return slices.DeleteFunc(r, func(x resourceapi.ResourceClaimConsumerReference) bool { return x.UID == second.UID })
	})
}

// tryReserve changes the claim's reservedFor once (again on a conflict) and
// returns the API server's answer.
func (w *world) tryReserve(c *draClaim, change func([]resourceapi.ResourceClaimConsumerReference) []resourceapi.ResourceClaimConsumerReference) error {
	rc := w.cp.Clientset.ResourceV1().ResourceClaims(namespace)
	for range 10 {
		claim, err := rc.Get(w.ctx, c.name, metav1.GetOptions{})
		if err != nil {
			w.fail("reading claim %s: %v", c.name, err)
		}
		claim.Status.ReservedFor = change(claim.Status.ReservedFor)
		if _, err = rc.UpdateStatus(w.ctx, claim, metav1.UpdateOptions{}); err == nil || !apierrors.IsConflict(err) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // a conflict with the driver's status write
	}
	w.fail("changing claim %s's reservedFor keeps conflicting", c.name)
	return nil
}

// reserve changes the claim's reservedFor; a refusal fails the test.
func (w *world) reserve(c *draClaim, change func([]resourceapi.ResourceClaimConsumerReference) []resourceapi.ResourceClaimConsumerReference) {
	if err := w.tryReserve(c, change); err != nil {
		w.fail("changing claim %s's reservedFor: %v", c.name, err)
	}
}

// cniMasterAdd is a NAD whose CNI configuration names a port of the node as
// its master (macvlan, host-device): sometimes one a prepared claim holds (it
// must be refused), sometimes a free rail port (a claim on it must then be
// refused, or the port not published).
func (w *world) cniMasterAdd() {
	i := w.rng.IntN(nodeCount)
	var held []*hostPort
	for _, c := range w.claims {
		if c.node == i && c.state == claimPrepared {
			held = append(held, w.portOf(i, c.device))
		}
	}
	slices.SortFunc(held, func(a, b *hostPort) int { return strings.Compare(a.name, b.name) })
	var p *hostPort
	if len(held) > 0 && w.rng.IntN(2) == 0 {
		p = held[w.rng.IntN(len(held))]
	} else {
		p = w.portNamed(i, []string{fakesysfs.DGXH100Rails[0], fakesysfs.DGXH100Rails[1]}[w.rng.IntN(2)])
	}
	w.nextID++
	a := attachment{node: i, net: networkOfRail(p.name), containerID: fmt.Sprintf("c%d", w.nextID), master: p.name}
	claimed := slices.Contains(held, p)
	out, err := w.call("ADD", a, nil)
	if err != nil {
		w.tracef("ADD %s master=%s failed: %v", a, p.name, firstLine(err))
		if claimed {
			w.counts["cni-master-on-claimed-refused"]++
		}
		w.uncertain[key(a)] = a
		return
	}
	a.ip = resultIP(w, out)
	w.tracef("ADD %s master=%s (a claim holds it: %t)", a, p.name, claimed)
	w.live[key(a)] = a
	w.counts["cni-master-ok"]++
}

// draRecreateWhileDown: a claim is deleted while its node's daemon is down
// and re-created under the same name (a new UID), allocated and reserved
// again; the daemon starts. The new claim must show nothing of the old one's
// until it is prepared itself.
func (w *world) draRecreateWhileDown() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared })
	if c == nil {
		return
	}
	n := w.nodes[c.node]
	if c.pod != nil && n.cmd != nil && w.nriConnected(c.node, draRetryFor) {
		w.podStop(c, false) // the pod is deleted first; the kubelet then loses track of the claim
	}
	if n.cmd != nil {
		w.killDaemon(c.node)
		w.tracef("kill -9 ipam-node on %s", n.name)
	}
	if c.pod != nil {
		w.podGone(c.pod, true)
		c.pod = nil
	}
	w.draDeleteDown(c)
	nc := &draClaim{name: c.name, node: c.node, rail: c.rail, device: c.device, what: "rail", pool: c.pool}
	if c.what != "rail" {
		nc.pool = poolDefs[3]
		if c.rail == poolDefs[4].rail {
			nc.pool = poolDefs[4]
		}
		nc.rail = nc.pool.rail
		if d, _ := w.draDevice(c.node, nc.rail); d != "" {
			nc.device = d
		}
	}
	w.draCreate(nc)
	w.claims[nc.uid] = nc
	w.counts["dra-recreated-while-down"]++
	w.tracef("re-create %s under the same name while ipam-node on %s is down", nc, n.name)
	w.startDaemon(c.node)
	w.tracef("restart ipam-node on %s", n.name)
	// The daemon's status refresh comes shortly after its start.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		claim, err := w.cp.Clientset.ResourceV1().ResourceClaims(namespace).Get(w.ctx, nc.name, metav1.GetOptions{})
		if err != nil {
			w.fail("reading claim %s: %v", nc.name, err)
		}
		for _, d := range claim.Status.Devices {
			if d.NetworkData != nil && len(d.NetworkData.IPs) > 0 && nc.state != claimPrepared {
				w.violation("status-of-recreated", "%s, re-created under the name of a claim deleted while its daemon was down, shows %v in its status "+
					"before it was prepared (the old claim's, UID %s)", nc, d.NetworkData.IPs, c.uid)
				deadline = time.Time{}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.draPrepare(nc)
}

// draKillDuringPrepare kills -9 a daemon while it prepares a new claim, at a
// random moment of the prepare, starts it again, and has the kubelet either
// prepare the claim again or give it up (unprepare and delete): either way
// store and checkpoint must converge (one address, or none, held under the
// claim's UID).
func (w *world) draKillDuringPrepare() {
	i := w.rng.IntN(nodeCount)
	if w.nodes[i].cmd == nil || !w.proxy.Up() || !w.draRegister(i, draRetryFor) {
		return
	}
	n := w.nodes[i]
	railPools := []poolDef{poolDefs[3], poolDefs[4]}
	c := &draClaim{node: i, what: "rail"}
	c.pool = railPools[w.rng.IntN(len(railPools))]
	c.rail = c.pool.rail
	if w.rng.IntN(3) == 0 {
		c.what = "static"
		c.want, c.refuseFirst = w.draStaticAddr(i, c.pool)
		if c.refuseFirst {
			c.what = "static-held"
		}
		c.config = fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"ips":[%q]}`, nicdra.ConfigAPIVersion, nicdra.ConfigKind, c.want)
	}
	if !w.draAllocate(c) {
		return
	}
	req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: namespace, Uid: string(c.uid), Name: c.name}}}
	// The prepare cut short may have allocated from the block the daemon has
	// now (a pool deleted a moment ago included: the daemon learns it later).
	c.uncertainIn = append(c.uncertainIn, w.nodeBlock(i, v1alpha1.PoolKey(c.pool.kind, c.pool.name)))
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(w.ctx, draCallTimeout)
	plugin := n.dra
	go func() {
		_, err := plugin.NodePrepareResources(ctx, req)
		done <- err
	}()
	delay := time.Duration(w.rng.IntN(40)) * time.Millisecond
	time.Sleep(delay)
	w.killDaemon(i)
	err := <-done
	cancel()
	c.state = claimUncertain
	w.counts["dra-kill-during-prepare"]++
	w.tracef("kill -9 ipam-node on %s %s into the prepare of %s (the call: %v)", n.name, delay, c, err)
	w.startDaemon(i)
	if w.rng.IntN(2) == 0 {
		w.draPrepare(c)
		return
	}
	w.unprepareUntilDone(c, "after a kill during its prepare")
	w.draDelete(c)
	delete(w.claims, c.uid)
	w.tracef("delete %s", c)
}

// slowFile makes a file of a sysfs tree slow to read: a FIFO that a feeder
// answers, each open, with the file's content after delay (a sysfs scan that
// takes seconds, as on a node with many functions or a busy kernel). scratch
// is a directory outside the tree on its filesystem (the FIFO is linked into
// the tree). stop puts the file back and stops the feeder once no reader
// waits.
func (w *world) slowFile(path, scratch string, delay time.Duration) (stop func()) {
	content, err := os.ReadFile(path)
	if err != nil {
		w.fail("reading %s: %v", path, err)
	}
	sideDir, err := os.MkdirTemp(scratch, "fifo-")
	if err != nil {
		w.fail("a directory for the FIFO: %v", err)
	}
	side := filepath.Join(sideDir, "fifo")
	if err := syscall.Mkfifo(side, 0o644); err != nil {
		w.fail("mkfifo: %v", err)
	}
	tmp := path + ".fifo"
	if err := os.Link(side, tmp); err != nil {
		w.fail("linking the FIFO into the tree: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		w.fail("putting the FIFO in place of %s: %v", path, err)
	}
	var stopped atomic.Bool
	var stoppedAt atomic.Int64
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			fd, err := unix.Open(side, unix.O_WRONLY|unix.O_NONBLOCK, 0)
			if err != nil {
				if stopped.Load() && time.Since(time.Unix(0, stoppedAt.Load())) > time.Second {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			time.Sleep(delay)
			_, _ = unix.Write(fd, content)
			_ = unix.Close(fd)
			// The reader reads on to EOF, which it gets only while no
			// writer has the FIFO open: opened again at once, the FIFO
			// would feed the same reader the content again, and again,
			// until stop (a scan that never ended).
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return func() {
		if err := os.WriteFile(path+".new", content, 0o644); err != nil {
			w.fail("restoring %s: %v", path, err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			w.fail("restoring %s: %v", path, err)
		}
		stoppedAt.Store(time.Now().UnixNano())
		stopped.Store(true)
		<-finished
		_ = os.RemoveAll(sideDir)
	}
}

// draSlowPrepare: a prepare that takes seconds (its sysfs scan is slow)
// beside a sandbox start on the same node: the runtime's hook must answer
// within its budget, with the pod's port moved.
func (w *world) draSlowPrepare() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && w.nodes[c.node].cmd != nil })
	if c == nil || !w.proxy.Up() || !w.nriConnected(c.node, draRetryFor) || !w.draRegister(c.node, draRetryFor) {
		return
	}
	w.draSlowDone = true
	i := c.node
	n := w.nodes[i]
	if c.pod != nil {
		w.podStop(c, false)
	}
	nc := &draClaim{node: i, what: "rail"}
	nc.pool = poolDefs[3]
	if c.rail == nc.pool.rail {
		nc.pool = poolDefs[4]
	}
	nc.rail = nc.pool.rail
	if !w.draAllocate(nc) {
		return
	}
	stop := w.slowFile(filepath.Join(n.sysfs, "sys", "class", "net", "enp225s0f1np1", "operstate"), n.dir, 3*time.Second)
	time.Sleep(1100 * time.Millisecond) // past the daemon's inventory cache (a fresh scan is reused for 1 s)
	req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: namespace, Uid: string(nc.uid), Name: nc.name}}}
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(w.ctx, draCallTimeout)
	plugin := n.dra
	began := time.Now()
	go func() {
		_, err := plugin.NodePrepareResources(ctx, req)
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	w.tracef("prepare of %s runs (its sysfs scan slow); %s's pod starts beside it", nc, c.name)
	w.counts["dra-slow-prepare"]++
	w.podStart(c)
	err := <-done
	cancel()
	stop()
	nc.state = claimUncertain
	w.tracef("the slow prepare of %s returned after %s: %v", nc, time.Since(began).Round(time.Millisecond), err)
	w.draPrepare(nc)
}

// unprepareUntilDone unprepares the claim as the kubelet does, again until it
// succeeds; one that keeps failing for 30 s fails the test (when says after
// what).
func (w *world) unprepareUntilDone(c *draClaim, when string) {
	deadline := time.Now().Add(30 * time.Second)
	for !w.draUnprepare(c) {
		if time.Now().After(deadline) {
			w.fail("unprepare of %s %s keeps failing", c, when)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// networkOfRail is the network whose pool is labelled for rail, the first
// network when none is.
func networkOfRail(rail string) network {
	nw := networks[0]
	for _, x := range networks {
		if x.pool.rail == rail {
			nw = x
		}
	}
	return nw
}
