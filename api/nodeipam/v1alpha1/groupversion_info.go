// Package v1alpha1 is the ipam.hwipam.io/v1alpha1 API: NodeIPAM, one object per
// node in the pools' namespace, named after the node, through which the
// ipam-controller delivers a node's blocks of every pool to its ipam-node; and
// PoolSpecs, one object in that namespace with what the daemons need of every
// pool's spec.
//
// It is hwipam's own group: nv-ipam has no such object, and the network
// operator's CRDs do not include it. Without it (or without the RBAC to read it)
// the controller lists every block in the pools' status and the daemons read
// them there, as nv-ipam does.
//
// +kubebuilder:object:generate=true
// +groupName=ipam.hwipam.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of NodeIPAM.
	GroupVersion = schema.GroupVersion{Group: "ipam.hwipam.io", Version: "v1alpha1"}

	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds NodeIPAM to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &NodeIPAM{}, &NodeIPAMList{}, &PoolSpecs{}, &PoolSpecsList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
