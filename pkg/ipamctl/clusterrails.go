package ipamctl

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
)

// labelRail binds a pool to a rail (docs/rails.md); ipam-node reads the same label.
const labelRail = v1alpha1.LabelRail

// railKind is the kind of pool a rail section picks: its poolType, IPPool by default.
func (r nadRef) railKind() string {
	if r.poolType == "cidrpool" {
		return v1alpha1.KindCIDRPool
	}
	return v1alpha1.KindIPPool
}

// railPools are the pools of kind labelled for rail, sorted.
func (s *clusterState) railPools(kind, rail string) []string {
	var out []string
	if kind == v1alpha1.KindIPPool {
		for i := range s.ipPools {
			if s.ipPools[i].Labels[labelRail] == rail {
				out = append(out, s.ipPools[i].Name)
			}
		}
	} else {
		for i := range s.cidrPools {
			if s.cidrPools[i].Labels[labelRail] == rail {
				out = append(out, s.cidrPools[i].Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// anyRailPool says whether a pool of kind is labelled for some rail.
func (s *clusterState) anyRailPool(kind string) bool {
	if kind == v1alpha1.KindIPPool {
		return slices.ContainsFunc(s.ipPools, func(p v1alpha1.IPPool) bool { return p.Labels[labelRail] != "" })
	}
	return slices.ContainsFunc(s.cidrPools, func(p v1alpha1.CIDRPool) bool { return p.Labels[labelRail] != "" })
}

// hasBlock says whether the pool gives node a block.
func (s *clusterState) hasBlock(kind, name, node string) bool {
	if kind == v1alpha1.KindIPPool {
		for i := range s.ipPools {
			if s.ipPools[i].Name == name {
				return slices.ContainsFunc(s.ipPools[i].Status.Allocations, func(a v1alpha1.Allocation) bool { return a.NodeName == node })
			}
		}
		return false
	}
	for i := range s.cidrPools {
		if s.cidrPools[i].Name == name {
			return slices.ContainsFunc(s.cidrPools[i].Status.Allocations, func(a v1alpha1.CIDRPoolAllocation) bool { return a.NodeName == node })
		}
	}
	return false
}

// nodeRails maps each NIC port a node's labels show (nic.hwipam.io/<port>=eth|ib)
// to its rail, as ipam-node names the rail of a device's physical function: the
// rail map's rail that names the port (nic.hwipam.io/rail.<rail>=<port>, the first
// by name), else the port's own name.
func nodeRails(n *corev1.Node) map[string]string {
	out := map[string]string{}
	for k, v := range n.Labels {
		port, ok := strings.CutPrefix(k, nicdiscovery.LabelPrefix)
		if !ok || strings.Contains(port, ".") || (v != "eth" && v != "ib") {
			continue
		}
		out[port] = port
	}
	for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
		rail, ok := strings.CutPrefix(k, nicdiscovery.LabelPrefix+"rail.")
		if port := n.Labels[k]; ok && out[port] == port {
			out[port] = rail
		}
	}
	return out
}

// railUse is a node a rail section is used on, and the rail it picks there.
type railUse struct {
	node, rail string
	// certain is false where the rail depends on the device the attachment is
	// given ("auto" with a deviceID from a device plugin): any rail of the node.
	certain bool
}

// railUses lists where a rail section picks pools, and by which rail: with a
// master (or host-device's device), the nodes that have that netdev (its rail for
// "auto"); without, for a named rail the nodes that have the rail, for "auto"
// every rail of every node.
func (s *clusterState) railUses(ref nadRef) []railUse {
	var out []railUse
	netdev := strings.ReplaceAll(ref.master, ".", "_") // as the port's label key spells it
	if strings.Contains(netdev, "/") {
		netdev = ""
	}
	for i := range s.nodes {
		n := &s.nodes[i]
		nr := nodeRails(n)
		switch {
		case netdev != "":
			rail, ok := nr[netdev]
			if !ok {
				continue
			}
			if ref.rail != "auto" {
				rail = ref.rail
			}
			out = append(out, railUse{node: n.Name, rail: rail, certain: true})
		case ref.rail == "auto":
			for _, rail := range slices.Sorted(maps.Values(nr)) {
				if len(out) == 0 || out[len(out)-1] != (railUse{node: n.Name, rail: rail}) {
					out = append(out, railUse{node: n.Name, rail: rail})
				}
			}
		case slices.Contains(slices.Collect(maps.Values(nr)), ref.rail):
			out = append(out, railUse{node: n.Name, rail: ref.rail, certain: true})
		}
	}
	return out
}

// railFinding is a problem of a rail section.
type railFinding struct {
	severity, msg, fix string
	// withoutPool is the NAD's line under "NAD without pool" in pools --cluster,
	// refused its line under "NAD refused"; "" when the finding has none.
	withoutPool, refused string
}

// railReach resolves a rail section as the plugin and ipam-node would on each
// node it is used on: the pools it reaches ("kind/name"), and what fails.
func (s *clusterState) railReach(ref nadRef) ([]string, []railFinding) {
	if ref.refused != "" {
		return nil, []railFinding{{severity: SeverityError, msg: fmt.Sprintf("NAD %s: %s", ref.nad, ref.refused),
			fix:     "every ADD with it fails: remove poolName (the rail picks the pools), or remove rail to name them",
			refused: ref.nad + ": " + ref.refused}}
	}
	kind := ref.railKind()
	var findings []railFinding
	var reached []string
	noPool := func(rail string) railFinding {
		return railFinding{severity: SeverityError,
			msg:         fmt.Sprintf("NAD %s: rail %q: no %s in namespace %s is labelled %s=%s", ref.nad, rail, kind, s.ns, labelRail, rail),
			fix:         "pods using this NAD get no address (code 11): label the rail's pool (two, IPv4 and IPv6, for dual-stack), or fix ipam.rail",
			withoutPool: fmt.Sprintf("%s rail %q (no %s labelled %s=%s)", ref.nad, rail, kind, labelRail, rail)}
	}
	tooMany := func(rail string, pools []string) railFinding {
		return railFinding{severity: SeverityError,
			msg: fmt.Sprintf("NAD %s: rail %q: %d %ss are labelled %s=%s (%s); a rail has one pool, or two for dual-stack",
				ref.nad, rail, len(pools), kind, labelRail, rail, strings.Join(pools, ", ")),
			fix:     "the plugin refuses every ADD on this rail (code 7): keep the label on one pool per address family",
			refused: fmt.Sprintf("%s: rail %q has %d %ss (%s)", ref.nad, rail, len(pools), kind, strings.Join(pools, ", "))}
	}
	checked := map[string]bool{} // rails whose pool count is reported
	noBlock := map[string][]string{}
	if ref.rail != "auto" {
		// A named rail's pools must exist wherever the NAD is used, also before
		// any node has the rail.
		switch pools := s.railPools(kind, ref.rail); {
		case len(pools) == 0:
			return nil, []railFinding{noPool(ref.rail)}
		case len(pools) > 2:
			return nil, []railFinding{tooMany(ref.rail, pools)}
		}
		checked[ref.rail] = true
	} else if !s.anyRailPool(kind) {
		return nil, []railFinding{{severity: SeverityError,
			msg:         fmt.Sprintf("NAD %s: rail \"auto\": no %s in namespace %s is labelled %s", ref.nad, kind, s.ns, labelRail),
			fix:         "pods using this NAD get no address (code 11): label each rail's pool " + labelRail + "=<rail> (see docs/rails.md)",
			withoutPool: fmt.Sprintf("%s rail \"auto\" (no %s labelled %s)", ref.nad, kind, labelRail)}}
	}
	for _, u := range s.railUses(ref) {
		pools := s.railPools(kind, u.rail)
		switch {
		case len(pools) == 0 && !u.certain:
			// "auto" by a device plugin's device: whether a device of this rail
			// (a storage or management NIC, say) is ever given is not known here.
			continue
		case len(pools) == 0 || len(pools) > 2:
			if !checked[u.rail] {
				checked[u.rail] = true
				f := tooMany(u.rail, pools)
				if len(pools) == 0 {
					f = noPool(u.rail)
				}
				if ref.master != "" {
					f.msg += fmt.Sprintf(" (the rail of its master %s)", ref.master)
				}
				findings = append(findings, f)
			}
			continue
		}
		for _, p := range pools {
			if k := kind + "/" + p; !slices.Contains(reached, k) {
				reached = append(reached, k)
			}
			if !s.hasBlock(kind, p, u.node) {
				noBlock[p] = append(noBlock[p], u.node)
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(noBlock)) {
		findings = append(findings, railFinding{severity: SeverityWarning,
			msg: fmt.Sprintf("NAD %s reaches %s %s by rail, and the pool has no block on node(s) %s, which have its rail",
				ref.nad, kind, p, strings.Join(noBlock[p], ",")),
			fix: "pods there using this NAD get no address (code 11, pool has no block on this node): widen the pool's " +
				"nodeSelector to the rail's nodes, or see its conditions (kubectl describe)"})
	}
	slices.Sort(reached)
	return reached, findings
}
