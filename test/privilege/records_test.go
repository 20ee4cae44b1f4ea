package privilege

import (
	"fmt"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
)

// recordsRefusal is what deploy/policy/records.yaml says when it refuses.
const recordsRefusal = "only the ipam-controller (service account hwipam-controller or nv-ipam-controller of namespace kube-system) writes"

// TestRecordsWrittenByTheControllerOnly: with deploy/base's policies, a
// NodeIPAM or PoolSpecs is created and its spec changed by the controller's
// service account only. The test's own identity (system:masters, which RBAC
// lets do anything) is refused both, and may still change an object's metadata
// (take the finalizer off to uninstall) and delete one.
func TestRecordsWrittenByTheControllerOnly(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	controller, err := client.New(e.as(e.tokenFor(t, controlSA, nil)), client.Options{Scheme: e.c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	record := func(name, start string) *nodeipamv1.NodeIPAM {
		return &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{nodeipamv1.Finalizer}},
			Spec: nodeipamv1.NodeIPAMSpec{Blocks: []nodeipamv1.NodeBlock{{Kind: "IPPool", Pool: "rail", PoolUID: "u1",
				StartIP: start, EndIP: start[:len(start)-1] + "8"}}}}
	}
	// In force once the admin's create is refused (a dry run stores nothing).
	eventually(t, 30*time.Second, "the records policy in force", func() error {
		err := e.c.Create(ctx, record("probe", "10.30.0.1"), client.DryRunAll)
		if apierrors.IsForbidden(err) {
			return nil
		}
		return fmt.Errorf("the admin's create of a NodeIPAM is not refused yet: %v", err)
	})
	wantForbidden(t, e.c.Create(ctx, record("node-a", "10.30.0.1")), recordsRefusal)
	specs := &nodeipamv1.PoolSpecs{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: nodeipamv1.PoolSpecsName}}
	wantForbidden(t, e.c.Create(ctx, specs.DeepCopy()), recordsRefusal)

	// The controller's service account creates both.
	if err := controller.Create(ctx, record("node-a", "10.30.0.1")); err != nil {
		t.Fatalf("the controller's service account may not create a NodeIPAM: %v", err)
	}
	if err := controller.Create(ctx, specs.DeepCopy()); err != nil {
		t.Fatalf("the controller's service account may not create the PoolSpecs: %v", err)
	}
	// The admin may not move node-a's block, as kubectl edit or apply would.
	var cur nodeipamv1.NodeIPAM
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "node-a"}, &cur); err != nil {
		t.Fatal(err)
	}
	edited := cur.DeepCopy()
	edited.Spec.Blocks[0].StartIP, edited.Spec.Blocks[0].EndIP = "10.30.0.9", "10.30.0.16"
	wantForbidden(t, e.c.Update(ctx, edited), recordsRefusal)
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"blocks":[]}}`))
	wantForbidden(t, e.c.Patch(ctx, cur.DeepCopy(), patch), recordsRefusal)
	// The controller may.
	if err := controller.Update(ctx, edited.DeepCopy()); err != nil {
		t.Fatalf("the controller's service account may not update a NodeIPAM's spec: %v", err)
	}
	// Metadata only: allowed to anyone RBAC allows (uninstall takes the
	// finalizer off), and so is a delete.
	if err := e.c.Patch(ctx, cur.DeepCopy(), client.RawPatch("application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"team":"net"},"finalizers":null}}`))); err != nil {
		t.Fatalf("the admin may not change a NodeIPAM's metadata: %v", err)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "node-a"}, &cur); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(cur.Finalizers, nodeipamv1.Finalizer) || cur.Labels["team"] != "net" || cur.Spec.Blocks[0].StartIP != "10.30.0.9" {
		t.Fatalf("after the metadata patch: finalizers %v, labels %v, blocks %+v", cur.Finalizers, cur.Labels, cur.Spec.Blocks)
	}
	if err := e.c.Delete(ctx, &cur); err != nil {
		t.Fatalf("the admin may not delete a NodeIPAM: %v", err)
	}
}
