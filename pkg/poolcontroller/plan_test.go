package poolcontroller

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
)

// TestPlanInvariantsRandomized drives makePlan through random sequences of node
// churn, selection changes and daemon annotations, feeding each plan's output back
// as the next input as the controller does through status, and checks after every
// step the invariants of DESIGN.md §5 that concern blocks.
func TestPlanInvariantsRandomized(t *testing.T) {
	layout, err := blocks.NewIPPool(&v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/26", PerNodeBlockSize: 4,
		Exclusions: []v1alpha1.ExcludeRange{{StartIP: "10.0.0.9", EndIP: "10.0.0.12"}}})
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		grace := time.Duration(rng.IntN(3)) * time.Minute
		now := time.Unix(0, 0)
		departed := map[string]time.Time{}
		nodes := map[string]nodeState{}
		var existing []assignment
		for step := range 40 {
			// Random world change.
			name := fmt.Sprintf("n%02d", rng.IntN(24))
			switch rng.IntN(4) {
			case 0:
				nodes[name] = nodeState{Exists: true, Selected: true}
			case 1:
				delete(nodes, name)
			case 2:
				st := nodes[name]
				st.Selected = !st.Selected
				nodes[name] = st
			case 3:
				st := nodes[name]
				st.InUse = st.Exists && !st.InUse
				nodes[name] = st
			}
			now = now.Add(time.Duration(rng.IntN(90)) * time.Second)
			var selected []string
			for n, st := range nodes {
				if st.Selected && st.Exists {
					selected = append(selected, n)
				}
			}
			slices.Sort(selected)
			prev := map[string]uint64{}
			for _, a := range existing {
				prev[a.Node] = a.Index
			}
			out := makePlan(planInput{Layout: layout, Existing: existing, Selected: selected, Nodes: nodes,
				Departed: departed, Now: now, Grace: grace})

			ctx := fmt.Sprintf("seed %d step %d", seed, step)
			seenNode, seenIdx := map[string]bool{}, map[uint64]string{}
			for _, a := range out.Assignments {
				if seenNode[a.Node] {
					t.Fatalf("%s: node %s has two blocks", ctx, a.Node)
				}
				if other, dup := seenIdx[a.Index]; dup {
					t.Fatalf("%s: block %d given to %s and %s", ctx, a.Index, other, a.Node)
				}
				if !layout.Usable(a.Index) {
					t.Fatalf("%s: unusable block %d assigned to %s", ctx, a.Index, a.Node)
				}
				seenNode[a.Node], seenIdx[a.Index] = true, a.Node
				if old, had := prev[a.Node]; had && old != a.Index {
					t.Fatalf("%s: node %s moved from block %d to %d", ctx, a.Node, old, a.Index)
				}
				if !had(prev, a.Node) {
					for _, r := range out.Released {
						if prev[r] == a.Index {
							t.Fatalf("%s: block %d released from %s and handed to %s in one reconcile", ctx, a.Index, r, a.Node)
						}
					}
				}
			}
			for _, n := range selected {
				if _, kept := prev[n]; kept && !seenNode[n] {
					t.Fatalf("%s: selected node %s lost its block", ctx, n)
				}
			}
			for n, old := range prev {
				if st := nodes[n]; st.Exists && st.InUse && !seenNode[n] {
					t.Fatalf("%s: node %s lost block %d while its daemon reports the pool in use", ctx, n, old)
				}
			}
			if len(out.Unassigned) > 0 && len(out.Released) == 0 {
				// Exhaustion must be real: no usable free block left.
				for i := range layout.Count() {
					if _, used := seenIdx[i]; !used && layout.Usable(i) {
						t.Fatalf("%s: %v left without a block while block %d is free", ctx, out.Unassigned, i)
					}
				}
			}
			existing = out.Assignments
		}
	}
}

func had(m map[string]uint64, k string) bool {
	_, ok := m[k]
	return ok
}

// BenchmarkMakePlan plans a pool of 5,000 selected nodes, as the controller does
// once per pool when the pool is created (none has a block) and on every later
// reconcile (all keep theirs).
func BenchmarkMakePlan(b *testing.B) {
	layout, err := blocks.NewIPPool(&v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/14", PerNodeBlockSize: 8})
	if err != nil {
		b.Fatal(err)
	}
	const n = 5000
	nodes := make(map[string]nodeState, n)
	var selected []string
	for i := range n {
		name := fmt.Sprintf("node-%05d", i)
		nodes[name] = nodeState{Exists: true, Selected: true}
		selected = append(selected, name)
	}
	first := makePlan(planInput{Layout: layout, Selected: selected, Nodes: nodes, Departed: map[string]time.Time{}})
	if len(first.Assignments) != n {
		b.Fatalf("%d of %d nodes got a block", len(first.Assignments), n)
	}
	for _, c := range []struct {
		name     string
		existing []assignment
	}{{"new-pool", nil}, {"all-assigned", first.Assignments}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				out := makePlan(planInput{Layout: layout, Existing: c.existing, Selected: selected, Nodes: nodes,
					Departed: map[string]time.Time{}})
				if len(out.Assignments) != n {
					b.Fatalf("%d of %d nodes got a block", len(out.Assignments), n)
				}
			}
		})
	}
}
