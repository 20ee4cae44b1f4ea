package ipamctl_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/allocator"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

func planReport(t *testing.T, args ...string) ipamctl.PlanReport {
	t.Helper()
	out, err := run(t, append([]string{"plan", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatalf("plan %v: %v", args, err)
	}
	var r ipamctl.PlanReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("plan -o json does not parse: %v\n%s", err, out)
	}
	return r
}

// The figures of a small pool, worked out by hand: a /24 in blocks of 10 from .1
// (25 blocks, .251-.254 left over), the gateway .1 and .5-.6 excluded, both in the
// first block.
func TestPlanFigures(t *testing.T) {
	r := planReport(t, "--subnet", "10.0.0.0/24", "--block-size", "10", "--gateway", "10.0.0.1",
		"--exclude", "10.0.0.5-10.0.0.6", "--nodes", "3", "--node-name-length", "8", "--list")
	want := ipamctl.PlanReport{Kind: "IPPool", Range: "10.0.0.0/24", BlockSize: "10", Blocks: "25", UsableBlocks: 25,
		Nodes: 3, Assigned: 3, FirstBlock: "10.0.0.1-10.0.0.10", LastBlock: "10.0.0.21-10.0.0.30",
		UsablePerNodeMin: "7", UsablePerNodeMax: "10", UsableTotal: "27", LostToGateway: "1", LostToExclusions: "2",
		LostToNetworkAndBroadcast: "2", NodeNameLength: 8, StatusBytes: r.StatusBytes, RequestLimitBytes: 1572864,
		MaxNodesWithinRequestLimit: 25, StatusAllocationsMaxNodes: 10000, StatusListsBlocks: true, NodeIPAMBlockBytes: r.NodeIPAMBlockBytes,
		Assignments: []ipamctl.PlanBlock{{"node-xx0", "10.0.0.1-10.0.0.10", "7"}, {"node-xx1", "10.0.0.11-10.0.0.20", "10"},
			{"node-xx2", "10.0.0.21-10.0.0.30", "10"}}}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("plan\n got %+v\nwant %+v", r, want)
	}
	if r.NodeIPAMBlockBytes < 80 || r.NodeIPAMBlockBytes > 200 {
		t.Errorf("a NodeIPAM block of this pool takes %d bytes, want some 80-200", r.NodeIPAMBlockBytes)
	}
	// Above the controller's threshold the status lists no block: the object
	// is the pool without them.
	above := planReport(t, "--subnet", "10.0.0.0/24", "--block-size", "10", "--gateway", "10.0.0.1",
		"--exclude", "10.0.0.5-10.0.0.6", "--nodes", "3", "--node-name-length", "8", "--status-allocations-max-nodes", "2")
	if above.StatusListsBlocks || above.StatusAllocationsMaxNodes != 2 || above.StatusBytes >= r.StatusBytes-3*40 {
		t.Errorf("above the threshold: lists %v (max %d), %d bytes, want no list and %d bytes less 3 entries",
			above.StatusListsBlocks, above.StatusAllocationsMaxNodes, above.StatusBytes, r.StatusBytes)
	}
	if r.StatusBytes < 1500 || r.StatusBytes > 4000 {
		t.Errorf("a 3-node pool object of %d bytes", r.StatusBytes)
	}

	// A CIDRPool: a /22 in /24s, gateway index 1, index 0-1 excluded per node (the
	// network address and the gateway: only .0's exclusion costs nothing extra).
	c := planReport(t, "--cidr", "10.8.0.0/22", "--per-node-prefix", "24", "--gateway-index", "1",
		"--per-node-exclude", "0-2", "--nodes", "5")
	if c.Blocks != "4" || c.Assigned != 4 || c.Unassigned != 1 || c.FirstBlock != "10.8.0.0/24" || c.LastBlock != "10.8.3.0/24" ||
		c.UsablePerNodeMin != "252" || c.LostToNetworkAndBroadcast != "8" || c.LostToGateway != "0" || c.LostToExclusions != "8" {
		t.Errorf("CIDRPool plan %+v", c)
	}

	// The etcd limit binds before the blocks run out: a smaller limit, fewer nodes.
	small := planReport(t, "--subnet", "10.0.0.0/16", "--block-size", "4", "--max-request-bytes", "65536")
	if small.UsableBlocks != 16383 || small.MaxNodesWithinRequestLimit == 0 || small.MaxNodesWithinRequestLimit >= 1000 {
		t.Errorf("with a 64 KiB limit: %d usable blocks, %d nodes fit", small.UsableBlocks, small.MaxNodesWithinRequestLimit)
	}
}

