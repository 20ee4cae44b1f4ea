package nodealloc_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// TestStoredBlocksServeOnlyOnceDecided: after a restart the blocks kept in the
// store hand out no new address until a pool sync confirms them, or the daemon
// gives up on the API server (UseStoredBlocks). Existing allocations answer at
// once either way.
func TestStoredBlocksServeOnlyOnceDecided(t *testing.T) {
	m, path := newManager(t)
	for _, c := range []*nodealloc.PoolConfig{v4Pool("rail0"), v6Pool("v6")} {
		if err := m.SetPool(c); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := m.Allocate(t.Context(), req("c1", "rail0")); err != nil || res[0].Addr.String() != "10.0.0.2/24" {
		t.Fatalf("first allocation = %v %v", res, err)
	}
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}

	// Restarted, nothing decided yet.
	m2 := reopen(t, m, path)
	if res, err := m2.Allocate(short(), req("c2", "rail0")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a new address from a stored block before any pool sync = %v %v, want to wait (DeadlineExceeded)", res, err)
	}
	if res, err := m2.Allocate(short(), req("c1", "rail0")); err != nil || res[0].Addr.String() != "10.0.0.2/24" {
		t.Errorf("retry of a stored allocation before any pool sync = %v %v, want 10.0.0.2/24 at once", res, err)
	}
	if p := m2.Pools(); len(p) != 2 || p[0].Active || !p[0].Provisional {
		t.Errorf("pools before any sync = %+v, want provisional and not active", p)
	}
	// The sync lists rail0 with a moved block, and no v6.
	moved := v4Pool("rail0")
	moved.Block = iprange.Range{Start: netip.MustParseAddr("10.0.0.9"), End: netip.MustParseAddr("10.0.0.16")}
	moved.ExclusionBase = moved.Block.Start
	if err := m2.SyncPools([]*nodealloc.PoolConfig{moved}); err != nil {
		t.Fatal(err)
	}
	if res, err := m2.Allocate(short(), req("c2", "rail0")); err != nil || !moved.Block.Contains(res[0].Addr.Addr()) {
		t.Errorf("after the sync moved the block = %v %v, want an address in %s", res, err, moved.Block)
	}
	if res, err := m2.Allocate(short(), req("c3", "v6")); !errors.Is(err, nodealloc.ErrUnknownPool) {
		t.Errorf("a stored block the sync did not list = %v %v, want ErrUnknownPool", res, err)
	}

	// Every pool was deleted: the empty listing deactivates every stored block.
	m3 := reopen(t, m, path)
	if err := m3.SyncPools(nil); err != nil {
		t.Fatal(err)
	}
	for _, pool := range []string{"rail0", "v6"} {
		if res, err := m3.Allocate(short(), req("c4", pool)); !errors.Is(err, nodealloc.ErrUnknownPool) {
			t.Errorf("%s after an empty listing = %v %v, want ErrUnknownPool", pool, res, err)
		}
	}
	if err := m3.IsAllocated(t.Context(), req("c1", "rail0")); err != nil {
		t.Errorf("the stored allocation after an empty listing: %v", err)
	}

	// The API server does not answer: the stored blocks serve until the first sync.
	m4 := reopen(t, m, path)
	if n := m4.UseStoredBlocks(); n != 2 {
		t.Errorf("UseStoredBlocks = %d, want 2", n)
	}
	if res, err := m4.Allocate(short(), req("c5", "rail0")); err != nil || res[0].Addr.String() != "10.0.0.3/24" {
		t.Errorf("from the stored block with the API server away = %v %v, want 10.0.0.3/24", res, err)
	}
	if err := m4.SyncPools(nil); err != nil {
		t.Fatal(err)
	}
	if res, err := m4.Allocate(short(), req("c6", "rail0")); !errors.Is(err, nodealloc.ErrUnknownPool) {
		t.Errorf("after the first sync, once the API server answers, listed nothing = %v %v, want ErrUnknownPool", res, err)
	}
	if n := m4.UseStoredBlocks(); n != 0 {
		t.Errorf("UseStoredBlocks after a sync = %d, want 0", n)
	}
}

