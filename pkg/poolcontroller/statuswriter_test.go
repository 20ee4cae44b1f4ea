package poolcontroller_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// The controller's status writer stores the status, reports the resourceVersion the
// pool was stored under, and a write over a stale one is a conflict.
func TestStatusWriter(t *testing.T) {
	f := newFixture(t, 0)
	sw := newStatusWriter(t, cp)
	f.newIPPool("p", "10.97.0.0/24", 8, nil)
	p := f.ipPool("p")
	p.Status.Allocations = []v1alpha1.Allocation{{NodeName: "a", StartIP: "10.97.0.1", EndIP: "10.97.0.8"}}
	rv, err := sw.UpdateStatus(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	stored := f.ipPool("p")
	if rv != stored.ResourceVersion || rv == p.ResourceVersion {
		t.Errorf("resourceVersion %s returned, stored %s, sent %s", rv, stored.ResourceVersion, p.ResourceVersion)
	}
	wantStrings(t, "stored blocks", f.blocksOf(stored), []string{"a=10.97.0.1-10.97.0.8"})
	// The server's own message survives (it says why, e.g. that etcd refused the
	// object as too large), not client-go's "an error on the server".
	if _, err := sw.UpdateStatus(t.Context(), p); !apierrors.IsConflict(err) ||
		!strings.Contains(err.Error(), "the object has been modified") {
		t.Errorf("a write over a stale resourceVersion = %v, want the server's conflict", err)
	}
	if _, err := sw.UpdateStatus(t.Context(), &corev1.Node{}); err == nil {
		t.Error("the status of a Node was written")
	}
}
