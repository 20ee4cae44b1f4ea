package nodealloc_test

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

func newManager(t *testing.T) (*nodealloc.Manager, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	return openManager(t, path), path
}

func openManager(t *testing.T, path string) *nodealloc.Manager {
	t.Helper()
	st, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(st, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func v4Pool(name string) *nodealloc.PoolConfig {
	start, end := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.8")
	return &nodealloc.PoolConfig{Name: name, Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.0.0.0/24"),
		Block: iprange.Range{Start: start, End: end}, ExclusionBase: start, Gateway: netip.MustParseAddr("10.0.0.1"),
		Routes: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}, DefaultGateway: true}
}

func v6Pool(name string) *nodealloc.PoolConfig {
	p := netip.MustParsePrefix("fd00:1::/64")
	return &nodealloc.PoolConfig{Name: name, Kind: v1alpha1.KindIPPool, Prefix: p, Block: iprange.Usable(p), ExclusionBase: p.Addr().Next()}
}

func req(cid string, pools ...string) *nodealloc.Request {
	return &nodealloc.Request{Pools: pools, ContainerID: cid, IfName: "net1",
		Meta: nodealloc.Metadata{PodName: "pod-" + cid, PodNamespace: "ns", PodUID: "uid-" + cid}}
}

func TestAllocateIdempotentAndDeallocate(t *testing.T) {
	m, path := newManager(t)
	if err := m.SetPool(v4Pool("rail0")); err != nil {
		t.Fatal(err)
	}
	res, err := m.Allocate(t.Context(), req("c1", "rail0"))
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.Addr.String() != "10.0.0.2/24" || r.Gateway.String() != "10.0.0.1" || fmt.Sprint(r.Routes) != "[0.0.0.0/0 10.9.0.0/16]" {
		t.Errorf("result = %+v", r)
	}
	again, err := m.Allocate(t.Context(), req("c1", "rail0"))
	if err != nil || again[0].Addr != r.Addr {
		t.Errorf("repeated Allocate = %v %v, want the same address", again, err)
	}
	if err := m.IsAllocated(t.Context(), req("c1", "rail0")); err != nil {
		t.Errorf("IsAllocated: %v", err)
	}
	// Restart: the allocation and the block come back from the store.
	m2 := reopen(t, m, path)
	if err := m2.IsAllocated(t.Context(), req("c1", "rail0")); err != nil {
		t.Errorf("after restart, IsAllocated: %v", err)
	}
	m2.UseStoredBlocks() // as when the API server does not answer at start
	next, err := m2.Allocate(t.Context(), req("c2", "rail0"))
	if err != nil || next[0].Addr.String() != "10.0.0.3/24" {
		t.Errorf("after restart, next Allocate = %v %v (cursor not restored?)", next, err)
	}
	if err := m2.Deallocate(t.Context(), req("c1", "rail0")); err != nil {
		t.Fatal(err)
	}
	if err := m2.Deallocate(t.Context(), req("c1", "rail0")); err != nil {
		t.Errorf("deallocating twice: %v", err)
	}
	if err := m2.Deallocate(t.Context(), req("zzz", "no-such-pool")); err != nil {
		t.Errorf("deallocating in an unknown pool: %v", err)
	}
	if err := m2.IsAllocated(t.Context(), req("c1", "rail0")); !errors.Is(err, nodealloc.ErrNotAllocated) {
		t.Errorf("IsAllocated after Deallocate = %v", err)
	}
}

// reopen simulates a daemon restart over the same store file.
func reopen(t *testing.T, _ *nodealloc.Manager, path string) *nodealloc.Manager {
	t.Helper()
	// The first manager's store is still open in this process; bbolt's file lock
	// is per open file, so close it by reopening through a fresh path copy.
	cp := filepath.Join(t.TempDir(), "store")
	copyFile(t, path, cp)
	return openManager(t, cp)
}

func TestErrorsAndExhaustion(t *testing.T) {
	m, _ := newManager(t)
	if err := m.SetPool(v4Pool("rail0")); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		r    *nodealloc.Request
		want error
	}{
		"no pools":       {&nodealloc.Request{ContainerID: "c", IfName: "i", Meta: nodealloc.Metadata{PodName: "p", PodNamespace: "n"}}, nodealloc.ErrInvalid},
		"three pools":    {req("c", "a", "b", "c"), nodealloc.ErrInvalid},
		"no container":   {&nodealloc.Request{Pools: []string{"rail0"}, IfName: "i"}, nodealloc.ErrInvalid},
		"no pod name":    {&nodealloc.Request{Pools: []string{"rail0"}, ContainerID: "c", IfName: "i"}, nodealloc.ErrInvalid},
		"unknown pool":   {req("c", "nope"), nodealloc.ErrUnknownPool},
		"wrong kind":     {&nodealloc.Request{Pools: []string{"rail0"}, Kind: v1alpha1.KindCIDRPool, ContainerID: "c", IfName: "i", Meta: nodealloc.Metadata{PodName: "p", PodNamespace: "n"}}, nodealloc.ErrUnknownPool},
		"foreign static": {&nodealloc.Request{Pools: []string{"rail0"}, ContainerID: "c", IfName: "i", Meta: nodealloc.Metadata{PodName: "p", PodNamespace: "n"}, RequestedIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")}}, nodealloc.ErrInvalid},
	} {
		if _, err := m.Allocate(t.Context(), tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	// Block .1-.8 with .1 the gateway: 7 addresses.
	for i := range 7 {
		if _, err := m.Allocate(t.Context(), req(fmt.Sprint(i), "rail0")); err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
	}
	_, err := m.Allocate(t.Context(), req("full", "rail0"))
	if !errors.Is(err, nodealloc.ErrExhausted) {
		t.Fatalf("allocating in a full block: %v", err)
	}
	t.Logf("exhausted: %v", err)
}

func TestStaticIndexGatewayAndDualStackAllOrNothing(t *testing.T) {
	m, _ := newManager(t)
	for _, c := range []*nodealloc.PoolConfig{v4Pool("v4"), v6Pool("v6")} {
		if err := m.SetPool(c); err != nil {
			t.Fatal(err)
		}
	}
	r := req("s", "v4", "v6")
	r.RequestedIPs = []netip.Addr{netip.MustParseAddr("fd00:1::77"), netip.MustParseAddr("10.0.0.5")}
	res, err := m.Allocate(t.Context(), r)
	if err != nil || res[0].Addr.String() != "10.0.0.5/24" || res[1].Addr.String() != "fd00:1::77/64" {
		t.Fatalf("static dual-stack = %v %v", res, err)
	}
	ix := req("ix", "v4")
	ix.Index = ptr.To[int32](6)
	if res, err := m.Allocate(t.Context(), ix); err != nil || res[0].Addr.String() != "10.0.0.7/24" {
		t.Errorf("by index = %v %v", res, err)
	}
	gw := req("gw", "v4")
	gw.AllocateGateway = true
	if res, err := m.Allocate(t.Context(), gw); err != nil || res[0].Addr.String() != "10.0.0.1/24" {
		t.Errorf("gateway = %v %v", res, err)
	}
	// The v4 static address is taken: the dual-stack request fails and leaves no
	// v6 address behind.
	clash := req("clash", "v4", "v6")
	clash.RequestedIPs = []netip.Addr{netip.MustParseAddr("10.0.0.5")}
	if _, err := m.Allocate(t.Context(), clash); !errors.Is(err, nodealloc.ErrInvalid) {
		t.Errorf("taken static address: %v", err)
	}
	if n := len(m.Allocations(v1alpha1.PoolKey(v1alpha1.KindIPPool, "v6"))["v6"]); n != 1 {
		t.Errorf("v6 holds %d allocations after a failed dual-stack request, want 1", n)
	}
}

// TestGatewayHolderGetsNoGatewayOrRoutes: the pod given the gateway address
// (allocate_default_gateway) must not be told to route through itself.
func TestGatewayHolderGetsNoGatewayOrRoutes(t *testing.T) {
	m, _ := newManager(t)
	if err := m.SetPool(v4Pool("rail0")); err != nil { // gateway .1, defaultGateway, a route
		t.Fatal(err)
	}
	gw := req("router", "rail0")
	gw.AllocateGateway = true
	for _, attempt := range []string{"ADD", "repeated ADD"} {
		res, err := m.Allocate(t.Context(), gw)
		if err != nil {
			t.Fatalf("%s: %v", attempt, err)
		}
		if r := res[0]; r.Addr.String() != "10.0.0.1/24" || r.Gateway.IsValid() || len(r.Routes) != 0 {
			t.Errorf("%s of the gateway = %+v, want 10.0.0.1/24 with no gateway and no routes", attempt, r)
		}
	}
	res, err := m.Allocate(t.Context(), req("pod", "rail0"))
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Gateway.String() != "10.0.0.1" || fmt.Sprint(r.Routes) != "[0.0.0.0/0 10.9.0.0/16]" {
		t.Errorf("another pod = %+v, want gateway 10.0.0.1 and both routes", r)
	}
}

func TestInactivePoolKeepsAllocations(t *testing.T) {
	m, _ := newManager(t)
	if err := m.SetPool(v4Pool("rail0")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(t.Context(), req("c1", "rail0")); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncPools(nil); err != nil { // the block disappeared from the API
		t.Fatal(err)
	}
	if _, err := m.Allocate(t.Context(), req("c2", "rail0")); !errors.Is(err, nodealloc.ErrUnknownPool) {
		t.Errorf("new allocation in an inactive pool: %v", err)
	}
	if res, err := m.Allocate(t.Context(), req("c1", "rail0")); err != nil || res[0].Addr.String() != "10.0.0.2/24" {
		t.Errorf("existing allocation in an inactive pool: %v %v", res, err)
	}
	if got := m.PoolsInUse(); fmt.Sprint(got) != "[rail0]" {
		t.Errorf("PoolsInUse = %v", got)
	}
	if err := m.Deallocate(t.Context(), req("c1", "rail0")); err != nil {
		t.Fatal(err)
	}
	if got := m.PoolsInUse(); len(got) != 0 {
		t.Errorf("PoolsInUse after release = %v", got)
	}
}

func TestConcurrentAllocationsAreUniqueAndShareCommits(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(st, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	c := v6Pool("v6")
	if err := m.SetPool(c); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[netip.Prefix]string{}
	for w := range 32 {
		wg.Go(func() {
			for i := range 25 {
				cid := fmt.Sprintf("w%d-%d", w, i)
				res, err := m.Allocate(t.Context(), req(cid, "v6"))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if other, dup := seen[res[0].Addr]; dup {
					t.Errorf("%s handed to %s and %s", res[0].Addr, other, cid)
				}
				seen[res[0].Addr] = cid
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != 800 {
		t.Errorf("%d distinct addresses, want 800", len(seen))
	}
	// One pool, 32 concurrent clients: their commits must share transactions
	// rather than queue behind the pool's lock one fsync each.
	commits, txs := st.Stats()
	if txs*2 > commits {
		t.Errorf("%d commits took %d write transactions: allocations in one pool are serialised", commits, txs)
	}
	t.Logf("%d commits in %d transactions", commits, txs)
}

// TestRetryBeforeBlockIsKnown: after an nv-ipam import the store holds
// allocations of a pool whose block the daemon has not learned yet; a CNI retry
// for such an allocation must get NotFound, not crash the daemon.
func TestRetryBeforeBlockIsKnown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	st, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Commit([]store.Put{{PoolKey: "rail0", Allocation: store.Allocation{ContainerID: "c1", IfName: "net1", IP: "10.0.0.5"}}}, nil); err != nil {
		t.Fatal(err)
	}
	m, err := nodealloc.New(st, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(t.Context(), req("c1", "rail0")); !errors.Is(err, nodealloc.ErrUnknownPool) {
		t.Errorf("retry before the block is known = %v, want ErrUnknownPool", err)
	}
	if err := m.IsAllocated(t.Context(), req("c1", "rail0")); err != nil {
		t.Errorf("the imported allocation is not reported: %v", err)
	}
	// Once the block arrives, the retry returns the imported address.
	if err := m.SetPool(v4Pool("rail0")); err != nil {
		t.Fatal(err)
	}
	res, err := m.Allocate(t.Context(), req("c1", "rail0"))
	if err != nil || res[0].Addr.String() != "10.0.0.5/24" {
		t.Errorf("retry after the block is known = %v %v, want 10.0.0.5/24", res, err)
	}
}
