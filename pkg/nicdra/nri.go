package nicdra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
)

// The NRI plugin attaches a pod's prepared devices when its sandbox starts
// and detaches them when it stops. containerd (2.x: NRI on by default) calls
// it over its NRI socket: RunPodSandbox after the pod's CNI network is set up
// (so a clash with the pod's own interfaces shows), an error failing the
// sandbox; StopPodSandbox before the network is torn down and the namespace
// removed (containerd logs an error of it and goes on); CreateContainer for
// each container, which attaches what a missed RunPodSandbox left on the host
// and whose adjustment adds the devices' RDMA character devices.
// Every hook answers from memory and netlink (no API call): containerd gives a
// plugin 2s per request by default (plugin_request_timeout).

// NRI registration and the runtime's socket.
const (
	NRIPluginName    = "hwipam-nic"
	NRIPluginIndex   = "10"
	DefaultNRISocket = "/var/run/nri/nri.sock"
)

// PodDevices is what the NRI plugin needs of the driver's prepared claims:
// *Preparer implements it.
type PodDevices interface {
	// PodDevices returns the devices prepared for the claims of the pod with
	// this UID (none for a pod without any), from memory: it is called in the
	// runtime's hooks.
	PodDevices(podUID string) []PreparedDevice
	// DeviceAttached is told what the attach learnt of a device (set in d by
	// Attachment.RecordIn: its MAC address, MTU, permanent MAC, parent
	// device and admin state on the host, its ifindex in the pod) once it is
	// in the pod: record them with the device (PreparedDevice.recordAttach),
	// so that the detach finds it by them and restores its state (PodDevices
	// returns them then), and the claim's networkData can show the MAC.
	DeviceAttached(podUID string, d PreparedDevice)
}

// NRIPlugin is the driver's NRI plugin.
type NRIPlugin struct {
	Devices  PodDevices
	Attacher *Attacher
	// SysfsRoot is the directory holding sys/ ("/" on a node).
	SysfsRoot string
	Log       logr.Logger
	// Failures records the attaches and detaches that fail (nil: none).
	Failures *FailureLog
	// CharDevicesByCDI: the RDMA character devices reach the containers
	// that reference the claim through its CDI spec (Driver.CDI), and
	// CreateContainer adds none; otherwise it gives them to every container
	// of the pod.
	CharDevicesByCDI bool

	readyInit, readyOnce sync.Once
	ready                chan struct{}

	// running are the pods with devices whose sandbox the runtime runs, by
	// UID, as the plugin heard (RunPodSandbox, Synchronize; until
	// StopPodSandbox detached them all, or RemovePodSandbox).
	runMu   sync.Mutex
	running map[string]bool
	// synced: the runtime has told the plugin, at least once since the
	// process started, which sandboxes run (Synchronize).
	synced bool
}

// SandboxRuns tells whether the runtime runs the sandbox of the pod with this
// UID, which has devices of the driver, as far as the plugin heard.
func (p *NRIPlugin) SandboxRuns(podUID string) bool {
	if p == nil {
		return false
	}
	p.runMu.Lock()
	defer p.runMu.Unlock()
	return p.running[podUID]
}

// Synchronized tells whether the runtime has told the plugin which sandboxes
// run, at least once since the process started: until then SandboxRuns knows
// nothing (a restarted ipam-node has not heard of the sandboxes that ran
// before it).
func (p *NRIPlugin) Synchronized() bool {
	if p == nil {
		return false
	}
	p.runMu.Lock()
	defer p.runMu.Unlock()
	return p.synced
}

// runs records whether the pod's sandbox runs.
func (p *NRIPlugin) runs(podUID string, running bool) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	if p.running == nil {
		p.running = map[string]bool{}
	}
	if running {
		p.running[podUID] = true
	} else {
		delete(p.running, podUID)
	}
}

// podNetNS is the path of the sandbox's network namespace, "" when it has
// none of its own (hostNetwork).
func podNetNS(pod *api.PodSandbox) string {
	for _, ns := range pod.GetLinux().GetNamespaces() {
		if ns.GetType() == "network" {
			return ns.GetPath()
		}
	}
	return ""
}

