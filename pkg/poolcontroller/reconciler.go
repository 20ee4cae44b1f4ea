// Package poolcontroller is the ipam-controller's reconciler: for every IPPool and
// CIDRPool in the pools namespace it gives each node that matches the pool's
// nodeSelector exactly one block, keeps existing blocks stable, holds the block of a
// departed node through a grace period, and reports the outcome in the pool's status,
// conditions, events and metrics. It is the only writer of pool status.
package poolcontroller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// Reconciler reconciles the pools of one kind.
type Reconciler struct {
	// Client reads pools and nodes (a cached client is expected) and writes status.
	Client client.Client
	// Reader reads pools live, past the cache, when the cache may lag the
	// reconciler's own last status write; nil means Client.
	Reader client.Reader
	// StatusWriter sends status updates; nil means Client.Status().Update, which
	// reads the whole pool back.
	StatusWriter StatusWriter
	// Recorder emits events about pools; nil disables events.
	Recorder events.EventRecorder
	// Kind is v1alpha1.KindIPPool or v1alpha1.KindCIDRPool.
	Kind string
	// ReleaseGracePeriod is how long the block of a node that is gone or no longer
	// selected stays reserved before another node may get it; 0 releases at once.
	ReleaseGracePeriod time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	state map[types.NamespacedName]*poolState
	// Memory keeps the daemons' held reports the Nodes may no longer show; nil: a
	// memory of this reconciler's own, in this process only.
	Memory *Memory
	// Delivery, when set and enabled, gives each node its blocks through its
	// NodeIPAM; nil: the status lists every block, and is the only record.
	Delivery *Delivery
	// MaxListed is how many blocks a pool's status lists at most while Delivery
	// is enabled: above it, status.allocations is empty and the blocks are in the
	// NodeIPAMs only (status.blocksIn says so). 0 lists every block.
	MaxListed int
	writes    atomic.Uint64
	// lastTook is the last plan's duration up to its status write, in
	// nanoseconds, and took each pool's last reconcile's, the write included
	// (see followUp).
	lastTook atomic.Int64
	took     map[types.NamespacedName]time.Duration
}

// reservationKey names a pool's reservations in the memory: its namespace and
// its key in the daemons' stores (an IPPool and a CIDRPool may share a name).
func (r *Reconciler) reservationKey(pool types.NamespacedName) string {
	return pool.Namespace + "/" + v1alpha1.PoolKey(r.Kind, pool.Name)
}

// memory returns r.Memory, made on first use when not set.
func (r *Reconciler) memory() *Memory {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Memory == nil {
		r.Memory = &Memory{}
	}
	return r.Memory
}

// poolState is what the reconciler remembers of one pool between reconciles.
type poolState struct {
	uid types.UID
	// departed: node -> when its block first became releasable.
	departed map[string]time.Time
	// lastSent is the status last written (see sendStatus).
	lastSent pool
	// exhausted is the number of nodes without a block last reported in an event.
	exhausted int
	// reserved are ranges retired from nodes, held back for the grace period.
	reserved []reservation
	// writtenVersion is the resourceVersion of the pool after the last status
	// write; a cached pool of another version may be older than that write.
	writtenVersion string
	// written is the pool as the last status write stored it, and writtenFrom the
	// resourceVersion that write replaced: while the cache still holds that
	// version, it has not yet seen the write, and written is the pool as stored.
	// Kept only until the cache catches up.
	written     pool
	writtenFrom string
	// tooLarge is set while the API server refuses the pool's status as too large,
	// tooLargeEvent is when the last StatusTooLarge event was emitted.
	tooLarge      bool
	tooLargeEvent time.Time
	// refused is the last status write refused as too large, nil once a status is
	// stored (see holdTooLarge).
	refused *refusal
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) newPool() pool {
	if r.Kind == v1alpha1.KindCIDRPool {
		return cidrPool{&v1alpha1.CIDRPool{}}
	}
	return ipPool{&v1alpha1.IPPool{}}
}

// poolState returns the remembered state of a pool, fresh when the pool is new or
// was re-created under the same name.
func (r *Reconciler) poolState(obj client.Object, mem *Memory) *poolState {
	key := client.ObjectKeyFromObject(obj)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == nil {
		r.state = map[types.NamespacedName]*poolState{}
	}
	st, ok := r.state[key]
	if !ok || st.uid != obj.GetUID() {
		st = &poolState{uid: obj.GetUID(), departed: map[string]time.Time{},
			reserved: mem.reservationsOf(r.reservationKey(key), obj.GetUID(), r.now(), r.ReleaseGracePeriod)}
		r.state[key] = st
	}
	return st
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.state, key)
	delete(r.took, key)
}

