package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPPoolSpec describes a pool of addresses cut into equal, consecutive per-node blocks.
type IPPoolSpec struct {
	// subnet is the pool's network in CIDR notation, IPv4 or IPv6.
	// +required
	Subnet string `json:"subnet"`
	// perNodeBlockSize is how many consecutive addresses each selected node gets.
	// +required
	// +kubebuilder:validation:Minimum=1
	PerNodeBlockSize int `json:"perNodeBlockSize"`
	// gateway is the subnet's gateway; it must be inside the subnet and is never
	// handed to a pod.
	// +optional
	Gateway string `json:"gateway,omitempty"`
	// exclusions are address ranges inside the subnet that are never handed out.
	// +optional
	// +listType=atomic
	Exclusions []ExcludeRange `json:"exclusions,omitempty"`
	// perNodeExclusions are index ranges excluded in every node's block.
	// +optional
	// +listType=atomic
	PerNodeExclusions []ExcludeIndexRange `json:"perNodeExclusions,omitempty"`
	// nodeSelector chooses the nodes that get a block; terms are ORed, expressions
	// within a term ANDed. Empty means every node.
	// +optional
	NodeSelector *corev1.NodeSelector `json:"nodeSelector,omitempty"`
	// defaultGateway adds a default route through the gateway to every allocation.
	// +optional
	DefaultGateway bool `json:"defaultGateway,omitempty"`
	// routes are static routes through the gateway added to every allocation.
	// +optional
	// +listType=atomic
	Routes []Route `json:"routes,omitempty"`
}

// Allocation is the block of an IPPool assigned to one node.
type Allocation struct {
	// nodeName is the node that owns the block.
	// +required
	NodeName string `json:"nodeName"`
	// startIP is the block's first address.
	// +required
	StartIP string `json:"startIP"`
	// endIP is the block's last address.
	// +required
	EndIP string `json:"endIP"`
}

// IPPoolStatus is written by the ipam-controller only.
type IPPoolStatus struct {
	// allocations lists the block of every node that has one.
	// +optional
	// +listType=atomic
	Allocations []Allocation `json:"allocations"`

	PoolStatusCommon `json:",inline"`
}

// IPPool is a named pool of addresses from which each selected node gets a block.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ipp
// +kubebuilder:printcolumn:name="Subnet",type="string",JSONPath=`.spec.subnet`
// +kubebuilder:printcolumn:name="Gateway",type="string",JSONPath=`.spec.gateway`
// +kubebuilder:printcolumn:name="Block Size",type="integer",JSONPath=`.spec.perNodeBlockSize`
// +kubebuilder:printcolumn:name="Allocated",type="integer",JSONPath=`.status.allocatedNodes`
// +kubebuilder:printcolumn:name="Selected",type="integer",JSONPath=`.status.selectedNodes`
// +kubebuilder:printcolumn:name="Blocks In",type="string",JSONPath=`.status.blocksIn`
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired pool.
	// +required
	Spec IPPoolSpec `json:"spec"`
	// status is the blocks the controller assigned.
	// +optional
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolList is a list of IPPools.
//
// +kubebuilder:object:root=true
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPPool `json:"items"`
}
