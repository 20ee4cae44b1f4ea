package poolcontroller

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/daemon"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// Delivery gives each node its blocks through one NodeIPAM object, named after the
// node in the pools' namespace, which the node's daemon watches by name: a block
// given to or taken from another node sends a daemon nothing, and a pool's status
// need not list every block (see Reconciler.MaxListed).
//
// The pool reconcilers tell it each pool's blocks (Set) and deleted pools
// (Remove); workers write the NodeIPAMs whose blocks differ from what they say,
// one write per node for any number of pools changed together. A NodeIPAM edited
// or deleted by someone else is written back. A pool no reconcile has set since
// the start keeps the blocks its NodeIPAMs show (a restarted controller does not
// take blocks away while its pools are reconciled one after another), unless the
// pool is gone.
//
// Without the NodeIPAM CRD, or without the right to write NodeIPAMs, Delivery is
// off (Enabled is false): the pools' status lists every block, as nv-ipam's does.
type Delivery struct {
	// Client writes NodeIPAMs and reads NodeIPAMs, pools and Node metadata from the
	// manager's cache; Reader probes the API server for the CRD at start.
	Client client.Client
	Reader client.Reader
	Cache  cache.Cache
	// Namespace is the pools' namespace, where the NodeIPAMs are.
	Namespace string
	// Workers write NodeIPAMs in parallel; 0 means 32.
	Workers int
	Log     logr.Logger

	mu    sync.Mutex
	pools map[poolRef]*poolBlocks // set by the reconcilers
	gone  map[poolRef]bool        // removed: dropped from every NodeIPAM
	queue workqueue.TypedRateLimitingInterface[string]

	decided chan struct{} // closed once enabled is known
	enabled bool
	writes  uint64
	// busy counts the queue's items being synced.
	busy atomic.Int64
	// pending are the NodeIPAMs (and the PoolSpecs) a Set or Remove changed and
	// that are not yet written as it says, by the number of the last change:
	// a sync that succeeds after that change clears it. A write that failed and
	// waits in the rate limiter, or an object waiting to be created again, stays
	// pending (see Idle).
	pending map[string]uint64
	// freezes counts, per pool, what stopped its joins index (see
	// joins.go); snaps is the count when the pool's running plan started:
	// a plan whose index was frozen meanwhile installs a frozen one.
	freezes map[poolRef]uint64
	snaps   map[poolRef]uint64
	changes uint64
	// untrusted are the nodes whose NodeIPAM someone other than the controller
	// wrote, as the cache last saw them (see UntrustedNodes).
	untrusted map[string]bool
	trustSubs []chan event.GenericEvent
	// Memory keeps the blocks retired from nodes that their records list
	// (see retired.go); nil: records list none.
	Memory *Memory
}

// poolSpecsKey is the queue's item for the PoolSpecs object: no node is named
// so (a name has no slash).
const poolSpecsKey = "/poolspecs"

const (
	// newNodeDelay is how long after a Node is created its NodeIPAM is
	// written when no pool has given it a block by then; startSweepDelay, for
	// the Nodes there at the start.
	newNodeDelay    = 5 * time.Second
	startSweepDelay = 30 * time.Second
)

// poolRef names a pool of the namespace.
type poolRef struct{ kind, name string }

// poolBlocks are one pool's blocks as its last reconcile left them: by node,
// the index of its block in layout (8 bytes a node, where the block's text
// would take some 40; it is written out for the node's NodeIPAM only).
type poolBlocks struct {
	template nodeipamv1.PoolSpec
	layout   blocks.Layout
	blocks   map[string]uint64
	// joins is the index of free blocks that joining nodes are given blocks
	// from before the pool's next plan (see joins.go); nil: none.
	joins *joinIndex
}

// val returns the block of index i as status lists it.
func (pb *poolBlocks) val(i uint64) blockVal {
	if l, ok := pb.layout.(*blocks.CIDRPool); ok {
		prefix := l.Prefix(i)
		v := blockVal{prefix: prefix.String()}
		if gw, ok := l.Gateway(prefix); ok {
			v.gateway = gw.String()
		}
		return v
	}
	b := pb.layout.Block(i)
	return blockVal{start: b.Start.String(), end: b.End.String()}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the leader
// writes.
func (*Delivery) NeedLeaderElection() bool { return true }

func (d *Delivery) init() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.decided == nil {
		d.decided = make(chan struct{})
		d.pools = map[poolRef]*poolBlocks{}
		d.gone = map[poolRef]bool{}
		d.pending = map[string]uint64{}
		d.freezes = map[poolRef]uint64{}
		d.snaps = map[poolRef]uint64{}
		d.untrusted = map[string]bool{}
		d.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodeipam"})
	}
}

// Enabled waits until Start has found whether NodeIPAMs can be written, and
// reports it; false when ctx ends first. A nil Delivery is off.
func (d *Delivery) Enabled(ctx context.Context) bool {
	if d == nil {
		return false
	}
	d.init()
	select {
	case <-d.decided:
		return d.enabled
	case <-ctx.Done():
		return false
	}
}

