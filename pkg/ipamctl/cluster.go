package ipamctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	nadutils "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/utils"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/daemon"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

// ClusterPool is one pool in `ipamctl pools --cluster`.
type ClusterPool struct {
	Kind  string `json:"kind"`
	Name  string `json:"name"`
	Range string `json:"range"`
	// Blocks lists node → block (IPPool start-end, CIDRPool prefix).
	Blocks map[string]string `json:"blocks"`
	// Selected counts the nodes the nodeSelector matches; WithoutBlock are those
	// of them that have no block.
	Selected     int      `json:"selected"`
	WithoutBlock []string `json:"withoutBlock,omitempty"`
	// UsableBlocks is how many blocks the layout has that are not entirely
	// excluded; Utilisation is the share of them assigned, in percent.
	UsableBlocks uint64  `json:"usableBlocks"`
	Utilisation  float64 `json:"utilisation"`
	// Rail is the rail the pool is labelled for (nic.hwipam.io/rail), "" when none.
	Rail string `json:"rail,omitempty"`
	// NADs are the NetworkAttachmentDefinitions (namespace/name) whose nv-ipam
	// section names the pool, or reaches it by rail.
	NADs []string `json:"nads,omitempty"`
	// Claims are the ResourceClaims (namespace/name) whose nic.hwipam.io
	// devices have addresses from the pool, as their status says.
	Claims []string `json:"claims,omitempty"`
	// Ready is the pool's Ready condition message.
	Ready string `json:"ready,omitempty"`
	// BlocksIn is where the blocks are listed (status.blocksIn): "status", or
	// "NodeIPAM" above ipam-controller's --status-allocations-max-nodes, where
	// Blocks are read from the nodes' NodeIPAM objects; "" from a controller
	// that does not say (nv-ipam's, an earlier hwipam's): the status.
	BlocksIn string `json:"blocksIn,omitempty"`
}

// ClusterReport is `ipamctl pools --cluster`.
type ClusterReport struct {
	Namespace string        `json:"namespace"`
	Pools     []ClusterPool `json:"pools"`
	// NADsWithoutPool are NADs whose nv-ipam section names a pool that does not
	// exist, or asks for a rail no pool is labelled for.
	NADsWithoutPool []string `json:"nadsWithoutPool,omitempty"`
	// NADsRefused are NADs the plugin refuses outright (code 7), with why.
	NADsRefused []string `json:"nadsRefused,omitempty"`
	// NADNote says why NADs were not read, when they were not.
	NADNote string `json:"nadNote,omitempty"`
	// ClaimNote says why ResourceClaims were not read, when they were not
	// (a cluster without DRA, or no right to list them).
	ClaimNote string `json:"claimNote,omitempty"`
}

// nadRef is one nv-ipam ipam section of a NAD.
type nadRef struct {
	nad      string // namespace/name
	pools    []string
	poolType string // "", "ippool" or "cidrpool"
	master   string // the netdev the attachment sits on (macvlan, ipvlan, ipoib), or ""
	// rail is ipam.rail: "auto", a rail name, or "" when the pools are named.
	rail string
	// refused says why the plugin refuses the section outright (code 7), or "".
	refused string
}

