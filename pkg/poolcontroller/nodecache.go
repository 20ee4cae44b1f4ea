package poolcontroller

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// nodeAnnotations are the only Node annotations the controller reads: the
// daemon's report and the pools it has in use.
var nodeAnnotations = []string{v1alpha1.HeldAnnotation, v1alpha1.PoolsInUseAnnotation}

// CacheTransform is the controller's cache transform of every object: no
// managedFields (nothing reads them, and on a real Node they are several kB of
// kubelet's status fields), and of a Node's metadata only the labels and the
// annotations the controller reads. Nodes carry annotations of their own that
// are often larger than anything hwipam keeps of them (NFD's list of every
// feature label, a CNI's, kubelet's, a node-problem-detector's): at 100,000
// nodes, 3 kB of them would be 300 MB of the cache. The controller never writes
// a Node from the cache, so what it drops is not written back.
func CacheTransform() toolscache.TransformFunc {
	strip := cache.TransformStripManagedFields()
	return func(o any) (any, error) {
		o, err := strip(o)
		if err != nil {
			return o, err
		}
		if n, ok := o.(*metav1.PartialObjectMetadata); ok {
			n.Annotations = keptAnnotations(n.Annotations)
		}
		return o, nil
	}
}

// keptAnnotations returns those of annotations the controller reads: the map
// itself when that is all of them, nil when none.
func keptAnnotations(annotations map[string]string) map[string]string {
	kept := 0
	for _, k := range nodeAnnotations {
		if _, ok := annotations[k]; ok {
			kept++
		}
	}
	switch {
	case kept == len(annotations):
		return annotations
	case kept == 0:
		return nil
	}
	out := make(map[string]string, kept)
	for _, k := range nodeAnnotations {
		if v, ok := annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}
