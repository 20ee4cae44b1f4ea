package ipamctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/allocator"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
)

// etcdRequestLimit is etcd's default --max-request-bytes: a pool object whose
// status write is larger is refused.
const etcdRequestLimit = 1572864

// metadataAllowance is what the API server adds to a stored pool object besides
// what the controller writes (uid, timestamps, managedFields, resourceVersion).
const metadataAllowance = 1536

// planLimit caps the nodes a plan lays out: enough for any cluster, and bounded
// for an IPv6 pool with 2^64 blocks.
const planLimit = 100000

// PlanReport is what `ipamctl plan` prints.
type PlanReport struct {
	Kind string `json:"kind"`
	// Range is the IPPool's subnet or the CIDRPool's cidr.
	Range string `json:"range"`
	// BlockSize is the addresses of one node's block (IPPool) or prefix (CIDRPool).
	BlockSize string `json:"blockSize"`
	// Blocks is how many blocks the layout has; UsableBlocks those not entirely
	// excluded (capped at planLimit; UsableBlocksCapped says so).
	Blocks             string `json:"blocks"`
	UsableBlocks       uint64 `json:"usableBlocks"`
	UsableBlocksCapped bool   `json:"usableBlocksCapped,omitempty"`
	// Nodes is how many nodes were planned (--nodes, or as many as blocks fit);
	// Assigned got a block, Unassigned did not (the pool is exhausted for them).
	Nodes      int `json:"nodes"`
	Assigned   int `json:"assigned"`
	Unassigned int `json:"unassigned"`
	// FirstBlock and LastBlock are the blocks of the first and last node in the
	// controller's order.
	FirstBlock string `json:"firstBlock,omitempty"`
	LastBlock  string `json:"lastBlock,omitempty"`
	// UsablePerNode* are the addresses a node's daemon can hand out, after the
	// gateway and exclusions; the minimum differs from the maximum when an
	// exclusion or the gateway falls into some blocks only.
	UsablePerNodeMin string `json:"usablePerNodeMin,omitempty"`
	UsablePerNodeMax string `json:"usablePerNodeMax,omitempty"`
	UsableTotal      string `json:"usableTotal"`
	// LostToGateway and LostToExclusions count addresses of assigned blocks that
	// are never handed out; LostToNetworkAndBroadcast those of CIDRPool prefixes
	// (and the IPPool subnet's own network and broadcast addresses).
	LostToGateway             string `json:"lostToGateway"`
	LostToExclusions          string `json:"lostToExclusions"`
	LostToNetworkAndBroadcast string `json:"lostToNetworkAndBroadcast"`
	// StatusBytes is the pool object's size with Nodes nodes whose names are
	// NodeNameLength long; MaxNodesWithinRequestLimit is how many nodes fit before
	// it reaches RequestLimitBytes (etcd's --max-request-bytes).
	NodeNameLength             int  `json:"nodeNameLength"`
	StatusBytes                int  `json:"statusBytes"`
	RequestLimitBytes          int  `json:"requestLimitBytes"`
	MaxNodesWithinRequestLimit int  `json:"maxNodesWithinRequestLimit"`
	MaxNodesCapped             bool `json:"maxNodesCapped,omitempty"`
	// StatusAllocationsMaxNodes is ipam-controller's --status-allocations-max-nodes
	// (0: no limit); StatusListsBlocks whether the status lists the Assigned
	// nodes' blocks (else StatusBytes is the object without them, and each
	// node's block is in its NodeIPAM only). NodeIPAMBlockBytes is what the
	// pool's block adds to each node's NodeIPAM.
	StatusAllocationsMaxNodes int  `json:"statusAllocationsMaxNodes"`
	StatusListsBlocks         bool `json:"statusListsBlocks"`
	NodeIPAMBlockBytes        int  `json:"nodeIPAMBlockBytes"`
	// Assignments, with --list, is every planned node's block (none when the pool
	// is exhausted for it) and its usable addresses.
	Assignments []PlanBlock `json:"assignments,omitempty"`
}

// PlanBlock is one planned node's block.
type PlanBlock struct {
	Node   string `json:"node"`
	Block  string `json:"block,omitempty"`
	Usable string `json:"usable"`
}

