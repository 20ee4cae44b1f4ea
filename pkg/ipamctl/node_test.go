package ipamctl_test

import (
	"bytes"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/test/harness"
)

// serve runs the real node service with one pool and one allocation.
func serve(t *testing.T) string {
	t.Helper()
	start, end := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.8")
	sock, m := harness.ServeNode(t, &nodealloc.PoolConfig{Name: "rail0", Kind: v1alpha1.KindIPPool,
		Prefix: netip.MustParsePrefix("10.1.0.0/24"), Block: iprange.Range{Start: start, End: end}, ExclusionBase: start, Gateway: start,
		Exclusions: []iprange.Range{{Start: netip.MustParseAddr("10.1.0.6"), End: netip.MustParseAddr("10.1.0.20")}}})
	if _, err := m.Allocate(t.Context(), &nodealloc.Request{Pools: []string{"rail0"}, ContainerID: "0123456789abcdef", IfName: "net1",
		Meta: nodealloc.Metadata{PodName: "trainer-0", PodNamespace: "ml", DeviceID: "0000:3b:00.2", Network: "rail0-net"}}); err != nil {
		t.Fatal(err)
	}
	return sock
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := ipamctl.Run(t.Context(), ipamctl.Options{Args: args, Stdout: &out, Stderr: &errOut})
	return out.String(), err
}

func TestPoolsAndAllocations(t *testing.T) {
	sock := serve(t)
	out, err := run(t, "pools", "--socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"POOL", "rail0", "IPPool", "10.1.0.1-10.1.0.8", "10.1.0.0/24", "true"} {
		if !strings.Contains(out, want) {
			t.Errorf("pools output lacks %q:\n%s", want, out)
		}
	}
	// POOL KIND RAIL BLOCK PREFIX GATEWAY SIZE USED FREE ORPHANS EXCLUDED ACTIVE (a daemon
	// without rails: "-")
	if fields := strings.Fields(strings.Split(out, "\n")[1]); len(fields) != 12 || fields[2] != "-" || fields[6] != "8" ||
		fields[7] != "1" || fields[8] != "3" || fields[9] != "0" || fields[10] != "10.1.0.6-10.1.0.8" {
		t.Errorf("pools row = %v, want size 8, 1 used, 3 free (8 minus the gateway, the 3 excluded and one), "+
			"no orphans, the exclusion's part in the block", fields)
	}
	out, err = run(t, "pools", "--socket", sock, "-o", "yaml")
	if err != nil || !strings.Contains(out, "- 10.1.0.6-10.1.0.8\n") || !strings.Contains(out, "orphans: \"0\"") {
		t.Errorf("pools -o yaml (%v):\n%s", err, out)
	}
	out, err = run(t, "allocations", "--socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NETWORK", "10.1.0.2", "rail0-net", "ml/trainer-0", "0123456789ab", "net1", "0000:3b:00.2"} {
		if !strings.Contains(out, want) {
			t.Errorf("allocations output lacks %q:\n%s", want, out)
		}
	}
	out, err = run(t, "allocations", "--socket", sock, "-o", "json")
	if err != nil || !strings.Contains(out, `"podName": "trainer-0"`) {
		t.Errorf("allocations -o json = %v\n%s", err, out)
	}
}

func TestUnreachableDaemon(t *testing.T) {
	_, err := run(t, "pools", "--socket", "unix://"+filepath.Join(t.TempDir(), "none.sock"), "--timeout", "500ms")
	if err == nil || !strings.Contains(err.Error(), "is it running on this node") {
		t.Errorf("pools against no daemon = %v", err)
	}
	if _, err := run(t, "pools", "-o", "xml"); err == nil || !strings.Contains(err.Error(), "--output") {
		t.Errorf("bad -o = %v", err)
	}
}
