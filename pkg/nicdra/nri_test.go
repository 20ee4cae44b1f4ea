package nicdra_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/go-logr/logr/testr"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/test/harness"
)

// podDevices is a PodDevices as the driver's would be: devices by pod UID,
// keeping what DeviceAttached tells it.
type podDevices struct {
	mu       sync.Mutex
	byPod    map[string][]nicdra.PreparedDevice
	asked    map[string]int
	attached []string // "podUID device MAC MTU"
}

func newPodDevices() *podDevices {
	return &podDevices{byPod: map[string][]nicdra.PreparedDevice{}, asked: map[string]int{}}
}

func (p *podDevices) set(uid string, devs ...nicdra.PreparedDevice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.byPod[uid] = devs
}

func (p *podDevices) PodDevices(uid string) []nicdra.PreparedDevice {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked[uid]++
	return slices.Clone(p.byPod[uid])
}

func (p *podDevices) DeviceAttached(uid string, d nicdra.PreparedDevice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attached = append(p.attached, fmt.Sprintf("%s %s %s %d", uid, d.Device, d.MAC, d.MTU))
	for i, x := range p.byPod[uid] {
		if x.Device == d.Device {
			p.byPod[uid][i] = d
		}
	}
}

func (p *podDevices) wasAsked(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked[uid] > 0
}

var _ nicdra.PodDevices = (*podDevices)(nil)

func sandbox(uid, name, netns string) *api.PodSandbox {
	pod := &api.PodSandbox{Id: "sb-" + uid, Uid: uid, Name: name, Namespace: "default", Linux: &api.LinuxPodSandbox{}}
	if netns != "" {
		pod.Linux.Namespaces = []*api.LinuxNamespace{{Type: "ipc"}, {Type: "network", Path: netns}}
	}
	return pod
}

// nriEnv is a host stand-in with two rail ports (veths rail0 and rail1, MTU
// 9000), a DGX-H100 sysfs tree with verbs devices for their PCI functions,
// and the plugin.
type nriEnv struct {
	*attachEnv
	devs   *podDevices
	plugin *nicdra.NRIPlugin
	rail0  nicdra.PreparedDevice
	rail1  nicdra.PreparedDevice
}

func newNRIEnv(t *testing.T) *nriEnv {
	t.Helper()
	e := &nriEnv{attachEnv: newAttachEnv(t, "rail0", 9000), devs: newPodDevices()}
	harness.NewVethPair(t, e.host, "rail1", e.wire, "peer1")
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	addVerbs(t, tree.Root)
	e.plugin = &nicdra.NRIPlugin{Devices: e.devs, Attacher: e.att, SysfsRoot: tree.Root, Log: testr.New(t)}
	e.rail0 = railDevice()
	e.rail1 = railDevice()
	e.rail1.Device, e.rail1.PCIAddress, e.rail1.HostNetdev, e.rail1.InterfaceName = "pci-0000-40-00-0", "0000:40:00.0", "rail1", "net2"
	e.rail1.Addresses, e.rail1.Routes = []string{"10.26.0.4/24"}, nil
	return e
}

