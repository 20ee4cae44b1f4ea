package ipamcontroller

import (
	"net/http"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// memoMapper is a RESTMapper that remembers the mappings it found. The
// client and the cache ask for one on every call (whether an object is
// namespaced, to list it from the cache of its namespaces; its resource, to
// write it), and controller-runtime's dynamic mapper answers each by asking
// the mapper of every API group the server serves, which makes a "no match"
// error of each group that does not have the kind: at 100,000 nodes that was
// 41% of all the controller allocated (heap profile of BenchmarkRailScale's
// convergence), for the pools listed at every Node event and the NodeIPAMs
// written. A kind that is not found is not remembered: a CRD installed after
// the start (NodeIPAM's) is found when it is there. A kind's scope cannot
// change while its CRD exists.
type memoMapper struct {
	meta.RESTMapper
	mu    sync.RWMutex
	found map[mappingKey]meta.RESTMapping
}

type mappingKey struct {
	gk       schema.GroupKind
	versions string
}

// newMemoMapper wraps controller-runtime's default mapper (a
// manager.Options.MapperProvider).
func newMemoMapper(cfg *rest.Config, httpClient *http.Client) (meta.RESTMapper, error) {
	m, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	return &memoMapper{RESTMapper: m, found: map[mappingKey]meta.RESTMapping{}}, nil
}

// RESTMapping implements meta.RESTMapper; each caller gets its own copy.
func (m *memoMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	key := mappingKey{gk: gk}
	switch len(versions) {
	case 0:
	case 1:
		key.versions = versions[0]
	default:
		key.versions = strings.Join(versions, ",")
	}
	m.mu.RLock()
	rm, ok := m.found[key]
	m.mu.RUnlock()
	if ok {
		return &rm, nil
	}
	found, err := m.RESTMapper.RESTMapping(gk, versions...)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.found[key] = *found
	m.mu.Unlock()
	return found, nil
}
