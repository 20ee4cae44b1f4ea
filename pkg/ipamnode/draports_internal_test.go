package ipamnode

import (
	"testing"

	"github.com/hwipam/hwipam/test/harness"
)

// TestHostPortsFindsTheUplink: in a fresh network namespace standing in for
// the host's, the links that carry an address, the default route, a static
// route, or are a bridge port of a bridge with an address are found, each with
// why; a link with only its IPv6 link-local address, and the veth peers that
// carry nothing, are not.
func TestHostPortsFindsTheUplink(t *testing.T) {
	ns := harness.NewNetNS(t)
	for _, pair := range [][2]string{{"up0", "up1"}, {"gw0", "gw1"}, {"rt0", "rt1"}, {"ll0", "ll1"}, {"sl0", "sl1"}} {
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
		"up0": "carries the host address 192.0.2.10/24",
		"gw0": "carries the host's default route",
		"rt0": "carries the host's route to 203.0.113.0/24",
		"br0": "carries the host address 2001:db8::5/64",
		"sl0": "is enslaved to br0, which carries the host address 2001:db8::5/64",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	for _, name := range []string{"ll0", "up1", "gw1", "rt1", "ll1", "sl1", "lo"} {
		if why, ok := got[name]; ok {
			t.Errorf("%s is called an uplink: %s", name, why)
		}
	}
	if t.Failed() {
		t.Logf("found: %v", got)
	}
}
