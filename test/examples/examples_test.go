// Package examples applies every manifest of the repository (examples, the
// kustomize base, RBAC) to the real apiserver, so that they cannot drift from the
// CRDs and the Kubernetes API.
package examples

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

// exampleFiles lists the manifests under deploy/examples, deploy/base, deploy/rbac
// and docs (kustomization files excepted).
func exampleFiles(t *testing.T) []string {
	t.Helper()
	root := harness.RepoRoot()
	var files []string
	for _, dir := range []string{"deploy/examples", "deploy/base", "deploy/rbac", "docs"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) &&
				d.Name() != "kustomization.yaml" {
				files = append(files, path)
			}
			return nil
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if len(files) == 0 {
		t.Fatal("no examples found under deploy/examples or docs")
	}
	return files
}

// TestExamplesApplyAndValidate applies every manifest, with the pool CRDs and
// Multus's NetworkAttachmentDefinition CRD installed (deploy/examples has NADs).
func TestExamplesApplyAndValidate(t *testing.T) {
	root := harness.RepoRoot()
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{CRDDirs: []string{
		filepath.Join(root, "deploy", "crds"), filepath.Join(root, "test", "realnode", "nad-crd.yaml")}})
	ctx := t.Context()
	for _, file := range exampleFiles(t) {
		rel, _ := filepath.Rel(harness.RepoRoot(), file)
		t.Run(rel, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
			n := 0
			for {
				var u unstructured.Unstructured
				if err := dec.Decode(&u.Object); err != nil {
					if errors.Is(err, io.EOF) {
						break
					}
					t.Fatalf("decoding: %v", err)
				}
				if len(u.Object) == 0 {
					continue
				}
				n++
				ensureNamespace(t, cp.Client, u.GetNamespace())
				if err := cp.Client.Create(ctx, &u); err != nil {
					t.Fatalf("applying %s %s: %v", u.GetKind(), u.GetName(), err)
				}
				validate(t, &u)
			}
			if n == 0 {
				t.Errorf("%s holds no objects", rel)
			}
		})
	}
}

// validate runs the pool kinds through the same Validate the webhook uses.
func validate(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	var errs []string
	switch u.GetKind() {
	case "IPPool":
		var p v1alpha1.IPPool
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &p, true); err != nil {
			t.Fatalf("IPPool %s has unknown fields: %v", u.GetName(), err)
		}
		for _, e := range p.Validate() {
			errs = append(errs, e.Error())
		}
	case "CIDRPool":
		var p v1alpha1.CIDRPool
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &p, true); err != nil {
			t.Fatalf("CIDRPool %s has unknown fields: %v", u.GetName(), err)
		}
		for _, e := range p.Validate() {
			errs = append(errs, e.Error())
		}
	}
	if len(errs) > 0 {
		t.Errorf("%s %s is invalid: %v", u.GetKind(), u.GetName(), errs)
	}
}

func ensureNamespace(t *testing.T, c client.Client, ns string) {
	t.Helper()
	if ns == "" || ns == "default" || ns == "kube-system" {
		return
	}
	err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
}

// TestDemoDocApplies applies docs/demo.md's "Try it" manifests (what `make demo`
// writes to /tmp/hwipam-demo/try.yaml, a registry in place of REGISTRY) to a real
// API server with the NetworkAttachmentDefinition CRD: the pool passes the
// webhook's validation, the NADs and the pod are accepted. That they give the pod
// its addresses is seen on the demo node itself.
func TestDemoDocApplies(t *testing.T) {
	blocks := docYAMLBlocks(t, "docs/demo.md")
	if len(blocks) != 2 {
		t.Fatalf("docs/demo.md has %d yaml blocks, want those of \"Try it\" and \"A NIC claim\"", len(blocks))
	}
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{CRDDirs: []string{
		filepath.Join(harness.RepoRoot(), "deploy", "crds"), filepath.Join(harness.RepoRoot(), "test", "realnode", "nad-crd.yaml")}})
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(strings.ReplaceAll(blocks[0]+"---\n"+blocks[1], "REGISTRY", "127.0.0.1:5000")), 4096)
	kinds := map[string]int{}
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("decoding: %v", err)
		}
		if err := cp.Client.Create(t.Context(), &u); err != nil {
			t.Fatalf("applying %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		validate(t, &u)
		kinds[u.GetKind()]++
	}
	if kinds["IPPool"] != 1 || kinds["NetworkAttachmentDefinition"] != 2 || kinds["Pod"] != 2 || kinds["ResourceClaimTemplate"] != 1 {
		t.Errorf("docs/demo.md applied %v, want a pool, two NADs, a ResourceClaimTemplate and two pods", kinds)
	}
}
