package nicdra_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// countingAllocator is the real allocation state, counting the calls.
type countingAllocator struct {
	*nodealloc.Manager
	allocs, deallocs int
	last             *nodealloc.Request
}

func (c *countingAllocator) Allocate(ctx context.Context, req *nodealloc.Request) ([]nodealloc.Result, error) {
	c.allocs++
	c.last = req
	return c.Manager.Allocate(ctx, req)
}

func (c *countingAllocator) Deallocate(ctx context.Context, req *nodealloc.Request) error {
	c.deallocs++
	return c.Manager.Deallocate(ctx, req)
}

// node is a DGX-H100-like node: its inventory, and the real allocation state
// over a store in a temporary directory with two rail pools' blocks (rail
// ibp24s0: rail0 and rail0-v6; ibp64s0: none labelled; "spare" labelled for no rail).
type node struct {
	inv   *nicdiscovery.Inventory
	store string
	st    *store.Store
	alloc *countingAllocator
	dir   string
}

func newNode(t testing.TB) *node {
	t.Helper()
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := &node{inv: scan(t, tree.Root), store: filepath.Join(t.TempDir(), "store"), dir: t.TempDir()}
	n.open(t)
	return n
}

// open opens the store and the allocation state, as a (re)started daemon does.
func (n *node) open(t testing.TB) {
	t.Helper()
	if n.st != nil {
		if err := n.st.Close(); err != nil { // the daemon stops
			t.Fatal(err)
		}
	}
	st, err := store.Open(n.store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n.st = st
	t.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(st, "dgx-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, prefix, start, end, gw string }{
		{"rail0", "10.24.0.0/16", "10.24.0.1", "10.24.0.32", "10.24.0.1"},
		{"rail0-v6", "fd00:24::/64", "fd00:24::1", "fd00:24::20", ""},
		{"spare", "10.99.0.0/24", "10.99.0.1", "10.99.0.16", ""},
	} {
		cfg := &nodealloc.PoolConfig{Name: c.name, Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix(c.prefix),
			Block: iprange.Range{Start: netip.MustParseAddr(c.start), End: netip.MustParseAddr(c.end)}, ExclusionBase: netip.MustParseAddr(c.start),
			Routes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
		if c.gw != "" {
			cfg.Gateway = netip.MustParseAddr(c.gw)
		}
		if err := m.SetPool(cfg); err != nil {
			t.Fatal(err)
		}
	}
	n.alloc = &countingAllocator{Manager: m}
}

// preparer is the driver's Preparer on the node, as a (re)started daemon has it.
func (n *node) preparer() *nicdra.Preparer {
	return &nicdra.Preparer{Allocator: n.alloc, Checkpoint: nicdra.CheckpointFile{Path: filepath.Join(n.dir, "checkpoint.json")},
		Inventory: func() *nicdiscovery.Inventory { return n.inv },
		PoolsForRail: func(rail, kind string) ([]string, bool) {
			if rail == "ibp24s0" && kind == v1alpha1.KindIPPool {
				return []string{"rail0", "rail0-v6"}, true
			}
			return nil, true
		}, BootID: "boot-1"}
}

func (n *node) held(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pool := range []string{"rail0", "rail0-v6", "spare"} {
		for key, as := range n.alloc.Allocations(pool) {
			for _, a := range as {
				out = append(out, pool+" "+key+" "+a.IP)
			}
		}
	}
	slices.Sort(out)
	return out
}

// claim is a claim allocated the given devices (request name: device), with
// opaque configurations, reserved for pod p.
func claim(uid string, devices map[string]string, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c-" + uid, Namespace: "ml", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, req := range slices.Sorted(func(yield func(string) bool) {
		for r := range devices {
			if !yield(r) {
				return
			}
		}
	}) {
		driver := nicdra.DriverName
		if strings.HasPrefix(req, "gpu") {
			driver = "gpu.nvidia.com"
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: req, Driver: driver, Pool: "dgx-1", Device: devices[req]})
	}
	c.Status.Allocation.Devices.Config = configs
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: "pod-uid"}}
	return c
}

