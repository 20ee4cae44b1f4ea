package ipamnode

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// watchRetrySweeps is how many sweeps the cleaner makes with one GET per allocation,
// after listing and watching pods was refused, before it tries the pod informer again
// (RBAC may have been granted since).
const watchRetrySweeps = 10

// cleaner releases allocations whose pod is gone, or was replaced by a pod of the
// same name with another UID (for a static pod, the UID its mirror pod names),
// after misses consecutive checks. It snapshots the allocations, checks them
// without holding any lock, and releases only an allocation that is still exactly
// what it checked (nodealloc.ReleaseIf). Allocations without pod metadata are never
// touched.
//
// The checks read the node's pod informer (watchPods: the pods bound to this node,
// metadata only), so they cost the API server nothing however many allocations
// there are. The informer may lag behind the API server - a pod bound seconds ago
// may not be in it yet - so an allocation that reaches misses is released only
// after one GET confirms that its pod is gone: no live pod's address is released on
// the informer's word alone. Until the informer has synced a sweep checks nothing.
// When the API server refuses to list or watch pods (a service account with get
// only), the cleaner warns once and checks each allocation with a GET, as before
// the informer, retrying the informer every watchRetrySweeps sweeps.
type cleaner struct {
	reader    client.Reader
	watchPods func(context.Context) *podWatch // nil: always one GET per allocation
	manager   *nodealloc.Manager
	interval  time.Duration
	misses    int
	log       logr.Logger
	// keepLegacyDRA: the DRA checkpoint could not be read at start, so the
	// allocations of network nic.hwipam.io without an owner mark (made before
	// the mark existed) may be live claims' and are left alone.
	keepLegacyDRA bool

	counts        map[string]int
	problems      problems // reading pods by GET
	watchProblems problems // the informer
	watch         *podWatch
	fallback      bool // list/watch refused: one GET per allocation
	sinceRetry    int  // sweeps since the informer was last tried, in fallback
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every node cleans.
func (*cleaner) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (c *cleaner) Start(ctx context.Context) error {
	c.counts = map[string]int{}
	setForbidden(featureStaleCleanup, false)
	if c.watchPods != nil {
		c.watch = c.watchPods(ctx)
	}
	defer func() {
		if c.watch != nil {
			c.watch.stop()
		}
	}()
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.sweep(ctx)
		}
	}
}

// podGoneFunc reports whether the pod an allocation names is gone (see podGone).
type podGoneFunc func(ctx context.Context, namespace, name, uid string) (bool, error)

// source picks how this sweep checks pods: lookup answers each check, and confirm
// says whether an allocation that reaches misses must be confirmed by a GET first.
// ok is false when the sweep should check nothing (the informer has not synced).
func (c *cleaner) source(ctx context.Context) (lookup podGoneFunc, confirm, ok bool) {
	if c.watchPods == nil {
		return c.podGone, false, true
	}
	if c.watch == nil {
		c.sinceRetry++
		if c.sinceRetry < watchRetrySweeps {
			return c.podGone, false, true
		}
		c.sinceRetry = 0
		c.watch = c.watchPods(ctx)
	}
	if err := c.watch.forbidden(); err != nil {
		c.watch.stop()
		c.watch, c.sinceRetry = nil, 0
		if !c.fallback {
			c.fallback = true
			c.log.Info("warning: cannot list and watch the pods of this node, so the stale-allocation cleaner reads "+
				"each allocation's pod with a GET every interval, which loads the API server in proportion to the "+
				"allocations; grant list and watch on pods to the node's service account", "error", err.Error())
		}
		return c.podGone, false, true
	}
	if c.watch.synced() {
		if c.fallback {
			c.fallback = false
			c.log.Info("listing and watching pods works now: the stale-allocation cleaner uses the node's pod informer")
		}
		c.watchProblems.clear()
		return c.watch.podGone, true, true
	}
	if c.fallback { // a retry that has not synced yet
		return c.podGone, false, true
	}
	c.watchProblems.warn(c.log, "the node's pod informer has not synced yet; stale allocations are checked once it has",
		c.watch.lastError())
	return nil, false, false
}

