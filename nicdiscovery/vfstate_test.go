package nicdiscovery_test

import (
	"net"
	"reflect"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/hwipam/hwipam/nicdiscovery"
)

// A PF's VFs as its netlink link reports them (IFLA_VFINFO_LIST): no SR-IOV
// hardware here, so the list is built as the kernel's mlx5 driver fills it.
func TestVFStates(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:3b:00:01")
	got := nicdiscovery.VFStatesOf([]netlink.VfInfo{
		{ID: 0, Mac: mac, Vlan: 100, Qos: 3, Spoofchk: true, Trust: 1, LinkState: netlink.VF_LINK_STATE_ENABLE},
		{ID: 1, Mac: make(net.HardwareAddr, 6), LinkState: netlink.VF_LINK_STATE_AUTO},
		{ID: 2, Spoofchk: true, LinkState: netlink.VF_LINK_STATE_DISABLE},
	})
	want := []nicdiscovery.VFState{
		{Index: 0, MAC: "02:00:00:3b:00:01", VLAN: 100, QoS: 3, SpoofCheck: true, Trust: true, LinkState: "enable"},
		{Index: 1, LinkState: "auto"}, // an unset (all-zero) MAC is no MAC
		{Index: 2, SpoofCheck: true, LinkState: "disable"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("VF states\n got %+v\nwant %+v", got, want)
	}
}