// JSON and YAML carry the same report, and both round-trip.
func TestPlanOutputsRoundTrip(t *testing.T) {
	args := []string{"plan", "--cidr", "fd00:10::/56", "--per-node-prefix", "64", "--gateway-index", "1", "--nodes", "4", "--list"}
	js, err := run(t, append(args, "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	ym, err := run(t, append(args, "-o", "yaml")...)
	if err != nil {
		t.Fatal(err)
	}
	var fromJSON, fromYAML ipamctl.PlanReport
	if err := json.Unmarshal([]byte(js), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(ym), &fromYAML); err != nil {
		t.Fatalf("%v\n%s", err, ym)
	}
	if !reflect.DeepEqual(fromJSON, fromYAML) || fromJSON.Assigned != 4 || len(fromJSON.Assignments) != 4 {
		t.Fatalf("json %+v\nyaml %+v", fromJSON, fromYAML)
	}
	again, err := json.MarshalIndent(fromJSON, "", "  ")
	if err != nil || string(again)+"\n" != js {
		t.Errorf("JSON does not round-trip (%v):\n%s\n%s", err, again, js)
	}
	table, err := run(t, args...)
	if err != nil || !strings.Contains(table, "first block:") || !strings.Contains(table, "fd00:10::/64") {
		t.Errorf("table (%v):\n%s", err, table)
	}
}

func TestPlanUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan"}, "either --subnet"},
		{[]string{"plan", "--subnet", "10.0.0.0/24", "--block-size", "4", "--cidr", "10.1.0.0/16"}, "either --subnet"},
		{[]string{"plan", "--subnet", "10.0.0.0/33", "--block-size", "4"}, "spec.subnet"},
		{[]string{"plan", "--subnet", "10.0.0.0/24", "--block-size", "0"}, "perNodeBlockSize"},
		{[]string{"plan", "--subnet", "10.0.0.0/24", "--block-size", "4", "--exclude", "10.0.0.9-x"}, "--exclude"},
		{[]string{"plan", "--subnet", "10.0.0.0/24", "--block-size", "4", "--gateway-index", "1"}, "CIDRPool's"},
		{[]string{"plan", "--subnet", "10.0.0.0/24", "--block-size", "4", "-o", "xml"}, "--output"},
		{[]string{"plan", "--no-such-flag"}, "unknown flag"},
		{[]string{"no-such-command"}, "unknown command"},
	} {
		_, err := run(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || ipamctl.ExitCode(err) != ipamctl.ExitUsage {
			t.Errorf("%v: error %v (exit %d), want one about %q with exit %d", c.args, err, ipamctl.ExitCode(err), c.want, ipamctl.ExitUsage)
		}
	}
}

// plan lays pools out as the controller does: random IPPools and CIDRPools, with
// and without a gateway (a CIDRPool's at any index), exclusions and per-node
// exclusions, the nodes plan names created on a real API server, the real
// reconciler run; status must list exactly the plan's blocks, the plan's figures
// (usable per node, in total, lost to the gateway, exclusions, network and
// broadcast) match those counted from the stored pool, and the object's size
// match the plan's. HWIPAM_PLAN_SEED replays a run.
func TestPlanAgreesWithController(t *testing.T) {
	cp, err := harness.NewControlPlane(harness.ControlPlaneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("HWIPAM_PLAN_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (HWIPAM_PLAN_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	ctx := t.Context()
	ns := "plan"
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		nameLen := 12 + i // names differ between cases: nodes are cluster-scoped
		nodes := 1 + rng.IntN(40)
		label := fmt.Sprintf("case%d", i)
		args := []string{"--nodes", strconv.Itoa(nodes), "--node-name-length", strconv.Itoa(nameLen), "--list"}
		var obj client.Object
		kind := v1alpha1.KindIPPool
		sel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: "plan.hwipam.io/case", Operator: corev1.NodeSelectorOpIn, Values: []string{label}}}}}}
		meta := metav1.ObjectMeta{Name: label, Namespace: ns}
		if i%2 == 0 {
			third := i // pools of one namespace must not overlap: each case has its own range
			size := 1 + rng.IntN(24)
			spec := v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.%d.0.0/24", third), PerNodeBlockSize: size, NodeSelector: sel}
			args = append(args, "--subnet", spec.Subnet, "--block-size", strconv.Itoa(size))
			if rng.IntN(2) == 0 {
				spec.Gateway = fmt.Sprintf("10.%d.0.%d", third, 1+rng.IntN(254))
				args = append(args, "--gateway", spec.Gateway)
			}
			for range rng.IntN(3) {
				a := 1 + rng.IntN(250)
				b := min(a+rng.IntN(40), 254)
				e := v1alpha1.ExcludeRange{StartIP: fmt.Sprintf("10.%d.0.%d", third, a), EndIP: fmt.Sprintf("10.%d.0.%d", third, b)}
				spec.Exclusions = append(spec.Exclusions, e)
				args = append(args, "--exclude", e.StartIP+"-"+e.EndIP)
			}
			for range rng.IntN(3) {
				e := randIndexRange(rng, size)
				spec.PerNodeExclusions = append(spec.PerNodeExclusions, e)
				args = append(args, "--per-node-exclude", fmt.Sprintf("%d-%d", e.StartIndex, e.EndIndex))
			}
			p := &v1alpha1.IPPool{ObjectMeta: meta, Spec: spec}
			if errs := p.Validate(); len(errs) > 0 {
				t.Fatalf("case %d: generated an invalid IPPool %v: %v", i, args, errs)
			}
			obj = p
		} else {
			kind = v1alpha1.KindCIDRPool
			prefix := 16 + rng.IntN(6)
			per := int32(min(prefix+2+rng.IntN(8), 30))
			base := netip.AddrFrom4([4]byte{10, byte(128 + i*8), 0, 0})
			spec := v1alpha1.CIDRPoolSpec{CIDR: fmt.Sprintf("%s/%d", base, prefix), PerNodeNetworkPrefix: per, NodeSelector: sel}
			args = append(args, "--cidr", spec.CIDR, "--per-node-prefix", strconv.Itoa(int(per)))
			cidrSize, perSize := 1<<(32-prefix), 1<<(32-per)
			if rng.IntN(2) == 0 { // any host index of a node's prefix
				gi := int32(1 + rng.IntN(perSize-2))
				spec.GatewayIndex = &gi
				args = append(args, "--gateway-index", strconv.Itoa(int(gi)))
			}
			// Exclusions where the planned nodes' prefixes lie: a few addresses, or
			// up to three prefixes' worth, which covers whole prefixes the
			// controller then skips.
			span := min(cidrSize, (nodes+2)*perSize)
			for range rng.IntN(3) {
				a, n := rng.IntN(span), 1+rng.IntN(8)
				if rng.IntN(2) == 0 {
					n = 1 + rng.IntN(3*perSize)
				}
				b := min(a+n-1, cidrSize-1)
				e := v1alpha1.ExcludeRange{StartIP: addr4(base, a).String(), EndIP: addr4(base, b).String()}
				spec.Exclusions = append(spec.Exclusions, e)
				args = append(args, "--exclude", e.StartIP+"-"+e.EndIP)
			}
			for range rng.IntN(3) {
				e := randIndexRange(rng, perSize)
				spec.PerNodeExclusions = append(spec.PerNodeExclusions, e)
				args = append(args, "--per-node-exclude", fmt.Sprintf("%d-%d", e.StartIndex, e.EndIndex))
			}
			p := &v1alpha1.CIDRPool{ObjectMeta: meta, Spec: spec}
			if errs := p.Validate(); len(errs) > 0 {
				t.Fatalf("case %d: generated an invalid CIDRPool %v: %v", i, args, errs)
			}
			obj = p
		}
		plan := planReport(t, args...)
		for _, a := range plan.Assignments { // every planned node, with a block or not
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.Node, Labels: map[string]string{"plan.hwipam.io/case": label}}}
			if err := cp.Client.Create(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		r := &poolcontroller.Reconciler{Client: cp.Client, Kind: kind}
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: label}}); err != nil {
			t.Fatal(err)
		}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		var fig *planFigures
		switch p := obj.(type) {
		case *v1alpha1.IPPool:
			for _, a := range p.Status.Allocations {
				got[a.NodeName] = a.StartIP + "-" + a.EndIP
			}
			fig = ipPoolFigures(t, p)
		case *v1alpha1.CIDRPool:
			for _, a := range p.Status.Allocations {
				got[a.NodeName] = a.Prefix
			}
			fig = cidrPoolFigures(t, p)
		}
		want := map[string]string{}
		for _, a := range plan.Assignments {
			if a.Block != "" {
				want[a.Node] = a.Block
			}
		}
		if len(plan.Assignments) != nodes || len(want) != plan.Assigned {
			t.Errorf("case %d: plan lists %d nodes, %d with a block, for %d nodes (%d assigned)", i, len(plan.Assignments), len(want),
				nodes, plan.Assigned)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("case %d (%s %v): the controller assigned\n%v\nplan said\n%v", i, kind, args, got, want)
		}
		// The figures: what the assigned blocks give and lose, counted address by
		// address from the stored pool, against the plan's.
		usable := map[string]string{}
		for _, a := range plan.Assignments {
			usable[a.Node] = a.Usable
		}
		if wantUsable := fig.usableByNode(plan.Assignments); !reflect.DeepEqual(usable, wantUsable) {
			t.Errorf("case %d (%s %v): usable addresses per node\nplan said %v\n  counted %v", i, kind, args, usable, wantUsable)
		}
		gotFig := [...]string{plan.UsablePerNodeMin, plan.UsablePerNodeMax, plan.UsableTotal, plan.LostToGateway,
			plan.LostToExclusions, plan.LostToNetworkAndBroadcast}
		if wantFig := fig.summary(); gotFig != wantFig {
			t.Errorf("case %d (%s %v): usable per node min, max, total; lost to the gateway, exclusions, network/broadcast:\n"+
				"plan said %q\n  counted %q", i, kind, args, gotFig, wantFig)
		}
		raw, err := cp.Clientset.CoreV1().RESTClient().Get().AbsPath("/apis/nv-ipam.nvidia.com/v1alpha1/namespaces", ns,
			strings.ToLower(kind)+"s", label).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The plan's size allows for the metadata the API server adds; the stored
		// object also carries the spec's nodeSelector, which plan's flags lack.
		if diff := plan.StatusBytes - len(raw); diff < -300 || diff > 600 {
			t.Errorf("case %d: plan says the object has %d bytes, the API server returns %d", i, plan.StatusBytes, len(raw))
		}
	}
}

