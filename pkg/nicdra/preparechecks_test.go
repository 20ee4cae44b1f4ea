package nicdra_test

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// claimFor is a claim reserved for the pod with UID podUID, allocated
// devices as (request, device) pairs in order: one request may have several
// (count: 2, allocationMode: All).
func claimFor(uid, podUID string, devices [][2]string, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c-" + uid, Namespace: "ml", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: d[0], Driver: nicdra.DriverName, Pool: "dgx-1", Device: d[1]})
	}
	c.Status.Allocation.Devices.Config = configs
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer-" + podUID,
		UID: types.UID(podUID)}}
	return c
}

// refusedCleanly checks that a refused prepare left nothing: no address
// allocated or held, no claim in the checkpoint.
func refusedCleanly(t *testing.T, n *node) {
	t.Helper()
	if n.alloc.allocs != 0 {
		t.Errorf("%d allocations for a refused claim, want none", n.alloc.allocs)
	}
	if held := n.held(t); len(held) != 0 {
		t.Errorf("held after a refused prepare: %v", held)
	}
	cp, err := nicdra.CheckpointFile{Path: filepath.Join(n.dir, "checkpoint.json")}.Load()
	if err != nil || len(cp.Claims) != 0 {
		t.Errorf("checkpoint after a refused prepare: %+v %v", cp, err)
	}
}

// renameOnHost gives a port of the node's inventory another host netdev name
// (a node that names its ports eth0, eth1, ...).
func renameOnHost(t *testing.T, inv *nicdiscovery.Inventory, pci, name string) {
	t.Helper()
	for i := range inv.NICs {
		if inv.NICs[i].PCIAddress == pci {
			inv.NICs[i].Netdevs = append([]string{name}, inv.NICs[i].Netdevs[1:]...)
			return
		}
	}
	t.Fatalf("no NIC %s", pci)
}

// Prepare refuses, before allocating anything, a claim whose devices could
// not all get their names in the pod: two named alike (a request of count 2,
// or allocationMode All, with one interfaceName; two requests with one name;
// a name another of its ports has on the host), or one named eth0 or lo,
// configured or by its host name. Without the check the claim held its
// addresses while the pod's sandbox failed on every start.
func TestPrepareRefusesInterfaceNamesThePodCannotHave(t *testing.T) {
	const a, b = "pci-0000-18-00-0", "pci-0000-40-00-0" // ibp24s0, ibp64s0
	for _, c := range []struct {
		name     string
		devices  [][2]string
		configs  []resourceapi.DeviceAllocationConfiguration
		hostEth0 bool     // b is called eth0 on the host
		refused  []string // the error's parts; none: prepared
		names    []string // the names in the pod, when prepared
	}{
		{name: "count 2 with one interfaceName", devices: [][2]string{{"nic", a}, {"nic", b}},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"pool": "spare", "interfaceName": "net1"`)},
			refused: []string{`device pci-0000-18-00-0 (request nic) and device pci-0000-40-00-0 (request nic) would both be "net1" in the pod`,
				"count > 1 or allocationMode All", "drop interfaceName"}},
		{name: "count 2 keeping the host names", devices: [][2]string{{"nic", a}, {"nic", b}},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"pool": "spare"`)},
			names:   []string{"ibp24s0", "ibp64s0"}},
		{name: "two requests with one interfaceName", devices: [][2]string{{"x", a}, {"y", b}},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"pool": "spare", "interfaceName": "net1"`, "x"),
				claimConfig(`"pool": "spare", "interfaceName": "net1"`, "y")},
			refused: []string{`device pci-0000-18-00-0 (request x) and device pci-0000-40-00-0 (request y) would both be "net1"`}},
		{name: "two requests with their own names", devices: [][2]string{{"x", a}, {"y", b}},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"pool": "spare"`),
				claimConfig(`"interfaceName": "net1"`, "x"), claimConfig(`"interfaceName": "net2"`, "y")},
			names: []string{"net1", "net2"}},
		{name: "a name another port has on the host", devices: [][2]string{{"x", a}, {"y", b}},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"pool": "spare"`),
				claimConfig(`"interfaceName": "ibp24s0"`, "y")},
			refused: []string{`device pci-0000-18-00-0 (request x) and device pci-0000-40-00-0 (request y) would both be "ibp24s0"`}},
		{name: "eth0 configured", devices: [][2]string{{"nic", a}},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"interfaceName": "eth0"`)},
			refused: []string{`interfaceName "eth0" is the pod's primary interface, its CNI network's: choose another`}},
		{name: "lo configured by the class", devices: [][2]string{{"nic", a}},
			configs: []resourceapi.DeviceAllocationConfiguration{class(`"interfaceName": "lo"`)},
			refused: []string{`interfaceName "lo" is the pod's loopback interface`}},
		{name: "a port called eth0 on the host", devices: [][2]string{{"nic", b}}, hostEth0: true,
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"pool": "spare"`)},
			refused: []string{`device pci-0000-40-00-0 (request nic) would be "eth0" in the pod, its host netdev's name ` +
				`(it has no interfaceName), which is the pod's primary interface`, "set another interfaceName"}},
		{name: "a port called eth0 on the host, renamed in the pod", devices: [][2]string{{"nic", b}}, hostEth0: true,
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(`"pool": "spare", "interfaceName": "net1"`)},
			names:   []string{"net1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t)
			if c.hostEth0 {
				renameOnHost(t, n.inv, "0000:40:00.0", "eth0")
			}
			devs, err := n.preparer().Prepare(t.Context(), claimFor("u1", "pod-1", c.devices, c.configs...))
			if c.refused == nil {
				var names []string
				for _, d := range devs {
					names = append(names, d.InterfaceName)
				}
				if err != nil || !slices.Equal(names, c.names) {
					t.Errorf("prepared %v %v, want names %v", names, err, c.names)
				}
				return
			}
			if !errors.Is(err, nicdra.ErrConfig) {
				t.Fatalf("%v, want ErrConfig", err)
			}
			for _, part := range c.refused {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("%v\nwant it saying %q", err, part)
				}
			}
			refusedCleanly(t, n)
		})
	}
}

