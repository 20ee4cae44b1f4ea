package nicdra

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/hwipam/hwipam/pkg/store"
)

// Garbage collection by claim: an allocation of this driver (network
// nic.hwipam.io, container ID = claim UID) is released when the ResourceClaim
// with that UID no longer exists, for instance when the claim was deleted
// while ipam-node was down and the kubelet's unprepare never reached it. A
// claim that exists is never released, whatever pods there are: a UID, once
// gone, never comes back, so the decision needs no pod lookup.

// GoneClaims returns which of the UIDs no ResourceClaim has: those it saw before the
// listing began (the caller's snapshot) and that a consistent list of the
// claims does not contain; a claim whose namespace and name are known is read
// again by name, so that a claim is never called gone by a list alone.
func GoneClaims(ctx context.Context, c kubernetes.Interface, seen map[types.UID]metav1.ObjectMeta) (map[types.UID]bool, error) {
	if len(seen) == 0 {
		return nil, nil
	}
	exists := map[types.UID]bool{}
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := c.ResourceV1().ResourceClaims("").List(ctx, opts)
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
	gone := map[types.UID]bool{}
	for uid, meta := range seen {
		if exists[uid] {
			continue
		}
		if meta.Name != "" {
			rc, err := c.ResourceV1().ResourceClaims(meta.Namespace).Get(ctx, meta.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return nil, fmt.Errorf("reading ResourceClaim %s/%s: %w", meta.Namespace, meta.Name, err)
			case rc.UID == uid:
				continue
			}
		}
		gone[uid] = true
	}
	return gone, nil
}

// collect releases what claims that no longer exist hold: the prepared claims
// of the checkpoint (through Unprepare, which also forgets them) and any
// allocation of this driver the checkpoint does not know (a checkpoint lost or
// restored from an older copy).
func (d *Driver) collect(ctx context.Context) (ok bool) {
	claims, err := d.Preparer.Claims()
	if err != nil {
		d.Log.Error(err, "claim garbage collection: reading the prepared claims")
		return false
	}
	seen := map[types.UID]metav1.ObjectMeta{}
	for uid, pc := range claims {
		seen[uid] = metav1.ObjectMeta{Namespace: pc.Namespace, Name: pc.Name}
	}
	type orphan struct {
		key string
		a   store.Allocation
	}
	var orphans []orphan
	err = d.Allocations(func(key string, a store.Allocation) error {
		if !OwnedByDRA(a) {
			return nil
		}
		uid := types.UID(a.ContainerID)
		if _, ok := claims[uid]; !ok {
			orphans = append(orphans, orphan{key, a})
			if _, ok := seen[uid]; !ok {
				seen[uid] = metav1.ObjectMeta{}
			}
		}
		return nil
	})
	if err != nil {
		d.Log.Error(err, "claim garbage collection: reading the store")
		return false
	}
	gone, err := GoneClaims(ctx, d.Client, seen)
	if err != nil {
		d.Log.Error(err, "claim garbage collection: the API server did not answer; nothing released, tried again soon")
		return false
	}
	for uid := range gone {
		pc, ok := claims[uid]
		if !ok {
			continue
		}
		if err := d.Preparer.Unprepare(ctx, uid); err != nil {
			d.Log.Error(err, "claim garbage collection: releasing a deleted claim", "claim", pc.Namespace+"/"+pc.Name, "uid", uid)
			continue
		}
		gcReleases.Inc()
		d.Log.Info("released the addresses of a claim that no longer exists", "claim", pc.Namespace+"/"+pc.Name, "uid", uid,
			"devices", len(pc.Devices))
	}
	for _, o := range orphans {
		if !gone[types.UID(o.a.ContainerID)] {
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
