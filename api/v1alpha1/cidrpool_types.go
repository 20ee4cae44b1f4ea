package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CIDRPoolSpec describes a network cut into one prefix per selected node.
type CIDRPoolSpec struct {
	// cidr is the pool's network in CIDR notation, IPv4 or IPv6.
	// +required
	CIDR string `json:"cidr"`
	// perNodeNetworkPrefix is the prefix length of each node's share of cidr.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	PerNodeNetworkPrefix int32 `json:"perNodeNetworkPrefix"`
	// gatewayIndex, when set, makes the address with this index in each node's
	// prefix that node's gateway; unset means no gateway.
	// +optional
	// +kubebuilder:validation:Minimum=0
	GatewayIndex *int32 `json:"gatewayIndex,omitempty"`
	// exclusions are address ranges inside cidr that are never handed out.
	// +optional
	// +listType=atomic
	Exclusions []ExcludeRange `json:"exclusions,omitempty"`
	// perNodeExclusions are index ranges excluded in every node's prefix.
	// +optional
	// +listType=atomic
	PerNodeExclusions []ExcludeIndexRange `json:"perNodeExclusions,omitempty"`
	// staticAllocations pin prefixes: to a node, or, with an empty nodeName, away
	// from every node.
	// +optional
	// +listType=atomic
	StaticAllocations []CIDRPoolStaticAllocation `json:"staticAllocations,omitempty"`
	// nodeSelector chooses the nodes that get a prefix; empty means every node.
	// +optional
	NodeSelector *corev1.NodeSelector `json:"nodeSelector,omitempty"`
	// defaultGateway adds a default route through the node's gateway.
	// +optional
	DefaultGateway bool `json:"defaultGateway,omitempty"`
	// routes are static routes through the node's gateway.
	// +optional
	// +listType=atomic
	Routes []Route `json:"routes,omitempty"`
}

// CIDRPoolStaticAllocation pins one prefix of the pool.
type CIDRPoolStaticAllocation struct {
	// nodeName is the node that gets the prefix; empty reserves the prefix so that
	// no node gets it.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// gateway overrides gatewayIndex for this prefix; it must be inside the prefix.
	// +optional
	Gateway string `json:"gateway,omitempty"`
	// prefix is a prefix of cidr with length perNodeNetworkPrefix.
	// +required
	Prefix string `json:"prefix"`
}

// CIDRPoolAllocation is the prefix of a CIDRPool assigned to one node.
type CIDRPoolAllocation struct {
	// nodeName is the node that owns the prefix.
	// +required
	NodeName string `json:"nodeName"`
	// gateway is the node's gateway inside the prefix, when the pool has one.
	// +optional
	Gateway string `json:"gateway,omitempty"`
	// prefix is the node's prefix.
	// +required
	Prefix string `json:"prefix"`
}

// CIDRPoolStatus is written by the ipam-controller only.
type CIDRPoolStatus struct {
	// allocations lists the prefix of every node that has one.
	// +optional
	// +listType=atomic
	Allocations []CIDRPoolAllocation `json:"allocations"`

	PoolStatusCommon `json:",inline"`
}

// CIDRPool is a named network from which each selected node gets a prefix.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cidrp
// +kubebuilder:printcolumn:name="CIDR",type="string",JSONPath=`.spec.cidr`
// +kubebuilder:printcolumn:name="Gateway Index",type="integer",JSONPath=`.spec.gatewayIndex`
// +kubebuilder:printcolumn:name="Per Node Prefix",type="integer",JSONPath=`.spec.perNodeNetworkPrefix`
// +kubebuilder:printcolumn:name="Allocated",type="integer",JSONPath=`.status.allocatedNodes`
// +kubebuilder:printcolumn:name="Selected",type="integer",JSONPath=`.status.selectedNodes`
// +kubebuilder:printcolumn:name="Blocks In",type="string",JSONPath=`.status.blocksIn`
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type CIDRPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired pool.
	// +required
	Spec CIDRPoolSpec `json:"spec"`
	// status is the prefixes the controller assigned.
	// +optional
	Status CIDRPoolStatus `json:"status,omitempty"`
}

// CIDRPoolList is a list of CIDRPools.
//
// +kubebuilder:object:root=true
type CIDRPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CIDRPool `json:"items"`
}