// on reports whether delivery runs, without waiting.
func (d *Delivery) on() bool {
	if d == nil {
		return false
	}
	d.init()
	select {
	case <-d.decided:
		return d.enabled
	default:
		return false
	}
}

// Start implements manager.Runnable.
func (d *Delivery) Start(ctx context.Context) error {
	d.init()
	defer d.queue.ShutDown()
	// Asked first: under network-operator's roles this is the common case, and
	// not worth a refused request.
	for _, resource := range []string{"nodeipams", "poolspecs"} {
		denied, err := daemon.Allowed(ctx, d.Client, nodeipamv1.GroupVersion.Group, resource, d.Namespace,
			"list", "watch", "create", "update", "delete")
		if err == nil && denied != "" {
			d.Log.Info("WARNING: this controller's role does not let it " + denied + " " + resource + " (ipam.hwipam.io): every pool's " +
				"status lists every block, as nv-ipam's does; grant deploy/rbac/controller's rules on nodeipams and poolspecs " +
				"to deliver blocks per node (docs/scale.md)")
			d.decide(false)
			<-ctx.Done()
			return nil
		}
	}
	var probe nodeipamv1.NodeIPAMList
	err := d.Reader.List(ctx, &probe, client.InNamespace(d.Namespace), client.Limit(1))
	switch {
	case err == nil:
	case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
		d.Log.Info("the NodeIPAM CRD is not installed: every pool's status lists every block (as nv-ipam's does), " +
			"and daemons read their blocks there; install deploy/crds to deliver blocks per node")
		d.decide(false)
		<-ctx.Done()
		return nil
	case apierrors.IsForbidden(err):
		d.Log.Info("WARNING: not allowed to list NodeIPAMs: every pool's status lists every block; grant the "+
			"controller deploy/rbac/controller's rules on nodeipams to deliver blocks per node", "error", err.Error())
		d.decide(false)
		<-ctx.Done()
		return nil
	default:
		// The API server does not answer yet: the informers would not sync
		// either. Tried again until it does.
		for err != nil && !meta.IsNoMatchError(err) && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			d.Log.V(1).Info("probing for NodeIPAMs failed; will retry", "error", err.Error())
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(2 * time.Second):
			}
			err = d.Reader.List(ctx, &probe, client.InNamespace(d.Namespace), client.Limit(1))
		}
		if err != nil {
			d.decide(false)
			d.Log.Info("NodeIPAMs cannot be listed: every pool's status lists every block", "error", err.Error())
			<-ctx.Done()
			return nil
		}
	}
	enqueue := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { d.enqueueObject(o) },
		UpdateFunc: func(_, o any) { d.enqueueObject(o) },
		DeleteFunc: func(o any) { d.enqueueObject(o) },
	}
	inf, err := d.Cache.GetInformer(ctx, &nodeipamv1.NodeIPAM{})
	if err != nil {
		return fmt.Errorf("watching NodeIPAMs: %w", err)
	}
	if _, err := inf.AddEventHandler(enqueue); err != nil {
		return fmt.Errorf("watching NodeIPAMs: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { d.observe(o, false) },
		UpdateFunc: func(_, o any) { d.observe(o, false) },
		DeleteFunc: func(o any) { d.observe(o, true) },
	}); err != nil {
		return fmt.Errorf("watching NodeIPAMs: %w", err)
	}
	sinf, err := d.Cache.GetInformer(ctx, &nodeipamv1.PoolSpecs{})
	if err != nil {
		return fmt.Errorf("watching PoolSpecs: %w", err)
	}
	specsChanged := func(any) { d.queue.Add(poolSpecsKey) }
	if _, err := sinf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: specsChanged, UpdateFunc: func(_, o any) { specsChanged(o) }, DeleteFunc: specsChanged,
	}); err != nil {
		return fmt.Errorf("watching PoolSpecs: %w", err)
	}
	var node metav1.PartialObjectMetadata
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	ninf, err := d.Cache.GetInformer(ctx, &node)
	if err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	// A Node created gets its object (empty when no pool selects it), one
	// deleted loses it once no pool keeps a block for it. Not at once: the
	// pools' reconciles usually give it its blocks first, so that it is
	// written once; the Nodes there at the start, later still (a controller
	// that starts with its pools reconciles them all first).
	if _, err := ninf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(o any, initial bool) {
			delay := newNodeDelay
			if initial {
				delay = startSweepDelay
			}
			if m, err := meta.Accessor(o); err == nil {
				d.queue.AddAfter(m.GetName(), delay)
			}
		},
		DeleteFunc: func(o any) { d.enqueueObject(o) },
	}); err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	if !d.Cache.WaitForCacheSync(ctx) {
		return nil
	}
	d.decide(true)
	d.Log.Info("delivering blocks per node through NodeIPAM objects", "namespace", d.Namespace)
	workers := cmp.Or(d.Workers, 32)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	d.queue.ShutDown()
	wg.Wait()
	return nil
}

