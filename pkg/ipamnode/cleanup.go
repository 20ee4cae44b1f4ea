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

	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// cleaner releases allocations whose pod is gone, or was replaced by a pod of the
// same name with another UID (for a static pod, the UID its mirror pod names),
// after misses consecutive checks. It snapshots the
// allocations, asks the API server without holding any lock, and releases only
// an allocation that is still exactly what it checked (nodealloc.ReleaseIf).
// Allocations without pod metadata are never touched.
type cleaner struct {
	reader   client.Reader
	manager  *nodealloc.Manager
	interval time.Duration
	misses   int
	log      logr.Logger

	counts   map[string]int
	problems problems
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every node cleans.
func (*cleaner) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (c *cleaner) Start(ctx context.Context) error {
	c.counts = map[string]int{}
	setForbidden(featureStaleCleanup, false)
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

func (c *cleaner) sweep(ctx context.Context) {
	seen := map[string]bool{}
	for pool, list := range c.manager.Allocations("") {
		for i := range list {
			a := list[i]
			if a.PodName == "" || a.PodNamespace == "" {
				continue
			}
			key := pool + "/" + a.ContainerID + "/" + a.IfName
			seen[key] = true
			gone, err := c.podGone(ctx, a.PodNamespace, a.PodName, a.PodUID)
			if err != nil {
				if apierrors.IsForbidden(err) {
					setForbidden(featureStaleCleanup, true)
					c.problems.warn(c.log, "cannot read pods, stale allocations are not cleaned up; grant get on pods to the node's service account", err)
				}
				continue
			}
			setForbidden(featureStaleCleanup, false)
			if !gone {
				delete(c.counts, key)
				continue
			}
			c.counts[key]++
			if c.counts[key] < c.misses {
				continue
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
	}
	for key := range c.counts {
		if !seen[key] {
			delete(c.counts, key)
		}
	}
}

// podGone reports whether the pod no longer exists, or exists with another UID.
//
// A static pod is known to the API server by its mirror pod, whose UID is the
// API server's own. The kubelet, and so the CNI's K8S_POD_UID, knows the static
// pod by the UID it derived from the manifest, which the mirror pod carries in
// its kubernetes.io/config.mirror annotation: that is the UID to compare.
func (c *cleaner) podGone(ctx context.Context, namespace, name, uid string) (bool, error) {
	var pod metav1.PartialObjectMetadata
	pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	err := c.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	case uid == "", pod.UID == types.UID(uid):
		return false, nil
	}
	mirrorOf, isMirror := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return !isMirror || mirrorOf != uid, nil
}
