package ipamnode_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// TestCleanupKeepsStaticPods: a static pod's allocation carries the UID the
// kubelet gave it, which the API server shows only in its mirror pod's
// kubernetes.io/config.mirror annotation; the mirror pod's own UID differs. The
// cleaner keeps such an allocation, and releases one whose static pod the kubelet
// has replaced (the mirror names another UID).
func TestCleanupKeepsStaticPods(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "p", "10.14.0.0/24", "10.14.0.1", "10.14.0.8")
	mirror := func(name, staticUID string) {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
				Annotations: map[string]string{corev1.MirrorPodAnnotationKey: staticUID, "kubernetes.io/config.hash": staticUID}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		if string(pod.UID) == staticUID {
			t.Fatalf("the API server gave mirror pod %s the static pod's UID; the test means nothing", name)
		}
	}
	// What the kubelet derives from the manifests; the old pod's manifest changed.
	mirror("etcd-"+node, "c1b2a39a7d4b2f1e0d8e6f5a4b3c2d1e")
	mirror("proxy-"+node, "9f8e7d6c5b4a39281706f5e4d3c2b1a0")
	d := startDaemon(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) {
		o.CleanupInterval, o.CleanupMisses = 200*time.Millisecond, 3
	})
	alloc := func(cid, pod, uid string) {
		t.Helper()
		prm := params(cid, "p")
		prm.Metadata = &nodev1.IPAMMetadata{K8SPodName: pod, K8SPodNamespace: "default", K8SPodUid: uid}
		waitFor(t, "allocation "+cid, func() bool {
			_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: prm})
			return err == nil
		})
	}
	alloc("static", "etcd-"+node, "c1b2a39a7d4b2f1e0d8e6f5a4b3c2d1e")
	alloc("replaced", "proxy-"+node, "0000000000000000000000000000dead")
	waitFor(t, "the replaced static pod's allocation to be released", func() bool {
		_, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("replaced", "p")})
		return code(err) == codes.NotFound
	})
	time.Sleep(time.Second) // five more sweeps
	if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("static", "p")}); err != nil {
		t.Errorf("a live static pod's allocation was released: %v", err)
	}
}