// randIndexRange is a perNodeExclusions entry for blocks of size addresses:
// now and then the whole block, else a stretch of up to a quarter of it.
func randIndexRange(rng *rand.Rand, size int) v1alpha1.ExcludeIndexRange {
	if rng.IntN(8) == 0 {
		return v1alpha1.ExcludeIndexRange{StartIndex: 0, EndIndex: size - 1}
	}
	s := rng.IntN(size)
	return v1alpha1.ExcludeIndexRange{StartIndex: s, EndIndex: min(s+rng.IntN(max(size/4, 1)), size-1)}
}

func v4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// addr4 is the IPv4 address off addresses past base.
func addr4(base netip.Addr, off int) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v4(base)+uint32(off))
	return netip.AddrFrom4(b)
}

// planFigures are the figures a stored IPv4 pool's status implies, counted
// address by address: the trivial model plan's figures are checked against.
type planFigures struct {
	usable                                 map[string]uint64 // by node with a block
	min, max                               uint64
	total, gateway, excluded, netBroadcast uint64
}

// addBlock counts node's block, addresses start to end whose per-node indexes
// count from base: an address in an exclusion or at an excluded index is lost to
// exclusions (the gateway too, then), else the gateway is lost to the gateway.
func (f *planFigures) addBlock(node string, start, end, base uint32, gw netip.Addr, excl []v1alpha1.ExcludeRange,
	perNode []v1alpha1.ExcludeIndexRange) {
	var ranges [][2]uint32
	for _, e := range excl {
		ranges = append(ranges, [2]uint32{v4(netip.MustParseAddr(e.StartIP)), v4(netip.MustParseAddr(e.EndIP))})
	}
	for _, e := range perNode {
		ranges = append(ranges, [2]uint32{base + uint32(e.StartIndex), base + uint32(e.EndIndex)})
	}
	free := uint64(0)
	for a := start; a <= end; a++ {
		excluded := false
		for _, r := range ranges {
			excluded = excluded || r[0] <= a && a <= r[1]
		}
		switch {
		case excluded:
			f.excluded++
		case gw.IsValid() && a == v4(gw):
			f.gateway++
		default:
			free++
		}
	}
	if len(f.usable) == 0 || free < f.min {
		f.min = free
	}
	f.max = max(f.max, free)
	if f.usable == nil {
		f.usable = map[string]uint64{}
	}
	f.usable[node] = free
	f.total += free
}