// Reconcile brings one pool's status in line with its spec and the nodes.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	start, gone := time.Now(), false
	defer func() {
		took := time.Since(start)
		if !gone {
			r.tookInAll(req.NamespacedName, took)
		}
		reconcileDuration.WithLabelValues(r.Kind).Observe(took.Seconds())
		if err != nil {
			reconcileErrors.WithLabelValues(r.Kind).Inc()
		}
	}()
	logger := log.FromContext(ctx).WithValues("pool", req.Name, "kind", r.Kind)

	p := r.newPool()
	if err := r.Client.Get(ctx, req.NamespacedName, p.object()); err != nil {
		if apierrors.IsNotFound(err) {
			gone = true
			forgetMetrics(r.Kind, req.Namespace, req.Name)
			r.forget(req.NamespacedName)
			// The pool's blocks are its nodes' grants now, retired in their
			// records by the same writes that drop them as blocks: recorded
			// before the blocks are removed.
			mem := r.memory()
			if err := mem.load(ctx, r.now()); err != nil {
				return ctrl.Result{}, err
			}
			key := v1alpha1.PoolKey(r.Kind, req.Name)
			if given := r.Delivery.Frozen(r.Kind, req.Name); given != nil {
				// Blocks placed for joining nodes since the pool's last
				// plan, which the memory does not know of yet.
				mem.blocksOf(key, *given, r.now())
			}
			mem.forgetPool(key, r.now())
			mem.keepReservations(r.reservationKey(req.NamespacedName), "", nil)
			r.Delivery.Remove(r.Kind, req.Name)
			if r.Delivery.on() {
				return ctrl.Result{}, nil
			}
			// Without records, kept in the Lease at once, before a restart
			// could forget them.
			if err := mem.Save(ctx); err != nil && !apierrors.IsForbidden(err) && !errors.Is(err, errTooLarge) {
				return ctrl.Result{}, err
			}
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading %s %s: %w", r.Kind, req, err)
	}
	if !p.object().GetDeletionTimestamp().IsZero() {
		r.Delivery.Freeze(r.Kind, req.Name)
		return ctrl.Result{}, nil
	}
	// What a controller before this one kept (reservations, reports) is read
	// before this pool's state is made.
	mem := r.memory()
	if err := mem.load(ctx, r.now()); err != nil {
		return ctrl.Result{}, err
	}
	st := r.poolState(p.object(), mem)
	p = st.caughtUp(p)
	delivering := r.Delivery.Enabled(ctx)
	if ctx.Err() != nil {
		return ctrl.Result{}, ctx.Err()
	}
	// The pool whose status lists the blocks the plan starts from: above the
	// threshold the status lists none, and the NodeIPAMs hold them.
	planned, assigned, err := r.plannedFrom(ctx, p, delivering)
	if err != nil {
		return ctrl.Result{}, err
	}
	c := p.common()
	c.ObservedGeneration = p.object().GetGeneration()
	c.Conditions = slices.Clone(c.Conditions)

	// An invalid spec: report it, keep whatever blocks status lists, assign nothing.
	if errs := p.validate(); len(errs) > 0 {
		setCondition(&c, v1alpha1.ConditionInvalidSpec, true, "InvalidSpec", errs.ToAggregate().Error())
		setCondition(&c, v1alpha1.ConditionReady, false, "InvalidSpec", "the spec is invalid; see the InvalidSpec condition")
		meta.RemoveStatusCondition(&c.Conditions, v1alpha1.ConditionConflict)
		meta.RemoveStatusCondition(&c.Conditions, v1alpha1.ConditionExhausted)
		c.AllocatedNodes = int32(p.allocationCount())
		r.Delivery.Freeze(r.Kind, req.Name)
		return ctrl.Result{}, r.writeStatus(ctx, st, p, p.withStatus(nil, nil, true, c))
	}
	setCondition(&c, v1alpha1.ConditionInvalidSpec, false, "Valid", "the spec is valid")
	layout, err := p.layout()
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("layout of valid %s %s: %w", r.Kind, req, err)
	}

	// Overlap with an older pool of the namespace: no new blocks until it is
	// resolved. Blocks already held stay, so that no address in use is handed out
	// twice; for the same reason no pool hands out a block overlapping the blocks
	// another pool holds.
	older, foreign, err := r.overlaps(ctx, p, layout.Range())
	if err != nil {
		return ctrl.Result{}, err
	}
	if older != "" {
		msg := fmt.Sprintf("the pool's range %s overlaps %s, which is older; no new blocks are assigned until one of "+
			"the two is changed (blocks already held are kept)", layout.Range(), older)
		setCondition(&c, v1alpha1.ConditionConflict, true, "Overlap", msg)
		setCondition(&c, v1alpha1.ConditionReady, false, "Conflict", msg)
		meta.RemoveStatusCondition(&c.Conditions, v1alpha1.ConditionExhausted)
		c.AllocatedNodes, c.SelectedNodes = int32(p.allocationCount()), 0
		updateMetrics(r.Kind, p.object(), layout, p.allocationCount(), 0)
		r.Delivery.Freeze(r.Kind, req.Name)
		return ctrl.Result{}, r.writeStatus(ctx, st, p, p.withStatus(nil, nil, true, c))
	}
	setCondition(&c, v1alpha1.ConditionConflict, false, "NoOverlap", "the pool overlaps no other pool")

	in, notes, err := r.planInput(ctx, planned, layout, st, assigned)
	orphans, reservedUntil := notes.orphans, notes.reservedUntil
	if err != nil {
		return ctrl.Result{}, err
	}
	in.Foreign = append(in.Foreign, foreign...)
	// Joining nodes get blocks from this plan's spare ones until the next
	// plan (see joins.go) where nothing but this controller can change what
	// is free: records as the memory, no other pool over this one's network,
	// no record written by someone else.
	joins := delivering && mem.trustsOnlyGrants() && len(in.Foreign) == 0 && len(notes.untrusted) == 0 &&
		len(r.Delivery.UntrustedNodes()) == 0
	if joins {
		in.SpareLimit, in.SpareExcluded = spareLimit, mem.grantRanges(layout.Range())
	}
	out := planner.Make(in)
	granted := mem.retire(p.storeKey(), out.Taken, in.Now)
	if st.addReservations(out.Retired, in.Now, r.ReleaseGracePeriod) {
		mem.keepReservations(r.reservationKey(req.NamespacedName), p.object().GetUID(), st.reserved)
		granted = true
	}
	if granted && !delivering {
		// Without records: kept in the Lease before the status no longer
		// lists the retired blocks, as a restart in between would forget
		// them. Also when a reconcile that failed to save retires them again.
		// Without the Lease's RBAC, or over its size, they are kept in memory
		// only (logged by Start). With records, each node's record lists them
		// as retired in the very write that takes them from its blocks (see
		// retired.go), and the Lease is only a copy for a controller before
		// that (a downgrade), saved by Start.
		if err := mem.Save(ctx); err != nil && !apierrors.IsForbidden(err) && !errors.Is(err, errTooLarge) {
			return ctrl.Result{}, err
		}
	}
	if len(out.Unassigned) > 0 && !reservedUntil.IsZero() {
		// Nodes wait for ranges held back only by time: look again when that ends.
		if left := reservedUntil.Sub(in.Now); out.RequeueAfter == 0 || left < out.RequeueAfter {
			out.RequeueAfter = max(left, planner.RetiredRequeue)
		}
	}
	if at := mem.nextPrune(p.storeKey(), r.ReleaseGracePeriod); delivering && !at.IsZero() {
		// A block taken from a node goes from its record once that is due.
		if left := max(at.Sub(in.Now), planner.RetiredRequeue); out.RequeueAfter == 0 || left < out.RequeueAfter {
			out.RequeueAfter = left
		}
	}
	if delivering {
		// The NodeIPAM writes are queued before the status is written; the
		// blocks placed for joining nodes while this plan ran are merged in.
		var spare []uint64
		var skip map[string]bool
		if joins {
			spare, skip = out.Spare, joinSkips(in, out)
			if spare == nil {
				spare = []uint64{}
			}
		}
		var unplaced []string
		out.Assignments, unplaced = r.Delivery.Set(p, layout, out.Assignments, spare, skip)
		afterMerge(&out, unplaced)
		if len(unplaced) > 0 && (out.RequeueAfter == 0 || out.RequeueAfter > planner.RetiredRequeue) {
			out.RequeueAfter = planner.RetiredRequeue
		}
	}
	for _, n := range out.Replaced {
		logger.Info("replacing a block that no longer fits the spec", "node", n)
		r.event(p, corev1.EventTypeWarning, "BlockReplaced", "Replace",
			"the block of node %s no longer fits the pool's spec and was replaced", n)
	}
	for _, n := range out.Released {
		logger.Info("released the block of a node that is gone, no longer selected, or whose block no longer fits the spec", "node", n)
	}

	if len(orphans) > 0 {
		const maxListed = 5
		listed := orphans[:min(len(orphans), maxListed)]
		msg := fmt.Sprintf("%d node(s) still hold addresses outside their current block (%s); these ranges go to no "+
			"other node until their pods release them", len(orphans), strings.Join(listed, "; "))
		setCondition(&c, v1alpha1.ConditionOrphans, true, "AddressesHeld", msg)
	} else {
		setCondition(&c, v1alpha1.ConditionOrphans, false, "NoneHeld", "no node holds addresses outside its block")
	}
	if len(notes.untrusted) > 0 {
		const maxListed = 5
		listed := notes.untrusted[:min(len(notes.untrusted), maxListed)]
		setCondition(&c, v1alpha1.ConditionRecordsUntrusted, true, "WrittenByOthers", fmt.Sprintf("the NodeIPAM of %d node(s) "+
			"(%s) was written by someone other than ipam-controller: their daemons keep the blocks they had, and what they "+
			"report holding in this pool goes to no other node until the controller has written their records again "+
			"(ipamctl check --cluster)", len(notes.untrusted), strings.Join(listed, ", ")))
	} else {
		meta.RemoveStatusCondition(&c.Conditions, v1alpha1.ConditionRecordsUntrusted)
	}
	c.SelectedNodes = int32(len(in.Selected))
	if msg := setAssignedConditions(&c, layout, out); msg != "" && st.exhausted != len(out.Unassigned) {
		r.event(p, corev1.EventTypeWarning, "PoolExhausted", "Assign", "%s", msg)
	}
	st.exhausted = len(out.Unassigned)
	updateMetrics(r.Kind, p.object(), layout, len(out.Assignments), len(out.Unassigned))

	// A status that lists blocks a daemon may have read (an nv-ipam or earlier
	// hwipam daemon reads nothing else) stops listing them only once every
	// NodeIPAM write queued so far is done: a controller that restarts then
	// plans from the NodeIPAMs, which must hold every block the status gave.
	flushed := func() bool { return p.allocationCount() == 0 || r.Delivery.Idle() }
	omit := delivering && r.MaxListed > 0 && len(out.Assignments) > r.listedBelow(c.BlocksIn == v1alpha1.BlocksInNodeIPAM)
	if omit && !flushed() {
		omit = false
		if out.RequeueAfter == 0 || out.RequeueAfter > time.Second {
			out.RequeueAfter = time.Second
		}
	}
	r.setListed(p, &c, omit, len(out.Assignments), "")
	listed := out.Assignments
	if omit {
		listed = []planner.Assignment{}
	}
	desired := p.withStatus(layout, listed, false, c)
	// How long the plan took, without the status write, which a slow API
	// server can stretch to seconds (see followUp).
	r.lastTook.Store(int64(time.Since(start)))
	err = r.writeStatus(ctx, st, p, desired)
	if err != nil && isTooLarge(err) && delivering && !omit && flushed() {
		// Under the threshold but too large to store (long node names, IPv6):
		// the NodeIPAMs hold the blocks.
		r.setListed(p, &c, true, len(out.Assignments), "the list is too large to store")
		err = r.writeStatus(ctx, st, p, p.withStatus(layout, []planner.Assignment{}, false, c))
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	// The blocks now given are the nodes' grants (see trust.go), whatever
	// happens before the next reconcile reads them back.
	mem.blocksOfPlan(p.storeKey(), layout, out.Assignments, in.Now)
	return ctrl.Result{RequeueAfter: out.RequeueAfter}, nil
}