// nadRefs finds the nv-ipam ipam sections of a NAD's config the way Multus
// reads it: through the NAD client's GetCNIConfigFromSpec, which names the
// network after the NAD when the config has no name; then a single plugin
// config, or a plugin list ("plugins"). Each plugin's "ipam" of type nv-ipam
// names its pool(s) in poolName (comma-separated for dual stack), or the
// network's name when poolName is absent.
func nadRefs(nad *nadv1.NetworkAttachmentDefinition) ([]nadRef, error) {
	if strings.TrimSpace(nad.Spec.Config) == "" {
		return nil, nil // the config is a file on each node (Multus' confDir): not readable from here
	}
	config, err := nadutils.GetCNIConfigFromSpec(nad.Spec.Config, nad.Name)
	if err != nil {
		return nil, fmt.Errorf("config does not parse: %w", err)
	}
	var conf struct {
		Name    string            `json:"name"`
		Plugins []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(config, &conf); err != nil {
		return nil, fmt.Errorf("config does not parse: %w", err)
	}
	plugins := conf.Plugins
	if len(plugins) == 0 {
		plugins = []json.RawMessage{config}
	}
	var out []nadRef
	for _, raw := range plugins {
		var p struct {
			Master string `json:"master"`
			Device string `json:"device"`
			IPAM   *struct {
				Type     string `json:"type"`
				PoolName string `json:"poolName"`
				PoolType string `json:"poolType"`
				Rail     string `json:"rail"`
			} `json:"ipam"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("a plugin of the config does not parse: %w", err)
		}
		if p.IPAM == nil || p.IPAM.Type != "nv-ipam" {
			continue
		}
		r := nadRef{nad: nad.Namespace + "/" + nad.Name, poolType: strings.ToLower(p.IPAM.PoolType), master: p.Master, rail: p.IPAM.Rail}
		if r.master == "" {
			r.master = p.Device
		}
		if r.rail != "" {
			// The pools are picked by rail, on the node, at each ADD (docs/rails.md).
			if p.IPAM.PoolName != "" {
				r.refused = fmt.Sprintf("ipam.rail %q and poolName %q are both set: the plugin refuses it (code 7)", r.rail, p.IPAM.PoolName)
			}
			out = append(out, r)
			continue
		}
		names := p.IPAM.PoolName
		if names == "" {
			names = conf.Name
		}
		for _, n := range strings.Split(names, ",") {
			if n = strings.TrimSpace(n); n != "" {
				r.pools = append(r.pools, n)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// clusterState is what the cluster checks read.
type clusterState struct {
	ns        string
	nodes     []corev1.Node
	ipPools   []v1alpha1.IPPool
	cidrPools []v1alpha1.CIDRPool
	refs      []nadRef
	nadErrs   []string
	nadNote   string
	// claims are the nic.hwipam.io devices of the ResourceClaims' status;
	// claimNote says why they were not read.
	claims    []claimPort
	claimNote string
}

// claimPort is a nic.hwipam.io device of a claim's status.
type claimPort struct {
	claim  string // namespace/name
	node   string // the node of the claim's allocation, "" when not one node
	device string
	ips    []string
	data   nicdra.DeviceData
}

// newClusterClient is a client of the API server that gives up on a request after
// timeout, so that an unreachable API server is reported, not waited for.
func newClusterClient(kubeconfig string, timeout time.Duration) (client.Client, error) {
	cfg, err := daemon.RESTConfig(kubeconfig)
	if err != nil {
		return nil, &ConnectionError{err}
	}
	cfg.Timeout = timeout
	scheme, err := v1alpha1.NewScheme()
	if err != nil {
		return nil, err
	}
	if err := nadv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := resourceapi.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := nodeipamv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, &ConnectionError{fmt.Errorf("API server %s: %w", cfg.Host, err)}
	}
	return cl, nil
}

func readCluster(ctx context.Context, cl client.Client, ns string) (*clusterState, error) {
	s := &clusterState{ns: ns}
	var nodes corev1.NodeList
	if err := cl.List(ctx, &nodes); err != nil {
		return nil, &ConnectionError{fmt.Errorf("listing nodes: %w", err)}
	}
	s.nodes = nodes.Items
	var ipPools v1alpha1.IPPoolList
	if err := cl.List(ctx, &ipPools, client.InNamespace(ns)); err != nil {
		return nil, &ConnectionError{fmt.Errorf("listing IPPools in %s: %w", ns, err)}
	}
	s.ipPools = ipPools.Items
	var cidrPools v1alpha1.CIDRPoolList
	if err := cl.List(ctx, &cidrPools, client.InNamespace(ns)); err != nil && !meta.IsNoMatchError(err) {
		return nil, &ConnectionError{fmt.Errorf("listing CIDRPools in %s: %w", ns, err)}
	}
	s.cidrPools = cidrPools.Items
	// Pools above ipam-controller's threshold list their blocks in the
	// nodes' NodeIPAMs only.
	fillFromNodeIPAMs(ctx, cl, ns, "", s.ipPools, s.cidrPools)
	var nads nadv1.NetworkAttachmentDefinitionList
	switch err := cl.List(ctx, &nads); {
	case meta.IsNoMatchError(err):
		s.nadNote = "the NetworkAttachmentDefinition CRD is not installed"
	case err != nil:
		s.nadNote = fmt.Sprintf("cannot list NetworkAttachmentDefinitions: %v", err)
	}
	for i := range nads.Items {
		refs, err := nadRefs(&nads.Items[i])
		if err != nil {
			s.nadErrs = append(s.nadErrs, fmt.Sprintf("%s/%s: %v", nads.Items[i].Namespace, nads.Items[i].Name, err))
		}
		s.refs = append(s.refs, refs...)
	}
	s.readClaims(ctx, cl)
	return s, nil
}

// readClaims reads the nic.hwipam.io devices of every ResourceClaim's status:
// the pools they have addresses from, and their ports.
func (s *clusterState) readClaims(ctx context.Context, cl client.Client) {
	var claims resourceapi.ResourceClaimList
	switch err := cl.List(ctx, &claims); {
	case meta.IsNoMatchError(err):
		s.claimNote = "the API server serves no resource.k8s.io/v1 ResourceClaims (no DRA)"
		return
	case err != nil:
		s.claimNote = fmt.Sprintf("cannot list ResourceClaims: %v", err)
		return
	}
	for _, c := range claims.Items {
		node := ""
		if a := c.Status.Allocation; a != nil && a.NodeSelector != nil && len(a.NodeSelector.NodeSelectorTerms) == 1 {
			for _, f := range a.NodeSelector.NodeSelectorTerms[0].MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					node = f.Values[0]
				}
			}
		}
		for _, d := range c.Status.Devices {
			if d.Driver != nicdra.DriverName || d.Data == nil {
				continue
			}
			var data nicdra.DeviceData
			if err := json.Unmarshal(d.Data.Raw, &data); err != nil {
				continue
			}
			cp := claimPort{claim: c.Namespace + "/" + c.Name, node: node, device: d.Device, data: data}
			if d.NetworkData != nil {
				cp.ips = d.NetworkData.IPs
			}
			s.claims = append(s.claims, cp)
		}
	}
}

// poolOf finds the pool a NAD names: of its poolType, else an IPPool, else a CIDRPool.
func (s *clusterState) poolOf(name, poolType string) (kind string, sel *corev1.NodeSelector, ok bool) {
	if poolType != "cidrpool" {
		for i := range s.ipPools {
			if s.ipPools[i].Name == name {
				return v1alpha1.KindIPPool, s.ipPools[i].Spec.NodeSelector, true
			}
		}
	}
	if poolType != "ippool" {
		for i := range s.cidrPools {
			if s.cidrPools[i].Name == name {
				return v1alpha1.KindCIDRPool, s.cidrPools[i].Spec.NodeSelector, true
			}
		}
	}
	return "", nil, false
}

func (s *clusterState) selected(sel *corev1.NodeSelector) []string {
	var out []string
	var ns *nodeaffinity.NodeSelector
	var err error
	if sel != nil { // nil selects every node
		ns, err = nodeaffinity.NewNodeSelector(sel)
	}
	for i := range s.nodes {
		if sel == nil || err == nil && ns.Match(&s.nodes[i]) {
			out = append(out, s.nodes[i].Name)
		}
	}
	return out
}

func (s *clusterState) report() *ClusterReport {
	r := &ClusterReport{Namespace: s.ns, Pools: []ClusterPool{}, NADNote: s.nadNote, ClaimNote: s.claimNote}
	claimsOf := map[string][]string{} // kind/name -> claims
	for _, cp := range s.claims {
		kind := v1alpha1.KindIPPool
		if cp.data.PoolType == "cidrpool" {
			kind = v1alpha1.KindCIDRPool
		}
		for _, p := range cp.data.Pools {
			if k := kind + "/" + p; !slices.Contains(claimsOf[k], cp.claim) {
				claimsOf[k] = append(claimsOf[k], cp.claim)
			}
		}
	}
	nadsOf := map[string][]string{} // kind/name -> NADs
	for _, ref := range s.refs {
		if ref.rail != "" {
			reached, findings := s.railReach(ref)
			for _, k := range reached {
				if !slices.Contains(nadsOf[k], ref.nad) {
					nadsOf[k] = append(nadsOf[k], ref.nad)
				}
			}
			for _, f := range findings {
				if f.withoutPool != "" {
					r.NADsWithoutPool = append(r.NADsWithoutPool, f.withoutPool)
				}
				if f.refused != "" {
					r.NADsRefused = append(r.NADsRefused, f.refused)
				}
			}
			continue
		}
		for _, p := range ref.pools {
			kind, _, ok := s.poolOf(p, ref.poolType)
			if !ok {
				r.NADsWithoutPool = append(r.NADsWithoutPool, fmt.Sprintf("%s names %s", ref.nad, p))
				continue
			}
			k := kind + "/" + p
			if !slices.Contains(nadsOf[k], ref.nad) {
				nadsOf[k] = append(nadsOf[k], ref.nad)
			}
		}
	}
	add := func(kind, name, rng, rail string, sel *corev1.NodeSelector, blocksOf map[string]string, layout blocks.Layout,
		st v1alpha1.PoolStatusCommon) {
		conds := st.Conditions
		p := ClusterPool{Kind: kind, Name: name, Range: rng, Rail: rail, Blocks: blocksOf, NADs: nadsOf[kind+"/"+name],
			Claims: claimsOf[kind+"/"+name], BlocksIn: st.BlocksIn}
		for _, n := range s.selected(sel) {
			p.Selected++
			if _, ok := blocksOf[n]; !ok {
				p.WithoutBlock = append(p.WithoutBlock, n)
			}
		}
		if layout != nil {
			for i, ok := layout.NextUsable(0); ok && p.UsableBlocks < planLimit; i, ok = layout.NextUsable(i + 1) {
				p.UsableBlocks++
			}
			if p.UsableBlocks > 0 {
				p.Utilisation = float64(len(blocksOf)) * 100 / float64(p.UsableBlocks)
			}
		}
		if c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); c != nil {
			p.Ready = c.Message
		}
		r.Pools = append(r.Pools, p)
	}
	for i := range s.ipPools {
		p := &s.ipPools[i]
		b := map[string]string{}
		for _, a := range p.Status.Allocations {
			b[a.NodeName] = a.StartIP + "-" + a.EndIP
		}
		var layout blocks.Layout
		if l, err := blocks.NewIPPool(&p.Spec); err == nil {
			layout = l
		}
		add(v1alpha1.KindIPPool, p.Name, p.Spec.Subnet, p.Labels[labelRail], p.Spec.NodeSelector, b, layout, p.Status.PoolStatusCommon)
	}
	for i := range s.cidrPools {
		p := &s.cidrPools[i]
		b := map[string]string{}
		for _, a := range p.Status.Allocations {
			b[a.NodeName] = a.Prefix
		}
		var layout blocks.Layout
		if l, err := blocks.NewCIDRPool(&p.Spec); err == nil {
			layout = l
		}
		add(v1alpha1.KindCIDRPool, p.Name, p.Spec.CIDR, p.Labels[labelRail], p.Spec.NodeSelector, b, layout, p.Status.PoolStatusCommon)
	}
	return r
}

// nadFindings are check --cluster's findings: NADs naming no pool, and NADs
// whose master netdev exists on nodes (by their nic.hwipam.io label) that the
// pool does not select.
func (s *clusterState) nadFindings(c *checker) {
	if s.nadNote != "" {
		c.add(SeverityWarning, "nad", "", s.nadNote, "the NAD checks need the NAD CRD and list rights on it")
		return
	}
	for _, e := range s.nadErrs {
		c.add(SeverityError, "nad", "", e, "Multus cannot use this NAD either: fix its spec.config")
	}
	problems, byRail := 0, 0
	for _, ref := range s.refs {
		problems += s.heldMaster(c, ref)
		if ref.rail != "" {
			byRail++
			_, findings := s.railReach(ref)
			for _, f := range findings {
				if f.severity != SeverityInfo {
					problems++
				}
				c.add(f.severity, "nad", ref.nad, f.msg, f.fix)
			}
			continue
		}
		for _, p := range ref.pools {
			kind, sel, ok := s.poolOf(p, ref.poolType)
			if !ok {
				problems++
				what := "pool"
				if ref.poolType != "" {
					what = ref.poolType
				}
				c.add(SeverityError, "nad", ref.nad, fmt.Sprintf("NAD %s names %s %q, which does not exist in %s", ref.nad, what, p, s.ns),
					"pods using this NAD get no address: create the pool, or fix poolName in the NAD")
				continue
			}
			if ref.master == "" || strings.ContainsAny(ref.master, "/") {
				continue
			}
			selected := s.selected(sel)
			for _, n := range s.nodes {
				if _, has := n.Labels[nicdiscovery.LabelPrefix+ref.master]; !has || slices.Contains(selected, n.Name) {
					continue
				}
				problems++
				c.add(SeverityWarning, "nad", ref.nad, fmt.Sprintf("NAD %s uses master %s, which node %s has, but %s %s does not "+
					"select that node", ref.nad, ref.master, n.Name, kind, p),
					"pods there using this NAD get no address: widen the pool's nodeSelector")
			}
		}
	}
	if problems == 0 {
		msg := fmt.Sprintf("%d nv-ipam NAD section(s) name existing pools that select their nodes", len(s.refs))
		if byRail > 0 {
			msg = fmt.Sprintf("%d nv-ipam NAD section(s) find their pools: %d by name, which select their nodes, and %d by rail, "+
				"whose pools have a block on each node with the rail", len(s.refs), len(s.refs)-byRail, byRail)
		}
		c.add(SeverityOK, "nad", "", msg, "")
	}
}

// claimFindings are check --cluster's list of the NIC ports DRA claims hold,
// node by node: what a pod whose claim "cannot allocate all claims" waits for.
func (s *clusterState) claimFindings(c *checker) {
	if s.claimNote != "" {
		c.add(SeverityInfo, "dra-claims", "", s.claimNote, "")
		return
	}
	for _, cp := range s.claims {
		port := cp.device
		if cp.data.HostNetdev != "" || cp.data.PCIAddress != "" {
			port += " (" + strings.Trim(cp.data.HostNetdev+", "+cp.data.PCIAddress, ", ") + ")"
		}
		on := "on no one node"
		if cp.node != "" {
			on = "on node " + cp.node
		}
		c.add(SeverityInfo, "dra-claims", "claim "+cp.claim, fmt.Sprintf("holds port %s %s, rail %s, pool(s) %s, address(es) %s: "+
			"no other claim or NAD gets it until the claim's pod is gone", port, on, dash(cp.data.Rail),
			dash(strings.Join(cp.data.Pools, ",")), dash(strings.Join(cp.ips, ","))), "")
	}
}

// heldMaster reports a NAD whose master is a port a DRA claim holds: its pods
// on that node fail with "Link not found". It returns how many it reported.
func (s *clusterState) heldMaster(c *checker, ref nadRef) int {
	if ref.master == "" {
		return 0
	}
	problems := 0
	for _, cp := range s.claims {
		if cp.data.HostNetdev != ref.master {
			continue
		}
		problems++
		on := "its node"
		if cp.node != "" {
			on = "node " + cp.node
		}
		c.add(SeverityWarning, "nad", ref.nad, fmt.Sprintf("NAD %s uses master %s, which DRA claim %s holds on %s: pods "+
			"there using this NAD fail with \"Link not found\" (the port is in the claim's pod)", ref.nad, ref.master, cp.claim, on),
			"one owner per port: move this workload to a claim too, or give the NAD another master, or delete the claim's pod "+
				"(docs/dra.md, With Multus NADs)")
	}
	return problems
}

// clusterTableWithBlocks is clusterTable followed by every pool's block on each
// node, pool by pool, nodes in name order.
func clusterTableWithBlocks(w io.Writer, v any) error {
	if err := clusterTable(w, v); err != nil {
		return err
	}
	r := v.(*ClusterReport)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nPOOL\tKIND\tNODE\tBLOCK")
	for _, p := range r.Pools {
		for _, n := range slices.Sorted(maps.Keys(p.Blocks)) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, p.Kind, n, p.Blocks[n])
		}
	}
	return tw.Flush()
}

func clusterTable(w io.Writer, v any) error {
	r := v.(*ClusterReport)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// Nodes (selected, with a block, selected without one), then blocks: those
	// assigned of those the layout has, as a share.
	fmt.Fprintln(tw, "POOL\tKIND\tRAIL\tRANGE\tNODES SELECTED\tNODES WITH BLOCK\tWITHOUT BLOCK\tBLOCKS USED\tNADS\tDRA CLAIMS\tBLOCKS IN")
	omitted := false
	for _, p := range r.Pools {
		in := p.BlocksIn
		if in == "" {
			in = v1alpha1.BlocksInStatus
		}
		omitted = omitted || in == v1alpha1.BlocksInNodeIPAM
		selected := strconv.Itoa(p.Selected)
		if p.Selected == 0 {
			selected = "0 (selects no node)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d/%d (%.1f%%)\t%s\t%s\t%s\n", p.Name, p.Kind, dash(p.Rail), p.Range, selected, len(p.Blocks),
			dash(strings.Join(p.WithoutBlock, ",")), len(p.Blocks), p.UsableBlocks, p.Utilisation, dash(strings.Join(p.NADs, ",")),
			dash(strings.Join(p.Claims, ",")), in)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if omitted {
		if _, err := fmt.Fprintln(w, "note: a pool whose BLOCKS IN is NodeIPAM has more nodes than ipam-controller lists in its status "+
			"(--status-allocations-max-nodes): its blocks were read from the nodes' NodeIPAM objects"); err != nil {
			return err
		}
	}
	for _, n := range r.NADsWithoutPool {
		if _, err := fmt.Fprintf(w, "NAD without pool: %s\n", n); err != nil {
			return err
		}
	}
	for _, n := range r.NADsRefused {
		if _, err := fmt.Fprintf(w, "NAD refused by the plugin: %s\n", n); err != nil {
			return err
		}
	}
	if r.NADNote != "" {
		if _, err := fmt.Fprintf(w, "note: %s\n", r.NADNote); err != nil {
			return err
		}
	}
	if r.ClaimNote != "" {
		if _, err := fmt.Fprintf(w, "note: %s\n", r.ClaimNote); err != nil {
			return err
		}
	}
	return nil
}
