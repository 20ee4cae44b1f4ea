package poolcontroller

import (
	"fmt"
	"slices"
	"time"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// Preview is what the reconciler writes for a new pool (no status yet) when exactly
// the given nodes match its nodeSelector, every node exists, and no other pool
// overlaps it: the same planner, layout and status encoding, without the API.
// `ipamctl plan` uses it, so offline planning cannot disagree with the controller.
type Preview struct {
	// Layout is the pool's block layout.
	Layout blocks.Layout
	// IPPool or CIDRPool is the pool with the status the reconciler would write.
	IPPool   *v1alpha1.IPPool
	CIDRPool *v1alpha1.CIDRPool
	// Unassigned are the nodes left without a block (the pool is exhausted).
	Unassigned []string
}

// PreviewIPPool previews an IPPool's assignment to nodes.
func PreviewIPPool(p *v1alpha1.IPPool, nodes []string) (*Preview, error) {
	out, err := preview(ipPool{p.DeepCopy()}, nodes)
	if err != nil {
		return nil, err
	}
	out.IPPool = out.pool.(ipPool).p
	return &out.Preview, nil
}

// PreviewCIDRPool previews a CIDRPool's assignment to nodes.
func PreviewCIDRPool(p *v1alpha1.CIDRPool, nodes []string) (*Preview, error) {
	out, err := preview(cidrPool{p.DeepCopy()}, nodes)
	if err != nil {
		return nil, err
	}
	out.CIDRPool = out.pool.(cidrPool).p
	return &out.Preview, nil
}

type previewed struct {
	Preview
	pool pool
}

func preview(p pool, nodes []string) (previewed, error) {
	if errs := p.validate(); len(errs) > 0 {
		return previewed{}, fmt.Errorf("invalid %s: %w", p.kind(), errs.ToAggregate())
	}
	layout, err := p.layout()
	if err != nil {
		return previewed{}, fmt.Errorf("layout of %s: %w", p.kind(), err)
	}
	selected := slices.Sorted(slices.Values(nodes))
	if d := slices.Compact(slices.Clone(selected)); len(d) != len(selected) {
		return previewed{}, fmt.Errorf("node names repeat")
	}
	states := make(map[string]planner.NodeState, len(selected))
	for _, n := range selected {
		states[n] = planner.NodeState{Exists: true, Selected: true}
	}
	out := planner.Make(planner.Input{Layout: layout, Selected: selected, Nodes: states, Pinned: p.pinned(layout),
		Departed: map[string]time.Time{}, Now: time.Now()})
	c := v1alpha1.PoolStatusCommon{ObservedGeneration: p.object().GetGeneration(), SelectedNodes: int32(len(selected))}
	// The conditions of a valid pool without overlap or orphans, in the
	// reconciler's order: the status is as large as the one it writes.
	setCondition(&c, v1alpha1.ConditionInvalidSpec, false, "Valid", "the spec is valid")
	setCondition(&c, v1alpha1.ConditionConflict, false, "NoOverlap", "the pool overlaps no other pool")
	setCondition(&c, v1alpha1.ConditionOrphans, false, "NoneHeld", "no node holds addresses outside its block")
	setAssignedConditions(&c, layout, out)
	setListedTrue(&c)
	return previewed{Preview: Preview{Layout: layout, Unassigned: out.Unassigned},
		pool: p.withStatus(layout, out.Assignments, false, c)}, nil
}
