package ipamnode

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// poolSync turns the pools' status into this node's allocatable blocks. Every
// pool event recomputes the whole set (pools are few), so a pool whose block for
// this node disappears is deactivated: it keeps its allocations and hands out no
// new ones.
//
// At start the blocks kept in the store are provisional (nodealloc.New). The
// start-up sync asks the API server directly: when it answers, its listing
// replaces the stored blocks before any of them hands out an address; when it
// does not, the stored blocks serve until a listing succeeds.
type poolSync struct {
	client    client.Client // the manager's cache, fed by the watch
	reader    client.Reader // the API server itself, for the start-up sync
	manager   *nodealloc.Manager
	node      string
	namespace string
	// changed, when set, gets a token (never blocking) after each sync that changed
	// what this node may allocate from; railsChanged, after each that changed
	// which pools are labelled for which rail (the DRA driver publishes them).
	changed      chan<- struct{}
	railsChanged chan<- struct{}

	// mu makes each listing and its SyncPools one step, so that two listings
	// are not applied interleaved. It is held across the listing's API calls:
	// readers of what the last listing found take rmu, never mu.
	mu sync.Mutex
	// rmu guards what the last complete listing found.
	rmu    sync.Mutex
	synced bool
	// railPools are the pools labelled nic.hwipam.io/rail, by kind and rail, from
	// the last listing.
	railPools map[railKey][]string
	poolRail  map[railKey]string // kind and pool name → rail
}

// railKey is a pool kind and a rail.
type railKey struct{ kind, rail string }

// LabelRail binds a pool to a rail (docs/rails.md).
const LabelRail = v1alpha1.LabelRail

// railOfPool returns the rail a pool is labelled for.
func (s *poolSync) railOfPool(kind, name string) string {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.poolRail[railKey{kind, name}]
}

// poolsOfRail returns the pools of kind labelled for rail, and whether a listing
// has been seen.
func (s *poolSync) poolsOfRail(kind, rail string) ([]string, bool) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return slices.Clone(s.railPools[railKey{kind, rail}]), s.synced
}

const (
	// waitForever is the cache sync timeout: with the API server unreachable the
	// watch waits for it, while the gRPC API goes on serving.
	waitForever = 100 * 365 * 24 * time.Hour
	// startupSyncTimeout bounds the first listing; it is shorter than the CNI
	// plugin's default call timeout (5 s), since a request that needs a stored
	// block waits for it.
	startupSyncTimeout = 3 * time.Second
	// startupRetryInterval is how often the listing is tried again while the API
	// server does not answer, so that stored blocks are reconciled soon after it
	// does, whether or not a pool event follows.
	startupRetryInterval = 2 * time.Second
)

func (s *poolSync) setup(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: s.namespace, Name: "all-pools"}}}
	})
	// One event that is there from the start: the controller reconciles once its
	// cache has synced even when no pool exists (an empty listing deactivates
	// every stored block; no pool event would ever say so).
	initial := make(chan event.GenericEvent, 1)
	initial <- event.GenericEvent{Object: &v1alpha1.IPPool{}}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("poolsync").
		Watches(&v1alpha1.IPPool{}, all).
		Watches(&v1alpha1.CIDRPool{}, all).
		WatchesRawSource(source.Channel(initial, all)).
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
	n, err := s.sync(ctx, s.client)
	if err != nil {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).V(1).Info("pools synced", "blocks", n)
	return reconcile.Result{}, nil
}

// startup lists the pools from the API server itself, bounded by
// startupSyncTimeout. If that fails, the stored blocks serve
// (UseStoredBlocks) and the listing is retried every startupRetryInterval until
// it, or the watch, has synced once.
func (s *poolSync) startup(ctx context.Context, logger logr.Logger) {
	for first := true; ; first = false {
		lctx, cancel := context.WithTimeout(ctx, startupSyncTimeout)
		n, err := s.sync(lctx, s.reader)
		cancel()
		switch {
		case err == nil:
			logger.Info("pools synced from the API server", "blocks", n)
			return
		case ctx.Err() != nil:
			return
		case first:
			logger.Info("the API server did not answer: allocating from the blocks kept in the store until it does",
				"storedBlocks", s.manager.UseStoredBlocks(), "error", err.Error())
		default:
			logger.V(1).Info("the API server still does not answer", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(startupRetryInterval):
		}
		if s.hasSynced() {
			return
		}
	}
}

func (s *poolSync) hasSynced() bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.synced
}