type planFlags struct {
	subnet, cidr, gateway string
	blockSize             int32
	perNodePrefix         int32
	gatewayIndex          int32
	nodes                 int
	excludes, perNode     []string
	nameLength            int
	requestLimit          int
	maxListed             int
	output                string
	list                  bool
}

func planCommand() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:   "plan (--subnet CIDR --block-size N | --cidr CIDR --per-node-prefix N) [flags]",
		Short: "Plan a pool offline: blocks, usable addresses per node, what fits before etcd's request limit",
		Long: "Plan lays a pool out for --nodes nodes exactly as ipam-controller would (the same layout and\n" +
			"planner code) without a cluster: an IPPool with --subnet/--block-size, or a CIDRPool with\n" +
			"--cidr/--per-node-prefix.",
		Example: "  ipamctl plan --subnet 10.0.0.0/16 --block-size 128 --nodes 400 --gateway 10.0.0.1\n" +
			"  ipamctl plan --cidr 10.8.0.0/14 --per-node-prefix 24 --gateway-index 1 -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			r, err := f.plan(cmd)
			if err != nil {
				return err
			}
			return writeReport(cmd.OutOrStdout(), f.output, r, planTable)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.subnet, "subnet", "", "IPPool: the pool's subnet")
	fl.Int32Var(&f.blockSize, "block-size", 0, "IPPool: perNodeBlockSize, addresses per node")
	fl.StringVar(&f.gateway, "gateway", "", "IPPool: the gateway address")
	fl.StringVar(&f.cidr, "cidr", "", "CIDRPool: the pool's cidr")
	fl.Int32Var(&f.perNodePrefix, "per-node-prefix", 0, "CIDRPool: perNodeNetworkPrefix, the prefix length of each node's network")
	fl.Int32Var(&f.gatewayIndex, "gateway-index", -1, "CIDRPool: gatewayIndex, the gateway's index in each node's prefix (-1: none)")
	fl.IntVar(&f.nodes, "nodes", 0, fmt.Sprintf("nodes to plan for (0: as many as the pool has blocks, at most %d)", planLimit))
	fl.StringArrayVar(&f.excludes, "exclude", nil, "exclusion START-END or a single address (repeatable)")
	fl.StringArrayVar(&f.perNode, "per-node-exclude", nil, "per-node exclusion by index, START-END or one index (repeatable)")
	fl.IntVar(&f.nameLength, "node-name-length", 32, "length of node names, for the object's size")
	fl.IntVar(&f.requestLimit, "max-request-bytes", etcdRequestLimit, "etcd's --max-request-bytes")
	fl.IntVar(&f.maxListed, "status-allocations-max-nodes", 10000,
		"ipam-controller's --status-allocations-max-nodes: above it the status lists no block (0: no limit)")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table, json or yaml")
	fl.BoolVar(&f.list, "list", false, "also list every planned node's block")
	return cmd
}

