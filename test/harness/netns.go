package harness

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// RequireRoot skips the test when it does not run as root: network namespaces, veth
// links and CNI plugins need CAP_NET_ADMIN and CAP_SYS_ADMIN.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("skipped: needs root for network namespaces (run `make test` as root)")
	}
}

// NetNS is a named network namespace made with `ip netns add`, visible to every
// process on the machine under /run/netns.
type NetNS struct {
	// Name is the name `ip netns` knows it by.
	Name string
	// Path is the bind-mounted namespace file, what CNI_NETNS takes.
	Path string
}

// NewNetNS creates a network namespace with a unique name and deletes it, with every
// link left in it, when the test ends. Its loopback is up.
func NewNetNS(tb testing.TB) *NetNS {
	tb.Helper()
	RequireRoot(tb)
	name := "hwt-" + randomSuffix(tb)
	run(tb, "ip", "netns", "add", name)
	ns := &NetNS{Name: name, Path: "/run/netns/" + name}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("deleting netns %s: %v: %s", name, err, out)
		}
	})
	run(tb, "ip", "-n", name, "link", "set", "lo", "up")
	return ns
}

// Handle opens a netlink handle that acts inside the namespace without moving the
// calling thread into it. It is closed when the test ends.
func (n *NetNS) Handle(tb testing.TB) *netlink.Handle {
	tb.Helper()
	nsh, err := netns.GetFromPath(n.Path)
	if err != nil {
		tb.Fatalf("opening netns %s: %v", n.Name, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		tb.Fatalf("netlink handle in netns %s: %v", n.Name, err)
	}
	tb.Cleanup(func() { _ = h.Close() })
	return h
}

// Addrs returns the addresses of interface ifName inside the namespace, of the given
// family (netlink.FAMILY_V4, FAMILY_V6 or FAMILY_ALL), as CIDR strings.
func (n *NetNS) Addrs(tb testing.TB, ifName string, family int) []string {
	tb.Helper()
	h := n.Handle(tb)
	link, err := h.LinkByName(ifName)
	if err != nil {
		tb.Fatalf("interface %s in netns %s: %v", ifName, n.Name, err)
	}
	addrs, err := h.AddrList(link, family)
	if err != nil {
		tb.Fatalf("addresses of %s in netns %s: %v", ifName, n.Name, err)
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, a.IPNet.String())
	}
	return out
}

// Exec runs a command inside the namespace (`ip netns exec`) and returns its combined
// output.
func (n *NetNS) Exec(name string, args ...string) ([]byte, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("in netns %s: %s %s: %w: %s", n.Name, name, strings.Join(args, " "), err, out)
	}
	return out, nil
}

// NewVethPair creates a veth pair with one end, aName, in namespace a and the other,
// bName, in namespace b, and sets both up.
func NewVethPair(tb testing.TB, a *NetNS, aName string, b *NetNS, bName string) {
	tb.Helper()
	bns, err := netns.GetFromPath(b.Path)
	if err != nil {
		tb.Fatalf("opening netns %s: %v", b.Name, err)
	}
	defer bns.Close()
	ha := a.Handle(tb)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(int(bns)),
	}
	if err := ha.LinkAdd(veth); err != nil {
		tb.Fatalf("creating veth %s (netns %s) <-> %s (netns %s): %v", aName, a.Name, bName, b.Name, err)
	}
	for _, side := range []struct {
		ns   *NetNS
		name string
	}{{a, aName}, {b, bName}} {
		h := side.ns.Handle(tb)
		link, err := h.LinkByName(side.name)
		if err != nil {
			tb.Fatalf("veth end %s in netns %s: %v", side.name, side.ns.Name, err)
		}
		if err := h.LinkSetUp(link); err != nil {
			tb.Fatalf("setting %s up in netns %s: %v", side.name, side.ns.Name, err)
		}
	}
}

func run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func randomSuffix(tb testing.TB) string {
	tb.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("random name: %v", err)
	}
	return hex.EncodeToString(b[:])
}
