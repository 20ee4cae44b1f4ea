// Package planner decides, for one pool, which node keeps, gets or loses which
// block: a pure function of what the reconciler read (the pool's layout, the
// nodes' records and reports, the nodes the selector picks), with no I/O. The
// reconciler (package poolcontroller) gathers its Input from the API server and
// the records, and writes what the Plan says into the records and the pool's
// status.
package planner

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// Assignment is one node's block, by index into the pool's layout.
type Assignment struct {
	Node  string
	Index uint64
}

// NodeState is what the planner needs to know of a node named in a pool.
type NodeState struct {
	// Exists is false when the node object is gone.
	Exists bool
	// Selected is true when the node matches the pool's nodeSelector.
	Selected bool
	// InUse is true when the node's pools-in-use annotation names the pool: its
	// daemon still holds allocations in the block.
	InUse bool
}

// Input is everything one pool's reconcile decides from.
type Input struct {
	Layout blocks.Layout
	// Existing are the assignments read from status that fit the layout, in status
	// order; Invalid are the status entries that no longer fit (or repeat a node).
	Existing []Assignment
	Invalid  []Misfit
	// Foreign are ranges no node gets a block overlapping: blocks of overlapping
	// pools and addresses nodes hold in other pools.
	Foreign []iprange.Range
	// Held are, per node, the ranges that node's daemon may still hold addresses
	// in (reported orphans, a block it has not yet acknowledged losing, blocks
	// retired within the grace period). No other node gets a block overlapping them;
	// the node itself may, since its daemon reserves what it holds.
	Held map[string][]iprange.Range
	// Selected are the names of the nodes matching the nodeSelector, sorted.
	Selected []string
	// Nodes describes every node named in Existing or Selected.
	Nodes map[string]NodeState
	// Pinned gives the block a node must have (CIDRPool static allocations).
	Pinned map[string]uint64
	// Departed records, per node, when its block first became releasable; the
	// planner adds and removes entries. It lives across reconciles.
	Departed map[string]time.Time
	Now      time.Time
	Grace    time.Duration
	// SpareLimit is how many spare blocks the plan lists at most (see
	// Plan.Spare); 0 lists none. No spare block overlaps SpareExcluded either
	// (the blocks taken from nodes that their daemons have not reported
	// holding anything in, which a late report may still claim).
	SpareLimit    int
	SpareExcluded []iprange.Range
}

// Plan is the outcome of one pool's reconcile.
type Plan struct {
	// Assignments is every node's block after the reconcile, sorted by node.
	Assignments []Assignment
	// Released are nodes whose block was released; Replaced are selected nodes whose
	// old block no longer fit the spec and who got a new one (or none, if exhausted).
	Released []string
	Replaced []string
	// Retained are unselected nodes whose block is kept (grace period or in use).
	Retained []string
	// Retired are the blocks taken from nodes in this reconcile because they no
	// longer fit the spec, which the reconciler keeps out of other nodes' reach for
	// the grace period.
	Retired []Misfit
	// Taken are all the blocks taken from nodes in this reconcile (Retired,
	// released blocks, status entries that no longer fit): the reconciler keeps
	// them as the nodes' grants (see trust.go).
	Taken []Misfit
	// Unassigned are selected nodes left without a block: the pool is exhausted.
	Unassigned []string
	// RequeueAfter is when the next grace period ends, 0 if none is running.
	RequeueAfter time.Duration
	// Spare are the lowest usable blocks, ascending, at most Input.SpareLimit,
	// that after this plan no node has, no node may hold anything in (Held,
	// and the blocks taken in this plan), that overlap no Foreign range and
	// that no node is pinned to, nor overlap Input.SpareExcluded: each may go to any node that joins, holds
	// nothing in the pool and is pinned to nothing, without another plan,
	// for as long as nothing this plan read has changed. The lowest is the
	// block Make would give such a node.
	Spare []uint64
}

// Misfit is a range of a node's that no longer is (or never was) a block of the
// current layout; Range is the zero Range when it could not be parsed.
type Misfit struct {
	Node  string
	Range iprange.Range
}

// RetiredRequeue is how soon a pool with waiting nodes is reconciled again after
// blocks were retired.
const RetiredRequeue = time.Second

