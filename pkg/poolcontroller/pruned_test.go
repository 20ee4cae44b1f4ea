package poolcontroller_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

// nvIPAMStyleCRDs writes the project's CRDs with the status schema cut down to what
// nv-ipam's own CRDs have (allocations only), as network-operator installs them.
func nvIPAMStyleCRDs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"nv-ipam.nvidia.com_ippools.yaml", "nv-ipam.nvidia.com_cidrpools.yaml"} {
		data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "deploy", "crds", name))
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatal(err)
		}
		status := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"]
		for k := range status.Properties {
			if k != "allocations" {
				delete(status.Properties, k)
			}
		}
		crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"] = status
		crd.Spec.Versions[0].AdditionalPrinterColumns = nil
		out, err := yaml.Marshal(&crd)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestWorksWhenStatusFieldsArePruned runs against CRDs without hwipam's status
// additions: blocks are still assigned, and the pool is not rewritten over and over
// because the conditions it sends never come back.
func TestWorksWhenStatusFieldsArePruned(t *testing.T) {
	pruned := harness.StartControlPlane(t, harness.ControlPlaneOptions{
		CRDDirs: []string{nvIPAMStyleCRDs(t)}})
	c := pruned.Client
	ctx := t.Context()
	for _, n := range []string{"n1", "n2"} {
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	// The status writer's warnings are collected: a write that sends fields the CRD
	// lacks must not draw an "unknown field" warning, which the controller would log
	// for every write.
	cfg := rest.CopyConfig(pruned.Config)
	var warnings bytes.Buffer // written under the writer's own lock; read after the writes
	cfg.WarningHandler = rest.NewWarningWriter(&warnings, rest.WarningWriterOptions{})
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sw, err := poolcontroller.NewStatusWriter(cfg, httpClient, c.Scheme())
	if err != nil {
		t.Fatal(err)
	}
	for i, writer := range []poolcontroller.StatusWriter{nil, sw} {
		name := []string{"client-update", "status-writer"}[i]
		t.Run(name, func(t *testing.T) {
			r := &poolcontroller.Reconciler{Client: c, StatusWriter: writer, Kind: v1alpha1.KindIPPool, Now: time.Now}
			checkPrunedStatus(t, c, r, name, i)
		})
	}
	t.Run("selects-no-node", func(t *testing.T) {
		r := &poolcontroller.Reconciler{Client: c, StatusWriter: sw, Kind: v1alpha1.KindIPPool, Now: time.Now}
		checkPrunedNoNode(t, c, r)
	})
	if warnings.Len() > 0 {
		t.Errorf("the status writer drew warnings from the server:\n%s", warnings.String())
	}
}

// checkPrunedNoNode: a pool that selects no node, under a pruning CRD, is
// written once and then left alone, although the 0 node counts sent (issue 39)
// never come back either.
func checkPrunedNoNode(t *testing.T, c client.Client, r *poolcontroller.Reconciler) {
	ctx := t.Context()
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "selects-no-node", Namespace: "default"},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.0.9.0/24", PerNodeBlockSize: 50, NodeSelector: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "test.hwipam.io/nobody", Operator: corev1.NodeSelectorOpExists}}}}}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if w := r.StatusWrites(); w != 1 {
		t.Errorf("%d status writes for a new pool that selects no node, want 1", w)
	}
	var got v1alpha1.IPPool
	if err := c.Get(ctx, req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Allocations) != 0 || len(got.Status.Conditions) != 0 || got.Status.ObservedGeneration != 0 {
		t.Fatalf("status of a pool selecting no node under a pruning CRD = %+v, want empty", got.Status)
	}
	for range 3 {
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if w := r.StatusWrites(); w != 1 {
		t.Errorf("%d status writes in 3 more reconciles of an unchanged pool that selects no node under a pruning CRD, want 0", w-1)
	}
}

// checkPrunedStatus runs the checks of TestWorksWhenStatusFieldsArePruned on pool
// name, of subnet 10.0.<i>.0/24.
func checkPrunedStatus(t *testing.T, c client.Client, r *poolcontroller.Reconciler, name string, i int) {
	ctx := t.Context()
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.0.%d.0/24", i), PerNodeBlockSize: 50}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	req := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "default", Name: name}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.IPPool
	if err := c.Get(ctx, req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Allocations) != 2 || got.Status.Allocations[0].StartIP != fmt.Sprintf("10.0.%d.1", i) {
		t.Fatalf("allocations under a pruning CRD = %+v", got.Status.Allocations)
	}
	if len(got.Status.Conditions) != 0 {
		t.Fatalf("conditions survived: the CRD used does not prune (%+v)", got.Status.Conditions)
	}
	writes := r.StatusWrites()
	for range 3 {
		time.Sleep(1100 * time.Millisecond) // a new second: rebuilt conditions get new transition times
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if w := r.StatusWrites() - writes; w != 0 {
		t.Errorf("%d status writes in 3 reconciles of an unchanged pool under a pruning CRD, want 0", w)
	}
	var again v1alpha1.IPPool
	if err := c.Get(ctx, req.NamespacedName, &again); err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != got.ResourceVersion {
		t.Errorf("pool rewritten on every reconcile although nothing changed (resourceVersion %s -> %s)",
			got.ResourceVersion, again.ResourceVersion)
	}
}
