package v1alpha1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OwnedByController reports whether the object's (a NodeIPAM's, a PoolSpecs')
// spec is the controller's alone:
// its managedFields have an entry of FieldManager, and no other manager owns a
// field under spec. An object written by anyone else (kubectl edit, apply, a
// script) is not, until the controller has written it again.
func OwnedByController(o interface {
	GetManagedFields() []metav1.ManagedFieldsEntry
}) bool {
	mine := false
	for _, e := range o.GetManagedFields() {
		if e.Manager == FieldManager && e.Subresource == "" {
			mine = true
			continue
		}
		if e.FieldsV1 == nil {
			continue
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(e.FieldsV1.Raw, &top); err != nil {
			return false
		}
		if _, ok := top["f:spec"]; ok {
			return false
		}
	}
	return mine
}