// usableByNode is each planned node's usable addresses, as plan lists them:
// "0" for a node without a block.
func (f *planFigures) usableByNode(planned []ipamctl.PlanBlock) map[string]string {
	out := map[string]string{}
	for _, a := range planned {
		out[a.Node] = strconv.FormatUint(f.usable[a.Node], 10)
	}
	return out
}

// summary is what plan reports as usablePerNodeMin, usablePerNodeMax,
// usableTotal, lostToGateway, lostToExclusions and lostToNetworkAndBroadcast.
func (f *planFigures) summary() [6]string {
	s := [6]string{"", "", strconv.FormatUint(f.total, 10), strconv.FormatUint(f.gateway, 10),
		strconv.FormatUint(f.excluded, 10), strconv.FormatUint(f.netBroadcast, 10)}
	if len(f.usable) > 0 {
		s[0], s[1] = strconv.FormatUint(f.min, 10), strconv.FormatUint(f.max, 10)
	}
	return s
}

// ipPoolFigures counts a stored IPPool, whose subnet (IPv4, /30 or shorter)
// loses its network and broadcast addresses, and checks each block's count
// against what the node's daemon makes of it.
func ipPoolFigures(t *testing.T, p *v1alpha1.IPPool) *planFigures {
	t.Helper()
	f := &planFigures{netBroadcast: 2}
	var gw netip.Addr
	if p.Spec.Gateway != "" {
		gw = netip.MustParseAddr(p.Spec.Gateway)
	}
	for _, a := range p.Status.Allocations {
		start := v4(netip.MustParseAddr(a.StartIP))
		f.addBlock(a.NodeName, start, v4(netip.MustParseAddr(a.EndIP)), start, gw, p.Spec.Exclusions, p.Spec.PerNodeExclusions)
		c, err := nodealloc.FromIPPool(p, a.NodeName)
		daemonAgrees(t, a.NodeName, c, err, f.usable[a.NodeName])
	}
	return f
}