// plannedFrom returns the pool whose status lists the blocks the plan starts
// from. With delivery on, those are the records': each node's NodeIPAM is the
// record of which block it may allocate from, written before its daemon can use
// the block, so the plan never starts from the pool's status alone, which a
// failed, slow or refused write may have left without a block a node's record
// gives it. The status's own entries count too where no record says otherwise
// (a takeover from nv-ipam, from hwipam before NodeIPAM, or a block whose record
// write never went through): a block is kept from other nodes as long as either
// says a node has it.
//
// When this process's last reconcile of the pool (same UID and generation) is
// the record, it also returns that reconcile's assignments, which the plan then
// starts from as they are: they are what the records are being written from,
// whether or not the status write that followed went through.
//
// With delivery off, a status that says its blocks are in NodeIPAMs cannot be
// planned from: an error says so, and nothing is written.
func (r *Reconciler) plannedFrom(ctx context.Context, p pool, delivering bool) (pool, []planner.Assignment, error) {
	c := p.common()
	if !delivering {
		if c.BlocksIn == v1alpha1.BlocksInNodeIPAM && p.allocationCount() == 0 {
			return nil, nil, fmt.Errorf("%s %s: its status says its blocks are in NodeIPAM objects, which this controller cannot read "+
				"(the NodeIPAM CRD or the controller's RBAC on nodeipams is missing); nothing is assigned until it can: "+
				"install deploy/crds and deploy/rbac/controller", r.Kind, p.object().GetName())
		}
		return p, nil, nil
	}
	obj := p.object()
	if old := r.Delivery.Replaced(r.Kind, obj.GetName(), obj.GetUID()); old != nil {
		// The blocks of a pool of this name deleted and created again, as
		// this process gave them, joins placed since its last plan included:
		// its nodes' grants from this plan on (see planInput).
		r.memory().blocksOf(p.storeKey(), *old, r.now())
	}
	if as, ok := r.Delivery.Assigned(r.Kind, obj.GetName(), obj.GetUID(), obj.GetGeneration()); ok {
		return p, as, nil
	}
	bs, err := r.Delivery.ExistingToPlan(ctx, r.Kind, obj.GetName(), obj.GetUID())
	if err != nil {
		return nil, nil, err
	}
	if len(bs) == 0 {
		return p, nil, nil
	}
	return p.withRecords(bs), nil, nil
}