// observe keeps track of the NodeIPAMs someone other than the controller wrote.
func (d *Delivery) observe(o any, gone bool) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o, gone = t.Obj, true
	}
	obj, ok := o.(*nodeipamv1.NodeIPAM)
	if !ok {
		return
	}
	d.mu.Lock()
	was := d.untrusted[obj.Name]
	if gone || nodeipamv1.OwnedByController(obj) {
		delete(d.untrusted, obj.Name)
	} else {
		d.untrusted[obj.Name] = true
	}
	changed := was != d.untrusted[obj.Name]
	subs := d.trustSubs
	d.mu.Unlock()
	if changed {
		// The pools plan with the node's report, or without it, again.
		for _, ch := range subs {
			select {
			case ch <- event.GenericEvent{Object: obj}:
			default: // one is queued already: that reconcile reads the latest
			}
		}
	}
}

// TrustChanged returns a channel that receives an event each time a node's
// NodeIPAM becomes, or stops being, one someone other than the controller
// wrote (see UntrustedNodes): a source for the pools' reconcilers. nil for a
// nil Delivery.
func (d *Delivery) TrustChanged() <-chan event.GenericEvent {
	if d == nil {
		return nil
	}
	d.init()
	ch := make(chan event.GenericEvent, 1)
	d.mu.Lock()
	d.trustSubs = append(d.trustSubs, ch)
	d.mu.Unlock()
	return ch
}

// UntrustedNodes returns, sorted, the nodes whose NodeIPAM someone other than
// the controller wrote: their daemons ignore it and keep the blocks they had,
// which no record then says (the controller writes the object again, once
// every pool it lists has been reconciled).
func (d *Delivery) UntrustedNodes() []string {
	if !d.on() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.untrusted) == 0 {
		return nil
	}
	out := make([]string, 0, len(d.untrusted))
	for n := range d.untrusted {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (d *Delivery) decide(enabled bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.enabled = enabled
	close(d.decided)
}

func (d *Delivery) enqueueObject(o any) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if m, err := meta.Accessor(o); err == nil {
		d.queue.Add(m.GetName())
	}
}

// Set records a pool's blocks in layout, by node, as its reconcile decided them
// (as, sorted by node), and queues the nodes whose NodeIPAM they change. The
// blocks placed from the pool's index since the reconcile started are merged
// in (see mergePlaced), and the assignments returned are those recorded;
// unplaced are the nodes that lost the block their plan gave them to a
// placement and got none, and wait for another plan. spare and skip are the pool's new
// index of free blocks for joining nodes (see joins.go); nil spare: none.
func (d *Delivery) Set(p pool, layout blocks.Layout, as []planner.Assignment, spare []uint64, skip map[string]bool) (recorded []planner.Assignment, unplaced []string) {
	if !d.on() {
		return as, nil
	}
	ref := poolRef{p.kind(), p.object().GetName()}
	tmpl := p.template()
	d.mu.Lock()
	old := d.pools[ref]
	if old != nil && old.joins != nil && old.template.PoolUID == tmpl.PoolUID && old.template.Generation == tmpl.Generation {
		as, spare, unplaced = mergePlaced(as, old.joins.placed, spare)
	}
	sameLayout := old != nil && old.template.PoolUID == tmpl.PoolUID && old.template.Generation == tmpl.Generation
	bs := reuseBlocks(old, sameLayout, as)
	var joins *joinIndex
	if spare != nil {
		joins = &joinIndex{spare: spare, start: len(spare), skip: skip, placed: map[string]uint64{},
			frozen: d.freezes[ref] != d.snaps[ref]}
	}
	// The nodes whose records this changes, found before the blocks are the
	// index's: a join placed from then on writes bs (with d.mu held).
	var changed []string
	switch {
	case !sameLayout:
		// Another pool, or another layout (an index is a block of one
		// layout): every node of the pool's, old and new.
		for _, a := range as {
			changed = append(changed, a.Node)
		}
		if old != nil {
			for n := range old.blocks {
				changed = append(changed, n)
			}
		}
	case sameMap(bs, old.blocks):
		// The plan changed nothing.
	default:
		for _, a := range as {
			if ob, ok := old.blocks[a.Node]; !ok || ob != a.Index {
				changed = append(changed, a.Node)
			}
		}
		for n := range old.blocks {
			if _, ok := bs[n]; !ok {
				changed = append(changed, n)
			}
		}
	}
	d.pools[ref] = &poolBlocks{template: tmpl, layout: layout, blocks: bs, joins: joins}
	delete(d.gone, ref)
	d.mu.Unlock()
	if old == nil || !reflect.DeepEqual(old.template, tmpl) {
		// The spec is in PoolSpecs, once: a spec or rail change writes that.
		d.change(poolSpecsKey)
	}
	for _, n := range changed {
		d.change(n)
	}
	if old == nil {
		d.queueObserved(ref)
	}
	return as, unplaced
}