// Prepare gives the device an address from each pool of its rail, recorded
// with the claim and the pod; again (the kubelet retries; the daemon restarted)
// it returns the same without allocating; Unprepare releases, also after a
// restart, and again is no error.
func TestPrepareIsIdempotentAndSurvivesARestart(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	c := claim("u1", map[string]string{"nic": "pci-0000-18-00-0", "gpu": "gpu-0"})
	devs, err := p.Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].HostNetdev != "ibp24s0" || devs[0].InterfaceName != "ibp24s0" || devs[0].Rail != "ibp24s0" ||
		!slices.Equal(devs[0].Pools, []string{"rail0", "rail0-v6"}) || len(devs[0].Addresses) != 2 || devs[0].Gateway != "10.24.0.1" {
		t.Fatalf("prepared %+v", devs)
	}
	if r := n.alloc.last; r.ContainerID != "u1" || r.IfName != "nic:pci-0000-18-00-0" || r.Meta.PodName != "trainer" ||
		r.Meta.PodNamespace != "ml" || r.Meta.PodUID != "pod-uid" || r.Meta.Network != nicdra.DriverName || r.Meta.DeviceID != "0000:18:00.0" {
		t.Errorf("allocation request %+v", r)
	}
	want := n.held(t)
	if len(want) != 2 {
		t.Fatalf("held %v, want one address in each rail pool", want)
	}
	again, err := p.Prepare(t.Context(), c)
	if err != nil || !slices.EqualFunc(again, devs, func(a, b nicdra.PreparedDevice) bool { return slices.Equal(a.Addresses, b.Addresses) }) {
		t.Errorf("prepared again: %+v %v", again, err)
	}
	// The daemon restarts: a new allocation state over the same store, a new
	// Preparer over the same checkpoint.
	n.open(t)
	restarted := n.preparer()
	after, err := restarted.Prepare(t.Context(), c)
	if err != nil || n.alloc.allocs != 0 || !slices.Equal(after[0].Addresses, devs[0].Addresses) || !slices.Equal(n.held(t), want) {
		t.Errorf("prepared after a restart: %+v %v (%d allocations), held %v", after, err, n.alloc.allocs, n.held(t))
	}
	if err := restarted.Unprepare(t.Context(), c.UID); err != nil {
		t.Fatal(err)
	}
	if held := n.held(t); len(held) != 0 {
		t.Errorf("held after unprepare: %v", held)
	}
	if err := restarted.Unprepare(t.Context(), c.UID); err != nil {
		t.Errorf("unprepare again: %v", err)
	}
}

// Bad input: nothing stays allocated, and the error says what was wrong.
func TestPrepareRefuses(t *testing.T) {
	cfg := func(params string) resourceapi.DeviceAllocationConfiguration {
		return opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, `+params+`}`)
	}
	for _, c := range []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		is      error
		message string
	}{
		{"a rail no pool is labelled for", claim("b1", map[string]string{"a": "pci-0000-18-00-0", "b": "pci-0000-40-00-0"}),
			nodealloc.ErrUnknownPool, "no IPPool is labelled nic.hwipam.io/rail=ibp64s0"},
		{"an unknown pool", claim("b2", map[string]string{"nic": "pci-0000-18-00-0"}, cfg(`"pool": "nope"`)),
			nodealloc.ErrUnknownPool, `"nope"`},
		{"a static address outside the pool", claim("b3", map[string]string{"nic": "pci-0000-18-00-0"}, cfg(`"pool": "spare", "ips": ["10.24.0.9"]`)),
			nodealloc.ErrInvalid, "10.24.0.9"},
		{"an interface name too long", claim("b4", map[string]string{"nic": "pci-0000-18-00-0"}, cfg(`"interfaceName": "a-name-far-too-long"`)),
			nicdra.ErrConfig, "interfaceName"},
		{"a device this node does not have", claim("b5", map[string]string{"nic": "pci-0000-99-00-0"}),
			nodealloc.ErrInvalid, "no NIC port pci-0000-99-00-0 on this node"},
		{"a NicConfig for another driver's device", claim("b6", map[string]string{"nic": "pci-0000-18-00-0", "gpu": "gpu-0"},
			opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "interfaceName": "net1"}`, "gpu")),
			nicdra.ErrConfig, `request "gpu", whose device is of driver gpu.nvidia.com`},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t)
			_, err := n.preparer().Prepare(t.Context(), c.claim)
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.message) {
				t.Errorf("%v, want %v saying %q", err, c.is, c.message)
			}
			if held := n.held(t); len(held) != 0 {
				t.Errorf("held after a refused prepare: %v", held)
			}
			cp, err := nicdra.CheckpointFile{Path: filepath.Join(n.dir, "checkpoint.json")}.Load()
			if err != nil || len(cp.Claims) != 0 {
				t.Errorf("checkpoint after a refused prepare: %+v %v", cp, err)
			}
		})
	}
}

// A claim's configuration names the pod's interface, the pool and a static
// address, as the CNI path allows.
func TestPrepareWithConfiguration(t *testing.T) {
	n := newNode(t)
	c := claim("u3", map[string]string{"nic": "pci-0000-40-00-0"},
		opaque(resourceapi.AllocationConfigSourceClass, nicdra.DriverName, `{`+head+`, "pool": "spare"}`),
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "interfaceName": "net1", "ips": ["10.99.0.7"]}`))
	devs, err := n.preparer().Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if d := devs[0]; d.InterfaceName != "net1" || d.HostNetdev != "ibp64s0" || !slices.Equal(d.Pools, []string{"spare"}) ||
		!slices.Equal(d.Addresses, []string{"10.99.0.7/24"}) {
		t.Errorf("prepared %+v", d)
	}
}
