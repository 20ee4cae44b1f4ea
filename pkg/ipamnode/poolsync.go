package ipamnode

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// poolSync turns what the controller gave this node into its allocatable blocks:
// its NodeIPAM (watched by name, see run), or, where there is none (nv-ipam's CRDs
// and RBAC, a controller that has not written it yet), the pools' status. Every
// change recomputes the whole set (pools are few), so a pool whose block for this
// node disappears is deactivated: it keeps its allocations and hands out no new
// ones.
//
// At start the blocks kept in the store are provisional (nodealloc.New). The
// start-up sync asks the API server directly: when it answers, its NodeIPAM (or
// listing) replaces the stored blocks before any of them hands out an address;
// when it does not, the stored blocks serve until it does.
type poolSync struct {
	reader    client.Reader // the API server itself
	watcher   client.WithWatch
	legacy    legacyCache // starts a cache of the pools, for the pools' status
	log       logr.Logger
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
	problems  problems
	// delivered is set while the node's NodeIPAM is the source: a listing of the
	// pools is then not applied. specs are the pools' specs from the last
	// PoolSpecs the controller wrote (nil before one), by kind and name; last is
	// the last NodeIPAM the controller wrote. Guarded by mu.
	delivered bool
	specs     map[railKey]nodeipamv1.PoolSpec
	last      *nodeipamv1.NodeIPAM
	// applied is, by pool kind, name and UID, the block configuration last
	// applied from the NodeIPAM and its rail: kept while a new block of the pool
	// waits for the spec it was cut from. Guarded by mu.
	applied map[appliedKey]appliedBlock
	// kick tells run's watch that the PoolSpecs applied the NodeIPAM.
	kick chan struct{}
}

// railKey is a pool kind and a rail.
type railKey struct{ kind, rail string }

// appliedKey names a pool by kind, name and UID.
type appliedKey struct {
	kind, pool string
	uid        types.UID
}

// appliedBlock is a block configuration applied from the NodeIPAM, with its pool's rail.
type appliedBlock struct {
	cfg  *nodealloc.PoolConfig
	rail string
}

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
	// startupSyncTimeout bounds the first listing; it is shorter than the CNI
	// plugin's default call timeout (5 s), since a request that needs a stored
	// block waits for it.
	startupSyncTimeout = 3 * time.Second
	// startupRetryInterval is how often the listing is tried again while the API
	// server does not answer, so that stored blocks are reconciled soon after it
	// does, whether or not a pool event follows.
	startupRetryInterval = 2 * time.Second
)

// syncResult is what one listing found: this node's blocks, the pools bound to
// rails, and the pools that exist (for ForgetGone).
type syncResult struct {
	cfgs      []*nodealloc.PoolConfig
	railPools map[railKey][]string
	poolRail  map[railKey]string
	existing  map[string]bool
}

func newSyncResult() syncResult {
	return syncResult{railPools: map[railKey][]string{}, poolRail: map[railKey]string{}, existing: map[string]bool{}}
}

func (res *syncResult) bind(kind, name, rail string) {
	if rail == "" {
		return
	}
	k := railKey{kind, rail}
	res.railPools[k] = append(res.railPools[k], name)
	res.poolRail[railKey{kind, name}] = rail
}

// sync lists the pools from r and makes this node's blocks in them the
// allocatable set; it returns how many blocks that is. It is the way blocks
// arrive without NodeIPAMs (nv-ipam's): legacy says it is, and a listing that
// finds the node's NodeIPAM delivering meanwhile is not applied.
func (s *poolSync) sync(ctx context.Context, r client.Reader) (int, error) {
	// Held across the listing, so that two listings are not applied out of order.
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
	res := newSyncResult()
	for i := range ips.Items {
		c, err := nodealloc.FromIPPool(&ips.Items[i], s.node)
		if err != nil {
			logger.Error(err, "ignoring a pool whose block for this node does not parse", "pool", ips.Items[i].Name)
			continue
		}
		if c != nil {
			res.cfgs = append(res.cfgs, c)
		}
	}
	for i := range cidrs.Items {
		c, err := nodealloc.FromCIDRPool(&cidrs.Items[i], s.node)
		if err != nil {
			logger.Error(err, "ignoring a pool whose prefix for this node does not parse", "pool", cidrs.Items[i].Name)
			continue
		}
		if c != nil {
			res.cfgs = append(res.cfgs, c)
		}
	}
	// Both lists succeeded: this is the complete set, also when it is empty.
	for i := range ips.Items {
		res.bind(v1alpha1.KindIPPool, ips.Items[i].Name, ips.Items[i].Labels[LabelRail])
		res.existing[v1alpha1.PoolKey(v1alpha1.KindIPPool, ips.Items[i].Name)] = true
	}
	for i := range cidrs.Items {
		res.bind(v1alpha1.KindCIDRPool, cidrs.Items[i].Name, cidrs.Items[i].Labels[LabelRail])
		res.existing[v1alpha1.PoolKey(v1alpha1.KindCIDRPool, cidrs.Items[i].Name)] = true
	}
	if s.delivered {
		return len(res.cfgs), nil
	}
	return len(res.cfgs), s.apply(ctx, res)
}