// sameMap tells whether a and b are one map (reuseBlocks kept it).
func sameMap(a, b map[string]uint64) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// reuseBlocks returns the blocks of as by node: old's own map when they are
// what it holds, of the same layout (most plans change nothing: a map of 100,000
// nodes less for the collector, per pool and plan), else a new one. With d.mu
// held; old is replaced by the caller, so its map is no one else's.
func reuseBlocks(old *poolBlocks, sameLayout bool, as []planner.Assignment) map[string]uint64 {
	if sameLayout && len(old.blocks) == len(as) && !slices.ContainsFunc(as, func(a planner.Assignment) bool {
		b, ok := old.blocks[a.Node]
		return !ok || b != a.Index
	}) {
		return old.blocks
	}
	return indexOf(as)
}

// change queues a NodeIPAM (or the PoolSpecs) that a pool's blocks changed,
// pending until a sync after this succeeds.
func (d *Delivery) change(key string) {
	d.markPending(key)
	d.queue.Add(key)
}

// retryLater queues key again after delay, pending past the sync that runs
// now, which returns without having written it (it waits to be created again,
// or for the pools it lists to be reconciled).
func (d *Delivery) retryLater(key string, delay time.Duration) {
	d.markPending(key)
	d.queue.AddAfter(key, delay)
}

func (d *Delivery) markPending(key string) {
	d.mu.Lock()
	d.changes++
	d.pending[key] = d.changes
	d.mu.Unlock()
}

// wrote counts a write sent (see Writes).
func (d *Delivery) wrote() {
	d.mu.Lock()
	d.writes++
	d.mu.Unlock()
}