// listedBelow returns how many blocks a pool's status lists at most: MaxListed,
// and, once it lists none, some 5% fewer (at least one), so that a pool that
// hovers at the threshold (a node joins, one leaves) does not switch at every
// join between a list of 10,000 blocks and none, a 760 kB write and an event
// each time.
func (r *Reconciler) listedBelow(omitted bool) int {
	if !omitted {
		return r.MaxListed
	}
	return r.MaxListed - max(1, r.MaxListed/20)
}

// setListed sets status.blocksIn and the AllocationsListed condition, and tells
// the operator when the status stops or starts listing the blocks.
func (r *Reconciler) setListed(p pool, c *v1alpha1.PoolStatusCommon, omit bool, n int, why string) {
	was := c.BlocksIn
	if omit {
		c.BlocksIn = v1alpha1.BlocksInNodeIPAM
		if why == "" {
			why = fmt.Sprintf("more than the %d status.allocations lists at most (ipam-controller --status-allocations-max-nodes)",
				r.MaxListed)
		}
		msg := fmt.Sprintf("%d nodes have a block, %s: each node's block is in the NodeIPAM object named after it "+
			"in namespace %s (kubectl get nodeipams -n %s); nv-ipam daemons and hwipam daemons before NodeIPAMs cannot read them",
			n, why, p.object().GetNamespace(), p.object().GetNamespace())
		setCondition(c, v1alpha1.ConditionListed, false, "AboveThreshold", msg)
		if was != v1alpha1.BlocksInNodeIPAM {
			r.event(p, corev1.EventTypeNormal, "AllocationsOmitted", "Assign", "%s", msg)
		}
		return
	}
	setListedTrue(c)
	if was == v1alpha1.BlocksInNodeIPAM {
		r.event(p, corev1.EventTypeNormal, "AllocationsListed", "Assign",
			"%d nodes have a block, at most the %d status.allocations lists: it lists them again", n, r.MaxListed)
	}
}

