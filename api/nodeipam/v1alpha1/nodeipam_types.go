package v1alpha1

import (
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	poolv1 "github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// Kind is NodeIPAM's kind.
const Kind = "NodeIPAM"

// FieldManager is the field manager the ipam-controller writes NodeIPAMs with. A
// node daemon uses a NodeIPAM only while every field of its spec is managed by it:
// a block edited in by hand is not allocated from (the controller restores the
// object at once).
const FieldManager = "hwipam-controller"

// Finalizer is on every NodeIPAM the controller writes: a NodeIPAM is the record
// of which blocks its node may hold addresses in, and one deleted by anyone else
// stays (terminating, still read by the controller and the node's daemon) until
// the controller has read it and written it again.
const Finalizer = "ipam.hwipam.io/record"

// NodeIPAM holds one node's blocks of every pool. The ipam-controller is its only
// writer; the node's ipam-node watches it by name, so a block given to or taken
// from another node sends it nothing.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=nipam
// +kubebuilder:printcolumn:name="Pools",type=string,JSONPath=`.spec.blocks[*].pool`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeIPAM struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the controller gave the node.
	// +required
	Spec NodeIPAMSpec `json:"spec"`
}

// NodeIPAMSpec lists a node's blocks.
type NodeIPAMSpec struct {
	// blocks are the node's blocks, at most one per pool, sorted by kind and pool.
	// A pool that gives the node no block is not listed: the daemon allocates
	// nothing new from it.
	// +optional
	// +listType=atomic
	Blocks []NodeBlock `json:"blocks,omitempty"`
	// retired are the blocks taken from the node (by a layout edit, a release,
	// or its pool deleted or created again) that its daemon may still hold
	// addresses in, sorted by kind, pool and range. No daemon allocates from
	// them, and while one is listed the controller gives no other node an
	// address in it that the node's daemon reports holding; until its
	// reservedUntil, none at all. An entry goes once its daemon reports holding
	// nothing in it (after the grace period), or its node is gone that long.
	// +optional
	// +listType=atomic
	Retired []RetiredBlock `json:"retired,omitempty"`
	// daemonReports: the controller has seen the node's daemon report what it
	// holds (the Node's ipam.hwipam.io/held annotation). While the Node shows no
	// report (registered again while its daemon is down, the controller
	// restarted meanwhile), the controller takes that daemon to hold addresses
	// in the node's blocks and in its retired blocks marked held, until the
	// daemon reports again or the Node is gone for the grace period. Unset for a
	// daemon that does not report (it may not annotate its Node): its retired
	// blocks are kept for the grace period only.
	// +optional
	DaemonReports bool `json:"daemonReports,omitempty"`
}

// RetiredBlock is a block a node no longer has but may still hold addresses in.
type RetiredBlock struct {
	// kind is IPPool or CIDRPool.
	// +required
	// +kubebuilder:validation:Enum=IPPool;CIDRPool
	Kind string `json:"kind"`
	// pool is the pool's name (in the same namespace).
	// +required
	Pool string `json:"pool"`
	// poolUID is the UID of the pool that gave the block: a pool created again
	// under its name has another.
	// +optional
	PoolUID types.UID `json:"poolUID,omitempty"`
	// range is the block, as "startIP-endIP".
	// +required
	Range string `json:"range"`
	// since is when the block was taken from the node.
	// +required
	Since metav1.Time `json:"since"`
	// reservedUntil: until then no other node gets any address of the block,
	// whatever the daemons report (a block taken by a layout edit, for the
	// grace period); unset for a block the node held through a grace period
	// already.
	// +optional
	ReservedUntil *metav1.Time `json:"reservedUntil,omitempty"`
	// held: the node's daemon reported holding addresses in the block when the
	// controller last read its report (see NodeIPAMSpec.DaemonReports).
	// +optional
	Held bool `json:"held,omitempty"`
}

