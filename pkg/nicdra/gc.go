package nicdra

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/hwipam/hwipam/pkg/store"
)

// Garbage collection by claim: an allocation of this driver (container ID =
// claim UID) is released when the ResourceClaim with that UID no longer
// exists, for instance when the claim was deleted while ipam-node was down and
// the kubelet's unprepare never reached it. A claim that exists is never
// released, whatever pods there are: a UID, once gone, never comes back, so the
// decision needs no pod lookup.
//
// What it asks the API server: each claim of the checkpoint by name (its
// namespace and name are recorded), and a listing of claims only when the
// store holds allocations of this driver that the checkpoint does not know
// (orphans: a checkpoint lost, or restored from an older copy), in their
// namespaces only. The same reads tell which pods share a prepared claim
// (Preparer.Refusal).

// orphansGone returns which of the orphans' claim UIDs no ResourceClaim in
// their namespaces has (a namespace "" stands for all): those it saw before the
// listing began, absent from a consistent list.
func orphansGone(ctx context.Context, c kubernetes.Interface, uids map[types.UID]string) (map[types.UID]bool, error) {
	namespaces := map[string]bool{}
	for _, ns := range uids {
		namespaces[ns] = true
	}
	if namespaces[""] {
		namespaces = map[string]bool{"": true}
	}
	exists := map[types.UID]bool{}
	for _, ns := range slices.Sorted(func(yield func(string) bool) {
		for ns := range namespaces {
			if !yield(ns) {
				return
			}
		}
	}) {
		opts := metav1.ListOptions{Limit: 500}
		for {
			list, err := c.ResourceV1().ResourceClaims(ns).List(ctx, opts)
			if err != nil {
				return nil, fmt.Errorf("listing ResourceClaims for the garbage collection: %w", err)
			}
			for _, rc := range list.Items {
				exists[rc.UID] = true
			}
			if opts.Continue = list.Continue; opts.Continue == "" {
				break
			}
		}
	}
	gone := map[types.UID]bool{}
	for uid := range uids {
		if !exists[uid] {
			gone[uid] = true
		}
	}
	return gone, nil
}

