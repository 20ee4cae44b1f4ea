package ipamnode_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// The daemon's two annotations follow its allocations and blocks, and come back
// when the Node is deleted and re-registered or someone strips them.
func TestNodeAnnotationsAreReportedAndRestored(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	poolWithBlock(t, c, "p", "10.7.0.0/24", "10.7.0.1", "10.7.0.8")
	d := startDaemon(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) { o.AnnotationInterval = 50 * time.Millisecond })
	waitFor(t, "the pool to sync", func() bool {
		_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c1", "p")})
		return err == nil
	})
	annotated := func(inUse, held string) func() bool {
		return func() bool {
			var n corev1.Node
			if c.Get(ctx, client.ObjectKey{Name: node}, &n) != nil {
				return false
			}
			return n.Annotations[v1alpha1.PoolsInUseAnnotation] == inUse && sameJSON(n.Annotations[v1alpha1.HeldAnnotation], held)
		}
	}
	first := `{"p":{"block":"10.7.0.1-10.7.0.8"}}`
	waitFor(t, "the annotations", annotated("p", first))

	// Re-registered Node: no annotations until the daemon restores them.
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to go", func() bool {
		var n corev1.Node
		return c.Get(ctx, client.ObjectKey{Name: node}, &n) != nil
	})
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the annotations on the re-created node", annotated("p", first))

	// Stripped by someone: restored.
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	delete(n.Annotations, v1alpha1.PoolsInUseAnnotation)
	delete(n.Annotations, v1alpha1.HeldAnnotation)
	if err := c.Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stripped annotations to come back", annotated("p", first))

	// The block moves: the old address is reported held outside the new block.
	var p v1alpha1.IPPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "p"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Status.Allocations = []v1alpha1.Allocation{{NodeName: node, StartIP: "10.7.0.9", EndIP: "10.7.0.16"}}
	if err := c.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the orphan report", annotated("p", `{"p":{"block":"10.7.0.9-10.7.0.16","held":["10.7.0.1-10.7.0.1"]}}`))
	if _, err := d.ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: params("c1", "p")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the report without the orphan", annotated("", `{"p":{"block":"10.7.0.9-10.7.0.16"}}`))
}

func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return bytes.Equal(ja, jb)
}