func (f *planFlags) plan(cmd *cobra.Command) (*PlanReport, error) {
	ipPool, cidrPool := f.subnet != "" || f.blockSize != 0, f.cidr != "" || f.perNodePrefix != 0
	switch {
	case ipPool == cidrPool:
		return nil, usageErrorf("give either --subnet and --block-size (IPPool) or --cidr and --per-node-prefix (CIDRPool)")
	case f.nodes < 0 || f.nodes > planLimit:
		return nil, usageErrorf("--nodes %d: want 0 to %d", f.nodes, planLimit)
	case f.nameLength < 1 || f.nameLength > 253:
		return nil, usageErrorf("--node-name-length %d: a node name has 1 to 253 characters", f.nameLength)
	case cmd.Flags().Changed("gateway") && !ipPool:
		return nil, usageErrorf("--gateway is an IPPool's; a CIDRPool has --gateway-index")
	case cmd.Flags().Changed("gateway-index") && !cidrPool:
		return nil, usageErrorf("--gateway-index is a CIDRPool's; an IPPool has --gateway")
	}
	excl, err := parseExclusions(f.excludes)
	if err != nil {
		return nil, err
	}
	perNode, err := parseIndexExclusions(f.perNode)
	if err != nil {
		return nil, err
	}
	meta := metav1.ObjectMeta{Name: "plan", Namespace: "kube-system", Generation: 1}
	var p planner
	if ipPool {
		p = &ipPoolPlanner{pool: &v1alpha1.IPPool{ObjectMeta: meta, Spec: v1alpha1.IPPoolSpec{Subnet: f.subnet,
			PerNodeBlockSize: int(f.blockSize), Gateway: f.gateway, Exclusions: excl, PerNodeExclusions: perNode}}}
	} else {
		spec := v1alpha1.CIDRPoolSpec{CIDR: f.cidr, PerNodeNetworkPrefix: f.perNodePrefix, Exclusions: excl, PerNodeExclusions: perNode}
		if f.gatewayIndex >= 0 {
			spec.GatewayIndex = &f.gatewayIndex
		}
		p = &cidrPoolPlanner{pool: &v1alpha1.CIDRPool{ObjectMeta: meta, Spec: spec}}
	}
	if f.maxListed < 0 {
		return nil, usageErrorf("--status-allocations-max-nodes %d: want 0 or more", f.maxListed)
	}
	r, err := makeReport(p, f.nodes, f.nameLength, f.requestLimit, f.list)
	if err != nil {
		return nil, err
	}
	r.StatusAllocationsMaxNodes = f.maxListed
	r.StatusListsBlocks = f.maxListed == 0 || r.Assigned <= f.maxListed
	if !r.StatusListsBlocks {
		base, _, err := p.sizes(&poolcontroller.Preview{IPPool: ipOf(p), CIDRPool: cidrOf(p)})
		if err != nil {
			return nil, err
		}
		r.StatusBytes = base + metadataAllowance
	}
	r.NodeIPAMBlockBytes = p.nodeIPAMBlockBytes(r.FirstBlock)
	return r, nil
}

func ipOf(p planner) *v1alpha1.IPPool {
	if ip, ok := p.(*ipPoolPlanner); ok {
		return ip.pool
	}
	return nil
}

func cidrOf(p planner) *v1alpha1.CIDRPool {
	if c, ok := p.(*cidrPoolPlanner); ok {
		return c.pool
	}
	return nil
}

// planUID stands for a pool's UID in a NodeIPAM block's size.
const planUID = "00000000-0000-0000-0000-000000000000"

func (p *ipPoolPlanner) nodeIPAMBlockBytes(first string) int {
	start, end, _ := strings.Cut(first, "-")
	b, _ := json.Marshal(nodeipamv1.NodeBlock{Kind: v1alpha1.KindIPPool, Pool: p.pool.Name, PoolUID: planUID, StartIP: start, EndIP: end})
	return len(b) + 1
}

func (p *cidrPoolPlanner) nodeIPAMBlockBytes(first string) int {
	// The gateway, when there is one, is an address of the prefix: as long as
	// the prefix's own address at most.
	gw := ""
	if p.pool.Spec.GatewayIndex != nil {
		gw, _, _ = strings.Cut(first, "/")
	}
	b, _ := json.Marshal(nodeipamv1.NodeBlock{Kind: v1alpha1.KindCIDRPool, Pool: p.pool.Name, PoolUID: planUID, Prefix: first, Gateway: gw})
	return len(b) + 1
}

// planner previews one kind of pool.
type planner interface {
	preview(nodes []string) (*poolcontroller.Preview, error)
	// object is the previewed pool; configs are the assigned nodes' blocks as the
	// node daemon builds them.
	object(p *poolcontroller.Preview) any
	configs(p *poolcontroller.Preview) ([]nodeBlock, error)
	kind() string
	rangeString() string
	// sizes is the JSON size of the previewed pool without its allocations, and
	// of each allocation.
	sizes(p *poolcontroller.Preview) (int, []int, error)
	// nodeIPAMBlockBytes is the JSON size of the pool's entry in a NodeIPAM,
	// given a block as FirstBlock has it.
	nodeIPAMBlockBytes(first string) int
}

// nodeBlock is a planned node's block as its daemon configures it.
type nodeBlock struct {
	node string
	*nodealloc.PoolConfig
}

type ipPoolPlanner struct{ pool *v1alpha1.IPPool }

