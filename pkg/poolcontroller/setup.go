package poolcontroller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// SetupWithManager registers the reconciler for its kind. Pools are reconciled
// independently and in parallel (maxConcurrent workers); a Node event enqueues only
// the pools it can change: those whose selector matches the node before or after
// the event, or that hold a block for it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, namespace string, maxConcurrent int) error {
	var forObj client.Object = &v1alpha1.IPPool{}
	if r.Kind == v1alpha1.KindCIDRPool {
		forObj = &v1alpha1.CIDRPool{}
	}
	inNamespace := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == namespace })
	// A spec change, or a pool replaced: deleted and created anew under its name
	// while the watch was broken (an API server outage), which the relist
	// reports as an update with the same generation (1) and another UID.
	// Labels too: a pool's rail label is delivered in its nodes' NodeIPAMs.
	specChanged := predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return e.ObjectOld.GetUID() != e.ObjectNew.GetUID() },
	})
	// A pool created, deleted or re-specified in the namespace may end or start an
	// overlap with pools of either kind: re-check those of this kind whose network
	// overlaps its network before or after the change (the mapper sees both). No
	// other pool's outcome depends on it, so pools created together do not each
	// reconcile every other one again.
	overlapping := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return r.overlappingPools(ctx, namespace, o)
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named(r.Kind)
	if ch := r.Delivery.TrustChanged(); ch != nil {
		// A node's record written by someone else, or by the controller
		// again: every pool of the kind (the node's report counts, or no
		// longer does, beyond its grants).
		b = b.WatchesRawSource(source.Channel(ch, handler.Funcs{
			GenericFunc: func(ctx context.Context, _ event.GenericEvent, q nodeQueue) {
				for _, p := range r.poolsOfKind(ctx, namespace) {
					q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p.object())})
				}
			},
		}))
	}
	err := b.
		For(forObj, builder.WithPredicates(inNamespace, specChanged)).
		Watches(&v1alpha1.IPPool{}, overlapping, builder.WithPredicates(inNamespace, specChanged)).
		Watches(&v1alpha1.CIDRPool{}, overlapping, builder.WithPredicates(inNamespace, specChanged)).
		WatchesMetadata(&corev1.Node{}, r.nodeHandler(namespace)).
		// One controller per kind and process, but tests run several in turn.
		WithOptions(controller.Options{MaxConcurrentReconciles: maxConcurrent, SkipNameValidation: new(true)}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the %s controller: %w", r.Kind, err)
	}
	return nil
}

// poolsOfKind lists the pools of this kind, the cache's own objects: read only.
func (r *Reconciler) poolsOfKind(ctx context.Context, namespace string) []pool {
	all, err := listPools(ctx, r.Client, namespace, client.UnsafeDisableDeepCopy)
	if err != nil {
		log.FromContext(ctx).Error(err, "listing pools to map an event")
		return nil
	}
	out := all[:0]
	for _, p := range all {
		if p.kind() == r.Kind {
			out = append(out, p)
		}
	}
	return out
}

// overlappingPools returns the pools of this kind whose network overlaps that of
// the pool o (an IPPool or a CIDRPool), o itself excluded; a pool whose network
// does not parse overlaps nothing.
func (r *Reconciler) overlappingPools(ctx context.Context, namespace string, o client.Object) []reconcile.Request {
	var changed pool
	switch o := o.(type) {
	case *v1alpha1.IPPool:
		changed = ipPool{o}
	case *v1alpha1.CIDRPool:
		changed = cidrPool{o}
	default:
		return nil
	}
	theirs, ok := changed.network()
	if !ok {
		return nil
	}
	var reqs []reconcile.Request
	for _, p := range r.poolsOfKind(ctx, namespace) {
		if p.object().GetUID() == o.GetUID() {
			continue
		}
		if mine, ok := p.network(); ok && mine.Overlaps(theirs) {
			// What is free in this pool may change: no join is placed from
			// its index until its plan has seen the other pool.
			r.Delivery.Freeze(r.Kind, p.object().GetName())
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p.object())})
		}
	}
	return reqs
}

