package ipamnode

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/hwipam/hwipam/test/harness"
)

// TestHostPortsFindsTheUplink: in a fresh network namespace standing in for
// the host's, the links that carry an address, the default route, a static
// route, or are a bridge port of a bridge with an address are found, each with
// why; a link with only its IPv6 link-local address, and the veth peers that
// carry nothing, are not.
func TestHostPortsFindsTheUplink(t *testing.T) {
	ns := harness.NewNetNS(t)
	for _, pair := range [][2]string{{"up0", "up1"}, {"gw0", "gw1"}, {"rt0", "rt1"}, {"ll0", "ll1"}, {"sl0", "sl1"},
		{"mv0", "mv1"}, {"deep0", "deep1"}, {"free0", "free1"}} {
		harness.NewVethPair(t, ns, pair[0], ns, pair[1])
	}
	for _, args := range [][]string{
		{"addr", "add", "192.0.2.10/24", "dev", "up0"},
		{"route", "add", "default", "dev", "gw0"},
		{"route", "add", "203.0.113.0/24", "dev", "rt0"},
		{"link", "add", "br0", "type", "bridge"},
		{"link", "set", "sl0", "master", "br0"},
		{"link", "set", "br0", "up"},
		{"addr", "add", "2001:db8::5/64", "dev", "br0"},
		// A host macvlan on a port, with the node's address (issue 45, item 2).
		{"link", "add", "mvhost", "link", "mv0", "type", "macvlan", "mode", "bridge"},
		{"addr", "add", "198.51.100.7/24", "dev", "mvhost"},
		// Two levels: a port in a bridge that has no address, the bridge
		// carrying a macvlan that has one.
		{"link", "add", "br1", "type", "bridge"},
		{"link", "set", "deep0", "master", "br1"},
		{"link", "add", "mvdeep", "link", "br1", "type", "macvlan", "mode", "bridge"},
		{"addr", "add", "198.51.100.9/24", "dev", "mvdeep"},
		// A macvlan without any address leaves its port free.
		{"link", "add", "mvfree", "link", "free0", "type", "macvlan", "mode", "bridge"},
	} {
		if out, err := ns.Exec("ip", args...); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	got, err := hostPorts(ns.Handle(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"up0":   "carries the host address 192.0.2.10/24",
		"gw0":   "carries the host's default route",
		"rt0":   "carries the host's route to 203.0.113.0/24",
		"br0":   "carries the host address 2001:db8::5/64",
		"sl0":   "is enslaved to br0, which carries the host address 2001:db8::5/64",
		"mv0":   "has mvhost (macvlan) on it, which carries the host address 198.51.100.7/24",
		"deep0": "is below mvdeep (deep0 → br1 → mvdeep), which carries the host address 198.51.100.9/24",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	for _, name := range []string{"ll0", "up1", "gw1", "rt1", "ll1", "sl1", "lo", "mv1", "deep1", "free0", "free1", "mvfree"} {
		if why, ok := got[name]; ok {
			t.Errorf("%s is called an uplink: %s", name, why)
		}
	}
	if t.Failed() {
		t.Logf("found: %v", got)
	}
}

// Links the test machine cannot make (a VLAN, Open vSwitch), as netlink
// describes them: a port under a bond under a VLAN with the host's address is
// the host's; a port of Open vSwitch is withheld, saying why; a veth's peer
// (its link) is not stacked on it (issue 45, item 2).
func TestUplinksThroughEveryUpperDevice(t *testing.T) {
	attrs := func(name string, index, master, parent int) netlink.LinkAttrs {
		return netlink.LinkAttrs{Name: name, Index: index, MasterIndex: master, ParentIndex: parent}
	}
	links := []netlink.Link{
		&netlink.Device{LinkAttrs: attrs("ens1f0", 2, 10, 0)},
		&netlink.Bond{LinkAttrs: attrs("bond0", 10, 0, 0)},
		&netlink.Vlan{LinkAttrs: attrs("bond0.100", 11, 0, 10), VlanId: 100},
		&netlink.Device{LinkAttrs: attrs("ens2f0", 3, 20, 0)},
		&netlink.GenericLink{LinkAttrs: attrs("ovs-system", 20, 0, 0), LinkType: "openvswitch"},
		&netlink.GenericLink{LinkAttrs: attrs("br-ex", 21, 0, 0), LinkType: "openvswitch"},
		&netlink.Veth{LinkAttrs: attrs("veth0", 4, 0, 5)},
		&netlink.Veth{LinkAttrs: attrs("veth1", 5, 0, 4)},
		&netlink.Device{LinkAttrs: attrs("ens3f0", 6, 0, 0)},
	}
	why := map[int]string{11: "carries the host address 10.0.0.5/24", 21: "carries the host address 192.168.1.5/24",
		5: "carries the host address 10.9.9.9/24"}
	got := uplinks(links, why)
	if want := "is below bond0.100 (ens1f0 → bond0 → bond0.100), which carries the host address 10.0.0.5/24"; got["ens1f0"] != want {
		t.Errorf("ens1f0: %q, want %q", got["ens1f0"], want)
	}
	if !strings.Contains(got["ens2f0"], "Open vSwitch") || !strings.Contains(got["ens2f0"], "ovs-system") {
		t.Errorf("ens2f0, a port of OVS: %q", got["ens2f0"])
	}
	for _, name := range []string{"veth0", "ens3f0"} {
		if why, ok := got[name]; ok {
			t.Errorf("%s is called the host's: %s", name, why)
		}
	}
}
