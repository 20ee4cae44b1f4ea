package poolcontroller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
	"github.com/hwipam/hwipam/test/harness"
)

// TestPlacedJoinsMergeIntoARacingPlan: a plan starts from the pool's blocks;
// while it runs, joining nodes are given blocks from the last plan's spare
// ones (some of them nodes the plan also gives a block, as new nodes); the
// merge of the two must give no block twice, keep every block that was there
// and every block placed, and give a node whose planned block went to a
// placement another block that is free for it, from the plan's own spares.
// Random pools, holds and joins; replayable with HWIPAM_SEED.
func TestPlacedJoinsMergeIntoARacingPlan(t *testing.T) {
	rng := harness.Rand(t)
	layout, err := blocks.NewIPPool(&v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/24", PerNodeBlockSize: 4,
		Exclusions: []v1alpha1.ExcludeRange{{StartIP: "10.0.0.33", EndIP: "10.0.0.40"}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	for round := range 500 {
		ctx := fmt.Sprintf("round %d", round)
		nodes := map[string]planner.NodeState{}
		var selected []string
		for i := range rng.IntN(40) {
			n := fmt.Sprintf("a%02d", i)
			nodes[n] = planner.NodeState{Exists: true, Selected: true}
			selected = append(selected, n)
		}
		held := map[string][]iprange.Range{}
		for range rng.IntN(4) {
			s, _ := iprange.Add(layout.Range().Start, iprange.U64(uint64(rng.IntN(256))))
			e, _ := iprange.Add(s, iprange.U64(uint64(rng.IntN(8))))
			if layout.Range().End.Less(e) {
				e = layout.Range().End
			}
			n := fmt.Sprintf("h%d", rng.IntN(3))
			held[n] = append(held[n], iprange.Range{Start: s, End: e})
		}
		first := planner.Make(planner.Input{Layout: layout, Selected: selected, Nodes: nodes, Held: held,
			Departed: map[string]time.Time{}, Now: now, SpareLimit: 1 + rng.IntN(20)})
		// Joins placed from the first plan's spares while the second runs;
		// the second plan sees some of them as new nodes (the cache had
		// them), but not their blocks.
		placed := map[string]uint64{}
		spare := first.Spare
		var joined []string
		for i := range rng.IntN(8) {
			n := fmt.Sprintf("j%02d", i)
			joined = append(joined, n)
			if len(spare) > 0 && rng.IntN(4) > 0 {
				placed[n], spare = spare[0], spare[1:]
			}
		}
		nodes2 := map[string]planner.NodeState{}
		for n, s := range nodes {
			nodes2[n] = s
		}
		sel2 := slices.Clone(selected)
		for _, n := range joined {
			if rng.IntN(2) == 0 {
				nodes2[n] = planner.NodeState{Exists: true, Selected: true}
				sel2 = append(sel2, n)
			}
		}
		slices.Sort(sel2)
		in2 := planner.Input{Layout: layout, Existing: first.Assignments, Selected: sel2, Nodes: nodes2, Held: held,
			Departed: map[string]time.Time{}, Now: now, SpareLimit: 1 + rng.IntN(20)}
		second := planner.Make(in2)
		merged, left, unplaced := mergePlaced(second.Assignments, placed, second.Spare)
		short := len(unplaced) > 0

		byNode, byBlock := map[string]uint64{}, map[uint64]string{}
		for _, a := range merged {
			if _, dup := byNode[a.Node]; dup {
				t.Fatalf("%s: %s has two blocks in %v", ctx, a.Node, merged)
			}
			if o, dup := byBlock[a.Index]; dup {
				t.Fatalf("%s: block %d given to %s and %s", ctx, a.Index, o, a.Node)
			}
			byNode[a.Node], byBlock[a.Index] = a.Index, a.Node
			b := layout.Block(a.Index)
			for h, rs := range held {
				if h != a.Node && iprange.OverlapsAny(b, rs) {
					t.Fatalf("%s: %s got block %d over what %s holds (%v)", ctx, a.Node, a.Index, h, rs)
				}
			}
		}
		if !slices.IsSortedFunc(merged, func(a, b planner.Assignment) int { return strings.Compare(a.Node, b.Node) }) {
			t.Fatalf("%s: merged assignments not sorted by node: %v", ctx, merged)
		}
		for _, a := range first.Assignments {
			if byNode[a.Node] != a.Index {
				t.Fatalf("%s: %s lost its block %d", ctx, a.Node, a.Index)
			}
		}
		for n, i := range placed {
			if got, ok := byNode[n]; !ok || got != i {
				t.Fatalf("%s: %s was placed on block %d, the merge gives it %d (%v)", ctx, n, i, got, ok)
			}
		}
		bumped := 0
		for _, a := range second.Assignments {
			if _, p := placed[a.Node]; p {
				continue
			}
			if got, ok := byNode[a.Node]; !ok || got != a.Index {
				bumped++
				if ok && !slices.Contains(second.Spare, got) {
					t.Fatalf("%s: %s moved from block %d to %d, not one of the plan's spares %v", ctx, a.Node, a.Index, got, second.Spare)
				}
				if !ok && !short {
					t.Fatalf("%s: %s lost its planned block %d, and the merge does not say it is short", ctx, a.Node, a.Index)
				}
			}
		}
		for _, i := range left {
			if n, taken := byBlock[i]; taken {
				t.Fatalf("%s: block %d left spare, but given to %s", ctx, i, n)
			}
			if !slices.Contains(second.Spare, i) {
				t.Fatalf("%s: block %d left spare, not one of the plan's %v", ctx, i, second.Spare)
			}
		}
		if short && bumped == 0 {
			t.Fatalf("%s: short, with no node left without its planned block", ctx)
		}
	}
}

// TestSetAndPlaceRunTogether: plans recorded (Set) while joins are placed from
// the index (Place) on other goroutines, as the reconcilers and the Node
// handler do. Set once read the pool's blocks after installing them as the
// index's, while a placement wrote them (a fatal concurrent map access, seen in
// BenchmarkRailScale's burst). Run with -race; without it the map access fails
// now and then. No block may be given twice, and every placed node keeps its block.
func TestSetAndPlaceRunTogether(t *testing.T) {
	d := &Delivery{}
	d.init()
	d.enabled = true
	close(d.decided)
	p := ipPool{&v1alpha1.IPPool{}}
	p.p.Name, p.p.UID, p.p.Generation = "p", "uid-p", 1
	p.p.Spec = v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/16", PerNodeBlockSize: 4}
	layout, err := p.layout()
	if err != nil {
		t.Fatal(err)
	}
	var as []planner.Assignment
	for i := range 100 {
		as = append(as, planner.Assignment{Node: fmt.Sprintf("a%03d", i), Index: uint64(i)})
	}
	spareOf := func(as []planner.Assignment) []uint64 {
		used := map[uint64]bool{}
		for _, a := range as {
			used[a.Index] = true
		}
		var spare []uint64
		for i := uint64(0); len(spare) < 64; i++ {
			if !used[i] {
				spare = append(spare, i)
			}
		}
		return spare
	}
	// The pool's blocks as a plan before left them (a first plan also lists
	// the NodeIPAMs, which needs an API server).
	d.pools[poolRef{p.kind(), "p"}] = &poolBlocks{template: p.template(), layout: layout, blocks: statusOf(layout, as).index}
	as, _ = d.Set(p, layout, as, spareOf(as), nil)
	const joins = 3000
	placed := make(chan string, joins)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range joins {
			n := fmt.Sprintf("j%04d", i)
			if ok, _ := d.Place(p.kind(), "p", "uid-p", 1, n); ok {
				placed <- n
			}
		}
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		as, _ = d.Set(p, layout, as, spareOf(as), nil)
	}
	close(placed)
	final, _ := d.Set(p, layout, as, spareOf(as), nil)
	byNode, byBlock := map[string]uint64{}, map[uint64]string{}
	for _, a := range final {
		if o, dup := byBlock[a.Index]; dup {
			t.Fatalf("block %d given to %s and %s", a.Index, o, a.Node)
		}
		byNode[a.Node], byBlock[a.Index] = a.Index, a.Node
	}
	n := 0
	for node := range placed {
		n++
		if _, ok := byNode[node]; !ok {
			t.Fatalf("%s was placed and has no block in the last plan", node)
		}
	}
	if n == 0 {
		t.Fatal("no join was placed")
	}
	t.Logf("%d joins placed among the plans", n)
}
