package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ExcludeRange is an inclusive range of addresses that are never allocated.
type ExcludeRange struct {
	// startIP is the first excluded address.
	// +required
	StartIP string `json:"startIP"`
	// endIP is the last excluded address; it may equal startIP.
	// +required
	EndIP string `json:"endIP"`
}

// ExcludeIndexRange is an inclusive range of indexes, counted from 0 at the first
// address of each node's block, that are never allocated on any node.
type ExcludeIndexRange struct {
	// startIndex is the first excluded index.
	// +required
	// +kubebuilder:validation:Minimum=0
	StartIndex int `json:"startIndex"`
	// endIndex is the last excluded index; it may equal startIndex.
	// +required
	// +kubebuilder:validation:Minimum=0
	EndIndex int `json:"endIndex"`
}

// Route is a static route handed to every interface that gets an address from the
// pool; its next hop is the pool's (or the node block's) gateway.
type Route struct {
	// dst is the destination in CIDR notation, of the pool's address family.
	// +required
	Dst string `json:"dst"`
}

// Condition types set on IPPool and CIDRPool status.
const (
	// ConditionReady is True when every selected node has a block.
	ConditionReady = "Ready"
	// ConditionExhausted is True when some selected nodes have no block because the
	// pool has no free block left.
	ConditionExhausted = "Exhausted"
	// ConditionInvalidSpec is True when the spec fails validation; the pool then has
	// no blocks until it is fixed.
	ConditionInvalidSpec = "InvalidSpec"
	// ConditionConflict is True when the pool's range overlaps an older pool in the
	// same namespace; the pool then has no blocks until the overlap is removed.
	ConditionConflict = "Conflict"
	// ConditionListed is True while status.allocations lists every node's block,
	// False above the controller's threshold (--status-allocations-max-nodes),
	// where each node's block is in its NodeIPAM object only.
	ConditionListed = "AllocationsListed"
	// ConditionOrphans is True when node daemons report addresses of the pool held
	// outside their current block (after a layout edit, or a block released while
	// in use); those ranges are kept from every other node until released.
	ConditionOrphans = "OrphansHeld"
	// ConditionRecordsUntrusted is True while nodes whose NodeIPAM someone other
	// than ipam-controller wrote report holding addresses in the pool: those
	// ranges are kept from every other node until the controller has written
	// the records again. Absent otherwise.
	ConditionRecordsUntrusted = "RecordsUntrusted"
)

// PoolStatusCommon holds the status fields hwipam adds to both pool kinds. An API
// server that runs nv-ipam's own CRD prunes them; nothing depends on reading them back.
// The node counts are written also when 0, so that `kubectl get` prints 0 for a
// pool that selects no node rather than a blank; a pruned status is told apart by
// its conditions and observedGeneration, which every written status has.
type PoolStatusCommon struct {
	// conditions tell whether the pool is ready, exhausted, invalid or in conflict.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the spec generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// selectedNodes is how many nodes match the nodeSelector.
	// +optional
	SelectedNodes int32 `json:"selectedNodes"`
	// allocatedNodes is how many nodes hold a block, including nodes whose block is
	// kept through its release grace period.
	// +optional
	AllocatedNodes int32 `json:"allocatedNodes"`
	// blocksIn says where the nodes' blocks are: "status" while
	// status.allocations lists every one, "NodeIPAM" above the controller's
	// threshold (status.allocations is then empty; each node's block is in the
	// NodeIPAM object named after the node, in the pool's namespace). Empty when
	// written by nv-ipam or an earlier hwipam: the list is complete.
	// +optional
	BlocksIn string `json:"blocksIn,omitempty"`
}

// Values of PoolStatusCommon.BlocksIn.
const (
	BlocksInStatus   = "status"
	BlocksInNodeIPAM = "NodeIPAM"
)
