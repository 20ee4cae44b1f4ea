package nodeservice

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/rails"
	"github.com/hwipam/hwipam/pkg/store"
)

// serviceWith is a Service over a fresh store with pool "net-a" (10.9.0.0/24).
func serviceWith(t *testing.T) *Service {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(st, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetPool(&nodealloc.PoolConfig{Name: "net-a", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.9.0.0/24"),
		Block: iprange.Range{Start: netip.MustParseAddr("10.9.0.1"), End: netip.MustParseAddr("10.9.0.100")}}); err != nil {
		t.Fatal(err)
	}
	return &Service{Manager: m}
}

func allocateParams(network, cid string) *nodev1.IPAMParameters {
	return &nodev1.IPAMParameters{Pools: []string{"net-a"}, CniContainerid: cid, CniIfname: "net1", NetworkName: network,
		Metadata: &nodev1.IPAMMetadata{K8SPodName: "p", K8SPodNamespace: "ns", K8SPodUid: "uid"}}
}

// TestAllocateRefusesTheDRANetworkName: a CNI network named nic.hwipam.io
// (a NAD's config name, which any tenant chooses) is refused, saying to
// rename it; nothing is allocated.
func TestAllocateRefusesTheDRANetworkName(t *testing.T) {
	if ipamwire.ReservedNetworkName != nicdra.DriverName {
		t.Fatalf("ipamwire.ReservedNetworkName %s is not the DRA driver's name %s", ipamwire.ReservedNetworkName, nicdra.DriverName)
	}
	s := serviceWith(t)
	_, err := s.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: allocateParams(nicdra.DriverName, "cid-1")})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "rename the network") {
		t.Fatalf("Allocate with network %s: %v, want InvalidArgument saying to rename it", nicdra.DriverName, err)
	}
	if n := len(s.Manager.Allocations("")); n != 0 {
		t.Errorf("%d pools hold allocations after the refusal, want none", n)
	}
	// Another name allocates, and the record carries no owner mark.
	if _, err := s.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: allocateParams("net-a", "cid-2")}); err != nil {
		t.Fatal(err)
	}
	for _, list := range s.Manager.Allocations("") {
		for _, a := range list {
			if nicdra.OwnedByDRA(a) {
				t.Errorf("a CNI allocation is marked as the DRA driver's: %+v", a)
			}
		}
	}
}

// fakePorts resolves netdevs by a map and holds some for claims.
type fakePorts struct {
	pci     map[string]string // netdev → PCI address
	held    map[string]string // netdev or PCI address → claim
	changed int
	taking  int // ADDs between Take and done
}

func (f *fakePorts) Functions(dev rails.Device) []string {
	if dev.DeviceID != "" {
		return []string{dev.DeviceID}
	}
	if pci := f.pci[dev.Master+dev.Netdev]; pci != "" {
		return []string{pci}
	}
	return nil
}

func (f *fakePorts) Take(dev rails.Device, ports ...string) (string, func()) {
	for _, k := range append(ports, dev.Master, dev.Netdev, dev.DeviceID, dev.PCIBusID) {
		if c := f.held[k]; k != "" && c != "" {
			return c, nil
		}
	}
	f.taking++
	return "", func() { f.taking-- }
}

func (f *fakePorts) Changed() { f.changed++ }

// TestAllocateRecordsThePortAndRefusesAClaimsPort: an ADD naming a macvlan
// master records the master's PCI function with the allocation (what the DRA
// driver withholds) and tells the driver; one naming a master a DRA claim holds
// is refused with the claim's name.
func TestAllocateRecordsThePortAndRefusesAClaimsPort(t *testing.T) {
	s := serviceWith(t)
	ports := &fakePorts{pci: map[string]string{"ibp24s0": "0000:18:00.0"}, held: map[string]string{"ibp64s0": "default/rail-claim"}}
	s.Ports = ports
	prm := allocateParams("demo-a", "cid-1")
	prm.Master = "ibp24s0"
	if _, err := s.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: prm}); err != nil {
		t.Fatal(err)
	}
	var got []store.Allocation
	for _, list := range s.Manager.Allocations("") {
		got = append(got, list...)
	}
	if len(got) != 1 || got[0].Port != "0000:18:00.0" {
		t.Fatalf("allocations %+v, want one with port 0000:18:00.0", got)
	}
	if ports.changed != 1 || ports.taking != 0 {
		t.Errorf("the driver was told %d times, want once; %d ADDs not done", ports.changed, ports.taking)
	}
	prm = allocateParams("demo-b", "cid-2")
	prm.Master = "ibp64s0"
	_, err := s.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: prm})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "default/rail-claim") {
		t.Fatalf("ADD on a claim's master: %v, want FailedPrecondition naming claim default/rail-claim", err)
	}
}
