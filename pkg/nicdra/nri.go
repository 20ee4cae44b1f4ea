package nicdra

import (
	"context"
	"errors"
	"fmt"
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
// each container, whose adjustment adds the devices' RDMA character devices.
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
	// DeviceAttached is told a device's MAC address and MTU on the host (set
	// in d) once it has moved into the pod: record them with the device, so
	// that the MTU is restored when it comes back (PodDevices returns them
	// then) and the claim's networkData can show the MAC.
	DeviceAttached(podUID string, d PreparedDevice)
}

// NRIPlugin is the driver's NRI plugin.
type NRIPlugin struct {
	Devices  PodDevices
	Attacher *Attacher
	// SysfsRoot is the directory holding sys/ ("/" on a node).
	SysfsRoot string
	Log       logr.Logger
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
// one fails, those it attached go back to the host and the error, which
// fails the sandbox (the kubelet retries it), says which device and why.
func (p *NRIPlugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	if err := refusal(p.Devices, pod.GetUid()); err != nil {
		return fmt.Errorf("%s: pod %s: %w", DriverName, podName(pod), err)
	}
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
	for i, d := range devs {
		a, err := p.Attacher.Attach(path, d)
		if err != nil {
			if a.Outcome == Attached {
				d.MAC, d.MTU = a.MAC, a.MTU
				devs[i] = d
			}
			for _, back := range devs[:i+1] {
				if out, derr := p.Attacher.Detach(path, back); derr != nil {
					err = errors.Join(err, derr)
				} else {
					log.V(1).Info("device back on the host after a failed attach", "device", back.Device, "outcome", out)
				}
			}
			return fmt.Errorf("%s: pod %s: %w", DriverName, podName(pod), err)
		}
		if a.Outcome == Attached {
			d.MAC, d.MTU = a.MAC, a.MTU
			p.Devices.DeviceAttached(pod.GetUid(), d)
		}
		log.V(1).Info("device attached", "device", d.Device, "hostNetdev", d.HostNetdev, "ifName", d.InterfaceName, "outcome", a.Outcome)
	}
	log.Info("devices attached", "devices", len(devs), "took", time.Since(start))
	return nil
}

// StopPodSandbox detaches the pod's devices back to the host. Every device is
// tried; the error (which containerd only logs) names those that failed.
func (p *NRIPlugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.detach(pod, "stop")
}

// RemovePodSandbox detaches what a StopPodSandbox left (it finds nothing to
// do when that ran); its namespace may be gone by then.
func (p *NRIPlugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.detach(pod, "remove")
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

// CreateContainer gives the container the RDMA character devices of the
// pod's devices (RDMACharDevices; rdma_cm once). A device whose numbers
// cannot be read fails the container with the reason.
func (p *NRIPlugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	devs := p.Devices.PodDevices(pod.GetUid())
	if len(devs) == 0 {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	seen := map[string]bool{}
	for _, d := range devs {
		chars, err := RDMACharDevices(p.SysfsRoot, d.PCIAddress)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: pod %s, container %s, device %s: %w", DriverName, podName(pod), ctr.GetName(), d.Device, err)
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
// they would fail the registration, and with it every later pod.
func (p *NRIPlugin) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, pod := range pods {
		devs := p.Devices.PodDevices(pod.GetUid())
		path := podNetNS(pod)
		if len(devs) == 0 || path == "" {
			continue
		}
		for _, d := range devs {
			a, err := p.Attacher.Attach(path, d)
			if err != nil {
				p.Log.Error(err, "attaching a device of a running pod", "pod", podName(pod), "device", d.Device)
				continue
			}
			if a.Outcome == Attached {
				d.MAC, d.MTU = a.MAC, a.MTU
				p.Devices.DeviceAttached(pod.GetUid(), d)
				p.Log.Info("device of a running pod attached late", "pod", podName(pod), "device", d.Device)
			}
		}
	}
	return nil, nil
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
