package ipamctl

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// fillFromNodeIPAMs gives the pools whose status lists no block because they
// have more nodes than ipam-controller lists (status.blocksIn NodeIPAM) the
// blocks their nodes' NodeIPAMs hold, so that every view reads one list: all
// nodes' (node == ""), or node's only (one object read). Objects someone other
// than the controller wrote are left out, as the daemons leave them. It says
// how many pools it filled; a NodeIPAM it cannot read leaves them empty.
func fillFromNodeIPAMs(ctx context.Context, cl client.Client, ns, node string, ips []v1alpha1.IPPool, cidrs []v1alpha1.CIDRPool) int {
	omitted := false
	for i := range ips {
		omitted = omitted || ips[i].Status.BlocksIn == v1alpha1.BlocksInNodeIPAM
	}
	for i := range cidrs {
		omitted = omitted || cidrs[i].Status.BlocksIn == v1alpha1.BlocksInNodeIPAM
	}
	if !omitted {
		return 0
	}
	var objs []nodeipamv1.NodeIPAM
	if node == "" {
		var list nodeipamv1.NodeIPAMList
		if err := cl.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0
		}
		objs = list.Items
	} else {
		var o nodeipamv1.NodeIPAM
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: node}, &o); err != nil {
			return 0
		}
		objs = []nodeipamv1.NodeIPAM{o}
	}
	type ref struct {
		kind, name string
	}
	byPool := map[ref][]struct {
		node string
		b    nodeipamv1.NodeBlock
	}{}
	for i := range objs {
		if !nodeipamv1.OwnedByController(&objs[i]) {
			continue
		}
		for _, b := range objs[i].Spec.Blocks {
			k := ref{b.Kind, b.Pool}
			byPool[k] = append(byPool[k], struct {
				node string
				b    nodeipamv1.NodeBlock
			}{objs[i].Name, b})
		}
	}
	filled := 0
	for i := range ips {
		p := &ips[i]
		if p.Status.BlocksIn != v1alpha1.BlocksInNodeIPAM {
			continue
		}
		filled++
		for _, x := range byPool[ref{v1alpha1.KindIPPool, p.Name}] {
			if x.b.PoolUID == p.UID {
				p.Status.Allocations = append(p.Status.Allocations, v1alpha1.Allocation{NodeName: x.node, StartIP: x.b.StartIP, EndIP: x.b.EndIP})
			}
		}
	}
	for i := range cidrs {
		p := &cidrs[i]
		if p.Status.BlocksIn != v1alpha1.BlocksInNodeIPAM {
			continue
		}
		filled++
		for _, x := range byPool[ref{v1alpha1.KindCIDRPool, p.Name}] {
			if x.b.PoolUID == p.UID {
				p.Status.Allocations = append(p.Status.Allocations, v1alpha1.CIDRPoolAllocation{NodeName: x.node, Prefix: x.b.Prefix, Gateway: x.b.Gateway})
			}
		}
	}
	return filled
}