// setListedTrue says that status.allocations lists every block.
func setListedTrue(c *v1alpha1.PoolStatusCommon) {
	c.BlocksIn = v1alpha1.BlocksInStatus
	setCondition(c, v1alpha1.ConditionListed, true, "Listed", "status.allocations lists every node's block")
}

// setAssignedConditions sets the allocated-node count and the Exhausted and Ready
// conditions after a plan; it returns the exhaustion message, "" when every
// selected node has a block.
func setAssignedConditions(c *v1alpha1.PoolStatusCommon, layout blocks.Layout, out planner.Plan) string {
	c.AllocatedNodes = int32(len(out.Assignments))
	if n := len(out.Unassigned); n > 0 {
		msg := fmt.Sprintf("%d selected node(s) have no block (first: %s): no free block is left (%d usable blocks, %d assigned); "+
			"widen the pool's range, make per-node blocks smaller, or narrow the nodeSelector",
			n, out.Unassigned[0], countUsable(layout, len(out.Assignments)), len(out.Assignments))
		setCondition(c, v1alpha1.ConditionExhausted, true, "NoFreeBlock", msg)
		setCondition(c, v1alpha1.ConditionReady, false, "Exhausted", msg)
		return msg
	}
	if c.SelectedNodes == 0 {
		const msg = "the pool's nodeSelector selects no node, so no node has a block; check the selector against the nodes' labels"
		setCondition(c, v1alpha1.ConditionExhausted, false, "NoNodeSelected", msg)
		setCondition(c, v1alpha1.ConditionReady, true, "NoNodeSelected", msg)
		return ""
	}
	setCondition(c, v1alpha1.ConditionExhausted, false, "FreeBlocks", "every selected node has a block")
	setCondition(c, v1alpha1.ConditionReady, true, "AllNodesAssigned", "every selected node has a block")
	return ""
}