// queueObserved queues every node whose NodeIPAM lists a block of ref.
func (d *Delivery) queueObserved(ref poolRef) {
	var list nodeipamv1.NodeIPAMList
	if err := d.Client.List(context.Background(), &list, client.InNamespace(d.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	for i := range list.Items {
		for _, b := range list.Items[i].Spec.Blocks {
			if b.Kind == ref.kind && b.Pool == ref.name {
				d.change(list.Items[i].Name)
				break
			}
		}
	}
}

// Remove drops a deleted pool's blocks from every NodeIPAM.
func (d *Delivery) Remove(kind, name string) {
	if !d.on() {
		return
	}
	ref := poolRef{kind, name}
	d.mu.Lock()
	old := d.pools[ref]
	delete(d.pools, ref)
	d.gone[ref] = true
	d.mu.Unlock()
	if old != nil {
		for n := range old.blocks {
			d.change(n)
		}
	}
	d.queueObserved(ref)
	d.change(poolSpecsKey)
}

// Assigned returns the blocks the last reconcile in this process gave the pool
// of UID uid and generation gen (its layout), as the plan's assignments sorted
// by node, and whether there was such a reconcile: the plan's own record,
// without writing the blocks out and parsing them back.
func (d *Delivery) Assigned(kind, name string, uid types.UID, gen int64) ([]planner.Assignment, bool) {
	if !d.on() {
		return nil, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	pb := d.pools[poolRef{kind, name}]
	if pb == nil || pb.template.PoolUID != uid || pb.template.Generation != gen {
		return nil, false
	}
	if pb.joins != nil {
		// The plan starts from these: what is placed from now on is
		// merged into it (Set).
		pb.joins.placed = map[string]uint64{}
	}
	d.snaps[poolRef{kind, name}] = d.freezes[poolRef{kind, name}]
	out := make([]planner.Assignment, 0, len(pb.blocks))
	for n, i := range pb.blocks {
		out = append(out, planner.Assignment{Node: n, Index: i})
	}
	slices.SortFunc(out, func(a, b planner.Assignment) int { return cmp.Compare(a.Node, b.Node) })
	return out, true
}

// Existing returns the blocks the NodeIPAMs give a pool of UID uid, by node: as
// its last reconcile in this process set them, or, before that, as the objects
// the controller wrote show them (a controller restarted while the pool's status
// lists no blocks; an object someone else wrote counts for nothing).
func (d *Delivery) Existing(ctx context.Context, kind, name string, uid types.UID) (map[string]blockVal, error) {
	return d.existing(ctx, kind, name, uid, false)
}

// ExistingToPlan is Existing for the pool's own plan, which starts there (see
// Assigned).
func (d *Delivery) ExistingToPlan(ctx context.Context, kind, name string, uid types.UID) (map[string]blockVal, error) {
	return d.existing(ctx, kind, name, uid, true)
}

func (d *Delivery) existing(ctx context.Context, kind, name string, uid types.UID, plan bool) (map[string]blockVal, error) {
	ref := poolRef{kind, name}
	d.mu.Lock()
	// The pool's own plan starts from the records (a start, another layout,
	// another pool of the name): nothing is placed from an earlier index
	// meanwhile, which it would not know of. Or another pool over this one's
	// network plans: what is free here may be that pool's soon.
	d.freezeLocked(ref)
	if plan {
		d.snaps[ref] = d.freezes[ref]
	}
	if pb := d.pools[ref]; pb != nil && pb.template.PoolUID == uid {
		out := make(map[string]blockVal, len(pb.blocks))
		for n, i := range pb.blocks {
			out[n] = pb.val(i)
		}
		d.mu.Unlock()
		return out, nil
	}
	d.mu.Unlock()
	var list nodeipamv1.NodeIPAMList
	if err := d.Client.List(ctx, &list, client.InNamespace(d.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing NodeIPAMs: %w", err)
	}
	out := map[string]blockVal{}
	for i := range list.Items {
		if !nodeipamv1.OwnedByController(&list.Items[i]) {
			// Written by someone else (and about to be written again): not
			// what the controller gave, as no daemon takes it to be.
			continue
		}
		for _, b := range list.Items[i].Spec.Blocks {
			if b.Kind == kind && b.Pool == name && b.PoolUID == uid {
				out[list.Items[i].Name] = blockVal{start: b.StartIP, end: b.EndIP, prefix: b.Prefix, gateway: b.Gateway}
			}
		}
	}
	return out, nil
}

// Has reports whether a pool's NodeIPAM blocks include one for node.
func (d *Delivery) Has(kind, name, node string) bool {
	if !d.on() {
		return false
	}
	d.mu.Lock()
	if pb := d.pools[poolRef{kind, name}]; pb != nil {
		_, ok := pb.blocks[node]
		d.mu.Unlock()
		return ok
	}
	d.mu.Unlock()
	var obj nodeipamv1.NodeIPAM
	if err := d.Client.Get(context.Background(), client.ObjectKey{Namespace: d.Namespace, Name: node}, &obj); err != nil {
		return false
	}
	return slices.ContainsFunc(obj.Spec.Blocks, func(b nodeipamv1.NodeBlock) bool { return b.Kind == kind && b.Pool == name })
}

// Idle reports whether every NodeIPAM (and the PoolSpecs) holds what the pools'
// reconciles set so far: no write of theirs is queued, running, failed and
// waiting to be retried, or waiting to create an object again (a Node's delayed
// first write of an empty NodeIPAM aside). Only then may a status stop listing
// blocks that the records alone then hold.
func (d *Delivery) Idle() bool {
	if !d.on() {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pending) == 0
}

// Writes is how many NodeIPAM writes (creates, updates, deletes) were sent.
func (d *Delivery) Writes() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.writes
}

func (d *Delivery) processNext(ctx context.Context) bool {
	node, shutdown := d.queue.Get()
	if shutdown {
		return false
	}
	d.busy.Add(1)
	defer d.busy.Add(-1)
	defer d.queue.Done(node)
	sync := d.sync
	if node == poolSpecsKey {
		sync = d.syncSpecs
	}
	d.mu.Lock()
	mark, marked := d.pending[node]
	d.mu.Unlock()
	err := sync(ctx, node)
	if err == nil && marked {
		d.mu.Lock()
		if d.pending[node] == mark {
			delete(d.pending, node)
		}
		d.mu.Unlock()
	}
	if err != nil {
		if ctx.Err() == nil {
			if node == poolSpecsKey {
				writeFailures.WithLabelValues(failedPoolSpecs).Inc()
			} else {
				writeFailures.WithLabelValues(failedNodeIPAM).Inc()
			}
			if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
				d.Log.Error(err, "writing a node's NodeIPAM; will retry", "node", node)
			}
			d.queue.AddRateLimited(node)
		}
		return true
	}
	d.queue.Forget(node)
	return true
}

// want returns what node's NodeIPAM should say, given what it says now (nil
// when there is none): its blocks (see blocksOf) and the blocks retired from it
// that its daemon may still hold addresses in, as the memory keeps them (before
// the memory is loaded, as the record lists them).
func (d *Delivery) want(ctx context.Context, node string, cur *nodeipamv1.NodeIPAM) nodeipamv1.NodeIPAMSpec {
	var had []nodeipamv1.RetiredBlock
	if cur != nil {
		had = cur.Spec.Retired
	}
	blocks := d.blocksOf(ctx, node, cur)
	if cur != nil && d.Memory != nil {
		// What the record stops listing as a block, it lists as retired.
		var dropped []nodeipamv1.NodeBlock
		for _, b := range cur.Spec.Blocks {
			if !slices.ContainsFunc(blocks, func(n nodeipamv1.NodeBlock) bool { return sameBlock(n, b) }) {
				dropped = append(dropped, b)
			}
		}
		if len(dropped) > 0 && !d.Memory.retireRecorded(node, dropped) {
			// Not loaded: nothing is dropped before the memory can keep it.
			blocks = append(blocks, dropped...)
			slices.SortFunc(blocks, func(a, b nodeipamv1.NodeBlock) int {
				return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Pool, b.Pool))
			})
		}
	}
	var retired []nodeipamv1.RetiredBlock
	reports, ok := false, false
	if d.Memory != nil {
		retired, reports, ok = d.Memory.retiredOf(d.Namespace, node)
	}
	if ok {
		retired = mergeRetired(retired, had)
	} else {
		retired = slices.Clone(had)
		reports = cur != nil && cur.Spec.DaemonReports
	}
	return nodeipamv1.NodeIPAMSpec{Blocks: blocks, Retired: retired, DaemonReports: reports}
}

