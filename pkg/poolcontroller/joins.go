package poolcontroller

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// A node that joins gets its blocks from an index of free blocks that the
// pool's last plan left (planner.Plan.Spare), without a plan of the whole pool:
// its record is queued for writing as soon as its Node is seen, and the pool's
// next plan, a little later, merely finds the block given. At 100,000 nodes a
// plan reads every node's report and takes seconds; a join placed from the
// index costs a lookup and the node's own record write, whatever the node
// count.
//
// Why that gives no block twice. A spare block is one that, at the last plan,
// no node had, no node may hold anything in (what the reports count, the
// reservations of retired blocks, and every grant, reported or not, which a
// late report may still claim: planner.Input.SpareExcluded) and no other pool
// covers. Until the next plan only the controller itself can change that, and
// each way it can is closed:
//   - other placements: one index per pool, under Delivery's lock, and a block
//     leaves it when it is given;
//   - the next plan, which started from the blocks as they were before some
//     placements: Delivery.Assigned marks where it started, and Delivery.Set
//     merges the placements made since into the plan (a node the plan gave the
//     same block to takes another spare; a node placed keeps the block it got);
//   - a plan from another layout (a spec edit), from the records at a start,
//     or of a pool created again under the name: the index is frozen when such
//     a plan starts (Delivery.ExistingToPlan; for a pool created again, the old
//     pool's blocks, placements included, become its nodes' grants first:
//     Delivery.Replaced), and a placement checks the pool's UID and
//     generation;
//   - another pool created, edited, deleted or planned over this pool's
//     network: the index is frozen at the event (the reconcilers' overlap
//     mapper) and when the other pool's plan reads this pool's blocks
//     (Delivery.Existing); pools with foreign ranges, a conflict or a deletion
//     under way keep none. A freeze while a plan runs makes the index that plan
//     installs a frozen one (Delivery's freezes and snaps);
//   - reports: with the records as the memory, a report counts only within
//     the node's own grants, which are never spare; a node whose record
//     someone else wrote (whose report counts beyond its grants) stops every
//     placement until its record is the controller's again; a memory that
//     adopts reports (an earlier version's Lease without grants) keeps no
//     index at all.
//
// A node that holds something in the pool, or is pinned to a block (CIDRPool
// static allocations), is not placed: its plan gives it the block over what it
// holds, or its own.

// spareLimit is how many spare blocks a pool's index holds: joins until the
// pool's next plan, which a join asks for within followUpMax (and at once when
// a quarter of the index is left).
const spareLimit = 8192

// followUpMin and followUpMax bound how long after a placement the pool's
// plan runs (to write its status and conditions): 20 times the pool's last
// reconcile, its status write included, so that joins at any rate cost the
// pool a plan at most every followUpMax, and the API server at most a
// twentieth of the time of its status writes (the write is most of a plan's
// cost to it: some 560 kB at 7,000 nodes, which 100 joins a second with a plan
// a second made the API server's main load, and the joins' records waited
// behind them). A daemon's report waits half of 20 times the last plan up to
// its status write only (see nodeHandler): a slow API server stretches the
// write, and a range a report frees must not wait on it.
const (
	followUpMin    = time.Second
	followUpMax    = time.Minute
	followUpFactor = 20
)

var joinsPlaced = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "hwipam_controller_joins_placed_total",
	Help: "Blocks given to joining nodes from a pool's index of free blocks, before the pool's next reconcile.",
}, []string{"kind"})

func init() { metrics.Registry.MustRegister(joinsPlaced) }

// joinIndex is a pool's index of free blocks, as its last plan left it.
type joinIndex struct {
	// spare are the free blocks, ascending (see planner.Plan.Spare); start
	// is how many there were.
	spare []uint64
	start int
	// skip are the nodes without a block that hold something in the pool or
	// are pinned to a block: only a plan gives them one.
	skip map[string]bool
	// placed are the blocks given from the index since the plan now running
	// started (see Delivery.Assigned), by node.
	placed map[string]uint64
	// frozen: nothing more is placed until the next plan makes a new index;
	// what was placed is still merged into that plan.
	frozen bool
}