// recordFindings are check --cluster's findings on the NodeIPAMs, the record of
// which node holds which block that ipam-controller plans from: one written by
// someone other than the controller (its daemon ignores it), one being deleted
// (the controller's finalizer keeps it until the controller writes it again),
// and, for a pool whose status lists its blocks, a block a record gives a node
// that the status does not list (its status writes are not going through).
func recordFindings(ctx context.Context, c *checker, cl client.Client, ns string, ips []v1alpha1.IPPool, cidrs []v1alpha1.CIDRPool) {
	var list nodeipamv1.NodeIPAMList
	switch err := cl.List(ctx, &list, client.InNamespace(ns)); {
	case meta.IsNoMatchError(err):
		c.add(SeverityInfo, "records", "", "the NodeIPAM CRD is not installed: every pool's status lists every block, as nv-ipam's does", "")
		return
	case err != nil:
		c.add(SeverityWarning, "records", "", fmt.Sprintf("cannot list NodeIPAMs in %s: %v", ns, err),
			"the record checks need list rights on nodeipams.ipam.hwipam.io")
		return
	}
	listed := map[string]string{} // "kind/pool/node" → block, of pools whose status lists their blocks
	inStatus := map[string]bool{} // "kind/pool" of those pools
	for i := range ips {
		p := &ips[i]
		if p.Status.BlocksIn == v1alpha1.BlocksInNodeIPAM {
			continue
		}
		inStatus[v1alpha1.KindIPPool+"/"+p.Name+"/"+string(p.UID)] = true
		for _, a := range p.Status.Allocations {
			listed[v1alpha1.KindIPPool+"/"+p.Name+"/"+a.NodeName] = a.StartIP + "-" + a.EndIP
		}
	}
	for i := range cidrs {
		p := &cidrs[i]
		if p.Status.BlocksIn == v1alpha1.BlocksInNodeIPAM {
			continue
		}
		inStatus[v1alpha1.KindCIDRPool+"/"+p.Name+"/"+string(p.UID)] = true
		for _, a := range p.Status.Allocations {
			listed[v1alpha1.KindCIDRPool+"/"+p.Name+"/"+a.NodeName] = a.Prefix
		}
	}
	problems := 0
	for i := range list.Items {
		o := &list.Items[i]
		subject := "NodeIPAM " + ns + "/" + o.Name
		if !nodeipamv1.OwnedByController(o) {
			problems++
			c.add(SeverityError, "records", subject, fmt.Sprintf("NodeIPAM %s was written by someone other than ipam-controller: "+
				"node %s's daemon ignores it and keeps the blocks it had, until the controller writes it again (it does at once while it runs)",
				o.Name, o.Name), fmt.Sprintf("see who wrote it: kubectl get nodeipam -n %s %s -o yaml --show-managed-fields; "+
				"deploy/policy's hwipam-records-controller-only refuses such writes (is it applied?)", ns, o.Name))
			continue
		}
		if o.DeletionTimestamp != nil {
			problems++
			c.add(SeverityWarning, "records", subject, fmt.Sprintf("NodeIPAM %s is being deleted: its finalizer %s keeps it, and node %s "+
				"keeps its blocks, until ipam-controller has written it again", o.Name, nodeipamv1.Finalizer, o.Name),
				fmt.Sprintf("is ipam-controller running? kubectl -n %s get pods -l app.kubernetes.io/name=hwipam-controller", ns))
			continue
		}
		for _, b := range o.Spec.Blocks {
			if !inStatus[b.Kind+"/"+b.Pool+"/"+string(b.PoolUID)] {
				continue
			}
			want := b.StartIP + "-" + b.EndIP
			if b.Kind == v1alpha1.KindCIDRPool {
				want = b.Prefix
			}
			if got := listed[b.Kind+"/"+b.Pool+"/"+o.Name]; got != want {
				problems++
				c.add(SeverityWarning, "records", subject, fmt.Sprintf("%s %s's status does not list node %s's block %s, which its NodeIPAM "+
					"gives it (the status lists %s): the pool's status writes are not going through; the NodeIPAM is what the "+
					"controller plans from and the daemon allocates from, so no block is given twice, but nv-ipam tools and "+
					"daemons that read the status see an old list", b.Kind, b.Pool, o.Name, want, dash(got)),
					fmt.Sprintf("kubectl describe %s -n %s %s (events, conditions), and ipam-controller's log for the status writes",
						strings.ToLower(b.Kind), ns, b.Pool))
			}
		}
	}
	for _, o := range recordOverlaps(list.Items, time.Now()) {
		problems++
		c.add(SeverityError, "records", "NodeIPAM "+ns+"/"+o.node, o.msg,
			fmt.Sprintf("kubectl get nodeipam -n %s %s %s -o yaml; ipam-controller's log; then ipamctl check on both nodes "+
				"for the addresses in use there (docs/troubleshooting.md)", ns, o.node, o.other))
	}
	if problems == 0 {
		retired, nodes := 0, 0
		for i := range list.Items {
			retired += len(list.Items[i].Spec.Retired)
			if len(list.Items[i].Spec.Retired) > 0 {
				nodes++
			}
		}
		c.add(SeverityOK, "records", "", fmt.Sprintf("%d NodeIPAM(s), each written by ipam-controller, none giving a range "+
			"another holds, and the pools' status lists what they give; %d retired block(s) on %d node(s) kept from other "+
			"nodes while their daemons may hold addresses there", len(list.Items), retired, nodes), "")
	}
}

// overlap is a range two records give (or one keeps retired and reserved while
// the other gives it).
type overlap struct{ node, other, msg string }

// recordOverlaps finds, per pool, ranges that two controller-written records
// claim at once: two nodes' blocks, or a node's block and another node's retired
// block while it is reserved (no daemon reports are read here, so a retired
// block past its reservation is not checked).
func recordOverlaps(recs []nodeipamv1.NodeIPAM, now time.Time) []overlap {
	type claim struct {
		node, what string
		r          iprange.Range
		current    bool
	}
	byPool := map[string][]claim{}
	for i := range recs {
		o := &recs[i]
		if !nodeipamv1.OwnedByController(o) {
			continue
		}
		for _, b := range o.Spec.Blocks {
			text := b.StartIP + "-" + b.EndIP
			if b.Prefix != "" {
				text = b.Prefix
			}
			if r, err := b.Range(); err == nil {
				key := b.Kind + " " + b.Pool
				byPool[key] = append(byPool[key], claim{node: o.Name, what: "block " + text, r: r, current: true})
			}
		}
		for _, rb := range o.Spec.Retired {
			r, err := iprange.ParseRange(rb.Range)
			if err != nil || rb.ReservedUntil == nil || !now.Before(rb.ReservedUntil.Time) {
				continue
			}
			key := rb.Kind + " " + rb.Pool
			byPool[key] = append(byPool[key], claim{node: o.Name, what: "retired block " + rb.Range + " (reserved until " +
				rb.ReservedUntil.UTC().Format(time.RFC3339) + ")", r: r})
		}
	}
	var out []overlap
	for _, pool := range slices.Sorted(maps.Keys(byPool)) {
		cs := byPool[pool]
		slices.SortFunc(cs, func(a, b claim) int { return a.r.Start.Compare(b.r.Start) })
		for i := range cs {
			for j := i + 1; j < len(cs) && cs[j].r.Start.Compare(cs[i].r.End) <= 0; j++ {
				a, b := cs[i], cs[j]
				if a.node == b.node || !(a.current || b.current) {
					continue
				}
				out = append(out, overlap{node: a.node, other: b.node, msg: fmt.Sprintf("%s: node %s's %s and node %s's %s "+
					"overlap: two daemons may hand out the same addresses", pool, a.node, a.what, b.node, b.what)})
			}
		}
	}
	return out
}
