package ipamnode

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/nodeservice"
	"github.com/hwipam/hwipam/pkg/rails"
	"github.com/hwipam/hwipam/pkg/store"
)

// Issue 45, item 5: on a RoCE LAG node a NAD's macvlan master is bond0 (or a
// VLAN on it). The CNI path recorded a port only for a physical master, so
// such an attachment recorded none, and the DRA driver published both bond
// slaves to claims and would prepare one from under the NAD's pods. Now the
// ADD records both ports (store.Allocation.Ports) and the driver withholds
// both; a prepare of either is refused as of any port in use (the ledger reads
// the same ports in use, TestCNIAndPrepareNeverBothTakeAPort).
func TestBondMasterHoldsBothPorts(t *testing.T) {
	tree, err := fakesysfs.RoCELAG(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.AddVLAN("bond0.100", "bond0"); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(st, "lag-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetPool(&nodealloc.PoolConfig{Name: "roce", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.86.0.0/24"),
		Block: iprange.Range{Start: netip.MustParseAddr("10.86.0.1"), End: netip.MustParseAddr("10.86.0.30")}}); err != nil {
		t.Fatal(err)
	}
	ledger := &nicdra.PortLedger{InUse: func() map[string]string { return portsInUse(m) }}
	svc := &nodeservice.Service{Manager: m, Ports: &cniPorts{loc: rails.SysfsLocator{Root: tree.Root}, ledger: ledger}}
	_, err = svc.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: &nodev1.IPAMParameters{Pools: []string{"roce"},
		CniContainerid: "c1", CniIfname: "net1", NetworkName: "roce-lag", Master: "bond0.100",
		Metadata: &nodev1.IPAMMetadata{K8SPodName: "trainer-0", K8SPodNamespace: "ml", K8SPodUid: "uid-0"}}})
	if err != nil {
		t.Fatal(err)
	}
	var got []store.Allocation
	for _, list := range m.Allocations("") {
		got = append(got, list...)
	}
	both := []string{"0000:86:00.0", "0000:86:00.1"}
	if len(got) != 1 || !slices.Equal(got[0].UsedPorts(), both) {
		t.Fatalf("allocations %+v, want one using ports %v", got, both)
	}
	inUse := portsInUse(m)
	for _, pci := range both {
		if !strings.Contains(inUse[pci], "pod ml/trainer-0 (network roce-lag)") {
			t.Errorf("ports in use %v: %s is not the pod's", inUse, pci)
		}
	}
	inv, err := nicdiscovery.Scan(context.Background(), nicdiscovery.Options{Root: tree.Root, Live: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	withheld := map[string]string{}
	for _, w := range nicdra.Withheld(nicdra.Publish{Inventory: inv, InUse: inUse}) {
		withheld[w.PCIAddress] = w.Reason
	}
	for _, pci := range both {
		if !strings.Contains(withheld[pci], "trainer-0") {
			t.Errorf("port %s is published to claims (withheld: %v)", pci, withheld)
		}
	}
}