// The handlers, called as the runtime calls them: the pod's devices go into
// its namespace at RunPodSandbox (their host MAC and MTU recorded), its
// containers get their RDMA devices, and StopPodSandbox brings them back;
// each twice, and RemovePodSandbox after it finds nothing left to do. A pod
// without devices is left alone.
func TestNRIHandlers(t *testing.T) {
	e := newNRIEnv(t)
	ctx := t.Context()
	e.devs.set("uid-a", e.rail0, e.rail1)
	pod := sandbox("uid-a", "trainer", e.pod.Path)
	mac0 := link(t, e.host, "rail0").Attrs().HardwareAddr.String()
	for range 2 {
		if err := e.plugin.RunPodSandbox(ctx, pod); err != nil {
			t.Fatal(err)
		}
		e.checkInPod(t, e.rail0)
		if got := e.pod.Addrs(t, "net2", 0); !slices.Equal(got, []string{"10.26.0.4/24"}) {
			t.Errorf("net2: %v", got)
		}
		if !e.plugin.SandboxRuns("uid-a") {
			t.Error("the sandbox of a pod with devices is not known to run after RunPodSandbox")
		}
	}
	if want := "uid-a pci-0000-18-00-0 " + mac0 + " 9000"; len(e.devs.attached) != 2 || e.devs.attached[0] != want {
		t.Errorf("recorded: %q, want %q first, and one for rail1 (the second run found them attached)", e.devs.attached, want)
	}

	adj, upd, err := e.plugin.CreateContainer(ctx, pod, &api.Container{Name: "main", PodSandboxId: pod.Id})
	if err != nil || upd != nil {
		t.Fatal(err, upd)
	}
	var got []string
	for _, d := range adj.GetLinux().GetDevices() {
		got = append(got, fmt.Sprintf("%s %s %d:%d %o", d.Path, d.Type, d.Major, d.Minor, d.FileMode.Get().Perm()))
	}
	want := []string{"/dev/infiniband/uverbs0 c 231:192 666", "/dev/infiniband/rdma_cm c 10:58 666", "/dev/infiniband/uverbs1 c 231:193 666"}
	if !slices.Equal(got, want) {
		t.Errorf("container devices: %q, want %q", got, want)
	}

	for range 2 {
		if err := e.plugin.StopPodSandbox(ctx, pod); err != nil {
			t.Fatal(err)
		}
		d, _ := e.devs.PodDevices("uid-a")[0], 0
		e.checkOnHost(t, d, 9000)
		if link(t, e.host, "rail1") == nil {
			t.Error("rail1 not back on the host")
		}
		if e.plugin.SandboxRuns("uid-a") {
			t.Error("the sandbox is known to run after StopPodSandbox brought its devices back")
		}
	}
	if err := e.plugin.RemovePodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}

	other := sandbox("uid-b", "web", e.pod.Path)
	if err := e.plugin.RunPodSandbox(ctx, other); err != nil {
		t.Fatal(err)
	}
	if adj, _, err := e.plugin.CreateContainer(ctx, other, &api.Container{Name: "web"}); adj != nil || err != nil {
		t.Errorf("a pod without devices: %v, %v", adj, err)
	}
	if link(t, e.host, "rail0") == nil {
		t.Error("a pod without devices took rail0")
	}
}

// A RunPodSandbox that cannot attach every device fails with the device and
// the reason, and leaves none in the pod; a pod on the host's network, and a
// container whose device has no readable verbs device, fail too.
func TestNRIHandlerErrors(t *testing.T) {
	e := newNRIEnv(t)
	ctx := t.Context()
	other := harness.NewNetNS(t)
	harness.NewVethPair(t, e.pod, "net2", other, "x0") // the pod's own net2
	e.devs.set("uid-a", e.rail0, e.rail1)
	err := e.plugin.RunPodSandbox(ctx, sandbox("uid-a", "trainer", e.pod.Path))
	if err == nil || !strings.Contains(err.Error(), "pod default/trainer") || !strings.Contains(err.Error(), "already has an interface named net2") {
		t.Fatalf("got %v", err)
	}
	t.Log(err)
	for _, n := range []string{"rail0", "rail1"} {
		if link(t, e.host, n) == nil {
			t.Errorf("%s is not on the host after the failed attach", n)
		}
	}
	if link(t, e.pod, "net1") != nil {
		t.Error("net1 left in the pod")
	}

	err = e.plugin.RunPodSandbox(ctx, sandbox("uid-a", "trainer", ""))
	if err == nil || !strings.Contains(err.Error(), "hostNetwork") {
		t.Errorf("a pod without a namespace of its own: %v", err)
	}

	d := e.rail0
	d.PCIAddress = "0000:00:00.0" // no such function: no RDMA device, nothing to add
	e.devs.set("uid-c", d)
	podC := sandbox("uid-c", "c", harness.NewNetNS(t).Path)
	if err := e.plugin.RunPodSandbox(ctx, podC); err != nil {
		t.Fatal(err)
	}
	if adj, _, err := e.plugin.CreateContainer(ctx, podC, &api.Container{Name: "c"}); adj != nil || err != nil {
		t.Errorf("a device without RDMA: %v, %v", adj, err)
	}
	if err := e.plugin.StopPodSandbox(ctx, podC); err != nil {
		t.Fatal(err)
	}
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	removeVerbs(t, tree.Root) // ib_uverbs not loaded
	e.plugin.SysfsRoot = tree.Root
	e.devs.set("uid-d", e.rail0)
	podD := sandbox("uid-d", "trainer", harness.NewNetNS(t).Path)
	if err := e.plugin.RunPodSandbox(ctx, podD); err != nil {
		t.Fatal(err)
	}
	_, _, err = e.plugin.CreateContainer(ctx, podD, &api.Container{Name: "main"})
	if err == nil || !strings.Contains(err.Error(), "container main, device pci-0000-18-00-0") || !strings.Contains(err.Error(), "modprobe ib_uverbs") {
		t.Errorf("got %v", err)
	}
}

