package examples

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/test/harness"
)

// docYAMLBlocks returns the fenced yaml blocks of a document of the repository.
func docYAMLBlocks(t *testing.T, doc string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), doc))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(data), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// exampleObject reads one object of deploy/examples into obj.
func exampleObject(t *testing.T, file string, obj any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "deploy", "examples", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		t.Fatalf("deploy/examples/%s: %v", file, err)
	}
}

// TestNICsDocYAML takes the two fragments of docs/nics.md where ipam-node and the
// API server take them: the rail map is loaded by ipam-node's own loader
// (--rail-config) and is the start of deploy/examples/rail-config.yaml's map; the
// pool spec, in an IPPool, is applied to a real API server, passes the webhook's
// validation, and says what deploy/examples/ippool-rail.yaml (which the text
// names) says.
func TestNICsDocYAML(t *testing.T) {
	blocks := docYAMLBlocks(t, "docs/nics.md")
	if len(blocks) != 2 {
		t.Fatalf("docs/nics.md has %d yaml blocks, want the rail map and the pool spec", len(blocks))
	}

	t.Run("the rail map", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "rails.yaml")
		if err := os.WriteFile(file, []byte(blocks[0]), 0o644); err != nil {
			t.Fatal(err)
		}
		rails, err := nicdiscovery.LoadRails(file)
		if err != nil {
			t.Fatal(err)
		}
		var cm corev1.ConfigMap
		exampleObject(t, "rail-config.yaml", &cm)
		var example nicdiscovery.Rails
		if err := yaml.UnmarshalStrict([]byte(cm.Data["rails.yaml"]), &example); err != nil {
			t.Fatal(err)
		}
		if len(rails) == 0 {
			t.Fatal("the rail map is empty")
		}
		for name, members := range rails {
			if !equality.Semantic.DeepEqual(members, example[name]) {
				t.Errorf("rail %s is %q in docs/nics.md, %q in deploy/examples/rail-config.yaml", name, members, example[name])
			}
		}
	})

	t.Run("the pool spec", func(t *testing.T) {
		var spec v1alpha1.IPPoolSpec
		var doc struct {
			Spec *v1alpha1.IPPoolSpec `json:"spec"`
		}
		doc.Spec = &spec
		if err := yaml.UnmarshalStrict([]byte(blocks[1]), &doc); err != nil {
			t.Fatalf("docs/nics.md's pool: %v\n%s", err, blocks[1])
		}
		var example v1alpha1.IPPool
		exampleObject(t, "ippool-rail.yaml", &example)
		want := example.Spec
		// The document shows the selecting part of the example: its other fields
		// (gateway, exclusions, routes) are left out.
		want.Gateway, want.Exclusions, want.PerNodeExclusions, want.Routes = "", nil, nil, nil
		if !equality.Semantic.DeepEqual(spec, want) {
			t.Errorf("docs/nics.md's pool spec\n%+v\ndiffers from deploy/examples/ippool-rail.yaml's\n%+v", spec, want)
		}
		pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "nics-doc", Namespace: "kube-system"}, Spec: spec}
		if errs := pool.Validate(); len(errs) > 0 {
			t.Fatalf("docs/nics.md's pool is invalid: %v", errs)
		}
		cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
		if err := cp.Client.Create(t.Context(), pool); err != nil {
			t.Fatalf("applying docs/nics.md's pool: %v", err)
		}
	})
}

// definedObject is one object an example defines, and where.
type definedObject struct {
	where string
	obj   map[string]any
}