// blocksOf returns the blocks node's NodeIPAM should list, given what it lists
// now (nil when there is none).
func (d *Delivery) blocksOf(ctx context.Context, node string, cur *nodeipamv1.NodeIPAM) []nodeipamv1.NodeBlock {
	// A block the object already lists keeps the generation it was cut from;
	// a new one is of the spec its plan was made with (see NodeBlock.PoolGeneration):
	// a spec edit that leaves the block as it is writes no NodeIPAM.
	var had map[poolRef]nodeipamv1.NodeBlock
	if cur != nil {
		had = make(map[poolRef]nodeipamv1.NodeBlock, len(cur.Spec.Blocks))
		for _, b := range cur.Spec.Blocks {
			had[poolRef{b.Kind, b.Pool}] = b
		}
	}
	d.mu.Lock()
	var out []nodeipamv1.NodeBlock
	for _, pb := range d.pools {
		if i, ok := pb.blocks[node]; ok {
			b := pb.val(i)
			nb := nodeipamv1.NodeBlock{Kind: pb.template.Kind, Pool: pb.template.Pool, PoolUID: pb.template.PoolUID,
				StartIP: b.start, EndIP: b.end, Prefix: b.prefix, Gateway: b.gateway, PoolGeneration: pb.template.Generation}
			if o, ok := had[poolRef{nb.Kind, nb.Pool}]; ok && sameBlock(o, nb) && o.Gateway == nb.Gateway &&
				o.PoolGeneration <= nb.PoolGeneration {
				nb.PoolGeneration = o.PoolGeneration
			}
			out = append(out, nb)
		}
	}
	var kept []nodeipamv1.NodeBlock
	if cur != nil {
		for _, b := range cur.Spec.Blocks {
			ref := poolRef{b.Kind, b.Pool}
			if d.pools[ref] == nil && !d.gone[ref] {
				kept = append(kept, b)
			}
		}
	}
	d.mu.Unlock()
	// A pool not yet reconciled keeps its blocks while it exists with that UID.
	for _, b := range kept {
		if d.poolExists(ctx, b.Kind, b.Pool, b.PoolUID) {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b nodeipamv1.NodeBlock) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Pool, b.Pool))
	})
	return out
}

// PoolExists implements Records.
func (d *Delivery) PoolExists(ctx context.Context, kind, name string, uid types.UID) bool {
	return d.poolExists(ctx, kind, name, uid)
}

func (d *Delivery) poolExists(ctx context.Context, kind, name string, uid types.UID) bool {
	var obj client.Object = &v1alpha1.IPPool{}
	if kind == v1alpha1.KindCIDRPool {
		obj = &v1alpha1.CIDRPool{}
	}
	err := d.Client.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: name}, obj)
	return err == nil && obj.GetUID() == uid
}

// sync writes node's NodeIPAM when it differs from what the pools give it.
//
// Every NodeIPAM the controller writes carries nodeipamv1.Finalizer: one deleted
// by anyone else stays, terminating, and is still what the planner and the
// node's daemon read; once every pool it lists a block of has been reconciled in
// this process (so that what the node should hold no longer depends on the
// object), the finalizer is taken off and the object created again at once.
func (d *Delivery) sync(ctx context.Context, node string) error {
	key := client.ObjectKey{Namespace: d.Namespace, Name: node}
	var cur nodeipamv1.NodeIPAM
	exists := true
	if err := d.Client.Get(ctx, key, &cur); err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		exists = false
	}
	var curp *nodeipamv1.NodeIPAM
	if exists {
		curp = &cur
	}
	want := d.want(ctx, node, curp)
	var n metav1.PartialObjectMetadata
	n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	nodeErr := d.Client.Get(ctx, client.ObjectKey{Name: node}, &n)
	if nodeErr != nil && !apierrors.IsNotFound(nodeErr) {
		return nodeErr
	}
	nodeExists := nodeErr == nil
	switch {
	case !exists && empty(want) && !nodeExists:
		return nil
	case !exists:
		if err := d.create(ctx, node, want); err != nil {
			return err
		}
	case cur.DeletionTimestamp != nil:
		return d.writeBack(ctx, &cur, want, nodeExists)
	case empty(want) && !nodeExists:
		// The node is gone and holds no block, current or retired: the
		// record goes.
		if err := d.dropFinalizer(ctx, &cur); err != nil {
			return err
		}
		if err := d.Client.Delete(ctx, &cur, client.Preconditions{ResourceVersion: &cur.ResourceVersion}); err != nil &&
			!apierrors.IsNotFound(err) {
			return err
		}
	case editedByOthers(&cur):
		// Written by someone else: deleted and created again, which leaves the
		// spec's fields the controller's alone (an update that sets what they
		// already hold would not take them back). The finalizer keeps it, as
		// it stands, until it is created again.
		d.Log.Info("a node's NodeIPAM was written by someone other than the controller; writing it again", "node", node)
		if err := d.Client.Delete(ctx, &cur, client.Preconditions{ResourceVersion: &cur.ResourceVersion}); err != nil &&
			!apierrors.IsNotFound(err) {
			return err
		}
		d.retryLater(node, 100*time.Millisecond)
	case specEqual(cur.Spec, want) && slices.Contains(cur.Finalizers, nodeipamv1.Finalizer):
		return nil
	default:
		obj := cur.DeepCopy()
		obj.ManagedFields = nil // as stored
		obj.Spec = want
		if !slices.Contains(obj.Finalizers, nodeipamv1.Finalizer) {
			obj.Finalizers = append(obj.Finalizers, nodeipamv1.Finalizer)
		}
		if err := d.Client.Update(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
			if apierrors.IsNotFound(err) {
				d.retryLater(node, 100*time.Millisecond) // deleted meanwhile: created again
				return nil
			}
			return err
		}
	}
	d.wrote()
	return nil
}