// testNRILog sends the NRI library's logs to the test's log until the test
// ends (the library's goroutines log after that).
type testNRILog struct {
	mu   *sync.Mutex
	t    *testing.T
	done *bool
}

func newTestNRILog(t *testing.T) testNRILog {
	l := testNRILog{mu: &sync.Mutex{}, t: t, done: new(bool)}
	t.Cleanup(func() { l.mu.Lock(); *l.done = true; l.mu.Unlock() })
	return l
}

func (l testNRILog) logf(f string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !*l.done {
		l.t.Logf("nri: "+f, a...)
	}
}

func (l testNRILog) Debugf(context.Context, string, ...any)       {}
func (l testNRILog) Infof(_ context.Context, f string, a ...any)  { l.logf(f, a...) }
func (l testNRILog) Warnf(_ context.Context, f string, a ...any)  { l.logf(f, a...) }
func (l testNRILog) Errorf(_ context.Context, f string, a ...any) { l.logf(f, a...) }

// nriRuntime is the runtime side of NRI, as containerd runs it (the nri
// module's adaptation package), listening on a socket in a temporary
// directory; pods are what it reports at a plugin's synchronization.
type nriRuntime struct {
	t      *testing.T
	nri    *adaptation.Adaptation
	mu     sync.Mutex
	pods   []*api.PodSandbox
	synced chan struct{}
}

func startRuntime(t *testing.T, dir string, pods ...*api.PodSandbox) *nriRuntime {
	t.Helper()
	r := &nriRuntime{t: t, pods: pods, synced: make(chan struct{}, 10)}
	nrilog.Set(newTestNRILog(t)) // the adaptation logs through the library's global logger
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		r.mu.Lock()
		pods := r.pods
		r.mu.Unlock()
		_, err := cb(ctx, pods, nil)
		r.synced <- struct{}{}
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	a, err := adaptation.New("containerd", "test", syncFn, update, adaptation.WithSocketPath(filepath.Join(dir, "nri.sock")),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf")))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	r.nri = a
	return r
}

// waitPlugin waits until the plugin is synchronized and registered: a
// RunPodSandbox of a probe pod reaches it.
func (r *nriRuntime) waitPlugin(devs *podDevices, probe string) {
	r.t.Helper()
	select {
	case <-r.synced:
	case <-time.After(10 * time.Second):
		r.t.Fatal("the plugin did not connect within 10s")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !devs.wasAsked(probe) {
		if err := r.nri.RunPodSandbox(r.t.Context(), &api.RunPodSandboxRequest{Pod: sandbox(probe, "probe", "")}); err != nil {
			r.t.Fatal(err)
		}
		if time.Now().After(deadline) {
			r.t.Fatal("the plugin is not registered 5s after its synchronization")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// socketProxy forwards connections from its socket to the runtime's, so that
// a test can cut them as a runtime's restart does (the adaptation's Stop
// leaves external plugins' connections open).
type socketProxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newSocketProxy(t *testing.T, path, target string) *socketProxy {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := &socketProxy{l: l}
	t.Cleanup(func() { _ = l.Close(); p.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("unix", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	return p
}

// cut closes every connection made through the proxy.
func (p *socketProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// End to end over NRI's wire: the plugin's Run connects to a runtime-side NRI
// (the adaptation containerd embeds) on a socket; a running pod whose device
// is still on the host gets it at synchronization; RunPodSandbox,
// CreateContainer and StopPodSandbox reach the handlers through the socket,
// an attach error fails the runtime's RunPodSandbox with the plugin's
// message; and when the runtime restarts, the plugin connects again.
func TestNRIEndToEnd(t *testing.T) {
	e := newNRIEnv(t)
	dir := t.TempDir()
	pod2 := harness.NewNetNS(t)
	running := sandbox("uid-running", "running", pod2.Path)
	e.devs.set("uid-running", e.rail1)
	rt := startRuntime(t, dir, running)
	t.Cleanup(func() { rt.nri.Stop() })

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	proxy := newSocketProxy(t, filepath.Join(dir, "proxy.sock"), filepath.Join(dir, "nri.sock"))
	go func() { done <- e.plugin.Run(ctx, filepath.Join(dir, "proxy.sock")) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return 10s after its context ended")
		}
	})
	rt.waitPlugin(e.devs, "probe-1")
	if link(t, pod2, "net2") == nil {
		t.Error("the running pod's rail1 was not attached at synchronization")
	}

	e.devs.set("uid-a", e.rail0)
	pod := sandbox("uid-a", "trainer", e.pod.Path)
	start := time.Now()
	if err := rt.nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}); err != nil {
		t.Fatal(err)
	}
	t.Logf("RunPodSandbox over NRI with one device took %v", time.Since(start))
	e.checkInPod(t, e.rail0)
	res, err := rt.nri.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: &api.Container{Id: "c1", Name: "main", PodSandboxId: pod.Id}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range res.GetAdjust().GetLinux().GetDevices() {
		got = append(got, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
	}
	if want := []string{"/dev/infiniband/uverbs0 231:192", "/dev/infiniband/rdma_cm 10:58"}; !slices.Equal(got, want) {
		t.Errorf("container devices over NRI: %q, want %q", got, want)
	}
	if err := rt.nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod}); err != nil {
		t.Fatal(err)
	}
	e.checkOnHost(t, e.devs.PodDevices("uid-a")[0], 9000)

	// An attach that fails fails the runtime's request, with the reason.
	bad := e.rail0
	bad.InterfaceName = "lo"
	e.devs.set("uid-bad", bad)
	err = rt.nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: sandbox("uid-bad", "bad", e.pod.Path)})
	if err == nil || !strings.Contains(err.Error(), "already has an interface named lo") {
		t.Errorf("RunPodSandbox over NRI with a clash: %v", err)
	}
	t.Log(err)

	// The runtime restarts: the plugin connects to the new one.
	rt.nri.Stop()
	proxy.cut()
	rt2 := startRuntime(t, dir)
	t.Cleanup(func() { rt2.nri.Stop() })
	rt2.waitPlugin(e.devs, "probe-2")
	if err := rt2.nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}); err != nil {
		t.Fatal(err)
	}
	e.checkInPod(t, e.rail0)
}