func podName(pod *api.PodSandbox) string { return pod.GetNamespace() + "/" + pod.GetName() }

// RunPodSandbox attaches the pod's devices into its network namespace. When
// one fails, those this call found in or moved into the pod go back to the
// host (the one that failed only if it moved: a device that never left the
// host is not touched), and the error, which fails the sandbox (the kubelet
// retries it), says which device and why.
func (p *NRIPlugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	if err := refusal(p.Devices, pod.GetUid()); err != nil {
		err = fmt.Errorf("%s: pod %s: %w", DriverName, podName(pod), err)
		p.Failures.Add(FailedAttach, "", podName(pod), err)
		return err
	}
	err := p.ensureAttached(pod, "", true)
	if err == nil && len(p.Devices.PodDevices(pod.GetUid())) > 0 {
		p.runs(pod.GetUid(), true)
	}
	return p.recorded(FailedAttach, pod, err)
}

// recorded records err (a failure of op for the pod) or clears the pod's
// failures of op, and returns err.
func (p *NRIPlugin) recorded(op string, pod *api.PodSandbox, err error) error {
	if err != nil {
		p.Failures.Add(op, "", podName(pod), err)
	} else if len(p.Devices.PodDevices(pod.GetUid())) > 0 {
		p.Failures.Succeeded(op, "", podName(pod))
	}
	return err
}

// ensureAttached attaches the pod's devices that are not in its namespace
// yet; with rollback, a failure brings back those that are (see
// RunPodSandbox). container names the container being created, "" for the
// sandbox.
func (p *NRIPlugin) ensureAttached(pod *api.PodSandbox, container string, rollback bool) error {
	devs := p.Devices.PodDevices(pod.GetUid())
	if len(devs) == 0 {
		return nil
	}
	start := time.Now()
	path := podNetNS(pod)
	if path == "" {
		return fmt.Errorf("pod %s has %s devices but no network namespace of its own (hostNetwork: true?): "+
			"they move into the pod's namespace; drop hostNetwork or the claim", podName(pod), DriverName)
	}
	log := p.Log.WithValues("pod", podName(pod), "podUID", pod.GetUid(), "netns", path)
	if container != "" {
		log = log.WithValues("container", container)
	}
	attached := 0
	for i, d := range devs {
		a, err := p.Attacher.Attach(path, d)
		if a.Outcome == Attached || a.Outcome == AlreadyAttached {
			if a.RecordIn(&d) {
				p.Devices.DeviceAttached(pod.GetUid(), d)
			}
			devs[i] = d
		}
		if err != nil {
			if container != "" {
				err = fmt.Errorf("%w (attached when its container %s is created: the pod's RunPodSandbox did not reach "+
					"the plugin, which was not connected to the runtime then)", err, container)
			}
			if !rollback {
				return fmt.Errorf("%s: pod %s: %w", DriverName, podName(pod), err)
			}
			in := devs[:i]
			if a.Outcome == Attached {
				in = devs[:i+1] // it moved, then failed: it goes back too
			}
			for _, back := range in {
				if out, derr := p.Attacher.Detach(path, back); derr != nil {
					err = errors.Join(err, derr)
				} else {
					log.V(1).Info("device back on the host after a failed attach", "device", back.Device, "outcome", out)
				}
			}
			return fmt.Errorf("%s: pod %s: %w", DriverName, podName(pod), err)
		}
		if a.Outcome == Attached {
			attached++
		}
		log.V(1).Info("device attached", "device", d.Device, "hostNetdev", d.HostNetdev, "ifName", d.InterfaceName, "outcome", a.Outcome)
	}
	switch {
	case container == "":
		log.Info("devices attached", "devices", len(devs), "took", time.Since(start))
	case attached > 0:
		log.Info("devices attached at a container's creation: the pod's RunPodSandbox did not reach the plugin",
			"devices", attached, "took", time.Since(start))
	}
	return nil
}