// inputNotes is what planInput found beside the plan's input, for the pool's
// conditions: the nodes holding addresses outside their block (orphans), when
// the first time-bound reservation ends, and the nodes whose record someone else
// wrote that report holding something in the pool.
type inputNotes struct {
	orphans       []string
	reservedUntil time.Time
	untrusted     []string
}

// planInput gathers the nodes, the daemons' reports and the status of the pool for
// planner.Make. It also returns the nodes' orphans (for the condition) and when the
// first of the pool's time-bound reservations ends.
func (r *Reconciler) planInput(ctx context.Context, p pool, layout blocks.Layout, st *poolState, assigned []planner.Assignment) (planner.Input, inputNotes, error) {
	selector, err := compileSelector(p.nodeSelector())
	if err != nil {
		return planner.Input{}, inputNotes{}, fmt.Errorf("node selector of %s %s: %w", r.Kind, p.object().GetName(), err)
	}
	var nodes metav1.PartialObjectMetadataList
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	// Read only: the cache's own objects, not copies of 5,000 nodes per reconcile.
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return planner.Input{}, inputNotes{}, fmt.Errorf("listing nodes: %w", err)
	}
	existing, invalid := assigned, []planner.Misfit(nil)
	if assigned == nil {
		existing, invalid = p.existing(layout)
	}
	now := r.now()
	objs := make([]client.Object, len(nodes.Items))
	for i := range nodes.Items {
		objs[i] = &nodes.Items[i]
	}
	mem := r.memory() // loaded by Reconcile
	key := p.storeKey()
	mem.blocksOfPlan(key, layout, existing, now)
	mem.retire(key, invalid, now)
	mem.know(key, p.object().GetUID(), layout.Range())
	rep, ignored := mem.reportsFor(objs, now, r.ReleaseGracePeriod, key, layout.Range())
	r.reportIgnored(ctx, p, ignored, nodes.Items)
	var untrustedHere []string
	if untrusted := r.Delivery.UntrustedNodes(); len(untrusted) > 0 {
		// A node whose record someone else wrote: its daemon ignores that
		// record and keeps the blocks it had, which now only its report says
		// (a controller restarted meanwhile has no record of them). What it
		// reports in this pool, within the pool's range, goes to no other node
		// until the controller has written the record again.
		byName := make(map[string]*metav1.PartialObjectMetadata, len(untrusted))
		for i := range nodes.Items {
			if slices.Contains(untrusted, nodes.Items[i].Name) {
				byName[nodes.Items[i].Name] = &nodes.Items[i]
			}
		}
		for _, name := range untrusted {
			n, ok := byName[name]
			if !ok {
				continue
			}
			parsed, opaque, _ := parseReport(n.GetAnnotations()[v1alpha1.HeldAnnotation])
			if opaque != "" {
				continue
			}
			h := parsed[key]
			rs := slices.Clone(h.held)
			if h.block.Start.IsValid() {
				rs = append(rs, h.block)
			}
			if len(rs) > 0 {
				untrustedHere = append(untrustedHere, name)
			}
			for _, x := range rs {
				rep.held[name] = append(rep.held[name], clip(x, []iprange.Range{layout.Range()})...)
			}
		}
	}
	live, until := st.liveReservations(now)
	mem.keepReservations(r.reservationKey(client.ObjectKeyFromObject(p.object())), p.object().GetUID(), live)
	for _, res := range live {
		rep.held[res.Node] = append(rep.held[res.Node], res.Range)
	}
	in := planner.Input{
		Layout:   layout,
		Existing: existing,
		Invalid:  invalid,
		Foreign:  rep.foreign,
		Held:     rep.held,
		Nodes:    make(map[string]planner.NodeState, len(nodes.Items)),
		Pinned:   p.pinned(layout),
		Departed: st.departed,
		Now:      now,
		Grace:    r.ReleaseGracePeriod,
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		s := planner.NodeState{Exists: true, Selected: selector.match(n), InUse: poolsInUse(n, key)}
		in.Nodes[n.Name] = s
		if s.Selected {
			in.Selected = append(in.Selected, n.Name)
		}
	}
	slices.Sort(in.Selected)
	return in, inputNotes{orphans: rep.orphans, reservedUntil: until, untrusted: untrustedHere}, nil
}

// writeStatus writes the desired status unless it is already stored (see
// sendStatus) and tells the operator when the pool has grown too large to store.
func (r *Reconciler) writeStatus(ctx context.Context, st *poolState, current, desired pool) error {
	err := r.sendStatus(ctx, st, current, desired)
	switch {
	case err == nil:
		r.statusFits(st, desired)
	case isTooLarge(err):
		r.statusTooLarge(st, desired, err)
	}
	return err
}

