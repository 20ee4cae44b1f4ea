package v1alpha1

// Kinds of pools, as reconcile requests, metrics and the node store name them.
const (
	KindIPPool   = "IPPool"
	KindCIDRPool = "CIDRPool"
)

// PoolsInUseAnnotation is the Node annotation in which the node daemon lists,
// comma separated, the pools it holds live allocations in, by PoolKey. The
// ipam-controller keeps a node's block in a listed pool even after the node stops
// matching the pool's nodeSelector.
const PoolsInUseAnnotation = "ipam.hwipam.io/pools-in-use"

// PoolKey is how the node daemon's store and the pools-in-use annotation name a
// pool: the IPPool's name, or "cidrpool/<name>" (nv-ipam's store keys).
func PoolKey(kind, name string) string {
	if kind == KindCIDRPool {
		return "cidrpool/" + name
	}
	return name
}
