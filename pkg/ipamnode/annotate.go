package ipamnode

import (
	"context"
	"encoding/json"
	"fmt"
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

// readBackIntervals is how many intervals apart the annotator reads its Node back
// to restore annotations that someone removed or that a re-created Node lacks.
const readBackIntervals = 6

// annotator keeps two annotations of this node up to date: the pools it holds
// allocations in (v1alpha1.PoolsInUseAnnotation) and, per pool, its block and the
// addresses it holds outside it (v1alpha1.HeldAnnotation). It writes on change,
// when kicked (the pool sync changed a block), and whenever a read-back finds the
// Node's values differ (a Node deleted and re-registered, an annotation stripped).
// Without RBAC to patch nodes (as under network-operator's node service account)
// it logs one warning, sets hwipam_node_feature_forbidden{feature="node-annotations"}
// and carries on; the gauge returns to 0 at the first write that succeeds.
type annotator struct {
	client   client.Client
	reader   client.Reader
	manager  *nodealloc.Manager
	node     string
	interval time.Duration
	kick     <-chan struct{}
	log      logr.Logger

	last     *annotations
	ticks    int
	problems problems
}

// annotations are the two values the annotator publishes; "" removes one.
type annotations struct{ inUse, held string }

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*annotator) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (a *annotator) Start(ctx context.Context) error {
	setForbidden(featureNodeAnnotations, false)
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		a.update(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-a.kick:
		}
	}
}

func (a *annotator) want() (annotations, error) {
	holds, err := json.Marshal(a.manager.Holds())
	if err != nil {
		return annotations{}, fmt.Errorf("encoding the held ranges: %w", err)
	}
	return annotations{inUse: strings.Join(a.manager.PoolsInUse(), ","), held: string(holds)}, nil
}

func (a *annotator) update(ctx context.Context) {
	want, err := a.want()
	if err != nil {
		a.log.Error(err, "computing the node's annotations")
		return
	}
	a.ticks++
	if a.last != nil && *a.last == want {
		if a.ticks < readBackIntervals || a.reader == nil {
			return
		}
		// Read back: the Node may have been re-created, or the annotations removed.
		a.ticks = 0
		var n metav1.PartialObjectMetadata
		n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		err := a.reader.Get(ctx, client.ObjectKey{Name: a.node}, &n)
		switch {
		case apierrors.IsNotFound(err):
			a.last = nil
			a.problems.warn(a.log, "this node does not exist in the API; check --node-name", nil, "node", a.node)
			return
		case err != nil:
			a.log.V(1).Info("reading the node back failed; will retry", "error", err.Error())
			return
		}
		got := annotations{inUse: n.GetAnnotations()[v1alpha1.PoolsInUseAnnotation], held: n.GetAnnotations()[v1alpha1.HeldAnnotation]}
		if got == want {
			return
		}
		a.log.Info("restoring this node's pool annotations, which are missing or changed", "node", a.node)
	}
	value := func(s string) any {
		if s == "" {
			return nil // remove the annotation
		}
		return s
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		v1alpha1.PoolsInUseAnnotation: value(want.inUse),
		v1alpha1.HeldAnnotation:       value(want.held),
	}}})
	if err != nil {
		a.log.Error(err, "encoding the annotation patch")
		return
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.node}}
	err = a.client.Patch(ctx, node, client.RawPatch("application/merge-patch+json", patch))
	switch {
	case err == nil:
		a.last = &want
		a.ticks = 0
		a.problems.clear()
		setForbidden(featureNodeAnnotations, false)
	case apierrors.IsForbidden(err):
		setForbidden(featureNodeAnnotations, true)
		a.problems.warn(a.log, "cannot annotate this node with the pools it uses; the controller then cannot keep "+
			"this node's blocks after it stops matching a pool, nor the ranges it still holds after a pool edit. "+
			forbiddenHint(err, a.node, "Grant patch on nodes to the node's service account."),
			err, "node", a.node)
	case apierrors.IsNotFound(err):
		a.last = nil
		a.problems.warn(a.log, "this node does not exist in the API; check --node-name", nil, "node", a.node)
	default:
		a.log.V(1).Info("annotating the node failed; will retry", "error", err.Error())
	}
}