// sendStatus writes the desired status unless it is already stored. When the
// CRD in the cluster lacks hwipam's status fields (nv-ipam's own CRD), the API
// server prunes them: then the stored status has allocations only, and the pool is
// not rewritten as long as those are right and what would be sent is what was
// last sent.
func (r *Reconciler) sendStatus(ctx context.Context, st *poolState, current, desired pool) error {
	if current.statusEqual(desired) {
		if st.writtenVersion == "" || current.object().GetResourceVersion() == st.writtenVersion {
			return nil
		}
		// The cached pool may be older than the last status this reconciler wrote
		// (which it then looks like the desired one only by chance): compare with
		// the stored pool, so that a block taken away is not left in status.
		live := r.newPool()
		reader := r.Reader
		if reader == nil {
			reader = r.Client
		}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(current.object()), live.object()); err != nil {
			return fmt.Errorf("reading %s %s: %w", r.Kind, current.object().GetName(), err)
		}
		if live.statusEqual(desired) {
			st.writtenVersion = live.object().GetResourceVersion()
			return nil
		}
		// desired is the reconciler's own copy: write it over the stored version.
		desired.object().SetResourceVersion(live.object().GetResourceVersion())
	}
	if st.lastSent != nil && st.lastSent.statusEqual(desired) && current.allocationsEqual(desired) &&
		extensionsPruned(current.common()) {
		return nil
	}
	obj := desired.object()
	if err := r.holdTooLarge(st, obj); err != nil {
		return err
	}
	sent := desired.withStatus(nil, nil, true, cloneCommon(desired.common()))
	from := obj.GetResourceVersion()
	start := time.Now()
	if err := r.updateStatus(ctx, obj); err != nil {
		writeFailures.WithLabelValues(failedPoolStatus).Inc()
		err = fmt.Errorf("writing status of %s %s: %w", r.Kind, obj.GetName(), err)
		if isTooLarge(err) {
			r.refusedTooLarge(st, obj, err)
		}
		return err
	}
	log.FromContext(ctx).V(1).Info("wrote status", "pool", obj.GetName(), "kind", r.Kind,
		"allocations", desired.allocationCount(), "took", time.Since(start))
	statusWrites.WithLabelValues(r.Kind).Inc()
	r.writes.Add(1)
	st.lastSent = sent
	st.writtenFrom = from
	st.writtenVersion = obj.GetResourceVersion()
	st.written = desired
	return nil
}

// updateStatus sends obj's status and leaves in obj its new resourceVersion. With
// a StatusWriter, obj is otherwise what was sent (the server may have pruned fields
// its CRD lacks, which sendStatus allows for).
func (r *Reconciler) updateStatus(ctx context.Context, obj client.Object) error {
	if r.StatusWriter == nil {
		return r.Client.Status().Update(ctx, obj)
	}
	rv, err := r.StatusWriter.UpdateStatus(ctx, obj)
	if err != nil {
		return err
	}
	obj.SetResourceVersion(rv)
	return nil
}

// caughtUp returns the pool as stored: the cached one, or, while the cache has
// not yet seen this reconciler's last status write, what that write stored. A
// pool reconciled again right after its write (another pool's event, a node's)
// then plans from its own blocks and sends nothing, instead of re-sending the
// whole status over a stale resourceVersion only to be refused with a conflict.
func (st *poolState) caughtUp(cached pool) pool {
	if st.written == nil {
		return cached
	}
	switch cached.object().GetResourceVersion() {
	case st.writtenFrom:
		return st.written.withStatus(nil, nil, true, cloneCommon(st.written.common()))
	default:
		// The cache holds the write or something newer: it has caught up.
		st.written = nil
		return cached
	}
}

// StatusWrites is how many status updates this reconciler sent.
func (r *Reconciler) StatusWrites() uint64 { return r.writes.Load() }

func extensionsPruned(c v1alpha1.PoolStatusCommon) bool {
	return len(c.Conditions) == 0 && c.ObservedGeneration == 0 && c.SelectedNodes == 0 && c.AllocatedNodes == 0
}

func cloneCommon(c v1alpha1.PoolStatusCommon) v1alpha1.PoolStatusCommon {
	c.Conditions = slices.Clone(c.Conditions)
	return c
}

// commonEqual compares hwipam's status fields, conditions without their
// transition times (those are set anew when a pruned list is rebuilt).
func commonEqual(a, b v1alpha1.PoolStatusCommon) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.SelectedNodes != b.SelectedNodes ||
		a.AllocatedNodes != b.AllocatedNodes || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, ca := range a.Conditions {
		cb := meta.FindStatusCondition(b.Conditions, ca.Type)
		if cb == nil || cb.Status != ca.Status || cb.Reason != ca.Reason || cb.Message != ca.Message ||
			cb.ObservedGeneration != ca.ObservedGeneration {
			return false
		}
	}
	return true
}