// cidrPoolFigures counts a stored IPv4 CIDRPool, each node's prefix (/30 or
// shorter) losing its network and broadcast addresses, its per-node indexes
// counting from the network address.
func cidrPoolFigures(t *testing.T, p *v1alpha1.CIDRPool) *planFigures {
	t.Helper()
	f := &planFigures{}
	for _, a := range p.Status.Allocations {
		prefix := netip.MustParsePrefix(a.Prefix)
		base, size := v4(prefix.Addr()), uint32(1)<<(32-prefix.Bits())
		var gw netip.Addr
		if a.Gateway != "" {
			gw = netip.MustParseAddr(a.Gateway)
		}
		f.addBlock(a.NodeName, base+1, base+size-2, base, gw, p.Spec.Exclusions, p.Spec.PerNodeExclusions)
		f.netBroadcast += 2
		c, err := nodealloc.FromCIDRPool(p, a.NodeName)
		daemonAgrees(t, a.NodeName, c, err, f.usable[a.NodeName])
	}
	return f
}

// daemonAgrees checks that the node's daemon, given its block c of the stored
// pool, has as many addresses to hand out as counted: the model is the daemon's.
func daemonAgrees(t *testing.T, node string, c *nodealloc.PoolConfig, err error, counted uint64) {
	t.Helper()
	if err != nil || c == nil {
		t.Fatalf("node %s: the daemon's block: %v", node, err)
	}
	b, err := allocator.New(allocator.Config{Range: c.Block, Gateway: c.Gateway, Exclusions: c.Exclusions})
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	if free := b.Free(); free != iprange.U64(counted) {
		t.Errorf("node %s: the daemon has %s addresses to hand out in %s, counted %d", node, free, c.Block, counted)
	}
}

func TestVersionOutputs(t *testing.T) {
	line, err := run(t, "version")
	if err != nil || !strings.HasPrefix(line, "ipamctl ") {
		t.Fatalf("version (%v): %q", err, line)
	}
	js, err := run(t, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	ym, err := run(t, "version", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	var a, b ipamctl.VersionReport
	if err := json.Unmarshal([]byte(js), &a); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(ym), &b); err != nil {
		t.Fatal(err)
	}
	if a != b || a.Version == "" || a.GoVersion == "" || !strings.Contains(line, a.Version) {
		t.Errorf("version: %q, json %+v, yaml %+v", line, a, b)
	}
}
