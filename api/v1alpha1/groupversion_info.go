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
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
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

// NewScheme returns a scheme with client-go's built-in types and this package's:
// the one the controller, the node daemon and the tests' clients work with.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering core types: %w", err)
	}
	if err := AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering %s: %w", GroupVersion, err)
	}
	return s, nil
}