type nodeQueue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// reportDelay is how long after a daemon's report changed the pools are
// reconciled (see nodeHandler).
const reportDelay = 500 * time.Millisecond

// nodeHandler maps Node events to the pools they concern. A node that a pool
// selects and that has no block of it (it joined, or its labels changed) gets
// one from the pool's index of free blocks when the index allows it (see
// joins.go): its record is queued at once, and the pool's plan follows later.
func (r *Reconciler) nodeHandler(namespace string) handler.EventHandler {
	// joined is the node as it is now, nil when it is gone.
	enqueue := func(ctx context.Context, q nodeQueue, joined client.Object, nodes ...client.Object) {
		placedAny := false
		defer func() {
			if placedAny {
				r.Delivery.Queue(joined.GetName())
			}
		}()
		for _, p := range r.poolsOfKind(ctx, namespace) {
			if !r.concerns(p, nodes...) && !reportsHolds(nodes...) {
				continue
			}
			req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p.object())}
			if joined == nil {
				q.Add(req)
				continue
			}
			placed, low := r.placeJoin(p, joined)
			placedAny = placedAny || placed
			if placed && !low {
				q.AddAfter(req, r.followUp(p.object()))
				continue
			}
			q.Add(req)
		}
	}
	// A report that changed, and nothing else: every pool, but at most once a
	// reportDelay whatever the daemons write (a delayed item is queued once), so
	// that a daemon rewriting its report in a loop costs each pool one
	// reconcile a reportDelay, not one per write; once a plan takes longer
	// than 50 ms, ten times its duration (a report frees what it no longer
	// holds and counts only within its node's grants: nothing waits on it
	// but the release of retired blocks).
	enqueueReport := func(ctx context.Context, q nodeQueue) {
		delay := max(reportDelay, r.followUp(nil)/2)
		for _, p := range r.poolsOfKind(ctx, namespace) {
			q.AddAfter(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p.object())}, delay)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q nodeQueue) { enqueue(ctx, q, e.Object, e.Object) },
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q nodeQueue) { enqueue(ctx, q, nil, e.Object) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q nodeQueue) {
			o, n := e.ObjectOld, e.ObjectNew
			if o.GetAnnotations()[v1alpha1.HeldAnnotation] != n.GetAnnotations()[v1alpha1.HeldAnnotation] {
				if mapsEqual(o.GetLabels(), n.GetLabels()) &&
					o.GetAnnotations()[v1alpha1.PoolsInUseAnnotation] == n.GetAnnotations()[v1alpha1.PoolsInUseAnnotation] {
					enqueueReport(ctx, q)
					return
				}
				enqueue(ctx, q, n, o, n)
				return
			}
			if mapsEqual(o.GetLabels(), n.GetLabels()) &&
				o.GetAnnotations()[v1alpha1.PoolsInUseAnnotation] == n.GetAnnotations()[v1alpha1.PoolsInUseAnnotation] {
				return // nothing a pool selects on or reads changed
			}
			enqueue(ctx, q, n, o, n)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q nodeQueue) { enqueue(ctx, q, nil, e.Object) },
	}
}

// reportsHolds reports whether any of the nodes carries a daemon's report of held
// ranges, which may block or free ranges of any pool.
func reportsHolds(nodes ...client.Object) bool {
	for _, n := range nodes {
		if v := n.GetAnnotations()[v1alpha1.HeldAnnotation]; v != "" && v != "{}" {
			return true
		}
	}
	return false
}

// concerns reports whether a pool's outcome may depend on any of the node states.
func (r *Reconciler) concerns(p pool, nodes ...client.Object) bool {
	sel, err := compileSelector(p.nodeSelector())
	if err != nil {
		return true
	}
	for _, n := range nodes {
		if sel.match(n) || p.hasNode(n.GetName()) || r.Delivery.Has(r.Kind, p.object().GetName(), n.GetName()) {
			return true
		}
	}
	return false
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