func (c *cleaner) sweep(ctx context.Context) {
	lookup, confirm, ok := c.source(ctx)
	if !ok {
		return
	}
	seen := map[string]bool{}
	// One record at a time from the store (Manager.Allocations would hold a copy of
	// every allocation: tens of MiB at 100,000); releases happen between its reads.
	err := c.manager.EachAllocation("", func(pool string, a store.Allocation) error {
		c.check(ctx, pool, a, lookup, confirm, seen)
		return nil
	})
	if err != nil {
		c.log.Error(err, "reading the allocations to check against their pods")
		return
	}
	for key := range c.counts {
		if !seen[key] {
			delete(c.counts, key)
		}
	}
}

// check counts one allocation's miss, or releases it at the limit (see cleaner).
func (c *cleaner) check(ctx context.Context, pool string, a store.Allocation, lookup podGoneFunc, confirm bool, seen map[string]bool) {
	if a.PodName == "" || a.PodNamespace == "" {
		return
	}
	if nicdra.OwnedByDRA(a) || c.keepLegacyDRA && nicdra.LegacyDRA(a) {
		// A DRA claim's address: released when the claim is unprepared or
		// gone, never by pod lookups (a pod may be recreated for the same
		// claim, and the claim outlives it). The network name decides nothing
		// (a NAD may carry any); see nicdra.OwnedByDRA.
		return
	}
	key := pool + "/" + a.ContainerID + "/" + a.IfName
	seen[key] = true
	gone, err := lookup(ctx, a.PodNamespace, a.PodName, a.PodUID)
	if err != nil {
		c.readFailed(err)
		return
	}
	if !confirm {
		c.readWorked()
	}
	if !gone {
		delete(c.counts, key)
		return
	}
	c.counts[key]++
	if c.counts[key] < c.misses {
		return
	}
	if confirm {
		// The informer may not show a pod bound moments ago: ask the API server
		// before releasing. The count stays, so a failed GET is retried next sweep.
		gone, err := c.podGone(ctx, a.PodNamespace, a.PodName, a.PodUID)
		if err != nil {
			c.readFailed(err)
			return
		}
		c.readWorked()
		if !gone {
			c.log.V(1).Info("kept an allocation whose pod the node's pod informer does not show but the API server has",
				"pool", pool, "pod", a.PodNamespace+"/"+a.PodName, "podUID", a.PodUID, "containerID", a.ContainerID,
				"ifName", a.IfName)
			delete(c.counts, key)
			return
		}
	}
	released, err := c.manager.ReleaseIf(ctx, pool, a)
	switch {
	case err != nil:
		c.log.Error(err, "releasing a stale allocation", "pool", pool, "containerID", a.ContainerID, "ifName", a.IfName)
	case released:
		cleanupReleases.Inc()
		c.log.Info("released the allocation of a pod that no longer exists", "pool", pool, "ip", a.IP,
			"pod", a.PodNamespace+"/"+a.PodName, "podUID", a.PodUID, "containerID", a.ContainerID, "ifName", a.IfName)
	}
	delete(c.counts, key)
}

// readFailed reports a failed GET of a pod: a refusal turns the stale-cleanup
// feature gauge on and is logged once.
func (c *cleaner) readFailed(err error) {
	if apierrors.IsForbidden(err) {
		setForbidden(featureStaleCleanup, true)
		// Keyed without the error, which names the pod: one warning, not one per allocation.
		c.problems.warn(c.log, "cannot read pods, stale allocations are not cleaned up; "+
			"grant get, list and watch on pods to the node's service account", nil, "error", err.Error())
	}
}

// readWorked reports a GET of a pod that the API server answered.
func (*cleaner) readWorked() { setForbidden(featureStaleCleanup, false) }

// podGone reads the pod from the API server and reports whether it no longer
// exists, or exists with another UID (see podReplaced).
func (c *cleaner) podGone(ctx context.Context, namespace, name, uid string) (bool, error) {
	var pod metav1.PartialObjectMetadata
	pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	err := c.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	}
	return podReplaced(&pod, uid), nil
}

// podReplaced reports whether pod, found under the name an allocation records, is
// another pod than the one with the allocation's uid (an empty uid matches any).
//
// A static pod is known to the API server by its mirror pod, whose UID is the
// API server's own. The kubelet, and so the CNI's K8S_POD_UID, knows the static
// pod by the UID it derived from the manifest, which the mirror pod carries in
// its kubernetes.io/config.mirror annotation: that is the UID to compare.
func podReplaced(pod *metav1.PartialObjectMetadata, uid string) bool {
	if uid == "" || pod.UID == types.UID(uid) {
		return false
	}
	mirrorOf, isMirror := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return !isMirror || mirrorOf != uid
}
