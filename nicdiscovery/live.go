package nicdiscovery

import (
	"net"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// addLive fills in what only the running kernel knows precisely: each netdev's
// operstate, MTU, MAC and addresses from rtnetlink, and each PF's eswitch mode
// from devlink. Failures (no devlink family, a netdev gone since the sysfs read)
// leave the sysfs values.
func addLive(nics []NIC, log logr.Logger) {
	for i := range nics {
		n := &nics[i]
		if n.Function == FunctionPF && n.Driver == "mlx5_core" {
			if dev, err := netlink.DevLinkGetDeviceByName("pci", n.PCIAddress); err == nil && dev.Attrs.Eswitch.Mode != "" {
				n.EswitchMode = dev.Attrs.Eswitch.Mode
			} else if err != nil {
				log.V(1).Info("devlink did not answer", "address", n.PCIAddress, "error", err.Error())
			}
		}
		for j := range n.Ports {
			p := &n.Ports[j]
			if p.Netdev == "" || p.NetdevFrom != "" {
				// A netdev named by the GID table is in another network namespace:
				// a link of that name here would be another one.
				continue
			}
			link, err := netlink.LinkByName(p.Netdev)
			if err != nil {
				log.V(1).Info("netlink: no such link", "netdev", p.Netdev, "error", err.Error())
				continue
			}
			a := link.Attrs()
			p.OperState = a.OperState.String()
			up, carrier := a.RawFlags&unix.IFF_UP != 0, a.RawFlags&unix.IFF_LOWER_UP != 0
			p.AdminUp, p.Carrier = &up, &carrier
			p.MTU = a.MTU
			if n.Function == FunctionPF && j == 0 && len(a.Vfs) > 0 {
				n.VFStates = vfStates(a.Vfs)
			}
			if len(a.HardwareAddr) > 0 {
				p.MAC = a.HardwareAddr.String()
			}
			addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
			if err != nil {
				continue
			}
			p.Addresses = p.Addresses[:0]
			for _, ad := range addrs {
				p.Addresses = append(p.Addresses, ad.IPNet.String())
			}
		}
	}
}

// vfStates converts the VF list a PF's link reports.
func vfStates(vfs []netlink.VfInfo) []VFState {
	out := make([]VFState, 0, len(vfs))
	for _, v := range vfs {
		st := VFState{Index: v.ID, VLAN: v.Vlan, QoS: v.Qos, SpoofCheck: v.Spoofchk, Trust: v.Trust != 0,
			LinkState: vfLinkState(v.LinkState)}
		if len(v.Mac) > 0 && !isZeroMAC(v.Mac) {
			st.MAC = v.Mac.String()
		}
		out = append(out, st)
	}
	return out
}

func vfLinkState(s uint32) string {
	switch s {
	case netlink.VF_LINK_STATE_AUTO:
		return "auto"
	case netlink.VF_LINK_STATE_ENABLE:
		return "enable"
	case netlink.VF_LINK_STATE_DISABLE:
		return "disable"
	}
	return "unknown"
}

func isZeroMAC(m net.HardwareAddr) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}