// TestExamplesDoNotRedefineObjects: no two examples in docs/ (its yaml blocks and
// files) and deploy/examples/ define the same object (kind, namespace, name)
// differently, so that following the guides one after another never silently
// changes a live object another guide made (an IPPool's subnet, say, which
// would orphan a pod's address). The same object given twice alike is fine.
func TestExamplesDoNotRedefineObjects(t *testing.T) {
	root := harness.RepoRoot()
	var sources []struct{ where, text string }
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		rel, _ := filepath.Rel(root, doc)
		for i, b := range docYAMLBlocks(t, rel) {
			sources = append(sources, struct{ where, text string }{fmt.Sprintf("%s (yaml block %d)", rel, i+1), b})
		}
	}
	for _, pattern := range []string{"docs/*.yaml", "deploy/examples/*.yaml"} {
		files, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, f)
			sources = append(sources, struct{ where, text string }{rel, string(b)})
		}
	}
	seen := map[string]definedObject{}
	objects := 0
	for _, src := range sources {
		for _, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(src.text, -1) {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(part), &obj); err != nil {
				t.Errorf("%s: %v", src.where, err)
				continue
			}
			kind, _ := obj["kind"].(string)
			apiVersion, _ := obj["apiVersion"].(string)
			meta, _ := obj["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			if kind == "" || name == "" {
				continue // a fragment (a spec, a rail map), not an object
			}
			ns, _ := meta["namespace"].(string)
			if ns == "" {
				ns = "default" // where kubectl applies it; cluster-scoped objects share the key alike
			}
			group, _, _ := strings.Cut(apiVersion, "/")
			if !strings.Contains(apiVersion, "/") {
				group = "" // the core group: "v1"
			}
			key := fmt.Sprintf("%s %s/%s (%s)", kind, ns, name, group)
			objects++
			if prev, ok := seen[key]; ok && !equality.Semantic.DeepEqual(prev.obj, obj) {
				t.Errorf("%s is defined in %s and, differently, in %s: give the examples distinct names", key, prev.where, src.where)
				continue
			}
			seen[key] = definedObject{where: src.where, obj: obj}
		}
	}
	if objects < 10 {
		t.Fatalf("found %d objects in docs/ and deploy/examples/: the test reads them wrong", objects)
	}
}

// TestRailsDocIPoIB checks that docs/rails.md shows deploy/examples/nad-ipoib.yaml
// (which TestExamplesApplyAndValidate applies and test/e2e TestIPoIBExample runs)
// as it is, without its comments.
func TestRailsDocIPoIB(t *testing.T) {
	var doc string
	for _, b := range docYAMLBlocks(t, "docs/rails.md") {
		if strings.Contains(b, `"type": "ipoib"`) {
			doc = b
		}
	}
	if doc == "" {
		t.Fatal("docs/rails.md has no yaml block with an IPoIB network")
	}
	data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "deploy", "examples", "nad-ipoib.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for l := range strings.Lines(string(data)) {
		if !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if example := strings.Join(lines, ""); doc != example {
		t.Errorf("docs/rails.md's IPoIB block\n%s\ndiffers from deploy/examples/nad-ipoib.yaml\n%s", doc, example)
	}
}

// TestScaleDocNodeIPAM takes docs/scale.md's NodeIPAM and PoolSpecs as the API
// server does: they decode strictly into the Go types, the API server accepts
// them against the CRDs' schemas, and each of the two blocks has its pool's spec.
func TestScaleDocNodeIPAM(t *testing.T) {
	blocks := docYAMLBlocks(t, "docs/scale.md")
	if len(blocks) != 2 {
		t.Fatalf("docs/scale.md has %d yaml blocks, want the NodeIPAM and the PoolSpecs", len(blocks))
	}
	var obj nodeipamv1.NodeIPAM
	if err := yaml.UnmarshalStrict([]byte(blocks[0]), &obj); err != nil {
		t.Fatalf("docs/scale.md's NodeIPAM: %v", err)
	}
	var specs nodeipamv1.PoolSpecs
	if err := yaml.UnmarshalStrict([]byte(blocks[1]), &specs); err != nil {
		t.Fatalf("docs/scale.md's PoolSpecs: %v", err)
	}
	if len(obj.Spec.Blocks) != 2 || len(specs.Spec.Pools) != 2 || specs.Name != nodeipamv1.PoolSpecsName {
		t.Fatalf("docs/scale.md's NodeIPAM %+v and PoolSpecs %+v", obj.Spec, specs)
	}
	// Each block's pool, by kind, name and UID, has its spec.
	for i, b := range obj.Spec.Blocks {
		e := specs.Spec.Pools[i]
		if e.Kind != b.Kind || e.Pool != b.Pool || e.PoolUID != b.PoolUID || (e.IPPool == nil) == (e.CIDRPool == nil) {
			t.Errorf("block %+v has no spec in the PoolSpecs (%+v)", b, e)
		}
	}
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	if err := cp.Client.Create(t.Context(), &obj); err != nil {
		t.Fatalf("the API server refuses docs/scale.md's NodeIPAM: %v", err)
	}
	if err := cp.Client.Create(t.Context(), &specs); err != nil {
		t.Fatalf("the API server refuses docs/scale.md's PoolSpecs: %v", err)
	}
}
