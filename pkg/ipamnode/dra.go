package ipamnode

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// The DRA driver's rights (deploy/overlays/dra): its node's ResourceSlices, the
// claims it prepares (read; listed for the garbage collection by claim UID),
// and their status.devices entries of driver nic.hwipam.io. They are written by
// hand in deploy/dra/rbac.yaml, not generated: the base role (generated from the
// markers of this package) must not grant them to a daemon that runs without
// --dra.

// draCheckpoint is the DRA checkpoint's file, beside the store.
func draCheckpoint(storeFile string) string {
	return nicdra.CheckpointBeside(storeFile)
}

// newDRADriver builds the DRA driver on the daemon's allocation state, pools
// and NIC inventory.
func newDRADriver(o *Options, cfg *rest.Config, m *nodealloc.Manager, pools *poolSync, rails nicdiscovery.Rails,
	scan func(fresh bool) (*nicdiscovery.Inventory, error), logger logr.Logger) (*nicdra.Driver, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the DRA driver's client: %w", err)
	}
	bootID, err := nicdra.BootID("/")
	if err != nil {
		return nil, err
	}
	inventory := func() *nicdiscovery.Inventory {
		inv, err := scan(true)
		if err != nil || inv == nil {
			return &nicdiscovery.Inventory{Root: o.SysfsRoot}
		}
		return inv
	}
	host := &hostPortsReader{netns: o.DRAHostNetNS}
	p := &nicdra.Preparer{Allocator: m, Checkpoint: nicdra.CheckpointFile{Path: draCheckpoint(o.StoreFile)},
		Inventory: inventory, Rails: rails, BootID: bootID, Log: logger.WithName("dra"),
		Ports: &nicdra.PortUse{InUse: func() map[string]string { return portsInUse(m) }, HostPorts: host.read, HostLinks: host.links,
			Exclude: o.DRAExcludeDevices},
		PoolsForRail: func(rail, kind string) ([]string, bool) { return pools.poolsOfRail(kind, rail) },
		Ledger:       &nicdra.PortLedger{InUse: func() map[string]string { return portsInUse(m) }}}
	// The claims' ports are known before the CNI path serves: read now (a
	// checkpoint that cannot be read is said by the driver, and read again).
	_ = p.CheckpointError()
	var nri *nicdra.NRIPlugin
	if o.DRANRISocket != "" {
		att := &nicdra.Attacher{HostNetNS: o.DRAHostNetNS}
		nri = &nicdra.NRIPlugin{Devices: p, Attacher: att, SysfsRoot: o.SysfsRoot, Log: logger.WithName("nri"),
			CharDevicesByCDI: o.DRACDIDir != ""}
		p.Reclaim = nicdra.ReclaimFunc(att, logger.WithName("dra"))
		p.HostState = att.HostState
	}
	var cdi *nicdra.CDISpecs
	if o.DRACDIDir != "" {
		cdi = &nicdra.CDISpecs{Dir: o.DRACDIDir, SysfsRoot: o.SysfsRoot}
	}
	return &nicdra.Driver{NodeName: o.NodeName, Client: client, Preparer: p, KubeletDir: o.DRAKubeletDir, CDI: cdi,
		NRI: nri, NRISocket: o.DRANRISocket,
		Inventory:   func() (*nicdiscovery.Inventory, error) { return scan(true) },
		PoolsByRail: pools.railPoolsAll,
		Allocations: func(fn func(string, store.Allocation) error) error { return m.EachAllocation("", fn) },
		Release:     m.ReleaseIf,
		Log:         logger.WithName("dra")}, nil
}

// markLegacyDRA marks as the DRA driver's (nicdra.MarkLegacy) the allocations
// an earlier ipam-node made for claims, which carry only the network name
// nic.hwipam.io: those whose claim UID the checkpoint knows. Any other
// allocation of that network is a CNI allocation from then on (a NAD of that
// name, or a claim this node no longer has prepared), which the
// stale-allocation cleaner releases once its pod is gone. It runs at start,
// with or without --dra. It returns true when the checkpoint cannot be read:
// the cleaner then leaves all such allocations alone.
func markLegacyDRA(ctx context.Context, storeFile string, m *nodealloc.Manager, logger logr.Logger) (keepLegacy bool) {
	c, err := nicdra.CheckpointFile{Path: draCheckpoint(storeFile)}.Load()
	if err != nil {
		logger.Error(err, "reading the DRA checkpoint to mark the driver's allocations made by an earlier version; "+
			"allocations of network "+nicdra.DriverName+" without an owner are left alone until it can be read")
		return true
	}
	n, err := nicdra.MarkLegacy(ctx, c.Claims, func(fn func(string, store.Allocation) error) error { return m.EachAllocation("", fn) },
		m.SetOwner)
	if err != nil {
		logger.Error(err, "marking the DRA driver's allocations made by an earlier version; allocations of network "+
			nicdra.DriverName+" without an owner are left alone until the next start")
		return true
	}
	if n > 0 {
		logger.Info("marked the DRA driver's allocations made by an earlier version", "allocations", n)
	}
	return false
}

// preparedNetdevs reads the DRA checkpoint beside the store for the host
// netdevs of the prepared claims' devices (nicdra.PreparedNetdevs); none when
// there is no checkpoint or it cannot be read.
func preparedNetdevs(storeFile string) map[string]string {
	c, err := nicdra.CheckpointFile{Path: draCheckpoint(storeFile)}.Load()
	if err != nil {
		return nil
	}
	return nicdra.PreparedNetdevs(c.Claims)
}

// runDRA runs the driver until ctx ends.
func runDRA(ctx context.Context, d *nicdra.Driver) error {
	if err := d.Run(ctx); err != nil {
		return fmt.Errorf("the DRA driver: %w", err)
	}
	return nil
}
