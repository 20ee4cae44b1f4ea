package ipamnode

import (
	"context"
	"fmt"
	"maps"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// poolSync turns the pools' status into this node's allocatable blocks. Every
// pool event recomputes the whole set (pools are few), so a pool whose block for
// this node disappears is deactivated: it keeps its allocations and hands out no
// new ones.
type poolSync struct {
	client    client.Client
	manager   *nodealloc.Manager
	node      string
	namespace string
	// changed, when set, gets a token (never blocking) after each sync that changed
	// what this node may allocate from.
	changed chan<- struct{}
}

// waitForever is the cache sync timeout: with the API server unreachable the pool
// sync waits for it, while the gRPC API goes on serving the stored blocks.
const waitForever = 100 * 365 * 24 * time.Hour

func (s *poolSync) setup(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: s.namespace, Name: "all-pools"}}}
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("poolsync").
		Watches(&v1alpha1.IPPool{}, all).
		Watches(&v1alpha1.CIDRPool{}, all).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, CacheSyncTimeout: waitForever, NeedLeaderElection: new(false),
			SkipNameValidation: new(true)}). // one daemon per process, but tests run several in turn
		Complete(s)
	if err != nil {
		return fmt.Errorf("setting up the pool sync: %w", err)
	}
	return nil
}

// Reconcile implements reconcile.Reconciler.
func (s *poolSync) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	var ips v1alpha1.IPPoolList
	if err := s.client.List(ctx, &ips, client.InNamespace(s.namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing IPPools: %w", err)
	}
	var cidrs v1alpha1.CIDRPoolList
	if err := s.client.List(ctx, &cidrs, client.InNamespace(s.namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing CIDRPools: %w", err)
	}
	var cfgs []*nodealloc.PoolConfig
	for i := range ips.Items {
		c, err := nodealloc.FromIPPool(&ips.Items[i], s.node)
		if err != nil {
			logger.Error(err, "ignoring a pool whose block for this node does not parse", "pool", ips.Items[i].Name)
			continue
		}
		if c != nil {
			cfgs = append(cfgs, c)
		}
	}
	for i := range cidrs.Items {
		c, err := nodealloc.FromCIDRPool(&cidrs.Items[i], s.node)
		if err != nil {
			logger.Error(err, "ignoring a pool whose prefix for this node does not parse", "pool", cidrs.Items[i].Name)
			continue
		}
		if c != nil {
			cfgs = append(cfgs, c)
		}
	}
	before := s.manager.Holds()
	err := s.manager.SyncPools(cfgs)
	if s.changed != nil && !maps.EqualFunc(before, s.manager.Holds(), func(a, b v1alpha1.PoolHold) bool { return a.Block == b.Block }) {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("applying pool blocks: %w", err)
	}
	logger.V(1).Info("pools synced", "blocks", len(cfgs))
	return reconcile.Result{}, nil
}