// Make decides which node keeps, gets or loses which block. Rules, in order:
//   - an existing block of a selected node is kept;
//   - an existing block of a node that is gone or no longer selected is kept while
//     the node exists and its daemon reports the pool in use, and otherwise for the
//     grace period counted from when this was first seen; then it is released;
//   - no node gets a block overlapping a range another node may still hold
//     addresses in (Held, and blocks released or replaced in this reconcile) or
//     a Foreign range;
//   - selected nodes without a block, in name order, get the lowest free usable
//     block that overlaps what their own daemon holds in the pool (its orphans,
//     a block it lost), or else the lowest usable block no node holds anything
//     in; so exhaustion is deterministic, a node that holds much of the pool is
//     not starved by the nodes before it, and a node that leaves and rejoins a
//     pool gets back a block it holds rather than accumulating new ones.
func Make(in Input) Plan {
	var out Plan
	// Sized for every node up front: grown one by one, these maps were rehashed
	// some dozen times per 5,000-node pool, most of Make's time.
	size := len(in.Existing) + len(in.Selected)
	taken := make(map[uint64]bool, size)
	have := make(map[string]bool, size)
	held := make(map[string][]iprange.Range, len(in.Held))
	for n, rs := range in.Held {
		held[n] = slices.Clone(rs)
	}
	// retire holds a range for its node in this reconcile; remember also keeps it
	// held for the grace period (a block that no longer fits the spec: unlike a
	// departed node's, it had no grace period in status).
	retire := func(node string, r iprange.Range, remember bool) {
		if remember {
			out.Retired = append(out.Retired, Misfit{Node: node, Range: r})
		}
		if r.Start.IsValid() {
			held[node] = append(held[node], r)
			out.Taken = append(out.Taken, Misfit{Node: node, Range: r})
		}
	}
	// free: no other node may hold addresses in the block; n itself may.
	// Asked once the ranges held are all known (below), from an index of them:
	// after a layout edit every node may hold a range, and a scan of them all
	// for each of the nodes' new blocks was quadratic in the node count.
	var index heldIndex
	free := func(n string, b iprange.Range) bool { return !index.othersIn(n, b) }
	// own finds, for node n, the lowest usable block not taken that overlaps a
	// range n's daemon holds and is free for n (at most maxOwnScan blocks looked
	// at per held range: a node holds a few ranges of about a block each).
	own := func(n string) (uint64, bool) {
		best, found := uint64(0), false
		for _, r := range held[n] {
			i := blockAt(in.Layout, r.Start)
			for scanned := 0; scanned < maxOwnScan && (!found || i < best); scanned++ {
				next, ok := in.Layout.NextUsable(i)
				if !ok || (found && next >= best) {
					break
				}
				b := in.Layout.Block(next)
				if r.End.Less(b.Start) {
					break
				}
				if !taken[next] && free(n, b) {
					best, found = next, true
					break
				}
				i = next + 1
			}
		}
		return best, found
	}
	keep := make([]Assignment, 0, size)
	for _, a := range in.Existing {
		st := in.Nodes[a.Node]
		if st.Selected {
			if pin, ok := in.Pinned[a.Node]; ok && pin != a.Index {
				out.Replaced = append(out.Replaced, a.Node)
				retire(a.Node, in.Layout.Block(a.Index), true)
				continue
			}
			delete(in.Departed, a.Node)
			keep = append(keep, a)
			taken[a.Index], have[a.Node] = true, true
			continue
		}
		if st.Exists && st.InUse {
			delete(in.Departed, a.Node)
			keep = append(keep, a)
			taken[a.Index], have[a.Node] = true, true
			out.Retained = append(out.Retained, a.Node)
			continue
		}
		since, seen := in.Departed[a.Node]
		if !seen {
			since = in.Now
			in.Departed[a.Node] = since
		}
		if left := since.Add(in.Grace).Sub(in.Now); left > 0 {
			keep = append(keep, a)
			taken[a.Index], have[a.Node] = true, true
			out.Retained = append(out.Retained, a.Node)
			if out.RequeueAfter == 0 || left < out.RequeueAfter {
				out.RequeueAfter = left
			}
			continue
		}
		delete(in.Departed, a.Node)
		retire(a.Node, in.Layout.Block(a.Index), false)
		out.Released = append(out.Released, a.Node)
	}
	for _, m := range in.Invalid {
		// A block that no longer fits the spec cannot be kept in status; its range
		// stays held for its node (see Held), so no other node gets it meanwhile.
		retire(m.Node, m.Range, true)
		switch {
		case have[m.Node]:
			// A duplicate entry of a node that keeps a valid block: nothing to report.
		case in.Nodes[m.Node].Selected:
			out.Replaced = append(out.Replaced, m.Node)
		default:
			out.Released = append(out.Released, m.Node)
		}
	}
	index = newHeldIndex(held, in.Foreign)
	// Pinned blocks first, so that a static allocation never loses its prefix to a
	// node that sorts earlier.
	var cursor uint64
	for _, n := range in.Selected {
		if have[n] {
			continue
		}
		if pin, ok := in.Pinned[n]; ok {
			if !taken[pin] && free(n, in.Layout.Block(pin)) {
				keep = append(keep, Assignment{Node: n, Index: pin})
				taken[pin], have[n] = true, true
			}
			continue
		}
	}
	for _, n := range in.Selected {
		if have[n] {
			continue
		}
		if _, ok := in.Pinned[n]; ok {
			out.Unassigned = append(out.Unassigned, n)
			continue
		}
		if i, ok := own(n); ok {
			keep = append(keep, Assignment{Node: n, Index: i})
			taken[i], have[n] = true, true
			continue
		}
		// The shared search position passes only blocks that are taken or that
		// some node holds something in (or another pool): those stay unusable for
		// every later node but the one holding them, which looked at them above.
		found := false
		for {
			next, ok := in.Layout.NextUsable(cursor)
			if !ok {
				break
			}
			cursor = next
			if !taken[cursor] && free("", in.Layout.Block(cursor)) {
				found = true
				break
			}
			cursor++
		}
		if !found {
			out.Unassigned = append(out.Unassigned, n)
			continue
		}
		keep = append(keep, Assignment{Node: n, Index: cursor})
		taken[cursor], have[n] = true, true
		cursor++
	}
	for n := range in.Departed {
		if !slices.Contains(out.Retained, n) {
			delete(in.Departed, n)
		}
	}
	slices.SortFunc(keep, func(a, b Assignment) int { return strings.Compare(a.Node, b.Node) })
	out.Assignments = keep
	out.Spare = spare(in, taken, free)
	// Blocks retired now may go to waiting nodes in the next reconcile; nothing else
	// would trigger it, so ask for one.
	if len(out.Unassigned) > 0 && len(out.Released)+len(out.Replaced) > 0 && (out.RequeueAfter == 0 || out.RequeueAfter > RetiredRequeue) {
		out.RequeueAfter = RetiredRequeue
	}
	slices.Sort(out.Replaced)
	out.Replaced = slices.Compact(out.Replaced)
	return out
}

