package v1alpha1

import "strings"

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
		return cidrPoolKeyPrefix + name
	}
	return name
}

const cidrPoolKeyPrefix = "cidrpool/"

// SplitPoolKey is the inverse of PoolKey: the kind and name of a pool key.
func SplitPoolKey(key string) (kind, name string) {
	if n, ok := strings.CutPrefix(key, cidrPoolKeyPrefix); ok {
		return KindCIDRPool, n
	}
	return KindIPPool, key
}

// HeldAnnotation is the Node annotation in which the node daemon reports, as JSON
// of PoolKey to PoolHold, what it may still hand out or holds in every pool it
// knows: the block it allocates from and the addresses it holds outside that
// block (orphans of an earlier block, or of a pool that was deleted). The
// ipam-controller never gives another node a block overlapping what a node
// reports, and treats a reported block that status no longer gives the node as
// still held until the daemon reports again: the report is the daemon's
// acknowledgement that it stopped allocating there.
const HeldAnnotation = "ipam.hwipam.io/held"

// LabelRail is the label that binds an IPPool or CIDRPool to a rail: attachments
// whose pool is picked by rail (a network config's "rail", a nic.hwipam.io DRA
// device) get their address from it (docs/rails.md).
const LabelRail = "nic.hwipam.io/rail"

// PoolHold is one pool's entry in HeldAnnotation.
// +kubebuilder:object:generate=false
type PoolHold struct {
	// Block is the range ("start-end") the daemon allocates from; empty when none.
	Block string `json:"block,omitempty"`
	// Held are the ranges ("start-end") of the addresses the daemon holds outside
	// Block, merged.
	Held []string `json:"held,omitempty"`
}
