package nicdra_test

import (
	"errors"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/test/harness"
)

// A host stand-in: the "host" and the "pod" are two fresh network namespaces,
// and the NIC port is one end of a veth pair (this kernel has no dummy links)
// whose other end sits in a third, the "wire".
type attachEnv struct {
	host, pod, wire *harness.NetNS
	att             *nicdra.Attacher
}

func newAttachEnv(t *testing.T, hostNetdev string, mtu int) *attachEnv {
	t.Helper()
	e := &attachEnv{host: harness.NewNetNS(t), pod: harness.NewNetNS(t), wire: harness.NewNetNS(t)}
	e.att = &nicdra.Attacher{HostNetNS: e.host.Path}
	if hostNetdev != "" {
		harness.NewVethPair(t, e.host, hostNetdev, e.wire, "peer0")
		if mtu > 0 {
			h := e.host.Handle(t)
			l, err := h.LinkByName(hostNetdev)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.LinkSetMTU(l, mtu); err != nil {
				t.Fatal(err)
			}
		}
	}
	return e
}

func railDevice() nicdra.PreparedDevice {
	return nicdra.PreparedDevice{Request: "nic", Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0",
		HostNetdev: "rail0", InterfaceName: "net1", Pools: []string{"rail0"}, PoolType: "ippool", Rail: "rail0",
		Addresses: []string{"10.25.0.4/24", "fd00:25::4/64"}, Gateway: "10.25.0.1",
		Routes: []string{"0.0.0.0/0", "10.30.0.0/16"}}
}

func link(t *testing.T, ns *harness.NetNS, name string) netlink.Link {
	t.Helper()
	l, err := ns.Handle(t).LinkByName(name)
	if err != nil {
		return nil
	}
	return l
}

// routes lists the link's routes as "dst via gw" ("dst" when on-link), the
// kernel's own (connected, link-local, multicast) left out.
func routes(t *testing.T, ns *harness.NetNS, name string) []string {
	t.Helper()
	h := ns.Handle(t)
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := h.RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.Protocol == unix.RTPROT_KERNEL || r.Protocol == unix.RTPROT_RA {
			continue // the kernel's own: connected, link-local
		}
		dst := "0.0.0.0/0"
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		if r.Gw != nil {
			dst += " via " + r.Gw.String()
		}
		out = append(out, dst)
	}
	slices.Sort(out)
	return out
}

// checkInPod checks the device's link in the pod: its name, addresses, routes
// and state, and that the host no longer has it.
func (e *attachEnv) checkInPod(t *testing.T, d nicdra.PreparedDevice) {
	t.Helper()
	l := link(t, e.pod, d.InterfaceName)
	if l == nil {
		t.Fatalf("no %s in the pod", d.InterfaceName)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s in the pod is not up", d.InterfaceName)
	}
	got := e.pod.Addrs(t, d.InterfaceName, netlink.FAMILY_ALL)
	slices.Sort(got)
	if want := []string{"10.25.0.4/24", "fd00:25::4/64"}; !slices.Equal(got, want) {
		t.Errorf("addresses in the pod: %v, want %v", got, want)
	}
	if got, want := routes(t, e.pod, d.InterfaceName), []string{"0.0.0.0/0 via 10.25.0.1", "10.30.0.0/16 via 10.25.0.1"}; !slices.Equal(got, want) {
		t.Errorf("routes in the pod: %v, want %v", got, want)
	}
	if link(t, e.host, d.HostNetdev) != nil {
		t.Errorf("%s is still on the host", d.HostNetdev)
	}
}

// checkOnHost checks the device is back on the host under its name, up or
// down as it was before the attach (down when that is not recorded), without
// addresses, with the MTU it had, and gone from the pod.
func (e *attachEnv) checkOnHost(t *testing.T, d nicdra.PreparedDevice, mtu int) {
	t.Helper()
	l := link(t, e.host, d.HostNetdev)
	if l == nil {
		t.Fatalf("%s is not back on the host", d.HostNetdev)
	}
	wantUp := d.HostUp != nil && *d.HostUp
	if up := l.Attrs().Flags&net.FlagUp != 0; up != wantUp {
		t.Errorf("%s on the host: up %v, want %v (as before the attach)", d.HostNetdev, up, wantUp)
	}
	if a := e.host.Addrs(t, d.HostNetdev, netlink.FAMILY_ALL); len(a) > 0 {
		t.Errorf("%s has addresses on the host: %v", d.HostNetdev, a)
	}
	if l.Attrs().MTU != mtu {
		t.Errorf("%s's MTU on the host is %d, want %d", d.HostNetdev, l.Attrs().MTU, mtu)
	}
	if link(t, e.pod, d.InterfaceName) != nil {
		t.Errorf("%s is still in the pod", d.InterfaceName)
	}
}