// syncNodeIPAM makes the blocks of this node's NodeIPAM the allocatable set. A
// pool it does not list gives this node no block; one that holds nothing here is
// forgotten.
func (s *poolSync) syncNodeIPAM(ctx context.Context, obj *nodeipamv1.NodeIPAM) (int, error) {
	logger := log.FromContext(ctx)
	res := newSyncResult()
	s.mu.Lock()
	defer s.mu.Unlock()
	applied := map[appliedKey]appliedBlock{}
	for _, b := range obj.Spec.Blocks {
		ak := appliedKey{b.Kind, b.Pool, b.PoolUID}
		spec, ok := s.specs[railKey{b.Kind, b.Pool}]
		if !ok || spec.PoolUID != b.PoolUID || spec.Generation < b.PoolGeneration {
			// A pool created a moment ago, or a block cut from a spec newer
			// than the one this daemon has: the spec comes with the next
			// PoolSpecs, which applies this NodeIPAM again. Until then the
			// pool's block stays as it was applied, never the new block with
			// an older spec's exclusions or gateway.
			logger.V(1).Info("a block of this node's NodeIPAM waits for its pool's spec", "kind", b.Kind, "pool", b.Pool,
				"blockOfGeneration", b.PoolGeneration, "specGeneration", spec.Generation)
			prev, had := s.applied[ak]
			if !had && ok && spec.PoolUID == b.PoolUID {
				// Restarted since: the block the daemon serves from its
				// store is the pool's as it was.
				if cfg := s.currentConfig(v1alpha1.PoolKey(b.Kind, b.Pool)); cfg != nil {
					prev, had = appliedBlock{cfg: cfg, rail: spec.Rail}, true
				}
			}
			if had {
				res.cfgs = append(res.cfgs, prev.cfg)
				res.bind(b.Kind, b.Pool, prev.rail)
				res.existing[v1alpha1.PoolKey(b.Kind, b.Pool)] = true
				applied[ak] = prev
			}
			continue
		}
		var c *nodealloc.PoolConfig
		var err error
		switch {
		case b.Kind == v1alpha1.KindIPPool && spec.IPPool != nil:
			p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: b.Pool, Namespace: s.namespace, UID: b.PoolUID},
				Spec: *spec.IPPool, Status: v1alpha1.IPPoolStatus{Allocations: []v1alpha1.Allocation{
					{NodeName: s.node, StartIP: b.StartIP, EndIP: b.EndIP}}}}
			c, err = nodealloc.FromIPPool(p, s.node)
		case b.Kind == v1alpha1.KindCIDRPool && spec.CIDRPool != nil:
			p := &v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: b.Pool, Namespace: s.namespace, UID: b.PoolUID},
				Spec: *spec.CIDRPool, Status: v1alpha1.CIDRPoolStatus{Allocations: []v1alpha1.CIDRPoolAllocation{
					{NodeName: s.node, Prefix: b.Prefix, Gateway: b.Gateway}}}}
			c, err = nodealloc.FromCIDRPool(p, s.node)
		default:
			err = fmt.Errorf("%s %s: its PoolSpecs entry has no spec of its kind", b.Kind, b.Pool)
		}
		if err != nil {
			logger.Error(err, "ignoring a block of this node's NodeIPAM that does not parse", "pool", b.Pool)
			continue
		}
		res.cfgs = append(res.cfgs, c)
		res.bind(b.Kind, b.Pool, spec.Rail)
		res.existing[v1alpha1.PoolKey(b.Kind, b.Pool)] = true
		applied[ak] = appliedBlock{cfg: c, rail: spec.Rail}
	}
	s.applied = applied
	if !s.delivered {
		logger.Info("reading this node's blocks from its NodeIPAM", "nodeipam", obj.Namespace+"/"+obj.Name, "blocks", len(res.cfgs))
	}
	s.delivered = true
	return len(res.cfgs), s.apply(ctx, res)
}

// currentConfig returns the block configuration the daemon serves the pool
// with key from (applied, or loaded from its store), nil when none.
func (s *poolSync) currentConfig(key string) *nodealloc.PoolConfig {
	for _, p := range s.manager.Pools() {
		if p.Key == key && p.Config != nil && (p.Active || p.Provisional) {
			return p.Config
		}
	}
	return nil
}

// apply makes res the allocatable set; s.mu is held.
func (s *poolSync) apply(ctx context.Context, res syncResult) error {
	logger := log.FromContext(ctx)
	for _, names := range res.railPools {
		slices.Sort(names)
	}
	before := s.manager.Holds()
	err := s.manager.SyncPools(res.cfgs)
	// A pool deleted from the API server is forgotten once it holds nothing
	// (now, or when its last allocation is released), so that it does not
	// linger in ipamctl pools and check. A pool that exists but gives this
	// node no block is kept.
	forgotten, ferr := s.manager.ForgetGone(res.existing)
	if len(forgotten) > 0 {
		logger.Info("forgot pools that hold nothing on this node and are deleted (or, through its NodeIPAM, give it no block)",
			"pools", forgotten)
	}
	if ferr != nil {
		logger.Error(ferr, "forgetting pools deleted from the API server; tried again at the next pool sync")
	}
	// What the listing found is told once its blocks are applied: a rail's
	// pool is not handed out before this node's block in it is there.
	s.rmu.Lock()
	railsBefore := s.railPools
	s.synced, s.railPools, s.poolRail = true, res.railPools, res.poolRail
	s.rmu.Unlock()
	if s.railsChanged != nil && !maps.EqualFunc(railsBefore, res.railPools, slices.Equal[[]string]) {
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
		return fmt.Errorf("applying pool blocks: %w", err)
	}
	return nil
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
