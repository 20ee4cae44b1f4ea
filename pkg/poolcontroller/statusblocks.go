package poolcontroller

import (
	"iter"

	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// poolStatus is what a pool's status gives nodes, as the memory keeps it: by
// node, the index of its block in the layout it was cut from. An index takes 8
// bytes where the block's Range takes 48: at 100,000 nodes × 8 pools, some 60 MB
// of the controller's live heap (and twice that of its peak, with Go's default
// GC). The zero poolStatus gives no node a block.
type poolStatus struct {
	layout blocks.Layout
	index  map[string]uint64
}

// statusOf is the poolStatus of as, blocks of layout; as is not kept.
func statusOf(layout blocks.Layout, as []planner.Assignment) poolStatus {
	return poolStatus{layout: layout, index: indexOf(as)}
}

// indexOf is the block index of as by node, as the memory and Delivery keep them.
func indexOf(as []planner.Assignment) map[string]uint64 {
	index := make(map[string]uint64, len(as))
	for _, a := range as {
		index[a.Node] = a.Index
	}
	return index
}

// block returns node's block, if it has one.
func (s poolStatus) block(node string) (iprange.Range, bool) {
	i, ok := s.index[node]
	if !ok {
		return iprange.Range{}, false
	}
	return s.layout.Block(i), true
}

// len is the number of nodes given a block.
func (s poolStatus) len() int { return len(s.index) }

// has tells whether node is given a block.
func (s poolStatus) has(node string) bool {
	_, ok := s.index[node]
	return ok
}

// all yields each node and its block, in map order.
func (s poolStatus) all() iter.Seq2[string, iprange.Range] {
	return func(yield func(string, iprange.Range) bool) {
		for node, i := range s.index {
			if !yield(node, s.layout.Block(i)) {
				return
			}
		}
	}
}

// equal tells whether s and o give the same nodes the same blocks (of whatever
// layouts).
func (s poolStatus) equal(o poolStatus) bool {
	if len(s.index) != len(o.index) {
		return false
	}
	for node, b := range s.all() {
		if ob, ok := o.block(node); !ok || ob != b {
			return false
		}
	}
	return true
}