func (p *ipPoolPlanner) preview(nodes []string) (*poolcontroller.Preview, error) {
	return poolcontroller.PreviewIPPool(p.pool, nodes)
}
func (p *ipPoolPlanner) object(pr *poolcontroller.Preview) any { return pr.IPPool }
func (p *ipPoolPlanner) kind() string                          { return v1alpha1.KindIPPool }
func (p *ipPoolPlanner) rangeString() string                   { return p.pool.Spec.Subnet }
func (p *ipPoolPlanner) sizes(pr *poolcontroller.Preview) (int, []int, error) {
	return objectSizes(pr.IPPool, &pr.IPPool.Status.Allocations)
}
func (p *ipPoolPlanner) configs(pr *poolcontroller.Preview) ([]nodeBlock, error) {
	var out []nodeBlock
	one := *pr.IPPool // the pool with one node's block at a time: a linear walk
	for _, a := range pr.IPPool.Status.Allocations {
		one.Status.Allocations = []v1alpha1.Allocation{a}
		c, err := nodealloc.FromIPPool(&one, a.NodeName)
		if err != nil {
			return nil, err
		}
		out = append(out, nodeBlock{a.NodeName, c})
	}
	return out, nil
}

type cidrPoolPlanner struct{ pool *v1alpha1.CIDRPool }

func (p *cidrPoolPlanner) preview(nodes []string) (*poolcontroller.Preview, error) {
	return poolcontroller.PreviewCIDRPool(p.pool, nodes)
}
func (p *cidrPoolPlanner) object(pr *poolcontroller.Preview) any { return pr.CIDRPool }
func (p *cidrPoolPlanner) kind() string                          { return v1alpha1.KindCIDRPool }
func (p *cidrPoolPlanner) rangeString() string                   { return p.pool.Spec.CIDR }
func (p *cidrPoolPlanner) sizes(pr *poolcontroller.Preview) (int, []int, error) {
	return objectSizes(pr.CIDRPool, &pr.CIDRPool.Status.Allocations)
}
func (p *cidrPoolPlanner) configs(pr *poolcontroller.Preview) ([]nodeBlock, error) {
	var out []nodeBlock
	one := *pr.CIDRPool
	for _, a := range pr.CIDRPool.Status.Allocations {
		one.Status.Allocations = []v1alpha1.CIDRPoolAllocation{a}
		c, err := nodealloc.FromCIDRPool(&one, a.NodeName)
		if err != nil {
			return nil, err
		}
		out = append(out, nodeBlock{a.NodeName, c})
	}
	return out, nil
}

// planNodeNames are n node names, length characters long where the count allows,
// that sort in index order (the planner assigns blocks in name order).
func planNodeNames(n, length int) []string {
	digits := len(strconv.Itoa(max(n-1, 0)))
	prefix := ""
	if length > digits {
		prefix = ("node-" + strings.Repeat("x", length))[:length-digits]
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%0*d", prefix, digits, i)
	}
	return names
}

