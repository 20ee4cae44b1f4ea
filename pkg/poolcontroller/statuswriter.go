package poolcontroller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// StatusWriter sends a pool's status update and returns the resourceVersion the
// pool was stored under.
type StatusWriter interface {
	UpdateStatus(ctx context.Context, pool client.Object) (resourceVersion string, err error)
}

// metadataAccept asks the API server to answer with the object's metadata only, and
// lets a server that cannot do that answer with the whole object.
const metadataAccept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"

// NewStatusWriter returns a StatusWriter that has the API server answer a status
// update with the pool's metadata instead of the whole pool. The reconciler needs
// only the new resourceVersion; a pool of 5,000 nodes is some 400 kB of JSON that
// the server would otherwise encode (and compress) and the controller decode, for
// every write.
func NewStatusWriter(cfg *rest.Config, httpClient *http.Client, scheme *runtime.Scheme) (StatusWriter, error) {
	gvk := v1alpha1.GroupVersion.WithKind(v1alpha1.KindIPPool)
	rc, err := apiutil.RESTClientForGVK(gvk, true, false, cfg, serializer.NewCodecFactory(scheme), httpClient)
	if err != nil {
		return nil, fmt.Errorf("creating a REST client for pool status: %w", err)
	}
	return metadataStatusWriter{rc}, nil
}

type metadataStatusWriter struct{ rc rest.Interface }

var poolResources = map[string]string{v1alpha1.KindIPPool: "ippools", v1alpha1.KindCIDRPool: "cidrpools"}

func (w metadataStatusWriter) UpdateStatus(ctx context.Context, pool client.Object) (string, error) {
	var kind string
	switch pool.(type) {
	case *v1alpha1.IPPool:
		kind = v1alpha1.KindIPPool
	case *v1alpha1.CIDRPool:
		kind = v1alpha1.KindCIDRPool
	default:
		return "", fmt.Errorf("status of %T: not a pool", pool)
	}
	// fieldValidation=Ignore: the pool is encoded from this program's own types, so
	// the only fields the server does not know are hwipam's status additions under
	// nv-ipam's CRDs, which it prunes (see sendStatus). The default, Warn, decodes
	// the body strictly and tracks the path of every unknown field, which costs the
	// server CPU on every write of a 5,000-node status and answers each write under
	// those CRDs with warnings the controller would log.
	res := w.rc.Put().Namespace(pool.GetNamespace()).Resource(poolResources[kind]).Name(pool.GetName()).
		SubResource("status").Param("fieldValidation", metav1.FieldValidationIgnore).
		SetHeader("Accept", metadataAccept).Body(pool).Do(ctx)
	// Error, not Raw: Error decodes the server's Status, whose message says what
	// went wrong ("etcdserver: request is too large"); Raw's error is only
	// "an error on the server ("unknown")".
	if err := res.Error(); err != nil {
		return "", err
	}
	raw, err := res.Raw()
	if err != nil {
		return "", err
	}
	// PartialObjectMetadata, or the whole pool from a server that cannot send less:
	// both carry metadata.resourceVersion.
	var stored metav1.PartialObjectMetadata
	if err := json.Unmarshal(raw, &stored); err != nil {
		return "", fmt.Errorf("reading the answer to a status update of %s %s: %w", kind, pool.GetName(), err)
	}
	if stored.ResourceVersion == "" {
		return "", fmt.Errorf("the answer to a status update of %s %s has no resourceVersion", kind, pool.GetName())
	}
	return stored.ResourceVersion, nil
}