// collect releases what claims that no longer exist hold: the prepared claims
// of the checkpoint (through Unprepare, which also forgets them) and any
// allocation of this driver the checkpoint does not know. It notes the pods
// that share a prepared claim. It says whether the API server answered; it
// does nothing while the checkpoint cannot be read.
func (d *Driver) collect(ctx context.Context) (ok bool) {
	claims, err := d.Preparer.Claims()
	if err != nil {
		return true // refusing (Run logged it, the status file says it); nothing to ask the API server
	}
	var gone []types.UID
	for _, uid := range slices.Sorted(func(yield func(types.UID) bool) {
		for uid := range claims {
			if !yield(uid) {
				return
			}
		}
	}) {
		pc := claims[uid]
		rc, err := d.Client.ResourceV1().ResourceClaims(pc.Namespace).Get(ctx, pc.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			gone = append(gone, uid)
		case err != nil:
			d.Log.Error(err, "claim garbage collection: the API server did not answer; nothing released, tried again later",
				"claim", pc.Namespace+"/"+pc.Name)
			return false
		case rc.UID != uid:
			gone = append(gone, uid) // deleted and re-created: the one prepared is gone
		default:
			d.Preparer.noteConsumers(uid, pc, rc.Status.ReservedFor)
		}
	}
	type orphan struct {
		key string
		a   store.Allocation
	}
	var orphans []orphan
	orphanUIDs := map[types.UID]string{} // → namespace
	err = d.Allocations(func(key string, a store.Allocation) error {
		if !OwnedByDRA(a) {
			return nil
		}
		uid := types.UID(a.ContainerID)
		if known(claims[uid], a.IfName) {
			return nil
		}
		orphans = append(orphans, orphan{key, a})
		if ns, ok := orphanUIDs[uid]; !ok || ns != a.PodNamespace {
			if ok {
				orphanUIDs[uid] = "" // namespaces disagree: look everywhere
			} else {
				orphanUIDs[uid] = a.PodNamespace
			}
		}
		return nil
	})
	if err != nil {
		d.Log.Error(err, "claim garbage collection: reading the store")
		return false
	}
	var orphansGoneSet map[types.UID]bool
	if len(orphanUIDs) > 0 {
		if orphansGoneSet, err = orphansGone(ctx, d.Client, orphanUIDs); err != nil {
			d.Log.Error(err, "claim garbage collection: the API server did not answer; nothing released, tried again later")
			return false
		}
	}
	waiting := 0
	defer func() { d.waitingRelease.Store(int64(waiting)) }()
	for _, uid := range gone {
		pc := claims[uid]
		claim := pc.Namespace + "/" + pc.Name
		if why := d.podStillRuns(ctx, pc); why != "" {
			// A claim deleted past its finalizer while its pod runs (its
			// tenant may remove the finalizer): the ports and addresses are
			// the pod's until its sandbox stops.
			err := fmt.Errorf("claim %s (UID %s) was deleted while %s: its addresses stay held, and its ports in the pod, "+
				"until the pod's sandbox stops", claim, uid, why)
			d.Failures.Add(WaitingRelease, claim, "", err)
			waiting++
			d.Log.V(1).Info("claim garbage collection: a deleted claim's pod still runs; released once it stops", "claim", claim,
				"uid", uid, "pod", pc.Namespace+"/"+pc.PodName)
			continue
		}
		err := d.Preparer.Unprepare(ctx, uid)
		if err == nil || errors.Is(err, ErrPortsHeld) {
			d.removeCDISpec(uid)
		}
		if errors.Is(err, ErrPortsHeld) {
			d.Failures.Add(PortHeld, claim, "", err) // the refresh releases it once the port is back
			d.Failures.Succeeded(WaitingRelease, claim, "")
			continue
		} else if err != nil {
			d.Log.Error(err, "claim garbage collection: releasing a deleted claim", "claim", pc.Namespace+"/"+pc.Name, "uid", uid)
			continue
		}
		gcReleases.Inc()
		d.Failures.Succeeded(WaitingRelease, claim, "")
		d.Log.Info("released the addresses of a claim that no longer exists", "claim", claim, "uid", uid,
			"devices", len(pc.Devices))
	}
	for _, o := range orphans {
		if !orphansGoneSet[types.UID(o.a.ContainerID)] {
			continue
		}
		released, err := d.Release(ctx, o.key, o.a)
		if err != nil {
			d.Log.Error(err, "claim garbage collection: releasing an allocation", "pool", o.key, "ip", o.a.IP)
			continue
		}
		if released {
			gcReleases.Inc()
			d.Log.Info("released an allocation whose claim no longer exists (not in the checkpoint)", "pool", o.key,
				"ip", o.a.IP, "claim", o.a.ContainerID, "interface", o.a.IfName)
		}
	}
	return true
}

// podStillRuns says why the pod a prepared claim was prepared for may still
// run ("" when it does not): the runtime runs its sandbox (as the NRI plugin
// heard), or the NRI plugin has not heard from the runtime since the process
// started, or the API server has the pod (by UID) in a phase other than
// Succeeded or Failed, or cannot say. Its ports and addresses are in use while
// it runs, whatever became of the claim.
func (d *Driver) podStillRuns(ctx context.Context, pc PreparedClaim) string {
	if pc.PodUID == "" {
		return ""
	}
	if d.NRI != nil && d.NRI.SandboxRuns(pc.PodUID) {
		return "the runtime still runs pod " + pc.Namespace + "/" + pc.PodName + "'s sandbox"
	}
	if d.NRI != nil && !d.NRI.Synchronized() {
		// A pod deleted from the API server (--force) may still run: only
		// the runtime can say, once the NRI plugin has heard from it.
		return "the NRI plugin has not yet heard from the runtime whether pod " + pc.Namespace + "/" + pc.PodName +
			"'s sandbox runs (is NRI enabled in the runtime? ipam-node logs each NRI connection)"
	}
	if pc.PodName == "" {
		return ""
	}
	pod, err := d.Client.CoreV1().Pods(pc.Namespace).Get(ctx, pc.PodName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ""
	case err != nil:
		return fmt.Sprintf("the API server could not say whether pod %s/%s still runs (%v)", pc.Namespace, pc.PodName, err)
	case string(pod.UID) != pc.PodUID:
		return "" // another pod of that name
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return ""
	}
	return fmt.Sprintf("pod %s/%s still runs (phase %s)", pc.Namespace, pc.PodName, pod.Status.Phase)
}

// known says whether the checkpoint's claim records the allocation's
// interface ("<request>:<device>") among its devices: those Unprepare
// releases. An allocation it does not record is an orphan.
func known(pc PreparedClaim, ifName string) bool {
	return slices.ContainsFunc(pc.Devices, func(d PreparedDevice) bool { return d.Request+":"+d.Device == ifName })
}
