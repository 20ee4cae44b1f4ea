// Package v1alpha1 is the nv-ipam.nvidia.com/v1alpha1 API: IPPool and CIDRPool, the
// named address pools that the ipam-controller cuts into per-node blocks. The field
// names and JSON shapes are those of the NVIDIA IPAM plugin (nv-ipam), so existing
// objects keep working; status conditions and observedGeneration are additions that
// code must tolerate being pruned by an older CRD.
//
// +kubebuilder:object:generate=true
// +groupName=nv-ipam.nvidia.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "nv-ipam.nvidia.com", Version: "v1alpha1"}

	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &IPPool{}, &IPPoolList{}, &CIDRPool{}, &CIDRPoolList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