// StopPodSandbox detaches the pod's devices back to the host. Every device is
// tried; the error (which containerd only logs) names those that failed.
func (p *NRIPlugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	err := p.detach(pod, "stop")
	if err == nil {
		p.runs(pod.GetUid(), false) // every port back on the host
	}
	return p.recorded(FailedDetach, pod, err)
}

// RemovePodSandbox detaches what a StopPodSandbox left (it finds nothing to
// do when that ran); its namespace may be gone by then.
func (p *NRIPlugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	defer p.runs(pod.GetUid(), false)
	return p.recorded(FailedDetach, pod, p.detach(pod, "remove"))
}

func (p *NRIPlugin) detach(pod *api.PodSandbox, event string) error {
	devs := p.Devices.PodDevices(pod.GetUid())
	if len(devs) == 0 {
		return nil
	}
	path := podNetNS(pod)
	log := p.Log.WithValues("pod", podName(pod), "podUID", pod.GetUid(), "netns", path, "event", event)
	var errs []error
	for _, d := range devs {
		out, err := p.Attacher.Detach(path, d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if out == Gone {
			log.Info("device gone with the pod's network namespace (a virtual link is destroyed with it)",
				"device", d.Device, "hostNetdev", d.HostNetdev)
			continue
		}
		log.V(1).Info("device detached", "device", d.Device, "hostNetdev", d.HostNetdev, "outcome", out)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: pod %s: %w", DriverName, podName(pod), errors.Join(errs...))
	}
	return nil
}

// CreateContainer makes sure the pod's devices are in its namespace (a
// RunPodSandbox that the plugin missed, because it was not connected to the
// runtime then, attaches them now; a device that cannot be attached fails the
// container, never lets it run without its device), then, unless CDI gives
// them (CharDevicesByCDI), gives the container the RDMA character devices of
// the pod's devices (RDMACharDevices; rdma_cm once). A device whose numbers cannot be read fails the container with the
// reason.
func (p *NRIPlugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	devs := p.Devices.PodDevices(pod.GetUid())
	if len(devs) == 0 {
		return nil, nil, nil
	}
	if err := p.ensureAttached(pod, ctr.GetName(), false); err != nil {
		p.Failures.Add(FailedAttach, "", podName(pod), err)
		return nil, nil, err
	}
	if p.CharDevicesByCDI {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	seen := map[string]bool{}
	for _, d := range devs {
		chars, err := RDMACharDevices(p.SysfsRoot, d.PCIAddress)
		if err != nil {
			err = fmt.Errorf("%s: pod %s, container %s, device %s: %w", DriverName, podName(pod), ctr.GetName(), d.Device, err)
			p.Failures.Add(FailedAttach, "", podName(pod), err)
			return nil, nil, err
		}
		for _, c := range chars {
			if seen[c.Path] {
				continue
			}
			seen[c.Path] = true
			adj.AddDevice(&api.LinuxDevice{Path: c.Path, Type: "c", Major: c.Major, Minor: c.Minor, FileMode: api.FileMode(c.Mode)})
		}
	}
	if len(seen) == 0 {
		return nil, nil, nil
	}
	p.Log.V(1).Info("RDMA devices added", "pod", podName(pod), "container", ctr.GetName(), "devices", len(seen))
	return adj, nil, nil
}

// Synchronize runs when the plugin (re)connects, with the pods that exist: a
// running pod whose devices are still on the host (its RunPodSandbox came
// while the plugin was away) gets them now. Errors are logged, not returned:
// they would fail the registration, and with it every later pod. Once it has
// run, Ready is closed.
func (p *NRIPlugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	defer p.setReady()
	running := map[string]bool{}
	defer func() {
		p.runMu.Lock()
		p.running, p.synced = running, true
		p.runMu.Unlock()
	}()
	for _, pod := range pods {
		devs := p.Devices.PodDevices(pod.GetUid())
		path := podNetNS(pod)
		if len(devs) == 0 || path == "" {
			continue
		}
		running[pod.GetUid()] = true
		late := 0
		for _, d := range devs {
			a, err := p.Attacher.Attach(path, d)
			if a.RecordIn(&d) {
				p.Devices.DeviceAttached(pod.GetUid(), d)
			}
			if err != nil {
				p.Failures.Add(FailedAttach, "", podName(pod), fmt.Errorf("%s: pod %s, device %s: %w", DriverName, podName(pod), d.Device, err))
				p.Log.Error(err, "attaching a device of a running pod", "pod", podName(pod), "device", d.Device)
				continue
			}
			if a.Outcome == Attached {
				late++
				p.Log.Info("device of a running pod attached late", "pod", podName(pod), "device", d.Device)
			}
		}
		// With CDI the runtime gave the containers their RDMA devices when it
		// created them, whether or not the plugin was there: only the netdev
		// came late.
		if late > 0 && !p.CharDevicesByCDI {
			p.lackingDevices(pod, containers)
		}
	}
	return nil, nil
}

// lackingDevices records, as a failed attach of the pod, that its containers
// the runtime already runs were created while the plugin was away (its ports
// were on the host, just attached late): they lack the ports' RDMA character
// devices, which only a container's creation can give. Nothing is recorded for
// a pod without containers yet: its containers get them when created.
func (p *NRIPlugin) lackingDevices(pod *api.PodSandbox, containers []*api.Container) {
	var names []string
	for _, c := range containers {
		if c.GetPodSandboxId() == pod.GetId() {
			names = append(names, c.GetName())
		}
	}
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	err := fmt.Errorf("%s: pod %s: its NIC ports were still on the host when the NRI plugin connected (its sandbox started while "+
		"the plugin was away): they are in the pod now, but its containers %s were created without their RDMA devices "+
		"(/dev/infiniband/...), which only a container's creation gives: restart the pod", DriverName, podName(pod),
		strings.Join(names, ", "))
	p.Failures.Add(FailedAttach, "", podName(pod), err)
	p.Log.Error(err, "a running pod's containers lack their RDMA devices", "pod", podName(pod))
}

// Ready is closed once the plugin has synchronized with the runtime (it is
// connected, and pods that started while it was away have their devices):
// the kubelet plugin waits for it before it registers, so that no claim is
// prepared for a sandbox that then starts with no one to attach its devices.
func (p *NRIPlugin) Ready() <-chan struct{} {
	p.readyInit.Do(func() { p.ready = make(chan struct{}) })
	return p.ready
}

func (p *NRIPlugin) setReady() {
	p.Ready()
	p.readyOnce.Do(func() { close(p.ready) })
}

// Run connects the plugin to the runtime's NRI socket (DefaultNRISocket when
// socketPath is "") and serves it; when the connection goes away (the runtime
// restarted) or cannot be made, it connects again, waiting up to 5s between
// tries. It returns nil when ctx ends.
func (p *NRIPlugin) Run(ctx context.Context, socketPath string) error {
	if socketPath == "" {
		socketPath = DefaultNRISocket
	}
	wait := 100 * time.Millisecond
	for {
		connected := time.Now()
		s, err := stub.New(p, stub.WithPluginName(NRIPluginName), stub.WithPluginIdx(NRIPluginIndex),
			stub.WithSocketPath(socketPath), stub.WithLogger(nriLogger{p.Log}),
			stub.WithOnClose(func() { p.Log.V(1).Info("the runtime closed the NRI connection", "socket", socketPath) }))
		if err != nil {
			return fmt.Errorf("NRI plugin: %w", err)
		}
		err = s.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(connected) > time.Minute {
			wait = 100 * time.Millisecond // it was up for a while: a fresh restart
		}
		p.Log.Info("NRI connection ended; connecting again", "socket", socketPath, "reason", fmt.Sprint(err), "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// nriLogger routes the NRI library's logs to the plugin's logger (its info to
// V(1): the library reports every connection step).
type nriLogger struct{ log logr.Logger }

func (l nriLogger) Debugf(_ context.Context, format string, args ...any) {
	l.log.V(2).Info(fmt.Sprintf(format, args...))
}

func (l nriLogger) Infof(_ context.Context, format string, args ...any) {
	l.log.V(1).Info(fmt.Sprintf(format, args...))
}

func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	l.log.Info(fmt.Sprintf(format, args...))
}

func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	l.log.Error(nil, fmt.Sprintf(format, args...))
}
