package ipamctl_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// After a pool edit that moves the node's block, `ipamctl pools` counts the
// address left in the old block as an orphan only: IPS USED and IPS FREE are
// both of the new block. Exclusions that overlap (the pool's and a per-node
// one) show merged. `allocations --pool` takes a CIDRPool's plain name, says
// when a name is both kinds' (--pool-type decides) or unknown, and -o json gives
// createTime in RFC 3339.
func TestPoolEditOrphansAndPoolLookup(t *testing.T) {
	a := netip.MustParseAddr
	ip := &nodealloc.PoolConfig{Name: "net3", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.3.0.0/24"),
		Block: iprange.Range{Start: a("10.3.0.1"), End: a("10.3.0.16")}, ExclusionBase: a("10.3.0.0"),
		Exclusions: []iprange.Range{{Start: a("10.3.0.2"), End: a("10.3.0.9")}, {Start: a("10.3.0.1"), End: a("10.3.0.2")}}}
	cidr := &nodealloc.PoolConfig{Name: "c1", Kind: v1alpha1.KindCIDRPool, Prefix: netip.MustParsePrefix("10.4.0.0/28"),
		Block: iprange.Range{Start: a("10.4.0.1"), End: a("10.4.0.14")}}
	same := &nodealloc.PoolConfig{Name: "net3", Kind: v1alpha1.KindCIDRPool, Prefix: netip.MustParsePrefix("10.5.0.0/28"),
		Block: iprange.Range{Start: a("10.5.0.1"), End: a("10.5.0.14")}}
	sock, m := harness.ServeNode(t, ip, cidr, same)
	for i, key := range []string{"net3", "cidrpool/c1", "cidrpool/net3"} {
		if _, err := m.Allocate(t.Context(), &nodealloc.Request{Pools: []string{key}, ContainerID: fmt.Sprintf("c%d", i), IfName: "net1",
			Meta: nodealloc.Metadata{PodName: fmt.Sprintf("p%d", i), PodNamespace: "default"}}); err != nil {
			t.Fatal(err)
		}
	}
	row := func(pool string) []string {
		t.Helper()
		out, err := run(t, "pools", "--socket", sock)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "BLOCK IPS  IPS USED  IPS FREE  ORPHANS") {
			t.Errorf("pools header:\n%s", out)
		}
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 12 && f[0] == pool {
				return f
			}
		}
		t.Fatalf("no row of %s:\n%s", pool, out)
		return nil
	}
	// Block 10.3.0.1-16, exclusions 10.3.0.1-10.3.0.9 once merged: the address is 10.3.0.10.
	if f := row("net3"); f[6] != "16" || f[7] != "1" || f[8] != "6" || f[9] != "0" || f[10] != "10.3.0.1-10.3.0.9" {
		t.Errorf("before the edit: %v, want 16 addresses, 1 used, 6 free, no orphans, excluded 10.3.0.1-10.3.0.9", f)
	}
	// The edit moves the block; the pod keeps 10.3.0.10, now an orphan.
	edited := *ip
	edited.Block = iprange.Range{Start: a("10.3.0.17"), End: a("10.3.0.32")}
	edited.Exclusions = []iprange.Range{{Start: a("10.3.0.20"), End: a("10.3.0.22")}, {Start: a("10.3.0.18"), End: a("10.3.0.21")}}
	if err := m.SyncPools([]*nodealloc.PoolConfig{&edited, cidr, same}); err != nil {
		t.Fatal(err)
	}
	if f := row("net3"); f[7] != "0" || f[8] != "11" || f[9] != "1" || f[10] != "10.3.0.18-10.3.0.22" {
		t.Errorf("after the edit: %v, want 0 used and 11 free in the new block, 1 orphan, excluded 10.3.0.18-10.3.0.22", f)
	}

	pools := func(args ...string) ([]string, error) {
		t.Helper()
		out, err := run(t, append([]string{"allocations", "--socket", sock, "-o", "json"}, args...)...)
		if err != nil {
			return nil, err
		}
		var r ipamctl.AllocationsReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var keys []string
		for _, a := range r.Allocations {
			keys = append(keys, a.Pool)
		}
		return keys, nil
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pool", "c1"}, "cidrpool/c1"},
		{[]string{"--pool", "cidrpool/c1"}, "cidrpool/c1"},
		{[]string{"--pool", "net3", "--pool-type", "ippool"}, "net3"},
		{[]string{"--pool", "net3", "--pool-type", "CIDRPool"}, "cidrpool/net3"},
	} {
		if got, err := pools(tc.args...); err != nil || len(got) != 1 || got[0] != tc.want {
			t.Errorf("allocations %v: %q (%v), want one of %s", tc.args, got, err, tc.want)
		}
	}
	if _, err := pools("--pool", "net3"); ipamctl.ExitCode(err) != ipamctl.ExitUsage || !strings.Contains(err.Error(), "--pool-type") {
		t.Errorf("allocations --pool of a name both kinds have: %v, want a usage error asking for --pool-type", err)
	}
	_, err := pools("--pool", "nope")
	if ipamctl.ExitCode(err) != ipamctl.ExitProblems || !strings.Contains(err.Error(), `no pool "nope"`) ||
		!strings.Contains(err.Error(), "cidrpool/c1, cidrpool/net3, net3") {
		t.Errorf("allocations --pool of an unknown pool: %v, want exit 1 naming it and the node's pools", err)
	}
	if _, err := pools("--pool", "c1", "--pool-type", "ippool"); err == nil || !strings.Contains(err.Error(), `no ippool "c1"`) {
		t.Errorf("allocations --pool c1 --pool-type ippool: %v", err)
	}

	out, err := run(t, "allocations", "--socket", sock, "--pool", "c1", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	roundTrip[ipamctl.AllocationsReport](t, "allocations", []byte(out))
	var raw struct {
		Allocations []map[string]any `json:"allocations"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw.Allocations) != 1 {
		t.Fatalf("%v\n%s", err, out)
	}
	ct, _ := raw.Allocations[0]["createTime"].(string)
	if at, err := time.Parse(time.RFC3339, ct); err != nil || time.Since(at) > time.Minute || !strings.HasSuffix(ct, "Z") {
		t.Errorf("createTime %q: want RFC 3339 in UTC, of now (%v)", ct, err)
	}
}
