package poolcontroller

import (
	"maps"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

func TestCacheTransformKeepsOfANodeOnlyWhatTheControllerReads(t *testing.T) {
	transform := CacheTransform()
	node := func(annotations map[string]string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"rail": "0"},
			Annotations: annotations, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}}}
	}
	ours := map[string]string{v1alpha1.HeldAnnotation: `{"ippool/p":{"block":"10.0.0.1-10.0.0.8"}}`, v1alpha1.PoolsInUseAnnotation: `["ippool/p"]`}
	theirs := map[string]string{"nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX,cpu-cpuid.AVX2,pci-15b3.present",
		"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
	for _, tc := range []struct {
		name     string
		in, want map[string]string
	}{
		{"ours and others", merged(ours, theirs), ours},
		{"ours alone", maps.Clone(ours), ours},
		{"the report alone", map[string]string{v1alpha1.HeldAnnotation: "{}", "other": "x"}, map[string]string{v1alpha1.HeldAnnotation: "{}"}},
		{"others alone", maps.Clone(theirs), nil},
		{"none", nil, nil},
	} {
		out, err := transform(node(tc.in))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		n := out.(*metav1.PartialObjectMetadata)
		if !maps.Equal(n.Annotations, tc.want) || (tc.want == nil) != (n.Annotations == nil) {
			t.Errorf("%s: annotations %v, want %v", tc.name, n.Annotations, tc.want)
		}
		if n.Labels["rail"] != "0" || len(n.Labels) != 1 {
			t.Errorf("%s: labels %v, want them all", tc.name, n.Labels)
		}
		if n.ManagedFields != nil {
			t.Errorf("%s: managedFields %v kept", tc.name, n.ManagedFields)
		}
	}
	// A pool's annotations are its own: kept.
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: maps.Clone(theirs)}}
	out, err := transform(pool)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*v1alpha1.IPPool).Annotations; !maps.Equal(got, theirs) {
		t.Errorf("a pool's annotations %v, want %v", got, theirs)
	}
}

func merged(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}
