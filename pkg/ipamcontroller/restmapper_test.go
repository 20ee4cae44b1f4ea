package ipamcontroller

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// countingMapper counts the RESTMapping calls that reach the mapper it wraps.
type countingMapper struct {
	meta.RESTMapper
	calls int
}

func (c *countingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	c.calls++
	return c.RESTMapper.RESTMapping(gk, versions...)
}

func TestMemoMapperRemembersWhatItFoundOnly(t *testing.T) {
	gv := schema.GroupVersion{Group: "ipam.hwipam.io", Version: "v1alpha1"}
	kind := schema.GroupKind{Group: gv.Group, Kind: "NodeIPAM"}
	under := meta.NewDefaultRESTMapper([]schema.GroupVersion{gv})
	counting := &countingMapper{RESTMapper: under}
	m := &memoMapper{RESTMapper: counting, found: map[mappingKey]meta.RESTMapping{}}

	// Not there yet (the CRD is installed later): an error each time, asked each time.
	for range 2 {
		if _, err := m.RESTMapping(kind, gv.Version); !meta.IsNoMatchError(err) {
			t.Fatalf("a kind not served: %v, want a no-match error", err)
		}
	}
	if counting.calls != 2 {
		t.Fatalf("%d calls reached the mapper for a kind not found twice, want 2", counting.calls)
	}
	under.Add(gv.WithKind("NodeIPAM"), meta.RESTScopeNamespace)
	first, err := m.RESTMapping(kind, gv.Version)
	if err != nil {
		t.Fatalf("once served: %v", err)
	}
	first.Scope = meta.RESTScopeRoot // a caller's copy is its own
	for range 3 {
		rm, err := m.RESTMapping(kind, gv.Version)
		if err != nil {
			t.Fatal(err)
		}
		if rm.Scope.Name() != meta.RESTScopeNameNamespace || rm.Resource.Resource != "nodeipams" {
			t.Fatalf("remembered mapping %+v, want namespaced nodeipams", rm)
		}
	}
	if counting.calls != 3 {
		t.Fatalf("%d calls reached the mapper, want 3: the found mapping is remembered", counting.calls)
	}
	// Other versions are other questions.
	if _, err := m.RESTMapping(kind, "v1"); !meta.IsNoMatchError(err) {
		t.Fatalf("another version: %v, want a no-match error", err)
	}
	if _, err := m.RESTMapping(kind); err != nil || counting.calls != 5 {
		t.Fatalf("no version: %v after %d calls, want a mapping asked of the mapper", err, counting.calls)
	}
}
