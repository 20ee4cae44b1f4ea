package nodealloc_test

import (
	"sync"
	"testing"

	"github.com/hwipam/hwipam/pkg/nodealloc"
)

func poolKeys(m *nodealloc.Manager) []string {
	var keys []string
	for _, p := range m.Pools() {
		keys = append(keys, p.Key)
	}
	return keys
}

// A pool gone from the API server is forgotten only once it holds nothing and
// hands out nothing; one that exists, or holds an allocation, or has a block,
// stays. Re-created while its last allocation is released (the two race), it
// ends active with its block, whichever comes first, and nothing allocated in
// it is lost.
func TestForgetGone(t *testing.T) {
	m, path := newManager(t)
	for _, n := range []string{"a", "b", "c"} {
		if err := m.SetPool(v4Pool(n)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	if _, err := m.Allocate(ctx, req("c1", "b")); err != nil {
		t.Fatal(err)
	}
	// Before any listing nothing is gone; an active pool is never forgotten.
	if got, err := m.ForgetGone(map[string]bool{}); err != nil || len(got) != 0 {
		t.Fatalf("ForgetGone with every pool active = %v, %v; want nothing", got, err)
	}
	// a and b deleted, c exists but gives this node no block.
	if err := m.SyncPools(nil); err != nil {
		t.Fatal(err)
	}
	got, err := m.ForgetGone(map[string]bool{"c": true})
	if err != nil || len(got) != 1 || got[0] != "a" {
		t.Fatalf("ForgetGone = %v, %v; want [a]", got, err)
	}
	if keys := poolKeys(m); len(keys) != 2 || keys[0] != "b" || keys[1] != "c" {
		t.Fatalf("pools = %v, want [b c]", keys)
	}
	if err := m.Deallocate(ctx, req("c1", "b")); err != nil {
		t.Fatal(err)
	}
	if keys := poolKeys(m); len(keys) != 1 || keys[0] != "c" {
		t.Fatalf("pools after the gone pool's last release = %v, want [c]", keys)
	}
	again := reopen(t, m, path)
	if keys := poolKeys(again); len(keys) != 1 || keys[0] != "c" {
		t.Errorf("pools after a restart = %v, want [c]", keys)
	}

	// The race: pool r is gone, holds one allocation; its release and its
	// re-creation run together.
	for i := range 20 {
		if err := m.SetPool(v4Pool("r")); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Allocate(ctx, req("held", "r")); err != nil {
			t.Fatal(err)
		}
		if err := m.SyncPools(nil); err != nil {
			t.Fatal(err)
		}
		if _, err := m.ForgetGone(map[string]bool{}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := m.Deallocate(ctx, req("held", "r")); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if err := m.SyncPools([]*nodealloc.PoolConfig{v4Pool("r")}); err != nil {
				t.Error(err)
			}
			if _, err := m.ForgetGone(map[string]bool{"r": true}); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if _, err := m.Allocate(ctx, req("new", "r")); err != nil {
			t.Fatalf("round %d: allocating in the re-created pool: %v", i, err)
		}
		re := reopen(t, m, path)
		re.UseStoredBlocks()
		if err := re.IsAllocated(ctx, req("new", "r")); err != nil {
			t.Fatalf("round %d: the re-created pool's allocation is lost across a restart: %v", i, err)
		}
		if _, err := re.Allocate(ctx, req("probe", "r")); err != nil {
			t.Fatalf("round %d: the re-created pool's block is not in the store: %v", i, err)
		}
		if err := m.Deallocate(ctx, req("new", "r")); err != nil {
			t.Fatal(err)
		}
	}
}