// create writes node's NodeIPAM, with the finalizer.
func (d *Delivery) create(ctx context.Context, node string, want nodeipamv1.NodeIPAMSpec) error {
	obj := &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: node,
		Finalizers: []string{nodeipamv1.Finalizer}}, Spec: want}
	return d.Client.Create(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager))
}

// dropFinalizer takes the controller's finalizer off cur, when it has it.
func (d *Delivery) dropFinalizer(ctx context.Context, cur *nodeipamv1.NodeIPAM) error {
	if !slices.Contains(cur.Finalizers, nodeipamv1.Finalizer) {
		return nil
	}
	obj := cur.DeepCopy()
	obj.ManagedFields = nil
	obj.Finalizers = slices.DeleteFunc(obj.Finalizers, func(f string) bool { return f == nodeipamv1.Finalizer })
	if err := d.Client.Update(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	*cur = *obj
	return nil
}

// writeBack handles a NodeIPAM that is being deleted: deleted by hand, by a
// backup tool, or by the controller itself. While a pool it lists a block of has
// not been reconciled in this process, it stays as it is (the planner reads its
// blocks, and so does the node's daemon). Then the finalizer comes off and, unless
// the node is gone and holds nothing, the object is created again at once with
// what the pools give the node.
func (d *Delivery) writeBack(ctx context.Context, cur *nodeipamv1.NodeIPAM, want nodeipamv1.NodeIPAMSpec, nodeExists bool) error {
	node := cur.Name
	for _, b := range cur.Spec.Blocks {
		ref := poolRef{b.Kind, b.Pool}
		d.mu.Lock()
		known := d.pools[ref] != nil || d.gone[ref]
		d.mu.Unlock()
		if !known && d.poolExists(ctx, b.Kind, b.Pool, b.PoolUID) {
			// Its reconcile will set the pool's blocks; until then this
			// object is all that says this node's.
			d.retryLater(node, time.Second)
			return nil
		}
	}
	if !slices.Contains(cur.Finalizers, nodeipamv1.Finalizer) {
		// Not held by the controller (another finalizer): created again once gone.
		d.retryLater(node, time.Second)
		return nil
	}
	recreate := !empty(want) || nodeExists
	if recreate {
		d.Log.Info("a node's NodeIPAM is being deleted; writing it again with the blocks the node holds", "node", node,
			"blocks", len(want.Blocks), "retired", len(want.Retired))
	}
	if err := d.dropFinalizer(ctx, cur); err != nil {
		return err
	}
	if len(cur.Finalizers) > 0 {
		// Another finalizer holds it: created again once it is gone.
		d.retryLater(node, time.Second)
		return nil
	}
	if !recreate {
		return nil
	}
	if err := d.create(ctx, node, want); err != nil {
		if apierrors.IsAlreadyExists(err) {
			d.retryLater(node, 100*time.Millisecond)
			return nil
		}
		return err
	}
	d.wrote()
	return nil
}

// syncSpecs writes the namespace's PoolSpecs when it differs from the pools'
// specs as their reconciles set them (a pool not yet reconciled since the start
// keeps its entry while it exists with that UID).
func (d *Delivery) syncSpecs(ctx context.Context, _ string) error {
	key := client.ObjectKey{Namespace: d.Namespace, Name: nodeipamv1.PoolSpecsName}
	var cur nodeipamv1.PoolSpecs
	exists := true
	if err := d.Client.Get(ctx, key, &cur); err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		exists = false
	}
	d.mu.Lock()
	var want, kept []nodeipamv1.PoolSpec
	for _, pb := range d.pools {
		want = append(want, pb.template)
	}
	for _, e := range cur.Spec.Pools {
		ref := poolRef{e.Kind, e.Pool}
		if d.pools[ref] == nil && !d.gone[ref] {
			kept = append(kept, e)
		}
	}
	d.mu.Unlock()
	for _, e := range kept {
		if d.poolExists(ctx, e.Kind, e.Pool, e.PoolUID) {
			want = append(want, e)
		}
	}
	slices.SortFunc(want, func(a, b nodeipamv1.PoolSpec) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Pool, b.Pool))
	})
	switch {
	case !exists:
		obj := &nodeipamv1.PoolSpecs{ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: nodeipamv1.PoolSpecsName},
			Spec: nodeipamv1.PoolSpecsSpec{Pools: want}}
		if err := d.Client.Create(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
			return err
		}
	case !nodeipamv1.OwnedByController(&cur):
		d.Log.Info("the PoolSpecs were written by someone other than the controller; writing them again", "poolspecs", key.String())
		if err := d.Client.Delete(ctx, &cur, client.Preconditions{ResourceVersion: &cur.ResourceVersion}); err != nil &&
			!apierrors.IsNotFound(err) {
			return err
		}
		d.retryLater(poolSpecsKey, 100*time.Millisecond)
		return nil
	case len(cur.Spec.Pools) == len(want) && (len(want) == 0 || reflect.DeepEqual(cur.Spec.Pools, want)):
		return nil
	default:
		obj := cur.DeepCopy()
		obj.ManagedFields = nil
		obj.Spec.Pools = want
		if err := d.Client.Update(ctx, obj, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
			if apierrors.IsNotFound(err) {
				d.retryLater(poolSpecsKey, 100*time.Millisecond)
				return nil
			}
			return err
		}
	}
	d.wrote()
	return nil
}

