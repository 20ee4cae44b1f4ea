// Package poolcontroller is the ipam-controller's reconciler: for every IPPool and
// CIDRPool in the pools namespace it gives each node that matches the pool's
// nodeSelector exactly one block, keeps existing blocks stable, holds the block of a
// departed node through a grace period, and reports the outcome in the pool's status,
// conditions, events and metrics. It is the only writer of pool status.
package poolcontroller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
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
)

// PoolsInUseAnnotation is the Node annotation in which the node daemon lists, comma
// separated, the pools it holds live allocations in. A node that lists a pool keeps
// its block in that pool even after it stops matching the pool's nodeSelector.
const PoolsInUseAnnotation = "ipam.hwipam.io/pools-in-use"

// Kinds of pools, as reconcile requests and metrics name them.
const (
	KindIPPool   = "IPPool"
	KindCIDRPool = "CIDRPool"
)

// +kubebuilder:rbac:groups=nv-ipam.nvidia.com,resources=ippools;cidrpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=nv-ipam.nvidia.com,resources=ippools/status;cidrpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Reconciler reconciles the pools of one kind.
type Reconciler struct {
	// Client reads pools and nodes (a cached client is expected) and writes status.
	Client client.Client
	// Recorder emits events about pools; nil disables events.
	Recorder events.EventRecorder
	// Kind is KindIPPool or KindCIDRPool.
	Kind string
	// ReleaseGracePeriod is how long the block of a node that is gone or no longer
	// selected stays reserved before another node may get it; 0 releases at once.
	ReleaseGracePeriod time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	state map[types.NamespacedName]*poolState
}

// poolState is what the reconciler remembers of one pool between reconciles.
type poolState struct {
	uid types.UID
	// departed: node -> when its block first became releasable.
	departed map[string]time.Time
	// lastSent and lastStored are the status last written and what the API server
	// stored of it; when a CRD without hwipam's status fields prunes them, the two
	// differ and the pool is not rewritten for that reason alone.
	lastSent, lastStored pool
	// exhausted is the number of nodes without a block last reported in an event.
	exhausted int
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) newPool() pool {
	if r.Kind == KindCIDRPool {
		return cidrPool{&v1alpha1.CIDRPool{}}
	}
	return ipPool{&v1alpha1.IPPool{}}
}

// poolState returns the remembered state of a pool, fresh when the pool is new or
// was re-created under the same name.
func (r *Reconciler) poolState(obj client.Object) *poolState {
	key := client.ObjectKeyFromObject(obj)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == nil {
		r.state = map[types.NamespacedName]*poolState{}
	}
	st, ok := r.state[key]
	if !ok || st.uid != obj.GetUID() {
		st = &poolState{uid: obj.GetUID(), departed: map[string]time.Time{}}
		r.state[key] = st
	}
	return st
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.state, key)
}

// Reconcile brings one pool's status in line with its spec and the nodes.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	start := time.Now()
	defer func() {
		reconcileDuration.WithLabelValues(r.Kind).Observe(time.Since(start).Seconds())
		if err != nil {
			reconcileErrors.WithLabelValues(r.Kind).Inc()
		}
	}()
	logger := log.FromContext(ctx).WithValues("pool", req.Name, "kind", r.Kind)

	p := r.newPool()
	if err := r.Client.Get(ctx, req.NamespacedName, p.object()); err != nil {
		if apierrors.IsNotFound(err) {
			forgetMetrics(r.Kind, req.Namespace, req.Name)
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading %s %s: %w", r.Kind, req, err)
	}
	if !p.object().GetDeletionTimestamp().IsZero() {
		return ctrl.Result{}, nil
	}
	st := r.poolState(p.object())
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
		return ctrl.Result{}, r.writeStatus(ctx, st, p, p.withStatus(nil, nil, true, c))
	}
	setCondition(&c, v1alpha1.ConditionInvalidSpec, false, "Valid", "the spec is valid")
	layout, err := p.layout()
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("layout of valid %s %s: %w", r.Kind, req, err)
	}

	// Overlap with an older pool of the namespace: no blocks until it is resolved.
	if other, err := r.olderOverlapping(ctx, p, layout); err != nil {
		return ctrl.Result{}, err
	} else if other != "" {
		msg := fmt.Sprintf("the pool's range %s overlaps %s, which is older; change one of the two", layout.Range(), other)
		setCondition(&c, v1alpha1.ConditionConflict, true, "Overlap", msg)
		setCondition(&c, v1alpha1.ConditionReady, false, "Conflict", msg)
		meta.RemoveStatusCondition(&c.Conditions, v1alpha1.ConditionExhausted)
		c.AllocatedNodes, c.SelectedNodes = 0, 0
		updateMetrics(r.Kind, p.object(), layout, 0, 0)
		return ctrl.Result{}, r.writeStatus(ctx, st, p, p.withStatus(layout, nil, false, c))
	}
	setCondition(&c, v1alpha1.ConditionConflict, false, "NoOverlap", "the pool overlaps no other pool")

	in, err := r.planInput(ctx, p, layout, st)
	if err != nil {
		return ctrl.Result{}, err
	}
	out := makePlan(in)
	for _, n := range out.Replaced {
		logger.Info("replacing a block that no longer fits the spec", "node", n)
		r.event(p, corev1.EventTypeWarning, "BlockReplaced", "Replace",
			"the block of node %s no longer fits the pool's spec and was replaced", n)
	}
	for _, n := range out.Released {
		logger.Info("released the block of a node that is gone or no longer selected", "node", n)
	}

	c.SelectedNodes = int32(len(in.Selected))
	c.AllocatedNodes = int32(len(out.Assignments))
	if n := len(out.Unassigned); n > 0 {
		msg := fmt.Sprintf("%d selected node(s) have no block: all %d usable blocks are assigned (first without: %s)",
			n, countUsable(layout, len(out.Assignments)), out.Unassigned[0])
		setCondition(&c, v1alpha1.ConditionExhausted, true, "NoFreeBlock", msg)
		setCondition(&c, v1alpha1.ConditionReady, false, "Exhausted", msg)
		if st.exhausted != n {
			r.event(p, corev1.EventTypeWarning, "PoolExhausted", "Assign", "%s", msg)
		}
	} else {
		setCondition(&c, v1alpha1.ConditionExhausted, false, "FreeBlocks", "every selected node has a block")
		setCondition(&c, v1alpha1.ConditionReady, true, "AllNodesAssigned", "every selected node has a block")
	}
	st.exhausted = len(out.Unassigned)
	updateMetrics(r.Kind, p.object(), layout, len(out.Assignments), len(out.Unassigned))

	if err := r.writeStatus(ctx, st, p, p.withStatus(layout, out.Assignments, false, c)); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: out.RequeueAfter}, nil
}