// A pod whose sandbox and containers started while the plugin was away gets its
// ports at synchronization, but its containers were created without the ports'
// RDMA devices: that is recorded as a failed attach of the pod, naming the
// containers, for ipamctl check (it was only logged, at info level). A pod
// whose ports were already in it (the plugin restarted) records nothing
// (issue 45, item 8).
func TestSynchronizeRecordsContainersWithoutDevices(t *testing.T) {
	e := newNRIEnv(t)
	e.plugin.Failures = &nicdra.FailureLog{}
	late := sandbox("uid-late", "late", e.pod.Path)
	e.devs.set("uid-late", e.rail0)
	containers := []*api.Container{{Id: "c1", PodSandboxId: late.Id, Name: "train"}, {Id: "c2", PodSandboxId: late.Id, Name: "sidecar"},
		{Id: "c3", PodSandboxId: "sb-other", Name: "web"}}
	if _, err := e.plugin.Synchronize(t.Context(), []*api.PodSandbox{late}, containers); err != nil {
		t.Fatal(err)
	}
	e.checkInPod(t, e.rail0)
	got := e.plugin.Failures.Recent()
	if len(got) != 1 || got[0].Op != nicdra.FailedAttach || got[0].Pod != "default/late" ||
		!strings.Contains(got[0].Message, "sidecar, train") || !strings.Contains(got[0].Message, "restart the pod") {
		t.Fatalf("failures after a late attach: %+v", got)
	}
	// The plugin restarts: the ports are in the pod already, the containers
	// had their devices from their creation.
	e.plugin.Failures = &nicdra.FailureLog{}
	if _, err := e.plugin.Synchronize(t.Context(), []*api.PodSandbox{late}, containers); err != nil {
		t.Fatal(err)
	}
	if got := e.plugin.Failures.Recent(); len(got) != 0 {
		t.Errorf("failures after a synchronization that found the ports in the pod: %+v", got)
	}
}
