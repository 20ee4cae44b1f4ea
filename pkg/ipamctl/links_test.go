package ipamctl_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/harness"
)

// linkRow is the LINKS table's row of netdev, split into fields.
func linkRow(t *testing.T, out, netdev string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == netdev {
			return f
		}
	}
	t.Fatalf("no link row for %s in:\n%s", netdev, out)
	return nil
}

// nics reads each port's link from netlink: a veth pair stands in for a ConnectX
// PF's netdev (same name in the tree), and its admin state, carrier, MTU and
// addresses follow what is done to the real link; the label and rail columns say
// what the port is published as.
func TestNicsLinkState(t *testing.T) {
	harness.RequireRoot(t)
	name := fmt.Sprintf("hwl%d", os.Getpid()%100000)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1500}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	tree, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.Add(fakesysfs.Function{Address: "0000:3b:00.0", Vendor: fakesysfs.VendorNVIDIA, Device: fakesysfs.DeviceCX6Dx,
		Class: fakesysfs.ClassEthernet, Driver: "mlx5_core", NUMA: 0, TotalVFs: 8,
		Netdevs: []fakesysfs.Netdev{{Name: name, Type: 1, Speed: 100000, OperState: "up", MTU: 9000, MAC: "0c:42:a1:00:00:01"}}}); err != nil {
		t.Fatal(err)
	}
	rails := filepath.Join(t.TempDir(), "rails.yaml")
	if err := os.WriteFile(rails, []byte("fe0: [\"0000:3b:00.0\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nics := func() string {
		t.Helper()
		out, err := run(t, "nics", "--sysfs-root", tree.Root, "--live", "--rail-config", rails)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// NETDEV PCI PORT ADMIN OPER CARRIER MTU MAC SPEED ADDRESSES LABEL RAILS
	row := linkRow(t, nics(), name)
	if row[3] != "down" || row[5] != "no" || row[6] != "1500" || row[9] != "-" || row[10] != "nic.hwipam.io/"+name || row[11] != "fe0" {
		t.Errorf("a new veth: %v", row)
	}
	if err := netlink.LinkSetMTU(veth, 4000); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.97.0.1/24")
	if err := netlink.AddrAdd(veth, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	row = linkRow(t, nics(), name)
	if row[3] != "up" || row[5] != "yes" || row[6] != "4000" || !strings.HasPrefix(row[9], "10.97.0.1/24") {
		t.Errorf("the veth up, both ends, MTU 4000, an address: %v", row)
	}
	if err := netlink.LinkSetDown(peer); err != nil {
		t.Fatal(err)
	}
	row = linkRow(t, nics(), name)
	if row[3] != "up" || row[5] != "no" {
		t.Errorf("the veth up, its peer down (no carrier): %v", row)
	}

	// JSON and YAML carry the same, with the port's label.
	js, err := run(t, "nics", "--sysfs-root", tree.Root, "--live", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	ym, err := run(t, "nics", "--sysfs-root", tree.Root, "--live", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	var a, b map[string]any
	if err := json.Unmarshal([]byte(js), &a); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(ym), &b); err != nil {
		t.Fatal(err)
	}
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	if !bytes.Equal(aj, bj) || !strings.Contains(js, `"carrier": false`) || !strings.Contains(js, `"adminUp": true`) ||
		!strings.Contains(js, `"key": "nic.hwipam.io/`+name+`"`) {
		t.Errorf("json and yaml differ or lack the link state:\n%s\n%s", js, ym)
	}
}