// TestBlockTakenAwayStaysAwayAfterRestart: a block a pool sync took away is
// marked so in the store; a restart with the API server unreachable (stored
// blocks serving) hands out nothing new from it — the controller may have given
// it to another node — while its allocations still answer retries and release.
// A sync that gives it back makes it serve again, also after the next restart.
func TestBlockTakenAwayStaysAwayAfterRestart(t *testing.T) {
	m, path := newManager(t)
	if err := m.SetPool(v4Pool("rail0")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(t.Context(), req("c1", "rail0")); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncPools(nil); err != nil {
		t.Fatal(err)
	}
	restart := func(from string) (*nodealloc.Manager, string) {
		to := filepath.Join(t.TempDir(), "store")
		copyFile(t, from, to)
		return openManager(t, to), to
	}
	m2, path2 := restart(path)
	m2.UseStoredBlocks()
	if res, err := m2.Allocate(t.Context(), req("c2", "rail0")); !errors.Is(err, nodealloc.ErrUnknownPool) {
		t.Errorf("new address from a block taken away before the restart = %v %v, want ErrUnknownPool", res, err)
	}
	if res, err := m2.Allocate(t.Context(), req("c1", "rail0")); err != nil || res[0].Addr.String() != "10.0.0.2/24" {
		t.Errorf("retry of its allocation = %v %v, want 10.0.0.2/24", res, err)
	}
	if err := m2.SyncPools([]*nodealloc.PoolConfig{v4Pool("rail0")}); err != nil {
		t.Fatal(err)
	}
	m3, _ := restart(path2)
	m3.UseStoredBlocks()
	if res, err := m3.Allocate(t.Context(), req("c2", "rail0")); err != nil || res[0].Addr.String() != "10.0.0.3/24" {
		t.Errorf("after the block came back and a restart = %v %v, want 10.0.0.3/24", res, err)
	}
}

// TestReleaseWhileAllocationWaitsWins: after a restart an ADD waits for the pool
// sync that confirms the stored block (the API server is away); the runtime gives
// up on it and runs the DEL, which finds nothing to release. When the sync comes,
// the waiting ADD must not commit an address that no attachment then holds (whole-
// system seed 705320 with API faults: the address stayed held for ever). An ADD
// of the same interface that begins after the DEL allocates as usual.
func TestReleaseWhileAllocationWaitsWins(t *testing.T) {
	m, path := newManager(t)
	if err := m.SetPool(v4Pool("rail0")); err != nil {
		t.Fatal(err)
	}
	m2 := reopen(t, m, path)
	done := make(chan error, 1)
	go func() {
		_, err := m2.Allocate(t.Context(), req("c1", "rail0"))
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the ADD waits for the pools to be decided
	if err := m2.Deallocate(t.Context(), req("c1", "rail0")); err != nil {
		t.Fatalf("DEL while the ADD waits: %v", err)
	}
	m2.UseStoredBlocks()
	select {
	case err := <-done:
		if !errors.Is(err, nodealloc.ErrDeletedMeanwhile) {
			t.Fatalf("the ADD that waited through its DEL = %v, want ErrDeletedMeanwhile", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting ADD did not return once the pools were decided")
	}
	if err := m2.IsAllocated(t.Context(), req("c1", "rail0")); !errors.Is(err, nodealloc.ErrNotAllocated) {
		t.Fatalf("the interface after its DEL and the aborted ADD: %v, want ErrNotAllocated", err)
	}
	if res, err := m2.Allocate(t.Context(), req("c1", "rail0")); err != nil || len(res) != 1 {
		t.Fatalf("an ADD that begins after the DEL = %v %v, want an address", res, err)
	}
}
