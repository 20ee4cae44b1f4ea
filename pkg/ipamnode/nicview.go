package ipamnode

import (
	"context"
	"strconv"
	"sync"
	"time"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/nicdiscovery"
)

// nicView is the daemon's NIC inventory as ipamctl asks for it (ListNICs): the
// NIC labeller's last scan, with the ports it keeps for netdevs that left the
// namespace; with --nic-labels=off, a scan of the same root as the rail
// resolver's.
type nicView struct {
	rails nicdiscovery.Rails
	// scan serves when no labeller sets the view.
	scan func(fresh bool) (*nicdiscovery.Inventory, error)

	mu   sync.Mutex
	set  bool
	inv  *nicdiscovery.Inventory
	kept map[string]bool // PCI addresses whose ports are kept from an earlier scan
	when time.Time
	err  error
}

// update records a scan: its inventory and the functions whose ports were kept,
// or why it failed (the last inventory then stays).
func (v *nicView) update(inv *nicdiscovery.Inventory, kept map[string]bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.set, v.err = true, err
	if err == nil {
		v.inv, v.kept, v.when = inv, kept, time.Now()
	}
}

// NICs implements nodeservice.NICSource.
func (v *nicView) NICs(context.Context) *infov1.ListNICsResponse {
	v.mu.Lock()
	inv, kept, when, err, set := v.inv, v.kept, v.when, v.err, v.set
	v.mu.Unlock()
	if !set && v.scan != nil {
		inv, err = v.scan(false)
		when = time.Now()
	}
	resp := &infov1.ListNICsResponse{}
	if err != nil {
		resp.Error = err.Error()
	}
	if inv == nil {
		if resp.Error == "" {
			resp.Error = "the daemon has not scanned the NICs yet"
		}
		return resp
	}
	resp.ScanTime, resp.NetdevsHidden = when.Unix(), inv.NetdevsHidden
	ports := map[string]nicdiscovery.Port{}
	for _, n := range inv.NICs {
		for _, p := range n.Ports {
			ports[portKey(n.PCIAddress, p.Number)] = p
		}
	}
	for _, l := range nicdiscovery.PortLabels(inv, v.rails) {
		p := ports[portKey(l.PCIAddress, l.Port)]
		resp.Ports = append(resp.Ports, &infov1.NICPort{Name: l.Key[len(nicdiscovery.LabelPrefix):], PciAddress: l.PCIAddress,
			Port: int32(l.Port), Netdev: p.Netdev, LinkLayer: p.LinkLayer, Rails: l.Rails, Kept: kept[l.PCIAddress]})
	}
	return resp
}

func portKey(addr string, port int) string { return addr + "/" + strconv.Itoa(port) }