// overlaps looks at the other pools of the namespace whose network overlaps
// mine (valid or not, as long as the network parses). It returns "Kind name
// (range)" of the oldest such pool that is older than this one, or "", and the
// address ranges the overlapping pools hold blocks in.
func (r *Reconciler) overlaps(ctx context.Context, p pool, mine iprange.Range) (string, []iprange.Range, error) {
	me := p.object()
	others, err := listPools(ctx, r.Client, me.GetNamespace(), client.UnsafeDisableDeepCopy)
	if err != nil {
		return "", nil, err
	}
	r.memory().checkGone(others)
	var older []string
	var foreign []iprange.Range
	for _, o := range others {
		obj := o.object()
		if obj.GetUID() == me.GetUID() {
			continue
		}
		theirs, ok := o.network()
		if !ok || !theirs.Overlaps(mine) {
			continue
		}
		if r.Delivery.on() {
			// Its blocks are its records', and its status's where no record
			// says otherwise (see plannedFrom).
			bs, err := r.Delivery.Existing(ctx, o.kind(), obj.GetName(), obj.GetUID())
			if err != nil {
				return "", nil, err
			}
			if len(bs) > 0 {
				o = o.withRecords(bs)
			}
		}
		foreign = append(foreign, o.allocatedRanges()...)
		if olderThan(obj, o.kind(), me, p.kind()) {
			older = append(older, fmt.Sprintf("%s %s (%s)", o.kind(), obj.GetName(), theirs))
		}
	}
	slices.Sort(older)
	if len(older) == 0 {
		return "", foreign, nil
	}
	return older[0], foreign, nil
}

// olderThan orders pools by creation time, then kind and name, so that of two
// overlapping pools exactly one is "older".
func olderThan(a client.Object, aKind string, b client.Object, bKind string) bool {
	ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
	if !ta.Equal(&tb) {
		return ta.Before(&tb)
	}
	if aKind != bKind {
		return aKind < bKind
	}
	return a.GetName() < b.GetName()
}

// listPools lists the IPPools and CIDRPools of a namespace. With
// client.UnsafeDisableDeepCopy, the caller must not modify what it gets.
func listPools(ctx context.Context, c client.Reader, namespace string, opts ...client.ListOption) ([]pool, error) {
	opts = append(opts, client.InNamespace(namespace))
	var ips v1alpha1.IPPoolList
	if err := c.List(ctx, &ips, opts...); err != nil {
		return nil, fmt.Errorf("listing IPPools in %s: %w", namespace, err)
	}
	var cidrs v1alpha1.CIDRPoolList
	if err := c.List(ctx, &cidrs, opts...); err != nil {
		return nil, fmt.Errorf("listing CIDRPools in %s: %w", namespace, err)
	}
	out := make([]pool, 0, len(ips.Items)+len(cidrs.Items))
	for i := range ips.Items {
		out = append(out, ipPool{&ips.Items[i]})
	}
	for i := range cidrs.Items {
		out = append(out, cidrPool{&cidrs.Items[i]})
	}
	return out, nil
}

func (r *Reconciler) event(p pool, eventType, reason, action, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(p.object(), nil, eventType, reason, action, note, args...)
	}
}

func setCondition(c *v1alpha1.PoolStatusCommon, typ string, status bool, reason, msg string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&c.Conditions, metav1.Condition{
		Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: c.ObservedGeneration,
	})
}

// countUsable counts usable blocks, stopping once past assigned+1: the exhaustion
// message only needs the count for pools that are nearly full.
func countUsable(l blocks.Layout, assigned int) uint64 {
	var n uint64
	for i, ok := l.NextUsable(0); ok && n <= uint64(assigned); i, ok = l.NextUsable(i + 1) {
		n++
	}
	return n
}

// selector matches nodes against a pool's nodeSelector; nil matches every node.
type selector struct{ ns *nodeaffinity.NodeSelector }

func compileSelector(ns *corev1.NodeSelector) (selector, error) {
	if ns == nil {
		return selector{}, nil
	}
	s, err := nodeaffinity.NewNodeSelector(ns)
	if err != nil {
		return selector{}, fmt.Errorf("compiling nodeSelector: %w", err)
	}
	return selector{s}, nil
}

func (s selector) match(n client.Object) bool {
	if s.ns == nil {
		return true
	}
	return s.ns.Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.GetName(), Labels: n.GetLabels()}})
}

func poolsInUse(n client.Object, key string) bool {
	v, ok := n.GetAnnotations()[v1alpha1.PoolsInUseAnnotation]
	if !ok {
		return false
	}
	for k := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(k) == key {
			return true
		}
	}
	return false
}