// spare lists the lowest usable blocks, at most in.SpareLimit, that are not
// taken, not pinned to any node and free of every node's held ranges, of the
// foreign ones and of in.SpareExcluded. It walks from the first block: past every block taken, so
// its cost grows with the node count as the plan's own does, and past at most
// SpareLimit free ones.
func spare(in Input, taken map[uint64]bool, free func(string, iprange.Range) bool) []uint64 {
	if in.SpareLimit <= 0 {
		return nil
	}
	pinned := make(map[uint64]bool, len(in.Pinned))
	for _, i := range in.Pinned {
		pinned[i] = true
	}
	excluded := newHeldIndex(nil, in.SpareExcluded)
	var out []uint64
	for i := uint64(0); len(out) < in.SpareLimit; i++ {
		next, ok := in.Layout.NextUsable(i)
		if !ok {
			break
		}
		i = next
		if b := in.Layout.Block(i); !taken[i] && !pinned[i] && free("", b) && !excluded.othersIn("", b) {
			out = append(out, i)
		}
	}
	return out
}

// maxOwnScan bounds how many blocks the planner looks at per range a node holds
// when it looks for a block overlapping them.
const maxOwnScan = 4096

// blockAt returns the index of the first block of the layout that ends at or
// after a (Count when none does): blocks lie in address order.
func blockAt(l blocks.Layout, a netip.Addr) uint64 {
	lo, hi := uint64(0), l.Count()
	for lo < hi {
		mid := lo + (hi-lo)/2
		if l.Block(mid).End.Less(a) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// heldIndex holds the ranges nodes may hold addresses in, and the foreign
// ranges, sorted by start, with the highest end up to each: what overlaps a
// block is found by a binary search and a walk back over the ranges that may
// reach it, not a scan of every node's.
type heldIndex struct {
	spans  []heldSpan
	maxEnd []netip.Addr
}

type heldSpan struct {
	r       iprange.Range
	node    string
	foreign bool // a Foreign range: no node may have it
}

func newHeldIndex(held map[string][]iprange.Range, foreign []iprange.Range) heldIndex {
	var x heldIndex
	for n, rs := range held {
		for _, r := range rs {
			if r.Start.IsValid() {
				x.spans = append(x.spans, heldSpan{r: r, node: n})
			}
		}
	}
	for _, r := range foreign {
		if r.Start.IsValid() {
			x.spans = append(x.spans, heldSpan{r: r, foreign: true})
		}
	}
	slices.SortFunc(x.spans, func(a, b heldSpan) int { return a.r.Start.Compare(b.r.Start) })
	x.maxEnd = make([]netip.Addr, len(x.spans))
	for i, sp := range x.spans {
		x.maxEnd[i] = sp.r.End
		if i > 0 && x.maxEnd[i].Less(x.maxEnd[i-1]) {
			x.maxEnd[i] = x.maxEnd[i-1]
		}
	}
	return x
}

// othersIn tells whether a range of a node other than n, or a foreign range,
// overlaps b.
func (x heldIndex) othersIn(n string, b iprange.Range) bool {
	// The ranges that start at or before b's end; of those, walked back, only
	// while one of them (or one before) ends at or after b's start.
	i, _ := slices.BinarySearchFunc(x.spans, b.End, func(sp heldSpan, a netip.Addr) int {
		if a.Less(sp.r.Start) {
			return 1
		}
		return -1
	})
	for j := i - 1; j >= 0 && !x.maxEnd[j].Less(b.Start); j-- {
		sp := x.spans[j]
		if (sp.foreign || sp.node != n) && sp.r.Overlaps(b) {
			return true
		}
	}
	return false
}