func blocksEqual(a, b []nodeipamv1.NodeBlock) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}

// sameBlock: a and b are the same block of the same pool (gateway and spec
// generation aside).
func sameBlock(a, b nodeipamv1.NodeBlock) bool {
	return a.Kind == b.Kind && a.Pool == b.Pool && a.PoolUID == b.PoolUID && a.StartIP == b.StartIP &&
		a.EndIP == b.EndIP && a.Prefix == b.Prefix
}

func specEqual(a, b nodeipamv1.NodeIPAMSpec) bool {
	return blocksEqual(a.Blocks, b.Blocks) && retiredEqual(a.Retired, b.Retired) && a.DaemonReports == b.DaemonReports
}

// empty: a record that gives its node nothing, and keeps nothing retired.
func empty(s nodeipamv1.NodeIPAMSpec) bool { return len(s.Blocks) == 0 && len(s.Retired) == 0 }

// editedByOthers reports whether a manager other than the controller's owns a
// field of the object's spec (the daemon then ignores the object: see
// nodeipamv1.FieldManager), so that the controller writes it again (which
// takes the fields back).
func editedByOthers(o *nodeipamv1.NodeIPAM) bool {
	return !nodeipamv1.OwnedByController(o)
}

// ownership is the cache transform of NodeIPAMs and PoolSpecs: of their
// managedFields it keeps only what OwnedByController tells, an entry of the
// controller's alone or none; and the strings every NodeIPAM repeats (the
// namespace, the pools' kinds, names and UIDs) are kept once: at 100,000 nodes
// of 8 pools, some 2.4 million strings.
func ownership() toolscache.TransformFunc {
	var mu sync.Mutex
	seen := map[string]string{}
	intern := func(s string) string {
		if v, ok := seen[s]; ok {
			return v
		}
		if len(seen) > 1<<16 { // pools come and go: start over now and then
			clear(seen)
		}
		seen[s] = s
		return s
	}
	return func(o any) (any, error) {
		obj, ok := o.(client.Object)
		if !ok {
			return o, nil
		}
		owned := nodeipamv1.OwnedByController(obj)
		obj.SetManagedFields(nil)
		if owned {
			obj.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: nodeipamv1.FieldManager}})
		}
		if n, ok := obj.(*nodeipamv1.NodeIPAM); ok {
			mu.Lock()
			n.Namespace = intern(n.Namespace)
			for i := range n.Spec.Blocks {
				b := &n.Spec.Blocks[i]
				b.Kind, b.Pool, b.PoolUID = intern(b.Kind), intern(b.Pool), types.UID(intern(string(b.PoolUID)))
			}
			mu.Unlock()
		}
		return obj, nil
	}
}

// NodeIPAMCacheOptions returns the cache options for NodeIPAMs and PoolSpecs of
// namespace: only that namespace, managedFields as OwnedByController tells them.
func NodeIPAMCacheOptions(namespace string) cache.ByObject {
	// The transform is the namespace's: a namespace's own settings are not
	// defaulted from the object's.
	return cache.ByObject{Namespaces: map[string]cache.Config{namespace: {Transform: ownership()}}}
}

// RecordsToRestore implements Records: the NodeIPAMs of the namespace, from the
// cache (the controller's and those being deleted; the memory reads only what
// the controller wrote). ok is false when Delivery is off.
func (d *Delivery) RecordsToRestore(ctx context.Context) ([]nodeipamv1.NodeIPAM, bool, error) {
	if !d.Enabled(ctx) {
		return nil, false, ctx.Err()
	}
	var list nodeipamv1.NodeIPAMList
	if err := d.Client.List(ctx, &list, client.InNamespace(d.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, false, fmt.Errorf("listing NodeIPAMs: %w", err)
	}
	return list.Items, true, nil
}

// RetiredChanged implements Records: node's record is written again.
func (d *Delivery) RetiredChanged(node string) {
	if d.on() {
		d.change(node)
	}
}