// NodeBlock is the node's block of one pool. What the daemon needs of the pool's
// spec is in the namespace's PoolSpecs, once for every node.
type NodeBlock struct {
	// kind is IPPool or CIDRPool.
	// +required
	// +kubebuilder:validation:Enum=IPPool;CIDRPool
	Kind string `json:"kind"`
	// pool is the pool's name (in the same namespace).
	// +required
	Pool string `json:"pool"`
	// poolUID is the pool's UID: a block of a pool deleted and created again
	// under its name is not the new pool's.
	// +required
	PoolUID types.UID `json:"poolUID"`
	// startIP and endIP are an IPPool's block, as in its status.allocations.
	// +optional
	StartIP string `json:"startIP,omitempty"`
	// +optional
	EndIP string `json:"endIP,omitempty"`
	// prefix and gateway are a CIDRPool's block, as in its status.allocations.
	// +optional
	Prefix string `json:"prefix,omitempty"`
	// +optional
	Gateway string `json:"gateway,omitempty"`
	// poolGeneration is the pool's metadata.generation whose spec the block was
	// cut from. A daemon uses the block only with that spec or a later one (the
	// PoolSpecs entry's generation), never with an older spec's exclusions or
	// gateway; until then it keeps the block it had. 0: any spec of the pool's UID
	// (written by a controller before this field).
	// +optional
	PoolGeneration int64 `json:"poolGeneration,omitempty"`
}

// Range is the block's range: an IPPool's startIP-endIP, or a CIDRPool's prefix.
func (b NodeBlock) Range() (iprange.Range, error) {
	if b.Prefix != "" {
		p, err := netip.ParsePrefix(b.Prefix)
		if err != nil {
			return iprange.Range{}, err
		}
		return iprange.PrefixRange(p.Masked()), nil
	}
	return iprange.ParseRange(b.StartIP + "-" + b.EndIP)
}

// PoolSpecsName is the name of the one PoolSpecs object of a pools' namespace.
const PoolSpecsName = "pools"

// PoolSpecs holds, once for every node, what a node daemon needs of each pool's
// spec to allocate from its block: the ipam-controller writes one, named
// PoolSpecsName, in the pools' namespace, and every daemon watches it by name. It
// changes only when a pool is created, deleted, re-specified or relabelled for a
// rail, never when a node joins or leaves.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:printcolumn:name="Pools",type=string,JSONPath=`.spec.pools[*].pool`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PoolSpecs struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec lists the pools.
	// +required
	Spec PoolSpecsSpec `json:"spec"`
}

// PoolSpecsSpec lists the pools of the namespace.
type PoolSpecsSpec struct {
	// pools are the pools, sorted by kind and name.
	// +optional
	// +listType=atomic
	Pools []PoolSpec `json:"pools,omitempty"`
}

// PoolSpec is one pool's spec, as a node daemon needs it.
type PoolSpec struct {
	// kind is IPPool or CIDRPool.
	// +required
	// +kubebuilder:validation:Enum=IPPool;CIDRPool
	Kind string `json:"kind"`
	// pool is the pool's name.
	// +required
	Pool string `json:"pool"`
	// poolUID is the pool's UID; a NodeIPAM block is of this pool only when its
	// poolUID is this.
	// +required
	PoolUID types.UID `json:"poolUID"`
	// generation is the pool's metadata.generation the spec is of.
	// +optional
	Generation int64 `json:"generation,omitempty"`
	// rail is the pool's nic.hwipam.io/rail label, when it has one.
	// +optional
	Rail string `json:"rail,omitempty"`
	// ipPool is the IPPool's spec without its nodeSelector.
	// +optional
	IPPool *poolv1.IPPoolSpec `json:"ipPool,omitempty"`
	// cidrPool is the CIDRPool's spec without its nodeSelector and
	// staticAllocations.
	// +optional
	CIDRPool *poolv1.CIDRPoolSpec `json:"cidrPool,omitempty"`
}

// PoolSpecsList is a list of PoolSpecs.
//
// +kubebuilder:object:root=true
type PoolSpecsList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PoolSpecs `json:"items"`
}

// NodeIPAMList is a list of NodeIPAMs.
//
// +kubebuilder:object:root=true
type NodeIPAMList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeIPAM `json:"items"`
}