// planInput gathers the nodes and the status of the pool for makePlan.
func (r *Reconciler) planInput(ctx context.Context, p pool, layout blocks.Layout, st *poolState) (planInput, error) {
	selector, err := compileSelector(p.nodeSelector())
	if err != nil {
		return planInput{}, fmt.Errorf("node selector of %s %s: %w", r.Kind, p.object().GetName(), err)
	}
	var nodes metav1.PartialObjectMetadataList
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.Client.List(ctx, &nodes); err != nil {
		return planInput{}, fmt.Errorf("listing nodes: %w", err)
	}
	existing, invalid, retired := p.existing(layout)
	in := planInput{
		Layout:   layout,
		Existing: existing,
		Invalid:  invalid,
		Retired:  retired,
		Nodes:    make(map[string]nodeState, len(nodes.Items)),
		Pinned:   p.pinned(layout),
		Departed: st.departed,
		Now:      r.now(),
		Grace:    r.ReleaseGracePeriod,
	}
	name := p.object().GetName()
	for i := range nodes.Items {
		n := &nodes.Items[i]
		s := nodeState{Exists: true, Selected: selector.match(n), InUse: poolsInUse(n, name)}
		in.Nodes[n.Name] = s
		if s.Selected {
			in.Selected = append(in.Selected, n.Name)
		}
	}
	slices.Sort(in.Selected)
	return in, nil
}

// writeStatus writes the desired status unless it is already stored.
func (r *Reconciler) writeStatus(ctx context.Context, st *poolState, current, desired pool) error {
	if current.statusEqual(desired) {
		return nil
	}
	if st.lastSent != nil && st.lastSent.statusEqual(desired) && st.lastStored.statusEqual(current) {
		return nil // the API server prunes part of what we write; nothing new to say
	}
	sent := desired.withStatus(nil, nil, true, desired.common()) // a copy; Update overwrites desired
	obj := desired.object()
	if err := r.Client.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("writing status of %s %s: %w", r.Kind, obj.GetName(), err)
	}
	statusWrites.WithLabelValues(r.Kind).Inc()
	// Update filled obj in with what the server stored; desired now holds that.
	st.lastSent, st.lastStored = sent, desired
	return nil
}

// olderOverlapping returns "Kind name" of an older pool in the namespace whose range
// overlaps this one's, or "".
func (r *Reconciler) olderOverlapping(ctx context.Context, p pool, layout blocks.Layout) (string, error) {
	me := p.object()
	others, err := listPools(ctx, r.Client, me.GetNamespace())
	if err != nil {
		return "", err
	}
	var found []string
	for _, o := range others {
		obj := o.object()
		if obj.GetUID() == me.GetUID() || len(o.validate()) > 0 {
			continue
		}
		ol, err := o.layout()
		if err != nil || !ol.Range().Overlaps(layout.Range()) {
			continue
		}
		if olderThan(obj, o.kind(), me, p.kind()) {
			found = append(found, fmt.Sprintf("%s %s (%s)", o.kind(), obj.GetName(), ol.Range()))
		}
	}
	slices.Sort(found)
	if len(found) == 0 {
		return "", nil
	}
	return found[0], nil
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

// listPools lists the IPPools and CIDRPools of a namespace.
func listPools(ctx context.Context, c client.Reader, namespace string) ([]pool, error) {
	var ips v1alpha1.IPPoolList
	if err := c.List(ctx, &ips, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing IPPools in %s: %w", namespace, err)
	}
	var cidrs v1alpha1.CIDRPoolList
	if err := c.List(ctx, &cidrs, client.InNamespace(namespace)); err != nil {
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

// countUsable counts usable blocks, stopping early once past limit+1: exhaustion
// messages only need "all N" for small pools.
func countUsable(l blocks.Layout, assigned int) uint64 {
	var n uint64
	for i := uint64(0); i < l.Count(); i++ {
		if l.Usable(i) {
			n++
		}
		if n > uint64(assigned)+1 {
			break
		}
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

func poolsInUse(n client.Object, pool string) bool {
	v, ok := n.GetAnnotations()[PoolsInUseAnnotation]
	if !ok {
		return false
	}
	for name := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(name) == pool {
			return true
		}
	}
	return false
}
