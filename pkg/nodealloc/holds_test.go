package nodealloc_test

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// Holds reports the block and, merged, what is held outside it; Pools counts the
// orphans. They follow a block move, a release and the pool going inactive.
func TestHoldsFollowBlocksAndOrphans(t *testing.T) {
	m, _ := newManager(t)
	cfg := v4Pool("p")
	if err := m.SetPool(cfg); err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{"c1", "c2", "c3"} {
		if _, err := m.Allocate(t.Context(), req(cid, "p")); err != nil {
			t.Fatal(err)
		}
	}
	want := func(what string, holds map[string]v1alpha1.PoolHold, orphans uint64) {
		t.Helper()
		if got := m.Holds(); !reflect.DeepEqual(got, holds) {
			t.Errorf("%s: Holds = %+v, want %+v", what, got, holds)
		}
		if got := m.Pools()[0].Orphans; got != orphans {
			t.Errorf("%s: orphans = %d, want %d", what, got, orphans)
		}
	}
	want("in the block", map[string]v1alpha1.PoolHold{"p": {Block: "10.0.0.1-10.0.0.8"}}, 0)

	moved := *cfg
	moved.Block = iprange.Range{Start: netip.MustParseAddr("10.0.0.9"), End: netip.MustParseAddr("10.0.0.16")}
	moved.Gateway = netip.Addr{}
	if err := m.SetPool(&moved); err != nil {
		t.Fatal(err)
	}
	want("block moved", map[string]v1alpha1.PoolHold{"p": {Block: "10.0.0.9-10.0.0.16", Held: []string{"10.0.0.2-10.0.0.4"}}}, 3)

	if err := m.Deallocate(t.Context(), req("c2", "p")); err != nil {
		t.Fatal(err)
	}
	want("one released", map[string]v1alpha1.PoolHold{"p": {Block: "10.0.0.9-10.0.0.16",
		Held: []string{"10.0.0.2-10.0.0.2", "10.0.0.4-10.0.0.4"}}}, 2)

	if err := m.SyncPools(nil); err != nil {
		t.Fatal(err)
	}
	want("pool gone", map[string]v1alpha1.PoolHold{"p": {Held: []string{"10.0.0.2-10.0.0.2", "10.0.0.4-10.0.0.4"}}}, 2)

	for _, cid := range []string{"c1", "c3"} {
		if err := m.Deallocate(t.Context(), req(cid, "p")); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.Holds(); len(got) != 0 {
		t.Errorf("Holds with nothing held and no block = %+v, want empty", got)
	}
}
