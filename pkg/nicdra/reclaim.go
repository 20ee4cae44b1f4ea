package nicdra

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/go-logr/logr"

	"github.com/hwipam/hwipam/nicdiscovery"
)

// A port must be where the driver can find it, under its own name, for a
// claim to get it, and it must come back there when its claim ends, whatever
// runtime events were missed. A StopPodSandbox that never reached the driver
// (ipam-node down while the pod stopped) leaves a physical port on the host
// under its pod name (net1, or devN on a clash): the kubelet then unprepares
// the claim, and no sandbox event comes again. So Unprepare, and the driver's
// start for the claims it holds, reclaim each port: found by its identity,
// renamed back, flushed, in its admin state from before the claim.

// ReclaimFunc is a Preparer's Reclaim on the attacher: a port on the host
// under another name is renamed back (logged); a port that is on the host
// nowhere is ErrNetdevMissing, saying where to look (it is in a namespace
// that outlived its pod, its addresses maybe still up there: Unprepare keeps
// them held, ErrPortsHeld, and a later prepare of the device is refused until
// it is back, CheckNetdev); any other error (another link has the port's
// name) fails the Unprepare, and the kubelet retries.
func ReclaimFunc(a *Attacher, log logr.Logger) func(PreparedDevice) error {
	return func(d PreparedDevice) error {
		out, err := a.Reclaim(d)
		switch {
		case err != nil:
			return err
		case out == ReturnedByKernel:
			log.Info("a port left under its pod name (a StopPodSandbox the driver missed) is back under its own name",
				"device", d.Device, "hostNetdev", d.HostNetdev)
		}
		return nil
	}
}

// ReclaimAll reclaims the ports of every claim this node prepared (Reclaim):
// at the driver's start, before the runtime's events are served, a port whose
// pod stopped while the driver was down gets its name back. Ports in live
// pods are not on the host and are left alone. Errors are logged.
func (p *Preparer) ReclaimAll(log logr.Logger) {
	if p.Reclaim == nil {
		return
	}
	claims, err := p.Claims()
	if err != nil {
		return // the driver reports the checkpoint's error
	}
	for uid, pc := range claims {
		for _, d := range pc.Devices {
			if err := p.Reclaim(d); err != nil {
				log.Error(err, "reclaiming a claim's port at start", "claim", pc.Namespace+"/"+pc.Name, "uid", uid,
					"device", d.Device)
			}
		}
	}
}

// afterReboot drops what the attach recorded of namespaces and host links
// before the node rebooted (every netdev is back on the host under the name
// udev gives it, every pod namespace is gone): the ifindex in the pod and the
// admin state from before the claim, which the next attach records again. The
// host netdev is read again from the inventory by PCI address (udev may name
// it otherwise now).
func (c *Checkpoint) afterReboot(inv *nicdiscovery.Inventory) {
	for uid, pc := range c.Claims {
		for i := range pc.Devices {
			d := &pc.Devices[i]
			d.PodIfIndex, d.HostUp = 0, nil
			if inv == nil {
				continue
			}
			j := slices.IndexFunc(inv.NICs, func(n nicdiscovery.NIC) bool { return n.PCIAddress == d.PCIAddress })
			if j >= 0 && len(inv.NICs[j].Netdevs) > 0 && d.HostNetdev != "" {
				d.HostNetdev = inv.NICs[j].Netdevs[0]
			}
		}
		c.Claims[uid] = pc
	}
}

// CheckNetdev refuses a NIC function that shows no netdev but should have
// one: an Ethernet function (a bound driver and no InfiniBand port: its
// netdev is its port), or an InfiniBand one while IPoIB is loaded (ib_ipoib
// gives every InfiniBand port a netdev). Its netdev is then in another
// network namespace (a pod's, or one that outlived its pod), and handing the
// device out would give a claim a port that no attach can find. A function
// that truly has no netdev (an InfiniBand port without IPoIB: RDMA only), an
// unbound one, and a scan that cannot see the host's netdevs pass.
func CheckNetdev(inv *nicdiscovery.Inventory, n nicdiscovery.NIC) error {
	if len(n.Netdevs) > 0 || n.Driver == "" || inv == nil || inv.NetdevsHidden {
		return nil
	}
	ib := slices.ContainsFunc(n.Ports, func(p nicdiscovery.Port) bool { return p.LinkLayer == nicdiscovery.LinkLayerInfiniBand })
	if ib {
		if _, err := os.Stat(filepath.Join(inv.Root, "sys", "module", "ib_ipoib")); err != nil {
			return nil // no IPoIB: an RDMA-only port
		}
	}
	return fmt.Errorf("%w: NIC function %s (%s, driver %s) has no netdev on the host although it should: it is in "+
		"another network namespace, a pod's or one that outlived its pod (find it: ip -all netns exec ip -d link; "+
		"lsns -t net), and moving it back to the host under its name makes the device available again",
		ErrNetdevMissing, n.PCIAddress, n.Model, n.Driver)
}