// Attach moves the veth into the pod as net1, with the pool's addresses and
// routes via the gateway, and records its host MAC and MTU; detach brings it
// back as rail0, down, flushed, its MTU restored although the pod changed it.
// Each twice, and the whole cycle twice.
func TestAttachDetach(t *testing.T) {
	e := newAttachEnv(t, "rail0", 9000)
	d := railDevice()
	mac := link(t, e.host, "rail0").Attrs().HardwareAddr.String()
	for cycle := range 2 {
		a, err := e.att.Attach(e.pod.Path, d)
		if err != nil {
			t.Fatalf("cycle %d: %v", cycle, err)
		}
		if a.Outcome != nicdra.Attached || a.MAC != mac || a.MTU != 9000 {
			t.Errorf("cycle %d: attach: %+v, want attached with MAC %s, MTU 9000", cycle, a, mac)
		}
		e.checkInPod(t, d)
		if a.RecordIn(&d); d.HostUp == nil || !*d.HostUp || d.PodIfIndex == 0 {
			t.Errorf("cycle %d: the attach recorded %+v, want the host link up and its ifindex in the pod", cycle, d)
		}
		if a, err = e.att.Attach(e.pod.Path, d); err != nil || a.Outcome != nicdra.AlreadyAttached {
			t.Fatalf("cycle %d: attach again: %+v, %v; want already-attached", cycle, a, err)
		}
		e.checkInPod(t, d)

		// The pod lowers the MTU: the host gets its own back.
		h := e.pod.Handle(t)
		if err := h.LinkSetMTU(link(t, e.pod, "net1"), 1400); err != nil {
			t.Fatal(err)
		}
		out, err := e.att.Detach(e.pod.Path, d)
		if err != nil || out != nicdra.Detached {
			t.Fatalf("cycle %d: detach: %q, %v; want detached", cycle, out, err)
		}
		e.checkOnHost(t, d, 9000)
		if out, err = e.att.Detach(e.pod.Path, d); err != nil || out != nicdra.AlreadyOnHost {
			t.Fatalf("cycle %d: detach again: %q, %v; want already-on-host", cycle, out, err)
		}
		e.checkOnHost(t, d, 9000)
	}
}

// The pod's namespace already holds a link named as the device is on the host
// (rail0), not as it is to be in the pod: the device moves in and is renamed in
// one step, so that name never has to be free.
func TestAttachHostNameTakenInPod(t *testing.T) {
	e := newAttachEnv(t, "rail0", 0)
	other := harness.NewNetNS(t)
	harness.NewVethPair(t, e.pod, "rail0", other, "x0")
	d := railDevice()
	if _, err := e.att.Attach(e.pod.Path, d); err != nil {
		t.Fatal(err)
	}
	e.checkInPod(t, d)
	if link(t, e.pod, "rail0") == nil {
		t.Error("the pod's own rail0 is gone")
	}
}

// With no route in the pool and no gateway (the gateway's own holder), the
// link gets its address and nothing else; an on-link route without a gateway
// goes straight through the link.
func TestAttachWithoutGateway(t *testing.T) {
	e := newAttachEnv(t, "rail0", 0)
	d := railDevice()
	d.Addresses, d.Gateway, d.Routes = []string{"10.25.0.1/24"}, "", []string{"10.31.0.0/16"}
	if _, err := e.att.Attach(e.pod.Path, d); err != nil {
		t.Fatal(err)
	}
	if got := routes(t, e.pod, "net1"); !slices.Equal(got, []string{"10.31.0.0/16"}) {
		t.Errorf("routes: %v, want the on-link 10.31.0.0/16 only", got)
	}
	d.Routes = nil
	d2 := d
	d2.HostNetdev, d2.InterfaceName, d2.Device = "rail1", "net2", "pci-0000-19-00-0"
	harness.NewVethPair(t, e.host, "rail1", e.wire, "peer1")
	if _, err := e.att.Attach(e.pod.Path, d2); err != nil {
		t.Fatal(err)
	}
	if got := routes(t, e.pod, "net2"); len(got) != 0 {
		t.Errorf("routes of a device without routes: %v, want none (a gateway alone adds no default route)", got)
	}
}