// sync lists the pools from r and makes this node's blocks in them the
// allocatable set; it returns how many blocks that is.
func (s *poolSync) sync(ctx context.Context, r client.Reader) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	logger := log.FromContext(ctx)
	var ips v1alpha1.IPPoolList
	if err := r.List(ctx, &ips, client.InNamespace(s.namespace)); err != nil {
		return 0, fmt.Errorf("listing IPPools: %w", err)
	}
	var cidrs v1alpha1.CIDRPoolList
	if err := r.List(ctx, &cidrs, client.InNamespace(s.namespace)); err != nil {
		return 0, fmt.Errorf("listing CIDRPools: %w", err)
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
	// Both lists succeeded: this is the complete set, also when it is empty.
	railPools, poolRail := map[railKey][]string{}, map[railKey]string{}
	bind := func(kind, name, rail string) {
		if rail == "" {
			return
		}
		k := railKey{kind, rail}
		railPools[k] = append(railPools[k], name)
		poolRail[railKey{kind, name}] = rail
	}
	for i := range ips.Items {
		bind(v1alpha1.KindIPPool, ips.Items[i].Name, ips.Items[i].Labels[LabelRail])
	}
	for i := range cidrs.Items {
		bind(v1alpha1.KindCIDRPool, cidrs.Items[i].Name, cidrs.Items[i].Labels[LabelRail])
	}
	for _, names := range railPools {
		slices.Sort(names)
	}
	before := s.manager.Holds()
	err := s.manager.SyncPools(cfgs)
	// A pool deleted from the API server is forgotten once it holds nothing
	// (now, or when its last allocation is released), so that it does not
	// linger in ipamctl pools and check. A pool that exists but gives this
	// node no block is kept.
	existing := make(map[string]bool, len(ips.Items)+len(cidrs.Items))
	for i := range ips.Items {
		existing[v1alpha1.PoolKey(v1alpha1.KindIPPool, ips.Items[i].Name)] = true
	}
	for i := range cidrs.Items {
		existing[v1alpha1.PoolKey(v1alpha1.KindCIDRPool, cidrs.Items[i].Name)] = true
	}
	forgotten, ferr := s.manager.ForgetGone(existing)
	if len(forgotten) > 0 {
		logger.Info("forgot pools deleted from the API server that hold nothing on this node", "pools", forgotten)
	}
	if ferr != nil {
		logger.Error(ferr, "forgetting pools deleted from the API server; tried again at the next pool sync")
	}
	// What the listing found is told once its blocks are applied: a rail's
	// pool is not handed out before this node's block in it is there.
	s.rmu.Lock()
	railsBefore := s.railPools
	s.synced, s.railPools, s.poolRail = true, railPools, poolRail
	s.rmu.Unlock()
	if s.railsChanged != nil && !maps.EqualFunc(railsBefore, railPools, slices.Equal[[]string]) {
		select {
		case s.railsChanged <- struct{}{}:
		default:
		}
	}
	if s.changed != nil && !maps.EqualFunc(before, s.manager.Holds(), func(a, b v1alpha1.PoolHold) bool { return a.Block == b.Block }) {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	if err != nil {
		return len(cfgs), fmt.Errorf("applying pool blocks: %w", err)
	}
	return len(cfgs), nil
}

// railPoolsAll returns, for each rail, its IPPools (its CIDRPools when it has
// no IPPool), and whether a listing has been seen.
func (s *poolSync) railPoolsAll() (map[string][]string, bool) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	out := map[string][]string{}
	for k, names := range s.railPools {
		if k.kind == v1alpha1.KindIPPool || len(out[k.rail]) == 0 && s.railPools[railKey{v1alpha1.KindIPPool, k.rail}] == nil {
			out[k.rail] = slices.Clone(names)
		}
	}
	return out, s.synced
}