func makeReport(p planner, nodes, nameLength, requestLimit int, list bool) (*PlanReport, error) {
	// The layout first, from a plan for no node: its block count caps the nodes.
	empty, err := p.preview(nil)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	l := empty.Layout
	r := &PlanReport{Kind: p.kind(), Range: p.rangeString(), Blocks: strconv.FormatUint(l.Count(), 10),
		NodeNameLength: nameLength, RequestLimitBytes: requestLimit}
	if l.Count() > 0 {
		r.BlockSize = l.Block(0).Size().String()
	}
	for i, ok := l.NextUsable(0); ok; i, ok = l.NextUsable(i + 1) {
		if r.UsableBlocks == planLimit {
			r.UsableBlocksCapped = true
			break
		}
		r.UsableBlocks++
	}
	if nodes == 0 {
		nodes = int(r.UsableBlocks)
	}
	r.Nodes = nodes
	pr, err := p.preview(planNodeNames(nodes, nameLength))
	if err != nil {
		return nil, err
	}
	cfgs, err := p.configs(pr)
	if err != nil {
		return nil, err
	}
	r.Assigned, r.Unassigned = len(cfgs), len(pr.Unassigned)
	if len(cfgs) > 0 {
		r.FirstBlock, r.LastBlock = blockString(cfgs[0].PoolConfig), blockString(cfgs[len(cfgs)-1].PoolConfig)
	}
	var minFree, maxFree, total, gw, excl, netbc iprange.U128
	for i, c := range cfgs {
		b, err := allocator.New(allocator.Config{Range: c.Block, Gateway: c.Gateway, Exclusions: c.Exclusions})
		if err != nil {
			return nil, fmt.Errorf("block %s: %w", c.Block, err)
		}
		free := b.Free()
		if list {
			r.Assignments = append(r.Assignments, PlanBlock{Node: c.node, Block: blockString(c.PoolConfig), Usable: free.String()})
		}
		if i == 0 || free.Cmp(minFree) < 0 {
			minFree = free
		}
		if free.Cmp(maxFree) > 0 {
			maxFree = free
		}
		total, _ = total.Add(free)
		lost, _ := c.Block.Size().Sub(free)
		if c.Gateway.IsValid() && c.Block.Contains(c.Gateway) && !inAny(c.Gateway, c.Exclusions) {
			gw, _ = gw.Add(iprange.U64(1))
			lost, _ = lost.Sub(iprange.U64(1))
		}
		excl, _ = excl.Add(lost)
		if c.Kind == v1alpha1.KindCIDRPool {
			nb, _ := iprange.PrefixRange(c.Prefix).Size().Sub(c.Block.Size())
			netbc, _ = netbc.Add(nb)
		}
	}
	if r.Kind == v1alpha1.KindIPPool {
		if subnet, err := v1alpha1.ParsePrefix(r.Range); err == nil {
			netbc, _ = iprange.PrefixRange(subnet).Size().Sub(iprange.Usable(subnet).Size())
		}
	}
	if len(cfgs) > 0 {
		r.UsablePerNodeMin, r.UsablePerNodeMax = minFree.String(), maxFree.String()
	}
	if list {
		for _, n := range pr.Unassigned {
			r.Assignments = append(r.Assignments, PlanBlock{Node: n, Usable: "0"})
		}
	}
	r.UsableTotal, r.LostToGateway, r.LostToExclusions, r.LostToNetworkAndBroadcast =
		total.String(), gw.String(), excl.String(), netbc.String()

	size := func(pr *poolcontroller.Preview) (int, error) {
		b, err := json.Marshal(p.object(pr))
		return len(b) + metadataAllowance, err
	}
	if r.StatusBytes, err = size(pr); err != nil {
		return nil, err
	}
	// The most nodes whose pool object stays within the limit: the object is the
	// pool without allocations plus one list entry (and a comma) per node, the
	// nodes taking the blocks in order.
	full := pr
	if most := int(r.UsableBlocks); most != nodes {
		if full, err = p.preview(planNodeNames(most, nameLength)); err != nil {
			return nil, err
		}
	}
	base, entries, err := p.sizes(full)
	if err != nil {
		return nil, err
	}
	bytes, n := base+metadataAllowance, 0
	for _, e := range entries {
		if bytes+e+1 > requestLimit {
			break
		}
		bytes += e + 1
		n++
	}
	r.MaxNodesWithinRequestLimit = n
	r.MaxNodesCapped = n == len(entries) && r.UsableBlocksCapped
	return r, nil
}

// objectSizes is the JSON size of obj without its allocations, and of each
// allocation, where allocations is the list obj holds.
func objectSizes[T any](obj any, allocations *[]T) (int, []int, error) {
	saved := *allocations
	*allocations = nil
	b, err := json.Marshal(obj)
	*allocations = saved
	if err != nil {
		return 0, nil, err
	}
	sizes := make([]int, len(saved))
	for i := range saved {
		e, err := json.Marshal(saved[i])
		if err != nil {
			return 0, nil, err
		}
		sizes[i] = len(e)
	}
	return len(b), sizes, nil
}