// A name a device of another claim prepared for the same pod has is refused
// too (two claims of one pod, one name); in another pod it is free, and it is
// free again once the other claim is unprepared.
func TestPrepareRefusesANameAnotherClaimOfThePodHas(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	net1 := claimConfig(`"pool": "spare", "interfaceName": "net1"`)
	first := claimFor("u1", "pod-1", [][2]string{{"nic", "pci-0000-18-00-0"}}, net1)
	if _, err := p.Prepare(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	_, err := p.Prepare(t.Context(), claimFor("u2", "pod-1", [][2]string{{"nic", "pci-0000-40-00-0"}}, net1))
	if !errors.Is(err, nicdra.ErrConfig) || !strings.Contains(err.Error(),
		`device pci-0000-18-00-0 of claim ml/c-u1 and device pci-0000-40-00-0 (request nic) would both be "net1" in the pod`) {
		t.Errorf("a second claim of the pod with the same name: %v, want refused naming the first", err)
	}
	if held := n.held(t); len(held) != 1 {
		t.Errorf("held %v, want the first claim's address only", held)
	}
	if _, err := p.Prepare(t.Context(), claimFor("u3", "pod-2", [][2]string{{"nic", "pci-0000-40-00-0"}}, net1)); err != nil {
		t.Errorf("the same name in another pod: %v", err)
	}
	if err := p.Unprepare(t.Context(), "u3"); err != nil {
		t.Fatal(err)
	}
	if err := p.Unprepare(t.Context(), first.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prepare(t.Context(), claimFor("u2", "pod-1", [][2]string{{"nic", "pci-0000-40-00-0"}}, net1)); err != nil {
		t.Errorf("the name once the other claim is unprepared: %v", err)
	}
}

// Before the pools have been listed from the API server (ipam-node just
// started, the API server away), a rail's pools are unknown, not missing: the
// prepare fails with ErrNotReady, which says the kubelet retries, not with
// ErrUnknownPool ("label the rail's pool"); nothing is held. A claim that
// names its pool needs no listing. Once listed, the same claim prepares.
func TestPrepareBeforeThePoolsAreListed(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	listed := p.PoolsForRail
	p.PoolsForRail = func(string, string) ([]string, bool) { return nil, false }
	c := claimFor("u1", "pod-1", [][2]string{{"nic", "pci-0000-18-00-0"}})
	_, err := p.Prepare(t.Context(), c)
	if !errors.Is(err, nicdra.ErrNotReady) || errors.Is(err, nodealloc.ErrUnknownPool) ||
		!strings.Contains(err.Error(), "the pools labelled for rail ibp24s0 are not loaded yet") ||
		!strings.Contains(err.Error(), "the kubelet retries") || strings.Contains(err.Error(), "label the rail's pool") {
		t.Errorf("%v, want ErrNotReady saying the pools are not loaded yet and the kubelet retries", err)
	}
	refusedCleanly(t, n)
	named := claimFor("u2", "pod-2", [][2]string{{"nic", "pci-0000-40-00-0"}}, claimConfig(`"pool": "spare"`))
	if _, err := p.Prepare(t.Context(), named); err != nil {
		t.Errorf("a claim naming its pool, before the listing: %v", err)
	}
	p.PoolsForRail = listed
	devs, err := p.Prepare(t.Context(), c)
	if err != nil || len(devs) != 1 || !slices.Equal(devs[0].Pools, []string{"rail0", "rail0-v6"}) {
		t.Errorf("after the listing: %+v %v", devs, err)
	}
}

// The DeviceClass's configuration binds a claim at prepare: a claim naming
// another pool is refused, a static address outside the class's pool is
// refused by the pool, and a class with allowClaimAddresses: false refuses a
// claim's static address and gives one from its pool otherwise. Nothing is
// held for a refused claim.
func TestPrepareKeepsTheClassConfiguration(t *testing.T) {
	spare := class(`"pool": "spare"`)
	pinned := class(`"pool": "spare", "allowClaimAddresses": false`)
	for _, c := range []struct {
		name    string
		configs []resourceapi.DeviceAllocationConfiguration
		is      error
		message string
		address string // when prepared
	}{
		{"another pool", []resourceapi.DeviceAllocationConfiguration{spare, claimConfig(`"pool": "rail0"`)},
			nicdra.ErrConfig, `it sets pool "rail0", but the DeviceClass's configuration sets pool "spare"`, ""},
		{"an address outside the class's pool", []resourceapi.DeviceAllocationConfiguration{spare, claimConfig(`"ips": ["10.24.0.9"]`)},
			nodealloc.ErrInvalid, "10.24.0.9", ""},
		{"an address in the class's pool", []resourceapi.DeviceAllocationConfiguration{spare, claimConfig(`"ips": ["10.99.0.9"]`)},
			nil, "", "10.99.0.9/24"},
		{"an address where the class forbids one", []resourceapi.DeviceAllocationConfiguration{pinned, claimConfig(`"ipIndex": 5`)},
			nicdra.ErrConfig, "allowClaimAddresses false", ""},
		{"no address where the class forbids one", []resourceapi.DeviceAllocationConfiguration{pinned,
			claimConfig(`"interfaceName": "net1"`)}, nil, "", "10.99.0.1/24"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t)
			devs, err := n.preparer().Prepare(t.Context(), claimFor("u1", "pod-1", [][2]string{{"nic", "pci-0000-18-00-0"}}, c.configs...))
			if c.is == nil {
				if err != nil || len(devs) != 1 || !slices.Equal(devs[0].Addresses, []string{c.address}) {
					t.Errorf("prepared %+v %v, want %s", devs, err, c.address)
				}
				return
			}
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.message) {
				t.Errorf("%v, want %v saying %q", err, c.is, c.message)
			}
			if held := n.held(t); len(held) != 0 {
				t.Errorf("held after a refused prepare: %v", held)
			}
		})
	}
}
