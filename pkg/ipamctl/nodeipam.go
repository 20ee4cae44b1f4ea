package ipamctl

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
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
