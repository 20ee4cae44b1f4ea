package ipamnode

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// annotator keeps the annotation up to date. Without RBAC to patch nodes (as under
// network-operator's node service account) it logs one warning and carries on.
type annotator struct {
	client   client.Client
	manager  *nodealloc.Manager
	node     string
	interval time.Duration
	log      logr.Logger

	last     *string
	problems problems
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*annotator) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (a *annotator) Start(ctx context.Context) error {
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		a.update(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (a *annotator) update(ctx context.Context) {
	want := strings.Join(a.manager.PoolsInUse(), ",")
	if a.last != nil && *a.last == want {
		return
	}
	var value any = want
	if want == "" {
		value = nil // remove the annotation
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.PoolsInUseAnnotation: value}}})
	if err != nil {
		a.log.Error(err, "encoding the annotation patch")
		return
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.node}}
	err = a.client.Patch(ctx, node, client.RawPatch("application/merge-patch+json", patch))
	switch {
	case err == nil:
		a.last = &want
		a.problems.clear()
	case apierrors.IsForbidden(err):
		a.problems.warn(a.log, "cannot annotate this node with the pools it uses; the controller then cannot keep "+
			"this node's blocks after it stops matching a pool. Grant patch on nodes to the node's service account.",
			err, "node", a.node)
	case apierrors.IsNotFound(err):
		a.problems.warn(a.log, "this node does not exist in the API; check --node-name", nil, "node", a.node)
	default:
		a.log.V(1).Info("annotating the node failed; will retry", "error", err.Error())
	}
}