func inAny(a netip.Addr, rs []iprange.Range) bool {
	for _, r := range rs {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

func blockString(c *nodealloc.PoolConfig) string {
	if c.Kind == v1alpha1.KindCIDRPool {
		return c.Prefix.String()
	}
	return c.Block.Start.String() + "-" + c.Block.End.String()
}

func parseExclusions(ss []string) ([]v1alpha1.ExcludeRange, error) {
	var out []v1alpha1.ExcludeRange
	for _, s := range ss {
		r, err := iprange.ParseRange(s)
		if err != nil {
			return nil, usageErrorf("--exclude: %v", err)
		}
		out = append(out, v1alpha1.ExcludeRange{StartIP: r.Start.String(), EndIP: r.End.String()})
	}
	return out, nil
}

func parseIndexExclusions(ss []string) ([]v1alpha1.ExcludeIndexRange, error) {
	var out []v1alpha1.ExcludeIndexRange
	for _, s := range ss {
		start, end, ok := strings.Cut(s, "-")
		if !ok {
			end = start
		}
		a, err1 := strconv.Atoi(strings.TrimSpace(start))
		b, err2 := strconv.Atoi(strings.TrimSpace(end))
		if err1 != nil || err2 != nil {
			return nil, usageErrorf("--per-node-exclude %q: want START-END (two indexes) or one index", s)
		}
		out = append(out, v1alpha1.ExcludeIndexRange{StartIndex: a, EndIndex: b})
	}
	return out, nil
}

func planTable(w io.Writer, v any) error {
	r := v.(*PlanReport)
	capped := func(b bool) string {
		if b {
			return " (capped)"
		}
		return ""
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"pool", r.Kind + " " + r.Range},
		{"addresses per block", dash(r.BlockSize)},
		{"blocks", fmt.Sprintf("%s (%d usable%s)", r.Blocks, r.UsableBlocks, capped(r.UsableBlocksCapped))},
		{"nodes", fmt.Sprintf("%d (%d with a block, %d without)", r.Nodes, r.Assigned, r.Unassigned)},
		{"first block", dash(r.FirstBlock)},
		{"last block", dash(r.LastBlock)},
		{"usable per node", usableRange(r.UsablePerNodeMin, r.UsablePerNodeMax)},
		{"usable in total", r.UsableTotal},
		{"lost to the gateway", r.LostToGateway},
		{"lost to exclusions", r.LostToExclusions},
		{"lost to network/broadcast", r.LostToNetworkAndBroadcast},
		{"status lists blocks", listed(r)},
		{"pool object", fmt.Sprintf("%d bytes (node names of %d characters)", r.StatusBytes, r.NodeNameLength)},
		{"nodes the status can list within etcd's limit", fmt.Sprintf("%d%s (--max-request-bytes %d)", r.MaxNodesWithinRequestLimit,
			capped(r.MaxNodesCapped), r.RequestLimitBytes)},
		{"NodeIPAM of each node", fmt.Sprintf("%d bytes for this pool's block", r.NodeIPAMBlockBytes)},
	}
	for _, row := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
	}
	if len(r.Assignments) > 0 {
		fmt.Fprintln(tw, "\nNODE\tBLOCK\tUSABLE")
		for _, a := range r.Assignments {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", a.Node, dash(a.Block), a.Usable)
		}
	}
	return tw.Flush()
}

// listed says whether and up to which count the pool's status lists the blocks.
func listed(r *PlanReport) string {
	switch {
	case r.StatusAllocationsMaxNodes == 0:
		return "yes, every block (--status-allocations-max-nodes 0)"
	case r.StatusListsBlocks:
		return fmt.Sprintf("yes, up to %d nodes (ipam-controller --status-allocations-max-nodes)", r.StatusAllocationsMaxNodes)
	default:
		return fmt.Sprintf("no: more than %d nodes; each node's block is in its NodeIPAM only (status.blocksIn NodeIPAM)",
			r.StatusAllocationsMaxNodes)
	}
}

func usableRange(lo, hi string) string {
	switch lo {
	case "":
		return "-"
	case hi:
		return lo
	}
	return lo + " to " + hi
}

// writeReport prints v as a table (with table), JSON or YAML.
func writeReport(w io.Writer, output string, v any, table func(io.Writer, any) error) error {
	switch output {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding JSON: %w", err)
		}
		_, err = w.Write(append(b, '\n'))
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encoding YAML: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	return table(w, v)
}

// UsageError is a usage mistake (bad flag values): exit code 2.
type UsageError struct{ err error }

func (e *UsageError) Error() string { return e.err.Error() }
func (e *UsageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}

// IsUsageError reports whether err is a usage mistake.
func IsUsageError(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}