// Place gives node the lowest spare block of the pool, if the pool's index
// allows it (the pool of UID uid and generation gen was planned with one, and
// the node has no block and is not skipped), and marks the node's record as
// pending; the caller queues it (Queue) once it has placed the node in every
// pool it joins, so that one write carries them all. low says that the index
// is running short and the pool wants a plan now.
func (d *Delivery) Place(kind, name string, uid types.UID, gen int64, node string) (placed, low bool) {
	if !d.on() {
		return false, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	pb := d.pools[poolRef{kind, name}]
	if pb == nil || pb.joins == nil || pb.joins.frozen || pb.template.PoolUID != uid || pb.template.Generation != gen || len(d.untrusted) > 0 {
		return false, false
	}
	x := pb.joins
	if _, has := pb.blocks[node]; has || x.skip[node] || len(x.spare) == 0 {
		return false, false
	}
	i := x.spare[0]
	x.spare = x.spare[1:]
	pb.blocks[node] = i
	x.placed[node] = i
	d.changes++
	d.pending[node] = d.changes
	joinsPlaced.WithLabelValues(kind).Inc()
	return true, len(x.spare) < x.start/4
}

// freezeLocked stops placements from ref's index, now and from an index a
// plan that started before installs; with d.mu held.
func (d *Delivery) freezeLocked(ref poolRef) {
	d.freezes[ref]++
	if pb := d.pools[ref]; pb != nil && pb.joins != nil {
		pb.joins.frozen = true
	}
}

// Queue queues node's record for writing, after Place.
func (d *Delivery) Queue(node string) {
	if d.on() {
		d.queue.Add(node)
	}
}

// Freeze stops placements from a pool's index: every join waits for the
// pool's next plan, which makes a new index if it can.
func (d *Delivery) Freeze(kind, name string) {
	d.Frozen(kind, name)
}

// Frozen freezes a pool's index (see Freeze) and returns the pool's blocks
// as they are then, placements included, by node; nil when it has none here.
func (d *Delivery) Frozen(kind, name string) *poolStatus {
	return d.frozen(kind, name, "")
}

// Replaced is Frozen for a pool whose blocks here are of a pool of its name
// with another UID than uid (deleted and created again); nil otherwise.
func (d *Delivery) Replaced(kind, name string, uid types.UID) *poolStatus {
	return d.frozen(kind, name, uid)
}

func (d *Delivery) frozen(kind, name string, unless types.UID) *poolStatus {
	if !d.on() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ref := poolRef{kind, name}
	pb := d.pools[ref]
	if unless != "" && (pb == nil || pb.template.PoolUID == unless) {
		return nil
	}
	d.freezeLocked(ref)
	if pb == nil {
		return nil
	}
	return &poolStatus{layout: pb.layout, index: maps.Clone(pb.blocks)}
}

// mergePlaced returns a plan's assignments (sorted by node) with the blocks
// placed since the plan started: a node placed keeps its block (the plan may
// have given it another, which no one else has then); a node the plan gave a
// placed block to gets the lowest of spare instead, or none (it is then in
// unplaced, and the pool wants another plan). It returns what is left of
// spare, without the blocks placed.
func mergePlaced(as []planner.Assignment, placed map[string]uint64, spare []uint64) (out []planner.Assignment, left []uint64, unplaced []string) {
	if len(placed) == 0 {
		return as, spare, nil
	}
	byBlock := make(map[uint64]string, len(placed))
	for n, i := range placed {
		byBlock[i] = n
	}
	out = make([]planner.Assignment, 0, len(as)+len(placed))
	done := make(map[string]bool, len(placed))
	var bumped []string
	for _, a := range as {
		if i, ok := placed[a.Node]; ok {
			out = append(out, planner.Assignment{Node: a.Node, Index: i})
			done[a.Node] = true
			continue
		}
		if n, ok := byBlock[a.Index]; ok && n != a.Node {
			bumped = append(bumped, a.Node)
			continue
		}
		out = append(out, a)
	}
	for n, i := range placed {
		if !done[n] {
			out = append(out, planner.Assignment{Node: n, Index: i})
		}
	}
	left = slices.DeleteFunc(slices.Clone(spare), func(i uint64) bool { _, ok := byBlock[i]; return ok })
	for _, n := range bumped {
		if len(left) == 0 {
			unplaced = append(unplaced, n)
			continue
		}
		out = append(out, planner.Assignment{Node: n, Index: left[0]})
		left = left[1:]
	}
	slices.SortFunc(out, func(a, b planner.Assignment) int { return cmp.Compare(a.Node, b.Node) })
	return out, left, unplaced
}

// afterMerge updates a plan's nodes without a block after its assignments
// were merged with placements (see mergePlaced): those placed since have one,
// and those unplaced have none.
func afterMerge(out *planner.Plan, unplaced []string) {
	if len(out.Unassigned) == 0 && len(unplaced) == 0 {
		return
	}
	has := func(n string) bool {
		_, ok := slices.BinarySearchFunc(out.Assignments, n, func(a planner.Assignment, n string) int { return cmp.Compare(a.Node, n) })
		return ok
	}
	out.Unassigned = append(slices.DeleteFunc(out.Unassigned, has), unplaced...)
	slices.Sort(out.Unassigned)
	out.Unassigned = slices.Compact(out.Unassigned)
}

// joinSkips returns the nodes an index skips: those of held (what they may
// hold in the pool) and pinned, and those a plan took a block from, that have
// no block after it.
func joinSkips(in planner.Input, out planner.Plan) map[string]bool {
	has := func(n string) bool {
		_, ok := slices.BinarySearchFunc(out.Assignments, n, func(a planner.Assignment, n string) int { return cmp.Compare(a.Node, n) })
		return ok
	}
	skip := map[string]bool{}
	for n, rs := range in.Held {
		if len(rs) > 0 && !has(n) {
			skip[n] = true
		}
	}
	for n := range in.Pinned {
		if !has(n) {
			skip[n] = true
		}
	}
	for _, m := range out.Taken {
		if !has(m.Node) {
			skip[m.Node] = true
		}
	}
	return skip
}

// followUp is how long after a placement pool's plan runs (see
// followUpFactor); pool nil: after a report, from the kind's last plan up to
// its status write.
func (r *Reconciler) followUp(pool client.Object) time.Duration {
	took := time.Duration(r.lastTook.Load())
	if pool != nil {
		r.mu.Lock()
		took = r.took[client.ObjectKeyFromObject(pool)]
		r.mu.Unlock()
	}
	return min(max(took*followUpFactor, followUpMin), followUpMax)
}

// tookInAll records how long a reconcile of pool took, its status write
// included (see followUp).
func (r *Reconciler) tookInAll(pool types.NamespacedName, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.took == nil {
		r.took = map[types.NamespacedName]time.Duration{}
	}
	r.took[pool] = took
}

// placeJoin gives node a block of pool p from the pool's index when the pool
// selects it, its status lists no block of it (a takeover's entry, which the
// plan reads) and the index allows it (see Delivery.Place).
func (r *Reconciler) placeJoin(p pool, node client.Object) (placed, low bool) {
	if !r.Delivery.on() {
		return false, false
	}
	sel, err := compileSelector(p.nodeSelector())
	if err != nil || !sel.match(node) || p.hasNode(node.GetName()) {
		return false, false
	}
	obj := p.object()
	return r.Delivery.Place(r.Kind, obj.GetName(), obj.GetUID(), obj.GetGeneration(), node.GetName())
}