// The pod's namespace is deleted while the device is in it (the runtime tore
// the sandbox down without StopPodSandbox, or the driver was down then): a
// veth is destroyed with the namespace, its peer with it, and detach reports
// it gone without an error. (A physical function is not destroyed: the kernel
// hands it back to the initial namespace, see TestDetachReturnedByKernel.)
func TestDetachAfterNetNSDeleted(t *testing.T) {
	e := newAttachEnv(t, "", 0)
	harness.NewVethPair(t, e.host, "rail0", e.wire, "peer0")
	pod := "hwt-gone-" + strings.ReplaceAll(t.Name(), "/", "-")[len("TestDetach"):]
	if out, err := exec.Command("ip", "netns", "add", pod).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", pod).Run() })
	d := railDevice()
	a, err := e.att.Attach("/run/netns/"+pod, d)
	if err != nil {
		t.Fatal(err)
	}
	a.RecordIn(&d)
	if out, err := exec.Command("ip", "netns", "del", pod).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := e.att.Detach("/run/netns/"+pod, d)
	if err != nil || out != nicdra.Gone {
		t.Fatalf("detach: %q, %v; want gone, no error", out, err)
	}
	if link(t, e.host, "rail0") != nil {
		t.Error("rail0 is on the host")
	}
	// The namespace is destroyed asynchronously, and the veth's peer with it.
	deadline := time.Now().Add(5 * time.Second)
	for link(t, e.wire, "peer0") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the veth's peer is still there 5s after the namespace was deleted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Attaching into a namespace that is gone says so.
	if _, err := e.att.Attach("/run/netns/"+pod, d); !errors.Is(err, nicdra.ErrNetNSGone) {
		t.Errorf("attach into a deleted namespace: %v, want ErrNetNSGone", err)
	}
}

// A physical function outlives its pod's namespace: the kernel moves it back
// to the initial namespace under its pod name (or devN on a clash). Detach,
// finding the namespace gone, finds it by its recorded MAC and renames it
// back. Here a veth on the "host" named net1 stands for the returned port.
func TestDetachReturnedByKernel(t *testing.T) {
	e := newAttachEnv(t, "net1", 9000)
	l := link(t, e.host, "net1")
	h := e.host.Handle(t)
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 25, 0, 4), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	d := railDevice()
	d.MAC, d.MTU = l.Attrs().HardwareAddr.String(), 9000
	out, err := e.att.Detach("/run/netns/hwt-no-such-namespace", d)
	if err != nil || out != nicdra.ReturnedByKernel {
		t.Fatalf("detach: %q, %v; want returned-by-kernel", out, err)
	}
	e.checkOnHost(t, d, 9000)
	if link(t, e.host, "net1") != nil {
		t.Error("net1 is still on the host")
	}
	if out, err := e.att.Detach("/run/netns/hwt-no-such-namespace", railDevice()); err != nil || out != nicdra.AlreadyOnHost {
		t.Errorf("detach again: %q, %v; want already-on-host", out, err)
	}
}

// A pod's namespace went away without StopPodSandbox reaching the plugin, and
// no unprepare came: the kernel returned the port under its pod name. The
// runtime then starts a new sandbox for the pod: the attach finds the port by
// its recorded identity (here its MAC: a veth on the "host" named net1 stands
// for the returned port), as the detach does, not only by its host name, and
// moves it in. It used to fail with "no netdev rail0 on the host", and the pod
// never started again (issue 45, item 10).
func TestAttachFindsAPortReturnedUnderItsPodName(t *testing.T) {
	e := newAttachEnv(t, "net1", 9000)
	l := link(t, e.host, "net1")
	d := railDevice()
	d.MAC, d.MTU, d.PodIfIndex = l.Attrs().HardwareAddr.String(), 9000, 4242 // as the first sandbox's attach recorded
	a, err := e.att.Attach(e.pod.Path, d)
	if err != nil {
		t.Fatalf("attach into the pod's new sandbox: %v", err)
	}
	if a.Outcome != nicdra.Attached || a.MAC != d.MAC {
		t.Errorf("attach: %+v", a)
	}
	e.checkInPod(t, d)
	if link(t, e.host, "net1") != nil {
		t.Error("net1 is still on the host")
	}
	// A link of another identity under another name is never taken.
	other := newAttachEnv(t, "net7", 9000)
	if _, err := other.att.Attach(other.pod.Path, railDevice()); !errors.Is(err, nicdra.ErrNetdevMissing) {
		t.Errorf("attach with nothing of the device's identity on the host: %v, want ErrNetdevMissing", err)
	}
}

func TestAttachErrors(t *testing.T) {
	t.Run("netdev missing", func(t *testing.T) {
		e := newAttachEnv(t, "", 0)
		_, err := e.att.Attach(e.pod.Path, railDevice())
		if !errors.Is(err, nicdra.ErrNetdevMissing) || !strings.Contains(err.Error(), "no netdev rail0 on the host") {
			t.Fatalf("got %v, want ErrNetdevMissing naming rail0", err)
		}
		t.Log(err)
	})
	t.Run("name taken in the pod", func(t *testing.T) {
		e := newAttachEnv(t, "rail0", 0)
		other := harness.NewNetNS(t)
		harness.NewVethPair(t, e.pod, "net1", other, "x0")
		_, err := e.att.Attach(e.pod.Path, railDevice())
		if !errors.Is(err, nicdra.ErrNameClash) || !strings.Contains(err.Error(), "already has an interface named net1") {
			t.Fatalf("got %v, want ErrNameClash naming net1", err)
		}
		t.Log(err)
		if link(t, e.host, "rail0") == nil {
			t.Error("rail0 left the host although the attach failed before moving it")
		}
	})
	t.Run("another device by that name in the pod", func(t *testing.T) {
		e := newAttachEnv(t, "", 0)
		other := harness.NewNetNS(t)
		harness.NewVethPair(t, e.pod, "net1", other, "x0")
		d := railDevice()
		d.MAC = "02:00:00:00:00:01"
		_, err := e.att.Attach(e.pod.Path, d)
		if !errors.Is(err, nicdra.ErrNameClash) || !strings.Contains(err.Error(), "not the device (PCI 0000:18:00.0, MAC 02:00:00:00:00:01)") {
			t.Fatalf("got %v, want ErrNameClash naming the MACs", err)
		}
		t.Log(err)
	})
	t.Run("default route taken in the pod", func(t *testing.T) {
		e := newAttachEnv(t, "rail0", 0)
		other := harness.NewNetNS(t)
		harness.NewVethPair(t, e.pod, "eth0", other, "x0")
		if _, err := e.pod.Exec("ip", "addr", "add", "192.168.7.2/24", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pod.Exec("ip", "route", "add", "default", "via", "192.168.7.1"); err != nil {
			t.Fatal(err)
		}
		d := railDevice()
		a, err := e.att.Attach(e.pod.Path, d)
		if !errors.Is(err, nicdra.ErrNameClash) || !strings.Contains(err.Error(), "defaultGateway false") {
			t.Fatalf("got %v, want ErrNameClash about the default route", err)
		}
		if a.Outcome != nicdra.Attached {
			t.Errorf("outcome %q, want attached: the device moved before the route failed", a.Outcome)
		}
		a.RecordIn(&d)
		t.Log(err)
		// The device went in; detach brings it back.
		if out, err := e.att.Detach(e.pod.Path, d); err != nil || out != nicdra.Detached {
			t.Fatalf("detach: %q, %v", out, err)
		}
		if link(t, e.host, "rail0") == nil {
			t.Error("rail0 not back on the host")
		}
	})
	t.Run("bad record", func(t *testing.T) {
		e := newAttachEnv(t, "rail0", 0)
		d := railDevice()
		d.Addresses = []string{"10.25.0.4"}
		_, err := e.att.Attach(e.pod.Path, d)
		if err == nil || !strings.Contains(err.Error(), `address "10.25.0.4" is not an address with a prefix length`) {
			t.Fatalf("got %v", err)
		}
		if link(t, e.host, "rail0") == nil {
			t.Error("rail0 left the host for a record that cannot be applied")
		}
	})
	t.Run("route without its family's gateway", func(t *testing.T) {
		e := newAttachEnv(t, "rail0", 0)
		d := railDevice()
		d.Routes = append(d.Routes, "::/0")
		_, err := e.att.Attach(e.pod.Path, d)
		if err == nil || !strings.Contains(err.Error(), "route ::/0 has no gateway of its family") {
			t.Fatalf("got %v", err)
		}
		t.Log(err)
		if link(t, e.host, "rail0") == nil {
			t.Error("rail0 left the host for a record that cannot be applied")
		}
	})
	t.Run("no netdev", func(t *testing.T) {
		e := newAttachEnv(t, "", 0)
		d := railDevice()
		d.HostNetdev = ""
		if a, err := e.att.Attach(e.pod.Path, d); err != nil || a.Outcome != nicdra.NoNetdev {
			t.Fatalf("got %+v, %v", a, err)
		}
		if out, err := e.att.Detach(e.pod.Path, d); err != nil || out != nicdra.NothingToDetach {
			t.Fatalf("got %q, %v", out, err)
		}
	})
}
